"""Convolutions, transposed convolutions and padding against PyTorch's (values and gradients,
on fresh random inputs over 1, 2 and 3 spatial axes, strides, dilations, paddings and groups),
np.pad, the interpreter, and clear errors for bad shapes."""
import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera.trace import apply

torch = pytest.importorskip("torch", reason="PyTorch's convolutions are the reference")
F = torch.nn.functional

CONV = [  # (input shape, weight shape, attributes)
    ((2, 3, 11), (4, 3, 3), {}),
    ((1, 4, 13), (6, 2, 4), {"stride": 3, "padding": 2, "groups": 2}),
    ((2, 4, 9, 8), (6, 4, 3, 2), {"padding": 1}),
    ((2, 4, 9, 8), (6, 2, 3, 3), {"stride": (2, 1), "dilation": (1, 2), "padding": (1, 2),
                                  "groups": 2}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"padding": "same", "groups": 6}),         # depthwise
    ((2, 3, 8, 9), (5, 3, 1, 1), {}),                                     # 1x1
    ((1, 2, 12, 10), (3, 2, 5, 3), {"stride": 2, "dilation": 2, "padding": "valid"}),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"stride": (1, 2, 1), "padding": 1}),
]


def _torch_conv(n):
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n]


def _torch_conv_t(n):
    return {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]


def _case(rng, xs, ws, dtype=np.float64):
    return (rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype))


@pytest.mark.parametrize("k", range(len(CONV)))
def test_conv_is_pytorchs_with_its_gradients(k, rng):
    xs, ws, attrs = CONV[k]
    x, w = _case(rng, xs, ws)
    n = len(xs) - 2
    tx, tw = (torch.from_numpy(a).requires_grad_() for a in (x, w))
    want = _torch_conv(n)(tx, tw, **attrs)
    g = rng.standard_normal(tuple(want.shape))
    want.backward(torch.from_numpy(g))
    f = ts.function(lambda x, w: op.conv(x, w, **attrs))
    np.testing.assert_allclose(f(x, w), want.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(op.conv(x, w, **attrs), want.detach().numpy(), rtol=1e-10,
                               atol=1e-10)                                 # eager: reference
    dx, dw = ts.grad(lambda x, w, g: op.sum(op.conv(x, w, **attrs) * g), argnums=(0, 1))(x, w, g)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-9, atol=1e-9)


def _im2col(x, ws, attrs):
    """x's windows as NumPy builds them, [N, groups, Cg * prod(kernel), P] with k = (c, offset):
    the operand of the matmul a convolution decomposes into."""
    n = len(ws) - 2
    norm = {key: (v,) * n if isinstance(v, int) else tuple(v) for key, v in attrs.items()
            if key in ("stride", "dilation")}
    stride, dil = norm.get("stride", (1,) * n), norm.get("dilation", (1,) * n)
    pad = attrs.get("padding", 0)
    if pad == "same":             # (PyTorch's: the extra row of an even total after)
        pad = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dil, ws[2:])]
    else:
        pad = [(p, p) for p in ((0,) * n if pad == "valid" else (pad,) * n
                                if isinstance(pad, int) else pad)]
    xp = np.pad(x, [(0, 0), (0, 0)] + pad)
    out = [(xp.shape[2 + a] - dil[a] * (ws[2 + a] - 1) - 1) // stride[a] + 1 for a in range(n)]
    cols = []
    for off in np.ndindex(*ws[2:]):
        idx = tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                    for o, d, m, s in zip(off, dil, out, stride))
        cols.append(xp[(slice(None), slice(None)) + idx])
    g = attrs.get("groups", 1)
    N, C = x.shape[:2]
    return np.stack(cols, axis=2).reshape(N, g, C // g * int(np.prod(ws[2:])), -1), out


STRATEGY = CONV[:-1] + [
    ((2, 40, 30, 30), (50, 40, 3, 3), {"padding": 1}),           # K past a block, edge tiles
    ((1, 1, 9), (1, 1, 4), {"padding": 3}),                      # one row: the vector path
    ((2, 8, 2, 1), (8, 8, 2, 1), {}),                            # one column per image
    ((1, 3, 5, 6, 7), (4, 3, 2, 3, 2), {"stride": (1, 2, 1), "padding": 1}),
    ((9, 16, 5, 5), (13, 16, 3, 3), {"padding": 1}),             # small images: a task's
    ((7, 8, 3, 3), (12, 4, 3, 3), {"groups": 2}),                # columns are whole images
    ((2, 6, 13, 17), (6, 1, 3, 5), {"stride": (2, 3), "dilation": (2, 1), "padding": (2, 1),
                                    "groups": 6}),              # depthwise: the stencil, its
    ((2, 8, 9, 21), (4, 2, 3, 3), {"padding": 1, "groups": 4}),  # column phases, two channels
    ((1, 3, 5, 70), (3, 1, 3, 3), {"padding": (0, 4), "groups": 3}),   # a group, rows of 78
    ((5, 16, 16, 16), (24, 16, 3, 3), {"padding": 1}),          # rows of 16 or more, whole
    ((4, 8, 17, 65), (12, 8, 3, 3), {"stride": 2, "padding": 1, "dilation": (1, 2)}),  # rows:
    ((3, 6, 9, 30), (10, 3, 3, 3), {"padding": (1, 2), "groups": 2}),  # laid out padded
    ((32, 4, 6, 6), (10, 4, 3, 3), {"padding": 1}),             # whole images: 4 a task
    ((2, 3, 70, 90), (3, 1, 3, 3), {"padding": 1, "groups": 3}),  # depthwise, a plane laid
    ((1, 2, 64, 130), (2, 1, 3, 3), {"stride": 2, "padding": 1, "groups": 2}),  # out in blocks
]


@pytest.mark.parametrize("k", range(len(STRATEGY)))
def test_the_conv_strategy_has_the_bits_of_the_im2col_matmul(k, rng):
    """The implicit GEMM (compiler/strategies/conv.py) computes each element as the GEMM
    routine's fma chain over (c, kernel offset): bit for bit the matmul of the windows built
    in NumPy, whatever its tiles (the K block included), threads, and the images a task's
    columns span (tile_n 50: two images of 25 positions, the last block one; tile_m 6 of 13
    rows: a last tile of one row, image by image; one output channel per group over whole
    rows: the stencil over zero-padded rows, strided columns split into phases)."""
    xs, ws, attrs = STRATEGY[k]
    _has_the_im2col_bits(rng, xs, ws, attrs, [
        None, ts.Schedule(block=(6, 32, 64)), ts.Schedule(block=(7, 50, 5), parallel=False),
        ts.Schedule(block=(6, 64, 64))])


def _has_the_im2col_bits(rng, xs, ws, attrs, schedules, dtype=np.float32):
    x, w = _case(rng, xs, ws, dtype)
    cols, out = _im2col(x, ws, attrs)
    g = attrs.get("groups", 1)
    wm = w.reshape(g, ws[0] // g, -1)
    want = ts.function(lambda a, b: op.matmul(a, b))(wm, cols).reshape(xs[0], ws[0], *out)
    f = ts.function(lambda x, w: op.conv(x, w, **attrs))
    assert [kn.strategy for kn in f.lower(x, w).schedule_ir.kernels] == ["conv"]
    for sched in schedules:
        got = (f if sched is None else f.with_schedule(sched))(x, w)
        assert got.tobytes() == want.tobytes(), sched
    np.testing.assert_allclose(got, _torch_conv(len(xs) - 2)(
        torch.from_numpy(x).double(), torch.from_numpy(w).double(), **attrs).numpy(),
        rtol=1e-4, atol=1e-4)


DIRECT = [  # (input, weight, attributes, tile_n: whole output rows)
    ((3, 20, 14, 14), (32, 20, 3, 3), {"padding": 1}, 28),
    ((2, 8, 9, 64), (30, 8, 3, 3), {"stride": 2, "padding": 1}, 64),
    ((2, 6, 12, 40), (28, 6, 3, 3), {"padding": (1, 2), "dilation": (1, 2)}, 120),
    ((2, 8, 10, 16), (64, 4, 3, 3), {"padding": 1, "groups": 2}, 32),
    ((1, 16, 24, 24), (32, 16, 3, 3), {"padding": 1}, 72),
    ((32, 6, 7, 7), (32, 6, 3, 3), {"padding": 1}, 49),          # whole images, several a task
    ((40, 8, 2, 3), (32, 8, 3, 3), {"padding": 1}, 6),           # and a K block: groups of
]                                                                # positions across images


@pytest.mark.parametrize("k", range(len(DIRECT)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_direct_convolution_has_the_bits_of_the_im2col_matmul(k, dtype, rng):
    """Tiles of whole output rows whose output channels fill the channel vectors take the
    direct path (routines/conv.c: the windows read where the rows are laid out, B never
    packed): bit for bit the windows' matmul, over K blocks (k 64 of K 180: the tile reloaded),
    a last group of positions in part, strides and dilations, groups, several images a task,
    tiles of 30 channels beside a last one of 2 (the packed path's) and in float64 (other
    vector widths)."""
    xs, ws, attrs, tile_n = DIRECT[k]
    _has_the_im2col_bits(rng, xs, ws, attrs, [
        None, ts.Schedule(block=(32, tile_n, 64)), ts.Schedule(block=(30, tile_n, 256)),
        ts.Schedule(block=(64, 2 * tile_n, 1000), parallel=False)], dtype)


SKIPPING = [  # small images, whose windows are mostly padding: the direct path skips those taps
    ((32, 16, 7, 7), (32, 16, 3, 3), {"padding": 1}),             # 18% of the taps
    ((32, 16, 2, 2), (64, 16, 3, 3), {"padding": 1}),             # 56%
    ((24, 8, 3, 5), (32, 8, 5, 5), {"padding": 2, "dilation": (1, 2)}),
    ((16, 8, 5, 5), (32, 8, 9, 9), {"padding": 4}),               # 81 taps: in order, none
]


@pytest.mark.parametrize("k", range(len(SKIPPING)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_taps_in_the_padding_are_skipped_with_the_im2col_bits(k, dtype, rng):
    """The direct path leaves out the taps of a small image's windows that fall in the padding
    (fma(w, 0, c) is c for a finite w), its positions grouped by the taps they keep: the bits of
    the windows' matmul, whatever the tiles. A weight that is not finite (inf x 0 is NaN) runs
    every tap of its K block: the matmul's NaNs where its windows reach the padding, the same
    bits elsewhere."""
    xs, ws, attrs = SKIPPING[k]
    _has_the_im2col_bits(rng, xs, ws, attrs, [
        None, ts.Schedule(block=(32, 2 * int(np.prod(xs[2:])), 64))], dtype)
    x, w = _case(rng, xs, ws, dtype)
    w[1, 2, 0, 0] = np.inf                   # (the top-left tap: padding at the first row)
    cols, out = _im2col(x, ws, attrs)
    want = ts.function(lambda a, b: op.matmul(a, b))(w.reshape(1, ws[0], -1), cols)
    got = ts.function(lambda x, w: op.conv(x, w, **attrs))(x, w)
    want = want.reshape(got.shape)
    assert np.isnan(want).any()              # (some windows reach the padding there)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert got[ok].tobytes() == want[ok].tobytes()


@pytest.mark.parametrize("k", range(len(SKIPPING)))
def test_the_weight_gradient_skips_the_padding_with_the_windows_bits(k, rng):
    """The direct weight gradient skips the same taps (a tap's row leaves out the positions
    whose window has it in the padding), its rows grouped by tap (a task of 16 channels' taps:
    whole micro-tiles of one tap): the bits of the cotangent's matmul with the windows; an
    infinite cotangent runs every position of its block (the matmul's NaNs where it meets the
    padding)."""
    xs, ws, attrs = SKIPPING[k]
    whole = ts.Schedule(block=(32, 144, 256))    # (16 channels' taps: 16 rows a tap, pure tiles)
    _weight_gradient_has_the_windows_bits(rng, xs, ws, attrs, [
        None, ts.Schedule(block=(32, 40, 64)), whole])
    x, w = _case(rng, xs, ws, np.float32)
    cols, out = _im2col(x, ws, attrs)
    gy = rng.standard_normal((xs[0], ws[0], *out)).astype(np.float32)
    gy[1, 2, 0, 0] = np.inf                  # (the first position: its windows reach the padding)
    P = int(np.prod(out))
    want = ts.function(lambda a, b: op.matmul(a, b))(
        gy.transpose(1, 0, 2, 3).reshape(1, ws[0], -1),
        cols.transpose(1, 0, 3, 2).reshape(1, xs[0] * P, -1)).reshape(ws)
    got = ts.function(lambda x, w, gy: ts.grad(
        lambda w: op.sum(op.conv(x, w, **attrs) * gy))(w)).with_schedule(whole)(x, w, gy)
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert got[ok].tobytes() == want[ok].tobytes()


def test_small_images_tasks_are_whole_images_by_all_the_rows():
    """ResNet's small layers at batch 32: each task whole images (columns from 128 to 1024)
    by every output channel up to 512, in SMALL_IMAGE_TASKS tasks where their columns stay
    within 1024, else MIN_TASKS (fewer, squarer tasks pack less: 7% faster at 7x7x512 on a
    2-core Xeon); a batch of 2x2 images is one column of tasks, its rows split (a column split
    packs the weights again); a small batch keeps the finer grid."""
    from tessera.compiler.strategies.conv import SMALL_IMAGE_TASKS
    from tessera.compiler.strategies.routines.c_gemm import MIN_TASKS
    for n, c, hw, whole, least in [(32, 512, 7, True, SMALL_IMAGE_TASKS),
                                   (32, 256, 4, True, SMALL_IMAGE_TASKS),
                                   (32, 256, 14, True, MIN_TASKS), (32, 128, 28, True, MIN_TASKS),
                                   (32, 64, 56, False, MIN_TASKS), (8, 512, 7, False, MIN_TASKS),
                                   (32, 512, 2, False, SMALL_IMAGE_TASKS)]:
        x, w = np.zeros((n, c, hw, hw), np.float32), np.zeros((c, c, 3, 3), np.float32)
        kn = ts.function(lambda x, w: op.conv(x, w, padding=1)).lower(x, w).schedule_ir \
            .kernels[0].knobs
        P, cols = hw * hw, kn["tile_n"]
        tasks = -(-c // kn["tile_m"]) * (-(-n // (cols // P)) if cols >= P else n * -(-P // cols))
        assert tasks >= least
        assert (kn["tile_m"] == min(c, 512) and cols % P == 0 and 128 <= cols <= 1024) == whole
        if hw == 2:
            assert cols == n * P and tasks == SMALL_IMAGE_TASKS


def test_a_convolutions_epilogue_is_fused(rng):
    """Bias, batch norm folded at inference, a residual and an activation run over each
    finished tile of the convolution's kernel: one kernel, PyTorch's values."""
    x = rng.standard_normal((2, 6, 12, 10)).astype(np.float32)
    w = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    b, scale = (rng.standard_normal(8).astype(np.float32) for _ in range(2))
    res = rng.standard_normal((2, 8, 6, 5)).astype(np.float32)

    def block(x, w, b, scale, res):
        y = op.conv(x, w, stride=2, padding=1) + op.reshape(b, (1, 8, 1, 1))
        return op.relu(y * op.reshape(scale, (1, 8, 1, 1)) + res)
    f = ts.function(block)
    assert [kn.strategy for kn in f.lower(x, w, b, scale, res).schedule_ir.kernels] == ["conv"]
    t = [torch.from_numpy(a).double() for a in (x, w, b, scale, res)]
    want = torch.relu(F.conv2d(t[0], t[1], t[2], stride=2, padding=1) * t[3][:, None, None] +
                      t[4]).numpy()
    np.testing.assert_allclose(f(x, w, b, scale, res), want, rtol=1e-4, atol=1e-4)
    # a residual read through a transpose: its spatial axes are not one run
    g = ts.function(lambda x, w, r: op.conv(x, w, stride=2, padding=1) +
                    op.permute(r, (0, 1, 3, 2)))
    r = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    assert [kn.strategy for kn in g.lower(x, w, r).schedule_ir.kernels] == ["conv"]
    want = F.conv2d(t[0], t[1], stride=2, padding=1) + \
        torch.from_numpy(r).double().permute(0, 1, 3, 2)
    np.testing.assert_allclose(g(x, w, r), want.numpy(), rtol=1e-4, atol=1e-4)


def test_a_stride_1_transposed_convolution_runs_as_a_convolution(rng):
    """At stride 1 the transposed convolution (a convolution's data gradient) is a convolution
    of the flipped kernel with its channels swapped: the conv strategy's kernel, no col2im."""
    y = rng.standard_normal((2, 6, 7, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    for attrs in ({"padding": 1}, {"padding": (1, 0), "groups": 3, "dilation": 2},
                  {"padding": ((2, 1), (0, 1)), "output_padding": (1, 0), "dilation": (2, 1)}):
        f = ts.function(lambda y, w: op.conv_transpose(y, w, **attrs))
        assert "conv" in [kn.strategy for kn in f.lower(y, w).schedule_ir.kernels]
        pairs = not isinstance(attrs["padding"], int) and isinstance(attrs["padding"][0], tuple)
        t = F.conv_transpose2d(torch.from_numpy(y).double(), torch.from_numpy(w).double(),
                               **{k: v for k, v in attrs.items() if k != "padding"},
                               padding=0 if pairs else attrs["padding"])
        if pairs:                                            # PyTorch pads symmetrically only
            (a, b), (c, d) = attrs["padding"]
            t = t[:, :, a:t.shape[2] - b, c:t.shape[3] - d]
        np.testing.assert_allclose(f(y, w), t.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", range(len(CONV)))
def test_conv_in_float32_and_bfloat16(k, rng):
    xs, ws, attrs = CONV[k]
    x, w = _case(rng, xs, ws, np.float32)
    want = _torch_conv(len(xs) - 2)(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                    **attrs).numpy()
    got = ts.function(lambda x, w: op.conv(x, w, **attrs))(x, w)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
    xb, wb = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
    gotb = ts.function(lambda x, w: op.conv(x, w, **attrs))(xb, wb)
    wantb = _torch_conv(len(xs) - 2)(torch.from_numpy(xb.astype(np.float64)),
                                     torch.from_numpy(wb.astype(np.float64)), **attrs).numpy()
    assert gotb.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(gotb.astype(np.float64), wantb, rtol=2 ** -7,
                               atol=2 ** -7 * np.abs(wantb).max())


CONV_T = [  # (input shape, weight shape, attributes)
    ((2, 3, 7), (3, 4, 3), {}),
    ((1, 4, 5), (4, 3, 4), {"stride": 3, "padding": 1, "output_padding": 2, "groups": 2}),
    ((2, 4, 5, 4), (4, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((1, 4, 6, 5), (4, 3, 2, 3), {"stride": (2, 3), "dilation": (2, 1), "padding": (0, 2),
                                  "groups": 2}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 2, 3), {"stride": 2}),
]


@pytest.mark.parametrize("k", range(len(CONV_T)))
def test_conv_transpose_is_pytorchs_with_its_gradients(k, rng):
    ys, ws, attrs = CONV_T[k]
    y, w = _case(rng, ys, ws)
    n = len(ys) - 2
    ty, tw = (torch.from_numpy(a).requires_grad_() for a in (y, w))
    want = _torch_conv_t(n)(ty, tw, **attrs)
    g = rng.standard_normal(tuple(want.shape))
    want.backward(torch.from_numpy(g))
    f = ts.function(lambda y, w: op.conv_transpose(y, w, **attrs))
    np.testing.assert_allclose(f(y, w), want.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(op.conv_transpose(y, w, **attrs), want.detach().numpy(),
                               rtol=1e-10, atol=1e-10)
    dy, dw = ts.grad(lambda y, w, g: op.sum(op.conv_transpose(y, w, **attrs) * g),
                     argnums=(0, 1))(y, w, g)
    np.testing.assert_allclose(dy, ty.grad.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_strided_transpose_of_a_batch_is_each_images_bits(dtype, rng):
    """A strided transposed convolution decomposes into a product and col2im; for small
    images the product takes every image's positions as its columns (ops/conv.py), for one
    image its own: each image of a batch has the bits of that image alone; a grouped, strided
    convolution's weight gradient PyTorch's values."""
    y = rng.standard_normal((5, 6, 3, 4)).astype(dtype)
    w = rng.standard_normal((6, 4, 3, 3)).astype(dtype)
    attrs = {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}
    f = ts.function(lambda y, w: op.conv_transpose(y, w, **attrs))
    whole = f(y, w)
    for i in range(5):
        assert f(y[i:i + 1], w).tobytes() == whole[i:i + 1].tobytes(), i
    x = rng.standard_normal((3, 4, 11, 10))
    wc = rng.standard_normal((6, 2, 3, 2))
    dw = ts.grad(lambda w: op.sum(op.conv(x, w, stride=(2, 1), padding=1, groups=2) ** 2))(wc)
    tw = torch.from_numpy(wc).requires_grad_()
    (F.conv2d(torch.from_numpy(x), tw, stride=(2, 1), padding=1, groups=2) ** 2).sum().backward()
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-9, atol=1e-9)


WGRAD = STRATEGY + [
    ((3, 4, 20, 20), (8, 4, 3, 3), {"padding": 1}),     # rows of 20: the padded-row layout, a
    ((2, 3, 33, 34), (6, 3, 7, 7), {"stride": 2, "padding": 3}),     # K block across images;
    ((2, 5, 40, 18), (4, 5, 3, 3), {"stride": (1, 2), "padding": (1, 0)}),  # stride phases
]


@pytest.mark.parametrize("k", range(len(WGRAD)))
def test_a_weight_gradient_has_the_bits_of_the_windows_matmul(k, rng):
    """The weight gradient (conv_weight_grad, compiler/strategies/conv_grad.py) computes each
    element as the GEMM routine's fma chain over (image, position): bit for bit the matmul of
    the cotangent with the windows built in NumPy, whatever its tiles (K blocks that split an
    image's rows, cross images, or hold one row) and threads; in float64 PyTorch's gradient."""
    xs, ws, attrs = WGRAD[k]
    _weight_gradient_has_the_windows_bits(rng, xs, ws, attrs, [
        None, ts.Schedule(block=(6, 32, 64)), ts.Schedule(block=(7, 50, 5), parallel=False),
        ts.Schedule(block=(16, 64, 13))])


@pytest.mark.parametrize("k", range(len(DIRECT)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_direct_weight_gradient_has_the_bits_of_the_windows_matmul(k, dtype, rng):
    """A weight gradient whose output channels fill the channel vectors runs direct too (the
    taps' values broadcast from the laid-out input rows against the cotangent's transposed
    panels): bit for bit the windows' matmul over blocks of whole rows of each image in order
    (k 64: rows split), with a last group of taps in part and tiles of 30 channels beside a last
    one of 2 (the packed path's)."""
    xs, ws, attrs, _ = DIRECT[k]
    _weight_gradient_has_the_windows_bits(rng, xs, ws, attrs, [
        None, ts.Schedule(block=(32, 40, 64)), ts.Schedule(block=(30, 64, 256)),
        ts.Schedule(block=(64, 100, 1000), parallel=False)], dtype)


def test_weight_gradients_of_few_columns_split_their_rows_where_that_moves_less():
    """Columns split into one-panel tasks copy the cotangent's rows for each 32 columns: the
    rows split in two instead (every column in each tile) where that moves fewer values (the
    7 x 7 stem: 4.4 -> 2.3 ms on a 2-core Xeon) or the columns make one task (a 1 x 1 layer
    of 32 channels); a strided 1 x 1 layer, whose windows outweigh the cotangent, keeps them."""
    from tessera.compiler.strategies.conv_grad import moved
    for xs, ws, attrs, halves in [((32, 3, 64, 64), (64, 3, 7, 7), dict(stride=2, padding=3), True),
                                  ((8, 32, 32, 32), (256, 32, 1, 1), {}, True),
                                  ((32, 64, 16, 16), (128, 64, 1, 1), dict(stride=2), False)]:
        x, w = np.zeros(xs, np.float32), np.zeros(ws, np.float32)
        out = [(n + 2 * attrs.get("padding", 0) - k) // attrs.get("stride", 1) + 1
               for n, k in zip(xs[2:], ws[2:])]
        gy = np.zeros((xs[0], ws[0], *out), np.float32)
        f = ts.function(lambda x, w, gy: ts.grad(lambda w: op.sum(op.conv(x, w, **attrs) * gy))(w))
        [kn] = [k.knobs for k in f.lower(x, w, gy).schedule_ir.kernels
                if k.strategy == "conv_weight_grad"]
        J = int(np.prod(ws[1:]))
        assert (kn["tile_m"], kn["tile_n"]) == ((ws[0] // 2, J) if halves else (ws[0], 32))
        g = {"N": xs[0], "Og": ws[0], "Cg": ws[1], "KK": J // ws[1], "G": 1,
             "P": int(np.prod(out)), "in": [1, *xs[2:]]}
        if xs[1] != 32:                                    # (the one-task case: any movement)
            assert (moved(g, ws[0] // 2, J) < moved(g, ws[0], 32)) == halves


def test_weight_gradient_tasks_are_whole_units_of_channels_taps():
    """A group of TAP_ROWS channels or more splits its columns into TASKS tasks of whole units
    of TAP_ROWS channels' taps in whole panels (ResNet's 3x3 layers: 288 columns a unit), so
    that each task copies G's rows fewer times and the direct micro-tiles are one tap each."""
    from tessera.compiler.strategies.conv_grad import PANEL, TAP_ROWS, TASKS
    for c, hw in [(128, 8), (64, 16), (256, 4), (512, 2), (128, 28)]:
        x, gy = np.zeros((32, c, hw, hw), np.float32), np.zeros((32, c, hw, hw), np.float32)
        w = np.zeros((c, c, 3, 3), np.float32)
        f = ts.function(lambda x, w, gy: ts.grad(lambda w: op.sum(op.conv(x, w, padding=1) * gy))(w))
        [kn] = [k.knobs for k in f.lower(x, w, gy).schedule_ir.kernels
                if k.strategy == "conv_weight_grad"]
        unit = np.lcm(PANEL, 9 * TAP_ROWS)
        assert kn["tile_m"] == c and kn["tile_n"] % unit == 0
        assert -(-9 * c // kn["tile_n"]) == max(1, min(TASKS, 9 * c // unit))


def _weight_gradient_has_the_windows_bits(rng, xs, ws, attrs, schedules, dtype=np.float32):
    x, w = _case(rng, xs, ws, dtype)
    cols, out = _im2col(x, ws, attrs)
    g, N, O = attrs.get("groups", 1), xs[0], ws[0]
    P = int(np.prod(out))
    gy = rng.standard_normal((N, O, *out)).astype(dtype)
    gm = gy.reshape(N, g, O // g, P).transpose(1, 2, 0, 3).reshape(g, O // g, N * P)
    cm = cols.transpose(1, 0, 3, 2).reshape(g, N * P, -1)
    want = ts.function(lambda a, b: op.matmul(a, b))(gm, cm).reshape(ws)

    def dw(x, w, gy):
        return ts.grad(lambda w: op.sum(op.conv(x, w, **attrs) * gy))(w)
    f = ts.function(dw)
    assert "conv_weight_grad" in [kn.strategy for kn in f.lower(x, w, gy).schedule_ir.kernels]
    for sched in schedules:
        got = (f if sched is None else f.with_schedule(sched))(x, w, gy)
        assert got.tobytes() == want.tobytes(), sched
    x64, w64, gy64 = (a.astype(np.float64) for a in (x, w, gy))
    tw = torch.from_numpy(w64).requires_grad_()
    _torch_conv(len(xs) - 2)(torch.from_numpy(x64), tw, **attrs).backward(torch.from_numpy(gy64))
    np.testing.assert_allclose(ts.function(dw)(x64, w64, gy64), tw.grad.numpy(), rtol=1e-10,
                               atol=1e-10)


def test_a_weight_gradient_fuses_the_momentum_update(rng):
    """SGD with momentum's update of the gradient is the weight gradient's epilogue: one
    kernel, the bits of the unfused program's."""
    x, w = _case(rng, (4, 6, 12, 12), (8, 6, 3, 3), np.float32)
    buf = rng.standard_normal(w.shape).astype(np.float32)
    gy = rng.standard_normal((4, 8, 12, 12)).astype(np.float32)

    def step(x, gy, buf):
        return buf * 0.9 + op.conv_weight_grad(x, gy, kernel=[3, 3], padding=1)
    f = ts.function(step)
    assert [kn.strategy for kn in f.lower(x, gy, buf).schedule_ir.kernels] == \
        ["conv_weight_grad"]
    dw = ts.function(lambda x, gy: op.conv_weight_grad(x, gy, kernel=[3, 3], padding=1))(x, gy)
    assert f(x, gy, buf).tobytes() == (buf * np.float32(0.9) + dw).tobytes()


def test_second_derivatives_through_a_weight_gradient(rng):
    """grad of the weight gradient (its adjoints: a transposed convolution and a convolution)
    against PyTorch's double backward."""
    x, w = _case(rng, (2, 3, 8, 7), (4, 3, 3, 2))
    r = rng.standard_normal(w.shape)
    attrs = {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2)}
    tx, tw = (torch.from_numpy(a).requires_grad_() for a in (x, w))
    (gw,) = torch.autograd.grad((F.conv2d(tx, tw, **attrs) ** 2).sum(), tw, create_graph=True)
    hx, hw = torch.autograd.grad((gw * torch.from_numpy(r)).sum(), (tx, tw))

    def outer(x, w, r):
        return op.sum(ts.grad(lambda w: op.sum(op.conv(x, w, **attrs) ** 2))(w) * r)
    gx, gw2 = ts.grad(outer, argnums=(0, 1))(x, w, r)
    np.testing.assert_allclose(gx, hx.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(gw2, hw.numpy(), rtol=1e-9, atol=1e-9)


def test_second_derivatives_of_a_convolution(rng):
    """grad of grad (the transposed convolution's own adjoints): against PyTorch's."""
    x, w = _case(rng, (1, 2, 7, 6), (3, 2, 3, 3))
    attrs = {"stride": 2, "padding": 1}
    tx, tw = (torch.from_numpy(a).requires_grad_() for a in (x, w))
    (gx,) = torch.autograd.grad((F.conv2d(tx, tw, **attrs) ** 2).sum(), tx, create_graph=True)
    (hw,) = torch.autograd.grad(gx.sum(), tw)

    def inner(x, w):
        return op.sum(op.conv(x, w, **attrs) ** 2)
    got = ts.grad(lambda x, w: op.sum(ts.grad(inner)(x, w)), argnums=1)(x, w)
    np.testing.assert_allclose(got, hw.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "circular"])
def test_pad_is_numpys_and_its_gradient_pytorchs(mode, rng):
    x = rng.standard_normal((2, 5, 6))
    pads = [[0, 0], [2, 3], [1, 0]] if mode != "circular" else [[0, 0], [2, 3], [1, 4]]
    value = 1.5 if mode == "constant" else 0.0
    f = ts.function(lambda x: op.pad(x, pads, mode=mode, value=value))
    np_mode = {"circular": "wrap"}.get(mode, mode)
    want = np.pad(x, pads, mode=np_mode, **({"constant_values": value}
                                            if mode == "constant" else {}))
    np.testing.assert_array_equal(f(x), want)
    np.testing.assert_array_equal(op.pad(x, pads, mode=mode, value=value), want)
    g = rng.standard_normal(want.shape)
    tx = torch.from_numpy(x).requires_grad_()
    torch_mode = {"edge": "replicate"}.get(mode, mode)
    flat = [p for pair in reversed(pads[1:]) for p in pair]      # PyTorch: last axis first
    tp = F.pad(tx.unsqueeze(0), flat, mode=torch_mode, value=value)[0] \
        if mode != "constant" else F.pad(tx, flat, value=value)
    tp.backward(torch.from_numpy(g))
    got = ts.grad(lambda x, g: op.sum(op.pad(x, pads, mode=mode, value=value) * g))(x, g)
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.bool_])
def test_a_constant_pad_is_one_kernel_numpys(dtype, rng):
    """A constant pad of fixed shapes copies its input into the interior and fills each slab
    of the border in one kernel (a pad per axis would copy the whole once per axis): np.pad's
    values, bit for bit."""
    x = (rng.standard_normal((2, 3, 7, 5)) * 4).astype(dtype)
    pads = [[0, 1], [2, 0], [1, 3], [0, 0]]
    f = ts.function(lambda x: op.pad(x, pads, value=1))
    assert [k.strategy for k in f.lower(x).schedule_ir.kernels] == ["concat"]
    assert f(x).tobytes() == np.pad(x, pads, constant_values=dtype(1)).tobytes()


def test_negative_pads_crop_and_the_widest_reflection(rng):
    x = rng.standard_normal((4, 6))
    f = ts.function(lambda x: op.pad(x, [[-1, 2], [5, -2]], mode="reflect"))
    cropped = x[1:, :4]
    want = np.pad(cropped, [(0, 2), (3, 0)], mode="reflect")
    got = ts.function(lambda x: op.pad(x, [[-1, 2], [3, -2]], mode="reflect"))(x)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ts.ShapeError, match="reflect padding of 5"):
        f(x)
    widest = ts.function(lambda x: op.pad(x, [[3, 3], [0, 0]], mode="reflect"))(x)
    np.testing.assert_array_equal(widest, np.pad(x, [(3, 3), (0, 0)], mode="reflect"))


BAD = [
    (lambda x, w: op.conv(x, w[:, :2]), ts.ShapeError, "input channels per group"),
    (lambda x, w: op.conv(x, w, groups=2), ts.ShapeError, "input channels per group"),
    (lambda x, w: op.conv(x, w, groups=4), ts.ShapeError, "must divide"),
    (lambda x, w: op.conv(x[:, :, :2, :2], w), ts.ShapeError, "larger than the padded input"),
    (lambda x, w: op.conv(x, w, stride=-1), ts.ArgumentError, "stride must be at least 1"),
    (lambda x, w: op.conv(x, w, stride=2, padding="same"), ts.ArgumentError, "needs stride 1"),
    (lambda x, w: op.conv(x[0], w), ts.ShapeError, "weight is"),
    (lambda x, w: op.conv(x > 0, w > 0), ts.DTypeError, "float or integer"),
    (lambda x, w: op.conv_weight_grad(x, w[:1], kernel=2), ts.ShapeError,
     r"convolution's output shape \(4 along spatial axis 0\)"),
    (lambda x, w: op.conv_weight_grad(x, w, kernel=3), ts.ShapeError, "as many images"),
    (lambda x, w: op.conv_weight_grad(x, w[:1, :2], kernel=3, groups=2), ts.ShapeError,
     "divide into 2 groups"),
]


@pytest.mark.parametrize("k", range(len(BAD)))
def test_bad_convolutions_name_the_users_line(k, rng):
    fn, err, text = BAD[k]
    x, w = _case(rng, (1, 3, 5, 5), (6, 3, 3, 3), np.float32)
    with pytest.raises(err, match=text) as e:
        ts.function(fn)(x, w)
    assert "test_conv.py:" in str(e.value)


POOLS = [  # (input shape, attributes)
    ((2, 3, 9, 8), {"kernel": 2}),
    ((2, 3, 9, 8), {"kernel": 3, "stride": 2, "padding": 1}),
    ((1, 2, 10, 7), {"kernel": (3, 2), "stride": (2, 3), "ceil_mode": True}),
    ((1, 2, 11), {"kernel": 4, "stride": 3, "padding": 2, "ceil_mode": True}),
    ((1, 2, 5, 6, 7), {"kernel": 2, "stride": (1, 2, 2), "padding": 1, "ceil_mode": True}),
    # windows of over 32 taps, pooled one axis at a time
    ((1, 2, 23, 21), {"kernel": (7, 6), "stride": (3, 2), "padding": 3, "ceil_mode": True}),
    ((1, 2, 9, 8, 7), {"kernel": (4, 3, 3), "stride": 2, "padding": (2, 1, 1)}),
]


def _torch_pool(kind, x, attrs, **extra):
    n = x.dim() - 2
    fn = getattr(F, f"{kind}_pool{n}d")
    return fn(x, kernel_size=attrs["kernel"], stride=attrs.get("stride"),
              padding=attrs.get("padding", 0), ceil_mode=attrs.get("ceil_mode", False), **extra)


@pytest.mark.parametrize("k", range(len(POOLS)))
@pytest.mark.parametrize("kind", ["max", "avg", "avg-exclude-pad"])
def test_pools_are_pytorchs_with_their_gradients(k, kind, rng):
    shape, attrs = POOLS[k]
    x = rng.standard_normal(shape)
    if kind == "max":               # ties (the first largest gets the cotangent) and a NaN
        x = np.round(x * 2) / 2
        x.flat[5] = np.nan
    extra = {"count_include_pad": False} if kind == "avg-exclude-pad" else {}
    name = "max_pool" if kind == "max" else "avg_pool"
    tx = torch.from_numpy(x).requires_grad_()
    want = _torch_pool(kind[:3], tx, attrs, **extra)
    g = rng.standard_normal(tuple(want.shape))

    def pool(x):
        return getattr(op, name)(x, **attrs, **extra)
    # (an average near 0 cancels: its rounding is relative to the window's values, not to it)
    tol = {"rtol": 1e-12, "atol": 1e-14 * np.nanmax(np.abs(x))}
    np.testing.assert_allclose(ts.function(pool)(x), want.detach().numpy(), **tol)
    np.testing.assert_allclose(pool(x), want.detach().numpy(), **tol)
    def loss(x, g):                 # (the NaN window's value left out of the loss)
        y = pool(x)
        return op.sum(op.where(y != y, 0.0, y * g))
    got = ts.grad(loss)(x, g)
    tx.grad = None
    y = _torch_pool(kind[:3], tx, attrs, **extra)
    torch.where(torch.isnan(y), torch.zeros_like(y), y * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-12, atol=1e-12)


POOLED = [  # (input shape, kernel, stride, padding): planes several a task, rows of one plane
    ((2, 3, 9, 8), 3, 2, 1),                    # (its tiles), strided columns' phases, 1-D
    ((1, 2, 131, 133), 3, 1, 1),                # and 3-D (the routine element by element);
    ((1, 2, 100, 118), 3, 2, 1),                # a plane laid out a block of rows at a time
    ((1, 2, 20, 31), (2, 3), (1, 3), (1, 1)),
    ((2, 2, 40), 5, 2, 2),
    ((1, 2, 5, 6, 7), 3, 2, 1),
]


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("k", range(len(POOLED)))
def test_pools_are_one_kernel_with_the_bits_of_the_chain_over_the_windows(kind, k, rng):
    """A float32 pool is one kernel of the pool strategy (avg_pool's division by the counts,
    and the arithmetic after, its epilogue) computing the chain of elementwise maxima (NaN
    propagating) or sums over the kernel offsets' slices that other dtypes decompose into: bit
    for bit that chain in NumPy, over NaN, infinities and zeros of both signs."""
    xs, kernel, stride, pad = POOLED[k]
    x = -np.abs(rng.standard_normal(xs)).astype(np.float32)     # ties of zeros of both signs
    x.flat[::3], x.flat[1::5], x.flat[::29], x.flat[1::31] = -0.0, 0.0, np.nan, np.inf
    pool = getattr(op, f"{kind}_pool")
    f = ts.function(lambda x: pool(x, kernel, stride, pad) * 2.0)
    assert [kn.strategy for kn in f.lower(x).schedule_ir.kernels] == ["pool"]
    n = len(xs) - 2
    kernel, stride, pad = ((v,) * n if isinstance(v, int) else v for v in (kernel, stride, pad))
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad], constant_values=fill)
    out = [(xs[2 + a] + 2 * pad[a] - kernel[a]) // stride[a] + 1 for a in range(n)]
    y = None
    for off in np.ndindex(*kernel):
        s = xp[(slice(None), slice(None)) + tuple(slice(o, o + (m - 1) * st + 1, st)
                                                  for o, m, st in zip(off, out, stride))]
        y = s if y is None else (y + s if kind == "avg" else
                                 np.where((y > s) | np.isnan(y), y, s))
    if kind == "avg":
        y = y / np.float32(np.prod(kernel))
    assert f(x).tobytes() == (y * np.float32(2)).tobytes()


@pytest.mark.parametrize("k", range(len(POOLED)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_windows_first_largest_offset_is_argmax_over_the_stacked_windows(k, dtype, rng):
    """fold_windows' argmax (max_pool's gradient, max_pool_indices) is one kernel of the pool
    strategy reading the windows where they lie: bit for bit NumPy's argmax over the stacked
    windows padded with -inf (the first largest; the first NaN; of zeros of both signs the
    first), over NaN, infinities, ties and windows of padding and -inf alone."""
    xs, kernel, stride, pad = POOLED[k]
    x = -np.abs(rng.standard_normal(xs)).astype(dtype)
    x.flat[::3], x.flat[1::5], x.flat[::29], x.flat[1::31] = -0.0, 0.0, np.nan, np.inf
    x.flat[2::11] = -np.inf
    n = len(xs) - 2
    kernel, stride, pad = ((v,) * n if isinstance(v, int) else v for v in (kernel, stride, pad))
    attrs = {"kernel": list(kernel), "stride": list(stride), "padding": [[p, p] for p in pad],
             "dilation": [1] * n, "combine": "argmax"}
    f = ts.function(lambda x: apply("fold_windows", x, **attrs))
    assert [kn.strategy for kn in f.lower(x).schedule_ir.kernels] == ["pool"]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad], constant_values=-np.inf)
    out = [(xs[2 + a] + 2 * pad[a] - kernel[a]) // stride[a] + 1 for a in range(n)]
    stack = np.stack([xp[(slice(None), slice(None)) + tuple(
        slice(o, o + (m - 1) * st + 1, st) for o, m, st in zip(off, out, stride))]
        for off in np.ndindex(*kernel)], axis=2)
    np.testing.assert_array_equal(f(x), np.argmax(stack, axis=2))


COL2IM = [  # (image, kernel, stride, padding pairs, dilation)
    ((9, 8), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),       # a max pool's adjoint
    ((12, 11), (3, 2), (1, 3), ((2, 0), (0, 2)), (2, 1)),     # stride 1 rows, phases of 3
    ((33, 29), (3, 3), (2, 2), ((1, 2), (1, 2)), (1, 1)),     # ceil mode's wider pad, rows
    ((40,), (5,), (2,), ((2, 2),), (1,)),                     # past a phase buffer's chunk
    ((5, 6, 7), (3, 2, 2), (2, 1, 2), ((1, 1), (0, 1), (1, 0)), (1, 2, 1)),           # 3-D
    ((7, 6), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),       # stride 1: no phases
    ((4, 5, 6), (2, 3, 3), (2, 1, 1), ((0, 1), (1, 1), (1, 1)), (1, 1, 1)),   # strided slabs
]


@pytest.mark.parametrize("k", range(len(COL2IM)))
def test_col2im_is_one_kernel_with_the_bits_of_the_placed_slices_chain(k, rng):
    """col2im (the pools' adjoint, a strided transposed convolution's last step) is one kernel
    of its strategy, each element the first offset's value then each later offset's added (+0
    where its slice puts nothing): bit for bit that chain of placed slices in NumPy, over NaN,
    infinities and zeros of both signs, whatever the planes a task takes; its epilogue fused."""
    image, kernel, stride, pads, dil = COL2IM[k]
    grid = [(i + lo + hi - d * (kk - 1) - 1) // s + 1 for i, kk, s, (lo, hi), d in
            zip(image, kernel, stride, pads, dil)]
    c = rng.standard_normal((2, 3, int(np.prod(kernel)), *grid)).astype(np.float32)
    c.flat[::3], c.flat[1::7], c.flat[::37], c.flat[1::41] = -0.0, 0.0, np.inf, np.nan
    c[0, 0] = -0.0             # a plane of -0: -0 where every offset reaches, +0 elsewhere
    attrs = {"image": list(image), "kernel": list(kernel), "stride": list(stride),
             "padding": [list(p) for p in pads], "dilation": list(dil)}
    f = ts.function(lambda c: op.col2im(c, **attrs) * 2.0)
    assert [kn.strategy for kn in f.lower(c).schedule_ir.kernels] == ["col2im"]
    padded = [i + lo + hi for i, (lo, hi) in zip(image, pads)]
    total = None
    for j, off in enumerate(np.ndindex(*kernel)):
        piece = np.zeros((2, 3, *padded), np.float32)
        piece[(slice(None), slice(None)) + tuple(slice(o * d, o * d + (m - 1) * s + 1, s) for
                                                 o, d, m, s in zip(off, dil, grid, stride))] = \
            c[:, :, j]
        total = piece if total is None else total + piece
    want = total[(slice(None), slice(None)) + tuple(slice(lo, lo + i) for i, (lo, _) in
                                                    zip(image, pads))] * np.float32(2)
    for sched in (None, ts.Schedule(block=(1, 1), parallel=False)):
        got = (f if sched is None else f.with_schedule(sched))(c)
        assert got.tobytes() == want.tobytes(), sched


def test_pool_and_strided_transpose_gradients_run_col2im(rng):
    """max_pool's and avg_pool's gradients and a strided transposed convolution end in one
    col2im kernel each (no chain of placed slices), with PyTorch's values."""
    x = rng.standard_normal((2, 3, 12, 11))
    g = rng.standard_normal((2, 3, 6, 6))
    for kind in ("max", "avg"):
        pool = getattr(op, f"{kind}_pool")
        f = ts.function(lambda x, g: ts.grad(lambda x: op.sum(pool(x, 3, 2, 1) * g))(x))
        kinds = [kn.strategy for kn in f.lower(x, g).schedule_ir.kernels]
        assert kinds.count("col2im") == 1 and kinds[-1] == "col2im", kinds
        tx = torch.from_numpy(x).requires_grad_()
        (getattr(F, f"{kind}_pool2d")(tx, 3, 2, 1) * torch.from_numpy(g)).sum().backward()
        np.testing.assert_allclose(f(x, g), tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    w = rng.standard_normal((3, 4, 3, 3))
    y = ts.function(lambda x, w: op.conv_transpose(x, w, stride=2, padding=1))
    assert "col2im" in [kn.strategy for kn in y.lower(x, w).schedule_ir.kernels]
    np.testing.assert_allclose(y(x, w), F.conv_transpose2d(torch.from_numpy(x),
                                                           torch.from_numpy(w), stride=2,
                                                           padding=1).numpy(), rtol=1e-12,
                               atol=1e-12)


def test_a_window_inside_the_padding_and_a_window_larger_than_the_input(rng):
    """A padding wider than half the window (ONNX allows it, PyTorch refuses) gives windows
    without an input element: -inf from max_pool, NaN from avg_pool excluding the padding; a
    kernel larger than the padded input is a ShapeError at the user's line."""
    x = rng.standard_normal((1, 1, 3, 3))
    y = ts.function(lambda x: op.max_pool(x, kernel=2, padding=2))(x)
    assert y.shape == (1, 1, 3, 3) and y[0, 0, 0, 0] == -np.inf and np.isfinite(y[0, 0, 1, 1])
    a = ts.function(lambda x: op.avg_pool(x, kernel=2, padding=2, count_include_pad=False))(x)
    assert np.isnan(a[0, 0, 0, 0]) and a[0, 0, 1, 1] == pytest.approx(x[0, 0, :2, :2].mean())
    with pytest.raises(ts.ShapeError, match="larger than the padded input") as e:
        ts.function(lambda x: op.max_pool(x, kernel=5))(x)
    assert "test_conv.py:" in str(e.value)


@pytest.mark.parametrize("size", [(3, 2), (7, 5), 1, (4, None), (2, 5)])
def test_adaptive_and_global_pools_are_pytorchs(size, rng):
    x = rng.standard_normal((3, 6, 7, 5))
    full = size if isinstance(size, int) else tuple(x.shape[2 + i] if s is None else s
                                                     for i, s in enumerate(size))
    tx = torch.from_numpy(x)
    for ours, theirs in ((op.adaptive_avg_pool, F.adaptive_avg_pool2d),
                         (op.adaptive_max_pool, F.adaptive_max_pool2d)):
        got = ts.function(lambda x: ours(x, size))(x)
        np.testing.assert_allclose(got, theirs(tx, full).numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ts.function(op.global_avg_pool)(x),
                               F.adaptive_avg_pool2d(tx, 1).numpy(), rtol=1e-12)
    np.testing.assert_array_equal(ts.function(op.global_max_pool)(x),
                                  F.adaptive_max_pool2d(tx, 1).numpy())


def test_normalisations_are_pytorchs_with_their_gradients(rng):
    x = rng.standard_normal((3, 6, 7, 5))
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    rm, rv = rng.standard_normal(6), rng.uniform(0.5, 2, 6)
    tx, tw, tb = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    cases = {
        "batch_norm eval": (lambda x, w, b: op.batch_norm(x, rm, rv, w, b),
                            lambda: F.batch_norm(tx, torch.from_numpy(rm), torch.from_numpy(rv),
                                                 tw, tb, False)),
        "batch_norm train": (lambda x, w, b: op.batch_norm(x, None, None, w, b, training=True),
                             lambda: F.batch_norm(tx, None, None, tw, tb, True)),
        "group_norm": (lambda x, w, b: op.group_norm(x, 3, w, b),
                       lambda: F.group_norm(tx, 3, tw, tb)),
        "instance_norm": (lambda x, w, b: op.instance_norm(x, w, b),
                          lambda: F.instance_norm(tx, weight=tw, bias=tb)),
    }
    for name, (ours, theirs) in cases.items():
        for t in (tx, tw, tb):
            t.grad = None
        want = theirs()
        g = rng.standard_normal(tuple(want.shape))
        want.backward(torch.from_numpy(g))
        np.testing.assert_allclose(ts.function(ours)(x, w, b), want.detach().numpy(),
                                   rtol=1e-10, atol=1e-12, err_msg=name)
        grads = ts.grad(lambda x, w, b, g: op.sum(ours(x, w, b) * g), argnums=(0, 1, 2))(
            x, w, b, g)
        for got, t in zip(grads, (tx, tw, tb)):
            np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-9, atol=1e-10, err_msg=name)
    trm, trv = torch.from_numpy(rm.copy()), torch.from_numpy(rv.copy())
    F.batch_norm(torch.from_numpy(x), trm, trv, None, None, True, 0.1)
    _, new_mean, new_var = ts.function(
        lambda x: op.batch_norm(x, rm, rv, training=True, momentum=0.1))(x)
    np.testing.assert_allclose(new_mean, trm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(new_var, trv.numpy(), rtol=1e-12)


def test_pixel_shuffles_and_depth_to_space_are_pytorchs_and_onnxs(rng):
    z = rng.standard_normal((2, 8, 3, 4))
    np.testing.assert_array_equal(ts.function(lambda x: op.pixel_shuffle(x, 2))(z),
                                  F.pixel_shuffle(torch.from_numpy(z), 2).numpy())
    np.testing.assert_array_equal(ts.function(lambda x: op.depth_to_space(x, 2, "CRD"))(z),
                                  F.pixel_shuffle(torch.from_numpy(z), 2).numpy())
    u = rng.standard_normal((2, 2, 6, 4))
    np.testing.assert_array_equal(ts.function(lambda x: op.pixel_unshuffle(x, 2))(u),
                                  F.pixel_unshuffle(torch.from_numpy(u), 2).numpy())
    # ONNX's DCR order, as its specification writes it in NumPy
    N, C, H, W = z.shape
    dcr = z.reshape(N, 2, 2, C // 4, H, W).transpose(0, 3, 4, 1, 5, 2).reshape(N, C // 4, 2 * H,
                                                                                 2 * W)
    np.testing.assert_array_equal(ts.function(lambda x: op.depth_to_space(x, 2))(z), dcr)
    s2d = u.reshape(2, 2, 3, 2, 2, 2).transpose(0, 3, 5, 1, 2, 4).reshape(2, 8, 3, 2)
    np.testing.assert_array_equal(ts.function(lambda x: op.space_to_depth(x, 2))(u), s2d)
    np.testing.assert_array_equal(ts.function(lambda x: op.depth_to_space(
        op.space_to_depth(x, 2), 2))(u), u)


RESIZES = [  # (ours, PyTorch's interpolate arguments)
    ({"size": (11, 3), "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
     {"size": (11, 3), "mode": "nearest"}),
    ({"size": (11, 3), "nearest_mode": "round_prefer_ceil"},
     {"size": (11, 3), "mode": "nearest-exact"}),
    ({"size": (11, 8), "mode": "linear"}, {"size": (11, 8), "mode": "bilinear"}),
    ({"size": (4, 3), "mode": "linear"}, {"size": (4, 3), "mode": "bilinear"}),
    ({"size": (11, 8), "mode": "linear", "coordinate_transformation_mode": "align_corners"},
     {"size": (11, 8), "mode": "bilinear", "align_corners": True}),
    ({"size": (11, 8), "mode": "cubic"}, {"size": (11, 8), "mode": "bicubic"}),
    ({"size": (13, 9), "mode": "cubic", "coordinate_transformation_mode": "align_corners"},
     {"size": (13, 9), "mode": "bicubic", "align_corners": True}),
    ({"scale": 2.0, "mode": "linear"}, {"scale_factor": 2, "mode": "bilinear"}),
]


@pytest.mark.parametrize("k", range(len(RESIZES)))
def test_resize_is_pytorchs_interpolate_with_its_gradient(k, rng):
    ours, theirs = RESIZES[k]
    x = rng.standard_normal((2, 3, 7, 5))
    tx = torch.from_numpy(x).requires_grad_()
    want = F.interpolate(tx, **theirs)
    g = rng.standard_normal(tuple(want.shape))
    want.backward(torch.from_numpy(g))
    np.testing.assert_allclose(ts.function(lambda x: op.resize(x, **ours))(x),
                               want.detach().numpy(), rtol=1e-12, atol=1e-12)
    got = ts.grad(lambda x, g: op.sum(op.resize(x, **ours) * g))(x, g)
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
