"""CUDA and HIP from the GPU Tile IR: the C-style base with what differs between the languages.

Every kernel is
    extern "C" __global__ void __launch_bounds__(block) name(<params>, int* ts_status)
with one pointer per TileKernel.params in order (`const T* __restrict__` for inputs), launched
with TileKernel.launch's grid and block (no dynamic shared memory); a bad gather index stores
the kernel's code in *ts_status, and the ints after it are the program's workspace (zeroed by
the runtime before each run: TileProgram.workspace). There is no host entry point:
TileProgram.calls lists the launches. CUDA source includes no system header (NVRTC has none):
the prelude defines the few names the code uses. The op helpers (tessera/compiler/spelling/)
and the routines are device functions.
"""
from __future__ import annotations

from ... import dtypes as dt
from ...runtime import gpu as gpu_runtime, targets
from ..tile_ir import (Barrier, BlockReduce, Load, Loop, Shared, ThreadIndex, Ticket, TileKernel,
                       TileProgram, Var, VecLoad, VecStore, Workspace, all_statements)
from ..strategies import routine_owner
from .cstyle import CStyleRenderer, ShapeGeneric

FULL_MASK = "0xffffffffu"


class GpuRenderer(CStyleRenderer):
    lang = ""
    warp = 32
    index_type = "long long"
    restrict = "__restrict__"

    def loop_range(self, s: Loop) -> tuple[str, str]:
        v = s.var
        if s.kind == "grid":
            return ("(long long)blockIdx.x * blockDim.x + threadIdx.x",
                    f"{v} += (long long)gridDim.x * blockDim.x")
        if s.kind == "block":
            return "blockIdx.x", f"{v} += gridDim.x"
        if s.kind == "thread":
            return "threadIdx.x", f"{v} += blockDim.x"
        return super().loop_range(s)

    def loop_header(self, s: Loop, k: TileKernel) -> list[str]:
        return ["#pragma unroll"] if s.kind == "unroll" else []

    def expr_ThreadIndex(self, e: ThreadIndex) -> str:
        return "(long long)threadIdx.x"

    def stmt_Shared(self, s: Shared, k: TileKernel, depth: int, out: list):
        out.append(f"{'  ' * depth}__shared__ {self.ctype(s.dtype)} {s.name}[{s.size}];")

    def stmt_Barrier(self, s: Barrier, k: TileKernel, depth: int, out: list):
        out.append(f"{'  ' * depth}__syncthreads();")

    def stmt_BlockReduce(self, s: BlockReduce, k: TileKernel, depth: int, out: list):
        out.extend("  " * depth + line for line in self.block_reduce(s, k.launch["block"]))

    def stmt_Workspace(self, s: Workspace, k: TileKernel, depth: int, out: list):
        pad, T = "  " * depth, self.storage_type(s.dtype)
        at = f"ts_status + {1 + self._work_base + s.offset}"
        if s.per_block or not s.volatile:
            own = f" + (long long)blockIdx.x * {s.per_block}" if s.per_block else ""
            out.append(f"{pad}{T}* {s.name} = ({T}*)({at}{own});")
        else:
            out.append(f"{pad}volatile {T}* {s.name} = (volatile {T}*)({at});")

    def stmt_Ticket(self, s: Ticket, k: TileKernel, depth: int, out: list):
        pad = "  " * depth
        out += [f"{pad}int {s.name};",
                f"{pad}{{",
                f"{pad}  __shared__ int {s.name}_s;",
                f"{pad}  __threadfence();      /* this block's writes, before its ticket */",
                f"{pad}  if (threadIdx.x == 0) {s.name}_s = "
                f"atomicAdd(ts_status + {1 + self._work_base + s.counter}, 1);",
                f"{pad}  __syncthreads();",
                f"{pad}  {s.name} = {s.name}_s;",
                f"{pad}  __syncthreads();          /* {s.name}_s is free again */",
                f"{pad}}}"]

    def stmt_VecLoad(self, s: VecLoad, k: TileKernel, depth: int, out: list):
        v = self.vector_type(s.dtype, s.lanes)
        out.append(f"{'  ' * depth}{v} {s.name} = *(const {v}*)({s.buf} + "
                   f"{self.expr(s.index)});")

    def stmt_VecStore(self, s: VecStore, k: TileKernel, depth: int, out: list):
        pad, v = "  " * depth, self.vector_type(self._dtypes[s.buf], len(s.values))
        out.append(f"{pad}{{")
        out.append(f"{pad}  {v} ts_v;")
        out.extend(f"{pad}  ts_v[{lane}] = {self.stored(s.buf, value)};"
                   for lane, value in enumerate(s.values))
        out.append(f"{pad}  *({v}*)({s.buf} + {self.expr(s.index)}) = ts_v;")
        out.append(f"{pad}}}")

    def vector_type(self, d: dt.DType, lanes: int) -> str:
        return f"ts_vec<{self.storage_type(d)}, {lanes}>"

    def begin_kernel(self, k: TileKernel):
        """Vector-loaded elements keep their parameter's storage: 16-bit floats as bits."""
        super().begin_kernel(k)
        self._dtypes = {p.name: p.dtype for p in k.params}
        self._halves = {**self._halves, **{s.name: s.dtype for s in all_statements(k.body)
                                           if isinstance(s, VecLoad) and s.dtype.is_narrow}}

    def atomic_add(self, s, k: TileKernel) -> list[str]:
        """atomicAdd: int32 as int, int64 through CUDA's unsigned long long overload (two's
        complement: the same bits)."""
        at, v = f"{s.buf} + ({self.expr(s.index)})", self.expr(s.value)
        if self._dtypes[s.buf] == dt.int64:
            return [f"atomicAdd((unsigned long long*)({at}), (unsigned long long)({v}));"]
        return [f"atomicAdd((int*)({at}), (int)({v}));"]

    def block_reduce(self, s: BlockReduce, block: int) -> list[str]:
        """A shuffle-down tree in each warp (lane i combines lane i + o, o halving), then thread 0
        combines the warps' results in order; the result goes through scratch[warps] to every
        thread. Fixed order: the same bits on every run. Two barriers: the scratch array is free
        again for the next reduction once every thread has passed the second."""
        T, w, warps = self.ctype(s.dtype), f"{s.name}_w", block // self.warp
        lines = [f"{T} {s.name};", "{", f"  {T} {w} = {self.expr(s.value)};"]
        o = self.warp // 2
        while o:
            lines += [f"  {T} {w}{o} = {self.shuffle(s.dtype, w, o)};",
                      f"  {w} = {self.expr(s.combine(Var(w), Var(f'{w}{o}')))};"]
            o //= 2
        lines += [f"  if ((threadIdx.x & {self.warp - 1}) == 0) {s.scratch}[threadIdx.x / "
                  f"{self.warp}] = {w};",
                  "  __syncthreads();",
                  "  if (threadIdx.x == 0) {",
                  f"    {w} = {s.scratch}[0];",
                  f"    for (int ts_w = 1; ts_w < {warps}; ++ts_w) "
                  f"{w} = {self.expr(s.combine(Var(w), Load(s.scratch, Var('ts_w'))))};",
                  f"    {s.scratch}[{warps}] = {w};",
                  "  }",
                  "  __syncthreads();",
                  f"  {s.name} = {s.scratch}[{warps}];",
                  "}"]
        return lines

    half_prefix = "tsg"
    half_lang = "gpu"
    _work_bases: dict = {}         # kernel -> its workspace's first int (set by render)
    _work_base = 0

    def half_helpers(self) -> list[str]:
        """The 16-bit conversions: the GPU routines' own (gpu_gemm.py's COMMON chunk, which
        the renderer emits once even when a routine needs it too)."""
        from ..strategies.routines.gpu_gemm import COMMON
        return [COMMON[self.lang]]

    def shuffle(self, d: dt.DType, v: str, offset: int) -> str:
        """`v` of the lane `offset` above, as C (bools travel as int)."""
        if d.is_bool:
            return f"(bool){self.shuffle_call(f'(int){v}', offset)}"
        return self.shuffle_call(v, offset)

    def shuffle_call(self, v: str, offset: int) -> str:
        raise NotImplementedError

    def flag_error(self, code: int) -> list[str]:
        return [f"*ts_status = {code};"]     # every writer of one kernel writes the same code

    def render(self, program: TileProgram) -> str:
        self._work_bases = program.workspace_bases()
        return super().render(program)

    def kernel(self, k: TileKernel) -> str:
        self.begin_kernel(k)
        self._work_base = self._work_bases.get(k.name, 0)
        params = ", ".join([self.param_decl(p) for p in k.params] + ["int* ts_status"] +
                           self.size_params())
        names = "".join(f"; {p.name} is %{p.label}" for p in k.params if p.label)
        L = k.launch
        grid = "per call" if self.size_params() else L["grid"]    # (a generic's: its size's)
        lines = [f"/* {k.strategy}: {k.origin}{names} */",
                 f"/* launch: grid {grid}, block {L['block']}, "
                 f"dynamic shared {L['shared']} */",
                 f'extern "C" __global__ void __launch_bounds__({L["block"]}) '
                 f"{k.name}({params}) {{"]
        for s in k.body:
            self.stmt(s, k, 1, lines)
        lines.append("}")
        return "\n".join(lines)

    def routine_source(self, key: str) -> list[str]:
        name, dtype, *sizes = key.split(":")
        return routine_owner(name).gpu_routine(self.lang, name, dtype, [int(x) for x in sizes])

    def entry(self, program: TileProgram) -> str:
        return ""                 # the runtime launches program.calls by kernel name

    def common_prelude(self) -> list[str]:
        return ["#define TS_INLINE static __device__ __forceinline__",
                "/* N elements moved in one aligned access (pointwise kernels' vector path) */",
                "template <typename T, int N> struct alignas(sizeof(T) * N) ts_vec {",
                "  T v[N];",
                "  __device__ __forceinline__ T& operator[](int i) { return v[i]; }",
                "  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }",
                "};",
                "#ifndef INT32_MIN",
                "#define INT32_MIN (-2147483647 - 1)",
                "#define INT32_MAX 2147483647",
                "#define INT64_MIN (-9223372036854775807LL - 1)",
                "#define INT64_MAX 9223372036854775807LL",
                "#endif",
                "#ifndef INT8_MIN",
                "#define INT8_MIN (-128)",
                "#define INT8_MAX 127",
                "#define INT16_MIN (-32767 - 1)",
                "#define INT16_MAX 32767",
                "#define UINT8_MAX 255",
                "#define UINT16_MAX 65535",
                "#define UINT32_MAX 4294967295U",
                "#define UINT64_MAX 18446744073709551615ULL",
                "#endif"]


class CudaRenderer(GpuRenderer):
    lang = "cuda"
    warp = 32

    def prelude(self) -> str:
        return "\n".join([
            "/* generated by tessera: CUDA C++ for NVRTC (no system headers) */",
            "typedef signed char int8_t;",
            "typedef short int16_t;",
            "typedef int int32_t;",
            "typedef long long int64_t;",
            "typedef unsigned int uint32_t;",
            "typedef unsigned long long uint64_t;",
            "typedef unsigned short uint16_t;",
            "typedef unsigned char uint8_t;",
            "#define INFINITY __int_as_float(0x7f800000)",
            "#define NAN __int_as_float(0x7fffffff)",
            *self.common_prelude()])

    def shuffle_call(self, v: str, offset: int) -> str:
        return f"__shfl_down_sync({FULL_MASK}, {v}, {offset})"


class HipRenderer(GpuRenderer):
    lang = "hip"
    warp = 64                     # gfx90a's wavefront

    def prelude(self) -> str:
        return "\n".join([
            "/* generated by tessera: HIP C++ */",
            "#include <hip/hip_runtime.h>",
            "#ifndef INFINITY",
            "#define INFINITY __builtin_huge_valf()",
            "#define NAN __builtin_nanf(\"\")",
            "#endif",
            *self.common_prelude()])

    def shuffle_call(self, v: str, offset: int) -> str:
        return f"__shfl_down({v}, {offset}, {self.warp})"


class ShapeGenericCuda(ShapeGeneric, CudaRenderer):
    """CUDA for a shape-generic program: the sizes are the kernels' last arguments."""


class ShapeGenericHip(ShapeGeneric, HipRenderer):
    """HIP for a shape-generic program."""


def render_cuda(program: TileProgram, symbols=None) -> str:
    """CUDA C++ of a tile program (shape-generic in `symbols` when given)."""
    return (ShapeGenericCuda(symbols) if symbols else CudaRenderer()).render(program)


def render_hip(program: TileProgram, symbols=None) -> str:
    return (ShapeGenericHip(symbols) if symbols else HipRenderer()).render(program)


# GPU programs are compiled where they first run (NVRTC, hipRTC: runtime/gpu.py), so a target
# has no build step here; either runs where CuPy is built for it and finds a device
CUDA = targets.register(targets.Target(
    "cuda", "cuda", ".cu", render=lambda program, level=None, symbols=None:
    render_cuda(program, symbols), gpu=True, warp=CudaRenderer.warp,
    available=lambda: "cuda" in gpu_runtime.runnable_targets(), peaks=gpu_runtime.device_peaks,
    about="CUDA C++ for NVIDIA GPUs, compiled by NVRTC, run through CuPy"))
HIP = targets.register(targets.Target(
    "hip", "hip", ".hip", render=lambda program, level=None, symbols=None:
    render_hip(program, symbols), gpu=True, warp=HipRenderer.warp,
    available=lambda: "hip" in gpu_runtime.runnable_targets(), peaks=gpu_runtime.device_peaks,
    about="HIP C++ for AMD GPUs (64-wide wavefronts), compiled by hipRTC, run through CuPy"))
