"""The call's fast path: arrays whose types were seen before go straight to their program's
launcher, with no binding, annotation check or tracing (all done the first time): NumPy arrays
to a CPU program's executor, CuPy arrays to the GPU runtime. Each launcher
holds a program; a function keeps at most FAST_ENTRIES of them. Arguments that are pytrees of
such arrays (a training step's parameters and optimiser state) take it too, keyed by their
structure: their leaves are the program's parameters in order."""
from __future__ import annotations

import sys

import numpy as np

FAST_ENTRIES = 256


def array_signature(args):
    """The fast path's key: each argument's kind, dtype and shape, or None unless every argument
    is a plain C-contiguous NumPy or CuPy array or a NumPy scalar (np.float32(2.0): a 0-d
    tensor argument, as the binding takes it)."""
    key = []
    cupy = sys.modules.get("cupy")      # (never imported here: a CuPy array means it was)
    for a in args:
        kind = type(a)
        if isinstance(a, np.generic):
            key.append((kind, a.dtype, ()))
            continue
        if kind is not np.ndarray and not (cupy is not None and kind is cupy.ndarray):
            return None
        if not a.flags.c_contiguous:
            return None
        key.append((kind, a.dtype, a.shape))
    return tuple(key)


def tree_signature(args):
    """(leaves, key) of arguments that are plain dicts, lists and tuples of arrays (as
    array_signature takes them): the structure (dict keys in order) and the leaves' signature;
    None for anything else (a namedtuple, a Python number inside: the full path)."""
    leaves = []

    def shape_of(x):
        kind = type(x)
        if kind is dict:
            return (dict, tuple(x), tuple(shape_of(v) for v in x.values()))
        if kind is list or kind is tuple:
            return (kind, tuple(shape_of(v) for v in x))
        leaves.append(x)
        return None
    structure = tuple(shape_of(a) for a in args)
    key = array_signature(leaves)
    return None if key is None else (leaves, (structure, key))


def launcher(prog, args, arrays):
    """A callable running `prog` on such arguments and returning its results in their
    structure, or None when these arrays are not exactly what the program takes: positional,
    in parameter order, C-contiguous, native and of its dtypes (NumPy arrays for a CPU program)."""
    from ..compiler.program import GPUProgram, Program
    if not isinstance(prog, (Program, GPUProgram)) or prog.has_complex or \
            len(arrays) != len(args):   # (complex arrays go through run's views)
        return None
    scalars = [k for k, a in enumerate(args) if isinstance(a, np.generic)]
    for arr, a, p in zip(arrays.values(), args, prog.graph_ir.params):
        if isinstance(a, np.generic):       # the binding made it a 0-d array of its own dtype
            if arr.shape != () or arr.dtype != a.dtype:
                return None
        elif arr is not a:
            return None
        if a.dtype != p.type.dtype.np:
            return None
    if isinstance(prog, GPUProgram):
        if scalars:
            return None
        from ..runtime import gpu
        execute = lambda a: gpu.run(prog, a)                # noqa: E731
    elif prog._runs_here and all(type(a) is np.ndarray or isinstance(a, np.generic)
                                 for a in args):
        execute = prog._execute
        if scalars:
            def execute(a, run=prog._execute):
                a = list(a)
                for k in scalars:
                    a[k] = np.asarray(a[k])
                return run(a)
    else:
        return None
    tree, structure = prog.output_tree, prog.output_structure
    if tree is not None:
        return lambda a: tree.unflatten(execute(list(a)))
    if structure in (None, "single"):
        return lambda a: execute(list(a))[0]
    if structure == "tuple":
        return lambda a: tuple(execute(list(a)))
    return lambda a: list(execute(list(a)))
