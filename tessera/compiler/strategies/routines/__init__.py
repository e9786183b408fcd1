"""The hand-written routines strategies call, as real source files beside this one: C for the CPU
(`.c`, `.h`), CUDA and HIP for GPUs (`.cuh`). The Python modules here hold what varies (ISA
tables, tile plans, which chunks a routine needs) and fill the files' {NAME} tokens with one
mechanism: `specialise(routine_text(file), NAME=value, ...)`.

Each file holds its text followed by one newline, which `routine_text` drops, so a text may end
without one."""
from __future__ import annotations

import functools
from importlib import resources


@functools.lru_cache(maxsize=None)
def routine_text(name: str) -> str:
    """The text of the routine source file `name` in this folder."""
    text = resources.files(__name__).joinpath(name).read_text()
    return text[:-1] if text.endswith("\n") else text


def specialise(template: str, **subs) -> str:
    """The text with each {NAME} token replaced literally by str(value) (C is full of braces
    str.format would trip on)."""
    for name, value in subs.items():
        template = template.replace("{" + name + "}", str(value))
    return template
