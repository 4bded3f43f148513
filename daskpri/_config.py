"""Configuration defaults, read through :mod:`dask.config` under ``daskpri``."""

from __future__ import annotations

import math
import os
from typing import Any

import dask.config
import numpy as np
import yaml

_fn = os.path.join(os.path.dirname(__file__), "daskpri.yaml")

with open(_fn) as _f:
    _defaults = yaml.safe_load(_f)

dask.config.update_defaults(_defaults)


def get(key: str, value: Any = None) -> Any:
    """Return ``value`` if given, else the configured ``daskpri.<key>``.

    A keyword argument of ``None`` means "read the config", as in distributed.
    """
    if value is not None:
        return value
    return dask.config.get(f"daskpri.{key}")


def get_bool(key: str) -> bool:
    """The configured ``daskpri.<key>``, which should be true or false."""
    value = dask.config.get(f"daskpri.{key}")
    if not isinstance(value, bool):
        raise ValueError(
            f"daskpri.{key} should be true or false, but got {value!r} "
            f"(set it with dask.config.set({{'daskpri.{key}': False}}) or in a YAML file)"
        )
    return value


def get_int(key: str, minimum: int) -> int:
    """The configured ``daskpri.<key>``, which should be an integer of at least ``minimum``."""
    value = dask.config.get(f"daskpri.{key}")
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(
            f"daskpri.{key} should be an integer of at least {minimum}, but got {value!r} "
            f"(set it with dask.config.set({{'daskpri.{key}': {max(minimum, 1)}}}) or in a "
            "YAML file)"
        )
    return int(value)


def get_seconds(key: str) -> float:
    """The configured ``daskpri.<key>``, a duration, in seconds.

    A number of seconds or a string such as ``"30s"`` or ``"2 minutes"``, as
    Dask's own timeouts take them.
    """
    from dask.utils import parse_timedelta

    value = dask.config.get(f"daskpri.{key}")
    try:
        seconds = None if isinstance(value, bool) else parse_timedelta(value, default="s")
    except (KeyError, ValueError, TypeError):
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"daskpri.{key} should be a duration, a number of seconds or a string like "
            f"'30s', but got {value!r} (set it with dask.config.set({{'daskpri.{key}': "
            "'30s'}) or in a YAML file)"
        )
    return float(seconds)


def cache_dir() -> str:
    """The directory where generated datasets are cached."""
    path = dask.config.get("daskpri.cache-dir")
    if path is None:
        path = os.path.join(os.path.expanduser("~"), ".cache", "daskpri")
    return str(path)
