"""The loop of one :meth:`Trainer.fit`: steps until its budget is spent.

:func:`check_fit` checks its arguments and opens its data (in the caller's
thread, for :meth:`Trainer.fit_in_background`); :func:`fit_loop` checks the
data against the model, sets the run up in the cluster, then takes steps (or
rounds), evaluating every ``eval_every`` steps and checkpointing every
``checkpoint_every``, until ``max_steps``, ``max_time``, ``target_accuracy``
or :meth:`Trainer.stop` ends it; where it ends it evaluates, sends the table
what it has not had and writes the last checkpoint. One fit runs at a time:
:data:`FIT_RUNNING` says why a second is refused.

The warnings here and in the methods the loop calls point at the caller's
line whatever the depth (:func:`daskpri._warnings.warn` skips daskpri's own
frames).

An interrupt (Jupyter's stop button, Ctrl-C) while a fit in the main thread
starts its cluster, sets its run up or steps ends it after what is in flight
(:func:`~daskpri.training._interrupts.stop_on_interrupt`), as the CLI's
Ctrl-C does.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import xarray as xr

from daskpri import _config
from daskpri._warnings import warn
from daskpri.training._checks import check_budget, open_data
from daskpri.training._inference import ChunkedEvalSet
from daskpri.training._interrupts import Interrupts, stop_on_interrupt, warn_workers_unshielded
from daskpri.training._waiting import WaitStopped
from daskpri.training.early_stopping import EarlyStopping, Watch
from daskpri.training.errors import FIT_RUNNING  # noqa: F401  (re-exported)
from daskpri.training.evaluation import EvalSet
from daskpri.training.recovery import SchedulerLostError, check_config
from daskpri.training.rounds import crossed

if TYPE_CHECKING:
    from daskpri.training.trainer import Trainer

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class FitRequest:
    """A fit's arguments, checked, with its data opened (see :func:`check_fit`)."""

    #: the data as the workers open it: a Dataset, or a store's absolute path
    source: xr.Dataset | str
    ds: xr.Dataset
    info: dict[str, Any]
    evalset: EvalSet | ChunkedEvalSet | None
    max_steps: int | None
    max_time: float | None
    target_accuracy: float | None
    progress: bool
    early_stopping: EarlyStopping | None = None
    callbacks: tuple[Callable[[Trainer, dict[str, Any]], Any], ...] = ()


def check_fit(
    trainer: Trainer,
    data: xr.Dataset | str,
    eval_data: xr.Dataset | str | None,
    *,
    max_steps: int | None,
    max_time: float | None,
    target_accuracy: float | None,
    progress: bool,
    eval_chunked: bool = False,
    early_stopping: EarlyStopping | int | None = None,
    callbacks: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
) -> FitRequest:
    """A fit's arguments checked, and its data opened (metadata only), as a request.

    The checks a fit makes before any work in the cluster, each cheap:
    :meth:`Trainer.fit_in_background` makes them in its caller's thread,
    so that a bad value raises there and not in the future.
    """
    check_budget(max_steps, max_time, target_accuracy, eval_data, eval_chunked)
    rule = EarlyStopping.from_argument(early_stopping)
    if rule is not None and eval_data is None:
        raise ValueError(f"early_stopping= needs eval_data= to watch its {rule.monitor} on")
    calls = check_callbacks(callbacks)
    if max_steps == 0:
        # a fit of no step is more likely a slip (an unset count) than what was meant, and
        # would set up a run in the cluster for nothing
        raise ValueError(
            "max_steps should be a positive integer, the trainer's total steps (a second fit "
            f"counts on from step_={trainer.step_}), but got max_steps=0"
        )
    if isinstance(data, str | os.PathLike):  # the workers open it, from their own directory
        data = os.path.abspath(data)
    ds, info, evalset = open_data(data, eval_data, eval_chunked)
    return FitRequest(data, ds, info, evalset, max_steps, max_time, target_accuracy, progress,
                      rule, calls)


def check_callbacks(
    callbacks: Callable[..., Any] | Sequence[Callable[..., Any]] | None,
) -> tuple[Callable[..., Any], ...]:
    """``fit``'s ``callbacks=`` as a tuple: ``None``, a callable, or a list or tuple of them.

    >>> check_callbacks(None), check_callbacks(print) == (print,)
    ((), True)
    >>> check_callbacks([print, "log"])
    Traceback (most recent call last):
    ...
    TypeError: callbacks should be a callable or a list of them, called as callback(trainer, record) after each step, but got 'log' among them
    """  # noqa: E501
    if callbacks is None:
        return ()
    if callable(callbacks):
        return (callbacks,)
    if isinstance(callbacks, list | tuple):
        for call in callbacks:
            if not callable(call):
                raise TypeError(f"{_CALLBACKS_ARE}, but got {call!r} among them")
        return tuple(callbacks)
    raise TypeError(f"{_CALLBACKS_ARE}, but got {callbacks!r}")


#: how a refusal of ``callbacks=`` begins
_CALLBACKS_ARE = ("callbacks should be a callable or a list of them, called as "
                  "callback(trainer, record) after each step")


def fit_loop(trainer: Trainer, request: FitRequest) -> xr.Dataset:
    """The body of :meth:`Trainer.fit`, its caller holding the trainer's ``_fitting``."""
    ds, evalset = request.ds, request.evalset
    t_setup = time.perf_counter()
    # the data and model, checked on the driver before the cluster is started or the
    # last data's run is released (an interrupt here raises at once: nothing to undo)
    key, n_classes = trainer._check_data(ds, request.info, request.source)
    if evalset is not None:
        evalset.check(n_classes)
    with stop_on_interrupt(trainer) as interrupt:
        warn_workers_unshielded(trainer)
        history = _set_up_and_step(trainer, request, key, n_classes, t_setup, interrupt)
    if interrupt.count:
        # raised here, where the fit has ended as at the end of its budget: its run,
        # history and checkpoint are whole, and a notebook's next cells do not run
        raise KeyboardInterrupt(interrupted_says(trainer, interrupt))
    return history


def interrupted_says(trainer: Trainer, interrupt: Interrupts) -> str:
    """The message of the ``KeyboardInterrupt`` of a fit that ``interrupt`` ended, by its phase.

    What the fit was doing at the first interrupt (:attr:`Interrupts.first`)
    says what it ended: a wait for workers (nothing set up), a set-up (the
    run set up, nothing trained) or its steps (those taken are kept).
    """
    kept = (f", checkpointed to {trainer.checkpoint_path}"
            if trainer.checkpoint_path is not None and trainer.checkpointed_step_ is not None
            else "")
    if interrupt.first == "waiting":
        return (f"the fit was interrupted while it waited for workers, before its set-up: "
                f"nothing was set up or trained (step_={trainer.step_}); fit again to wait "
                "for them again (daskpri.trainer.no-workers-timeout)")
    if interrupt.first == "setting up":
        return (f"the fit was interrupted during its set-up, before its first step: nothing "
                f"was trained (step_={trainer.step_}{kept}); fit again to train")
    return (f"the fit was interrupted and stopped at step_={trainer.step_}{kept}: its history "
            "is trainer.history_; fit again to go on")


def _set_up_and_step(
    trainer: Trainer,
    request: FitRequest,
    key: tuple[Any, ...],
    n_classes: int,
    t_setup: float,
    interrupts: Interrupts,
) -> xr.Dataset:
    """The run set up in the cluster (the trainer's LocalCluster started), then its steps.

    ``t_setup`` is when the fit's set-up began (``time.perf_counter()``).
    """
    ds, evalset = request.ds, request.evalset
    max_steps, max_time = request.max_steps, request.max_time
    target_accuracy = request.target_accuracy
    with trainer._blame_scheduler():
        trainer._drop_prefetched()  # left by a fit that raised
    trainer._kept = None  # the model may have changed since the last fit
    # read once per fit, so a bad value stops it before any work is sent
    trainer._prefetch_rounds = _config.get_bool("trainer.prefetch")
    trainer._keep_state = _config.get_bool("trainer.keep-state")
    hold = _config.get_bool("trainer.hold-workers")
    check_config()
    reopened = trainer._closed and trainer.step_ > 0
    try:
        trainer._prepare(ds, request.source, key, n_classes, interrupts)
    except WaitStopped:
        # stop() (or an interrupt) while the cluster had no workers for the run: no run
        # was set up, and the fit ends, as a stop before its first step does
        return trainer.history_
    if isinstance(evalset, ChunkedEvalSet) and trainer._client is not None:
        with trainer._blame_scheduler():  # its store read by every worker, before a step
            evalset.place(trainer._client, trainer.resources)
    trainer._closed = False
    if reopened:
        warn(
            f"this trainer was closed at step {trainer.step_}: this fit sets up a new run from "
            "the model's weights, its optimizer state and priorities afresh (step_ and the "
            "history go on counting); to go on exactly, save() before close() and "
            "Trainer.resume(path)"
        )
    trainer._setup_time += time.perf_counter() - t_setup
    interrupts.stepping = True

    from tqdm.auto import tqdm

    warn_past_schedule(trainer, max_steps)
    if max_steps is not None and trainer.step_ >= max_steps:
        # a notebook's fit cell run again: it returns at once, with the same history
        warn(
            f"max_steps={max_steps} is reached already (step_={trainer.step_}): max_steps "
            f"counts the steps of every fit of this trainer, so this one trains none; "
            f"pass max_steps={trainer.step_ + max_steps} to train {max_steps} more",
        )
    total = None if max_steps is None else max(0, max_steps - trainer.step_)
    release = hold_workers(trainer) if hold else None
    bar = tqdm(total=total, disable=not request.progress, desc=trainer.strategy.name, unit="step")
    start, start_step = trainer._elapsed, trainer.step_
    # this fit's early stopping (set once it steps: one that ends before leaves the last's)
    watch = None if request.early_stopping is None else Watch(request.early_stopping)
    last_watch, trainer._watched = trainer._watched, watch
    go_on_watching(trainer, watch, last_watch)
    try:
        while True:
            if trainer._stop_requested:
                break
            if max_steps is not None and trainer.step_ >= max_steps:
                break
            if max_time is not None and trainer._elapsed - start >= max_time:
                break
            before = trainer.step_
            with trainer._blame_scheduler():
                record = trainer._step(None if max_steps is None else max_steps - trainer.step_)
            patience_ran_out = False
            try:
                if evalset is not None and crossed(before, trainer.step_, trainer.eval_every):
                    evaluate(trainer, evalset, record)
                    if watch is not None:
                        patience_ran_out = watch.update(record["step"], record, trainer.model)
            finally:  # the step was taken: an interrupt in its evaluation keeps its record
                trainer._recorder.append(record)
            if trainer.checkpoint_every and crossed(
                before, trainer.step_, trainer.checkpoint_every
            ):
                with trainer._blame_scheduler():
                    write_checkpoint(trainer)
            for call in request.callbacks:  # (after the checkpoint: a raise keeps the step)
                call(trainer, dict(record))
            bar.update(trainer.step_ - before)
            postfix = {"loss": f"{record['loss']:.3f}"}
            if not math.isnan(record.get("accuracy", math.nan)):
                postfix["acc"] = f"{record['accuracy']:.3f}"
            bar.set_postfix(postfix, refresh=False)
            if target_accuracy is not None and record.get("accuracy", 0.0) >= target_accuracy:
                break
            if patience_ran_out:
                break
        if evalset is not None and trainer._recorder.records:
            last = trainer._recorder.records[-1]
            if math.isnan(last.get("accuracy", math.nan)):
                evaluate(trainer, evalset, last)
                if trainer.step_ > start_step:  # (a step of this fit): again, evaluated
                    if watch is not None:
                        watch.update(last["step"], last, trainer.model, last=True)
                    for call in request.callbacks:
                        call(trainer, dict(last))
        restored = False
        if watch is not None and trainer._recorder.records:
            # before the checkpoint, which then holds the weights the fit leaves
            restored = watch.restore(trainer.model, trainer._recorder.records[-1]["step"])
        with trainer._blame_scheduler():
            trainer._drop_prefetched()  # the round after the last: the table forgets it
            trainer._flush()
            if trainer.checkpoint_path is not None and (
                trainer._checkpointed != trainer.step_ or restored
            ):
                write_checkpoint(trainer)  # where the fit ended, whatever ended it
        if not interrupts.count and bar.total is not None and bar.n < bar.total:
            # ended by max_time, target_accuracy or stop() before max_steps: tqdm draws
            # a bar closed short of its total as failed (a notebook's turns red)
            bar.total = None
    except SchedulerLostError:
        release = None  # the scheduler is gone, and the hold with it: nothing to tell
        raise
    finally:
        bar.close()
        if release is not None:
            release()
    return trainer.history_


def go_on_watching(trainer: Trainer, watch: Watch | None, last: Watch | None) -> None:
    """Start ``watch`` (this fit's early stopping) from the last fit's, where it goes on.

    As ``max_steps`` and the history go on from fit to fit, so does early
    stopping: a fit given the same rule as the trainer's last fit goes on
    with its watch (the best evaluation, its weights, the evaluations
    since), unless that watch ended its fit (``patience`` run out) or put
    the best weights back (:attr:`Watch.goes_on`). A checkpoint keeps such
    a watch, and the first fit of the trainer resumed from it goes on with
    it where it is given the same rule, as the run would have gone on
    without the break; another rule, or none, watches afresh, saying so.
    """
    resumed, trainer._resumed_watch = trainer._resumed_watch, None
    if resumed is None:
        if watch is not None and last is not None and last.goes_on and last.rule == watch.rule:
            watch.load_state_dict(last.state_dict())
        return
    rule = EarlyStopping(**resumed["rule"])
    if watch is not None and watch.rule == rule:
        watch.load_state_dict(resumed)
        return
    best = ("no evaluation yet" if resumed["best_step"] is None else
            f"its best {rule.monitor} {resumed['best_score']:.4g} at step {resumed['best_step']}, "
            f"{resumed['waited']} evaluation(s) since")
    this = "has none" if watch is None else f"has {watch.rule!r}, which watches afresh"
    warn(f"the checkpoint this trainer resumed was written during a fit with "
         f"early_stopping={rule!r} ({best}), and this fit {this}; pass the same "
         "early_stopping to go on with its watch")


def hold_workers(trainer: Trainer) -> Callable[[], None]:
    """Keep the fit's workers from an adaptive cluster's scale-down; the call that lets go.

    ``daskpri.trainer.hold-workers``. The steps reach the workers as RPCs
    (``transport="direct"``) or brief tasks, which leave them idle to the
    scheduler between steps, so ``cluster.adapt()`` would retire them
    mid-fit: each retirement a re-plan (the partitions moved), the fit left
    on ``minimum`` workers. The table's scheduler plugin names them to
    Dask's ``valid_workers_downscaling`` hook (workers that join the run are
    held too); once the fit ends they are let go, and an adaptive cluster
    may retire them as idle.
    """
    table, deployment = trainer._remote, trainer._deployment
    assert deployment is not None
    with trainer._blame_scheduler():
        table.hold(deployment.slots)

    def release() -> None:
        try:  # bounded: a scheduler that stopped answering must not hold the fit's end
            table.hold([], timeout=_config.get_seconds("trainer.scheduler-timeout"))
        except Exception as e:  # the run closed meanwhile (the hold went with it)
            logger.debug("letting the workers of run %s go: %r", table.run, e)

    return release


def write_checkpoint(trainer: Trainer) -> None:
    """Write the checkpoint to ``checkpoint_path`` (reads the table from the scheduler)."""
    trainer.save(trainer.checkpoint_path)  # type: ignore[arg-type]
    trainer._checkpointed = trainer.step_


def warn_past_schedule(trainer: Trainer, max_steps: int | None) -> None:
    """Warn where this fit may step past the end of a decaying learning-rate schedule."""
    end = trainer.schedule_steps
    if trainer.lr_schedule == "constant" or end is None:
        return
    if max_steps is not None and max_steps <= end:
        return
    reach = "has no max_steps" if max_steps is None else f"runs to step {max_steps}"
    warn(
        f"lr_schedule={trainer.lr_schedule!r} decays to 0 at step {end} (schedule_steps), "
        f"but this fit {reach}: every step past {end} trains at learning rate 0 and "
        f"leaves the model as it is; pass max_steps={end} or less, or, to go on "
        f"training a checkpointed run, resume it with a longer schedule: "
        f"Trainer.resume(path, schedule_steps=...)",
    )


def evaluate(trainer: Trainer, evalset: EvalSet | ChunkedEvalSet,
             record: dict[str, Any]) -> None:
    """Evaluate the master model on ``evalset`` into ``record`` (with the time it took)."""
    t0 = time.perf_counter()
    if isinstance(evalset, ChunkedEvalSet):  # on the cluster
        with trainer._blame_scheduler():
            acc, loss = evalset.evaluate(trainer.model, trainer._client)
    else:
        acc, loss = evalset.evaluate(trainer.model)
    record["accuracy"], record["eval_loss"] = acc, loss
    record["eval_time"] = time.perf_counter() - t0
