"""How many threads a CPU call runs on: the configured count (OMP_NUM_THREADS, else the cores
this process may use), fewer while other processes keep the cores busy.

A parallel region ends when every thread of its team has arrived; on an oversubscribed machine
one of them is often descheduled, and the region waits a scheduler time slice for it (a warm
0.7 ms call of an imported GPT-2 took 94 ms with three other processes on two cores). So before
a call the runtime looks (at most every REFRESH_S seconds) at how many threads the machine is
running besides this process's own, and gives the call only the cores left, at least one. No
result depends on it: every output element is computed by one thread in a fixed order, whatever
the thread count. TESSERA_ADAPTIVE_THREADS=0 keeps the configured count.
"""
from __future__ import annotations

import os
import threading
import time

REFRESH_S = 0.05


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def configured_threads() -> int:
    """OMP_NUM_THREADS (its first level), else the cores."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(env) if env.isdigit() and int(env) > 0 else cores()


def busy_elsewhere() -> int | None:
    """Threads running on the machine now that are not this process's (Linux: the running
    count of /proc/loadavg less this process's own running threads); None where unknown."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        ours = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                    ours += f.read().rsplit(b")", 1)[1].split()[0] == b"R"
            except OSError:
                pass                    # (a thread that just ended)
        return max(0, running - max(ours, 1))
    except (OSError, ValueError, IndexError):
        return None


class _Chooser:
    def __init__(self):
        self.adaptive = os.environ.get("TESSERA_ADAPTIVE_THREADS", "1") not in ("0", "false",
                                                                                  "no")
        self.configured, self.cores = configured_threads(), cores()
        self.at, self.choice = -1.0, self.configured
        self.local = threading.local()          # per OS thread: the count it was last given

    def threads(self) -> int:
        now = time.monotonic()
        if now - self.at > REFRESH_S:
            self.at = now
            busy = busy_elsewhere()
            self.choice = self.configured if busy is None else \
                max(1, min(self.configured, self.cores - busy))
        return self.choice

    def narrow(self, set_threads, get_threads) -> int | None:
        """Before a call on this thread: its OpenMP thread count lowered to the cores other
        processes leave, where that is fewer; returns the count to put back after the call
        (None: nothing changed). The count is the calling thread's, shared with every OpenMP
        user on it: PyTorch's wheel bundles a libgomp.so.1, which our programs then load, so a
        count left lowered would run PyTorch's own kernels on one thread after ours (and on
        one thread, torch.compile's code for an MLP step corrupts the heap: torch 2.13)."""
        if not self.adaptive or set_threads is None or get_threads is None \
                or self.configured == 1:
            return None
        n = self.local.n = self.threads()       # (what the call may use: tests read it)
        if n >= self.configured:
            return None
        before = get_threads()
        if n >= before:
            return None
        set_threads(n)
        return before


chooser = _Chooser()
