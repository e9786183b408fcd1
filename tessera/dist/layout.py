"""Meshes and layouts: which device holds which block of a sharded tensor.

A `Mesh` arranges devices (MPI ranks, or virtual devices in one process) on named axes, row-major:
the last axis varies fastest. A `Layout` says, for every dimension of a tensor, which mesh axes
split it (major first), and which axes hold a pending reduction (`Partial`: each device's block is
one term of a sum, a mean or a max not taken yet). An axis neither splits a dimension nor is
pending: the tensor is replicated over it. `ShardSpec` is how a user writes a layout (the seeds'
``ShardSpec(("row",), ("dp",))``, or one entry per dimension as JAX's PartitionSpec).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..errors import ShardingError, TesseraError, enrich

REDUCTIONS = ("sum", "mean", "max", "min")


def at_user_line(fn):
    """A TesseraError raised inside names the user's line that called ``fn``."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TesseraError as e:
            from ..trace import user_location
            raise enrich(e, location=user_location()) from None
    return wrapped


class Mesh:
    """Devices on named axes. ``Mesh(axes=["dp"], devices=range(4))``; sizes given
    (``axes={"tp": 2, "dp": 2}`` or ``shape=(2, 2)``) or inferred (the device count's prime
    factors spread as evenly as possible, the later axes taking the larger). Under ``mpiexec``
    the devices are MPI ranks and the mesh needs exactly that many; elsewhere they are virtual
    devices in this process (every block held here), for a notebook on one machine.
    ``target="cuda"``: the blocks are CuPy arrays and every kernel is CUDA (each MPI rank on its
    node's GPU of its rank, exchanging by NCCL; ranks sharing a GPU, and virtual devices, share
    the current one)."""

    @at_user_line
    def __init__(self, axes, devices=None, shape=None, target="cpu"):
        if isinstance(axes, dict):
            names, sizes = list(axes), [int(v) for v in axes.values()]
        else:
            names, sizes = [str(a) for a in ([axes] if isinstance(axes, str) else axes)], None
            if shape is not None:
                sizes = [int(s) for s in shape]
        if not names or len(set(names)) != len(names):
            raise ShardingError("a mesh needs one or more distinct axis names",
                                received=str(names))
        devices = list(range(math.prod(sizes))) if devices is None and sizes else list(devices)
        if not devices:
            raise ShardingError("a mesh needs devices", hint="Mesh(axes=['dp'], devices=range(4))")
        if sizes is None:
            sizes = _spread(len(devices), len(names))
        if len(sizes) != len(names) or math.prod(sizes) != len(devices) or min(sizes) < 1:
            raise ShardingError(f"mesh axes {dict(zip(names, sizes))} do not hold "
                                f"{len(devices)} devices", expected="axis sizes whose product "
                                "is the device count")
        if target not in ("cpu", "cuda"):
            raise ShardingError(f"a mesh's target is 'cpu' or 'cuda', not {target!r}")
        self.target = target            # where the blocks live and the kernels run
        self.axis_names = tuple(names)
        self.shape = dict(zip(names, sizes))
        self.devices = tuple(devices)
        from .engine import engine_for
        self.engine = engine_for(self)

    @property
    def size(self) -> int:
        return len(self.devices)

    def coords(self, rank: int) -> dict:
        """The rank's coordinate on every axis (rank = position in ``devices``)."""
        out, rest = {}, rank
        for name in reversed(self.axis_names):
            out[name] = rest % self.shape[name]
            rest //= self.shape[name]
        return {n: out[n] for n in self.axis_names}

    def rank_of(self, coords: dict) -> int:
        r = 0
        for name in self.axis_names:
            r = r * self.shape[name] + coords[name]
        return r

    def group(self, rank: int, axes) -> list:
        """The ranks sharing ``rank``'s coordinates except along ``axes``, in the order of those
        axes' combined coordinate (major first): the members of one collective over ``axes``."""
        c = self.coords(rank)
        out = []
        for k in range(math.prod(self.shape[a] for a in axes)):
            rest, cc = k, dict(c)
            for a in reversed(axes):
                cc[a], rest = rest % self.shape[a], rest // self.shape[a]
            out.append(self.rank_of(cc))
        return out

    def check_axis(self, axis) -> tuple:
        axes = (axis,) if isinstance(axis, str) else tuple(axis)
        for a in axes:
            if a not in self.shape:
                raise ShardingError(f"mesh axis {a!r} is not in the mesh",
                                    expected=f"one of {list(self.axis_names)}")
        return axes

    def __eq__(self, other):
        return isinstance(other, Mesh) and self._key() == other._key()

    def _key(self):
        return tuple(self.shape.items()), self.devices, self.target      # axis order counts

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        axes = ", ".join(f"{k}={v}" for k, v in self.shape.items())
        where = "" if self.target == "cpu" else f", {self.target}"
        return f"Mesh({axes}; {self.engine.name}{where})"


def _spread(n: int, k: int) -> list:
    factors, m, p = [], n, 2
    while m > 1:
        while m % p == 0:
            factors.append(p)
            m //= p
        p += 1
    sizes = [1] * k
    for f in sorted(factors, reverse=True):     # each factor to the smallest axis so far
        sizes[sizes.index(min(sizes))] *= f
    return sorted(sizes)                        # the later axes the larger


@dataclass(frozen=True)
class Partial:
    """A pending reduction over a mesh axis: ``Partial("sum")``, ``"mean"``, ``"max"`` or
    ``"min"`` (kept distinct: only operators linear in the value may take a pending sum)."""
    op: str = "sum"

    def __post_init__(self):
        if self.op not in REDUCTIONS:
            raise ShardingError(f"Partial({self.op!r}) is not a reduction",
                                expected=f"one of {REDUCTIONS}")

    def __repr__(self):
        return f"Partial({self.op})"


class ShardSpec:
    """Which tensor dimension each mesh axis splits.

    The seeds' form names dimensions and axes side by side: ``ShardSpec(("row",), ("dp",))``,
    ``ShardSpec(partition=("row", "col"), mesh_axes=("tp", "pp"))``; a dimension is ``"row"``
    (0), ``"col"`` (1) or its index. JAX's form gives one entry per dimension:
    ``ShardSpec.per_dim("dp", None)``, an entry being an axis, a tuple of axes (major first) or
    None (not split). ``partial={"dp": "sum"}`` marks a pending reduction."""

    _NAMED = {"row": 0, "col": 1, "column": 1}

    @at_user_line
    def __init__(self, partition=(), mesh_axes=(), partial=None):
        partition = (partition,) if isinstance(partition, (str, int)) else tuple(partition)
        mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
        if len(partition) != len(mesh_axes):
            raise ShardingError("ShardSpec pairs each partitioned dimension with a mesh axis",
                                received=f"partition={partition}, mesh_axes={mesh_axes}")
        self.pairs = []
        for d, a in zip(partition, mesh_axes):
            if isinstance(d, str):
                if d not in self._NAMED:
                    raise ShardingError(f"unknown dimension {d!r} in a ShardSpec",
                                        expected="'row', 'col' or a dimension index")
                d = self._NAMED[d]
            self.pairs.append((int(d), (a,) if isinstance(a, str) else tuple(a)))
        self.partial = {a: (p if isinstance(p, Partial) else Partial(p))
                        for a, p in (partial or {}).items()}

    @classmethod
    def per_dim(cls, *entries, partial=None):
        pairs = [(d, e) for d, e in enumerate(entries) if e is not None]
        return cls([d for d, _ in pairs], [e for _, e in pairs], partial=partial)

    def layout(self, shape, mesh: Mesh, name: str = "tensor") -> "Layout":
        rank = len(shape)
        dims = [()] * rank
        for d, axes in self.pairs:
            if not -rank <= d < rank:
                raise ShardingError(f"{name}: its ShardSpec splits dimension {d}, and it has "
                                    f"{rank}", received=f"shape {tuple(shape)}")
            dims[d % rank] = dims[d % rank] + tuple(axes)
        layout = Layout(tuple(dims), tuple(sorted((a, p.op) for a, p in self.partial.items())))
        layout.check(shape, mesh, name)
        return layout

    def __repr__(self):
        inner = ", ".join(f"{d}@{'*'.join(a)}" for d, a in self.pairs)
        part = f", partial={self.partial}" if self.partial else ""
        return f"ShardSpec({inner}{part})"


@dataclass(frozen=True)
class Layout:
    """Per dimension the mesh axes splitting it (major first); the pending reductions as
    (axis, op) pairs. Replicated over every other axis."""
    dims: tuple
    partial: tuple = ()

    @classmethod
    def replicated(cls, rank: int) -> "Layout":
        return cls(((),) * rank)

    @property
    def partial_axes(self) -> dict:
        return dict(self.partial)

    def check(self, shape, mesh: Mesh, name: str = "tensor"):
        seen = []
        for d, axes in enumerate(self.dims):
            for a in axes:
                mesh.check_axis(a)
                seen.append(a)
            parts = math.prod(mesh.shape[a] for a in axes)
            if shape[d] % parts:
                raise ShardingError(
                    f"{name}: dimension {d} (size {shape[d]}) does not divide over mesh axes "
                    f"{'*'.join(axes)} ({parts} blocks)",
                    hint="choose a size that divides, or another axis; Tessera never "
                         "replicates silently")
        for a, _ in self.partial:
            mesh.check_axis(a)
            seen.append(a)
        if len(seen) != len(set(seen)):
            raise ShardingError(f"{name}: a mesh axis splits two dimensions (or is also "
                                "pending) in one layout", received=repr(self))

    def local_shape(self, shape, mesh: Mesh) -> tuple:
        return tuple(n // math.prod(mesh.shape[a] for a in axes)
                     for n, axes in zip(shape, self.dims))

    def block(self, shape, mesh: Mesh, rank: int) -> tuple:
        """The slices of the global tensor held by ``rank``."""
        c = mesh.coords(rank)
        out = []
        for n, axes in zip(shape, self.dims):
            k, parts = 0, 1
            for a in axes:
                k, parts = k * mesh.shape[a] + c[a], parts * mesh.shape[a]
            size = n // parts
            out.append(slice(k * size, (k + 1) * size))
        return tuple(out)

    def with_dims(self, dims) -> "Layout":
        return Layout(tuple(tuple(d) for d in dims), self.partial)

    def with_partial(self, partial: dict) -> "Layout":
        return Layout(self.dims, tuple(sorted(partial.items())))

    def type_str(self, shape, dtype: str) -> str:
        """``f32[1024@dp, 1024]``: the sharding as part of the type, as the Graph IR prints it."""
        dims = ", ".join(f"{n}@{'*'.join(a)}" if a else str(n) for n, a in zip(shape, self.dims))
        part = "".join(f" +{op}@{a}" for a, op in self.partial)
        return f"{dtype}[{dims}]{part}"

    def __repr__(self):
        dims = ", ".join("*".join(a) if a else "-" for a in self.dims)
        part = "".join(f", Partial({op})@{a}" for a, op in self.partial)
        return f"Layout({dims}{part})"
