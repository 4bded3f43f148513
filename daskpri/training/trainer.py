"""The trainer: prioritized data-parallel SGD driven from the client.

Each step: the cluster-held table applies the last step's priorities and
selects this step's samples per worker (one RPC); the driver ships the current
weights (CPU tensors, scattered once per step) and one task per worker; each
worker computes the gradient and fresh priorities on its own partitions; the
driver combines the gradients and steps its optimizer.

This module holds the :class:`Trainer`'s public face: its parameters, the fit
loop, checkpoints and results. Its arguments are checked in ``_checks``; the
run in the cluster and each step are its ``_run.RunMixin``; the partitions
and replicas on the workers, and re-planning after losing some, are a
:class:`~daskpri.training.deployment.Deployment`; the workers' results of a
step are combined in :mod:`~daskpri.training.rounds`; a lost scheduler and
the timeouts are in :mod:`~daskpri.training.recovery`.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import inspect
import math
import os
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import dask
import numpy as np
import torch
import xarray as xr
from distributed import Client, LocalCluster
from distributed.security import Security
from torch import nn

from daskpri import _config
from daskpri._warnings import DaskpriWarning
from daskpri.models import from_spec
from daskpri.strategies import STRATEGIES, Strategy, get_strategy, unknown_options
from daskpri.table.plugin import RemoteTable
from daskpri.table.staleness import validate_staleness
from daskpri.training import checkpoint
from daskpri.training._checks import (
    check_budget,
    check_checkpoint,
    check_choice,
    check_device,
    check_eval_every,
    check_float,
    check_int,
    check_local_steps,
    check_real,
    check_security,
    check_strategy_model,
    check_types,
    open_data,
)
from daskpri.training._run import RunMixin
from daskpri.training.cluster import local_cluster, stop_heartbeats
from daskpri.training.deployment import Deployment
from daskpri.training.evaluation import EvalSet
from daskpri.training.history import HistoryRecorder
from daskpri.training.placement import parse_resources
from daskpri.training.recovery import (
    SchedulerLostError,
    blame_scheduler,
    check_config,
    dask_timeout,
)
from daskpri.training.rounds import crossed
from daskpri.training.schedule import validate_schedule

# SchedulerLostError and dask_timeout moved to recovery; they are still
# importable from here.
__all__ = ["SchedulerLostError", "Trainer", "dask_timeout"]

#: The constructor's parameters besides the model and strategy, as a
#: checkpoint keeps them for :meth:`Trainer.resume`.
_INIT_PARAMS = (
    "seed", "n_workers", "resources", "batch_size", "learning_rate", "momentum",
    "weight_decay", "max_grad_norm", "optimizer", "lr_schedule", "schedule_steps", "local_steps",
    "eval_every", "partition_size", "staleness", "device", "checkpoint_path", "checkpoint_every",
    "transport", "on_nonfinite",
)

#: The trainers not garbage-collected yet, for :func:`_close_at_exit`.
#: Each optimizer's learning rate where neither the argument nor the config
#: (``daskpri.trainer.learning-rate``, null by default) gives one. SGD's
#: (with the default momentum 0.9) from ``daskpri bench``: every arm's best
#: rate on its four models lay in 0.075-0.3, uniform's in 0.1-0.3; Adam's is
#: torch's own.
LEARNING_RATES = {"sgd": 0.1, "adam": 0.001}

_TRAINERS: weakref.WeakSet[Trainer] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close the trainers never closed (no ``close()``, no ``with``) while their clusters run.

    At exit distributed closes the clusters still open, from an ``atexit`` hook
    registered when it was imported, before this one, so after this runs; a
    worker removed while a client holds data scattered to it (a trainer's
    partitions) makes the scheduler log an ERROR that the data is lost.
    """
    for trainer in list(_TRAINERS):
        client = trainer._client
        if client is not None and client.status == "running":
            with contextlib.suppress(Exception):  # the cluster may be going already
                trainer.close()


#: Why a second fit is refused while one runs.
_FIT_RUNNING = (
    "a fit is already running (fit_in_background's, or another thread's): stop() it and wait "
    "for its future, or wait for it to end, before fitting again"
)


class Trainer(RunMixin):
    """Prioritized data-parallel SGD of a PyTorch module on a Dask cluster.

    Parameters
    ----------
    model : torch.nn.Module
        The module to train; the trainer's copy is the master, replicas are
        built from it on every worker.
    strategy : str or Strategy
        A registered name (``"uniform"``, ``"projection"``, ``"length"``,
        ``"loss"``, ``"selective-backprop"``, ``"upper-bound"``,
        ``"infobatch"``; see ``daskpri.STRATEGIES``) or a
        :class:`~daskpri.strategies.Strategy`. The default,
        ``"selective-backprop"`` with its defaults, took the fewest steps
        to the benchmark's targets on every model measured; the paper's
        own ``"projection"`` learns less than uniform sampling in as many
        steps there (the README's "Which to use").
    client : distributed.Client, optional
        The cluster to use. ``None`` starts a LocalCluster of ``n_workers``
        (one thread each, bound to 127.0.0.1), closed by :meth:`close`.
    seed : int
        Seeds every random choice of the run; the same seed and cluster size
        give the same selections.
    n_workers : int, optional
        Workers of the LocalCluster started when ``client`` is None (2), or
        the number of the client's workers to use (all).
    resources : dict or str, optional
        Resources each training task requires, e.g. ``{"GPU": 1}``. ``None``
        asks for ``{"GPU": 1}`` when the cluster's workers have GPUs.
    batch_size, learning_rate, momentum, weight_decay, optimizer
        Samples per worker per step, and the driver's optimizer (``"sgd"``
        or ``"adam"``); ``None`` reads the ``daskpri.trainer`` config. Its
        ``learning-rate`` is null, which takes the optimizer's own rate
        (:data:`LEARNING_RATES`: 0.1 for SGD, 0.001 for Adam).
    max_grad_norm : float, optional
        Clip the gradient of each optimizer step to this L2 norm over all
        parameters (``torch.nn.utils.clip_grad_norm_``): the mean gradient
        of the workers at a synchronous step, as DDP users clip after the
        all-reduce, and each worker's own gradient at a local step. ``None``
        reads ``daskpri.trainer.max-grad-norm`` (null: no clipping). It
        keeps a learning rate that the high-loss samples a prioritized
        strategy picks would make diverge from blowing up a run.
    lr_schedule : {"constant", "cosine", "linear"}
        How the learning rate changes with the step: constant, or decaying
        from ``learning_rate`` to zero over ``schedule_steps`` steps (a
        function of the step count, so a resumed run follows it exactly).
    schedule_steps : int, optional
        Length of a decaying schedule, usually the run's ``max_steps``.
    local_steps : int
        Optimizer steps each worker takes per round trip. 1 (the default) is
        synchronous data-parallel SGD: every step combines all workers'
        gradients. ``k > 1`` is local SGD: each worker takes ``k`` steps on
        its own samples, then the driver averages the workers' parameters
        and optimizer states; one round trip carries ``k`` steps, which pays
        where steps are short. With one worker it is the plain optimizer.
        The table selects the round's ``k`` steps at once, so strategies
        that pick by the previous step's priorities (``projection``,
        ``length``) need ``local_steps=1``.
    eval_every : int, optional
        Steps between evaluations on ``eval_data``. A run evaluates at the
        end of the round of ``local_steps`` in which a multiple of it falls,
        so with ``local_steps > 1`` it should be a whole number of rounds
        (or at most one, every round): another warns, as its evaluations
        are unevenly spaced. ``None`` reads ``daskpri.trainer.eval-every``
        (50) and rounds it to whole rounds (48 steps with rounds of 16).
    partition_size : int, optional
        Samples per partition for data not chunked along ``sample``.
    staleness : str, optional
        Staleness model of the table: ``"keep"``, ``"exp-linear"``,
        ``"exp-quadratic"``.
    device : str, optional
        Force the replicas' device (default: each worker's GPU, else CPU).
    checkpoint_path, checkpoint_every : optional
        Write a checkpoint to ``checkpoint_path`` every ``checkpoint_every``
        steps and where each :meth:`fit` ends (its budget spent, its target
        reached, or :meth:`stop`; atomically; see :meth:`save` and
        :meth:`resume`).
    on_nonfinite : {"raise", "skip"}
        A step whose loss or gradient is NaN or infinite: ``"raise"`` stops
        with ``FloatingPointError`` naming the step and samples (after
        checkpointing the last good state where ``checkpoint_path`` is set);
        ``"skip"`` leaves the model as it is, counts it in ``skipped_steps_``
        and the history's ``skipped``, and goes on.
    transport : {"tasks", "direct"}, optional
        How steps reach the workers. ``"tasks"``: one Dask task per worker,
        through the scheduler, with ``resources`` accounted by it.
        ``"direct"``: one RPC per worker straight from the driver to the
        worker's replica, an order of magnitude less latency per step; the
        workers are still only those that have ``resources``.
    security : distributed.security.Security or bool, optional
        TLS for the LocalCluster the trainer starts (``True``: temporary
        self-signed credentials). A ``client`` brings its own security.
    **strategy_options
        Passed to the strategy named by ``strategy`` (``k``, ``renew``, ...).

    Attributes
    ----------
    history_ : xarray.Dataset
        Metrics along ``step``: a record per step, or with ``local_steps``
        one per round, at the round's last step (``step`` 15, 31, ... for
        rounds of 16). ``accuracy`` and ``eval_loss`` are NaN between
        evaluations: ``history_.accuracy.dropna("step")`` to plot them.
    table_ : xarray.DataArray
        The current priorities along ``sample`` (with the data's ``sample``
        coordinate, where it has one).
    step_ : int
        Steps taken over all calls of :meth:`fit`.

    Examples
    --------
    >>> import daskpri
    >>> train, test = daskpri.datasets.load("mnist1d")  # doctest: +SKIP
    >>> model = daskpri.models.build_model("mlp", train)  # doctest: +SKIP
    >>> with daskpri.Trainer(model, seed=0) as trainer:  # doctest: +SKIP
    ...     history = trainer.fit(train, eval_data=test, max_steps=500)
    """

    def __init__(
        self,
        model: nn.Module,
        strategy: str | Strategy = "selective-backprop",
        client: Client | None = None,
        seed: int = 0,
        n_workers: int | None = None,
        resources: Mapping[str, float] | str | None = None,
        *,
        batch_size: int | None = None,
        learning_rate: float | None = None,
        momentum: float | None = None,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = None,
        optimizer: str | None = None,
        lr_schedule: str = "constant",
        schedule_steps: int | None = None,
        local_steps: int = 1,
        eval_every: int | None = None,
        partition_size: int | None = None,
        staleness: str | None = None,
        device: str | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        checkpoint_every: int | None = None,
        security: Security | bool | None = None,
        transport: str | None = None,
        on_nonfinite: str = "raise",
        **strategy_options: Any,
    ) -> None:
        check_types(model, client)
        self.model = model
        if isinstance(strategy, str) and strategy in STRATEGIES:
            # a misspelled Trainer argument lands among the strategy's options
            allowed, unknown = unknown_options(strategy, strategy_options)
            if unknown:
                raise ValueError(
                    f"Trainer got {', '.join(unknown)}: neither a Trainer argument nor an "
                    f"option of strategy {strategy!r} ({', '.join(allowed) or 'none'})"
                )
        self.strategy = get_strategy(strategy, **strategy_options)
        self.seed = check_int("seed", seed, minimum=0)
        self.n_workers = (
            None if n_workers is None else check_int("n_workers", n_workers, minimum=1)
        )
        self.resources = parse_resources(resources)
        self.batch_size = check_int("batch_size", _config.get("trainer.batch-size", batch_size), 1)
        self.momentum = check_real("momentum", _config.get("trainer.momentum", momentum), 0.0, 1.0)
        self.weight_decay = check_real("weight_decay", weight_decay, 0.0, math.inf)
        norm = _config.get("trainer.max-grad-norm", max_grad_norm)
        self.max_grad_norm = None if norm is None else check_float("max_grad_norm", norm)
        self.optimizer = check_choice(
            "optimizer", _config.get("trainer.optimizer", optimizer), tuple(LEARNING_RATES)
        )
        # null in the config (the default): the optimizer's own rate
        rate = _config.get("trainer.learning-rate", learning_rate)
        self.learning_rate = check_float(
            "learning_rate", LEARNING_RATES[self.optimizer] if rate is None else rate
        )
        self.lr_schedule, self.schedule_steps = validate_schedule(lr_schedule, schedule_steps)
        self.local_steps = check_local_steps(local_steps, self.strategy)
        check_strategy_model(self.strategy, model)
        self.eval_every = check_eval_every(
            eval_every, _config.get("trainer.eval-every"), self.local_steps
        )
        self.partition_size = (
            None if partition_size is None else check_int("partition_size", partition_size, 1)
        )
        self.staleness = validate_staleness(_config.get("table.staleness", staleness))
        self.device = check_device(device)
        self.checkpoint_path = check_checkpoint(checkpoint_path, checkpoint_every)
        self.checkpoint_every = checkpoint_every
        self._own_cluster: LocalCluster | None = None
        self._client = client
        self.security = check_security(security, client)
        self.on_nonfinite = check_choice("on_nonfinite", on_nonfinite, ("raise", "skip"))
        self.skipped_steps_ = 0
        self._excluded: set[str] = set()
        self._setup_time = 0.0
        self.transport = check_choice(
            "transport", _config.get("trainer.transport", transport), ("tasks", "direct")
        )
        self.run_id = f"{self.strategy.name}-{uuid.uuid4().hex[:8]}"
        self.step_ = 0
        self._recorder = HistoryRecorder()
        self._opt: torch.optim.Optimizer | None = None
        self._mean_grad: torch.Tensor | None = None
        self._pending: list[tuple[np.ndarray, np.ndarray, int]] = []
        self._data_key: tuple[Any, ...] | None = None
        self._elapsed = 0.0
        self._deployment: Deployment | None = None
        self._table: RemoteTable | None = None
        self._resume_state: dict[str, Any] | None = None
        self._background: concurrent.futures.Future[xr.Dataset] | None = None
        # a plain flag: set from a signal handler, where a lock could deadlock
        self._stop_requested = False
        self._prefetched = None
        self._metrics_sent = 0
        self._fit_thread: int | None = None  # the thread running a fit, if one does
        self._fitting = threading.Lock()  # held from a fit's call to its end: one at a time
        self._starting = threading.Lock()  # held while the trainer starts its LocalCluster
        # closes the run in the cluster if the trainer is collected without close()
        self._abandoned = None
        self._sample_coord = None
        self._scheduler_address: str | None = None
        self._checkpointed = -1  # the step last written to checkpoint_path
        # (worker, name) of the state that a lone worker kept after the last
        # round, equal to the master's; None when the master's must be sent
        self._kept = None
        self._prefetch_rounds = True
        self._keep_state = True
        _TRAINERS.add(self)

    # -- cluster -------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The client in use (a LocalCluster's, started on first use)."""
        if self._client is None:
            # a background fit and a call from the caller's thread (dashboard())
            # may both start it: one cluster, not two
            with self._starting:
                if self._client is None:
                    self._own_cluster = local_cluster(
                        self.n_workers or 2, resources=self.resources, security=self.security
                    )
                    self._client = Client(self._own_cluster)
        if self._client.status in ("closing", "closed"):
            raise RuntimeError(
                f"the trainer's client is {self._client.status}: the run's cluster is out of "
                "reach; give a new Trainer a running client (Trainer.resume(path, client=...) "
                "goes on from a checkpoint)"
            )
        return self._client

    def close(self) -> None:
        """Release the run's state in the cluster; close a cluster we started.

        A fit running in the background (:meth:`fit_in_background`) is
        stopped first, after its step in flight, and waited for: its future
        keeps the history so far.
        """
        background = self._background
        if (background is not None and not background.done()
                and self._fit_thread != threading.get_ident()):
            self.stop()
            concurrent.futures.wait([background])
        self._release()
        if self._own_cluster is not None:
            stop_heartbeats(self._client)  # type: ignore[arg-type]
            self._client.close()  # type: ignore[union-attr]
            self._own_cluster.close()
            self._own_cluster = self._client = None

    def __repr__(self) -> str:
        client = self._client
        if client is None:
            where = "no cluster yet"
        elif client.status != "running" or client.scheduler is None:
            where = f"a {client.status} client"
        else:
            slots = len(self._deployment.slots) if self._deployment is not None else 0
            where = f"{slots} worker(s) of {client.scheduler.address}"
        fitting = ", fitting" if self._fitting.locked() else ""
        return f"<Trainer {self.strategy!r}, step {self.step_}, {where}{fitting}>"

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- fit -----------------------------------------------------------------

    def fit(
        self,
        data: xr.Dataset | str,
        eval_data: xr.Dataset | str | None = None,
        *,
        max_steps: int | None = None,
        max_time: float | None = None,
        target_accuracy: float | None = None,
        progress: bool = True,
    ) -> xr.Dataset:
        """Train on ``data`` until ``max_steps``, ``max_time`` or ``target_accuracy``.

        Parameters
        ----------
        data : xarray.Dataset or path
            Variables ``x`` and ``y`` along ``sample``, in memory or in a zarr
            store / netCDF file (read partition by partition on the workers).
        eval_data : xarray.Dataset or path, optional
            Evaluated every ``eval_every`` steps and at the end, on the
            driver: on its GPU where it has one, else its CPU (the
            ``daskpri.trainer.eval-device`` setting chooses another).
        max_steps : int, optional
            Total steps of the trainer (a second ``fit`` continues counting).
        max_time : float, optional
            Seconds of training in this call (as the history's ``time``
            counts them: evaluation excluded).
        target_accuracy : float, optional
            Stop once the accuracy on ``eval_data`` reaches it.
        progress : bool
            Show a progress bar.

        Returns
        -------
        xarray.Dataset
            The history, also in ``history_``.
        """
        if not self._fitting.acquire(blocking=False):
            raise RuntimeError(_FIT_RUNNING)
        try:
            return self._fit_holding(data, eval_data, max_steps=max_steps, max_time=max_time,
                                     target_accuracy=target_accuracy, progress=progress)
        finally:
            self._fitting.release()

    def _fit_holding(self, data: xr.Dataset | str, eval_data: xr.Dataset | str | None,
                     **kwargs: Any) -> xr.Dataset:
        """:meth:`fit`, its caller holding ``_fitting`` (one fit at a time)."""
        self._fit_thread = threading.get_ident()
        try:
            return self._fit(data, eval_data, **kwargs)
        finally:
            self._fit_thread = None
            self._stop_requested = False  # a stop is spent by the fit it ended

    def _fit(
        self,
        data: xr.Dataset | str,
        eval_data: xr.Dataset | str | None,
        *,
        max_steps: int | None,
        max_time: float | None,
        target_accuracy: float | None,
        progress: bool,
    ) -> xr.Dataset:
        check_budget(max_steps, max_time, target_accuracy, eval_data)
        if isinstance(data, str | os.PathLike):  # the workers open it, from their own directory
            data = os.path.abspath(data)
        ds, info, evalset = open_data(data, eval_data)
        t_setup = time.perf_counter()
        with self._blame_scheduler():
            self._drop_prefetched()  # left by a fit that raised
        self._kept = None  # the model may have changed since the last fit
        # read once per fit, so a bad value stops it before any work is sent
        self._prefetch_rounds = _config.get_bool("trainer.prefetch")
        self._keep_state = _config.get_bool("trainer.keep-state")
        check_config()
        self._prepare(ds, info, data)
        self._setup_time += time.perf_counter() - t_setup
        if evalset is not None:
            evalset.check(self._n_classes)

        from tqdm.auto import tqdm

        self._warn_past_schedule(max_steps)
        if max_steps and self.step_ >= max_steps:
            # a notebook's fit cell run again: it returns at once, with the same history
            # (max_steps=0 asks for no step: it sets the run up)
            warnings.warn(
                f"max_steps={max_steps} is reached already (step_={self.step_}): max_steps "
                f"counts the steps of every fit of this trainer, so this one trains none; "
                f"pass max_steps={self.step_ + max_steps} to train {max_steps} more",
                DaskpriWarning,
                stacklevel=4,
            )
        total = None if max_steps is None else max(0, max_steps - self.step_)
        bar = tqdm(total=total, disable=not progress, desc=self.strategy.name, unit="step")
        start = self._elapsed
        try:
            while True:
                if self._stop_requested:
                    break
                if max_steps is not None and self.step_ >= max_steps:
                    break
                if max_time is not None and self._elapsed - start >= max_time:
                    break
                before = self.step_
                with self._blame_scheduler():
                    record = self._step(None if max_steps is None else max_steps - self.step_)
                if evalset is not None and crossed(before, self.step_, self.eval_every):
                    self._evaluate(evalset, record)
                self._recorder.append(record)
                if self.checkpoint_every and crossed(before, self.step_, self.checkpoint_every):
                    with self._blame_scheduler():
                        self._checkpoint()
                bar.update(self.step_ - before)
                postfix = {"loss": f"{record['loss']:.3f}"}
                if not math.isnan(record.get("accuracy", math.nan)):
                    postfix["acc"] = f"{record['accuracy']:.3f}"
                bar.set_postfix(postfix, refresh=False)
                if target_accuracy is not None and record.get("accuracy", 0.0) >= target_accuracy:
                    break
            if evalset is not None and self._recorder.records:
                last = self._recorder.records[-1]
                if math.isnan(last.get("accuracy", math.nan)):
                    self._evaluate(evalset, last)
            with self._blame_scheduler():
                self._drop_prefetched()  # the round after the last: the table forgets it
                self._flush()
                if self.checkpoint_path is not None and self._checkpointed != self.step_:
                    self._checkpoint()  # where the fit ended, whatever ended it
        finally:
            bar.close()
        return self.history_

    def _checkpoint(self) -> None:
        """Write the checkpoint to ``checkpoint_path`` (reads the table from the scheduler)."""
        self.save(self.checkpoint_path)  # type: ignore[arg-type]
        self._checkpointed = self.step_

    def _warn_past_schedule(self, max_steps: int | None) -> None:
        """Warn where this fit may step past the end of a decaying learning-rate schedule."""
        end = self.schedule_steps
        if self.lr_schedule == "constant" or end is None:
            return
        if max_steps is not None and max_steps <= end:
            return
        reach = "has no max_steps" if max_steps is None else f"runs to step {max_steps}"
        warnings.warn(
            f"lr_schedule={self.lr_schedule!r} decays to 0 at step {end} (schedule_steps), "
            f"but this fit {reach}: every step past {end} trains at learning rate 0 and "
            f"leaves the model as it is; pass max_steps={end} or less, or, to go on "
            f"training a checkpointed run, resume it with a longer schedule: "
            f"Trainer.resume(path, schedule_steps=...)",
            DaskpriWarning,
            stacklevel=5,
        )

    def _evaluate(self, evalset: EvalSet, record: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        acc, loss = evalset.evaluate(self.model)
        record["accuracy"], record["eval_loss"] = acc, loss
        record["eval_time"] = time.perf_counter() - t0

    def stop(self) -> None:
        """End the running :meth:`fit` after the step (or round) in flight.

        That fit evaluates, keeps its history and returns it as if its
        budget were spent; the trainer can fit again afterwards. Safe to call
        from any thread or a signal handler, for example while
        :meth:`fit_in_background` runs. Called when no fit runs, it ends the
        next one before its first step (a stop that lands as a fit ends on
        its own may so end the next one).

        Examples
        --------
        >>> future = trainer.fit_in_background(train, max_time=600)  # doctest: +SKIP
        >>> trainer.stop()  # doctest: +SKIP
        >>> history = future.result()  # the steps made so far  # doctest: +SKIP
        """
        self._stop_requested = True

    def _blame_scheduler(self) -> contextlib.AbstractContextManager[None]:
        """Turn a failure of the cluster into :class:`SchedulerLostError` if the scheduler is gone.

        The user's errors (``ValueError``, ``TypeError``, ``FloatingPointError``)
        pass as they are.
        """
        return blame_scheduler(self._check_scheduler)

    def fit_in_background(
        self, data: xr.Dataset | str, eval_data: xr.Dataset | str | None = None, **kwargs: Any
    ) -> concurrent.futures.Future[xr.Dataset]:
        """Run :meth:`fit` in a thread; the future's result is the history.

        The notebook (or script) stays usable while the run goes on; watch it
        with :meth:`dashboard`. One fit at a time: a second call while one
        runs raises ``RuntimeError``.

        Examples
        --------
        >>> future = trainer.fit_in_background(train, eval_data=test, max_time=60)  # doctest: +SKIP
        >>> trainer.dashboard()  # doctest: +SKIP
        >>> history = future.result()  # doctest: +SKIP
        """
        kwargs.setdefault("progress", False)
        # fit's arguments, checked here as fit would check them, with its defaults
        bound = inspect.signature(self.fit).bind(data, eval_data, **kwargs)
        bound.apply_defaults()
        if not self._fitting.acquire(blocking=False):  # released by the fit's thread
            raise RuntimeError(_FIT_RUNNING)

        def run() -> xr.Dataset:
            try:
                return self._fit_holding(*bound.args, **bound.kwargs)
            finally:
                self._fitting.release()

        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="daskpri-fit")
        try:
            self._background = executor.submit(run)
        except BaseException:
            self._fitting.release()
            raise
        executor.shutdown(wait=False)
        return self._background

    def dashboard(self, height: int = 900) -> Any:
        """The live ``/daskpri`` page of this trainer's cluster.

        In Jupyter, an inline frame of the page (served by the scheduler, so
        the browser never talks to the driver); elsewhere, its address.
        """
        from daskpri.dashboard.notebook import show

        return show(self.client, height=height)

    # -- checkpoints ---------------------------------------------------------------------

    def _init_params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _INIT_PARAMS}

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write a checkpoint of the whole run to ``path``, atomically.

        It holds the model, the optimizer, the priority table with the
        selection's random state and the strategy's state, the step count and
        the history: :meth:`resume` continues the run exactly where it was.

        Examples
        --------
        >>> trainer.save("run.ckpt")  # doctest: +SKIP
        >>> trainer = daskpri.Trainer.resume("run.ckpt", client=client)  # doctest: +SKIP
        """
        if self._table is None or self._opt is None:
            raise RuntimeError("nothing to save yet: call fit first")
        if self._fit_elsewhere():
            raise RuntimeError(
                "save() while a fit runs in another thread (fit_in_background) could "
                "checkpoint a step half-applied; stop() it and wait for its future first, "
                "or pass checkpoint_path= and checkpoint_every= to checkpoint as it runs"
            )
        self._drop_prefetched()
        self._flush()
        return checkpoint.write(
            {
                "step": self.step_,
                "elapsed": self._elapsed,
                # placing data, building replicas, warm-ups so far (not in elapsed)
                "setup_time": self._setup_time,
                "model": self.model.state_dict(),
                "model_spec": getattr(self.model, "spec", None),
                "optimizer": self._opt.state_dict(),
                "mean_grad": self._mean_grad,
                "strategy": {"name": self.strategy.name,
                             # numpy scalars as Python numbers: the file is read weights-only
                             "params": {k: v.item() if isinstance(v, np.generic) else v
                                        for k, v in self.strategy.get_params().items()}},
                "trainer": self._init_params(),
                "table": checkpoint.to_storable(self._remote.state_dict()),
                "history": self._recorder.records,
            },
            path,
        )

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike[str],
        model: nn.Module | None = None,
        client: Client | None = None,
        **overrides: Any,
    ) -> Trainer:
        """A trainer that continues the run checkpointed at ``path``.

        The file is read weights-only. Call :meth:`fit` with the same data to
        go on: the step count, history, table and selections continue.

        Parameters
        ----------
        path : str or os.PathLike
            A checkpoint written by :meth:`save` or by ``checkpoint_path=``.
        model : torch.nn.Module, optional
            A module of the run's architecture (its weights are replaced); it
            may be left out for the built-in models.
        client : distributed.Client, optional
            The cluster to go on in, as for the constructor.
        **overrides
            Where and how the run goes on, which may change: ``n_workers``,
            ``resources``, ``device``, ``transport``, ``eval_every``,
            ``on_nonfinite``, ``security``, ``checkpoint_path`` and
            ``checkpoint_every`` (given alone, the run's own
            ``checkpoint_path`` is kept), and ``schedule_steps``, to go on
            past the end of a decaying schedule. What the run computes
            otherwise comes from the checkpoint: its strategy and options,
            seed, batch size, optimizer, learning rate and its schedule,
            local steps, partitions and staleness model.

        Raises
        ------
        ValueError
            If ``overrides`` names anything else, or the file is not a
            checkpoint of this architecture.

        Examples
        --------
        >>> trainer = daskpri.Trainer.resume("run.ckpt", client=client,  # doctest: +SKIP
        ...                                  checkpoint_every=50)
        >>> history = trainer.fit(train, eval_data=test, max_steps=2000)  # doctest: +SKIP
        """
        # the rest of the constructor's arguments shape the run itself: changed,
        # the resumed run would not be the checkpointed one going on
        may_change = ("n_workers", "resources", "device", "transport", "eval_every",
                      "on_nonfinite", "security", "checkpoint_path", "checkpoint_every",
                      "schedule_steps")
        fixed = sorted(set(overrides) - set(may_change))
        if fixed:
            raise ValueError(
                f"resume takes overrides of {', '.join(may_change)}, but got "
                f"{', '.join(fixed)}: the checkpoint fixes the run's strategy and its options, "
                "seed and optimization; start a new Trainer to change them"
            )
        state = checkpoint.read(path)
        if model is None:
            if state["model_spec"] is None:
                raise ValueError(
                    "the checkpoint's model is not a built-in one: pass model=, a module of "
                    "the same architecture"
                )
            model = from_spec(state["model_spec"])
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as e:
            raise ValueError(f"model does not match the checkpoint's architecture: {e}") from None
        params = dict(state["trainer"], **overrides)
        name = state["strategy"]["name"]
        if name not in STRATEGIES:
            raise ValueError(
                f"the checkpoint's strategy {name!r} is not registered in this process: "
                f"define its class and decorate it with daskpri.register_strategy (with "
                f"name = {name!r}) before resuming"
            )
        strategy = get_strategy(name, **state["strategy"]["params"])
        # the run's own clipping: None there is none, whatever the config says now
        # (a checkpoint from before the option has none)
        with dask.config.set({"daskpri.trainer.max-grad-norm": None}):
            trainer = cls(model, strategy=strategy, client=client, **params)
        trainer.step_ = int(state["step"])
        trainer._elapsed = float(state["elapsed"])
        trainer._setup_time = float(state.get("setup_time", 0.0))  # (not in older ones)
        trainer._recorder.records = list(state["history"])
        trainer._metrics_sent = len(trainer._recorder.records)  # not sent again
        trainer._resume_state = {
            "optimizer": state["optimizer"],
            "mean_grad": state["mean_grad"],
            "table": checkpoint.from_storable(state["table"]),
        }
        return trainer

    # -- results ------------------------------------------------------------------------

    @property
    def history_(self) -> xr.Dataset:
        """The metrics of every step so far, as an ``xarray.Dataset``."""
        return self._recorder.to_dataset(
            {
                "strategy": self.strategy.name,
                "strategy_params": repr(self.strategy),
                "seed": self.seed,
                "batch_size": self.batch_size,
                "learning_rate": self.learning_rate,
                # 0: no clipping (netCDF attributes have no null)
                "max_grad_norm": self.max_grad_norm or 0.0,
                "optimizer": self.optimizer,
                "lr_schedule": self.lr_schedule,
                "schedule_steps": self.schedule_steps if self.schedule_steps else 0,
                "local_steps": self.local_steps,
                "staleness": self.staleness,
                "n_workers": len(self._deployment.slots) if self._deployment is not None else 0,
                "resources": repr(self.resources),
                # placing data, building replicas, warm-up: not in ``time``
                "setup_time": self._setup_time,
            }
        )

    @property
    def checkpointed_step_(self) -> int | None:
        """The step of the checkpoint last written to ``checkpoint_path`` (``None``: none yet).

        A fit writes one every ``checkpoint_every`` steps and where it ends,
        whatever ends it (its budget, :meth:`stop`); one stopped by an
        exception keeps the last written before it.
        """
        return None if self._checkpointed < 0 else self._checkpointed

    def _fit_elsewhere(self) -> bool:
        """A fit runs in another thread (:meth:`fit_in_background`)."""
        return self._fit_thread not in (None, threading.get_ident())

    @property
    def table_(self) -> xr.DataArray:
        """The current priorities along ``sample`` (fetched from the cluster).

        During a background fit, the table as the fit last sent it (it sends
        with every step): only the fit's own thread sends what it holds.
        """
        if self._data_key is None:
            raise RuntimeError("table_ is available after fit")
        _ = self.client  # raises if it was closed
        if not self._fit_elsewhere():
            self._flush()
        p = self._remote.priorities()
        assert self._deployment is not None
        bounds = self._deployment.bounds
        pid = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
        return xr.DataArray(
            p["priority"],
            dims="sample",
            coords={"version": ("sample", p["version"]), "partition": ("sample", pid)}
            | ({} if self._sample_coord is None else {"sample": self._sample_coord}),
            name="priority",
            attrs={"strategy": self.strategy.name, "staleness": self.staleness},
        )
