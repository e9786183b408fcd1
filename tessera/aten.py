"""PyTorch models as tessera functions: ``ts.from_torch(model, *example_inputs)``.

    fn, params = ts.from_torch(model, x)       # torch.export, then ATen onto the registry
    y = fn(params, x)                          # compiled like any tessera function
    grads = ts.grad(lambda p, x: op.sum(fn(p, x)))(params, x)     # and trainable

``torch.export`` captures the model (or a function) on the example inputs and its core-ATen
decomposition gives a graph of ATen operators; each maps onto tessera operators (the table
`ATEN` below, one entry per ATen overload), traced into a tessera ``Function`` of
``(params, *inputs)``: its Graph IR, fusion, autotuning, explorer and profiler work as for any
other. ``params`` is a dict of the model's parameters, buffers and constants as NumPy arrays
(named as in ``state_dict``), a pytree argument, so ``ts.grad`` and ``ts.optim`` train it.
An ATen operator without an entry is a ``TesseraError`` listing every unsupported operator of
the model at once, each with the line of the PyTorch code that made it. The shapes are those
of the example inputs (a new shape is a new export). ``tessera.migrate.from_pytorch`` in the
seeds is this call.
"""
from __future__ import annotations

import inspect
import operator
import warnings

import numpy as np

from . import dtypes as dt
from . import op
from .errors import ArgumentError, TesseraError
from .function import Function
from .interop import from_dlpack
from .trace import apply, dtype_of

def _dtype(torch_dtype) -> str:
    """The tessera dtype name of a torch dtype (torch.float32 -> "float32")."""
    name = str(torch_dtype).split(".")[-1]
    try:
        return dt.get(name).name
    except TesseraError:
        raise ArgumentError(f"torch.{name} has no tessera dtype",
                            expected=", ".join(d.name for d in dt.ALL)) from None


def _axes(dims, rank):
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % rank for d in dims] if dims else list(range(rank))


def _shape(x):
    return tuple(x.shape)


def _reshape(x, shape):
    return op.reshape(x, shape=[int(s) for s in shape])


def _slice(x, dim=0, start=None, end=None, step=1):
    rank = len(_shape(x))
    n = _shape(x)[dim]
    starts, stops, steps = [None] * rank, [None] * rank, [1] * rank
    starts[dim] = None if start is None else max(min(start, n), -n)
    stops[dim] = None if end is None or end >= n else end
    steps[dim] = step
    return op.slice(x, starts=starts, stops=stops, steps=steps)


def _split(x, sizes, dim=0):
    out, at = [], 0
    for s in sizes:
        out.append(_slice(x, dim, at, at + s))
        at += s
    return out


def _expand(x, shape):
    have = _shape(x)
    full = [h if s == -1 else s for s, h in zip(shape, (None,) * (len(shape) - len(have)) + have)]
    return op.broadcast_to(x, shape=[int(s) for s in full])


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    k = len(normalized_shape)
    shape = _shape(x)
    flat = _reshape(x, shape[:len(shape) - k] + (-1,)) if k != 1 else x
    mean = op.mean(flat, axis=-1, keepdim=True)
    var = op.mean((flat - mean) ** 2, axis=-1, keepdim=True)
    out = op.layernorm(flat, eps=eps, axis=-1)
    out = _reshape(out, shape) if k != 1 else out
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    kept = shape[:len(shape) - k] + (1,) * k
    return (out, _reshape(mean, kept), _reshape(op.rsqrt(var + eps), kept))


def _full(size, value, dtype=None, **_):
    d = _dtype(dtype) if dtype is not None else ("float32" if isinstance(value, float)
                                                 else "int64")
    return np.full([int(s) for s in size], value, dtype=dt.get(d).np)


def _arange(start, end=None, step=1, dtype=None, **_):
    if end is None:
        start, end = 0, start
    d = _dtype(dtype) if dtype is not None else (
        "float32" if any(isinstance(v, float) for v in (start, end, step)) else "int64")
    return np.arange(start, end, step, dtype=dt.get(d).np)


def _to(x, dtype=None, **_):
    return x if dtype is None else op.cast(x, _dtype(dtype))


def _alpha(b, alpha):
    return b if alpha == 1 else b * alpha


def _sum(x, dims=None, keepdim=False, dtype=None):
    y = op.sum(x, axis=None if not dims else _axes(dims, len(_shape(x))), keepdim=keepdim)
    return y if dtype is None else op.cast(y, _dtype(dtype))


# ---- the convolution family ----------------------------------------------------------------------
def _n(v, k):
    """An ATen int list (one value meaning every axis) as k ints."""
    v = [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]
    return v * k if len(v) == 1 else v


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    k = len(_shape(w)) - 2
    attrs = dict(stride=_n(stride, k), padding=_n(padding, k), dilation=_n(dilation, k),
                 groups=int(groups))
    if transposed:
        return op.conv_transpose(x, w, b, output_padding=_n(output_padding, k), **attrs)
    return op.conv(x, w, b, **attrs)


def _max_pool_with_indices(x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    k = len(_shape(x)) - 2
    attrs = dict(kernel=_n(kernel, k), stride=_n(stride, k) if stride else None,
                 padding=_n(padding, k), dilation=_n(dilation, k), ceil_mode=bool(ceil_mode))
    return op.max_pool(x, **attrs), op.max_pool_indices(x, **attrs)


def _avg_pool(x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    if divisor_override is not None:
        raise TesseraError("avg_pool's divisor_override is not imported yet")
    k = len(_shape(x)) - 2
    return op.avg_pool(x, _n(kernel, k), _n(stride, k) if stride else None, _n(padding, k),
                       ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))


def _batch_norm_eval(x, w, b, mean, var, momentum, eps):
    """(out, save_mean, save_rstd): inference saves nothing (empty, as PyTorch's)."""
    return (op.batch_norm(x, mean, var, w, b, eps=eps), np.zeros(0, np.float32),
            np.zeros(0, np.float32))


def _batch_norm_train(x, w, b, mean, var, momentum, eps):
    """(out, batch mean, batch rstd, new running mean, new running var): the functional
    form of training batch norm torch.export records."""
    axes = [0] + list(range(2, len(_shape(x))))
    m = op.mean(x, axis=axes)
    rstd = op.rsqrt(op.var(x, axis=axes) + eps)
    if mean is None:
        y = op.batch_norm(x, None, None, w, b, training=True, eps=eps)
        return y, m, rstd
    y, new_mean, new_var = op.batch_norm(x, mean, var, w, b, training=True, momentum=momentum,
                                         eps=eps)
    return y, m, rstd, new_mean, new_var


def _native_batch_norm(x, w, b, mean, var, training, momentum, eps):
    if training:
        return _batch_norm_train(x, w, b, mean, var, momentum, eps)[:3]
    return _batch_norm_eval(x, w, b, mean, var, momentum, eps)


def _group_norm(x, w, b, N, C, HxW, groups, eps):
    """(out, mean [N, groups], rstd [N, groups])."""
    g = op.reshape(x, shape=[int(N), int(groups), -1])
    m, v = op.mean(g, axis=2), op.var(g, axis=2)
    return op.group_norm(x, int(groups), w, b, eps), m, op.rsqrt(v + eps)


def _torch_pad(x, pad, mode="constant", value=0.0):
    """PyTorch's flat pad list: (before, after) pairs from the last axis backwards."""
    rank = len(_shape(x))
    pairs = [[0, 0] for _ in range(rank)]
    for j in range(len(pad) // 2):
        pairs[rank - 1 - j] = [int(pad[2 * j]), int(pad[2 * j + 1])]
    return op.pad(x, pairs, mode=mode, value=0.0 if value is None else float(value))


def _upsample(mode):
    def up(x, output_size=None, *rest, **kw):
        align = False
        scales = None
        if mode != "nearest" and rest and isinstance(rest[0], bool):
            align, rest = rest[0], rest[1:]
        align = kw.get("align_corners", align)
        if rest:
            scales = rest[0] if isinstance(rest[0], (list, tuple)) else \
                [r for r in rest if r is not None] or None
        scales = kw.get("scale_factors", scales)
        how = {"nearest": dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                               nearest_mode="floor")}.get(mode) or dict(
            mode="cubic" if mode == "bicubic" else "linear",
            coordinate_transformation_mode="align_corners" if align else "half_pixel")
        if output_size:
            return op.resize(x, size=[int(s) for s in output_size], **how)
        return op.resize(x, scale=[float(s) for s in scales], **how)
    return up


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    """torch's scaled_dot_product_attention: a boolean mask says which keys take part (True)
    and becomes the additive form op.attention takes; with grouped-query attention each
    key/value head serves heads/kv_heads consecutive query heads, as in PyTorch."""
    if dropout_p:
        raise TesseraError("scaled_dot_product_attention with dropout is not imported",
                           hint="export the model in eval mode (model.eval())")
    if attn_mask is not None and dtype_of(attn_mask).is_bool:
        attn_mask = op.where(attn_mask, 0.0, -np.inf)
    sq, sk = _shape(q)[-2], _shape(k)[-2]
    if is_causal and sq != sk:          # torch's causal mask is top-left aligned, op's bottom-right
        attn_mask, is_causal = np.where(np.tri(sq, sk, dtype=bool), 0.0, -np.inf) \
            .astype(dtype_of(q).np), False
    if len(_shape(q)) >= 3 and _shape(q)[-3] != _shape(k)[-3]:
        k, v = (op.repeat_interleave(t, _shape(q)[-3] // _shape(k)[-3], axis=-3)
                for t in (k, v))
    return op.attention(q, k, v, mask=attn_mask, causal=is_causal, scale=scale)


def _index(x, indices):
    """x[i0, i1, ...] with integer index tensors (None: the whole axis), NumPy's advanced
    indexing: the indexed axes, moved to the front, are read through one flat index; the
    broadcast index shape takes the place of the first indexed axis when the indexed axes are
    adjacent, else goes first."""
    shape = _shape(x)
    indices = list(indices) + [None] * (len(shape) - len(indices))
    axes = [k for k, i in enumerate(indices) if i is not None]
    if any(dtype_of(indices[k]).is_bool for k in axes):
        raise TesseraError("aten.index with a boolean mask has a data-dependent shape; "
                           "it is not imported", hint="use torch.where in the model")
    rest = [k for k in range(len(shape)) if k not in axes]
    front = op.transpose(x, perm=axes + rest) if axes + rest != list(range(len(shape))) else x
    flat = _reshape(front, [int(np.prod([shape[k] for k in axes]))] + [shape[k] for k in rest])
    lin = op.flat_index([indices[k] for k in axes], [shape[k] for k in axes])
    out = op.take(flat, lin, axis=0)                                    # [*B, *rest]
    nb = len(_shape(out)) - len(rest)
    if axes == list(range(axes[0], axes[-1] + 1)) and axes[0] > 0:
        p = axes[0]
        perm = list(range(nb, nb + p)) + list(range(nb)) + list(range(nb + p, nb + len(rest)))
        out = op.transpose(out, perm=perm)
    return out


def _slice_scatter(x, src, dim, start, end, step):
    """x with src written over x[..., start:end:step, ...] along dim."""
    n = _shape(x)[dim]
    start, end, step = slice(start, end, step).indices(n)
    taken = list(range(start, end, step))
    if not taken:
        return x
    src = op.cast(src, dtype_of(x).name)
    if step == 1:
        pieces = [_slice(x, dim, 0, start)] if start else []
        pieces += [src] + ([_slice(x, dim, end, n)] if end < n else [])
        return pieces[0] if len(pieces) == 1 else op.concat(pieces, axis=dim)
    where = np.full(n, -1)
    where[taken] = np.arange(len(taken))
    rank = len(_shape(x))
    picked = op.take(src, np.maximum(where, 0), axis=dim)
    keep = where.reshape([-1 if k == dim % rank else 1 for k in range(rank)]) >= 0
    return op.where(keep, picked, x)


# ATen overload -> a function of its arguments giving tessera values (or a tuple of them)
ATEN = {
    "aten.permute.default": lambda x, dims: op.transpose(x, perm=list(dims)),
    "aten.t.default": lambda x: op.transpose(x),
    "aten.transpose.int": lambda x, a, b: op.transpose(
        x, perm=_swap(len(_shape(x)), a, b)),
    "aten.addmm.default": lambda bias, a, b, beta=1, alpha=1:
        _alpha(bias, beta) + _alpha(op.matmul(a, b), alpha),
    "aten.mm.default": lambda a, b: op.matmul(a, b),
    "aten.bmm.default": lambda a, b: op.matmul(a, b),
    "aten._int_mm.default": lambda a, b: op.matmul_integer(a, b),
    "aten.view.dtype": lambda x, dtype: op.bitcast(x, _dtype(dtype)),
    "aten.matmul.default": lambda a, b: op.matmul(a, b),
    "aten.native_layer_norm.default": _layer_norm,
    "aten._softmax.default": lambda x, dim, half_to_float=False: op.softmax(x, axis=dim),
    "aten._log_softmax.default": lambda x, dim, half_to_float=False: op.log_softmax(x, axis=dim),
    "aten.gelu.default": lambda x, approximate="none": op.gelu(x, approximate=approximate),
    "aten.relu.default": lambda x: op.relu(x),
    "aten.tanh.default": lambda x: op.tanh(x),
    "aten.sigmoid.default": lambda x: op.sigmoid(x),
    "aten.silu.default": lambda x: op.silu(x),
    "aten.exp.default": lambda x: op.exp(x),
    "aten.log1p.default": lambda x: op.log1p(x),
    "aten.expm1.default": lambda x: op.expm1(x),
    "aten.softplus.default": lambda x, beta=1, threshold=20: op.softplus(x, beta=beta),
    "aten.elu.default": lambda x, alpha=1, scale=1, input_scale=1:
        op.elu(x * input_scale, alpha) * scale,
    "aten.leaky_relu.default": lambda x, negative_slope=0.01: op.leaky_relu(x, negative_slope),
    "aten.hardtanh.default": lambda x, min_val=-1, max_val=1: op.hardtanh(x, min_val, max_val),
    "aten.hardsigmoid.default": lambda x: op.hardsigmoid(x),
    "aten.hardswish.default": lambda x: op.hardswish(x),
    "aten.mish.default": lambda x: op.mish(x),
    "aten.log.default": lambda x: op.log(x),
    "aten.sqrt.default": lambda x: op.sqrt(x),
    "aten.rsqrt.default": lambda x: op.rsqrt(x),
    "aten.neg.default": lambda x: -x,
    "aten.abs.default": lambda x: op.abs(x),
    "aten.sin.default": lambda x: op.sin(x),
    "aten.cos.default": lambda x: op.cos(x),
    "aten.erf.default": lambda x: op.erf(x),
    "aten.add.Tensor": lambda a, b, alpha=1: a + _alpha(b, alpha),
    "aten.add.Scalar": lambda a, b, alpha=1: a + _alpha(b, alpha),
    "aten.sub.Tensor": lambda a, b, alpha=1: a - _alpha(b, alpha),
    "aten.sub.Scalar": lambda a, b, alpha=1: a - _alpha(b, alpha),
    "aten.rsub.Scalar": lambda a, b, alpha=1: b - _alpha(a, alpha),
    "aten.mul.Tensor": lambda a, b: a * b,
    "aten.mul.Scalar": lambda a, b: a * b,
    "aten.div.Tensor": lambda a, b: op.div(a, b),
    "aten.div.Scalar": lambda a, b: op.div(a, b),
    "aten.pow.Tensor_Scalar": lambda x, e: x ** e,
    "aten.pow.Tensor_Tensor": lambda x, e: x ** e,
    "aten.maximum.default": lambda a, b: op.maximum(a, b),
    "aten.minimum.default": lambda a, b: op.minimum(a, b),
    "aten.clamp.default": lambda x, lo=None, hi=None: op.clamp(x, lo, hi),
    "aten.where.self": lambda c, a, b: op.where(c, a, b),
    "aten.view.default": _reshape,
    "aten._unsafe_view.default": _reshape,
    "aten.reshape.default": _reshape,
    "aten.expand.default": _expand,
    "aten.unsqueeze.default": lambda x, dim: op.expand_dims(x, axis=dim),
    "aten.squeeze.dim": lambda x, dim: op.squeeze(x, axis=dim),
    "aten.squeeze.dims": lambda x, dims: _reshape(
        x, [s for k, s in enumerate(_shape(x)) if k not in _axes(dims, len(_shape(x)))]),
    "aten.slice.Tensor": _slice,
    "aten.select.int": lambda x, dim, i: op.squeeze(_slice(x, dim, i, i + 1 if i != -1 else None),
                                                    axis=dim),
    "aten.split_with_sizes.default": _split,
    "aten.cat.default": lambda xs, dim=0: _cat(xs, dim),
    "aten.embedding.default": lambda w, ids, *_: op.take(w, ids, axis=0),
    "aten.gather.default": lambda x, dim, index, **_: op.take_along_axis(x, index, axis=dim),
    "aten.index_select.default": lambda x, dim, index: op.take(x, index, axis=dim),
    # checks torch.export leaves in the graph (on what the trace has already fixed): nothing
    "aten._assert_tensor_metadata.default": lambda *a, **k: None,
    "aten._assert_scalar.default": lambda *a, **k: None,
    "aten.mean.dim": lambda x, dims, keepdim=False, dtype=None: op.mean(
        x, axis=_axes(dims, len(_shape(x))), keepdim=keepdim),
    "aten.sum.dim_IntList": _sum,
    "aten.sum.default": lambda x, dtype=None: _sum(x, None, False, dtype),
    "aten.amax.default": lambda x, dims=(), keepdim=False: op.max(
        x, axis=_axes(dims, len(_shape(x))), keepdim=keepdim),
    "aten.amin.default": lambda x, dims=(), keepdim=False: op.min(
        x, axis=_axes(dims, len(_shape(x))), keepdim=keepdim),
    "aten.any.dim": lambda x, dim, keepdim=False: op.max(op.cast(x, "bool"), axis=dim,
                                                         keepdim=keepdim),
    "aten.eq.Scalar": lambda a, b: a == b, "aten.eq.Tensor": lambda a, b: a == b,
    "aten.ne.Scalar": lambda a, b: a != b, "aten.ne.Tensor": lambda a, b: a != b,
    "aten.lt.Scalar": lambda a, b: a < b, "aten.lt.Tensor": lambda a, b: a < b,
    "aten.le.Scalar": lambda a, b: a <= b, "aten.le.Tensor": lambda a, b: a <= b,
    "aten.gt.Scalar": lambda a, b: a > b, "aten.gt.Tensor": lambda a, b: a > b,
    "aten.ge.Scalar": lambda a, b: a >= b, "aten.ge.Tensor": lambda a, b: a >= b,
    # truth values: op.logical_* (and is min, or is max of bools)
    "aten.logical_and.default": op.logical_and,
    "aten.logical_or.default": op.logical_or,
    "aten.logical_xor.default": op.logical_xor,
    "aten.logical_not.default": op.logical_not,
    "aten.bitwise_not.default": op.bitwise_not,
    "aten.full.default": _full,
    "aten.full_like.default": lambda x, value, dtype=None, **_: op.broadcast_to(
        apply("cast", np.asarray(value), dtype=_dtype(dtype) if dtype is not None else
              x.dtype.name), shape=list(_shape(x))),
    "aten.scalar_tensor.default": lambda value, dtype=None, **_: np.asarray(
        value, dtype=dt.get(_dtype(dtype) if dtype is not None else "float32").np),
    "aten.arange.start_step": _arange,
    "aten.arange.default": lambda end, dtype=None, **kw: _arange(0, end, 1, dtype),
    "aten.clone.default": lambda x, **_: x,
    "aten.alias.default": lambda x: x,
    "aten.detach.default": lambda x: x,
    "aten.lift_fresh_copy.default": lambda x: x,
    "aten._to_copy.default": _to,
    "aten.convolution.default": _convolution,
    "aten.conv2d.default": lambda x, w, b=None, stride=1, padding=0, dilation=1, groups=1:
        _convolution(x, w, b, stride, padding, dilation, False, 0, groups),
    "aten.max_pool2d_with_indices.default": _max_pool_with_indices,
    "aten.max_pool3d_with_indices.default": _max_pool_with_indices,
    "aten.max_pool2d.default": lambda *a, **k: _max_pool_with_indices(*a, **k)[0],
    "aten.avg_pool2d.default": _avg_pool,
    "aten.avg_pool3d.default": _avg_pool,
    "aten.avg_pool1d.default": _avg_pool,
    "aten._adaptive_avg_pool2d.default": lambda x, size: op.adaptive_avg_pool(x, list(size)),
    "aten._adaptive_avg_pool3d.default": lambda x, size: op.adaptive_avg_pool(x, list(size)),
    "aten.adaptive_avg_pool1d.default": lambda x, size: op.adaptive_avg_pool(x, list(size)),
    "aten._native_batch_norm_legit_no_training.default": _batch_norm_eval,
    "aten._native_batch_norm_legit_functional.default":
        lambda x, w, b, mean, var, training, momentum, eps:
        _batch_norm_train(x, w, b, mean, var, momentum, eps) if training else
        _batch_norm_eval(x, w, b, mean, var, momentum, eps) + (mean, var),
    "aten._native_batch_norm_legit.no_stats": lambda x, w, b, training, momentum, eps:
        _batch_norm_train(x, w, b, None, None, momentum, eps),
    "aten.native_batch_norm.default": _native_batch_norm,
    "aten.native_group_norm.default": _group_norm,
    "aten.constant_pad_nd.default": lambda x, pad, value=0: _torch_pad(x, pad, "constant",
                                                                        value),
    **{f"aten.reflection_pad{k}d.default": (lambda x, pad: _torch_pad(x, pad, "reflect"))
       for k in (1, 2, 3)},
    **{f"aten.replication_pad{k}d.default": (lambda x, pad: _torch_pad(x, pad, "edge"))
       for k in (1, 2, 3)},
    "aten.pixel_shuffle.default": lambda x, r: op.pixel_shuffle(x, int(r)),
    "aten.pixel_unshuffle.default": lambda x, r: op.pixel_unshuffle(x, int(r)),
    **{f"aten.upsample_{m}{k}d.{form}": _upsample(m.replace("linear", "bilinear")
                                                  if m == "linear" else m)
       for m in ("nearest", "linear", "bilinear", "trilinear", "bicubic") for k in (1, 2, 3)
       for form in ("vec", "default")},
    "aten.scaled_dot_product_attention.default": _sdpa,
    # bits (of integers and bools: op.bitwise_*, NumPy's and PyTorch's bits)
    **{f"aten.bitwise_{how}.{form}": getattr(op, f"bitwise_{how}")
       for how in ("and", "or", "xor") for form in ("Tensor", "Scalar")},
    **{f"aten.{name}.{form}": getattr(op, f"{how}_shift")
       for how in ("left", "right")
       for name in (f"__{how[0]}shift__", f"bitwise_{how}_shift")
       for form in ("Tensor", "Scalar", "Tensor_Scalar", "Scalar_Tensor")},
    "aten.cumsum.default": lambda x, dim, dtype=None: op.cumsum(
        x if dtype is None else op.cast(x, _dtype(dtype)), axis=dim),
    "aten.index.Tensor": lambda x, indices: _index(x, indices),
    "aten.copy.default": lambda dst, src, non_blocking=False: op.broadcast_to(
        op.cast(src, dtype_of(dst).name), shape=list(_shape(dst))),
    "aten.slice_scatter.default": lambda x, src, dim=0, start=None, end=None, step=1:
        _slice_scatter(x, src, dim, start, end, step),
}


def _cat(xs, dim):
    """torch.cat, which skips 1-D empty tensors beside others of any rank (an empty cache)."""
    kept = [x for x in xs if tuple(_shape(x)) != (0,)] or list(xs)
    return kept[0] if len(kept) == 1 else op.concat(kept, axis=dim)


def _swap(rank, a, b):
    perm = list(range(rank))
    perm[a % rank], perm[b % rank] = perm[b % rank], perm[a % rank]
    return perm


def _getitem(x, i):
    return x[i]


def from_torch(model, *example_inputs):
    """(a tessera Function of (params, *inputs), params: the model's tensors as a dict of NumPy
    arrays). ``model`` is a torch.nn.Module or a function of tensors."""
    import torch

    module = model if isinstance(model, torch.nn.Module) else _as_module(model)
    name = type(model).__name__ if isinstance(model, torch.nn.Module) else \
        getattr(model, "__name__", "fn")
    examples = tuple(torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x
                     for x in example_inputs)
    _register_transformers_caches(module)
    try:
        with warnings.catch_warnings():     # (torch.export's own deprecation of its pytrees)
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            exported = torch.export.export(module, examples).run_decompositions(
                _decompositions())
    except Exception as e:         # torch.export's own reasons (data-dependent control flow)
        raise TesseraError(f"torch.export could not capture {name}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}",
                           hint="tessera imports what torch.export captures; see its "
                                "documentation for graph breaks") from None
    graph = exported.graph
    _check_supported(graph, name)
    out_spec = exported.call_spec.out_spec

    state = {**exported.state_dict, **getattr(exported, "constants", {})}
    params, places, user = {}, {}, []
    for spec in exported.graph_signature.input_specs:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            user.append(spec.arg.name)
        elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            params[spec.target] = np.array(from_dlpack(state[spec.target]))     # its own copy
            places[spec.arg.name] = spec.target
        else:
            raise TesseraError(f"{name}: torch.export input of kind {kind} is not supported")
    inputs = [f"x{i}" if not n.isidentifier() else n for i, n in enumerate(user)]

    def body(*args, **kw):
        kw = body.__signature__.bind(*args, **kw).arguments
        env = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                if node.name in places:
                    env[node.name] = kw["params"][places[node.name]]
                else:
                    env[node.name] = _example_shaped(kw[inputs[user.index(node.name)]], node,
                                                     inputs[user.index(node.name)], name)
            elif node.op == "call_function":
                args = _resolve(node.args, env)
                kwargs = {k: _resolve(v, env) for k, v in node.kwargs.items()
                          if k not in ("device", "layout", "pin_memory", "memory_format")}
                fn = _getitem if node.target is operator.getitem else ATEN[str(node.target)]
                env[node.name] = fn(*args, **kwargs)
            elif node.op == "output":
                return _structured(list(_resolve(node.args[0], env)), out_spec)
        raise TesseraError(f"{name}: the exported graph has no output")

    params_param = inspect.Parameter("params", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    body.__signature__ = inspect.Signature(
        [params_param] + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                          for n in inputs])
    body.__name__ = body.__qualname__ = name
    body.__doc__ = f"{name}, imported from PyTorch by torch.export (tessera.from_torch)"
    return Function(body, name=name), params


def _register_transformers_caches(module):
    """A transformers model returns its key/value cache (`use_cache`, on by default), an object
    torch.export cannot trace through: transformers' own exporter registers its cache classes as
    pytree nodes (what its `torch.export` support does; transformers 5's exporters)."""
    model = next((m for m in module.modules() if type(m).__module__.startswith("transformers.")),
                 None)
    if model is None:
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:     # (an older transformers: its caches stay untraceable)
        return
    register_cache_pytrees_for_model(model)


def _structured(outs: list, spec):
    """The graph's flat outputs as the model returned them: one value, or a tuple; a dict for a
    dict (a transformers ModelOutput: `logits`, `last_hidden_state`, ...), each field its value,
    or for a container (a cache) the tuple of its tensors in order (each layer's keys, then its
    values)."""
    if spec is None or not (isinstance(spec.type, type) and issubclass(spec.type, dict)):
        return outs[0] if len(outs) == 1 else tuple(outs)
    fields, at = {}, 0
    kids = spec.children() if hasattr(spec, "children") else spec.children_specs  # (torch<2.10)
    for key, child in zip(spec.context, kids):
        n = child.num_leaves
        fields[key] = outs[at] if child.is_leaf() else tuple(outs[at:at + n])
        at += n
    return fields


def _decompositions():
    """torch.export's core-ATen decompositions, less scaled_dot_product_attention's: it maps
    onto op.attention whole (its math decomposition also views a non-contiguous tensor,
    which fails inside torch.export for GPT-2)."""
    import torch
    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    return table


def _example_shaped(x, node, param, name):
    """x, which must have the shape and dtype of the example torch.export saw (its graph holds
    that shape only: another could reshape silently wrong)."""
    val = node.meta.get("val")
    if val is not None:
        have, want = (tuple(_shape(x)), dtype_of(x).name), (tuple(val.shape), _dtype(val.dtype))
        if have != want:
            raise ArgumentError(
                f"{param} of {name} is {have[1]}{list(have[0])}; the model was exported for "
                f"{want[1]}{list(want[0])}",
                hint="import again with ts.from_torch on an example of the new shape")
    return x


def _as_module(fn):
    """A function as the module torch.export needs."""
    import torch

    class Fn(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)
    return Fn()


def _resolve(value, env):
    """An argument with each fx.Node in it replaced by its value."""
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, env) for v in value)
    if hasattr(value, "op") and getattr(value, "name", None) in env:      # an fx.Node
        return env[value.name]
    return value


def _check_supported(graph, name):
    missing = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target)
        if target in ATEN or node.target is operator.getitem:
            continue
        trace = (node.meta.get("stack_trace") or "").strip().split("\n")
        where = next((line.strip() for line in reversed(trace) if line.strip().startswith(
            "File ")), "") or "(no source line)"
        missing.setdefault(target, []).append(where)
    if missing:
        lines = [f"  {t}: {len(w)} use(s), first at {w[0]}" for t, w in sorted(missing.items())]
        raise TesseraError(f"{name} uses {len(missing)} ATen operator(s) tessera does not map "
                           "yet:\n" + "\n".join(lines),
                           hint="each needs an entry in tessera/aten.py's ATEN table")


__all__ = ["from_torch", "ATEN"]
