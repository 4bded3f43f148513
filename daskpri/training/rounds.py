"""One step (or round of local steps) as the driver sees it: the workers' results combined.

Pure functions of the workers' :class:`~daskpri.replicas.worker.StepResult`
objects: their sums, the model update, the check for NaN or infinite values,
the priorities to send back to the table, and the step's history record.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from daskpri.replicas.worker import StepResult
from daskpri.strategies import Selection


@dataclass
class Combined:
    """The workers' results of one step or round, added up.

    Attributes
    ----------
    results : list of StepResult
        One per worker slot, in slot order.
    n_grad, loss_sum, n_loss : int, float, int
        Samples in the gradient, and the summed loss over ``n_loss`` samples.
    update : torch.Tensor
        The summed gradient (one step), or the workers' mean parameters (a
        round of local steps).
    buffers : dict or None
        The module's buffers after the step, combined over the workers that
        ran a forward pass (see :func:`mean_buffers`); None for a module
        without buffers.
    """

    results: list[StepResult]
    n_grad: int
    loss_sum: float
    n_loss: int
    update: torch.Tensor
    buffers: dict[str, torch.Tensor] | None = None


def combine(results: list[StepResult], local_steps: int) -> Combined:
    """Add up the workers' results of a step (``local_steps == 1``) or a round."""
    n_grad = sum(r.n_grad for r in results)
    loss_sum = sum(r.loss_sum for r in results)
    n_loss = sum(r.n_loss for r in results)
    if local_steps > 1:
        update = torch.stack([r.params for r in results if r.params is not None]).mean(0)
    else:
        update = torch.zeros_like(results[0].grad)
        for r in results:
            update += r.grad
    return Combined(results, n_grad, loss_sum, n_loss, update, mean_buffers(results))


def mean_buffers(results: list[StepResult]) -> dict[str, torch.Tensor] | None:
    """The workers' buffers after a step, as the master's next ones.

    Floating buffers (batch norm's running mean and variance) are averaged
    over the workers that ran a forward pass, as their parameters are after
    a round; with equal shares the running mean then moves towards the mean
    of the step's whole batch. Counters (``num_batches_tracked``) take the
    largest. None when no worker returned buffers.

    Examples
    --------
    >>> def result(v):
    ...     buffers = {"mean": torch.tensor([float(v)]), "n": torch.tensor(v)}
    ...     return StepResult(torch.empty(0), 0, np.empty(0), np.empty(0), 0.0, 0, 0, 0.0,
    ...                       "", "", 0, buffers=buffers)
    >>> r = [result(1), result(3)]
    >>> b = mean_buffers(r)
    >>> b["mean"].tolist(), int(b["n"])
    ([2.0], 3)
    """
    buffers = [r.buffers for r in results if r.buffers is not None]
    if not buffers:
        return None
    out = {}
    for name, first in buffers[0].items():
        stacked = torch.stack([b[name] for b in buffers])
        out[name] = stacked.mean(0) if first.is_floating_point() else stacked.amax(0)
    return out


def nonfinite(total: Combined, step: int, count: int, local_steps: int) -> str | None:
    """What became NaN or infinite in the ``count`` steps from ``step``, or None.

    The samples of non-finite priorities are named once each, though a
    strategy that draws with replacement may have trained one twice.

    Examples
    --------
    >>> def result(indices, priorities):
    ...     return StepResult(torch.empty(0), 0, np.array(indices), np.array(priorities),
    ...                       float("nan"), 0, 0, 0.0, "", "", 0)
    >>> nan = float("nan")
    >>> total = Combined([result([6, 6, 2], [nan, nan, 1.0]), result([9, 6], [nan, nan])],
    ...                  0, nan, 0, torch.zeros(1), None)
    >>> nonfinite(total, 4, 1, 1)
    'the training loss became nan at step 4; non-finite priorities for samples [6, 9]'
    """
    results, loss_sum = total.results, total.loss_sum
    where = f"step {step}" if count == 1 else f"steps {step}-{step + count - 1}"
    if not math.isfinite(loss_sum):
        bad = np.unique(np.concatenate([r.indices[~np.isfinite(r.priorities)] for r in results]))
        return f"the training loss became {loss_sum} at {where}" + (
            f"; non-finite priorities for samples {bad[:10].tolist()}" if bad.size else ""
        )
    if not bool(torch.isfinite(total.update).all()):
        what = "gradient" if local_steps == 1 else "parameters"
        return f"the {what} became non-finite at {where} (loss {loss_sum / max(total.n_loss, 1)})"
    for name, value in (total.buffers or {}).items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return f"the buffer {name!r} became non-finite at {where}"
    return None


def fresh_priorities(
    results: list[StepResult], version: int
) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """The finite priorities the workers computed, for the table, as of step ``version``."""
    pending = []
    for r in results:
        ok = np.isfinite(r.priorities)
        if ok.any():
            pending.append((r.indices[ok], r.priorities[ok], version))
    return pending


def step_record(
    total: Combined,
    selection_digest: float,
    *,
    step: int,
    skipped: bool,
    elapsed: float,
    rate: float,
    prev: dict[str, Any],
    step_time: float,
    selection_time: float,
    optimizer_time: float,
    selected_ahead: bool,
) -> dict[str, Any]:
    """The history record of a step (or round) that ended at ``step``.

    ``prev`` is the record before it (``{}`` for the first), from which the
    sample counts go on; ``elapsed`` is the training time so far.
    """
    results = total.results
    n_loss = total.n_loss
    prio = np.concatenate([r.priorities for r in results]) if results else np.empty(0)
    compute = max(r.compute_seconds for r in results)
    n_samples = sum(r.indices.size for r in results)
    return {
        "step": step,
        "selection_digest": selection_digest,
        "skipped": float(skipped),
        "time": elapsed,
        # a step that trained on no samples has no loss: NaN, not 0.0
        "loss": total.loss_sum / n_loss if n_loss else math.nan,
        "lr": rate,
        "train_accuracy": sum(r.correct for r in results) / n_loss if n_loss else math.nan,
        "samples": prev.get("samples", 0) + n_samples,
        "grad_samples": prev.get("grad_samples", 0) + total.n_grad,
        "samples_per_second": n_samples / step_time,
        "step_time": step_time,
        "compute_time": compute,
        "selection_time": selection_time,
        "selected_ahead": float(selected_ahead),
        "optimizer_time": optimizer_time,
        "communication_time": max(0.0, step_time - selection_time - compute - optimizer_time),
        "n_workers": len(results),
        "priority_mean": float(prio.mean()) if prio.size else math.nan,
        "priority_max": float(prio.max()) if prio.size else math.nan,
        "worker_samples": [r.indices.size for r in results],
        "worker_compute_time": [r.compute_seconds for r in results],
    }


def crossed(before: int, after: int, every: int) -> bool:
    """Whether a multiple of ``every`` lies in ``(before, after]``."""
    return after // every > before // every


def whole_rounds(every: int, local_steps: int) -> int:
    """``every`` steps, rounded to whole rounds of ``local_steps`` (one at least).

    A run evaluates at the end of the round in which a multiple of its
    period falls (:func:`crossed`); a period of whole rounds falls every so
    many rounds, where 20 steps with rounds of 16 would fall in 4 rounds of
    5, leaving one out.

    Examples
    --------
    >>> whole_rounds(20, 1), whole_rounds(20, 16), whole_rounds(50, 16), whole_rounds(20, 512)
    (20, 16, 48, 512)
    """
    return local_steps * max(1, round(every / local_steps))


def in_whole_rounds(every: int, local_steps: int) -> bool:
    """Whether a period of ``every`` steps evaluates evenly in rounds of ``local_steps``.

    At most a round (every round) or a whole number of rounds; another
    leaves some rounds out and not others (:func:`whole_rounds`).

    Examples
    --------
    >>> [in_whole_rounds(every, k) for every, k in [(32, 16), (4, 16), (20, 1), (20, 16)]]
    [True, True, True, False]
    """
    return every <= local_steps or every % local_steps == 0


def digest(selections: list[Selection]) -> float:
    """CRC-32 of a step's selected samples (exact in a float64 history)."""
    if not selections:
        return 0.0
    # one CRC over the concatenation: the same as chaining one per selection
    trains = np.concatenate([np.asarray(s.train, dtype=np.int64) for s in selections])
    return float(zlib.crc32(trains.tobytes()))
