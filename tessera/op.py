"""The operator namespace: ``op.matmul``, ``op.softmax``, ...

Every function here goes through ``trace.apply``: inside a tessera function it records a Graph IR
node; on NumPy arrays it runs eagerly through the operator's NumPy reference.
"""
from __future__ import annotations

import builtins as _builtins
import inspect as _inspect

from . import ops as _ops
from .errors import ArgumentError as _ArgumentError
from .errors import ShapeError as _ShapeError
from .trace import apply as _apply
from .trace import element_counters as _counters
from .trace import lift as _lift
from .trace import dtype_of as _dtype_of


def _make(name):
    opdef = _ops.get(name)
    attr_names = list(opdef.attrs)
    nin = 1 if opdef.nin == -1 else opdef.nin

    operands = ["x"] if nin == 1 else [f"x{i}" for i in range(nin)]

    def fn(*args, **kwargs):
        if len(args) < nin:                 # operands by name (x, x0, x1 ...), as bound
            args = args + tuple(kwargs.pop(n) for n in operands[len(args):] if n in kwargs)
        if len(args) < nin:
            raise _ArgumentError(f"op.{name} takes {nin} tensor operand(s), got {len(args)}")
        tensors, rest = args[:nin], args[nin:]
        if len(rest) > len(attr_names):
            raise _ArgumentError(f"op.{name} got {len(args)} positional arguments",
                                 expected=f"{nin} operand(s) then {', '.join(attr_names)}")
        attrs = dict(zip(attr_names, rest))
        for k in kwargs:
            if k in attrs:
                raise _ArgumentError(f"op.{name} got {k!r} twice")
        attrs.update(kwargs)
        return _apply(name, *tensors, **attrs)

    fn.__name__ = fn.__qualname__ = name
    # the signature a reader (and ts.function's binding) sees: operands, then attributes
    P = _inspect.Parameter
    fn.__signature__ = _inspect.Signature(
        [P(n, P.POSITIONAL_OR_KEYWORD) for n in operands] +
        [P(k, P.POSITIONAL_OR_KEYWORD, default=v) for k, v in opdef.attrs.items()])
    sig = ", ".join(operands)
    sig += "".join(f", {k}={v!r}" for k, v in opdef.attrs.items())
    fn.__doc__ = f"op.{name}({sig})\n\n{opdef.doc}"
    return fn


for _name in _ops.REGISTRY:      # (control flow is tessera.fori_loop & co, tessera/control.py)
    if _name not in ("layernorm", "rmsnorm", "attention", "cast", "matmul", "matmul_integer",
                     "round_stochastic", "softplus", "tile_program", "conv",
                     "conv_transpose") + _ops.regions.REGION_OPS + \
            _ops.host.HOST_OPS:
        globals()[_name] = _make(_name)

_layernorm = _make("layernorm")
_rmsnorm = _make("rmsnorm")
_attention = _make("attention")
_cast = _make("cast")
_matmul = _make("matmul")
_round_stochastic = _make("round_stochastic")
_softplus = _make("softplus")
_conv = _make("conv")
_conv_transpose = _make("conv_transpose")


def cast(x, dtype, saturate=False):
    """x converted to ``dtype`` (NumPy's astype; into a narrow float, the exact value rounded
    once to nearest even, from float64 and integers too). ``saturate=True`` (to a float dtype): values beyond the dtype's largest finite
    value, infinities included, become that value (NaN stays NaN), as fp8 training clamps."""
    from . import dtypes as dt
    d = dt.get(dtype)
    if saturate and d.is_float:
        top = d.max_finite
        src = _apply("cast", x, dtype="float32") if _dtype_of(x).is_narrow else x
        x = clamp(src, -top, top)
    return _cast(x, dtype=d.name)


def round_stochastic(x, dtype, seed, offset=0):
    """x rounded to the narrow float ``dtype`` (float16, bfloat16 or an fp8 format) at random:
    to the neighbour farther from zero with probability |x - nearer| / |farther - nearer|, so
    unbiased; element i (row-major) draws the generator's number for the counter ``offset + i``
    of stream ``seed`` (as op.random_uniform), so the same seed gives the same bits."""
    return _round_stochastic(x, seed, _counters(_shape_of(x), offset), dtype=dtype)


def matmul(a, b, tile_shape=None, scale_a=None, scale_b=None):
    """a @ b with NumPy's broadcasting of batch dimensions; ``tile_shape=(BM, BN, BK)`` sets
    the kernel's tiles. fp8 operands widen exactly and give a float32 product; per-tensor
    ``scale_a`` and ``scale_b`` (numbers or rank-0 tensors, as from an amax) multiply that
    product once, as fp8 GEMMs apply their scales to the accumulator."""
    out = _matmul(a, b, tile_shape=tile_shape)
    scales = [s for s in (scale_a, scale_b) if s is not None]
    if len(scales) == 2 and not any(hasattr(s, "shape") for s in scales):
        scales = [float(scales[0]) * float(scales[1])]      # one multiply, exact in double
    elif len(scales) == 2:
        scales = [_apply("mul", scales[0], scales[1])]
    return _apply("mul", out, scales[0]) if scales else out


def attention(q, k, v, mask=None, causal=False, scale=None):
    """softmax(scale * q @ k^T + mask) @ v over the last axis, as one flash-attention kernel.

    q: [..., Sq, D], k: [..., Sk, D], v: [..., Sk, Dv]; ``mask`` is additive (0 keeps, -inf
    drops) and broadcasts to [..., Sq, Sk]; ``causal`` lets query i see keys j <= i + Sk - Sq;
    ``scale`` defaults to 1/sqrt(D). A query that sees no key gets 0."""
    return _attention(q, k, v, 0.0 if mask is None else mask, causal=causal, scale=scale)


def layernorm(x, weight=None, bias=None, eps=1e-5, axis=-1):
    """(x - mean) / sqrt(var + eps) over ``axis``, then ``* weight + bias`` when given."""
    y = _layernorm(x, axis=axis, eps=eps)
    if weight is not None:
        y = _apply("mul", y, weight)
    if bias is not None:
        y = _apply("add", y, bias)
    return y


def rmsnorm(x, weight=None, eps=1e-6, axis=-1):
    """x / sqrt(mean(x*x) + eps) over ``axis``, then ``* weight`` when given."""
    y = _rmsnorm(x, axis=axis, eps=eps)
    return y if weight is None else _apply("mul", y, weight)


def _channel_bias(y, bias):
    """y [N, O, *spatial] plus a per-channel bias [O]."""
    if bias is None:
        return y
    return y + reshape(bias, (-1,) + (1,) * (len(_shape_of(y)) - 2))


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """PyTorch's conv1d/conv2d/conv3d (a cross-correlation): x [N, C, *spatial], weight
    [O, C/groups, *kernel], bias [O] or None; padding an int, one per axis, (before, after)
    pairs, "same" (stride 1) or "valid". See tessera/ops/conv.py."""
    return _channel_bias(_conv(x, weight, stride=stride, padding=padding, dilation=dilation,
                               groups=groups), bias)


def conv_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, dilation=1,
                   groups=1):
    """PyTorch's conv_transpose1d/2d/3d: x [N, C, *spatial], weight [C, O/groups, *kernel]:
    the data gradient of the convolution with the same attributes."""
    return _channel_bias(_conv_transpose(x, weight, stride=stride, padding=padding,
                                         output_padding=output_padding, dilation=dilation,
                                         groups=groups), bias)


# ---- the convolution family's compositions (NCHW: channels on axis 1) ----------------------------
def _spatial_axes(x, what):
    rank = len(_shape_of(x))
    if rank < 3:
        raise _ArgumentError(f"{what} takes [N, C, *spatial]", received=f"rank {rank}")
    return list(range(2, rank))


def global_avg_pool(x):
    """The mean over every spatial axis of x [N, C, *spatial], kept as size 1 (ONNX's
    GlobalAveragePool, PyTorch's adaptive_avg_pool to 1)."""
    return mean(x, axis=_spatial_axes(x, "global_avg_pool"), keepdim=True)


def global_max_pool(x):
    """The largest element over every spatial axis of x [N, C, *spatial], kept as size 1."""
    return max(x, axis=_spatial_axes(x, "global_max_pool"), keepdim=True)


def adaptive_avg_pool(x, output_size):
    """PyTorch's adaptive_avg_pool1d/2d/3d: output bin i of an axis of n averages elements
    floor(i n / m) .. ceil((i + 1) n / m) - 1 (an int or None per axis: None keeps it)."""
    return _adaptive(x, output_size, mean, "adaptive_avg_pool")


def adaptive_max_pool(x, output_size):
    """PyTorch's adaptive_max_pool1d/2d/3d (values): the largest element of each bin."""
    return _adaptive(x, output_size, max, "adaptive_max_pool")


def _adaptive(x, output_size, reduce, what):
    axes = _spatial_axes(x, what)
    shape = _shape_of(x)
    sizes = [output_size] * len(axes) if isinstance(output_size, int) else list(output_size)
    if len(sizes) != len(axes):
        raise _ArgumentError(f"{what}'s output_size is an int or one per spatial axis",
                             received=repr(output_size))
    for axis, m in zip(axes, sizes):
        n = shape[axis]
        if m is None or m == n:
            continue
        if not isinstance(m, int) or m < 1:
            raise _ArgumentError(f"{what}'s output sizes are positive ints",
                                 received=repr(output_size))
        if n % m == 0:                       # equal bins: one reshape and one reduction
            s = list(_shape_of(x))
            x = reduce(reshape(x, s[:axis] + [m, n // m] + s[axis + 1:]), axis=axis + 1)
            continue
        def bin_(i, rank=len(shape)):
            lo, hi = i * n // m, -(-(i + 1) * n // m)
            return slice(x, [lo if k == axis else None for k in range(rank)],
                         [hi if k == axis else None for k in range(rank)], [1] * rank)
        bins = [reduce(bin_(i), axis=axis, keepdim=True) for i in range(m)]
        x = concat(bins, axis=axis)
    return x


def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """PyTorch's batch_norm over x [N, C, *spatial], per channel. Inference (training=False):
    the running statistics. Training: the batch's (its mean, and its variance without
    correction to normalise), and, when running statistics are given, returns
    ``(y, new_running_mean, new_running_var)``, blended with ``momentum`` (the running
    variance unbiased, as PyTorch's)."""
    shape = _shape_of(x)
    axes = [0] + _spatial_axes(x, "batch_norm")
    per_channel = [1, shape[1]] + [1] * (len(shape) - 2)

    def channel(v):
        return reshape(v, per_channel)
    if training:
        m, v = mean(x, axis=axes, keepdim=True), var(x, axis=axes, keepdim=True)
    elif running_mean is None or running_var is None:
        raise _ArgumentError("batch_norm in inference needs running_mean and running_var",
                             hint="or training=True for the batch's statistics")
    else:
        m, v = channel(running_mean), channel(running_var)
    y = (x - m) * rsqrt(v + eps)
    if weight is not None:
        y = y * channel(weight)
    if bias is not None:
        y = y + channel(bias)
    if not training or running_mean is None:
        return y
    count = 1
    for a in axes:
        count *= shape[a]
    unbiased = reshape(v, (shape[1],)) * (count / _builtins.max(count - 1, 1))
    return (y, running_mean * (1 - momentum) + reshape(m, (shape[1],)) * momentum,
            running_var * (1 - momentum) + unbiased * momentum)


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """PyTorch's group_norm: x [N, C, *spatial] normalised over each group of C / num_groups
    channels and the spatial axes, then a per-channel affine."""
    shape = list(_shape_of(x))
    C = shape[1]
    if not isinstance(num_groups, int) or num_groups < 1 or C % num_groups:
        raise _ArgumentError(f"group_norm's num_groups must divide the {C} channels",
                             received=repr(num_groups))
    g = reshape(x, [shape[0], num_groups, -1])
    m, v = mean(g, axis=2, keepdim=True), var(g, axis=2, keepdim=True)
    y = reshape((g - m) * rsqrt(v + eps), shape)
    per_channel = [1, C] + [1] * (len(shape) - 2)
    if weight is not None:
        y = y * reshape(weight, per_channel)
    if bias is not None:
        y = y + reshape(bias, per_channel)
    return y


def instance_norm(x, weight=None, bias=None, eps=1e-5):
    """PyTorch's instance_norm (without running statistics): each channel of each sample
    normalised over its spatial axes, then a per-channel affine."""
    return group_norm(x, _shape_of(x)[1], weight, bias, eps)


def pixel_shuffle(x, upscale_factor):
    """PyTorch's pixel_shuffle (ONNX's DepthToSpace in CRD mode): [N, C r^2, H, W] to
    [N, C, H r, W r]."""
    N, C, H, W = _shape_of(x)
    r = upscale_factor
    if C % (r * r):
        raise _ArgumentError(f"pixel_shuffle: {C} channels are not a multiple of {r}^2")
    y = reshape(x, (N, C // (r * r), r, r, H, W))
    return reshape(transpose(y, (0, 1, 4, 2, 5, 3)), (N, C // (r * r), H * r, W * r))


def pixel_unshuffle(x, downscale_factor):
    """PyTorch's pixel_unshuffle (ONNX's SpaceToDepth is its DCR order: space_to_depth):
    [N, C, H r, W r] to [N, C r^2, H, W]."""
    N, C, H, W = _shape_of(x)
    r = downscale_factor
    if H % r or W % r:
        raise _ArgumentError(f"pixel_unshuffle: {H}x{W} is not a multiple of {r}")
    y = reshape(x, (N, C, H // r, r, W // r, r))
    return reshape(transpose(y, (0, 1, 3, 5, 2, 4)), (N, C * r * r, H // r, W // r))


def depth_to_space(x, blocksize, mode="DCR"):
    """ONNX's DepthToSpace: [N, C r^2, H, W] to [N, C, H r, W r]; mode "DCR" (depth, column,
    row: ONNX's default) or "CRD" (= pixel_shuffle)."""
    if mode == "CRD":
        return pixel_shuffle(x, blocksize)
    if mode != "DCR":
        raise _ArgumentError(f"depth_to_space's mode is 'DCR' or 'CRD', not {mode!r}")
    N, C, H, W = _shape_of(x)
    r = blocksize
    y = reshape(x, (N, r, r, C // (r * r), H, W))
    return reshape(transpose(y, (0, 3, 4, 1, 5, 2)), (N, C // (r * r), H * r, W * r))


def space_to_depth(x, blocksize, mode="DCR"):
    """ONNX's SpaceToDepth: [N, C, H r, W r] to [N, C r^2, H, W]; mode "DCR" (its default) or
    "CRD" (opset 28: = pixel_unshuffle)."""
    if mode == "CRD":
        return pixel_unshuffle(x, blocksize)
    if mode != "DCR":
        raise _ArgumentError(f"space_to_depth's mode is 'DCR' or 'CRD', not {mode!r}")
    N, C, H, W = _shape_of(x)
    r = blocksize
    y = reshape(x, (N, C, H // r, r, W // r, r))
    return reshape(transpose(y, (0, 3, 5, 1, 2, 4)), (N, C * r * r, H // r, W // r))


RESIZE_COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                      "half_pixel_symmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize(x, size=None, scale=None, mode="nearest", coordinate_transformation_mode="half_pixel",
           nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=False,
           axes=None, antialias=False, roi=None, extrapolation_value=0.0):
    """ONNX's Resize (and PyTorch's interpolate): each axis in ``axes`` (default the spatial
    ones, 2 on) resized to ``size`` (one per axis) or by ``scale`` (the output size its floor),
    ``mode`` "nearest", "linear" or "cubic", an output coordinate mapped to the input by
    ``coordinate_transformation_mode`` (half_pixel, pytorch_half_pixel, align_corners,
    asymmetric, half_pixel_symmetric: ONNX's formulas), neighbours beyond the edges the edge
    element (or, with ``exclude_outside``, left out and the weights renormalised);
    ``antialias`` widens a linear or cubic filter by 1/scale when downscaling;
    coordinate_transformation_mode "tf_crop_and_resize" reads the region ``roi`` ({axis:
    (start, end)} as fractions of the axis) and gives ``extrapolation_value`` outside it.
    PyTorch's
    modes: "nearest" is asymmetric with floor, "bilinear" linear with half_pixel
    (align_corners=False) or align_corners, "bicubic" cubic with A = -0.75. Each axis is one
    gather per tap and a weighted sum (gradients through take's adjoint)."""
    import numpy as np
    shape = _shape_of(x)
    axes = list(range(2, len(shape))) if axes is None else [a % len(shape) for a in axes]
    if (size is None) == (scale is None):
        raise _ArgumentError("resize takes size or scale, one of them")
    seq = size if size is not None else scale
    seq = [seq] * len(axes) if isinstance(seq, (int, float)) else list(seq)
    if len(seq) != len(axes):
        raise _ArgumentError(f"resize: one size or scale per axis ({len(axes)})",
                             received=repr(size if size is not None else scale))
    if mode not in ("nearest", "linear", "cubic"):
        raise _ArgumentError(f"resize mode {mode!r}", expected="nearest, linear or cubic")
    if coordinate_transformation_mode == "tf_crop_and_resize" and roi is None:
        raise _ArgumentError("tf_crop_and_resize needs roi={axis: (start, end)}")
    if coordinate_transformation_mode not in RESIZE_COORDINATES + ("tf_crop_and_resize",):
        raise _ArgumentError(f"coordinate_transformation_mode {coordinate_transformation_mode!r}",
                             expected=", ".join(RESIZE_COORDINATES))
    if nearest_mode not in NEAREST_MODES:
        raise _ArgumentError(f"nearest_mode {nearest_mode!r}", expected=", ".join(NEAREST_MODES))
    narrow = _dtype_of(x).is_narrow and mode != "nearest"
    if narrow:                              # weighted in float32, rounded once at the end
        narrow, x = _dtype_of(x).name, cast(x, "float32")
    for axis, v in zip(axes, seq):
        n = shape[axis]
        if size is not None:
            m, sc = int(v), int(v) / n
        else:
            sc = float(v)
            m = int(np.floor(n * sc))
        if m < 1 or sc <= 0:
            raise _ArgumentError(f"resize: axis {axis} of {n} to {m} elements")
        idx, weights, outside = _resize_taps(
            n, m, sc, mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
            exclude_outside, antialias, length=m if size is not None else n * sc,
            roi=(roi or {}).get(axis, (0.0, 1.0)))
        like = [1] * len(shape)
        like[axis] = m
        out = None
        for j in range(idx.shape[1]):
            tap = take(x, np.ascontiguousarray(idx[:, j]), axis=axis)
            if mode != "nearest":
                tap = tap * weights[:, j].reshape(like).astype(_dtype_of(x).name)
            out = tap if out is None else out + tap
        if outside.any():
            out = where(outside.reshape(like), extrapolation_value, out)
        x = out
        shape = _shape_of(x)
    return cast(x, narrow) if narrow else x


def _resize_taps(n, m, scale, mode, coordinates, nearest_mode, a, exclude_outside,
                 antialias=False, length=None, roi=(0.0, 1.0)):
    """For each of the m outputs along an axis of n: the input indices it reads, their
    weights, and whether it lies outside the region of interest (tf_crop_and_resize), as
    ONNX's reference computes them (in float64; ``length``: the output's length as a number,
    n * scale when a scale was given, which align_corners divides by)."""
    import numpy as np
    i = np.arange(m, dtype=np.float64)
    length = m if length is None else length
    outside = np.zeros(m, bool)
    if coordinates == "tf_crop_and_resize":
        lo, hi = roi
        src = i * (hi - lo) * (n - 1) / (length - 1) if length != 1 else \
            np.full(m, (hi - lo) * (n - 1) / 2)
        src = src + lo * (n - 1)
        outside = (src < 0) | (src > n - 1)
    elif coordinates == "half_pixel":
        src = (i + 0.5) / scale - 0.5
    elif coordinates == "pytorch_half_pixel":
        src = (i + 0.5) / scale - 0.5 if m > 1 else np.zeros(m)
    elif coordinates == "align_corners":
        src = i * (n - 1) / (length - 1) if length != 1 else np.zeros(m)
    elif coordinates == "asymmetric":
        src = i / scale
    else:                                           # half_pixel_symmetric (opset 19)
        src = n / 2 * (1 - m / (n * scale)) + (i + 0.5) / scale - 0.5
    if mode == "nearest":
        base = np.floor(src)
        frac = src - base
        up = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5,
              "floor": np.zeros(m, bool), "ceil": frac > 0}[nearest_mode]
        idx = (base + up).astype(np.int64)[:, None]
        return np.clip(idx, 0, n - 1), np.ones((m, 1)), outside
    base = np.ceil(src) - 1                         # (the left neighbour: r in (0, 1])
    r = (src - base)[:, None]
    s = _builtins.min(scale, 1.0) if antialias else 1.0     # antialias: a wider filter
    if mode == "linear":
        start = int(np.floor(-1 / s) + 1)
        offsets = np.arange(start, 2 - start)
        w = np.clip(1 - np.abs((offsets[None, :] - r) * s), 0, 1)
    else:
        start = int(np.floor(-2 / s) + 1)
        offsets = np.arange(start, 2 - start)
        t = np.abs((offsets[None, :] - r) * s)
        w = np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                     np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))
    w = w / w.sum(axis=1, keepdims=True)
    idx = base[:, None].astype(np.int64) + offsets[None, :]
    if exclude_outside:
        w = np.where((idx >= 0) & (idx < n), w, 0.0)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n - 1), w, outside


def clamp(x, min=None, max=None):
    """x limited to [min, max] (either may be None, or a tensor that broadcasts): maximum with
    ``min``, then minimum with ``max``, as NumPy's clip and torch.clamp; NaN stays NaN."""
    if min is None and max is None:
        raise _ArgumentError("op.clamp needs min, max or both")
    if min is not None:
        x = _apply("maximum", x, min)
    return x if max is None else _apply("minimum", x, max)


# ---- logic on truth values (NumPy's names): any dtype read as nonzero-is-true -------------------
def _truth(x):
    return _apply("cast", x, dtype="bool")


def logical_and(a, b):
    """a and b, elementwise, as bools (NumPy's logical_and)."""
    return _apply("minimum", _truth(a), _truth(b))


def logical_or(a, b):
    """a or b, elementwise, as bools (NumPy's logical_or)."""
    return _apply("maximum", _truth(a), _truth(b))


def logical_xor(a, b):
    """a != b as truth values (NumPy's logical_xor)."""
    return _apply("ne", _truth(a), _truth(b))


def logical_not(x):
    """not x, elementwise, as bools (NumPy's logical_not)."""
    return _apply("eq", _truth(x), False)


# ---- activations beyond the registry's: compositions, differentiated through their parts --------
def softplus(x, beta=1.0):
    """log(1 + exp(beta x)) / beta, computed as max(y, 0) + log1p(exp(-|y|)) (y = beta x): no
    overflow, and the exact value where PyTorch's ``threshold`` switches to x (equal to it
    there in float32)."""
    if beta == 1.0:
        return _softplus(x)
    return _apply("div", _softplus(_apply("mul", x, float(beta))), float(beta))


def log_sigmoid(x):
    """log(sigmoid(x)) = -softplus(-x), finite for every finite x."""
    return _apply("neg", _softplus(_apply("neg", x)))


def logaddexp(a, b):
    """log(exp(a) + exp(b)) without overflow: max + log1p(exp(-|a - b|)) (NumPy's; two -inf
    give -inf)."""
    top = _apply("maximum", a, b)
    gap = _apply("where", _apply("eq", a, b), 0.0, _apply("neg", _apply("abs",
                                                                        _apply("sub", a, b))))
    return _apply("add", top, _apply("log1p", _apply("exp", gap)))


def elu(x, alpha=1.0):
    """x for x > 0, alpha * expm1(x) below (torch.nn.functional.elu)."""
    neg = _apply("mul", _apply("expm1", _apply("minimum", x, 0.0)), float(alpha))
    return _apply("where", _apply("gt", x, 0.0), x, neg)


def celu(x, alpha=1.0):
    """max(0, x) + min(0, alpha * expm1(x / alpha)) (torch's celu)."""
    a = float(alpha)
    neg = _apply("mul", _apply("expm1", _apply("div", _apply("minimum", x, 0.0), a)), a)
    return _apply("where", _apply("gt", x, 0.0), x, neg)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772, 1.0507009873554805


def selu(x):
    """scale * elu(x, alpha) with the self-normalising constants (Klambauer et al.)."""
    return _apply("mul", elu(x, _SELU_ALPHA), _SELU_SCALE)


def leaky_relu(x, negative_slope=0.01):
    """x for x >= 0, negative_slope * x below."""
    return _apply("where", _apply("ge", x, 0.0), x, _apply("mul", x, float(negative_slope)))


def hardtanh(x, min_val=-1.0, max_val=1.0):
    """x clamped to [min_val, max_val]."""
    return clamp(x, float(min_val), float(max_val))


def hardsigmoid(x):
    """clamp(x + 3, 0, 6) / 6 (PyTorch's formula: no cancellation near -3)."""
    return _apply("div", clamp(_apply("add", x, 3.0), 0.0, 6.0), 6.0)


def hardswish(x):
    """x * clamp(x + 3, 0, 6) / 6."""
    return _apply("div", _apply("mul", x, clamp(_apply("add", x, 3.0), 0.0, 6.0)), 6.0)


def softsign(x):
    """x / (1 + |x|)."""
    return _apply("div", x, _apply("add", _apply("abs", x), 1.0))


def mish(x):
    """x * tanh(softplus(x)) (Misra 2019)."""
    return _apply("mul", x, _apply("tanh", _softplus(x)))


def fmod(a, b):
    """C's fmod (NumPy's np.fmod, torch.fmod): the remainder of a / b truncated toward zero,
    with a's sign, exact (the floor remainder of |a| and |b|, given a's sign; -0.0 gives +0.0);
    integers by zero give 0."""
    r = _apply("mod", _apply("abs", a), _apply("abs", b))
    return _apply("where", _apply("lt", a, 0), _apply("neg", r), r)


def trunc_divide(a, b):
    """a / b rounded toward zero: C's integer division (torch.div(rounding_mode="trunc"),
    JAX's lax.div of integers); floats: the true quotient truncated. Integers by zero give 0."""
    if not _dtype_of(a).is_int or not _dtype_of(b).is_int:
        q = _apply("div", a, b)
        return _apply("where", _apply("lt", q, 0), _apply("ceil", q), _apply("floor", q))
    q = _apply("floor_divide", a, b)
    inexact = _apply("ne", _apply("mod", a, b), 0)
    signs = _apply("ne", _apply("lt", a, 0), _apply("lt", b, 0))
    return _apply("where", _apply("minimum", inexact, signs), _apply("add", q, 1), q)


# log Gamma and digamma on x > 0, made of tessera operators (so they run on every target,
# compiled or eager, and differentiate to any order): the recurrence shifts x to y = x + 16,
# where Stirling's series to y^-7 (y^-8 for digamma) is below 1e-15 relative
_GAMMA_SHIFT = 16
_HALF_LOG_2PI = 0.9189385332046727


def lgamma(x):
    """log Gamma(x) for x > 0 (what the densities need; NaN for x <= 0, inf at 0):
    log Gamma(x + 16) by Stirling's series less log x(x+1)...(x+15). Absolute error about
    1e-14 in float64 (the log terms' rounding; 1e-14 relative above 1), 1e-5 in float32."""
    shift = _apply("log", x)
    for i in range(1, _GAMMA_SHIFT):
        shift = _apply("add", shift, _apply("log", _apply("add", x, float(i))))
    y = _apply("add", x, float(_GAMMA_SHIFT))
    r = _apply("div", 1.0, y)
    r2 = _apply("mul", r, r)
    series = 1 / 1260 - 1 / 1680 * r2            # 1/(12y) - 1/(360y^3) + 1/(1260y^5) - ...
    series = _apply("mul", r, _apply("sub", 1 / 12, _apply("mul", r2, _apply(
        "sub", 1 / 360, _apply("mul", r2, series)))))
    stirling = _apply("add", _apply("sub", _apply("mul", _apply("sub", y, 0.5),
                                                   _apply("log", y)), y), _HALF_LOG_2PI)
    return _apply("sub", _apply("add", stirling, series), shift)


def digamma(x):
    """d/dx log Gamma(x) for x > 0: digamma(x + 16) by its asymptotic series less the sum of
    1/(x + i) for i < 16. Absolute error about 1e-14 in float64, 1e-6 in float32."""
    shift = _apply("div", 1.0, x)
    for i in range(1, _GAMMA_SHIFT):
        shift = _apply("add", shift, _apply("div", 1.0, _apply("add", x, float(i))))
    y = _apply("add", x, float(_GAMMA_SHIFT))
    r = _apply("div", 1.0, y)
    r2 = _apply("mul", r, r)
    series = 1 / 252 - 1 / 240 * r2              # 1/(12y^2) - 1/(120y^4) + 1/(252y^6) - ...
    series = _apply("mul", r2, _apply("sub", 1 / 12, _apply("mul", r2, _apply(
        "sub", 1 / 120, _apply("mul", r2, series)))))
    asymptotic = _apply("sub", _apply("sub", _apply("log", y), _apply("mul", 0.5, r)), series)
    return _apply("sub", asymptotic, shift)


def einsum(spec, *operands):
    """Einstein summation, ``op.einsum("bij,bjk->bik", a, b)``, lowered to the operators the
    compiler fuses and tiles: a letter only one operand has and the result lacks is summed
    first; then operands are contracted left to right, each pair as one (batched) matmul of
    transposed, reshaped operands; the result is transposed into the order asked. Without
    ``->`` the result takes the letters seen once, sorted (NumPy's rule). Not supported, with
    a clear error: ``...``, and a letter twice in one operand (a diagonal)."""
    from .shapes import prod, same
    spec = str(spec).replace(" ", "")
    lhs, arrow, out = spec.partition("->")
    inputs = lhs.split(",")
    if "." in spec:
        raise _ArgumentError(f"op.einsum({spec!r}): '...' is not supported",
                             hint="name every axis with a letter")
    if len(inputs) != len(operands):
        raise _ArgumentError(f"op.einsum({spec!r}) names {len(inputs)} operand(s) but got "
                             f"{len(operands)}")
    letters = "".join(inputs)
    if not arrow:
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for word in (*inputs, out):
        if not all(c.isalpha() and c.isascii() for c in word) or len(set(word)) != len(word):
            raise _ArgumentError(f"op.einsum({spec!r}): {word!r} must be distinct letters",
                                 hint="a letter twice in one operand (a diagonal) is not "
                                      "supported: use op.take or a mask")
    if set(out) - set(letters):
        raise _ArgumentError(f"op.einsum({spec!r}): the result's "
                             f"{''.join(sorted(set(out) - set(letters)))!r} is in no operand")
    size = {}
    for k, (word, x) in enumerate(zip(inputs, operands)):
        shape = tuple(x.shape) if hasattr(x, "shape") else ()
        if len(shape) != len(word):
            raise _ArgumentError(f"op.einsum({spec!r}): operand {k} has rank {len(shape)} but "
                                 f"{word!r} names {len(word)} axes")
        for c, d in zip(word, shape):
            if c in size and not same(size[c], d):
                raise _ShapeError(f"op.einsum({spec!r}): {c!r} is {size[c]} in one operand and "
                                 f"{d} in operand {k}")
            size.setdefault(c, d)

    def arrange(x, word, order):                # transpose x (axes named by word) to order
        perm = [word.index(c) for c in order]
        return x if perm == sorted(perm) else _apply("transpose", x, perm=perm)

    def reshape(x, shape):                      # (no node when the shape is already so)
        now = tuple(x.shape) if hasattr(x, "shape") else ()
        if len(now) == len(shape) and all(same(a, b) for a, b in zip(now, shape)):
            return x
        return _apply("reshape", x, shape=list(shape))

    def reduce_private(x, word, others):        # sum the letters nobody else needs
        gone = [i for i, c in enumerate(word) if c not in out and c not in others]
        if not gone:
            return x, word
        return (_apply("sum", x, axis=gone, keepdim=False),
                "".join(c for i, c in enumerate(word) if i not in gone))

    terms = list(zip(operands, inputs))
    x, word = terms[0]
    x, word = reduce_private(x, word, "".join(w for _, w in terms[1:]))
    for j in range(1, len(terms)):
        y, yw = terms[j]
        later = "".join(w for _, w in terms[j + 1:])
        y, yw = reduce_private(y, yw, word + later)
        keep = out + later
        batch = [c for c in word if c in yw and c in keep]
        contract = [c for c in word if c in yw and c not in keep]
        fa = [c for c in word if c not in yw]
        fb = [c for c in yw if c not in word]
        bdims = [size[c] for c in batch]
        a = reshape(arrange(x, word, batch + fa + contract),
                    bdims + [prod(size[c] for c in fa), prod(size[c] for c in contract)])
        b = reshape(arrange(y, yw, batch + contract + fb),
                    bdims + [prod(size[c] for c in contract), prod(size[c] for c in fb)])
        x = reshape(_apply("matmul", a, b), bdims + [size[c] for c in fa + fb])
        word = "".join(batch + fa + fb)
    x, word = reduce_private(x, word, "")
    return arrange(x, word, out)


def norm(x, ord=2, axis=None, keepdim=False):
    """The vector norm over ``axis`` (all axes when None), as ``torch.linalg.vector_norm``:
    ``ord`` 2 (sqrt of the sum of squares; over two axes, Frobenius), 1, any p > 0
    (sum |x|^p)^(1/p), ``inf`` / ``-inf`` (max / min of |x|) or 0 (the count of nonzeros)."""
    import math
    if not isinstance(ord, (int, float)) or isinstance(ord, bool) or ord != ord or \
            (ord < 0 and ord != -math.inf):
        raise _ArgumentError(f"op.norm: ord={ord!r} is not a vector norm",
                             expected="2, 1, a p > 0, inf, -inf or 0")
    kw = dict(axis=axis, keepdim=keepdim)
    if ord == math.inf:
        return _apply("max", _apply("abs", x), **kw)
    if ord == -math.inf:
        return _apply("min", _apply("abs", x), **kw)
    if ord == 0:
        return _apply("sum", _apply("cast", _apply("ne", x, 0), dtype=_float_of(x)), **kw)
    if ord == 2:
        return _apply("sqrt", _apply("sum", _apply("mul", x, x), **kw))
    if ord == 1:
        return _apply("sum", _apply("abs", x), **kw)
    return _apply("pow", _apply("sum", _apply("pow", _apply("abs", x), float(ord)), **kw),
                  1.0 / ord)


def _float_of(x):
    d = getattr(x, "dtype", None)
    name = getattr(d, "name", str(d))
    return name if name in ("float16", "bfloat16", "float32", "float64") else "float64"


def one_hot(indices, num_classes, dtype="float32"):
    """``indices`` [...] -> [..., num_classes]: 1 where the last axis equals the index, else 0,
    in ``dtype``. An index outside [0, num_classes) gives a row of zeros (as JAX's one_hot)."""
    import numpy as np
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or \
            num_classes < 1:
        raise _ArgumentError(f"op.one_hot: num_classes must be a positive int, not "
                             f"{num_classes!r}")
    classes = _lift(np.arange(int(num_classes), dtype=np.int64))
    hit = _apply("eq", _apply("expand_dims", indices, axis=-1), classes)
    return _apply("cast", hit, dtype=dtype)


def _shape_of(x) -> tuple:
    """A traced tensor's or an array-like's shape."""
    import numpy as np
    return tuple(x.shape if hasattr(x, "shape") else np.shape(x))


def _shape_and_axis(x, axis):
    """x's shape, and ``axis`` normalised against it (a ShapeError if x has no such axis)."""
    from .ops.registry import norm_axis
    from .types import TensorType
    from . import dtypes
    shape = _shape_of(x)
    return shape, norm_axis(axis, len(shape), TensorType(dtypes.float32, shape))


def topk(x, k, axis=-1, largest=True):
    """The ``k`` largest (``largest=False``: smallest) elements along ``axis`` and their int64
    indices, as ``(values, indices)``, in order (PyTorch's ``topk``): equal elements go to the
    lower index first; NaN counts as the largest. The first k of a stable argsort, and the
    elements they pick."""
    import numpy as np
    if not _shape_of(x):
        raise _ArgumentError("op.topk of a rank-0 tensor (there is no axis)")
    shape, ax = _shape_and_axis(x, axis)
    n = shape[ax]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0 or \
            (isinstance(n, int) and k > n):
        raise _ArgumentError(f"op.topk: k={k!r} is not a count of elements along axis {ax}",
                             expected=f"an int in [0, {n}]")
    starts, stops = [None] * len(shape), [None] * len(shape)
    stops[ax] = int(k)
    first = dict(starts=starts, stops=stops, steps=[1] * len(shape))
    idx = _apply("slice", _apply("argsort", x, axis=ax, descending=bool(largest)), **first)
    return _apply("take_along_axis", x, idx, axis=ax), idx


def segment_sum(data, segment_ids, num_segments):
    """out[s] = the sum of data's rows (axis 0) whose id is s, for s in [0, num_segments):
    ``scatter_add`` into zeros, so rows with the same id add up in row order, deterministically.
    An id outside [-num_segments, num_segments) is an error (a RuntimeFault when compiled;
    negative ids count from the end, as take's)."""
    import numpy as np
    if isinstance(num_segments, bool) or not isinstance(num_segments, (int, np.integer)) or \
            num_segments < 0:
        raise _ArgumentError(f"op.segment_sum: num_segments must be an int >= 0, not "
                             f"{num_segments!r}")
    shape = _shape_of(data)
    if not shape:
        raise _ArgumentError("op.segment_sum of a rank-0 tensor (it sums rows, axis 0)")
    dtype = getattr(data, "dtype", None) or np.asarray(data).dtype
    zero = _lift(np.zeros((), dtype=getattr(dtype, "np", dtype)))
    target = _apply("broadcast_to", zero, shape=[int(num_segments), *shape[1:]])
    return _apply("scatter_add", target, segment_ids, data, axis=0)


def angle(z, deg=False):
    """The argument of each element, in (-pi, pi] (degrees with ``deg``): atan2(imag, real), so
    a negative real number's is pi, as NumPy's angle."""
    a = _apply("atan2", _apply("imag", z), _apply("real", z))
    return _apply("mul", a, 180.0 / 3.141592653589793) if deg else a


# ---- Fourier transforms over several axes (one-axis ones: ops/spectral.py) ----------------------
def _fft_axes(x, s, axes, last_two: bool):
    """NumPy's (s, axes) of an n-dimensional transform: axes default to the last len(s) (or the
    last two, or all), each transformed to s[i] points (None: its length)."""
    shape = _shape_of(x)
    if axes is None:
        axes = [-2, -1] if last_two else (list(range(-len(s), 0)) if s is not None
                                          else list(range(len(shape))))
    axes = [_shape_and_axis(x, a)[1] for a in axes]
    if len(set(axes)) != len(axes):
        raise _ArgumentError(f"repeated axis in {tuple(axes)}")
    if s is None:
        s = [None] * len(axes)
    if len(s) != len(axes):
        raise _ArgumentError(f"s={tuple(s)} and axes={tuple(axes)} differ in length")
    return list(s), axes


def _fftn(kind, x, s, axes, norm, last_two):
    s, axes = _fft_axes(x, s, axes, last_two)
    for n, a in zip(s, axes):
        x = _apply(kind, x, n=n, axis=a, norm=norm)
    return x


def fftn(x, s=None, axes=None, norm="backward"):
    """The transform over ``axes`` (all by default), one axis after another (NumPy's fftn)."""
    return _fftn("fft", x, s, axes, norm, False)


def ifftn(x, s=None, axes=None, norm="backward"):
    """The inverse of fftn over ``axes`` (all by default)."""
    return _fftn("ifft", x, s, axes, norm, False)


def fft2(x, s=None, axes=(-2, -1), norm="backward"):
    """fftn over the last two axes."""
    return _fftn("fft", x, s, axes, norm, True)


def ifft2(x, s=None, axes=(-2, -1), norm="backward"):
    """ifftn over the last two axes."""
    return _fftn("ifft", x, s, axes, norm, True)


def rfftn(x, s=None, axes=None, norm="backward"):
    """A real tensor's transform over ``axes``: rfft along the last of them, then fft along
    the others (NumPy's rfftn)."""
    s, axes = _fft_axes(x, s, axes, False)
    x = _apply("rfft", x, n=s[-1], axis=axes[-1], norm=norm)
    for n, a in zip(s[:-1], axes[:-1]):
        x = _apply("fft", x, n=n, axis=a, norm=norm)
    return x


def irfftn(x, s=None, axes=None, norm="backward"):
    """The inverse of rfftn: ifft along all but the last of ``axes``, then irfft along it
    (``s[-1]`` its output length; by default 2 (m - 1))."""
    s, axes = _fft_axes(x, s, axes, False)
    for n, a in zip(s[:-1], axes[:-1]):
        x = _apply("ifft", x, n=n, axis=a, norm=norm)
    return _apply("irfft", x, n=s[-1], axis=axes[-1], norm=norm)


def rfft2(x, s=None, axes=(-2, -1), norm="backward"):
    """rfftn over the last two axes."""
    return rfftn(x, s, axes, norm)


def irfft2(x, s=None, axes=(-2, -1), norm="backward"):
    """irfftn over the last two axes."""
    return irfftn(x, s, axes, norm)


def fftfreq(n, d=1.0):
    """The sample frequencies of an n-point transform with sample spacing d (NumPy's, float64):
    [0, 1, ..., (n-1)//2, -(n//2), ..., -1] / (d n). A constant: a NumPy array."""
    import numpy as np
    _check_points("fftfreq", n)
    return np.fft.fftfreq(int(n), d)


def rfftfreq(n, d=1.0):
    """The n // 2 + 1 non-negative frequencies of rfft's result (NumPy's rfftfreq)."""
    import numpy as np
    _check_points("rfftfreq", n)
    return np.fft.rfftfreq(int(n), d)


def _check_points(what, n):
    import numpy as np
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise _ArgumentError(f"op.{what}: n={n!r} is not a number of points",
                             expected="an int >= 1")


def fftshift(x, axes=None):
    """The zero frequency moved to the middle: a roll by n // 2 along ``axes`` (all by
    default), as NumPy's fftshift."""
    return _roll_half(x, axes, lambda n: n // 2)


def ifftshift(x, axes=None):
    """The inverse of fftshift: a roll by -(n // 2)."""
    return _roll_half(x, axes, lambda n: -(n // 2))


def _roll_half(x, axes, shift):
    shape = _shape_of(x)
    if axes is None:
        axes = range(len(shape))
    elif isinstance(axes, int):
        axes = [axes]
    for a in [_shape_and_axis(x, a)[1] for a in axes]:
        n = shape[a]
        k = shift(n) % n if n else 0
        if k == 0:
            continue
        rank = len(shape)
        cut = lambda lo, hi: _apply("slice", x, starts=[lo if i == a else None for i in range(rank)],
                                    stops=[hi if i == a else None for i in range(rank)], steps=None)
        x = _apply("concat", [cut(n - k, n), cut(0, n - k)], axis=a)
    return x


def permute(x, *perm):
    """Reorder axes: ``op.permute(x, 0, 2, 1)`` or ``op.permute(x, [0, 2, 1])``."""
    perm = perm[0] if len(perm) == 1 and isinstance(perm[0], (list, tuple)) else perm
    return _apply("transpose", x, perm=list(perm))


def split(x, sections, axis=-1):
    """Split along ``axis`` into ``sections`` equal parts (an int) or at the given indices."""
    shape, ax = _shape_and_axis(x, axis)
    rank, n = len(shape), shape[ax]
    if isinstance(sections, int):
        if sections < 1:
            raise _ArgumentError(f"op.split: sections must be >= 1, not {sections}")
        if not isinstance(n, int) or n % sections:
            raise _ArgumentError(f"op.split: axis {ax} of size {n} does not split into "
                                 f"{sections} equal parts")
        bounds = [n // sections * k for k in range(sections + 1)]
    else:
        bounds = [0] + list(sections) + [n]
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        starts = [None] * rank
        stops = [None] * rank
        starts[ax], stops[ax] = lo, hi
        parts.append(_apply("slice", x, starts=starts, stops=stops, steps=[1] * rank))
    return parts


def repeat_interleave(x, repeats, axis):
    """Each element repeated ``repeats`` times in place along ``axis`` (PyTorch's
    ``repeat_interleave`` with an int, NumPy's ``repeat``): a broadcast view reshaped, nothing
    computed. Grouped-query attention uses it to give each query head its key/value head."""
    shape, ax = _shape_and_axis(x, axis)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise _ArgumentError(f"op.repeat_interleave: repeats must be an int >= 1, not {repeats!r}")
    if repeats == 1:
        return x
    wide = _apply("broadcast_to", _apply("expand_dims", x, axis=ax + 1),
                  shape=[*shape[:ax + 1], repeats, *shape[ax + 1:]])
    return _apply("reshape", wide, shape=[*shape[:ax], shape[ax] * repeats, *shape[ax + 1:]])


def flat_index(coords, sizes):
    """The row-major flat index of integer coordinates over axes of the given ``sizes``, for
    ``take`` or ``scatter_add`` along a reshaped axis (advanced indexing, ONNX's GatherND and
    ScatterND). A negative coordinate counts from its axis' end (PyTorch's and ONNX's rule); a
    coordinate outside [-n, n) of its own axis gives an index past the flat axis, so the
    ``take`` it feeds reports it at run time instead of reading a neighbouring row (a
    constant one is an ArgumentError now)."""
    import numpy as np
    sizes = [int(n) for n in sizes]
    if len(coords) != len(sizes):
        raise _ArgumentError(f"op.flat_index: {len(coords)} coordinates for {len(sizes)} axes")
    total = int(np.prod(sizes))
    lin, outside = None, None
    for c, n in zip(coords, sizes):
        if isinstance(c, (np.ndarray, np.integer, int)):     # known now: checked now
            c = np.asarray(c, np.int64)
            if c.size and (c.min() < -n or c.max() >= n):
                raise _ArgumentError(f"op.flat_index: a coordinate outside [-{n}, {n}) for an "
                                     f"axis of size {n}")
            c = _lift(np.where(c < 0, c + n, c))
        else:
            c = _apply("cast", c, dtype="int64")
            c = _apply("where", _apply("lt", c, 0), _apply("add", c, n), c)
            bad = _apply("maximum", _apply("lt", c, 0), _apply("ge", c, n))
            outside = bad if outside is None else _apply("maximum", outside, bad)
        lin = c if lin is None else _apply("add", _apply("mul", lin, n), c)
    if outside is not None:
        lin = _apply("where", outside, np.int64(total), lin)
    return lin


def embedding(table, ids):
    """Rows of ``table`` picked by integer ``ids``: ``take(table, ids, axis=0)``."""
    return _apply("take", table, ids, axis=0)


gather = embedding


def pipeline(stages):
    """Apply stages in order: ``op.pipeline([x, f1, f2])`` is ``f2(f1(x))`` (as in the seeds)."""
    stages = list(stages)
    if not stages:
        raise _ArgumentError("op.pipeline needs a starting tensor")
    value = stages[0]
    for k, f in enumerate(stages[1:], 1):
        if not callable(f):
            raise _ArgumentError(f"op.pipeline: stage {k} is not callable",
                                 hint="the first item is the input; every later item a function")
        value = f(value)
    return value


def __dir__():
    return sorted(k for k in globals() if not k.startswith("_"))


# ---- linear quantization (ONNX's QuantizeLinear family; PyTorch's quantize_per_tensor/channel) ---
# q = saturate(round(x / scale) + zero_point), x ~ (q - zero_point) * scale. A scale (and zero
# point) is one number, one per index of `axis` (per channel), or, with `block_size`, one per
# block of that many elements along `axis`. Integer products accumulate exactly in int32.
def _numel(x) -> int:
    n = 1
    for s in _shape_of(x):
        n *= s
    return n


def _per_axis(v, x, axis, block_size, what):
    """A scale or zero point shaped to broadcast against x."""
    vs = _shape_of(v)
    if _numel(v) == 1:
        return _apply("reshape", v, shape=[]) if vs else v
    shape, ax = _shape_and_axis(x, axis)
    if block_size:
        if len(vs) != len(shape) or any(vs[k] != shape[k] for k in range(len(shape)) if k != ax) \
                or vs[ax] != -(-shape[ax] // block_size):
            raise _ArgumentError(f"{what} for blocks of {block_size} along axis {ax} of "
                                 f"{list(shape)} must have shape {[*shape[:ax], -(-shape[ax] // block_size), *shape[ax + 1:]]}",
                                 received=str(list(vs)))
        full = repeat_interleave(v, block_size, ax)
        rank = len(shape)
        return slice(full, [None] * rank, [shape[ax] if k == ax else None for k in range(rank)],
                     [1] * rank) if _shape_of(full)[ax] != shape[ax] else full
    if len(vs) != 1 or vs[0] != shape[ax]:
        raise _ArgumentError(f"{what} must be one number or one per index of axis {ax} "
                             f"({shape[ax]})", received=str(list(vs)))
    return _apply("reshape", v, shape=[shape[ax] if k == ax else 1 for k in range(len(shape))])


def quantize_linear(x, scale, zero_point=None, axis=1, block_size=0, dtype=None,
                    saturate=True):
    """x quantized: round(x / scale) to nearest even, plus zero_point, saturated to ``dtype``'s
    range (``dtype`` defaults to zero_point's dtype, else uint8). An fp8 ``dtype`` takes
    x / scale cast to it (saturated unless ``saturate=False``). ONNX's QuantizeLinear."""
    from . import dtypes as dt
    d = dt.get(dtype) if dtype is not None else \
        _dtype_of(zero_point) if zero_point is not None else dt.uint8
    if zero_point is not None and _dtype_of(zero_point) != d:
        raise _ArgumentError(f"op.quantize_linear: zero_point is {_dtype_of(zero_point).name} "
                             f"but the result is {d.name}")
    if not (d.is_int or d.is_fp8):
        raise _ArgumentError(f"op.quantize_linear quantizes to an integer or fp8 dtype, not "
                             f"{d.name}")
    q = _apply("div", x, _per_axis(scale, x, axis, block_size, "the scale"))
    if d.is_fp8:
        return cast(q, d, saturate=saturate)
    q = _apply("round", q)                       # (in x's dtype: exact, then widened)
    q = _apply("cast", q, dtype="float32") if _dtype_of(q).is_narrow else q
    if zero_point is not None:
        q = _apply("add", q, _apply("cast", _per_axis(zero_point, x, axis, block_size,
                                                      "the zero point"),
                                    dtype=_dtype_of(q).name))
    lo, hi = d.int_range
    return _apply("cast", clamp(q, lo, hi), dtype=d.name)


def dequantize_linear(x, scale, zero_point=None, axis=1, block_size=0, dtype=None):
    """(x - zero_point) * scale in float32, given as ``dtype`` (default: scale's dtype).
    ONNX's DequantizeLinear."""
    d = _dtype_of(scale) if dtype is None else dtype
    v = _apply("cast", x, dtype="float32")
    if zero_point is not None and not _dtype_of(x).is_fp8:
        v = _apply("sub", v, _apply("cast", _per_axis(zero_point, x, axis, block_size,
                                                      "the zero point"), dtype="float32"))
    y = _apply("mul", v, _per_axis(scale, x, axis, block_size, "the scale"))
    return cast(y, d)


def dynamic_quantize_linear(x):
    """x as uint8 with the scale and zero point that map [min(x, 0), max(x, 0)] onto
    [0, 255]: ``(q, scale, zero_point)``, ONNX's DynamicQuantizeLinear."""
    top = _apply("maximum", max(x), 0.0)
    low = _apply("minimum", min(x), 0.0)
    span = _apply("where", _apply("eq", top, low), 1.0, _apply("sub", top, low))
    scale = _apply("div", span, 255.0)
    zp = _apply("round", clamp(_apply("sub", 0.0, _apply("div", low, scale)), 0.0, 255.0))
    q = clamp(_apply("add", _apply("round", _apply("div", x, scale)), zp), 0.0, 255.0)
    return _apply("cast", q, dtype="uint8"), scale, _apply("cast", zp, dtype="uint8")


def _less_zero_point(x, zero_point):
    """x - zero_point in int32 (the zero point shaped to broadcast already)."""
    v = _apply("cast", x, dtype="int32")
    return v if zero_point is None else \
        _apply("sub", v, _apply("cast", zero_point, dtype="int32"))


def _per_leading(z, rank):
    """One number, or one per index of a tensor's first axis, shaped [n, 1, ...] (a rank-`rank`
    tensor's per-row or per-output-channel scale or zero point)."""
    if z is None or _numel(z) == 1:
        return z
    return _apply("reshape", z, shape=[_numel(z)] + [1] * (rank - 1))


def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """(a - a_zero_point) @ (b - b_zero_point), exact in int32 (wrapping past it): a's zero
    point one number or one per row, b's one or one per column. ONNX's MatMulInteger.

    int8 and uint8 matrices are multiplied as they are (the primitive matmul_integer: on the
    CPU, the ISA's integer dot products) and the zero points come off afterwards with the
    operands' sums, exact modulo 2^32: sum (a - za)(b - zb) = sum ab - zb sum_k a - za sum_k b
    + K za zb. Other integers are widened to int32 and multiplied."""
    from . import dtypes as dt
    K = _shape_of(a)[-1] if _shape_of(a) else None
    if _dtype_of(a) not in (dt.int8, dt.uint8) or _dtype_of(b) not in (dt.int8, dt.uint8) \
            or len(_shape_of(a)) < 2 or len(_shape_of(b)) < 2 or not isinstance(K, int):
        return matmul(_less_zero_point(a, _per_leading(a_zero_point, 2)),
                      _less_zero_point(b, b_zero_point))
    acc = _apply("matmul_integer", a, b)
    za, zb = (None if z is None else _apply("cast", z, dtype="int32")
              for z in (_per_leading(a_zero_point, 2), b_zero_point))

    def total(x, axis):          # an operand's sums along the contracted axis, in int32
        s = _apply("sum", _apply("cast", x, dtype="int32"), axis=[axis], keepdim=True)
        return _apply("cast", s, dtype="int32")
    if zb is not None:
        acc = _apply("sub", acc, _apply("mul", total(a, -1), zb))
    if za is not None:
        acc = _apply("sub", acc, _apply("mul", za, total(b, -2)))
    if za is not None and zb is not None:
        acc = _apply("add", acc, _apply("mul", _apply("mul", za, zb), K))
    return acc


def matmul_int8_weight(x, w, scale=None):
    """Weight-only quantization's product: float32 activations x [..., K] times int8 weights w
    [K, N], then ``scale`` (per column [N], or one number): (x @ float32(w)) * scale, reading
    the weights as bytes (a quarter of float32's). ``nn.quantize_int8`` makes w and scale from
    float weights; ``nn.linear`` takes them as ``{"int8": w, "scale": scale}``. Not
    differentiable (train in float, quantize after)."""
    out = _apply("matmul_int8_weight", x, w)
    return out if scale is None else _apply("mul", out, scale)


def _requantize(acc, multiplier, zero_point, dtype):
    """An int32 accumulator scaled (in float64, as ONNX's reference) and quantized."""
    from . import dtypes as dt
    y = _apply("mul", _apply("cast", acc, dtype="float64"),
               _apply("cast", multiplier, dtype="float64"))
    if zero_point is not None:
        y = _apply("add", y, _apply("cast", zero_point, dtype="float64"))
    lo, hi = dt.get(dtype).int_range
    return _apply("cast", clamp(_apply("round", y), lo, hi), dtype=dt.get(dtype).name)


def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point=None):
    """The quantized product of quantized a and b, requantized with y's scale and zero point
    (dtype: y_zero_point's, else a's). ONNX's QLinearMatMul."""
    acc = matmul_integer(a, b, a_zero_point, b_zero_point)
    a_scale = _per_leading(a_scale, 2)
    mult = _apply("div", _apply("mul", a_scale, b_scale), y_scale)
    d = _dtype_of(y_zero_point if y_zero_point is not None else a)
    return _requantize(acc, mult, y_zero_point, d)


def conv_integer(x, w, x_zero_point=None, w_zero_point=None, stride=1, padding=0, dilation=1,
                 groups=1):
    """conv(x - x_zero_point, w - w_zero_point) exact in int32 (w's zero point one number or
    one per output channel; padding contributes zero). ONNX's ConvInteger."""
    w = _less_zero_point(w, _per_leading(w_zero_point, len(_shape_of(w))))
    return conv(_less_zero_point(x, x_zero_point), w,
                stride=stride, padding=padding, dilation=dilation, groups=groups)


def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point=None,
                 bias=None, stride=1, padding=0, dilation=1, groups=1):
    """The quantized convolution of quantized x and w (w's scale and zero point per output
    channel or one), plus an int32 bias, requantized with y's. ONNX's QLinearConv."""
    acc = conv_integer(x, w, x_zero_point, w_zero_point, stride=stride, padding=padding,
                       dilation=dilation, groups=groups)
    if bias is not None:
        acc = _channel_bias(acc, _apply("cast", bias, dtype="int32"))
    rank, n = len(_shape_of(acc)), _numel(w_scale)
    ws = w_scale if n == 1 else _apply("reshape", w_scale, shape=[1, n] + [1] * (rank - 2))
    mult = _apply("div", _apply("mul", x_scale, ws), y_scale)
    d = _dtype_of(y_zero_point if y_zero_point is not None else x)
    return _requantize(acc, mult, y_zero_point, d)


# ---- counter-based random numbers (tessera/ops/random.py) ---------------------------------------
_random_uniform = _make("random_uniform")


def random_uniform(shape, seed, offset=0, dtype="float32"):
    """Uniform [0, 1) numbers of ``shape``, stateless: element i (row-major) is the generator's
    number for the counter ``offset + i`` of stream ``seed`` (counter-based SplitMix64, see
    tessera/ops/random.py), so a seed gives the same numbers on every run and thread count,
    compiled or eager. ``seed`` is a Python int or an integer tensor (a traced scalar lets a
    training step take a new seed each call without recompiling); ``offset`` (an int) moves to
    another part of the stream: draws at offsets 0 and prod(shape) do not overlap."""
    return _random_uniform(seed, _counters(shape, offset), dtype=dtype)
