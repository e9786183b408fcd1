"""The autotuning database: SQLite (WAL), one row per tuned kernel, holding knobs and measurements,
never binaries.

A row's key is a hash of everything the best knobs depend on: the kernel's structure (its
signature: operators, attributes, shapes, dtypes), the target, the hardware (CPU model and flags,
threads) and the compiler (version, flags, tessera's version). Change any of them and the old row
is simply never found again, so stale knobs are never reused.

Which database: `cache=` where the API takes one, else $TESSERA_AUTOTUNE_DB, else
autotune.sqlite in the cache directory. TESSERA_AUTOTUNE=0 ignores the database entirely (the
heuristics' knobs are used and nothing is searched).
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path

from ..version import __version__
from ..errors import ArgumentError, first_user_frame
from . import cache

DB_SCHEMA = 1
_TABLE = """CREATE TABLE IF NOT EXISTS tuned (
    key TEXT PRIMARY KEY,
    kernel TEXT NOT NULL,        -- the kernel's name where it was tuned (for people)
    strategy TEXT NOT NULL,
    signature TEXT NOT NULL,
    target TEXT NOT NULL,
    hardware TEXT NOT NULL,
    compiler TEXT NOT NULL,
    knobs TEXT NOT NULL,         -- JSON: the chosen knobs
    default_knobs TEXT NOT NULL, -- JSON
    best_s REAL NOT NULL,        -- median seconds of the chosen knobs
    default_s REAL NOT NULL,     -- median seconds of the heuristics' knobs, same run
    measurements TEXT NOT NULL,  -- JSON: every candidate tried, with its status and time
    created REAL NOT NULL,
    search TEXT                  -- JSON: how it was searched (search, space, exact, budget_s)
)"""
_COLUMNS = ("key", "kernel", "strategy", "signature", "target", "hardware", "compiler", "knobs",
            "default_knobs", "best_s", "default_s", "measurements", "created", "search")

# The database a compilation reads: (path, exact) set by `using`, None for "off", or _DEFAULT for
# the usual rules (the environment's database, unless TESSERA_AUTOTUNE=0).
_DEFAULT = object()
_active = contextvars.ContextVar("tessera_tune_db", default=_DEFAULT)


def enabled() -> bool:
    return os.environ.get("TESSERA_AUTOTUNE", "1").strip().lower() not in ("0", "false", "no", "off")


def default_path() -> Path:
    env = os.environ.get("TESSERA_AUTOTUNE_DB")
    return Path(env).expanduser() if env else cache.cache_dir() / "autotune.sqlite"


def resolve(path=None) -> Path:
    return Path(os.path.expanduser(os.fspath(path))) if path is not None else default_path()


@contextlib.contextmanager
def using(path, exact: bool = False):
    """Compilations inside read this database (`path`; None: none at all), even under
    TESSERA_AUTOTUNE=0, which only switches off the implicit one. `exact`: apply only the
    recorded knobs that keep every bit of the default's results."""
    token = _active.set((resolve(path), bool(exact)) if path is not None else None)
    try:
        yield
    finally:
        _active.reset(token)


def active() -> tuple | None:
    """(database path, exact) for the current compilation, or None when tuned knobs are off."""
    chosen = _active.get()
    if chosen is _DEFAULT:
        return (default_path(), False) if enabled() else None
    return chosen


# ---- keys ---------------------------------------------------------------------------------------
def hardware_fingerprint() -> str:
    from .toolchain import cpu_fingerprint
    threads = os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count() or 1)
    return f"{cpu_fingerprint()}/threads={threads.strip()}"


def compiler_fingerprint() -> str:
    from .toolchain import CFLAGS, compiler_version, find_compiler
    # the ISA level is in the key's target ("cpu:x86-64-v3")
    text = f"{compiler_version(find_compiler())}|{' '.join(CFLAGS)}|tessera={__version__}" \
           f"|cache={cache.SCHEMA_VERSION}|db={DB_SCHEMA}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_key(signature: str, target: str) -> tuple[str, dict]:
    parts = {"signature": signature, "target": target, "hardware": hardware_fingerprint(),
             "compiler": compiler_fingerprint()}
    h = hashlib.sha256("\0".join(parts[p] for p in sorted(parts)).encode()).hexdigest()
    return h, parts


# ---- the database -------------------------------------------------------------------------------
_warned: set = set()
_open_dbs: dict = {}
_open_lock = threading.Lock()


def _warn_once(key, message):
    if key in _warned:
        return
    _warned.add(key)
    _, depth = first_user_frame()
    warnings.warn(message, RuntimeWarning, stacklevel=depth + 1)


def _is_corruption(e: sqlite3.Error) -> bool:
    """Damage, as opposed to a busy, read-only, missing or failing file (never moved aside)."""
    name = getattr(e, "sqlite_errorname", "")
    if name:
        return name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or name.startswith("SQLITE_CORRUPT_")
    text = str(e).lower()
    return "not a database" in text or "malformed" in text or "integrity check" in text


def _is_busy(e: sqlite3.Error) -> bool:
    name = getattr(e, "sqlite_errorname", "")
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(e).lower()


class TuneDB:
    """One database file. Safe across threads (one connection, a lock), processes (SQLite's
    locking, WAL, a busy timeout and retries) and fork (a child opens its own connection).

    Only real damage (SQLite says corrupt or not a database, or its quick check fails) is
    reported, moved aside and rebuilt, under an exclusive file lock and after checking again;
    a busy, read-only or unreachable database raises sqlite3.Error to the caller, which falls
    back to the default knobs (reads) or reports it (writes)."""

    RETRY_S = 30.0

    def __init__(self, path):
        self.path = resolve(path)
        self._lock = threading.Lock()
        self._conn = None
        self._pid = os.getpid()
        self._inode = None

    def _check_path(self):
        if self.path.exists() and not self.path.is_file():
            raise ArgumentError(f"the autotuning database {self.path} is not a file",
                                hint="give the path of a file (it is created if missing)")

    def _connect(self) -> sqlite3.Connection:
        if self._pid != os.getpid():        # a forked child: never share the parent's handle
            self._conn, self._lock, self._pid = None, threading.Lock(), os.getpid()
        if self._conn is not None and self._stat() != self._inode:
            self._conn.close()              # the file was removed or replaced meanwhile
            self._conn = None
        if self._conn is None:
            self._check_path()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._conn = self._retry(self._open)
            except sqlite3.DatabaseError as e:
                if not _is_corruption(e):
                    raise
                self._rebuild(e)
                self._conn = self._retry(self._open)
            self._inode = self._stat()
        return self._conn

    def _stat(self):
        try:
            st = os.stat(self.path)
            return st.st_dev, st.st_ino
        except OSError:
            return None

    def _retry(self, fn):
        """fn(), retried with backoff while another process holds a lock it needs."""
        deadline, wait = time.monotonic() + self.RETRY_S, 0.01
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if not _is_busy(e) or time.monotonic() > deadline:
                    raise
                time.sleep(wait)
                wait = min(wait * 2, 0.5)

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False,
                               isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":       # e.g. a filesystem without shared memory
                conn.execute("PRAGMA journal_mode = DELETE")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(_TABLE)
            _add_search_column(conn)
            ok = conn.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {ok}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _rebuild(self, error):
        """Move the damaged file aside (to be looked at) and start anew: under an exclusive
        lock on a sidecar file, and only if it is still damaged once the lock is held (another
        process may have rebuilt it already)."""
        import fcntl
        with open(str(self.path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.path.exists():
                    try:
                        self._open().close()
                        return                   # healthy now: someone else rebuilt it
                    except sqlite3.DatabaseError as e:
                        if not _is_corruption(e):
                            raise
                stamp = time.strftime("%Y%m%d-%H%M%S")
                aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
                _warn_once(f"corrupt:{self.path}", f"tessera: the autotuning database "
                           f"{self.path} is corrupt ({error}); moved to {aside.name} and rebuilt "
                           "empty")
                cache.count("rebuilt_corrupt")
                if self.path.exists():
                    os.replace(self.path, aside)
                for suffix in ("-wal", "-shm"):     # the damaged file's journal goes with it
                    Path(str(self.path) + suffix).unlink(missing_ok=True)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _run(self, fn):
        with self._lock:
            try:
                return self._retry(lambda: fn(self._connect()))
            except sqlite3.DatabaseError as e:
                if not _is_corruption(e):
                    raise
                # damaged while open (another process wrote garbage): rebuild and retry once
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                self._rebuild(e)
                return fn(self._connect())

    def get(self, key: str) -> dict | None:
        row = self._run(lambda c: c.execute(
            "SELECT knobs, best_s, default_s, kernel FROM tuned WHERE key = ?", (key,)).fetchone())
        if row is None:
            return None
        try:
            knobs = json.loads(row[0])
        except ValueError:
            return None
        return {"knobs": knobs, "best_s": row[1], "default_s": row[2], "kernel": row[3]}

    def record(self, key: str) -> dict | None:
        """The whole row of a key (JSON fields parsed), or None (also for a damaged row)."""
        def read(c):
            cur = c.execute(f"SELECT {', '.join(_COLUMNS)} FROM tuned WHERE key = ?", (key,))
            return cur.fetchone()
        row = self._run(read)
        if row is None:
            return None
        out = dict(zip(_COLUMNS, row))
        try:
            for name in ("knobs", "default_knobs", "measurements"):
                out[name] = json.loads(out[name])
            out["search"] = json.loads(out["search"]) if out["search"] else None
        except ValueError:
            return None
        return out

    def put(self, key: str, parts: dict, *, kernel: str, strategy: str, knobs: dict,
            default_knobs: dict, best_s: float, default_s: float, measurements: list,
            search: dict | None = None):
        """Insert or replace a row in one transaction (the latest tuning of a key wins)."""
        values = (key, kernel, strategy, parts["signature"], parts["target"], parts["hardware"],
                  parts["compiler"], json.dumps(knobs, sort_keys=True),
                  json.dumps(default_knobs, sort_keys=True), best_s, default_s,
                  json.dumps(measurements, sort_keys=True), time.time(),
                  None if search is None else json.dumps(search, sort_keys=True))

        def write(c):
            with c:     # BEGIN ... COMMIT: readers see the old row or the whole new one
                c.execute(f"INSERT OR REPLACE INTO tuned ({', '.join(_COLUMNS)}) VALUES "
                          f"({', '.join('?' * len(_COLUMNS))})", values)
        self._run(write)

    def rows(self) -> list[dict]:
        """Every row, for people and DataFrames."""
        def read(c):
            cur = c.execute("SELECT * FROM tuned ORDER BY created")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]
        return self._run(read)

    def clear(self):
        self._run(lambda c: c.execute("DELETE FROM tuned"))

    def close(self):
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _add_search_column(conn):
    """A database made before rows kept how they were searched gets the column (empty)."""
    names = {r[1] for r in conn.execute("PRAGMA table_info(tuned)").fetchall()}
    if "search" not in names:
        try:
            conn.execute("ALTER TABLE tuned ADD COLUMN search TEXT")
        except sqlite3.OperationalError as e:
            if "duplicate column" not in str(e):     # (another process added it first)
                raise


def open_db(path=None) -> TuneDB:
    """The process's TuneDB for a path (one connection per file)."""
    p = resolve(path)
    with _open_lock:
        db = _open_dbs.get(p)
        if db is None:
            db = _open_dbs[p] = TuneDB(p)
        return db


def tuned_knobs(path, signature: str, target: str) -> dict | None:
    """The knobs recorded for a kernel of this signature on this target, machine and compiler
    (as stored: the scheduler checks them)."""
    if not resolve(path).exists():      # nobody has tuned here: create nothing
        return None
    db = open_db(path)
    key, _ = make_key(signature, target)
    try:
        row = db.get(key)
    except sqlite3.Error as e:          # locked for too long, read-only, failing: heuristics
        _warn_once(f"unreadable:{db.path}", f"tessera: cannot read the autotuning database "
                   f"{db.path} ({e}); using the default knobs")
        return None
    if row is None or not isinstance(row["knobs"], dict):
        return None
    cache.count("tuned_hits")
    return row["knobs"]


def warn_bad_record(path, kernel: str, why: str):
    _warn_once(f"bad:{path}:{kernel}", f"tessera: the autotuning database {path} holds knobs "
               f"for {kernel} that do not fit it ({why}); using the default knobs")
