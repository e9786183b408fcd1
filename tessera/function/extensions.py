"""What the modules above Function add to it, registered when they are imported (the package's
``__init__`` imports every one of them), so that function/ imports none of them:

- debug mode (tessera/debug.py): while a debug block is open in any thread, ``debug`` holds
  (active, checked_call): a call checks ``active()`` (this thread's checks) and, when on, runs
  through ``checked_call(fn, args, kwargs)``; None otherwise, so a call's cost is one read.
- export formats (tessera/onnx.py): ``exporters[format](fn, path, *example, **options)``.
- argument types that run calls themselves (tessera/dist/spmd.py: a sharded tensor's call is
  planned and run SPMD): ``callers[type(x)](fn, args, kwargs)``.
- other libraries' arrays (tessera/interop.py): ``as_array(x)`` reads an argument (PyTorch and
  JAX arrays through DLPack), ``convert_results(out, args)`` gives the results in the callers'
  array type.
"""
from __future__ import annotations

import numpy as np

debug = None                    # (active, checked_call) while a debug block is open
exporters: dict = {}            # format name -> export function
callers: dict = {}              # argument type -> call(fn, args, kwargs)
as_array = np.asarray           # an argument as the array a program takes
convert_results = None          # (results, the call's arguments) -> results; None: as they are


def register(**hooks):
    """Set hooks by name (``register(as_array=f)``); a name this module does not have is an
    error, so a misspelt one fails when its module is imported."""
    for name, value in hooks.items():
        if name not in ("debug", "as_array", "convert_results"):
            raise TypeError(f"Function has no extension point {name!r}")
        globals()[name] = value


def register_caller(cls: type, call):
    """A call of a tessera function with an argument of type `cls` (anywhere in its pytrees)
    runs as ``call(fn, args, kwargs)``."""
    callers[cls] = call


def register_exporter(format: str, export):
    """``Function.export(path, *example, format=format)`` calls ``export(fn, path, *example,
    **options)``."""
    exporters[format] = export
