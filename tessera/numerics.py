"""Numerical policies: how a computation accumulates, rounds and scales, beside its dtypes.

    ts.NumericalPolicy(accumulation=ts.float64)              # sums and products in float64
    ts.NumericalPolicy(rounding="stochastic", saturate=True)  # narrow results
    ts.NumericalPolicy(loss_scale=1024.0)                     # for ts.grad / value_and_grad

A policy applies to the operators traced under it: a region (``with ts.policy(...)``), a whole
function (``ts.function(f, policy=...)``), or the tensors that flow from a parameter annotated
with one (``Tensor["B", "D", ts.bfloat16, ts.NumericalPolicy(...)]``: the nearest valid Python
spelling of the seeds' ``bf16 @NumericalPolicy(...)``). The innermost region wins; a function's
policy is a region around its body; without either, an operator takes its operands' policy
(operands carrying two different ones are an error). The front end (tessera/trace.py) carries
a policy out as ordinary operators, so the Graph IR shows what it changed (nodes marked
``from policy(...)``) and the compile cache sees it:

- ``accumulation=float64``: an operator that accumulates (sums, means, norms, softmax, matmul,
  attention, cumulative sums) gets its float operands widened to float64 exactly and its result
  rounded once to the dtype it would have had. ``float32`` states the default for 16-bit, fp8
  and float32 operands (accumulated in float32 already); it is an error on a float64 operand,
  less precision than its storage. None (the default) leaves each operator's own.
- ``rounding="stochastic"``: an operator whose result is a narrow float (16-bit or fp8) computes
  in float32 and rounds to one of the two neighbours with probability proportional to nearness
  (unbiased), drawing from the counter-based generator keyed by (seed, the operator's place in
  the trace, the element): the same bits on every run.
- ``saturate=True``: a narrow result beyond the format's largest finite value clamps to it
  (NaN stays NaN) instead of becoming inf (or NaN in fp8 e4m3fn).
- ``loss_scale``: ts.grad and ts.value_and_grad of a function with this policy differentiate
  loss * loss_scale and divide the gradients by it (tessera.optim.LossScaler adjusts a scale
  dynamically instead).
- ``deterministic``: Tessera's kernels always are; False is refused rather than ignored.
"""
from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass

from . import dtypes as dt
from .errors import ArgumentError, DTypeError

ROUNDINGS = ("nearest", "stochastic")


@dataclass(frozen=True)
class NumericalPolicy:
    accumulation: dt.DType | None = None     # None: each operator's own (see dtypes)
    rounding: str = "nearest"
    loss_scale: float = 1.0
    saturate: bool = False
    deterministic: bool = True
    seed: int = 0                   # the stochastic rounding stream

    def __post_init__(self):
        acc = None if self.accumulation is None else dt.get(self.accumulation)
        if acc not in (None, dt.float32, dt.float64):
            raise DTypeError(f"a policy accumulates in float32 or float64, not {acc.name}",
                             expected="float32 or float64", received=acc.name,
                             hint="narrow formats are storage: their sums are float32 already")
        object.__setattr__(self, "accumulation", acc)
        if self.rounding not in ROUNDINGS:
            raise ArgumentError(f"rounding must be one of {ROUNDINGS}, not {self.rounding!r}")
        scale = self.loss_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
                not math.isfinite(scale) or scale <= 0:
            raise ArgumentError(f"loss_scale must be a finite number > 0, not {scale!r}")
        object.__setattr__(self, "loss_scale", float(scale))
        if self.deterministic is not True:
            raise ArgumentError("Tessera's kernels are deterministic; deterministic=False is not "
                                "offered", hint="leave deterministic at its default, True")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or \
                not 0 <= self.seed < 2 ** 63:
            raise ArgumentError(f"seed must be an int in [0, 2**63), not {self.seed!r}")
        object.__setattr__(self, "saturate", bool(self.saturate))

    @property
    def changes_rounding(self) -> bool:
        return self.rounding != "nearest" or self.saturate

    @property
    def is_default(self) -> bool:
        """Changes nothing an operator computes (loss_scale acts only in ts.grad)."""
        return self.accumulation is None and not self.changes_rounding

    def check_accumulation(self, d: dt.DType):
        """Refuse accumulating a float64 operand in float32 (less precision than its storage)."""
        if d is dt.float64 and self.accumulation is dt.float32:
            raise DTypeError("the policy accumulates in float32, less precise than an operand's "
                             "float64", expected="accumulation=float64 for float64 tensors",
                             received=str(self), hint="NumericalPolicy(accumulation=tessera."
                                                      "float64), or cast the tensor to float32")

    def __str__(self) -> str:
        parts = []
        if self.accumulation is not None:
            parts.append(f"acc={self.accumulation.short}")
        if self.rounding != "nearest":
            parts.append(f"rounding={self.rounding}" + (f"/seed={self.seed}" if self.seed else ""))
        if self.saturate:
            parts.append("saturate")
        if self.loss_scale != 1.0:
            parts.append(f"loss_scale={self.loss_scale:g}")
        return "policy(" + ", ".join(parts) + ")"


# ---- regions ----------------------------------------------------------------------------------
_state = threading.local()


class _Region:
    def __init__(self, policy: NumericalPolicy):
        self.policy = policy
        self.rounded = 0            # eager stochastic roundings so far (each its own stream)


def current() -> NumericalPolicy | None:
    """The innermost region's policy (None outside every region)."""
    stack = getattr(_state, "stack", None)
    return stack[-1].policy if stack else None


def region_state() -> _Region:
    return _state.stack[-1]


def as_policy(policy=None, **fields) -> NumericalPolicy:
    if policy is not None and fields:
        raise ArgumentError("pass a NumericalPolicy or its fields, not both")
    if policy is None:
        return NumericalPolicy(**fields)
    if not isinstance(policy, NumericalPolicy):
        raise ArgumentError(f"expected a tessera.NumericalPolicy, not {policy!r}")
    return policy


@contextlib.contextmanager
def policy(policy: NumericalPolicy | None = None, **fields):
    """``with ts.policy(accumulation=ts.float64): ...`` (or a NumericalPolicy): operators
    traced or run eagerly inside use it."""
    p = as_policy(policy, **fields)
    stack = _state.__dict__.setdefault("stack", [])
    stack.append(_Region(p))
    try:
        yield p
    finally:
        stack.pop()
