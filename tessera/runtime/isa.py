"""The CPU target's instruction-set level: the one this machine runs, and the one a program is
built for.

A CPU program is compiled for a named ISA level, never for `-march=native`: what a level means
does not depend on the machine that compiles, so AVX2 code can be built (and, on a machine that
runs it, measured) on an AVX-512 machine, and a test names the level it is about. The level is
the host's by default; `TESSERA_CPU_TARGET=x86-64-v3` or `target="cpu:x86-64-v3"` chooses another.
It is printed in the Schedule IR and the generated C and is part of the kernel cache's key and
the autotuning database's.

The numerics contract holds across levels: every kernel gives the same bits at every level (the
same operations in the same order; FMAs are written, never contracted).
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

from ..errors import BackendUnavailableError


@dataclass(frozen=True)
class Level:
    name: str
    arch: str                   # "x86_64", "aarch64", or "any"
    march: tuple[str, ...]      # the compiler flags that select it
    needs: frozenset            # the /proc/cpuinfo flags (x86) or Features (ARM) it needs
    rank: int                   # within one arch, the host's level is the highest-ranked it runs
    about: str
    chosen: bool = True         # whether a host that runs it takes it by itself


_X86_V2 = frozenset("cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3".split())
_X86_V3 = _X86_V2 | frozenset("avx avx2 bmi1 bmi2 f16c fma abm movbe xsave".split())
_X86_V4 = _X86_V3 | frozenset("avx512f avx512bw avx512cd avx512dq avx512vl".split())
# The integer dot products (u8 x s8 in fours into int32: vpdpbusd; NEON's s8 x s8 sdot) the int8
# GEMM uses: AVX-VNNI on AVX2 cores (Alder Lake, Sierra Forest), AVX-512 VNNI from Cascade Lake
# and Zen 4, ARMv8.2's dot product. Each is a level of its own, as -march names none of them.
# At x86-64-v4+vnni the int8 GEMM also carries AMX's tile code, taken at run time where the CPU
# has the tiles (exact sums: the same bits; routines/amx.h).

LEVELS = {lv.name: lv for lv in [
    Level("generic", "any", (), frozenset(), 0, "the C compiler's default for this machine"),
    Level("x86-64-v2", "x86_64", ("-march=x86-64-v2",), _X86_V2, 1, "SSE4.2"),
    Level("x86-64-v3", "x86_64", ("-march=x86-64-v3",), _X86_V3, 2, "AVX2 + FMA"),
    Level("x86-64-v3+vnni", "x86_64", ("-march=x86-64-v3", "-mavxvnni"),
          _X86_V3 | {"avx_vnni"}, 3, "AVX2 + FMA + AVX-VNNI"),
    Level("x86-64-v4", "x86_64", ("-march=x86-64-v4",), _X86_V4, 4, "AVX-512"),
    Level("x86-64-v4+vnni", "x86_64", ("-march=x86-64-v4", "-mavx512vnni"),
          _X86_V4 | {"avx512_vnni"}, 5, "AVX-512 + VNNI"),
    # bf16 products on AVX-512 BF16's dot product of pairs (Cooper Lake, Sapphire Rapids, Zen 4):
    # their bits are not the FMA chains' of every other level, so it is chosen, never taken
    Level("x86-64-v4+bf16", "x86_64", ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"),
          _X86_V4 | {"avx512_vnni", "avx512_bf16"}, 6,
          "AVX-512 + VNNI + BF16 dot products (bf16 products in the instruction's order)",
          chosen=False),
    # bf16 products on AMX's tile dot product (Sapphire Rapids and later Xeons): bits of their
    # own again (gemm_bf16_amx.c says which), so it is chosen, never taken
    Level("x86-64-v4+amx", "x86_64", ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16",
                                      "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
          _X86_V4 | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}, 7,
          "AVX-512 + VNNI + BF16 + AMX tiles (bf16 products in the tiles' order)",
          chosen=False),
    Level("armv8-a", "aarch64", ("-march=armv8-a",), frozenset({"asimd"}), 1, "NEON"),
    Level("armv8.2-a+dotprod", "aarch64", ("-march=armv8.2-a+dotprod",),
          frozenset({"asimd", "asimddp"}), 2, "NEON + dot product"),
    Level("armv8.2-a+sve", "aarch64", ("-march=armv8.2-a+sve",), frozenset({"asimd", "sve"}), 3,
          "NEON + SVE", chosen=False),
]}

ENV = "TESSERA_CPU_TARGET"


def _arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


@functools.lru_cache(maxsize=None)
def _host_features() -> frozenset:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    # No /proc/cpuinfo (macOS): every 64-bit ARM core has NEON; an x86 one stays generic.
    return frozenset({"asimd"}) if _arch() == "aarch64" else frozenset()


@functools.lru_cache(maxsize=None)
def host_level() -> str:
    """The highest level this machine runs, of those a host takes by itself: not SVE (NEON code
    is as fast for our kernels on the cores that have both) and not x86-64-v4+bf16 or +amx (their
    bf16 products have bits of their own); those stay explicit choices."""
    arch, features = _arch(), _host_features()
    best = "generic"
    for lv in LEVELS.values():
        if lv.arch == arch and lv.needs <= features and lv.chosen \
                and lv.rank > LEVELS[best].rank:
            best = lv.name
    return best


def check_level(name: str, where: str = "the CPU target") -> str:
    if name not in LEVELS:
        raise BackendUnavailableError(f"{where} names the unknown ISA level {name!r}",
                                      expected=" or ".join(LEVELS),
                                      hint="for example target='cpu:x86-64-v3' (AVX2 + FMA)")
    return name


def default_level() -> str:
    """$TESSERA_CPU_TARGET when set (read at each compile), else the host's level."""
    env = os.environ.get(ENV, "").strip()
    return check_level(env, f"${ENV}") if env else host_level()


def runs_here(name: str) -> bool:
    lv = LEVELS[name]
    if lv.arch == "any":
        return True
    return lv.arch == _arch() and lv.needs <= _host_features()


def same_arch(name: str) -> bool:
    """Whether code for this level is for this machine's architecture (so its compiler builds
    it, whether or not this CPU has every feature)."""
    return LEVELS[name].arch in ("any", _arch())


def march_flags(name: str) -> tuple[str, ...]:
    return LEVELS[name].march


def describe(name: str) -> str:
    return f"{name} ({LEVELS[name].about})"
