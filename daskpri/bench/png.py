"""The report's PNG plots, with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from daskpri.bench.analysis import CONFIDENCE
from daskpri.bench.config import BenchConfig
from daskpri.bench.figures import accuracy_lines, palette, scaling_points, speedup_bars
from daskpri.bench.records import RunRecord
from daskpri.data.store import write_atomic

__all__ = ["png_names", "write_pngs"]


def png_names(config: BenchConfig) -> list[str]:
    """The names of the PNGs :func:`write_pngs` writes for ``config``, in its order."""
    names = [f"accuracy_{dataset}_{model}.png"
             for dataset in config.datasets for model in config.models]
    return names + ["speedup.png"] + (["scaling.png"] if len(config.workers) > 1 else [])


def write_pngs(out: Path, config: BenchConfig, records: Sequence[RunRecord],
               summary: Mapping[str, Any]) -> list[str]:
    """Write the PNGs into ``out``; return their file names.

    ``accuracy_<dataset>_<model>.png`` (accuracy against training seconds,
    every seed of every arm, with the targets: the whole run, and beside it
    the band around the targets, where the arms part), ``speedup.png``
    (speedup vs uniform per target) and, with several worker counts,
    ``scaling.png``.
    """
    from matplotlib.figure import Figure  # a Figure needs no pyplot, hence no GUI backend

    names = []
    targets = summary["targets"]
    for dataset in config.datasets:
        for model in config.models:
            lines = accuracy_lines(config, records, dataset, model)
            colors = palette(list(dict.fromkeys(line.arm for line in lines)))
            # none where every uniform run failed: the report says so, and the plots show
            # the runs without lines to reach (a NaN one would be a NaN axis limit)
            levels = [t for t in targets if (t["dataset"], t["model"]) == (dataset, model)
                      and math.isfinite(t["target"])]
            fig = Figure(figsize=(12, 4.5))
            whole, near = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
            for ax in (whole, near):
                for line in lines:
                    ax.plot(line.time, line.accuracy, color=colors[line.arm], lw=1.2,
                            alpha=1.0 if line.first else 0.45,
                            label=line.arm if line.first else None)
                for t in levels:
                    ax.axhline(t["target"], color="grey", ls="--", lw=0.8)
                    ax.text(0.01, t["target"], f"{100 * t['fraction']:g}% target", fontsize=7,
                            color="grey", va="bottom", transform=ax.get_yaxis_transform())
                ax.set(xlabel="training time (s)", ylabel="test accuracy")
                ax.grid(alpha=0.3)
            whole.set_title(f"{dataset} / {model}, {_workers(config.main_workers)}")
            whole.legend(fontsize=8, loc="lower right")
            band = _target_band([t["target"] for t in levels],
                                [line.accuracy for line in lines])
            if band is not None:
                near.set_ylim(*band)
            near.set_title("near the targets")
            name = f"accuracy_{dataset}_{model}.png"  # as png_names has it
            _save(fig, out / name, bbox_inches="tight")
            names.append(name)
    names.append(_speedups(out, summary))
    if len(config.workers) > 1:
        names.append(_scaling(out, summary))
    return names


def _target_band(
    targets: Sequence[float], accuracies: Sequence[np.ndarray]
) -> tuple[float, float] | None:
    """The accuracies the zoomed panel shows: from below the lowest target to the best reached.

    Below the lowest target by half the targets' span (by 0.02 with one
    target), above the best accuracy of any run (NaN where a run diverged
    left out) by a tenth of that range; ``None`` without targets.

    Examples
    --------
    >>> [round(v, 4) for v in _target_band([0.955, 0.975], [np.array([0.3, 0.96, np.nan]),
    ...                                                      np.array([0.985])])]
    [0.945, 0.989]
    >>> _target_band([], [np.array([0.5])]) is None
    True
    """
    if not targets:
        return None
    low, high = min(targets), max(targets)
    low -= (high - low) / 2 if high > low else 0.02
    reached = [a[np.isfinite(a)] for a in accuracies]
    top = max([high, *(float(a.max()) for a in reached if a.size)])
    return low, top + (top - low) / 10


def _workers(n: int) -> str:
    return f"{n} worker" + ("" if n == 1 else "s")


def _speedups(out: Path, summary: Mapping[str, Any]) -> str:
    from matplotlib.figure import Figure

    bars = speedup_bars(summary)
    fig = Figure(figsize=(7, 3.2 * max(len(bars), 1)))
    for i, ((dataset, model), rows) in enumerate(bars.items()):
        ax = fig.add_subplot(len(bars), 1, i + 1)
        arms = list(dict.fromkeys(r["arm"] for r in rows))
        targets = list(dict.fromkeys(r["target"] for r in rows))
        width = 0.8 / max(len(targets), 1)
        for j, target in enumerate(targets):
            xs, hs, notes, spans = [], [], [], []
            for k, arm in enumerate(arms):
                row = next(r for r in rows if r["arm"] == arm and r["target"] == target)
                xs.append(k + j * width)
                hs.append(row["value"])
                notes.append({"not reached": "n.r.", "at least": "≥", "n/a": "—"}.get(
                    row["kind"], ""))
                spans.append((row["low"], row["high"]))
            ax.bar(xs, hs, width, label=f"to {target}")
            # the bootstrap interval over seeds, where there is one
            whiskers = [(x, lo, hi) for x, (lo, hi) in zip(xs, spans, strict=True)
                        if math.isfinite(lo) and math.isfinite(hi)]
            if whiskers:
                wx, lo, hi = (list(v) for v in zip(*whiskers, strict=True))
                ax.vlines(wx, lo, hi, color="black", lw=0.8)
                for ends in (lo, hi):
                    ax.hlines(ends, [x - width / 6 for x in wx], [x + width / 6 for x in wx],
                              color="black", lw=0.8)
            for x, h, note in zip(xs, hs, notes, strict=True):
                if note:
                    ax.annotate(note, (x, h), ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([k + width * (len(targets) - 1) / 2 for k in range(len(arms))], arms,
                      fontsize=8)
        ax.set(ylabel="speedup vs uniform",
               title=f"{dataset} / {model} (whiskers: {100 * CONFIDENCE:g}% interval over seeds)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out / "speedup.png")
    return "speedup.png"


def _scaling(out: Path, summary: Mapping[str, Any]) -> str:
    from matplotlib.figure import Figure

    points = scaling_points(summary)
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    labels = list(dict.fromkeys(a for arms in points.values() for a in arms))
    colors = palette(labels)
    for (dataset, model), arms in points.items():
        for arm, (workers, sps) in arms.items():
            ax.plot(workers, sps, "o-", color=colors[arm], label=f"{dataset}/{model} {arm}")
            ideal = [sps[0] * n / workers[0] for n in workers]
            ax.plot(workers, ideal, ":", color=colors[arm], lw=0.8)
    ax.set(xlabel="workers", ylabel="samples/s (median)", title="scaling (dotted: linear)")
    ax.set_xticks(sorted({n for arms in points.values() for w, _ in arms.values() for n in w}))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, out / "scaling.png", bbox_inches="tight")
    return "scaling.png"


def _save(fig: Any, path: Path, **options: Any) -> None:
    """Save ``fig`` as a PNG at ``path``: made in memory, then written atomically.

    So a disk that fills is one error naming ``path`` (see
    :func:`daskpri.data.store.write_atomic`), not a half-written PNG.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, **options)
    write_atomic(path, buffer.getvalue())
