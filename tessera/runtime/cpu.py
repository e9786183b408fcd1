"""Running CPU programs: the buffer table filled (inputs, constants, outputs, temporaries in
per-thread memory slots) and the program's launches run in one call of its C entry point
through ctypes (or of the timed entry point, which writes each kernel's seconds, when a profiler
is open)."""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from . import profiler
from .program import buffer_plan, launches_only, no_memory, results, status_error
from .toolchain import ENTRY


class CpuExecutor:
    def __init__(self, program, library, steps):
        if not launches_only(steps):
            raise NotImplementedError("a CPU program runs kernel launches only (for now)")
        self.program = program
        self.entry = getattr(library, ENTRY, None)
        self.timed_entry = getattr(library, ENTRY + "_timed", None)
        self.plan = buffer_plan(program.tile_ir.buffers)
        self.buffers = program.tile_ir.buffers
        self.slot_sizes = program.schedule_ir.slots
        self.kernels = len(program.schedule_ir.kernels)
        self.arenas = threading.local()      # temporaries' memory, kept per calling thread
        self.table_type = ctypes.c_void_p * max(1, len(self.buffers))
        self.poison = os.environ.get("TESSERA_POISON") == "1"     # read once, when built

    def slots(self):
        """This thread's temporary slots (allocated on its first call, then reused)."""
        arenas = getattr(self.arenas, "slots", None)
        if arenas is None:
            arenas = []
            for i, size in enumerate(self.slot_sizes):
                try:
                    arenas.append(np.empty(max(size, 1), dtype=np.uint8))
                except MemoryError:
                    b = next(b for b in self.buffers if b.slot == i)
                    raise no_memory(self.program, b) from None
            self.arenas.slots = arenas
        return arenas

    def execute(self, inputs: list) -> list:
        """Run on checked inputs (C-contiguous arrays of exactly the specialised types, in
        parameter order): the part of every call that cannot be skipped, kept lean because a
        warm call of a small function is mostly this."""
        poison = self.poison
        slots = self.slots() if self.slot_sizes else None
        table = []
        for step in self.plan:
            kind = step[0]
            if kind == "input":
                table.append(inputs[step[1]])
            elif kind == "const":
                table.append(step[1])
            elif kind == "temp":
                b = step[4]
                arr = slots[b.slot][:b.nbytes].view(step[2]).reshape(step[1])
                if poison:
                    arr.fill(step[3])
                table.append(arr)
            else:
                try:
                    arr = np.empty(step[1], dtype=step[2])
                except MemoryError:
                    raise no_memory(self.program, step[4]) from None
                if poison:
                    arr.fill(step[3])
                table.append(arr)
        ptrs = self.table_type(*[address(a) for a in table])
        recorder = profiler.current()
        if recorder is None:
            status = self.entry(ptrs)
        else:
            seconds = (ctypes.c_double * max(1, self.kernels))()
            status = self.timed_entry(ptrs, seconds)
            if not status:
                recorder.record(self.program, list(seconds)[:self.kernels])
        if status:
            raise status_error(self.program, status)
        return results(self.program, {b.name: arr for b, arr in zip(self.buffers, table)}, np)


def address(a: np.ndarray) -> int:
    """An array's data address: through the buffer protocol, three times faster than
    `a.ctypes.data`, which read-only and empty arrays still need."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data
