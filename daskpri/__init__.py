"""daskpri: prioritized data-parallel SGD for PyTorch on Dask clusters.

Examples
--------
>>> import daskpri
>>> sorted(daskpri.STRATEGIES)[:3]
['infobatch', 'length', 'loss']
"""

from __future__ import annotations

from daskpri import (
    _config,  # noqa: F401  (loads the config defaults)
    models,
)
from daskpri._warnings import DaskpriWarning
from daskpri.data import datasets
from daskpri.strategies import STRATEGIES, Strategy, get_strategy, register_strategy
from daskpri.table.table import PriorityTable
from daskpri.training.errors import WorkersLostError
from daskpri.training.history import time_to_accuracy
from daskpri.training.trainer import SchedulerLostError, Trainer

__version__ = "0.1.0"

__all__ = [
    "STRATEGIES",
    "DaskpriWarning",
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
