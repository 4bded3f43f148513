"""Learning-rate schedules: the rate of a step as a pure function of the step.

The rate is recomputed from the step count before every optimizer step, so a
resumed run (which restores the step count) follows the same schedule
without any scheduler state in the checkpoint.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine", "linear")


def validate_schedule(schedule: str, steps: int | None) -> tuple[str, int | None]:
    """``(schedule, steps)`` if they make a schedule, else a ``ValueError``.

    ``"cosine"`` and ``"linear"`` decay to zero over ``steps`` steps and need
    it; ``"constant"`` takes none.
    """
    if schedule not in SCHEDULES:
        allowed = ", ".join(repr(s) for s in SCHEDULES)
        raise ValueError(f"lr_schedule should be one of {allowed}, but got {schedule!r}")
    if schedule == "constant":
        if steps is not None:
            raise ValueError(
                "schedule_steps= sets the length of a decaying lr_schedule ('cosine' or "
                f"'linear'), but lr_schedule='constant' (got schedule_steps={steps!r})"
            )
        return schedule, None
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(
            f"lr_schedule={schedule!r} decays over schedule_steps steps, which should be a "
            f"positive integer, but got schedule_steps={steps!r}"
        )
    return schedule, steps


def scheduled_rate(base: float, schedule: str, step: int, steps: int | None) -> float:
    """The learning rate of step ``step`` (0-based) under ``schedule``.

    Past ``steps`` a decaying schedule stays at zero.

    Examples
    --------
    >>> scheduled_rate(0.1, "constant", 500, None)
    0.1
    >>> scheduled_rate(0.1, "linear", 50, 100)
    0.05
    >>> round(scheduled_rate(0.1, "cosine", 50, 100), 6)
    0.05
    """
    if schedule == "constant" or steps is None:
        return base
    frac = min(step, steps) / steps
    if schedule == "linear":
        return base * (1.0 - frac)
    return base * 0.5 * (1.0 + math.cos(math.pi * frac))
