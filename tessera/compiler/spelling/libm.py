"""Our own transcendentals (libm.h beside this file, C shipped as package data), as the named
chunks the renderers emit, each once per program.

libm.h is real C, kept as a file so that it reads (and diffs) as C: each line
``// ---- NAME (needs A, B)`` starts the chunk NAME, which runs to the next such line; its error
bounds and the reasons for its shape are in the file. The text before the first chunk is the
file's comment, never emitted.
"""
from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).parent        # (package data: installed beside this file)

# The operators whose kernels call the target's C library instead of a polynomial of ours (glibc's
# libm on the CPU, CUDA's or HIP's device library on a GPU), by dtype: within that library's
# error bound, and the same bits on two targets only where their libraries round alike. They
# did for glibc on x86 and ARM64; CUDA's sin, cos and pow differ from glibc's in the last bit
# (seen on an H200).
FROM_C_LIBRARY = {"sin": ("float32", "float64"), "cos": ("float32", "float64"),
                  "pow": ("float32", "float64"), "atan2": ("float32", "float64"),
                  "log": ("float64",),
                  # through float64 log (Goldberg's and Kahan's rewrites on it)
                  "log1p": ("float64",), "expm1": ("float64",), "softplus": ("float64",)}

_MARK = re.compile(r"^// ---- (\w+)(?: \(needs ([\w, ]+)\))?\n", re.M)


def _read(path: Path) -> dict[str, tuple]:
    """NAME -> (its text, the names it needs), from the chunks of a file."""
    text = path.read_text()
    marks = list(_MARK.finditer(text))
    out = {}
    for m, end in zip(marks, [n.start() for n in marks[1:]] + [len(text)]):
        needs = tuple(m.group(2).split(", ")) if m.group(2) else ()
        out[m.group(1)] = (text[m.end():end].rstrip("\n"), needs)
    return out


CHUNKS = _read(HERE / "libm.h")


def chunks(name: str) -> tuple[str, ...]:
    """The texts a program needs for the function `name`: what it needs first (depth first, each
    once), then its own."""
    out = []

    def add(n):
        text, needs = CHUNKS[n]
        for d in needs:
            add(d)
        if text not in out:
            out.append(text)
    add(name)
    return tuple(out)


# operator -> its chunks, by dtype (float64 log is a thin libm wrapper, ts_log)
F32 = {op: chunks(f"ts_{op}f") for op in ("exp", "tanh", "erf", "log")}
F64 = {op: chunks(f"ts_{op}") for op in ("exp", "tanh", "erf", "log")}
