"""daskpri: prioritized data-parallel SGD for PyTorch on Dask clusters.

The names below load on first use (PEP 562), as Dask's and SciPy's do: a
process that needs only a part of daskpri (the scheduler, which holds the
priority tables and serves the dashboard page) imports that part alone,
without torch.

Examples
--------
>>> import daskpri
>>> sorted(daskpri.STRATEGIES)[:3]
['infobatch', 'length', 'loss']
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from daskpri import _config  # noqa: F401  (loads the config defaults)
from daskpri._warnings import DaskpriWarning

if TYPE_CHECKING:
    from daskpri import models
    from daskpri.data import datasets
    from daskpri.strategies import STRATEGIES, Strategy, get_strategy, register_strategy
    from daskpri.table.table import PriorityTable
    from daskpri.training.early_stopping import EarlyStopping
    from daskpri.training.errors import SchedulerLostError, WorkersLostError
    from daskpri.training.history import time_to_accuracy
    from daskpri.training.trainer import Trainer

__version__ = "0.1.0"

#: each public name's module, imported when the name is first read
_LAZY = {
    "EarlyStopping": "daskpri.training.early_stopping",
    "STRATEGIES": "daskpri.strategies",
    "PriorityTable": "daskpri.table.table",
    "SchedulerLostError": "daskpri.training.errors",
    "Strategy": "daskpri.strategies",
    "Trainer": "daskpri.training.trainer",
    "WorkersLostError": "daskpri.training.errors",
    "get_strategy": "daskpri.strategies",
    "register_strategy": "daskpri.strategies",
    "time_to_accuracy": "daskpri.training.history",
}
#: the public submodules
_SUBMODULES = {"datasets": "daskpri.data.datasets", "models": "daskpri.models"}

__all__ = [
    "STRATEGIES",
    "DaskpriWarning",
    "EarlyStopping",
    "PriorityTable",
    "SchedulerLostError",
    "Strategy",
    "Trainer",
    "WorkersLostError",
    "datasets",
    "get_strategy",
    "models",
    "register_strategy",
    "time_to_accuracy",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'daskpri' has no attribute {name!r}")
    globals()[name] = value  # read once: the next read is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
