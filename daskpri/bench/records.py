"""The benchmark's data: arms, run specifications and the records of finished runs.

A :class:`RunSpec` says what to run; a :class:`RunRecord` is a spec with what
came of it (the full curve). Both round-trip through JSON, so a report can be
rebuilt from ``results.json`` alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import xarray as xr
from numpy.typing import ArrayLike

from daskpri.training.history import TIME_PARTS

__all__ = ["Arm", "Curve", "RunRecord", "RunSpec", "record_from_history", "time_to_target"]

#: How a run is executed.
KINDS = ("daskpri", "torch", "ddp")
#: Why a run is made (its phase of the protocol).
PHASES = ("sweep", "scaling", "overhead")


@dataclass(frozen=True)
class Arm:
    """One line of the comparison: a strategy with its batch and options.

    Parameters
    ----------
    label : str
        The name in the tables, e.g. ``"projection"`` or ``"uniform@144"``.
    strategy : str
        A registered strategy name.
    batch_size : int
        The trainer's ``batch_size`` (samples per worker per step).
    grads_per_step : int
        Gradients each worker computes per step, as planned (the report
        also shows the measured count).
    options : tuple of (str, value) pairs
        Strategy options.

    Examples
    --------
    >>> Arm("uniform@144", "uniform", 144, 144).is_uniform
    True
    """

    label: str
    strategy: str
    batch_size: int
    grads_per_step: int
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def is_uniform(self) -> bool:
        """Whether this arm is a uniform baseline (of any batch size)."""
        return self.strategy == "uniform"


@dataclass(frozen=True)
class RunSpec:
    """One run to make.

    ``kind`` is ``"daskpri"`` (a :class:`~daskpri.Trainer` on a cluster of
    ``n_workers``), ``"torch"`` (the plain single-process loop), ``"ddp"``
    (PyTorch DDP with ``n_workers`` processes) or ``"loops"`` (``n_workers``
    plain loops at once, not communicating).
    """

    phase: str
    kind: str
    dataset: str
    model: str
    arm: Arm
    learning_rate: float
    seed: int
    n_workers: int
    budget: float

    @property
    def name(self) -> str:
        """A short description, for progress lines."""
        kind = "" if self.kind == "daskpri" else f"{self.kind} "
        return (
            f"{self.dataset}/{self.model} {self.phase}: {kind}{self.arm.label} "
            f"lr={self.learning_rate:g} seed={self.seed} workers={self.n_workers}"
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSpec:
        arm = dict(d["arm"])
        arm["options"] = tuple((str(k), v) for k, v in arm.get("options", ()))
        return cls(**{**d, "arm": Arm(**arm)})


class Curve:
    """Per-step training curve: ``time`` (s, evaluation excluded), ``step``
    (steps done), test ``accuracy`` (NaN between evaluations) and train ``loss``.

    Examples
    --------
    >>> Curve([1.0, 2.0], [1, 2], [float("nan"), 0.5], [0.9, 0.8]).evaluated()[2]
    array([0.5])
    """

    def __init__(self, time: ArrayLike, step: ArrayLike, accuracy: ArrayLike,
                 loss: ArrayLike) -> None:
        self.time = np.asarray(time, dtype=np.float64)
        self.step = np.asarray(step, dtype=np.int64)
        self.accuracy = np.asarray(accuracy, dtype=np.float64)
        self.loss = np.asarray(loss, dtype=np.float64)
        sizes = {a.size for a in (self.time, self.step, self.accuracy, self.loss)}
        if len(sizes) != 1:
            raise ValueError(f"a curve's arrays should have one length, but got {sorted(sizes)}")

    def __repr__(self) -> str:
        return f"Curve(<{self.time.size} steps>)"

    def evaluated(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``time``, ``step`` and ``accuracy`` where the accuracy was measured."""
        ok = ~np.isnan(self.accuracy)
        return self.time[ok], self.step[ok], self.accuracy[ok]

    def to_dict(self) -> dict[str, list[Any]]:
        return {
            "time": self.time.tolist(),
            "step": self.step.tolist(),
            "accuracy": [None if math.isnan(a) else a for a in self.accuracy.tolist()],
            "loss": [None if not math.isfinite(v) else v for v in self.loss.tolist()],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Sequence[Any]]) -> Curve:
        def floats(values: Sequence[Any]) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

        return cls(d["time"], d["step"], floats(d["accuracy"]), floats(d["loss"]))


def time_to_target(curve: Curve, target: float) -> float:
    """Training seconds at the first evaluation whose accuracy reached ``target`` (else inf).

    Examples
    --------
    >>> c = Curve([1.0, 2.0, 3.0], [1, 2, 3], [0.5, float("nan"), 0.9], [1.0, 1.0, 1.0])
    >>> time_to_target(c, 0.8), time_to_target(c, 0.95)
    (3.0, inf)
    """
    t, _, acc = curve.evaluated()
    hit = np.flatnonzero(acc >= target)
    return float(t[hit[0]]) if hit.size and math.isfinite(target) else math.inf


@dataclass
class RunRecord:
    """A finished run: its spec, curve and totals.

    Parameters
    ----------
    spec : RunSpec
    curve : Curve
    samples : int
        Samples processed (forward and backward) in all.
    grad_samples : int
        Samples whose gradient entered an update.
    wall_seconds : float
        Wall time of the whole run, set-up and evaluations included.
    info : dict
        Anything else worth keeping (the strategy's repr, ...).
    """

    spec: RunSpec
    curve: Curve
    samples: int
    grad_samples: int
    wall_seconds: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def train_seconds(self) -> float:
        """Training time of the run (the curve's last ``time``)."""
        return float(self.curve.time[-1]) if self.curve.time.size else 0.0

    @property
    def steps(self) -> int:
        return int(self.curve.step[-1]) if self.curve.step.size else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": asdict(self.spec),
            "curve": self.curve.to_dict(),
            "samples": int(self.samples),
            "grad_samples": int(self.grad_samples),
            "wall_seconds": float(self.wall_seconds),
            "info": dict(self.info),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunRecord:
        return cls(
            spec=RunSpec.from_dict(d["spec"]),
            curve=Curve.from_dict(d["curve"]),
            samples=int(d["samples"]),
            grad_samples=int(d["grad_samples"]),
            wall_seconds=float(d["wall_seconds"]),
            info=dict(d.get("info", {})),
        )


def record_from_history(spec: RunSpec, history: xr.Dataset, wall_seconds: float) -> RunRecord:
    """The record of a daskpri run from the trainer's history.

    The history's ``step`` coordinate counts from 0; the curve's ``step`` is
    the number of steps done (``step + 1``).
    """
    n = history.sizes.get("step", 0)
    last = (lambda name: int(history[name].values[-1])) if n else (lambda name: 0)
    parts = {name.removesuffix("_time"): float(np.nansum(history[name].values))
             for name in TIME_PARTS if name in history}
    ahead = history["selected_ahead"].values if "selected_ahead" in history else np.empty(0)
    return RunRecord(
        spec=spec,
        curve=Curve(
            time=history["time"].values,
            step=history["step"].values + 1,
            accuracy=history["accuracy"].values,
            loss=history["loss"].values,
        ),
        samples=last("samples"),
        grad_samples=last("grad_samples"),
        wall_seconds=wall_seconds,
        info={
            "strategy": str(history.attrs.get("strategy_params", spec.arm.strategy)),
            "staleness": str(history.attrs.get("staleness", "")),
            "time_parts": parts,
            "selected_ahead": float(ahead.mean()) if ahead.size else math.nan,
        },
    )
