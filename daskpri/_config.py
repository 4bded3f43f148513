"""Configuration defaults, read through :mod:`dask.config` under ``daskpri``."""

from __future__ import annotations

import os
from typing import Any

import dask.config
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


def cache_dir() -> str:
    """The directory where generated datasets are cached."""
    path = dask.config.get("daskpri.cache-dir")
    if path is None:
        path = os.path.join(os.path.expanduser("~"), ".cache", "daskpri")
    return str(path)
