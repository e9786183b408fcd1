"""Running CPU programs: the buffer table filled (inputs, constants, outputs, temporaries in
per-thread memory slots) and the program's launches run in one call of its C entry point
through ctypes (or of the timed entry point, which writes each kernel's seconds, when a profiler
is open). Large outputs take memory that dead results left behind (recycle.py)."""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from . import profiler, recycle
from .program import buffer_plan, launches_only, no_memory, results, status_error
from .threads import chooser
from .toolchain import ENTRY


class CpuExecutor:
    def __init__(self, program, library, steps):
        if not launches_only(steps):
            raise NotImplementedError("a CPU program runs kernel launches only (for now)")
        self.program = program
        self.entry = getattr(library, ENTRY, None)
        self.timed_entry = getattr(library, ENTRY + "_timed", None)
        # the OpenMP runtime the program links (absent without OpenMP): threads.py sets a
        # call's thread count through it
        self.set_threads = getattr(library, "omp_set_num_threads", None)
        self.get_threads = getattr(library, "omp_get_max_threads", None)
        self.plan = buffer_plan(program.tile_ir.buffers)
        self.buffers = program.tile_ir.buffers
        self.slot_sizes = program.schedule_ir.slots
        self.kernels = len(program.schedule_ir.kernels)
        self.threads = threading.local()     # per calling thread: its temporaries and table
        # a shape-generic library (compiler/dynamic.py) reads the sizes of the dynamic symbols
        # from the slot after the buffers
        sizes = getattr(program, "dynamic_sizes", None)
        self.sizes = None if sizes is None else np.array(list(sizes.values()), dtype=np.int64)
        self.table_type = ctypes.c_void_p * max(1, len(self.buffers) + (sizes is not None))
        self.poison = os.environ.get("TESSERA_POISON") == "1"     # read once, when built
        # what changes from call to call: the inputs (table position, parameter) and the
        # fresh arrays (position, shape, dtype, poison value, buffer); the rest is fixed
        self.inputs = [(i, step[1]) for i, step in enumerate(self.plan) if step[0] == "input"]
        # (+ whether its memory comes from dead results': decided here, off the warm path)
        self.allocs = [(i,) + step[1:] + (recycle.lends(step[4].nbytes),)
                       for i, step in enumerate(self.plan) if step[0] == "alloc"]
        wanted = {b.name for b in program.schedule_ir.outputs}
        self.outputs = [(i, b.name) for i, b in enumerate(self.buffers) if b.name in wanted]

    def prepared(self):
        """This thread's buffer table with the constants' and temporaries' addresses filled
        in (its temporary slots allocated on its first call, then reused): a call fills in
        only the inputs and the fresh arrays."""
        state = getattr(self.threads, "state", None)
        if state is not None:
            return state
        slots = []
        for i, size in enumerate(self.slot_sizes):
            try:
                slots.append(np.empty(max(size, 1), dtype=np.uint8))
            except MemoryError:
                b = next(b for b in self.buffers if b.slot == i)
                raise no_memory(self.program, b) from None
        table, ptrs, temps = [None] * len(self.plan), self.table_type(), []
        for i, step in enumerate(self.plan):
            if step[0] == "const":
                table[i] = step[1]
            elif step[0] == "temp":
                b = step[4]
                table[i] = slots[b.slot][:b.nbytes].view(step[2]).reshape(step[1])
                temps.append((table[i], step[3]))
            else:
                continue
            ptrs[i] = address(table[i])
        if self.sizes is not None:
            ptrs[len(self.buffers)] = address(self.sizes)
        state = self.threads.state = (table, ptrs, temps, slots)
        return state

    def execute(self, inputs: list) -> list:
        """Run on checked inputs (C-contiguous arrays of exactly the specialised types, in
        parameter order): the part of every call that cannot be skipped, kept lean because a
        warm call of a small function is mostly this."""
        fixed, ptrs, temps, _ = self.prepared()
        table = fixed.copy()
        for i, k in self.inputs:
            a = table[i] = inputs[k]
            ptrs[i] = address(a)
        for i, shape, dtype, fill, b, lent in self.allocs:
            try:
                a = table[i] = (recycle.empty(shape, dtype, b.nbytes) if lent
                                else np.empty(shape, dtype=dtype))
            except MemoryError:
                raise no_memory(self.program, b) from None
            if self.poison:
                a.fill(fill)
            ptrs[i] = address(a)
        if self.poison:
            for a, fill in temps:
                a.fill(fill)
        restore = chooser.narrow(self.set_threads, self.get_threads)
        recorder = profiler.current()
        if recorder is None:
            status = self.entry(ptrs)
        else:
            seconds = (ctypes.c_double * max(1, self.kernels))()
            status = self.timed_entry(ptrs, seconds)
        if restore is not None:
            self.set_threads(restore)
        if recorder is not None and not status:
            recorder.record(self.program, list(seconds)[:self.kernels])
        if status:
            raise status_error(self.program, status)
        return results(self.program, {name: table[i] for i, name in self.outputs}, np)


def address(a: np.ndarray) -> int:
    """An array's data address: through the buffer protocol, three times faster than
    `a.ctypes.data`, which read-only and empty arrays still need."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data
