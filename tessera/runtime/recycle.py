"""Large results' memory, used again once the arrays that held it are gone.

A fresh result from the system costs a pass of page zeroing before the kernel's own pass: the
kernel zeroes every new page on first touch (a 64 MiB softmax result: 30% of the call on a 2-core
VM, more than the softmax itself). So a CPU program's result of MIN_BYTES or more comes from a
block of memory an earlier result left behind when it died, where one of that size is idle.

Each such result is a NumPy array over a lease on its block: the lease is the base of its
bases, and every view taken from it holds the array through its own base, so the lease lives
exactly as long as some array can still reach the memory. When it dies the block goes back to
the idle list, up to IDLE_BYTES in all (the rest is freed). A result is never handed memory
another array can read or write.

The arrays behave as NumPy's own, except that they do not own their data (`flags.owndata` is
False, so `ndarray.resize` refuses them). `release()` frees the idle blocks;
$TESSERA_IDLE_RESULTS_MB sets IDLE_BYTES (0: none kept, every result fresh pages).
"""
from __future__ import annotations

import collections
import os
import threading
import warnings

import numpy as np

MIN_BYTES = 1 << 20          # smaller results: NumPy's allocator (malloc reuses their memory)


def _idle_limit() -> int:
    """$TESSERA_IDLE_RESULTS_MB in bytes (default 512 MiB; 0: no idle memory kept)."""
    text = os.environ.get("TESSERA_IDLE_RESULTS_MB", "").strip()
    try:
        return max(0, int(text)) << 20 if text else 512 << 20
    except ValueError:
        warnings.warn(f"TESSERA_IDLE_RESULTS_MB={text!r} is not a number of MiB: 512 kept",
                      stacklevel=2)
        return 512 << 20


IDLE_BYTES = _idle_limit()   # at most this much idle memory kept for later results (read once)
ALIGN = 64                   # (a cache line: what the kernels' vector loads like)

_lock = threading.Lock()
_idle: dict[int, list] = {}  # block size -> idle blocks
_idle_bytes = 0
# blocks whose leases died, waiting to join the idle list: appending is atomic, so a lease's
# finaliser (which the collector may run at any moment, even inside `_lock`) takes no lock
_returned: collections.deque = collections.deque()


class _Lease:
    """One result's hold on its block: `__array_interface__` its aligned bytes (which the
    result views as its dtype: the interface's type strings cannot name ml_dtypes' types)."""
    __slots__ = ("block", "__array_interface__")

    def __init__(self, block: np.ndarray, nbytes: int):
        self.block = block
        start = block.ctypes.data
        start += -start % ALIGN
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (start, False), "version": 3}

    def __del__(self):
        try:
            _returned.append(self.block)
        except Exception:        # (interpreter shutdown: the module may be gone)
            pass


def _take_returned() -> None:
    """Move the returned blocks to the idle list, freeing what exceeds IDLE_BYTES (under
    _lock)."""
    global _idle_bytes
    while _returned:
        block = _returned.popleft()
        if _idle_bytes + block.nbytes <= IDLE_BYTES:
            _idle.setdefault(block.nbytes, []).append(block)
            _idle_bytes += block.nbytes


def lends(nbytes: int) -> bool:
    """Whether a result of `nbytes` takes its memory from here (callers decide once per
    program: a warm call of a small function must not pay for asking)."""
    return nbytes >= MIN_BYTES


def empty(shape: tuple, dtype, nbytes: int) -> np.ndarray:
    """An uninitialised array of `nbytes` (which lends), as np.empty, for a program's result:
    its memory an idle block's where one of the size is waiting."""
    global _idle_bytes
    size = nbytes + ALIGN
    with _lock:
        _take_returned()
        blocks = _idle.get(size)
        block = blocks.pop() if blocks else None
        if block is not None:
            _idle_bytes -= size
    if block is None:
        block = np.empty(size, np.uint8)
    return np.asarray(_Lease(block, nbytes)).view(np.dtype(dtype)).reshape(shape)


def block_of(a) -> np.ndarray | None:
    """The block under a result (following its bases), or None for memory not lent here."""
    while a is not None and not isinstance(a, _Lease):
        a = getattr(a, "base", None)
    return None if a is None else a.block


def idle_bytes() -> int:
    """The memory kept idle for later results, in bytes."""
    with _lock:
        _take_returned()
        return _idle_bytes


def release() -> int:
    """Free the idle blocks (results alive keep theirs); the bytes freed."""
    global _idle_bytes
    with _lock:
        _take_returned()
        freed, _idle_bytes = _idle_bytes, 0
        _idle.clear()
    return freed
