"""Checks of a strategy's parameters, at the boundary.

Each raises ``ValueError`` naming the parameter, the value received and
what is allowed, and returns the value to keep.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def check_fraction(
    name: str, value: float, *, low_open: bool = False, high_open: bool = False
) -> float:
    """``value`` if it is a number in [0, 1] (open at 0 with ``low_open``, at 1 with ``high_open``).

    Examples
    --------
    >>> check_fraction("decay", 0.9, high_open=True)
    0.9
    >>> check_fraction("decay", 1.0, high_open=True)
    Traceback (most recent call last):
    ...
    ValueError: decay should be a number in [0, 1), but got decay=1.0
    """
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    if ok:
        ok = (0.0 < value if low_open else 0.0 <= value) and (
            value < 1.0 if high_open else value <= 1.0
        )
    if not ok:
        interval = ("(" if low_open else "[") + "0, 1" + (")" if high_open else "]")
        raise ValueError(f"{name} should be a number in {interval}, but got {name}={value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool if it is one (a NumPy bool too).

    Examples
    --------
    >>> check_bool("flag", np.True_)
    True
    >>> check_bool("flag", "no")
    Traceback (most recent call last):
    ...
    ValueError: flag should be True or False, but got flag='no'
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} should be True or False, but got {name}={value!r}")
    return bool(value)


def check_number(name: str, value: Any, low: float, *, low_open: bool = False) -> float:
    """``value`` if it is a finite number ``>= low`` (``> low`` with ``low_open``)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and (value > low if low_open else value >= low)):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise ValueError(f"{name} should be a finite number {bound}, but got {name}={value!r}")
    return float(value)


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int if it is an integer (not a bool) of at least ``minimum``.

    The one integer check of the package (``daskpri.training._checks``
    re-exports it; it lives here, which the training modules import).
    """
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise ValueError(f"{name} should be {kind}, but got {name}={value!r}")
    return int(value)


def check_positive_int(name: str, value: int | None, *, allow_none: bool = True) -> int | None:
    """``value`` if it is a positive integer (or None where allowed)."""
    if value is None and allow_none:
        return None
    return check_int(name, value, 1)
