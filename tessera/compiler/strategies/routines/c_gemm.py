"""The CPU's GEMM routine: packed panels and a register-tiled micro-kernel (BLIS-style).

`ts_gemm_tile_<T>(A, rsa, csa, B, rsb, csb, C, ldc, K, mt, nt, kc)` overwrites the mt x nt block
at C with A @ B for operands of any strides (a transposed operand is read in place by the
packing). The caller hands out tiles to threads; the routine is single-threaded.

Determinism: every C element is fma(a_k, b_k, c) for k = 0, 1, ... from c = 0 - the same
chain whatever the tile, its edges, the K blocking or the instruction set (AVX-512, AVX2 and the
portable path all use fused multiply-adds), so tiles and threads never change a bit.
"""
from __future__ import annotations

from . import routine_text, specialise

MR = 6                         # micro-tile rows as the tiling heuristics count them (the C
                               # micro-kernel has its own per ISA: gemm_isa.h)
DEFAULT_TILE = {"f32": (512, 512, 256), "f64": (128, 256, 256),     # rows, cols per task; K block
                "i8": (256, 512, 1024)}
MIN_TASKS = 8                  # split smaller products finer, so both cores get work

# the chunks: ISA macros (plain C), per-thread scratch memory and the routine ({S}: f32 or f64,
# {T}: its C type, {F}: its libm suffix)
ISA = routine_text("gemm_isa.h")
SCRATCH = routine_text("scratch.c")
TRANSPOSE = routine_text("transpose.c")
_ROUTINE = routine_text("gemm.c")


def instantiate(template: str, dtype_short: str) -> str:
    t, f = {"f32": ("float", "f"), "f64": ("double", "")}[dtype_short]
    return specialise(template, S=dtype_short, T=t, F=f)


def gemm_source(dtype_short: str) -> list[str]:
    """The chunks for one dtype ("f32" or "f64"): the ISA definitions and the scratch memory
    (shared with the other routines, emitted once), the transposition its packing uses, then
    the routine."""
    return [ISA, instantiate(SCRATCH, dtype_short), instantiate(TRANSPOSE, dtype_short),
            instantiate(_ROUTINE, dtype_short)]


# The routines for 16-bit operands ({S}: f16 or bf16; the conversions are the C target's
# half.h): the float32 routine's chains on widened operands (float32 accumulation), each result
# rounded once into the output. The GEMM widens them straight into the float32 routine's packed
# panels per K block and runs its blocks (tiles of few rows or columns, and K = 0: widened
# copies into the float32 routine); attention widens its queries, the keys, values and its mask
# block into float32 scratch. Scratch comes from the thread's (the GEMM's panels) or malloc per
# call: a call's arithmetic (mt*nt*K, nq*Sk*D) dwarfs it. Never abort() in the user's process:
# without scratch the GEMM computes the same chains straight from the 16-bit operands;
# attention returns 1 and its kernel reports out of memory.
# At x86-64-v4+bf16, bf16 operands take the AVX-512 BF16 dot product instead (gemm_bf16_dot.c,
# compiled only where the flags define __AVX512BF16__): the order of its pairs gives other bits;
# at x86-64-v4+amx, AMX's tile dot product (gemm_bf16_amx.c, where __AMX_BF16__ is defined),
# with bits of its own again.
AMX = routine_text("amx.h")
HALF_ROUTINE = "\n\n".join([AMX] + [routine_text(f) for f in (
    "gemm_bf16_dot.c", "gemm_bf16_amx.c", "gemm_half.c")])


# The int8 GEMM (gemm_i8.c on gemm_i8_isa.h's instruction sets): int8 or uint8 operands, an
# exact int32 product. {S} names the pair ("i8u8": int8 A, uint8 B), {TA}/{TB} their C types,
# {UA}/{UB} whether each is unsigned.
INT8_PAIRS = {a + b for a in ("i8", "u8") for b in ("i8", "u8")}
I8_ISA = routine_text("gemm_i8_isa.h")
_I8_AMX = routine_text("gemm_i8_amx.c")           # (x86-64-v4+amx: the tiles)
_I8_ROUTINE = routine_text("gemm_i8.c")


def int8_gemm_source(pair: str) -> list[str]:
    """The chunks of the int8 GEMM for one operand pair ("i8i8", "u8i8", ...)."""
    ctype = {"i8": ("int8_t", 0), "u8": ("uint8_t", 1)}
    (ta, ua), (tb, ub) = ctype[pair[:2]], ctype[pair[2:]]
    return [I8_ISA, AMX, specialise(SCRATCH, S="q", T="unsigned char"),
            specialise(_I8_AMX + "\n\n" + _I8_ROUTINE, S=pair, TA=ta, UA=ua, TB=tb, UB=ub)]


# float32 activations times int8 weights (gemm_w8.c): the float32 routine's chains on weights
# widened in registers (few rows) or into scratch (more).
_W8_ROUTINE = routine_text("gemm_w8.c")


def int8_weight_gemm_source() -> list[str]:
    """The chunks of the float32 x int8-weight GEMM: the float32 routine's, then its own."""
    return gemm_source("f32") + [_W8_ROUTINE]
