"""The Strategy base class and the registry of strategies.

A strategy is how one kind of fusion group becomes a kernel: the compiler's counterpart of an
operator's registry entry. It owns, in one module, everything that kind of kernel needs: which
nodes start its groups and which producers they take in (fusion), its cost, its knobs (defaults
per target, what the autotuner may try, which values are invalid, the seeds' names for them,
what a user's Schedule sets), its lowering to Tile IR for the CPU and for GPUs side by side on
the shared emitter (compiler/emit.py), and the sources of the routines its kernels call.

Fusion, the scheduler (scheduler.py), the autotuner and the renderers loop over the registry; no
compiler file outside a strategy names one.
"""
from __future__ import annotations

from ..dynamic import representative
from ..groups import Group, identity_map, is_elementwise, is_view, squeezes_only

PARALLEL_MIN_ELEMENTS = 1 << 16     # below this, starting threads costs more than it saves
PARALLEL_MIN_FLOPS = 1 << 20
GPU_THREADS = 256                   # threads per block of elementwise kernels


def worth_threads(elements) -> bool:
    """Whether a kernel over this many elements runs in parallel (a dynamic size is judged by
    its bucket's, so every size of the bucket decides alike: compiler/dynamic.py)."""
    return representative(elements) >= PARALLEL_MIN_ELEMENTS


class Strategy:
    name = ""
    makes_kernels = True    # its groups become kernels (control flow's become region steps)
    grows = True            # fusion grows its groups from the root towards their producers
    fuses_views = True      # its groups read views (transpose, slice, broadcast) in place
    knobs = ()              # the knobs it tunes besides parallel and threads
    numeric_knobs = ()      # of those, the ones that change the association of sums
    aliases = {}            # the seeds' (Triton's) names for its knobs: {"BM": "tile_m"}
    routines = {}           # routine name -> the C function its kernels call, {S}: the dtype

    # -- fusion ----------------------------------------------------------------------------------
    def claims(self, n) -> bool:
        """Does node n start a group of this strategy (as its root)?"""
        return False

    def start(self, n) -> Group:
        shape = tuple(n.out.type.shape)
        grp = Group(self.name, n, shape)
        grp.maps[n.out.id] = identity_map(shape)
        return grp

    def absorb(self, grp: Group, p, m, users) -> bool:
        """Take producer p (every user of it in the group; m: its axis map) into the group.
        By default elementwise nodes, and views where the group reads views in place."""
        if is_elementwise(p) or is_view(p) and (squeezes_only(p) or self.fuses_views):
            grp.maps[p.out.id] = m
            return True
        return False

    def adopt(self, grp: Group, p, m) -> bool:
        """Turn a group of another strategy into one of this one, taking in p (a pointwise
        group meeting a reduction becomes a row group)."""
        return False

    def absorb_output(self, grp: Group, p, users, group_of) -> bool:
        """Take p, a function output, into the group as a second store."""
        return False

    def absorb_operand(self, grp: Group, p) -> bool:
        """Take p, an operand of the group's anchor (the node its routine computes)."""
        return False

    def takes_as_epilogue(self, p, users) -> bool:
        """Could a group of this strategy take elementwise node p as its epilogue (so that
        another group had better leave it alone)?"""
        return False

    # -- cost ------------------------------------------------------------------------------------
    def node_flops(self, n) -> int:
        """Floating-point operations of node n, a node this strategy claims."""
        return 0

    # -- knobs -----------------------------------------------------------------------------------
    def cpu_knobs(self, k) -> dict:
        return {"parallel": worth_threads(k.output.type.numel()), "simd": True}

    def gpu_knobs(self, k, target: str) -> dict:
        return {"threads": GPU_THREADS}

    def op_knobs(self, grp: Group) -> dict:
        """Knobs an operator's own attributes set (matmul's tile_shape)."""
        return {}

    def user_knobs(self, schedule) -> dict:
        """The knobs a user's tessera.Schedule sets for this strategy's kernels."""
        return {} if schedule.parallel is None else {"parallel": bool(schedule.parallel)}

    def space(self, k) -> dict:
        """The values of this strategy's own knobs the autotuner may try."""
        return {}

    def invalid(self, k, knobs: dict) -> str | None:
        """Why these knobs cannot serve kernel k (None when they can)."""
        return None

    # -- lowering --------------------------------------------------------------------------------
    def lower_cpu(self, k, code: int) -> list:
        """The kernel's Tile IR statements for the CPU; `code`: what it reports on bad input."""
        raise NotImplementedError(self.name)

    def lower_gpu(self, k, code: int, target: str, knobs: dict) -> tuple | list:
        """(Tile IR statements, launch) for a GPU target; or a list of them: phases, launched
        one after another (a barrier across the whole grid between them), sharing one
        workspace."""
        raise NotImplementedError(self.name)

    # -- routines --------------------------------------------------------------------------------
    def c_routine(self, name: str, dtype: str) -> list[str]:
        """The C chunks defining routine `name` for dtype (f32, f64)."""
        raise KeyError(name)

    def c_half_routine(self, name: str) -> str:
        """The C wrapper of routine `name` for 16-bit operands ({S}: f16 or bf16)."""
        raise KeyError(name)

    def gpu_routine(self, lang: str, name: str, dtype: str, sizes: list) -> list[str]:
        """The CUDA or HIP chunks defining routine `name` for dtype at these sizes."""
        raise KeyError(name)


REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    if strategy.name in REGISTRY:
        raise ValueError(f"strategy {strategy.name} registered twice")
    REGISTRY[strategy.name] = strategy
    return strategy


def get(name: str) -> Strategy:
    return REGISTRY[name]


def of(grp_or_kernel) -> Strategy:
    """The strategy of a fusion group or a kernel."""
    return REGISTRY[getattr(grp_or_kernel, "strategy", None) or grp_or_kernel.kind]


def owner(n) -> Strategy | None:
    """The strategy an operator node starts a group of (None if none claims it)."""
    return next((s for s in REGISTRY.values() if s.claims(n)), None)


def routine_owner(name: str) -> Strategy:
    """The strategy whose kernels call routine `name` ("gemm")."""
    for s in REGISTRY.values():
        if name in s.routines:
            return s
    raise KeyError(f"no strategy has a routine {name!r}")
