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


def validate_warmup(warmup: int, schedule: str, steps: int | None) -> int:
    """``warmup`` (the steps of a linear warm-up) if it fits the schedule, else ``ValueError``.

    >>> validate_warmup(100, "cosine", 1000)
    100
    >>> validate_warmup(1000, "cosine", 1000)
    Traceback (most recent call last):
    ...
    ValueError: warmup_steps=1000 leaves no step for lr_schedule='cosine' to decay over: it should be less than schedule_steps=1000
    """  # noqa: E501
    # imported here: this module is the command line's too, which imports no torch
    from daskpri.strategies._checks import check_int

    warmup = check_int("warmup_steps", warmup, 0)
    if steps is not None and warmup >= steps:
        raise ValueError(f"warmup_steps={warmup} leaves no step for lr_schedule={schedule!r} to "
                         f"decay over: it should be less than schedule_steps={steps}")
    return warmup


def scheduled_rate(base: float, schedule: str, step: int, steps: int | None,
                   warmup: int = 0) -> float:
    """The learning rate of step ``step`` (0-based) under ``schedule``, after ``warmup``.

    The first ``warmup`` steps rise linearly to ``base`` (step ``i`` at
    ``base * (i + 1) / warmup``), as Goyal et al.'s large-batch data-parallel
    SGD warms up; a decaying schedule then decays from ``base`` to zero over
    the rest of its ``steps`` (as Hugging Face's ``get_cosine_schedule_with_warmup``),
    and stays at zero past them.

    Examples
    --------
    >>> scheduled_rate(0.1, "constant", 500, None)
    0.1
    >>> scheduled_rate(0.1, "linear", 50, 100)
    0.05
    >>> round(scheduled_rate(0.1, "cosine", 50, 100), 6)
    0.05
    >>> [round(scheduled_rate(0.1, "linear", s, 14, warmup=4), 4) for s in (0, 3, 4, 9, 14)]
    [0.025, 0.1, 0.1, 0.05, 0.0]
    """
    if step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant" or steps is None:
        return base
    frac = (min(step, steps) - warmup) / (steps - warmup)
    if schedule == "linear":
        return base * (1.0 - frac)
    return base * 0.5 * (1.0 + math.cos(math.pi * frac))
