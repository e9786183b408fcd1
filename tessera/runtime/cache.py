"""The on-disk kernel cache: content-addressed, written to a temporary name and renamed, so a
killed run or a concurrent process never leaves a half-written file behind."""
from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

SCHEMA_VERSION = 1
_stats_lock = threading.Lock()
_stats = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "traces": 0, "rebuilt_corrupt": 0,
          "tuned_hits": 0, "dynamic_reuses": 0}


def cache_dir() -> Path:
    root = os.environ.get("TESSERA_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tessera")
    return Path(root)


def cache_enabled() -> bool:
    return os.environ.get("TESSERA_NO_CACHE", "") not in ("1", "true", "yes")


def cache_stats() -> dict:
    """Counters since the process started (or since reset_cache_stats): compiles run, disk
    cache hits, in-memory hits, traces, and dynamic_reuses: calls at a new size of a dynamic
    symbol that a shape-generic program compiled earlier served (compiles avoided)."""
    return dict(_stats)


def reset_cache_stats():
    for k in _stats:
        _stats[k] = 0


def count(name: str, n: int = 1):
    with _stats_lock:
        _stats[name] += n


STALE_TEMPORARY_S = 3600     # a temporary this old belongs to no live write: its writer died
_swept: set = set()


def sweep_stale_temporaries():
    """Once per process and cache directory: delete the temporaries (.tmp-*) that a process
    killed while writing (SIGKILL during a compile) left behind. A live writer's temporary is
    seconds old; one an hour old is an orphan."""
    root = cache_dir()
    if root in _swept:
        return
    _swept.add(root)
    cutoff = time.time() - STALE_TEMPORARY_S
    try:
        for p in root.rglob(".tmp-*"):
            try:
                if p.is_file() and p.stat().st_mtime < cutoff:
                    p.unlink()
            except OSError:
                pass                    # (gone already, or not ours to delete)
    except OSError:
        pass


def atomic_write(path: Path, data: bytes):
    """Write data to path so that readers see the old file, or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
