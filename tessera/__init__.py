"""Tessera: a notebook-first deep-learning compiler. The public surface; no logic lives here."""
from .version import __version__  # noqa: F401

from . import dtypes, errors, op  # noqa: E402
from . import graph  # noqa: E402
from .dtypes import (bfloat16, bool_, float8_e4m3fn, float8_e5m2, float16, float32,  # noqa: E402
                     float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64)
from .dtypes import (bf16, f16, f32, f64, fp8, fp8_e4m3, fp8_e5m2, i8, i16, i32, i64,  # noqa: E402
                     u8, u16, u32, u64)  # (the seeds' short names)
from .numerics import NumericalPolicy, policy  # noqa: E402
from .errors import (AnnotationError, ArgumentError, BackendUnavailableError, CompileError,  # noqa: E402
                     CompilerNotFoundError, DeviceError, DifferentiationError, DTypeError,
                     GradientCheckError, IRVerificationError, RankError, ResourceError,
                     RankFailure, RuntimeFault, ShapeError, ShardingError,
                     SymbolicValueError, SymbolMismatchError,
                     TesseraError, TracingError, UnsupportedDTypeError)
from .function import Function, function, interpret  # noqa: E402
from . import nn, optim, pytree  # noqa: E402
from .autodiff import check_grad, grad, jvp, laplacian, value_and_grad, vjp  # noqa: E402
# the package tessera.kernel first, so that the name ts.kernel ends as the decorator below
from . import tile  # noqa: E402
from .tiles import Tile  # noqa: E402
from .autotune import autotune, kernel  # noqa: E402
from .runtime import cache_stats, reset_cache_stats  # noqa: E402
from .runtime.profiler import machine_peaks, profiler  # noqa: E402
from .compiler.target.c import gemm_shape_report  # noqa: E402
from .schedule import Schedule  # noqa: E402
from .types import Tensor, TensorType  # noqa: E402
from .trace import is_training, static_range, training  # noqa: E402
from .control import cond, fori_loop, scan, while_loop  # noqa: E402
from . import debug  # noqa: E402
from .debug import NumericalError, analyze_performance, debug_mode, profile_memory  # noqa: E402
from .nn.precision import to_mixed_precision  # noqa: E402
from .interop import from_dlpack, to_torch  # noqa: E402
from .aten import from_torch  # noqa: E402
from .jaxpr import from_jax  # noqa: E402
from . import migrate  # noqa: E402
from . import onnx  # noqa: E402
from . import models  # noqa: E402
from . import prob  # noqa: E402
from . import checkpoint, collectives, dist  # noqa: E402
from .fault import fault_tolerant, recover_and_continue  # noqa: E402
from .prob import elbo, mcmc, probabilistic, variational  # noqa: E402
from .compiler.load import load  # noqa: E402
# the renderers register the built-in targets (cpu, cuda, hip: runtime/targets.py) as they load
from .compiler import target as _renderers  # noqa: E402,F401



def load_ipython_extension(ipython):
    """`%load_ext tessera`: the %%tessera magic (tessera.lab; imported only here)."""
    from .lab import load_ipython_extension as load
    load(ipython)


def unload_ipython_extension(ipython):
    """`%unload_ext tessera`: Tessera's objects display as plain text again."""
    from .lab import unload_ipython_extension as unload
    unload(ipython)


__all__ = [
    "op", "graph", "function", "Function", "interpret", "static_range", "is_training", "training",
    "dist", "collectives", "checkpoint", "fault_tolerant", "recover_and_continue", "DeviceError",
    "fori_loop", "while_loop", "scan", "cond", "Schedule", "Tensor", "TensorType", "dtypes",
    "grad", "value_and_grad", "vjp", "jvp", "laplacian", "check_grad", "pytree", "nn", "optim",
    "DifferentiationError", "GradientCheckError",
    "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", "bool_",
    "float8_e4m3fn", "float8_e5m2", "f16", "bf16", "f32", "f64", "fp8", "fp8_e4m3", "fp8_e5m2",
    "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
    "NumericalPolicy", "policy", "to_mixed_precision", "from_dlpack", "to_torch", "from_torch",
    "from_jax", "migrate", "onnx", "prob", "mcmc", "probabilistic", "variational", "elbo", "load",
    "TesseraError", "ShapeError", "DTypeError", "UnsupportedDTypeError", "ArgumentError",
    "AnnotationError", "ShardingError", "RankFailure",
    "CompileError", "BackendUnavailableError", "CompilerNotFoundError", "IRVerificationError",
    "RuntimeFault", "SymbolicValueError", "RankError", "SymbolMismatchError", "TracingError", "ResourceError", "cache_stats", "reset_cache_stats", "errors", "profiler", "machine_peaks",
    "gemm_shape_report",
    "autotune", "kernel", "tile", "Tile", "debug", "debug_mode", "NumericalError",
    "profile_memory", "analyze_performance",
]
