"""`DTensor`: a tensor split over a mesh, and how operators run on it.

A DTensor holds its global shape and dtype, its `Layout` and the blocks of the ranks this
process holds (every rank on virtual devices, its own under MPI). Any ``op.*`` given a DTensor
comes here (trace.apply asks its operands for ``__tessera_apply__``): a sharding rule chooses the
result's layout and the layouts its operands need, `redistribute` moves the operands (the
collectives it inserts are the rule's cost), and every rank runs the operator on its blocks with
the compiled kernel the single-process program uses. Rules, by the operator's kind:

- elementwise: the result keeps its operands' splits (an operand split differently, or not at
  all, is moved or sliced); a pending sum passes through add, sub, neg, and mul or div by a
  value without one; any other operator takes the reduction first (relu of a pending sum is not
  the sum of relus);
- matmul: rows and columns keep their splits; a contraction over a split dimension gives a pending
  sum (the other operand sliced to match when it is whole); an axis wanted by both the rows and
  the columns is gathered on the smaller operand (the right one when equal); where the batch
  dimensions' splits conflict with these, the way moving the fewest bytes wins (experts split
  over an axis take their tokens by an all-to-all rather than have their weights gathered);
- transpose: the splits move with the dimensions;
- attention: batch and heads keep their splits, the sequence and feature dimensions are gathered;
- sum, mean, max, min: a reduced dimension's axes become a pending sum, mean, max or min;
- reshape: a split of the first dimension of a group of merged or split dimensions moves to the
  group's first output dimension where it divides (heads split out of a split feature dimension
  keep the split); any other split is gathered first;
- operators over an axis (softmax, layernorm, cumsum ...): that dimension gathered first;
- routing (argmax, argmin, topk's argsort, slice and take_along_axis, take, expand_dims,
  squeeze) and reductions no pending value stands for (logsumexp, var): the dimension picked
  from or reduced whole, the others keep their splits;
- anything else: its operands gathered whole, the result replicated (correct, not fast).
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from ..errors import ShardingError, TesseraError, enrich
from ..function import function
from .engine import on_gpu
from .layout import Layout, Mesh, ShardSpec, at_user_line
from .moves import apply_moves, bytes_moved, moves

_LINEAR_SUM = {"add", "sub", "neg"}
_AXIS_OPS = {"softmax", "log_softmax", "layernorm", "rmsnorm", "cumsum", "cumprod", "logcumsumexp",
             "sort", "argsort"}


class DTensor:
    """A tensor split over a mesh. ``repr`` shows its type with the layout:
    ``DTensor(f32[1024@dp, 1024] on Mesh(dp=4; virtual))``."""

    __array_priority__ = 1000          # x * dtensor: NumPy defers to our operators

    def __init__(self, mesh: Mesh, shape, dtype, layout: Layout, blocks: dict):
        self.mesh, self.shape, self.layout = mesh, tuple(int(s) for s in shape), layout
        self.dtype = np.dtype(dtype)
        self.blocks = blocks

    # ---- what a user sees --------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def local(self) -> np.ndarray:
        """This process's block (under MPI, one rank per process)."""
        if len(self.blocks) != 1:
            raise ShardingError("on virtual devices this process holds every block",
                                hint="x.blocks[rank], or dist.gather(x) for the whole tensor")
        return next(iter(self.blocks.values()))

    @property
    def type_str(self) -> str:
        return self.layout.type_str(self.shape, dt.from_numpy(self.dtype).short)

    def __repr__(self):
        return f"DTensor({self.type_str} on {self.mesh})"

    def __array__(self, *a, **k):
        raise ShardingError("a sharded tensor is not an array here: its blocks live on the mesh",
                            hint="dist.gather(x) brings the whole tensor to every rank")

    def __len__(self):
        return self.shape[0]

    # ---- operators -------------------------------------------------------------------------------
    @classmethod
    def __tessera_apply__(cls, opdef, args, attrs):
        try:
            return _apply(opdef, list(args), attrs)
        except TesseraError as e:
            from ..trace import user_location
            raise enrich(e, location=user_location(), op=opdef.name)

    def _op(self, name, *args, **attrs):
        from ..trace import apply
        return apply(name, *args, **attrs)

    def __add__(self, o): return self._op("add", self, o)
    def __radd__(self, o): return self._op("add", o, self)
    def __sub__(self, o): return self._op("sub", self, o)
    def __rsub__(self, o): return self._op("sub", o, self)
    def __mul__(self, o): return self._op("mul", self, o)
    def __rmul__(self, o): return self._op("mul", o, self)
    def __truediv__(self, o): return self._op("div", self, o)
    def __rtruediv__(self, o): return self._op("div", o, self)
    def __matmul__(self, o): return self._op("matmul", self, o)
    def __rmatmul__(self, o): return self._op("matmul", o, self)
    def __neg__(self): return self._op("neg", self)
    def __lt__(self, o): return self._op("lt", self, o)
    def __le__(self, o): return self._op("le", self, o)
    def __gt__(self, o): return self._op("gt", self, o)
    def __ge__(self, o): return self._op("ge", self, o)
    __hash__ = object.__hash__

    def __getitem__(self, key):
        """Indexing gathers the tensor (the result is whole on every rank: correct, not fast;
        inside a tessera function indexing is planned like any operator)."""
        return shard(gather(self)[key], None, self.mesh)
    def __pow__(self, o): return self._op("pow", self, o)

    @property
    def T(self):
        return self._op("transpose", self)

    def sum(self, axis=None, keepdim=False):
        return self._op("sum", self, axis=axis, keepdim=keepdim)

    def mean(self, axis=None, keepdim=False):
        return self._op("mean", self, axis=axis, keepdim=keepdim)

    def max(self, axis=None, keepdim=False):
        return self._op("max", self, axis=axis, keepdim=keepdim)

    def min(self, axis=None, keepdim=False):
        return self._op("min", self, axis=axis, keepdim=keepdim)


# ---- making and gathering -----------------------------------------------------------------------
def _layout_of(layout, shape, mesh, name):
    if layout is None:
        return Layout.replicated(len(shape))
    if isinstance(layout, Layout):
        layout.check(shape, mesh, name)
        return layout
    if not isinstance(layout, ShardSpec):
        raise ShardingError(f"{name}: layout must be a dist.ShardSpec", received=repr(layout))
    return layout.layout(shape, mesh, name)


@at_user_line
def tensor(shape, layout=None, mesh=None, dtype="float32", init="zeros", seed=0):
    """A new sharded tensor: each rank makes only its block. ``init``: "zeros", "ones", or
    "uniform" (op.random_uniform's numbers for ``seed``, by the element's global index, so the
    same tensor on any mesh)."""
    if not isinstance(mesh, Mesh):
        raise ShardingError("dist.tensor needs mesh=dist.Mesh(...)", received=repr(mesh))
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    lay = _layout_of(layout, shape, mesh, "dist.tensor")
    d = dt.get(dtype)
    blocks = {}
    for r in mesh.engine.ranks:
        sl = lay.block(shape, mesh, r)
        local = tuple(s.stop - s.start for s in sl)
        if init in ("zeros", "ones"):
            blocks[r] = _placed(mesh, np.full(local, 0 if init == "zeros" else 1, dtype=d.np))
        elif init == "uniform":
            idx = np.ravel_multi_index(np.meshgrid(*[np.arange(s.start, s.stop) for s in sl],
                                                   indexing="ij"), shape) if shape else 0
            from ..ops.random import _reference
            u = _reference([np.int64(seed), np.asarray(idx, np.int64)],
                           {"dtype": "float64" if d.name == "float64" else "float32"})
            blocks[r] = _placed(mesh, np.asarray(u).astype(d.np))
        else:
            raise ShardingError(f"unknown init {init!r}", expected="zeros, ones or uniform")
    return DTensor(mesh, shape, d.np, lay, blocks)


@at_user_line
def shard(x, layout, mesh: Mesh):
    """The NumPy array ``x`` (the same on every rank) split as ``layout`` says: each rank keeps
    its block, no communication."""
    if not isinstance(mesh, Mesh):
        raise ShardingError("dist.shard needs a dist.Mesh", received=repr(mesh))
    x = x if on_gpu(x) else np.asarray(x)
    lay = _layout_of(layout, x.shape, mesh, "dist.shard")
    if lay.partial:
        raise ShardingError("dist.shard cannot make a pending reduction")
    blocks = {r: _placed(mesh, x[lay.block(x.shape, mesh, r)]) for r in mesh.engine.ranks}
    return DTensor(mesh, x.shape, x.dtype, lay, blocks)


@at_user_line
def shard_tree(tree, layouts, mesh: Mesh):
    """Every array leaf of a pytree (model parameters, optimizer state) sharded by
    ``layouts``: a function ``(path, shape) -> ShardSpec or None`` or a dict from path to
    ShardSpec (absent: replicated), where a leaf's path is its keys joined by "/"
    (``"blocks/0/attn/q/w"``, as `ts.checkpoint` names them). Numbers stay numbers."""
    from ..pytree import flatten
    from ..ops.registry import is_scalar
    flat, treedef = flatten(tree)
    paths = treedef.path_names()
    if isinstance(layouts, dict):
        unknown = sorted(set(layouts) - set(paths))
        if unknown:
            raise ShardingError(f"layouts names {unknown}, which are no leaves of the tree",
                                hint=f"the paths are like {paths[:3]}")
        pick = lambda path, shape: layouts.get(path)
    elif callable(layouts):
        pick = layouts
    else:
        raise ShardingError("layouts must be a function (path, shape) -> ShardSpec or a dict",
                            received=repr(layouts))
    out = [x if is_scalar(x) or isinstance(x, DTensor) else
           shard(x, pick(path, tuple(np.shape(x))), mesh) for path, x in zip(paths, flat)]
    return treedef.unflatten(out)


@at_user_line
def _placed(mesh, block):
    """A block where the mesh keeps them: a contiguous NumPy array, or a CuPy one."""
    # (ascontiguousarray would make a 0-d block 1-d)
    if mesh.target == "cuda":
        import cupy
        return cupy.asarray(block, order="C")
    return np.asarray(block, order="C")


def gather(x) -> np.ndarray:
    """The whole tensor on every rank (pending reductions taken): a NumPy array, or a CuPy one
    on a CUDA mesh."""
    if not isinstance(x, DTensor):
        return np.asarray(x)
    whole = redistribute(x, Layout.replicated(x.ndim))
    return next(iter(whole.blocks.values())).copy()


# ---- operators on sharded tensors ---------------------------------------------------------------
def _apply(opdef, args, attrs):
    from ..compiler.graph_ir import check_op
    from ..ops.registry import is_scalar, operand_dtypes
    from ..types import TensorType

    packed = opdef.nin == -1
    flat = list(args[0]) if packed else list(args)
    meshes = {a.mesh for a in flat if isinstance(a, DTensor)}
    if len(meshes) > 1:
        raise ShardingError(f"{opdef.name} got tensors on different meshes",
                            received=" and ".join(map(repr, meshes)))
    mesh = meshes.pop()
    # plain arrays are replicated on every rank; numbers stay numbers
    flat = [a if isinstance(a, DTensor) or is_scalar(a) else shard(a, None, mesh) for a in flat]
    kinds = [dt.from_numpy(a.dtype) if isinstance(a, DTensor) else a for a in flat]
    want = operand_dtypes(opdef, kinds, attrs)
    types = [TensorType(want[k] if want else dt.from_numpy(a.dtype), a.shape)
             if isinstance(a, DTensor) else TensorType(want[k] if want else dt.float64, ())
             for k, a in enumerate(flat)]
    full_attrs, out_type = check_op(opdef, attrs, types)
    tensors = [k for k, a in enumerate(flat) if isinstance(a, DTensor)]
    layouts, out_layout = _rule(opdef, full_attrs, [flat[k] for k in tensors], out_type)
    for k, lay in zip(tensors, layouts):
        flat[k] = redistribute(flat[k], lay)
    local = _local_function(opdef.name, local_attrs(opdef.name, full_attrs, out_layout, mesh),
                            packed,
                            tuple(None if k in tensors else flat[k] for k in range(len(flat))),
                            mesh.target)
    blocks = _run(mesh, local, {r: [flat[k].blocks[r] for k in tensors]
                                for r in mesh.engine.ranks})
    blocks = {r: b if on_gpu(b) else np.asarray(b) for r, b in blocks.items()}
    out = DTensor(mesh, out_type.shape, out_type.dtype.np, out_layout, blocks)
    want_shape = out_layout.local_shape(out.shape, mesh)
    for b in blocks.values():
        if b.shape != want_shape:        # a rule's mistake, never a silent wrong answer
            raise ShardingError(f"{opdef.name}: a block of shape {b.shape} where the layout "
                                f"{out_layout} gives {want_shape}")
    return out


def _rule(opdef, attrs, xs, out_type):
    """(the layout each DTensor operand needs, the result's layout)."""
    name = opdef.name
    from ..ops.registry import Elementwise
    if isinstance(opdef.lowering, Elementwise):
        return _elementwise(name, xs, out_type)
    if name == "matmul" and all(x.ndim >= 2 for x in xs) and len(xs) == 2:
        return _matmul(xs, tuple(out_type.shape))
    if name == "transpose" and len(xs) == 1:
        x = xs[0]
        perm = attrs["perm"]
        return [x.layout], Layout(tuple(x.layout.dims[p] for p in perm), x.layout.partial)
    if name == "attention":
        return _batched(xs, out_type, core=2)
    if name in ("sum", "mean", "max", "min") and len(xs) == 1:
        return _reduction(name, xs[0], attrs)
    if name == "reshape" and xs[0].ndim and out_type.shape:
        return _reshape(xs[0], tuple(out_type.shape))
    if name in ("expand_dims", "squeeze") and len(xs) == 1:
        # dimensions of size 1 come and go; the others keep their splits
        x, shape = xs[0], tuple(out_type.shape)
        kept = [d for d in range(x.ndim) if x.shape[d] != 1]
        dims, it = [], iter(kept)
        for n in shape:
            dims.append(x.layout.dims[next(it)] if n != 1 else ())
        need = tuple(x.layout.dims[d] if d in kept else () for d in range(x.ndim))
        return [Layout(need)], Layout(tuple(dims))
    if name == "take" and len(xs) == 2 and xs[0].ndim:
        # rows picked by split indices (an embedding of a batch split over dp): the table's
        # picked dimension whole, the indices' splits carried into the result
        x, idx = xs
        ax = attrs["axis"] % x.ndim
        keep = [() if d == ax else x.layout.dims[d] for d in range(x.ndim)]
        used = {a for axes in keep for a in axes}
        idims = [() if used & set(axes) else axes for axes in idx.layout.dims]
        return [Layout(tuple(keep)), Layout(tuple(idims))], \
            Layout(tuple(keep[:ax] + idims + keep[ax + 1:]))
    if name in ("argmax", "argmin", "logsumexp", "var") and len(xs) == 1 and xs[0].ndim:
        # a reduction no pending value can stand for: its axes whole, the others keep their
        # splits (cross-entropy's logsumexp over a batch split over dp)
        x = xs[0]
        axes = _axes(attrs.get("axis"), x.ndim)
        dims = [() if d in axes else x.layout.dims[d] for d in range(x.ndim)]
        out = dims if attrs.get("keepdim") else [dims[d] for d in range(x.ndim) if d not in axes]
        return [Layout(tuple(dims))], Layout(tuple(out))
    if name == "slice" and len(xs) == 1 and xs[0].ndim:
        # a dimension sliced is whole; one kept whole keeps its split (topk's first k)
        x = xs[0]
        dims = tuple(x.layout.dims[d] if (attrs["starts"][d], attrs["stops"][d],
                                          attrs["steps"][d]) == (0, x.shape[d], 1) else ()
                     for d in range(x.ndim))
        return [Layout(dims)], Layout(dims)
    if name == "take_along_axis" and len(xs) == 2 and xs[0].ndim == xs[1].ndim:
        # the other dimensions keep the splits of the indices (topk's picks)
        x, idx = xs
        ax = attrs["axis"] % x.ndim
        dims = tuple(() if d == ax or x.shape[d] != idx.shape[d] else idx.layout.dims[d]
                     for d in range(x.ndim))
        return [Layout(dims), Layout(dims)], Layout(dims)
    if name in _AXIS_OPS and len(xs) == 1:
        x = xs[0]
        axes = _axes(attrs.get("axis"), x.ndim)
        if out_type.shape != x.shape:
            return [Layout.replicated(x.ndim)], Layout.replicated(len(out_type.shape))
        lay = Layout(tuple(() if d in axes else x.layout.dims[d] for d in range(x.ndim)))
        return [lay], lay
    return [Layout.replicated(x.ndim) for x in xs], Layout.replicated(len(out_type.shape))


def _axes(axis, ndim: int) -> list:
    """An operator's axis attribute (None: all; an int; a list) as sorted dimensions."""
    axes = range(ndim) if axis is None else [axis] if isinstance(axis, int) else axis
    return sorted({a % ndim for a in axes})


def reshape_groups(ins: tuple, outs: tuple) -> list | None:
    """[(input dimensions, output dimensions)] of a reshape: the shortest runs of each side
    with equal products, in order (None for a shape with a zero)."""
    if 0 in ins or 0 in outs:
        return None
    groups, i, j = [], 0, 0
    while i < len(ins) or j < len(outs):
        gi, go, pi, po = [], [], 1, 1
        if i < len(ins):
            gi, pi, i = [i], ins[i], i + 1
        if j < len(outs):
            go, po, j = [j], outs[j], j + 1
        while pi != po:
            if pi < po and i < len(ins):
                gi.append(i)
                pi *= ins[i]
                i += 1
            elif po < pi and j < len(outs):
                go.append(j)
                po *= outs[j]
                j += 1
            else:
                return None
        groups.append((gi, go))
    return groups


def _reshape(x, out_shape):
    """A split of a group's first input dimension is p contiguous runs of the group's
    elements: it becomes the split of the group's first output dimension when that divides
    (batch and sequence merged, heads split out of the features and merged back, experts
    split); any other split of the group is gathered first."""
    groups = reshape_groups(tuple(x.shape), out_shape)
    if groups is None:
        return [Layout.replicated(x.ndim)], Layout.replicated(len(out_shape))
    need, out = list(x.layout.dims), [()] * len(out_shape)
    for gi, go in groups:
        # dimensions of size 1 in a group hold no split and are passed over
        gi = [d for d in gi if x.shape[d] != 1] or gi
        go = [d for d in go if out_shape[d] != 1] or go
        axes = x.layout.dims[gi[0]] if gi else ()
        parts = math.prod(x.mesh.shape[a] for a in axes)
        if axes and go and not any(x.layout.dims[d] for d in gi[1:]) and \
                out_shape[go[0]] % parts == 0:
            out[go[0]] = axes
        else:
            for d in gi:
                need[d] = ()
    partial = x.layout.partial
    return [Layout(tuple(need), partial)], Layout(tuple(out), partial)


def local_attrs(name, attrs, out_layout, mesh) -> dict:
    """An operator's attributes for the blocks: sizes in them are the global tensor's."""
    # a reshape's target shape and a slice's stops along split (whole) dimensions
    key = {"reshape": "shape", "slice": "stops"}.get(name)
    if key and any(out_layout.dims):
        sizes = list(attrs[key])
        for d, axes in enumerate(out_layout.dims):
            for a in axes:
                sizes[d] //= mesh.shape[a]
        return {**attrs, key: sizes}
    return attrs


def _broadcast(xs, out_shape, core=0):
    """The result's splits over its broadcast dimensions (all but the last ``core``: the first
    operand splitting a dimension decides, an axis used once), and each operand's (a dimension
    it broadcasts from size 1, or a core one, whole)."""
    rank = len(out_shape)
    out_dims, used = [()] * rank, set()
    for x in xs:
        off = rank - x.ndim
        for d in range(max(0, x.ndim - core)):
            axes = x.layout.dims[d]
            if axes and x.shape[d] == out_shape[off + d] and not out_dims[off + d] and \
                    not used & set(axes):
                out_dims[off + d] = axes
                used |= set(axes)
    each = [tuple(out_dims[rank - x.ndim + d]
                  if d < x.ndim - core and x.shape[d] == out_shape[rank - x.ndim + d] else ()
                  for d in range(x.ndim)) for x in xs]
    return tuple(out_dims), each


def _elementwise(name, xs, out_type):
    out_dims, each = _broadcast(xs, out_type.shape)
    split = {a for axes in out_dims for a in axes}
    partial = tuple(sorted(_unsplit(_elementwise_partial(name, xs), split).items()))
    return ([Layout(dims, partial if x.layout.partial else ()) for x, dims in zip(xs, each)],
            Layout(out_dims, partial))


def _batched(xs, out_type, core):
    """An operator over the last ``core`` dimensions, batched over the others (attention: heads
    and batch split, sequence and features whole)."""
    out_dims, each = _broadcast(xs, out_type.shape, core)
    return [Layout(dims) for dims in each], Layout(out_dims)


def _elementwise_partial(name, xs):
    """The pending reductions that pass through; the others are taken first."""
    pend = [x.layout.partial_axes for x in xs]
    if not any(pend):
        return {}
    sums = all(op == "sum" for p in pend for op in p.values())
    if name in _LINEAR_SUM and sums and all(p == pend[0] for p in pend):
        return pend[0]
    if name in ("mul", "div") and sums and sum(bool(p) for p in pend) == 1 and \
            (name == "mul" or pend[0]):
        return next(p for p in pend if p)
    return {}


def _unsplit(partial: dict, split: set) -> dict:
    """The pending reductions that pass on to a result split over `split`: not one over an
    axis the result is split by (that one is taken first: an axis cannot both split a
    dimension and hold terms of a sum)."""
    return {a: op for a, op in partial.items() if a not in split}


def _matmul(xs, out_shape):
    """Each way of giving the mesh axes to the product's dimensions (see `_matmul_claims`),
    the one moving the fewest bytes: a batch split of the larger operand kept and the smaller
    one moved (experts split over an axis: the tokens sent to them by one all-to-all, not the
    experts' weights gathered)."""
    best = None
    for order in _CLAIM_ORDERS:
        need, out = _matmul_claims(xs, order)
        cost = sum(_move_cost(x, lay) for x, lay in zip(xs, need)) + \
            _pending_cost(xs[0].mesh, out_shape, out)
        if best is None or cost < best[0]:
            best = cost, need, out
    return list(best[1]), best[2]


# the orders in which a product's dimensions claim the mesh axes: contraction, rows, columns,
# then the batch (the rule's default), or the batch first, the larger operand's or the smaller's
_CLAIM_ORDERS = (("k", "m", "n", "ba", "bb"), ("big", "small", "k", "m", "n"),
                 ("small", "big", "k", "m", "n"))


def _move_cost(x, lay) -> int:
    """Elements each rank receives to take ``x`` to ``lay`` (the collectives' cost)."""
    if x.layout == lay:
        return 0
    block = math.prod(x.layout.local_shape(x.shape, x.mesh))
    return sum(bytes_moved(x.mesh, moves(x.layout, lay), block))


def _pending_cost(mesh, shape, out) -> int:
    """A pending sum of the product costs at least a reduce-scatter of its block later."""
    block = math.prod(out.local_shape(shape, mesh))
    return sum((mesh.shape[ax] - 1) * block // mesh.shape[ax] for ax, _ in out.partial)


def _matmul_claims(xs, order):
    """(the operands' layouts, the product's) when the contraction ``k``, rows ``m``, columns
    ``n`` and each operand's batch dimensions (``ba``, ``bb``; ``big`` and ``small`` by size)
    claim their splits in ``order``, each axis going to the first claim."""
    a, b = xs
    if a.layout.partial and b.layout.partial:
        b_lay = Layout(b.layout.dims)      # one pending sum at a time: b's taken first
    else:
        b_lay = b.layout
    # only a pending sum passes through a product
    sums = all(op == "sum" for lay in (a.layout, b_lay) for op in lay.partial_axes.values())
    ad, bd = list(a.layout.dims), list(b_lay.dims)
    ka, kb = ad[-1], bd[-2]
    if ka and kb and ka != kb:
        ka = kb = ()
    want = {"k": ka or kb, "m": ad[-2], "n": bd[-1]}
    if set(want["m"]) & set(want["n"]) and math.prod(a.shape) < math.prod(b.shape):
        want["m"] = ()          # an axis wanted by both: the smaller operand is gathered
    batch = len(ad) - 2, len(bd) - 2
    out_batch_rank = max(batch)
    out_batch = [()] * out_batch_rank
    larger = 0 if math.prod(a.shape) >= math.prod(b.shape) else 1
    names = {"ba": 0, "bb": 1, "big": larger, "small": 1 - larger}
    got, taken = {}, set()
    for claim in order:
        if claim in want:
            axes = () if taken & set(want[claim]) else want[claim]
            got[claim] = axes
            taken |= set(axes)
            continue
        j = names[claim]
        dims, nb = (ad, bd)[j], batch[j]
        for d in range(nb):
            o = out_batch_rank - nb + d
            if dims[d] and not out_batch[o] and not taken & set(dims[d]):
                out_batch[o] = dims[d]
                taken |= set(dims[d])
    k, m, n = got["k"], got["m"], got["n"]
    a_batch = [out_batch[out_batch_rank - batch[0] + d] if a.shape[d] != 1 else ()
               for d in range(batch[0])]
    b_batch = [out_batch[out_batch_rank - batch[1] + d] if b.shape[d] != 1 else ()
               for d in range(batch[1])]
    keep_a = _unsplit(a.layout.partial_axes, taken) if sums else {}
    keep_b = _unsplit(b_lay.partial_axes, taken) if sums else {}
    a_need = Layout(tuple(a_batch + [m, k]), tuple(sorted(keep_a.items())))
    b_need = Layout(tuple(b_batch + [k, n]), tuple(sorted(keep_b.items())))
    partial = {**keep_a, **keep_b, **{ax: "sum" for ax in k}}
    return (a_need, b_need), Layout(tuple(out_batch + [m, n]), tuple(sorted(partial.items())))


def _reduction(name, x, attrs):
    axes = _axes(attrs["axis"], x.ndim)
    pend = x.layout.partial_axes
    passes = (name in ("sum", "mean") and all(op == "sum" for op in pend.values())) or \
        (name in ("max", "min") and all(op == name for op in pend.values()))
    keep = pend if passes else {}
    new = {ax: name for d in axes for ax in x.layout.dims[d]}
    need = Layout(x.layout.dims, tuple(sorted(keep.items())))
    dims = [() if d in axes else x.layout.dims[d] for d in range(x.ndim)]
    if not attrs["keepdim"]:
        dims = [dims[d] for d in range(x.ndim) if d not in axes]
    return [need], Layout(tuple(dims), tuple(sorted({**keep, **new}.items())))


# ---- the local kernels: the compiled single-process operator, one per (operator, attributes) ----
_LOCAL: dict = {}


def _local_function(name, attrs, packed, consts, target="cpu"):
    """A compiled function of the tensor operands (numbers and attributes baked in)."""
    key = (name, repr(sorted(attrs.items())), packed, repr(consts), target)
    fn = _LOCAL.get(key)
    if fn is None:
        def body(*tensors):
            it = iter(tensors)
            return apply_local(name, packed, [next(it) if c is None else c for c in consts],
                               attrs)
        body.__name__ = f"local_{name}"
        fn = _LOCAL[key] = function(_fixed_arity(body, sum(c is None for c in consts)),
                                    target=target)
    return fn


def apply_local(name, packed, xs, attrs):
    """Operator ``name`` on ``xs`` while tracing a blocks' function; an operator of a list of
    operands (``packed``: concat) takes them as one list."""
    from ..trace import apply
    return apply(name, xs, **attrs) if packed else apply(name, *xs, **attrs)


def _fixed_arity(fn, n):
    """A function of exactly n positional parameters (tessera.function binds by signature)."""
    names = ", ".join(f"x{i}" for i in range(n))
    scope = {"fn": fn}
    exec(f"def local({names}):\n    return fn({names})\n", scope)
    scope["local"].__name__ = scope["local"].__qualname__ = fn.__name__
    return scope["local"]


_COMPILED: set = set()


def _run(mesh, fn, operands: dict) -> dict:
    """fn on every held rank's operand blocks. Under MPI rank 0 compiles a new kernel first and
    the others wait, then load it from the shared cache (n gccs would fight over the cores)."""
    eng = mesh.engine
    some = next(iter(operands.values()))
    key = (id(fn), tuple((b.shape, b.dtype.str) for b in some))
    first = eng.name != "virtual" and key not in _COMPILED
    if first and eng.rank != 0:
        eng.barrier()
    out = {r: fn(*blocks) for r, blocks in operands.items()}
    if first and eng.rank == 0:
        eng.barrier()
    _COMPILED.add(key)
    return out


def redistribute(x, layout):
    """``x`` (a DTensor) in ``layout`` (see `moves`); x itself when nothing changes."""
    if x.layout == layout:
        return x
    blocks = apply_moves(x.mesh, dict(x.blocks), moves(x.layout, layout))
    return DTensor(x.mesh, x.shape, x.dtype, layout, blocks)
