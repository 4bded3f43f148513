"""The trainer: prioritized data-parallel SGD driven from the client.

Each step: the cluster-held table applies the last step's priorities and
selects this step's samples per worker (one RPC); the driver ships the current
weights (CPU tensors, scattered once per step) and one task per worker; each
worker computes the gradient and fresh priorities on its own partitions; the
driver combines the gradients and steps its optimizer.

This module holds the :class:`Trainer`'s public face: its parameters, its
cluster and the fit loop; the work behind them is in private modules:
``_settings`` checks and sets its arguments, ``_fit`` runs a fit's loop,
``_resume`` writes and reads checkpoints, ``_results`` builds ``history_``
and ``table_``, ``_cleanup`` starts its LocalCluster and closes a trainer
never closed, ``_interrupts`` says what an interrupt (Jupyter's, Ctrl-C)
does meanwhile, and its mixins ``_run.RunMixin``, ``_step.StepMixin``,
``_persist.PersistMixin``, ``_background.BackgroundMixin`` and
``_inference.InferenceMixin`` hold the run
in the cluster, each step, the checkpoints and results
(:meth:`~Trainer.save`, :meth:`~Trainer.resume`, ``history_``, ``table_``),
a fit in a thread, its stop and the dashboard
(:meth:`~Trainer.fit_in_background`, :meth:`~Trainer.stop`,
:meth:`~Trainer.dashboard`), and the model scored and run on other data
(:meth:`~Trainer.evaluate`, :meth:`~Trainer.predict`).
The partitions and replicas on the workers, and re-planning after losing
some, are a :class:`~daskpri.training.deployment.Deployment`; the
workers' results of a step are combined in :mod:`~daskpri.training.rounds`;
a lost scheduler and the timeouts are in :mod:`~daskpri.training.recovery`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr
from distributed import Client, LocalCluster
from distributed.security import Security
from torch import nn

from daskpri.strategies import Strategy
from daskpri.table.plugin import RemoteTable
from daskpri.training._background import BackgroundMixin
from daskpri.training._cleanup import (
    TRAINERS,
    close_cluster,
    killing_on_interrupt,
    start_own_cluster,
)
from daskpri.training._fit import FIT_RUNNING, FitRequest, check_fit, fit_loop
from daskpri.training._inference import InferenceMixin
from daskpri.training._interrupts import dropped_by_interrupts

# LEARNING_RATES moved to _settings; it is still importable from here (daskpri.cli's is)
from daskpri.training._settings import LEARNING_RATES as LEARNING_RATES
from daskpri.training._settings import set_arguments
from daskpri.training.deployment import Deployment
from daskpri.training.early_stopping import EarlyStopping, Watch
from daskpri.training.history import HistoryRecorder
from daskpri.training.recovery import SchedulerLostError, blame_scheduler, dask_timeout

# SchedulerLostError and dask_timeout moved to recovery; they are still
# importable from here.
__all__ = ["SchedulerLostError", "Trainer", "dask_timeout"]

class Trainer(InferenceMixin, BackgroundMixin):
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
        (one thread each, bound to 127.0.0.1), closed by :meth:`close`. An
        adaptive cluster (``cluster.adapt()``) keeps a fit's workers until it
        ends (``daskpri.trainer.hold-workers``), but starts workers for Dask
        tasks only: adapt with a ``minimum`` of the workers a fit should use.
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
        Samples per worker per step, and the driver's optimizer (``"sgd"``,
        ``"adam"`` or ``"adamw"``, Adam with weight decay decoupled from
        its moments); ``None`` reads the ``daskpri.trainer`` config. Its
        ``learning-rate`` is null, which takes the optimizer's own rate
        (:data:`LEARNING_RATES`: 0.1 for SGD, 0.001 for Adam and AdamW).
        ``weight_decay`` ``None`` is torch's own: 0.01 for AdamW, none for
        the others.
    max_grad_norm : float, optional
        Clip the gradient of each optimizer step to this L2 norm over all
        parameters (``torch.nn.utils.clip_grad_norm_``): the mean gradient
        of the workers at a synchronous step, as DDP users clip after the
        all-reduce, and each worker's own gradient at a local step. ``None``
        reads ``daskpri.trainer.max-grad-norm`` (null: no clipping). It
        keeps a learning rate that the high-loss samples a prioritized
        strategy picks would make diverge from blowing up a run.
    label_smoothing : float, optional
        Label smoothing of the training loss, in ``[0, 1)``, as
        ``torch.nn.CrossEntropyLoss(label_smoothing=...)``: the target of
        each sample puts ``1 - label_smoothing`` on its label and spreads
        the rest evenly over the classes. The gradients are the smoothed
        loss's; the losses the strategies rank and the history records
        stay the plain cross-entropy. ``None`` reads
        ``daskpri.trainer.label-smoothing`` (0: none).
    precision : {"float32", "bfloat16"}, optional
        The precision of the workers' training passes. ``"bfloat16"`` runs
        each forward and backward under ``torch.autocast(dtype=torch.bfloat16)``
        (the matrix products and convolutions in bfloat16; the parameters,
        gradients, optimizer and losses stay float32, and bfloat16 has
        float32's range, so no loss scaling is needed). It pays on GPUs from
        Ampere on and on CPUs with AVX512-BF16 or AMX (a CNN step took half
        the time; the README's "Mixed precision"); elsewhere a CPU emulates
        it, slower than float32, and an older GPU is refused, by the worker
        that has it. Evaluation stays float32; the strategies' scoring
        passes take their own ``score_dtype``. ``None`` reads
        ``daskpri.trainer.precision`` (``"float32"``).
    lr_schedule : {"constant", "cosine", "linear"}
        How the learning rate changes with the step: constant, or decaying
        from ``learning_rate`` to zero over ``schedule_steps`` steps (a
        function of the step count, so a resumed run follows it exactly).
    schedule_steps : int, optional
        Length of a decaying schedule, usually the run's ``max_steps``.
    warmup_steps : int, default 0
        Steps over which the learning rate first rises linearly to
        ``learning_rate`` (step ``i`` at ``learning_rate * (i + 1) /
        warmup_steps``), before ``lr_schedule`` (a decaying one then decays
        over the rest of ``schedule_steps``). Goyal et al.'s warm-up for
        large-batch data-parallel SGD: with many workers the batch of a step
        is ``batch_size`` times their number, and a rate scaled up with it
        diverges in the first steps without one.
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
        Force the replicas' device (default: each worker's GPU, else CPU):
        ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"xpu"`` or
        ``"xpu:N"``. An accelerator is checked as a fit starts, before the
        replicas are set up: every worker of the run should have it.
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
    best_step_, best_score_, stopped_step_ : int, float, int or None
        The last fit's ``early_stopping``: its best evaluation's step and
        figure, and the step at which its patience ran out (``None``: it
        did not, or the fit had no ``early_stopping``).
    skipped_steps_ : int
        Steps skipped for a non-finite loss or gradient
        (``on_nonfinite="skip"``) by this trainer's fits; a resumed trainer
        counts from 0, the history's ``skipped`` keeps every step's.
    run_id : str
        The run's name in the cluster (the strategy's name and a random
        suffix), in the keys of its tasks.

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
        weight_decay: float | None = None,
        max_grad_norm: float | None = None,
        label_smoothing: float | None = None,
        precision: str | None = None,
        optimizer: str | None = None,
        lr_schedule: str = "constant",
        schedule_steps: int | None = None,
        warmup_steps: int = 0,
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
        set_arguments(
            self, model, strategy, client, seed, n_workers, resources,
            batch_size=batch_size, learning_rate=learning_rate, momentum=momentum,
            weight_decay=weight_decay, max_grad_norm=max_grad_norm,
            label_smoothing=label_smoothing, precision=precision, optimizer=optimizer,
            lr_schedule=lr_schedule, schedule_steps=schedule_steps, warmup_steps=warmup_steps,
            local_steps=local_steps,
            eval_every=eval_every, partition_size=partition_size, staleness=staleness,
            device=device, checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every,
            security=security, transport=transport, on_nonfinite=on_nonfinite,
            strategy_options=strategy_options,
        )
        self._own_cluster: LocalCluster | None = None
        self._client = client
        self.skipped_steps_ = 0
        self._excluded: set[str] = set()
        self._setup_time = 0.0
        self._watched: Watch | None = None
        #: a resumed checkpoint's early-stopping watch, for the first fit to go on with
        self._resumed_watch: dict[str, Any] | None = None
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
        # closes the LocalCluster the trainer started if it is collected without close()
        self._dropped: weakref.finalize[Any, Any] | None = None
        self._sample_coord = None
        self._scheduler_address: str | None = None
        self._checkpointed = -1  # the step last written to checkpoint_path
        # (worker, name) of the state that a lone worker kept after the last
        # round, equal to the master's; None when the master's must be sent
        self._kept = None
        self._prefetch_rounds = True
        self._interrupts_checked = False  # whether a fit asked if an interrupt kills the workers
        self._closed = False  # closed, and not fitted or given a cluster since
        self._keep_state = True
        TRAINERS.add(self)

    # -- cluster -------------------------------------------------------------

    @property
    @dropped_by_interrupts
    def client(self) -> Client:
        """The client in use (a LocalCluster's, started on first use).

        Raises
        ------
        RuntimeError
            If the client is closing or closed.
        KeyboardInterrupt
            Interrupted as it starts the trainer's LocalCluster: once started
            (the trainer's), or, interrupted twice, at once, the cluster closed.

        Examples
        --------
        >>> import daskpri
        >>> trainer = daskpri.Trainer(model, n_workers=2)  # doctest: +SKIP
        >>> trainer.client  # starts the LocalCluster  # doctest: +SKIP
        <Client: 'tcp://127.0.0.1:...' processes=2 threads=2, memory=...>
        """
        if self._client is None:
            # a background fit and a call from the caller's thread (dashboard())
            # may both start it: one cluster, not two
            with self._starting:
                if self._client is None:
                    start_own_cluster(self)
        client = self._client
        assert client is not None  # (started, or start_own_cluster raised)
        if client.status in ("closing", "closed"):
            raise RuntimeError(
                f"the trainer's client is {client.status}: the run's cluster is out of "
                "reach; give a new Trainer a running client (Trainer.resume(path, client=...) "
                "goes on from a checkpoint)"
            )
        return client

    def close(self) -> None:
        """Release the run's state in the cluster; close a cluster we started.

        A fit running in the background (:meth:`fit_in_background`) is
        stopped first, after its step in flight, and waited for: its future
        keeps the history so far. A later :meth:`fit` sets up a new run from
        the model's weights, its optimizer state and priorities afresh, and
        warns so (:meth:`save` before closing, then :meth:`resume`, goes on
        exactly).

        Examples
        --------
        >>> import daskpri
        >>> from daskpri.models import MLP
        >>> trainer = daskpri.Trainer(MLP((40,), 10), strategy="uniform")
        >>> trainer.close()  # no cluster started yet: nothing to release
        >>> with daskpri.Trainer(model) as trainer:  # closed when the block ends  # doctest: +SKIP
        ...     history = trainer.fit(train, max_steps=100)
        """
        self._close(kill_workers=False)

    def _close(self, *, kill_workers: bool) -> None:
        """:meth:`close`; ``kill_workers``: a cluster of daskpri's own is killed, not waited for."""
        background = self._background
        if (background is not None and not background.done()
                and self._fit_thread != threading.get_ident()):
            self.stop()
            concurrent.futures.wait([background])
        own = self._own_cluster
        # the close of the trainer's own LocalCluster, the run's release in it included, is
        # whole: an interrupt meanwhile (a second Ctrl-C, after the first ended the fit)
        # kills its workers, a stuck one that the close would wait for among them, and is
        # raised once it is closed; cut, the close would leave it closing for ever, and
        # the next close(), at exit's among them, waiting for it
        with (contextlib.nullcontext() if own is None else killing_on_interrupt(own)) as held:
            # killed, the workers take the run's replicas with them: none waited for
            self._release(workers=not (kill_workers or held is not None and held.count > 0))
            if self._dropped is not None:
                self._dropped.detach()
                self._dropped = None
            if own is not None:
                close_cluster(self._client, own,  # type: ignore[arg-type]
                              kill_workers=kill_workers or held is not None and held.count > 0)
                self._own_cluster = self._client = None
        self._closed = True

    def __repr__(self) -> str:
        client = self._client
        if self._closed:
            where = "closed"
        elif client is None:
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

    @dropped_by_interrupts
    def fit(
        self,
        data: xr.Dataset | str,
        eval_data: xr.Dataset | str | None = None,
        *,
        max_steps: int | None = None,
        max_time: float | None = None,
        target_accuracy: float | None = None,
        progress: bool = True,
        eval_chunked: bool = False,
        early_stopping: EarlyStopping | int | None = None,
        callbacks: Callable[[Trainer, dict[str, Any]], Any]
        | Sequence[Callable[[Trainer, dict[str, Any]], Any]] | None = None,
    ) -> xr.Dataset:
        """Train on ``data`` until its budget, ``target_accuracy`` or ``early_stopping`` ends it.

        Parameters
        ----------
        data : xarray.Dataset or path
            Variables ``x`` and ``y`` along ``sample``, in memory or in a zarr
            store / netCDF file (read partition by partition on the workers).
        eval_data : xarray.Dataset or path, optional
            Evaluated every ``eval_every`` steps and at the end, on the
            driver: on its GPU where it has one, else its CPU (the
            ``daskpri.trainer.eval-device`` setting chooses another); with
            ``eval_chunked``, on the cluster.
        max_steps : int, optional
            Total steps of the trainer (a second ``fit`` continues counting).
        max_time : float, optional
            Seconds of training in this call (as the history's ``time``
            counts them: evaluation excluded).
        target_accuracy : float, optional
            Stop once the accuracy on ``eval_data`` reaches it.
        progress : bool
            Show a progress bar.
        eval_chunked : bool, default False
            Score ``eval_data`` on the cluster rather than the driver, as
            :meth:`evaluate` does with ``chunked=True``: a task per chunk of
            samples, on the workers with the run's ``resources``, each on its
            worker's device (a ``GPU``-tagged worker's GPU), a copy of the
            master model sent at each evaluation. For
            held-out data too large for the driver, or a driver without the
            workers' GPUs. Only its labels are read on the driver; a store
            is read by the workers (every one should see its path: checked
            before the first step), data in memory is sent to the cluster
            once; its ``x`` values are checked by the tasks, at the first
            evaluation. The figures are the driver's: the accuracy exactly,
            the loss to float32's rounding.
        early_stopping : daskpri.EarlyStopping or int, optional
            End the fit once ``eval_data``'s accuracy (or the rule's
            ``monitor``) has not improved for that many evaluations in a row
            (an ``int``: ``EarlyStopping(patience=that)``), and with
            ``restore_best`` leave the model with the weights of the best
            one; see :class:`~daskpri.training.early_stopping.EarlyStopping`.
            Needs ``eval_data``; ``max_steps`` or ``max_time`` still bound
            the fit. What it found is :attr:`best_step_`,
            :attr:`best_score_` and :attr:`stopped_step_`, and the
            history's attributes.
        callbacks : callable or list of callables, optional
            Each called as ``callback(trainer, record)`` after every step
            (or round of ``local_steps``), in the fit's thread, once the
            step is in ``history_`` (and checkpointed, where it falls on
            ``checkpoint_every``): ``record`` is a copy of that step's
            figures by the history's names (``step``, ``time``, ``loss``,
            ``samples``, ...; ``accuracy`` and ``eval_loss`` where it was
            evaluated). Where the fit evaluates its last step as it ends,
            that step's record comes again, with its evaluation. To log a
            run elsewhere (MLflow, TensorBoard), or end it:
            ``trainer.stop()`` in a callback ends the fit after that step.
            A callback that raises ends the fit with its error; the steps
            taken stay in ``history_``.

        Returns
        -------
        xarray.Dataset
            The history, also in ``history_``.

        Raises
        ------
        ValueError
            If an argument or the data is refused. The model is run on two
            samples of ``data.x`` and the labels ``data.y`` are checked
            against the data's ``n_classes`` (else the model's output width)
            on this machine, and a CUDA ``device`` against the machine
            (for the trainer's own LocalCluster) or the workers (for a
            client's), before the trainer starts its LocalCluster or lets
            the last fit's run go: a fit refused so leaves that run as it
            was. The values of an ``x`` in memory (NumPy) are checked there
            too (finite, within float32); those of a store or Dask array on
            the workers, as they load their partitions.
        RuntimeError, ValueError
            If the cluster has no workers for the run (none, none with
            ``resources``, all paused, fewer than ``n_workers``) and none
            join within ``daskpri.trainer.no-workers-timeout``: the fit waits
            that long first, as Dask's work does, saying so (an adaptive
            cluster at zero starts a worker for it); a :meth:`stop` or an
            interrupt meanwhile ends the fit, with no step taken.
        RuntimeError
            If another fit of this trainer is running.
        TypeError
            If ``eval_chunked`` is not a bool, ``early_stopping`` neither
            an ``int`` nor an :class:`~daskpri.training.early_stopping.EarlyStopping`,
            or ``callbacks`` not callables.
        FileNotFoundError
            With ``eval_chunked``, if workers cannot read ``eval_data``'s
            store at its path (named, before the first step).
        KeyboardInterrupt
            Once a fit in the main thread that was interrupted (Jupyter's stop
            button, Ctrl-C) has ended: from the start of its cluster and
            set-up on, an interrupt ends it after the step in flight, as at
            the end of its budget (it evaluates, keeps its history in
            ``history_`` and writes its checkpoint), and the message says
            what it ended: the step it stopped at, or, interrupted while it
            waited for workers or set its run up, that nothing was trained;
            ``fit`` again goes on from there. A
            second interrupt raises at once. Its traceback keeps the lines
            it passed, not their variables: a trainer a notebook drops after
            it closes its LocalCluster.

        Examples
        --------
        >>> import daskpri
        >>> train, test = daskpri.datasets.load("mnist1d")  # doctest: +SKIP
        >>> trainer = daskpri.Trainer(daskpri.models.build_model("mlp", train))  # doctest: +SKIP
        >>> history = trainer.fit(train, eval_data=test, max_steps=500)  # doctest: +SKIP
        >>> history.accuracy.dropna("step")  # doctest: +SKIP
        >>> history = trainer.fit(train, max_steps=1000)  # 500 steps more  # doctest: +SKIP
        """
        # (an interrupt's traceback keeps no trainer alive: dropped_by_interrupts)
        if not self._fitting.acquire(blocking=False):
            raise RuntimeError(FIT_RUNNING)
        try:
            request = check_fit(self, data, eval_data, max_steps=max_steps, max_time=max_time,
                                target_accuracy=target_accuracy, progress=progress,
                                eval_chunked=eval_chunked, early_stopping=early_stopping,
                                callbacks=callbacks)
            return self._fit_holding(request)
        finally:
            self._fitting.release()

    def _fit_holding(self, request: FitRequest) -> xr.Dataset:
        """:meth:`fit`, its caller holding ``_fitting`` (one fit at a time)."""
        self._fit_thread = threading.get_ident()
        try:
            return fit_loop(self, request)
        finally:
            self._fit_thread = None
            self._stop_requested = False  # a stop is spent by the fit it ended

    def _blame_scheduler(self) -> contextlib.AbstractContextManager[None]:
        """Turn a failure of the cluster into :class:`SchedulerLostError` if the scheduler is gone.

        The user's errors (``ValueError``, ``TypeError``, ``FloatingPointError``)
        pass as they are.
        """
        return blame_scheduler(self._check_scheduler, self._client)
