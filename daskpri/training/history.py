"""The training history: per-step metrics kept as an ``xarray.Dataset``."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

#: Per-step scalar metrics, with their units and meaning (``attrs``).
STEP_VARIABLES: dict[str, tuple[str, str]] = {
    "time": ("s", "training wall time since the first fit began, evaluation excluded"),
    "loss": ("", "mean training loss of the samples processed in the step (NaN: none)"),
    "selection_digest": ("", "CRC-32 of the samples selected in the step, to compare runs"),
    "skipped": ("", "1 where the step's loss or gradient was non-finite and it was skipped"),
    "accuracy": ("", "accuracy on eval_data (NaN between evaluations)"),
    "eval_loss": ("", "mean loss on eval_data (NaN between evaluations)"),
    "lr": ("", "learning rate of the step's update (0 where no update was made)"),
    "train_accuracy": ("", "accuracy on the samples processed in the step"),
    "samples": ("", "samples processed so far (forward and backward)"),
    "grad_samples": ("", "samples whose gradient entered an update so far"),
    "samples_per_second": ("1/s", "samples processed per second of step time"),
    "step_time": ("s", "wall time of the step"),
    "compute_time": ("s", "slowest worker's computation time in the step"),
    "communication_time": ("s", "step time spent shipping weights, tasks and results"),
    "selection_time": ("s", "time to update the priority table and select the next samples"),
    "selected_ahead": ("", "1 where the step's samples were selected while the workers computed "
                       "the round before (0: selected after it, while the workers waited)"),
    "optimizer_time": ("s", "time to combine the gradients and step the optimizer"),
    "eval_time": ("s", "time spent evaluating after the step"),
    "n_workers": ("", "workers that took part in the step"),
    "priority_mean": ("", "mean of the priorities computed in the step"),
    "priority_max": ("", "max of the priorities computed in the step"),
}

#: The :data:`STEP_VARIABLES` that count something (samples, workers) or flag a
#: step (0 or 1): ``int64`` in the history. A record without one (from a
#: checkpoint written before the variable existed) leaves it ``float64``, NaN
#: there, rather than a made-up count.
COUNT_VARIABLES = frozenset({"skipped", "selected_ahead", "samples", "grad_samples", "n_workers"})

#: The parts of a step's wall time, as :data:`STEP_VARIABLES` names them: they add up
#: to ``step_time`` (the dashboards stack them; ``daskpri bench`` reports their shares).
TIME_PARTS = ("compute_time", "communication_time", "selection_time", "optimizer_time")

#: Per-step, per-worker-slot metrics: ``float64`` (``worker_samples`` counts too),
#: NaN in the slots a step did not have (it ran on fewer workers than the most
#: the history saw), where any integer fill would read as a real count.
WORKER_VARIABLES: dict[str, tuple[str, str]] = {
    "worker_samples": ("", "samples processed by each worker slot in the step"),
    "worker_compute_time": ("s", "computation time of each worker slot in the step"),
}


class HistoryRecorder:
    """Collects one record per step and builds the history Dataset."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def __len__(self) -> int:
        return len(self.records)

    def to_dataset(self, attrs: dict[str, Any] | None = None) -> xr.Dataset:
        """The history along ``step`` (and ``worker`` for per-worker metrics).

        Built from the records as they are when it is called: a fit in
        another thread (``fit_in_background``) may append more meanwhile.
        Counts are integers (see :data:`COUNT_VARIABLES`).

        Examples
        --------
        >>> recorder = HistoryRecorder()
        >>> recorder.append({"step": 0, "loss": 2.3, "samples": 64, "n_workers": 2})
        >>> h = recorder.to_dataset()
        >>> h["samples"].dtype, h["n_workers"].dtype, h["loss"].dtype
        (dtype('int64'), dtype('int64'), dtype('float64'))
        """
        records = list(self.records)
        steps = np.array([r["step"] for r in records], dtype=np.int64)
        data: dict[str, Any] = {}
        for name, (units, doc) in STEP_VARIABLES.items():
            values = np.array([r.get(name, np.nan) for r in records], dtype=np.float64)
            if name in COUNT_VARIABLES and not np.isnan(values).any():
                values = values.astype(np.int64)  # exact: counts stay far below 2**53
            data[name] = xr.Variable("step", values, {"units": units, "long_name": doc})
        n_slots = max((len(r.get("worker_samples", ())) for r in records), default=0)
        for name, (units, doc) in WORKER_VARIABLES.items():
            values = np.full((len(records), n_slots), np.nan)
            for i, r in enumerate(records):
                row = r.get(name, ())
                values[i, : len(row)] = row
            data[name] = xr.Variable(("step", "worker"), values, {"units": units, "long_name": doc})
        ds = xr.Dataset(data, coords={"step": steps, "worker": np.arange(n_slots)})
        ds.attrs.update({k: _attr(v) for k, v in (attrs or {}).items()})
        return ds


def _attr(value: Any) -> Any:
    """netCDF attributes hold numbers and strings only."""
    if isinstance(value, (str, int, float, np.number)):
        return value
    if value is None:
        return "None"
    return repr(value)


def time_to_accuracy(history: xr.Dataset, target: float) -> float:
    """Training time at which ``accuracy`` first reached ``target`` (NaN if never).

    Parameters
    ----------
    history : xarray.Dataset
        A history with ``time`` and ``accuracy`` along ``step``, such as
        :attr:`Trainer.history_ <daskpri.Trainer.history_>` or what
        :meth:`Trainer.fit <daskpri.Trainer.fit>` returns (NaN accuracies,
        between evaluations, never count).
    target : float
        The accuracy to reach.

    Returns
    -------
    float
        The ``time`` (seconds of training) of the first step whose
        ``accuracy`` is at least ``target``; NaN if none is.

    Examples
    --------
    >>> import xarray as xr, numpy as np
    >>> h = xr.Dataset({"time": ("step", [1.0, 2.0, 3.0]),
    ...                 "accuracy": ("step", [0.5, np.nan, 0.9])})
    >>> time_to_accuracy(h, 0.8)
    3.0
    """
    acc = history["accuracy"].values
    hit = np.flatnonzero(np.nan_to_num(acc, nan=-np.inf) >= target)
    return float(history["time"].values[hit[0]]) if hit.size else float("nan")
