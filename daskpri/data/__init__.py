"""Datasets: built-in loaders, and opening, checking and storing training data."""

from __future__ import annotations

from daskpri.data.datasets import DATASETS, load
from daskpri.data.io import check_values, open_dataset, to_store, validate_dataset

__all__ = ["DATASETS", "check_values", "load", "open_dataset", "to_store", "validate_dataset"]
