"""The hand-written routines strategies call, as real source files beside this one: C for the CPU
(`.c`, `.h`), CUDA and HIP for GPUs (`.cuh`). The Python modules here hold what varies (ISA
tables, tile plans, which chunks a routine needs) and fill the files' {NAME} tokens with one
mechanism: `specialise(routine_text(file), NAME=value, ...)`. The 16-bit conversions are one
text for C and CUDA alike (half.h, on each language's primitives).

Each file holds its text followed by one newline, which `routine_text` drops, so a text may end
without one."""
from __future__ import annotations

import functools
from pathlib import Path

HERE = Path(__file__).parent        # (package data: installed beside this file)


@functools.lru_cache(maxsize=None)
def routine_text(name: str) -> str:
    """The text of the routine source file `name` in this folder."""
    text = (HERE / name).read_text()
    return text[:-1] if text.endswith("\n") else text


def specialise(template: str, **subs) -> str:
    """The text with each {NAME} token replaced literally by str(value) (C is full of braces
    str.format would trip on)."""
    for name, value in subs.items():
        template = template.replace("{" + name + "}", str(value))
    return template


# How the shared 16-bit conversions (half.h) are spelled in C and in CUDA/HIP: {P} the prefix,
# {Q} the qualifier, {U8}/{U16}/{U32} the unsigned types. Each language defines {P}_bits_f32
# and {P}_f32_bits before the text: C in half_c.h, CUDA/HIP in gpu_common.cuh.
HALF_SPELLING = {"c": dict(P="ts", Q="TS_INLINE", U8="uint8_t", U16="uint16_t", U32="uint32_t"),
                 "gpu": dict(P="tsg", Q="static __device__ __forceinline__", U8="unsigned char",
                             U16="tsg_u16", U32="unsigned")}


def half_conversions(lang: str) -> str:
    """f16/bf16/fp8 <-> float32 and float64 -> float32 rounded to odd, for "c" or "gpu": one text,
    so every target converts alike."""
    return specialise(routine_text("half.h"), **HALF_SPELLING[lang])


def narrow_conversions(lang: str, fp8: bool, sround: bool) -> list[str]:
    """The fp8 conversions (fp8.h) and stochastic rounding (sround.h, then sround_format.h once
    per narrow format; they use the fp8 conversions), for "c" or "gpu": chunks that follow
    half.h's text, emitted only for a program that uses them."""
    spell = HALF_SPELLING[lang]
    out = [specialise(routine_text("fp8.h"), **spell)] if fp8 or sround else []
    if sround:
        out.append(specialise(routine_text("sround.h"), **spell))
        out += [specialise(routine_text("sround_format.h"), F=f, B=spell[b], **spell)
                for f, b in (("f16", "U16"), ("bf16", "U16"), ("f8e4m3", "U8"), ("f8e5m2", "U8"))]
    return out
