"""Schedules: first-class knob settings a user attaches to a function (``@ts.function(schedule=)``).

A Schedule says how kernels should be cut into tiles, never what they compute. Knobs a target
does not use (warps and stages on the CPU) are kept, shown and saved, so one schedule file
serves every target.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field

from .errors import ArgumentError

SCHEDULE_FORMAT = 1


def _positive_ints(name, value, lengths):
    if value is None:
        return None
    if isinstance(value, int):
        value = (value,)
    if not isinstance(value, (tuple, list)) or len(value) not in lengths or \
            not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ArgumentError(f"Schedule {name} must be {' or '.join(map(str, lengths))} positive "
                            f"integers, not {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class Schedule:
    """Knobs for a function's kernels.

    block: tile sizes: (BM, BN) or (BM, BN, BK) for matmuls; its first size is attention's
        queries per task.
    vector_width: accumulators per row reduction (this changes the association of sums, so
        results differ in the last bits from the default; still deterministic).
    parallel: False runs every kernel on one thread.
    fusion: False gives every operator its own kernel (to compare with what fusion saves).
    warps, stages, swizzle: GPU knobs, kept for the GPU targets.
    """
    name: str = "schedule"
    block: tuple | None = None
    warps: int | None = None
    stages: int | None = None
    vector_width: int | None = None
    swizzle: str | None = None
    parallel: bool | None = None
    fusion: bool | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "block", _positive_ints("block", self.block, (2, 3)))
        for name in ("warps", "stages", "vector_width"):
            v = getattr(self, name)
            if v is not None:
                _positive_ints(name, v, (1,))
        if self.vector_width is not None and self.vector_width > 256:
            raise ArgumentError(f"Schedule vector_width must be at most 256, not "
                                f"{self.vector_width}")

    # -- deriving (the seeds' two; dataclasses.replace sets any field) -------------------------
    def with_block(self, *block) -> "Schedule":
        return dataclasses.replace(self, block=tuple(block))

    def with_stages(self, stages: int) -> "Schedule":
        return dataclasses.replace(self, stages=stages)

    # -- applying --------------------------------------------------------------------------------
    def knobs_for(self, strategy: str) -> dict:
        """The knob overrides this schedule gives a kernel of the given strategy (each strategy
        says which of the schedule's fields set which of its knobs)."""
        from .compiler import strategies
        return strategies.get(strategy).user_knobs(self)

    def key(self) -> tuple:
        return tuple(sorted((k, json.dumps(v, sort_keys=True))
                            for k, v in self.to_dict().items()))

    # -- files -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["block"] = list(self.block) if self.block else None
        return {"format": SCHEDULE_FORMAT, **d}

    def save(self, path) -> None:
        """Write the schedule as JSON (atomically: a crash never leaves half a file)."""
        path = os.fspath(path)
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".sched-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def load(cls, path) -> "Schedule":
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ArgumentError(f"cannot read schedule {os.fspath(path)}: {e}") from None
        if not isinstance(d, dict) or d.pop("format", None) != SCHEDULE_FORMAT:
            raise ArgumentError(f"{os.fspath(path)} is not a tessera schedule (format "
                                f"{SCHEDULE_FORMAT})")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ArgumentError(f"schedule {os.fspath(path)} has unknown knobs {sorted(unknown)}")
        return cls(**d)

    def __str__(self):
        knobs = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()
                          if k not in ("format", "name") and v not in (None, {}))
        return f"Schedule {self.name!r} {{{knobs}}}"
