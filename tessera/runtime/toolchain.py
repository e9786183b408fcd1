"""The system C compiler: found, fingerprinted, and run into the kernel cache."""
from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

from ..version import __version__
from ..errors import CompileError, CompilerNotFoundError, first_user_frame
from . import cache, isa

# DESIGN.md's numerics contract: never -ffast-math (it sets FTZ/DAZ for the whole process);
# no FMA contraction unless written explicitly.
# -fno-tree-slp-vectorize: gcc 12's straight-line vectorizer drops a float round trip
# ((double)(float)x becomes x in a short unrolled loop); loops still vectorize, and the
# hand-vectorized routines use intrinsics, so no kernel measured slower without it.
# No -fno-trapping-math: with it gcc 12 folds (float)(int)x into a truncation that keeps the
# sign, so cast(cast(-0.5, int32), float32) gave -0.0 (NumPy: +0.0); gelu measured ~3% slower
# without it, the other kernels within noise.
# The ISA comes from the target's level (runtime/isa.py), never -march=native. These are gcc's
# spellings; flags() translates for clang and drops -fopenmp where the compiler has no OpenMP.
CFLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", "-ffp-contract=off",
          "-fno-tree-slp-vectorize", "-std=c11",
          "-Werror=implicit-function-declaration")   # a missing helper fails here, not at load
CLANG_SPELLING = {"-fno-tree-slp-vectorize": "-fno-slp-vectorize"}
COMPILE_TIMEOUT_S = 300


def find_compiler(name: str | None = None) -> str:
    """The path of the C compiler `name` (a target's own driver), else $CC's, else cc's."""
    name = name or os.environ.get("CC") or "cc"
    path = shutil.which(name)
    if path is None:
        raise CompilerNotFoundError(
            f"no C compiler: {name!r} is not on PATH",
            hint="install gcc (apt-get install gcc) or point $CC at a C compiler")
    return path


@functools.lru_cache(maxsize=None)
def compiler_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise CompilerNotFoundError(f"the C compiler {path} cannot be run: {e}") from None
    return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else path


def is_clang(cc: str) -> bool:
    return "clang" in compiler_version(cc).lower()


@functools.lru_cache(maxsize=None)
def has_openmp(cc: str) -> bool:
    """Whether `cc -fopenmp` builds a shared object (Apple's clang, and clang without libomp,
    cannot). Without it kernels run on one thread: the pragmas are ignored, the bits the same."""
    with tempfile.TemporaryDirectory(prefix="tessera-omp-") as d:
        src = Path(d) / "omp.c"
        src.write_text("#include <omp.h>\nint tessera_omp_probe(void) "
                       "{ return omp_get_max_threads(); }\n")
        try:
            r = subprocess.run([cc, "-fopenmp", "-fPIC", "-shared", "-o", str(Path(d) / "omp.so"),
                                str(src)], capture_output=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0


def flags(cc: str, level: str) -> tuple[str, ...]:
    """The command-line flags for compiling a program for ISA `level` with the compiler `cc`."""
    out = list(isa.march_flags(level))
    clang = is_clang(cc)
    for f in CFLAGS:
        if f == "-fopenmp" and not has_openmp(cc):
            _warn_once(f"no-openmp:{cc}", f"tessera: {cc} has no OpenMP (-fopenmp fails), so "
                       "CPU kernels run on one thread; install libomp (clang) or gcc for all "
                       "cores. Results are the same bits either way.")
            continue
        out.append(CLANG_SPELLING.get(f, f) if clang else f)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def cpu_fingerprint() -> str:
    """The machine, the CPU model and its feature flags (what tuning and peaks depend on)."""
    parts = [platform.machine()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    parts.append(line.split(":", 1)[1].strip())
                if len(parts) >= 3:
                    break
    except OSError:
        parts.append(platform.processor())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def artifact_key(source: str, cc: str, level: str, link=()) -> str:
    h = hashlib.sha256()
    for part in (f"schema={cache.SCHEMA_VERSION}", f"tessera={__version__}", cc,
                 compiler_version(cc), f"isa={level}", " ".join(flags(cc, level)),
                 cpu_fingerprint(), " ".join(_link_name(p) for p in link), source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


ENTRY = "tessera_entry"         # the one symbol every generated program exports
_loaded: dict[str, ctypes.CDLL] = {}
_building: dict[str, threading.Lock] = {}
_building_guard = threading.Lock()
_warned: set[str] = set()


def build(source: str, name: str = "program", level: str | None = None,
          link=(), compiler: str | None = None) -> ctypes.CDLL:
    """Compile C source for ISA `level` (default: isa.default_level()) to a shared object (or
    take it from the cache) and load it. `link`: shared objects it is linked against (their
    absolute paths are recorded in it, so the loader maps them with it).

    `name` only labels messages: files are named by the content hash. `compiler`: the driver
    (find_compiler's default when None)."""
    cc = find_compiler(compiler)
    level = level or isa.default_level()
    key = artifact_key(source, cc, level, link)
    with _lock_for(key):            # threads asking for one program build it once
        if key not in _loaded:
            _loaded[key] = _build_unlocked(cc, source, name, key, flags(cc, level), tuple(link))[0]
        return _loaded[key]


def _lock_for(key: str) -> threading.Lock:
    with _building_guard:
        return _building.setdefault(key, threading.Lock())


_libraries: dict[str, Path] = {}


def build_library(source: str, name: str, level: str, compiler: str | None = None) -> Path:
    """A shared object that programs link against (the routine library): compiled once per
    source, compiler and ISA level (or taken from the cache), loaded, and its path returned.
    Without a usable cache it lives in a temporary directory until the process exits."""
    cc = find_compiler(compiler)
    key = artifact_key(source, cc, level)
    with _lock_for(key):    # (a cache directory removed since: programs must link to a real file)
        if key not in _libraries or not _libraries[key].exists():
            lib, path = _build_unlocked(cc, source, name, key, flags(cc, level), (), library=True)
            _loaded[key] = lib              # kept mapped: programs find it by its path
            _libraries[key] = path
        return _libraries[key]


def _build_unlocked(cc, source, name, key, cflags, link, library=False):
    """(the loaded object, its path)."""
    if cache.cache_enabled():
        kernels = cache.cache_dir() / "kernels"
        cache.sweep_stale_temporaries()
        try:
            so = kernels / key[:2] / f"{key}.so"
            return _load_or_build(cc, source, so, name, key, cflags, link, library), so
        except OSError as e:
            _warn_once(f"unwritable:{kernels}", f"tessera: the kernel cache {kernels} cannot be "
                       f"used ({e.strerror or e}); compiling into a temporary directory instead "
                       "(set TESSERA_CACHE_DIR to a writable place)")
    return _build_in_tempdir(cc, source, name, key, cflags, link, library)


def _build_in_tempdir(cc, source, name, key, cflags, link, library):
    tmpdir = Path(tempfile.mkdtemp(prefix="tessera-"))
    so = tmpdir / (f"{key}.so" if library else "program.so")    # (programs link it by name)
    _compile(cc, cflags, source, so, tmpdir / "program.c", name, link)  # on failure: kept
    lib = _open(so, entry=not library)
    if library:                     # programs built later link against it by this path
        atexit.register(shutil.rmtree, tmpdir, ignore_errors=True)
    else:
        shutil.rmtree(tmpdir, ignore_errors=True)  # the mapping outlives the files
    return lib, so


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_or_build(cc, source, so: Path, name: str, key: str, cflags, link=(),
                   library=False) -> ctypes.CDLL:
    """The cached shared object, checked against its recorded digest before it is mapped (a
    damaged file would crash the process inside dlopen); rebuilt when missing or damaged."""
    digest = so.with_suffix(".sha256")
    stale = False                   # True once the loader has seen a broken file at this path
    if so.exists():
        reason = None
        try:
            if not digest.exists() or digest.read_text().strip() != _digest(so):
                reason = "its digest does not match"
            else:
                lib = _open(so, entry=not library)
                cache.count("disk_hits")
                return lib
        except (OSError, AttributeError) as e:
            reason, stale = str(e), True
        _warn_once(f"corrupt:{key}", f"tessera: corrupt kernel cache entry {so} ({reason}); "
                   "rebuilding it")
        cache.count("rebuilt_corrupt")
        so.unlink(missing_ok=True)
    so.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=so.parent, prefix=".tmp-", suffix=".so")
    os.close(fd)
    try:
        _compile(cc, cflags, source, Path(tmp), so.with_suffix(".c"), name, link)
        os.replace(tmp, so)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    cache.atomic_write(digest, _digest(so).encode())
    if stale:
        # The dynamic loader knows the broken file by this path and would hand back its handle:
        # load the rebuilt one through a link of another name.
        alias = so.with_name(f".{so.stem}.{os.getpid()}.so")
        os.link(so, alias)
        try:
            return _open(alias, entry=not library)
        finally:
            alias.unlink()
    return _open(so, entry=not library)


# After a parallel region libgomp's workers spin GOMP_SPINCOUNT times, then sleep; waking a
# sleeping one costs up to a scheduler tick on a VM (4 ms measured on the 2-core EPYC), so with
# the default (300k spins, about 8 ms) a 1 ms kernel called every 20-200 ms took 2-7 ms on two
# threads, slower than on one. 3M spins (about 80 ms of one core after a call) keep the team
# awake between the calls of a loop: 0.9 ms. A user's own setting wins; libgomp reads it when
# it is first loaded, which is here unless another library loaded it before.
SPINCOUNT = "3000000"


def _openmp_defaults():
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SPINCOUNT


def _open(so: Path, entry: bool = True) -> ctypes.CDLL:
    """Load a shared object and type its entry point (AttributeError if it has none)."""
    _openmp_defaults()
    lib = ctypes.CDLL(str(so))
    if not entry:
        return lib
    entry = getattr(lib, ENTRY)
    entry.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    entry.restype = ctypes.c_int
    timed = getattr(lib, ENTRY + "_timed")
    timed.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_double)]
    timed.restype = ctypes.c_int
    return lib


def _warn_once(key: str, message: str):
    if key in _warned:
        return
    _warned.add(key)
    _, depth = first_user_frame()       # the warning points at the user's line
    warnings.warn(message, RuntimeWarning, stacklevel=depth + 1)


RELATIVE_LINKS = sys.platform.startswith("linux")


def _link_name(lib) -> str:
    """How a linked library enters a program's key: on Linux its file name (a routine
    library's content hash: the program finds it relative to itself, so a moved cache keeps
    its programs), elsewhere its path (recorded in the program as it is)."""
    return Path(lib).name if RELATIVE_LINKS else str(lib)


def _link_args(link, out: Path) -> list:
    """The linker's arguments for the libraries a program calls: on Linux by name, found at
    run time through a search path relative to the program ($ORIGIN)."""
    if not RELATIVE_LINKS:
        return [str(p) for p in link]
    args = []
    for p in map(Path, link):
        rel = os.path.relpath(p.parent, out.parent)
        args += [f"-L{p.parent}", f"-l:{p.name}", f"-Wl,-rpath,$ORIGIN/{rel}"]
    return args


def _compile(cc: str, cflags, source: str, out: Path, src_path: Path, name: str, link=()):
    cache.atomic_write(src_path, source.encode())
    cmd = [cc, *cflags, "-o", str(out), str(src_path), *_link_args(link, out), "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except FileNotFoundError:
        raise CompilerNotFoundError(f"the C compiler {cc} vanished") from None
    except subprocess.TimeoutExpired:
        raise CompileError(f"the C compiler took over {COMPILE_TIMEOUT_S}s on {name}",
                           hint=f"source: {src_path}") from None
    cache.count("compiles")
    if proc.returncode != 0:
        log = (proc.stderr or proc.stdout).strip()
        raise CompileError(f"the C compiler rejected the generated code for {name} "
                           f"(exit {proc.returncode})\n  source: {src_path}\n  command: "
                           f"{' '.join(cmd)}\n" + "\n".join("  | " + l for l in log.splitlines()[:40]))


# ---- standalone programs (saved files: tessera/compiler/saved.py) --------------------------------
def build_standalone(sources: dict, level: str) -> bytes:
    """One shared object of these C translation units ({file name: source}: a program and the
    routine libraries it calls), linked against nothing but libm and OpenMP, so it loads on a
    machine without the kernel cache or a compiler. Its bytes."""
    cc = find_compiler()
    with tempfile.TemporaryDirectory(prefix="tessera-save-") as d:
        paths = []
        for fname, text in sources.items():
            p = Path(d) / fname
            p.write_text(text)
            paths.append(str(p))
        out = Path(d) / "program.so"
        cmd = [cc, *flags(cc, level), "-o", str(out), *paths, "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CompileError(f"the C compiler took over {COMPILE_TIMEOUT_S}s on a saved "
                               "program") from None
        if proc.returncode != 0:
            raise CompileError("the C compiler rejected a saved program's sources\n"
                               + "\n".join("  | " + line for line in
                                           (proc.stderr or proc.stdout).splitlines()[:40]))
        cache.count("compiles")
        return out.read_bytes()


def load_standalone(data: bytes, digest: str) -> ctypes.CDLL:
    """Map a standalone shared object (its bytes, already checked against `digest`), from a
    private temporary file that is gone once mapped."""
    with tempfile.TemporaryDirectory(prefix="tessera-load-") as d:
        so = Path(d) / f"{digest[:16]}.so"
        so.write_bytes(data)
        return _open(so)
