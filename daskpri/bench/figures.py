"""What the plots show, as plain data: shared by the PNG and the HTML renderers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskpri.bench.config import BenchConfig
from daskpri.bench.protocol import pick_learning_rates
from daskpri.bench.records import RunRecord

__all__ = ["AccuracyLine", "accuracy_lines", "palette", "scaling_points", "speedup_bars"]

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")


def palette(labels: Sequence[str]) -> dict[str, str]:
    """A color per arm label, stable across plots (uniform first, in black).

    Examples
    --------
    >>> palette(["uniform", "loss"])
    {'uniform': '#000000', 'loss': '#1f77b4'}
    """
    colors = iter(_PALETTE * (len(labels) // len(_PALETTE) + 1))
    return {lab: "#000000" if lab == "uniform" else next(colors) for lab in labels}


@dataclass(frozen=True)
class AccuracyLine:
    """The evaluated points of one run: test accuracy against training seconds."""

    arm: str
    seed: int
    time: np.ndarray
    accuracy: np.ndarray
    #: the run of the benchmark's first seed, drawn solid and named in the legend
    first: bool = False


def accuracy_lines(config: BenchConfig, records: Sequence[RunRecord], dataset: str,
                   model: str) -> list[AccuracyLine]:
    """Each arm's runs at its chosen learning rate, on the comparison's worker count."""
    picks = pick_learning_rates(records, config.pick, max(config.target_fractions))
    out = []
    for r in records:
        s = r.spec
        if (s.phase, s.dataset, s.model, s.n_workers) != ("sweep", dataset, model,
                                                          config.main_workers):
            continue
        if picks.get((dataset, model, s.arm.label)) != s.learning_rate:
            continue
        t, _, acc = r.curve.evaluated()
        out.append(AccuracyLine(s.arm.label, s.seed, t, acc, s.seed == config.first_seed))
    return out


def speedup_bars(summary: Mapping[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per dataset and model: the speedup vs uniform of each non-uniform arm per target.

    ``value`` is 0 where the arm missed the target (``kind`` says so) and the
    lower bound where uniform missed it; ``low`` and ``high`` bound its
    bootstrap interval over seeds (NaN where there is none).
    """
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in summary["time_to_target"]:
        if r["arm"] == "uniform":
            continue
        ratio, ci = r["vs_uniform"], r.get("vs_uniform_interval")
        value = ratio.value if math.isfinite(ratio.value) else 0.0
        out.setdefault((r["dataset"], r["model"]), []).append(
            {"arm": r["arm"], "target": f"{100 * r['fraction']:g}%", "value": value,
             "kind": ratio.kind, "low": ci.low if ci is not None else math.nan,
             "high": ci.high if ci is not None else math.nan}
        )
    return out


def scaling_points(summary: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per dataset and model, per arm: worker counts and median samples/s."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in summary["scaling"]:
        arms = out.setdefault((r["dataset"], r["model"]), {})
        workers, sps = arms.setdefault(r["arm"], ([], []))
        workers.append(r["n_workers"])
        sps.append(r["samples_per_second"].median)
    return out
