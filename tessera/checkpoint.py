"""Checkpoints: ``ts.checkpoint.save(path, params, opt_state, step)`` and ``load(path)``.

    checkpoint.save("run/ckpt", params, opt_state, step)     # every rank calls it under MPI
    params, opt_state, step = checkpoint.load("run/ckpt")    # or load(path, mesh=other_mesh)

``params`` and ``opt_state`` are pytrees (tessera.pytree: dicts, lists, tuples, namedtuples,
None) whose leaves are NumPy arrays and scalars, Python numbers and strings, or sharded tensors
(`tessera.dist.DTensor`). A checkpoint is a directory::

    path/manifest.json          the tree, every leaf's kind, shape, dtype, layout, mesh and files
    path/blocks.<id>/*.npy      the arrays: one file per distinct block of a DTensor

**Atomic.** The manifest is the commit point. A save writes its blocks into a new directory
``path/blocks.<id>`` that no manifest names yet (each file written, flushed and fsync'ed); after
every rank has written its blocks, rank 0 writes the manifest under a temporary name, fsyncs it
and renames it onto ``path/manifest.json`` (a rename is atomic), then fsyncs ``path``; only then
are the older blocks directories removed. A crash at any moment leaves ``manifest.json``
naming either the old checkpoint's blocks or the new one's, both complete; the leftovers of a
crashed save are removed by the next save, and a save that raises removes its own. Every block
file's size and CRC-32 are in the manifest, so a missing, truncated or damaged file is a
`CheckpointError`, never a silent wrong answer. (One writer per path at a time.)

**Who writes what.** Under MPI each rank writes the blocks it holds, a block replicated over some
mesh axes by the lowest rank holding it; plain arrays and numbers by rank 0 (its value). On
virtual devices this process writes every block. A DTensor with a pending reduction has it taken
first, as `dist.gather` does (a collective: every rank is in ``save``): the checkpoint holds the
reduced values, and it loads with the same splits and no pending reduction.

**Dtypes** are recorded by their tessera names; bfloat16 and the fp8 formats (which NumPy's
``.npy`` cannot describe) are stored as their bits, unsigned integers of their width.

**Resharding.** ``load`` rebuilds each DTensor on ``mesh`` (default: a new mesh of the saved
axes, whose engine is found as `dist.Mesh` finds it) in its saved layout, or another given by
``layouts``; each rank assembles its new block from the saved blocks overlapping it. This
version reads each overlapping block file whole (and checks its CRC) before slicing it.
"""
from __future__ import annotations

import functools
import importlib
import io
import json
import math
import os
import shutil
import sys
import threading
import types
import uuid
import zlib

import numpy as np

from . import dtypes as dt
from .errors import ArgumentError, DeviceError, ShardingError, TesseraError
from .pytree import flatten

__all__ = ["save", "save_async", "wait", "load", "latest_step", "CheckpointError", "Checkpointed",
           "PendingSave"]

FORMAT, VERSION = "tessera.checkpoint", 1
MANIFEST = "manifest.json"
_BLOCKS = "blocks."                 # prefix of a save's blocks directory
_TMP_MANIFEST = ".manifest."        # prefix of a manifest not yet renamed into place


class CheckpointError(TesseraError):
    """A checkpoint that cannot be read: no manifest, a damaged one, a block file missing or not
    what the manifest says; or a save another rank failed."""


# ---- saving -------------------------------------------------------------------------------------
def save(path, params, opt_state=None, step=0) -> None:
    """Write ``params``, ``opt_state`` and ``step`` to the directory ``path``, atomically (see
    the module's docstring). Under MPI every rank calls it; it returns once the checkpoint is in
    place (or raises on every rank if any rank failed, leaving the previous checkpoint)."""
    group = _Group()
    _write_all(os.path.abspath(os.fspath(path)),
               _prepare(params, opt_state, step, group.rank), group)


def _prepare(params, opt_state, step, rank, copy=False):
    """What a save writes, decided now: (trees, entries, [(file, array)], step). Pending
    reductions are taken here (a collective: every rank); ``copy``: the arrays copied, so the
    caller may change its own at once (an asynchronous save)."""
    step = _as_step(step)
    trees, leaves = _flatten_trees(params, opt_state)
    entries, writes = _plan(leaves, rank)
    if copy:
        writes = [(f, np.array(a, copy=True)) for f, a in writes]
    return trees, entries, writes, step


def _write_all(path, prepared, group):
    """The save's files, written by every rank of ``group`` and committed by rank 0."""
    trees, entries, writes, step = prepared

    # rank 0 makes the blocks directory; every rank learns its name, or that rank 0 failed
    blocks, created, failure = None, False, None
    if group.rank == 0:
        try:
            blocks, created = _begin(path)
        except Exception as e:
            failure = e
    got = group.bcast(("error", _say(failure)) if failure is not None else ("ok", blocks))
    if failure is not None:
        raise failure
    if got[0] == "error":
        raise CheckpointError(f"saving {path}: rank 0 could not start: {got[1]}")
    blocks = got[1]

    # every rank writes its blocks, then reports what it wrote (or its error) to rank 0
    written, failure = {}, None
    try:
        for fname, arr in writes:
            written[fname] = _write_npy(os.path.join(path, blocks, fname), arr)
    except BaseException as e:          # Ctrl-C too: rank 0 removes the blocks directory
        failure = e
    reports = group.gather((group.rank, written, None if failure is None else _say(failure)))

    if group.rank == 0:
        try:
            bad = [(r, msg) for r, _, msg in reports if msg]
            if failure is not None:
                raise failure
            if bad:
                raise CheckpointError(f"saving {path}: rank {bad[0][0]} could not write its "
                                      f"blocks: {bad[0][1]}")
            files = {f: meta for _, w, _ in reports for f, meta in w.items()}
            _commit(path, blocks, _manifest(trees, entries, files, step, blocks))
            outcome = None
        except BaseException as e:
            _abandon(path, blocks, created)
            outcome = e
        group.bcast(None if outcome is None else _say(outcome))
        if outcome is not None:
            raise outcome
    else:
        msg = group.bcast(None)
        if failure is not None:
            raise failure
        if msg:
            raise CheckpointError(f"saving {path} failed on rank 0: {msg}")


def _as_step(step) -> int:
    s = np.asarray(step)
    if s.shape != () or s.dtype.kind not in "iu":
        raise ArgumentError("a checkpoint's step must be an integer", received=repr(step))
    return int(s)


class _Group:
    """The processes saving together: the MPI world under mpiexec (every rank in ``save``),
    else this process alone (virtual devices: it holds every block). ``own``: a communicator
    of the checkpoints' own (a duplicate of the world's, made once), so that a save written
    in the background never meets the program's collectives."""
    _own = None

    def __init__(self, own: bool = False):
        from .dist.engine import MPIEngine, under_mpi
        self.comm = None
        if under_mpi():
            world = MPIEngine.world()
            if world.size > 1:
                if own and _Group._own is None:
                    _Group._own = world.comm.Dup()      # (collective: every rank, in order)
                self.comm = _Group._own if own else world.comm
        self.rank = self.comm.Get_rank() if self.comm is not None else 0

    def bcast(self, obj):
        return obj if self.comm is None else self.comm.bcast(obj, root=0)

    def gather(self, obj) -> list:
        return [obj] if self.comm is None else self.comm.gather(obj, root=0)


def _say(e) -> str:
    return f"{type(e).__name__}: {e}"


def _flatten_trees(params, opt_state):
    """({"params": encoded tree, "opt_state": ...}, [(leaf path, leaf)] in order)."""
    trees, leaves = {}, []
    for name, tree in (("params", params), ("opt_state", opt_state)):
        flat, treedef = flatten(tree)
        trees[name] = _encode_tree(treedef, name)
        for path, x in zip(treedef.path_names(), flat):
            leaves.append((f"{name}/{path}" if path else name, x))
    return trees, leaves


def _encode_tree(td, where):
    """A TreeDef as JSON: "*" a leaf, null None, {"dict": [[key, sub], ...]} (keys keep their
    order and type), {"list": [...]}, {"tuple": [...]}, {"namedtuple": "mod:Name", ...}."""
    if td.kind == "leaf":
        return "*"
    if td.kind == "none":
        return None
    kids = [_encode_tree(c, where) for c in td.children]
    if td.kind == "dict":
        for k in td.meta:
            if not (k is None or isinstance(k, (str, int, float))):
                raise ArgumentError(f"{where}: a dict key {k!r} cannot be saved",
                                    expected="str, int, float, bool or None keys")
        return {"dict": [[k, c] for k, c in zip(td.meta, kids)]}
    if td.kind == "namedtuple":
        return {"namedtuple": f"{td.meta.__module__}:{td.meta.__qualname__}", "items": kids}
    return {td.kind: kids}


def _storage(npd: np.dtype) -> np.dtype:
    """What a dtype is written as: itself, or (bfloat16, fp8: not .npy dtypes) its bits."""
    return np.dtype(f"uint{8 * npd.itemsize}") if npd.kind == "V" else npd


def _dtype_name(npd: np.dtype, where: str) -> str:
    try:
        return dt.from_numpy(npd).name
    except TesseraError:
        if npd.kind in "biufc":              # NumPy's own (uint8 ...): their NumPy name
            return npd.name
        raise ArgumentError(f"{where}: an array of dtype {npd} cannot be saved") from None


def _plan(leaves, rank):
    """(each leaf's manifest entry without file sizes, [(file name, array)] this rank writes)."""
    from .dist.tensor import DTensor
    entries, writes = [], []
    for i, (where, x) in enumerate(leaves):
        if isinstance(x, DTensor):
            entry, mine = _plan_dtensor(i, where, x)
            writes += mine
        elif isinstance(x, (np.ndarray, np.generic)):
            a = np.asarray(x)
            if not a.dtype.isnative:
                a = a.astype(a.dtype.newbyteorder("="))
            fname = f"{i:05d}.npy"
            entry = {"kind": "array", "shape": list(a.shape),
                     "dtype": _dtype_name(a.dtype, where), "storage": _storage(a.dtype).name,
                     "scalar": isinstance(x, np.generic), "file": fname}
            if rank == 0:
                writes.append((fname, a))
        elif isinstance(x, complex):
            entry = {"kind": "complex", "value": [x.real, x.imag]}
        elif isinstance(x, (bool, int, float, str)):
            entry = {"kind": "value", "value": x}
        else:
            raise ArgumentError(f"{where}: a leaf of type {type(x).__name__} cannot be saved in "
                                "a checkpoint",
                                expected="NumPy arrays, Python numbers, strings or DTensors",
                                hint="np.asarray(x) first if it is an array of another library")
        entries.append({"path": where, **entry})
    return entries, writes


def _plan_dtensor(i, where, x):
    from .dist.collectives import redistribute
    from .dist.layout import Layout
    if x.layout.partial:                # taken first, as dist.gather does
        x = redistribute(x, Layout(x.layout.dims))
    mesh = x.mesh
    first = {}                          # block slices -> the lowest rank holding them
    for r in range(mesh.size):
        sl = x.layout.block(x.shape, mesh, r)
        first.setdefault(tuple((s.start, s.stop) for s in sl), r)
    want = x.layout.local_shape(x.shape, mesh)
    blocks, writes = [], []
    for k, (sl, r) in enumerate(first.items()):
        fname = f"{i:05d}.{k:04d}.npy"
        blocks.append({"file": fname, "slices": [list(s) for s in sl], "rank": r})
        if r in x.blocks:
            b = np.asarray(x.blocks[r])
            if b.shape != want or b.dtype != x.dtype:      # a broken DTensor: never save it
                raise ShardingError(f"{where}: rank {r}'s block is {b.dtype}{list(b.shape)}, "
                                    f"its layout {x.layout} gives {x.dtype}{list(want)}")
            writes.append((fname, b))
    entry = {"kind": "dtensor", "shape": list(x.shape),
             "dtype": _dtype_name(x.dtype, where), "storage": _storage(x.dtype).name,
             "layout": {"dims": [list(a) for a in x.layout.dims]},
             "mesh": {"axes": list(mesh.axis_names),
                      "shape": [mesh.shape[a] for a in mesh.axis_names]},
             "blocks": blocks}
    return entry, writes


def _begin(path):
    """Rank 0: ``path`` made if new, and a new, empty blocks directory in it."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ArgumentError(f"{path} exists and is not a directory: a checkpoint is one")
    created = not os.path.exists(path)
    if created:
        os.makedirs(path)
        _fsync_dir(os.path.dirname(path))
    name = _BLOCKS + uuid.uuid4().hex[:16]
    os.mkdir(os.path.join(path, name))
    return name, created


def _write_file(path, data: bytes):
    with open(path, "xb") as f:         # "x": a name is never written twice
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_npy(path, arr) -> dict:
    storage = _storage(arr.dtype)
    a = arr.view(storage) if storage != arr.dtype else arr
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    data = buf.getvalue()
    _write_file(path, data)
    return {"bytes": len(data), "crc32": zlib.crc32(data)}


def _fsync_dir(path):
    if os.name == "nt":                 # Windows cannot open a directory to fsync it
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest(trees, entries, files, step, blocks) -> dict:
    for e in entries:                   # each file's size and CRC, as its writer reported
        holders = e["blocks"] if e["kind"] == "dtensor" else [e] if e["kind"] == "array" else []
        for b in holders:
            if b["file"] not in files:
                raise CheckpointError(f"no rank wrote {b['file']} ({e['path']})")
            b.update(files[b["file"]])
    return {"format": FORMAT, "version": VERSION, "step": step, "blocks": blocks,
            "params": trees["params"], "opt_state": trees["opt_state"], "leaves": entries}


def _commit(path, blocks, manifest):
    """Rank 0, every block written: the manifest renamed into place, then the old blocks gone."""
    _fsync_dir(os.path.join(path, blocks))        # the block files' names are durable first
    tmp = os.path.join(path, f"{_TMP_MANIFEST}{uuid.uuid4().hex[:16]}.tmp")
    _write_file(tmp, json.dumps(manifest, indent=1).encode())
    os.replace(tmp, os.path.join(path, MANIFEST))     # the commit point
    _fsync_dir(path)
    for name in os.listdir(path):       # older checkpoints and crashed saves' leftovers
        if name.startswith(_BLOCKS) and name != blocks:
            shutil.rmtree(os.path.join(path, name), ignore_errors=True)
        elif name.startswith(_TMP_MANIFEST) and name.endswith(".tmp"):
            _remove(os.path.join(path, name))


def _abandon(path, blocks, created):
    """A failed save's blocks removed (never the ones the manifest names), and ``path`` too if
    this save made it and it is empty again."""
    if blocks is None:
        return
    if _named_blocks(path) != blocks:
        shutil.rmtree(os.path.join(path, blocks), ignore_errors=True)
    for name in os.listdir(path) if os.path.isdir(path) else []:
        if name.startswith(_TMP_MANIFEST) and name.endswith(".tmp"):
            _remove(os.path.join(path, name))
    if created:
        try:
            os.rmdir(path)
        except OSError:
            pass


def _named_blocks(path):
    try:
        with open(os.path.join(path, MANIFEST), "rb") as f:
            return json.loads(f.read()).get("blocks")
    except Exception:
        return None


def _remove(p):
    try:
        os.remove(p)
    except OSError:
        pass


# ---- saving in the background ------------------------------------------------------------------
class PendingSave:
    """A checkpoint being written by a background thread: ``wait()`` returns once it is in
    place, raising what the save raised; ``done()`` says whether it has finished."""

    def __init__(self, path, prepared, group):
        self.path, self._error = path, None
        self._thread = threading.Thread(target=self._run, args=(prepared, group),
                                        name=f"tessera-checkpoint:{os.path.basename(path)}",
                                        daemon=False)
        self._thread.start()

    def _run(self, prepared, group):
        try:
            _write_all(self.path, prepared, group)
        except BaseException as e:      # (raised to the caller by wait)
            self._error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self):
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


_pending: list = []                     # this process's saves not yet waited for, in order


def save_async(path, params, opt_state=None, step=0) -> PendingSave:
    """``save`` without blocking the caller (the seeds' ``tessera.checkpoint.save_async``):
    the values are taken now (arrays copied, a DTensor's pending sum reduced: under MPI every
    rank calls it, in the same order), then a background thread writes and commits them,
    atomically as ``save`` does, while the caller goes on. One save is written at a time per
    process: this call first waits for the previous one (and raises its error, if it failed).
    ``wait()`` (or ``checkpoint.wait()``) blocks until it is in place."""
    wait()
    group = _Group(own=True)
    prepared = _prepare(params, opt_state, step, group.rank, copy=True)
    pending = PendingSave(os.path.abspath(os.fspath(path)), prepared, group)
    _pending.append(pending)
    return pending


def wait():
    """Wait for this process's background saves; raise the first one's error."""
    while _pending:
        _pending.pop(0).wait()


# ---- a training loop that checkpoints itself ---------------------------------------------------
class Checkpointed:
    """``@ts.checkpoint(interval=N, path=...)`` on a step function ``step(state, i) -> state``
    (the seeds decorate a whole training function; the decorator must see the loop's state, so
    in Python it decorates the step and runs the loop): ``loop(state, steps)`` runs steps
    ``0 .. steps-1`` from ``state``, or from the latest checkpoint in ``path`` when there is one
    (a restarted job goes on where the last complete checkpoint left it), saving ``state``
    every ``interval`` steps in the background (`save_async`: the next steps do not wait for
    the disk). ``state`` is a pytree of arrays, numbers or DTensors; a step whose result
    depends only on ``(state, i)`` (its data and randomness drawn from ``i``) gives the same
    bits resumed as uninterrupted.

    A `DeviceError` in a step, or `recover_and_continue()` called in one, rolls the loop back
    to its last checkpoint (the state it started from when there is none yet) and goes on from
    there, up to ``max_restarts`` times (`fault_tolerant` sets it; 3 by default); then the
    error is raised."""

    def __init__(self, step, path, interval: int):
        if int(interval) < 1:
            raise ArgumentError("a checkpoint interval is a number of steps, at least 1",
                                received=repr(interval))
        self.step, self.path, self.interval = step, os.path.abspath(os.fspath(path)), \
            int(interval)
        self.restarts = 0                   # roll-backs in the latest run
        functools.update_wrapper(self, step)

    @property
    def max_restarts(self) -> int:
        return getattr(self.step, "max_restarts", DEFAULT_MAX_RESTARTS)

    def resume(self, state):
        """(state, first step): the latest checkpoint's, or the given state's at step 0."""
        wait()
        if latest_step(self.path) is None:
            return state, 0
        saved, _, step = load(self.path)
        return saved, step

    def __call__(self, state, steps: int):
        initial = state
        state, i = self.resume(initial)
        self.restarts = 0
        _running.append(self)
        try:
            while i < steps:
                try:
                    state = self.step(state, i)
                except (DeviceError, RollBack) as e:
                    if self.restarts >= self.max_restarts:
                        wait()
                        raise getattr(e, "error", None) or e
                    self.restarts += 1
                    state, i = self.resume(initial)
                    continue
                i += 1
                if i % self.interval == 0 and i < steps:
                    save_async(self.path, state, step=i)
        finally:
            _running.pop()
        wait()
        return state


DEFAULT_MAX_RESTARTS = 3
_running: list = []                     # the checkpointed loops running, innermost last


class RollBack(TesseraError):
    """Raised by `recover_and_continue()`: the checkpointed loop running the step rolls back to
    its last checkpoint. Outside one it reaches the caller, saying so."""

    def __init__(self, error=None):
        super().__init__("recover_and_continue() rolls a ts.checkpoint loop back to its last "
                         "checkpoint; none is running here",
                         hint="call it in the step function of a @ts.checkpoint(interval=...) "
                              "loop")
        self.error = error


def checkpointed(interval: int = 1000, path=None):
    """The decorator ``@ts.checkpoint(interval=..., path=...)`` (see `Checkpointed`); ``path``
    defaults to ``checkpoints/<the step function's name>``."""
    def wrap(step):
        return Checkpointed(step, path or os.path.join("checkpoints", step.__name__), interval)
    return wrap


# ---- loading ------------------------------------------------------------------------------------
def latest_step(path):
    """The step of the checkpoint at ``path``; None if there is none (no manifest)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(os.path.join(path, MANIFEST)):
        return None
    return _read_manifest(path)["step"]


def load(path, mesh=None, layouts=None):
    """``(params, opt_state, step)`` from the checkpoint at ``path``.

    DTensor leaves come back as DTensors on ``mesh`` (default: a new mesh of the saved axes and
    sizes; under MPI it needs as many ranks), in their saved layout unless ``layouts`` says:

    - a dict from a leaf's path to a `dist.ShardSpec`, a `dist.Layout` or None (replicated);
      paths are the tree's keys joined by "/" under "params" or "opt_state":
      ``{"params/w": ShardSpec(("row",), ("dp",)), "opt_state/m/w": ...}``; a path not listed
      keeps its saved layout, a path that names no DTensor leaf is an ArgumentError;
    - or a function ``(path, shape, saved_layout) -> ShardSpec | Layout | None``, asked for
      every DTensor leaf (return ``saved_layout`` to keep it).

    Each rank reads the saved block files overlapping its new block, whole (this version does
    not read parts of a file), after checking each file's size and CRC-32 against the manifest.
    NumPy arrays, NumPy scalars and Python values come back as they were saved."""
    path = os.path.abspath(os.fspath(path))
    man = _read_manifest(path)
    data = os.path.join(path, man["blocks"])
    dtensors = {e["path"] for e in man["leaves"] if e["kind"] == "dtensor"}
    if isinstance(layouts, dict):
        unknown = sorted(set(layouts) - dtensors)
        if unknown:
            raise ArgumentError(f"layouts names {unknown}, which are no DTensor leaves of "
                                f"{path}", expected=f"some of {sorted(dtensors)}")
    elif layouts is not None and not callable(layouts):
        raise ArgumentError("layouts must be a dict from leaf path to ShardSpec, or a function",
                            received=repr(layouts))
    meshes: dict = {}
    values = []
    for e in man["leaves"]:
        try:
            values.append(_restore(path, data, e, mesh, layouts, meshes))
        except (KeyError, TypeError, ValueError) as err:     # a manifest not as we write them
            raise CheckpointError(f"{path}: the manifest's entry for {e.get('path')!r} is "
                                  f"damaged ({type(err).__name__}: {err})") from None
    it = iter(values)
    try:
        params = _decode_tree(man["params"], it)
        opt_state = _decode_tree(man["opt_state"], it)
        if next(it, it) is not it:
            raise ValueError("more leaves than the trees hold")
    except (KeyError, TypeError, ValueError, StopIteration) as err:
        raise CheckpointError(f"{path}: the manifest's trees are damaged ({err})") from None
    return params, opt_state, man["step"]


def _read_manifest(path) -> dict:
    where = os.path.join(path, MANIFEST)
    try:
        with open(where, "rb") as f:
            man = json.loads(f.read())
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}: {MANIFEST} is missing",
                              hint="checkpoint.save writes it last; latest_step(path) is None "
                                   "where there is none") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"the checkpoint at {path} has a damaged {MANIFEST} "
                              f"({type(e).__name__}: {e})") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not a tessera checkpoint's manifest")
    if man.get("version") != VERSION:
        raise CheckpointError(f"{where} has format version {man.get('version')!r}",
                              expected=f"version {VERSION}")
    if not all(k in man for k in ("step", "blocks", "params", "opt_state", "leaves")):
        raise CheckpointError(f"the checkpoint at {path} has a damaged {MANIFEST} (keys missing)")
    return man


def _decode_tree(enc, it):
    if enc == "*":
        return next(it)
    if enc is None:
        return None
    if "namedtuple" in enc:
        return _import(enc["namedtuple"])(*[_decode_tree(sub, it) for sub in enc["items"]])
    (kind, body), = enc.items()
    if kind == "dict":
        return {k: _decode_tree(sub, it) for k, sub in body}
    if kind == "list":
        return [_decode_tree(sub, it) for sub in body]
    if kind == "tuple":
        return tuple(_decode_tree(sub, it) for sub in body)
    raise ValueError(f"unknown tree node {kind!r}")


def _import(name):
    module, _, qual = name.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise CheckpointError(f"the checkpoint holds a namedtuple {name} that cannot be "
                              "imported here") from None
    # only a namedtuple class is ever called: a manifest naming anything else is refused
    if not (isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")):
        raise CheckpointError(f"the checkpoint names {name} as a namedtuple, and it is not one")
    return obj


def _np_dtype(name) -> np.dtype:
    try:
        return dt.get(name).np
    except TesseraError:
        return np.dtype(name)           # NumPy's own (uint8 ...), as _dtype_name wrote it


def _restore(path, data, e, mesh, layouts, meshes):
    kind = e["kind"]
    if kind == "value":
        return e["value"]
    if kind == "complex":
        return complex(*e["value"])
    if kind == "array":
        a = _read_npy(path, data, e, e, tuple(e["shape"]), np.dtype(e["storage"]))
        a = a.view(_np_dtype(e["dtype"]))
        return a[()] if e["scalar"] else a
    if kind == "dtensor":
        return _restore_dtensor(path, data, e, mesh, layouts, meshes)
    raise ValueError(f"unknown leaf kind {kind!r}")


def _restore_dtensor(path, data, e, mesh, layouts, meshes):
    from .dist.layout import Layout, Mesh, ShardSpec
    from .dist.tensor import DTensor
    where, shape = e["path"], tuple(e["shape"])
    dtype, storage = _np_dtype(e["dtype"]), np.dtype(e["storage"])
    saved_mesh = tuple(zip(e["mesh"]["axes"], e["mesh"]["shape"]))
    if mesh is None:                    # one mesh per saved shape, shared by its leaves
        if saved_mesh not in meshes:
            meshes[saved_mesh] = Mesh(axes=dict(saved_mesh))
        target = meshes[saved_mesh]
    else:
        target = mesh
    total = 0                           # the saved blocks must tile the tensor
    for b in e["blocks"]:
        if len(b["slices"]) != len(shape) or \
                not all(0 <= lo <= hi <= n for (lo, hi), n in zip(b["slices"], shape)):
            raise CheckpointError(f"{path}: block {b['file']} of {where} lies outside its "
                                  f"shape {list(shape)}; the manifest is damaged")
        total += math.prod(hi - lo for lo, hi in b["slices"])
    if total != math.prod(shape):
        raise CheckpointError(f"{path}: the blocks of {where} hold {total} elements, its shape "
                              f"{list(shape)} {math.prod(shape)}; the manifest is damaged")
    saved = Layout(tuple(tuple(a) for a in e["layout"]["dims"]))
    if isinstance(layouts, dict):
        spec = layouts.get(where, saved)
    elif layouts is not None:
        try:
            spec = layouts(where, shape, saved)
        except Exception as err:        # the caller's function: not a damaged manifest
            raise ArgumentError(f"loading {path}: layouts({where!r}, ...) raised "
                                f"{type(err).__name__}: {err}") from err
    else:
        spec = saved
    try:
        if spec is None:
            lay = Layout.replicated(len(shape))
        elif isinstance(spec, ShardSpec):
            lay = spec.layout(shape, target, where)
        elif isinstance(spec, Layout):
            spec.check(shape, target, where)
            lay = spec
        else:
            raise ShardingError(f"{where}: layouts gave {spec!r}",
                                expected="a dist.ShardSpec, a dist.Layout or None")
    except ShardingError as err:
        raise ShardingError(f"loading {path}: {err.summary} ({where} was saved as "
                            f"{saved.type_str(shape, dt.from_numpy(dtype).short)} on mesh "
                            f"{dict(saved_mesh)})", expected=err.expected,
                            hint="layouts={path: dist.ShardSpec(...)} gives it another layout "
                                 "on this mesh") from None
    if lay.partial:
        raise ShardingError(f"loading {path}: {where} cannot be loaded as a pending reduction")
    cache: dict = {}                    # file -> array, read once for all this process' ranks
    blocks = {r: _assemble(path, data, e, lay.block(shape, target, r), storage, cache).view(dtype)
              for r in target.engine.ranks}
    return DTensor(target, shape, dtype, lay, blocks)


def _assemble(path, data, e, want, storage, cache):
    """The block at slices ``want`` of the global tensor, from the saved blocks overlapping it."""
    out = np.empty(tuple(s.stop - s.start for s in want), storage)
    filled = 0
    for b in e["blocks"]:
        have = [slice(lo, hi) for lo, hi in b["slices"]]
        cut = [(max(w.start, h.start), min(w.stop, h.stop)) for w, h in zip(want, have)]
        if any(lo >= hi for lo, hi in cut):
            continue
        if b["file"] not in cache:
            cache[b["file"]] = _read_npy(path, data, e, b, tuple(h.stop - h.start for h in have),
                                         storage)
        src = cache[b["file"]]
        out[tuple(slice(lo - w.start, hi - w.start) for (lo, hi), w in zip(cut, want))] = \
            src[tuple(slice(lo - h.start, hi - h.start) for (lo, hi), h in zip(cut, have))]
        filled += math.prod(hi - lo for lo, hi in cut)
    if filled != out.size:              # blocks that do not tile the tensor: never np.empty's
        raise CheckpointError(f"{path}: the blocks of {e['path']} cover {filled} of the "
                              f"{out.size} elements of a block; the manifest is damaged")
    return out


def _read_npy(path, data, e, b, shape, storage) -> np.ndarray:
    """A block file, checked against the manifest: size, CRC-32, shape and dtype."""
    fname = os.path.join(data, b["file"])
    try:
        with open(fname, "rb") as f:
            raw = bytearray(f.read())   # writable: the arrays made from it are too
    except FileNotFoundError:
        raise CheckpointError(f"{path}: the block file {b['file']} of {e['path']} is "
                              "missing") from None
    if len(raw) != b["bytes"] or zlib.crc32(raw) != b["crc32"]:
        raise CheckpointError(f"{path}: the block file {b['file']} of {e['path']} is damaged "
                              f"({len(raw)} bytes, CRC {zlib.crc32(raw):08x})",
                              expected=f"{b['bytes']} bytes, CRC {b['crc32']:08x}")
    try:
        fp = io.BytesIO(raw)
        version = np.lib.format.read_magic(fp)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}[version]
        fshape, fortran, fdtype = read(fp)
        if fshape != shape or fdtype != storage:
            raise ValueError(f"it holds {fdtype}{list(fshape)}, the manifest says "
                             f"{storage}{list(shape)}")
        arr = np.frombuffer(raw, storage, math.prod(shape), fp.tell())
        return arr.reshape(shape, order="F" if fortran else "C")
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"{path}: the block file {b['file']} of {e['path']} is not the "
                              f"array the manifest names: {err}") from None


class _CallableModule(types.ModuleType):
    """``ts.checkpoint`` is this module (save, load, save_async, ...) and, called, the seeds'
    decorator ``@ts.checkpoint(interval=...)``: Python lets a module be callable through its
    class."""

    def __call__(self, interval: int = 1000, path=None):
        return checkpointed(interval, path)

    def __reduce__(self):               # pickled (by cloudpickle: dist.launch) as a module
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _CallableModule
