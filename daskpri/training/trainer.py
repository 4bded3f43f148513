"""The trainer: prioritized data-parallel SGD driven from the client.

Each step: the cluster-held table applies the last step's priorities and
selects this step's samples per worker (one RPC); the driver ships the current
weights (CPU tensors, scattered once per step) and one task per worker; each
worker computes the gradient and fresh priorities on its own partitions; the
driver combines the gradients and steps its optimizer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import os
import time
import uuid
import warnings
import zlib
from collections.abc import Iterator, Mapping
from concurrent.futures import CancelledError
from typing import Any

import numpy as np
import torch
import xarray as xr
from distributed import Client, Future, LocalCluster
from distributed.comm import CommClosedError
from distributed.protocol import pickle
from distributed.scheduler import KilledWorker
from distributed.security import Security
from torch import nn

from daskpri import _config
from daskpri._warnings import DaskpriWarning
from daskpri.data.io import open_dataset, validate_dataset
from daskpri.models import from_spec
from daskpri.replicas.optim import LocalSteps, average_states, make_optimizer, set_flat_grad
from daskpri.replicas.replica import Weights
from daskpri.replicas.worker import (
    ArrayPart,
    ReplicaPlugin,
    Shares,
    StepResult,
    StoreRef,
    load_task,
    train_task,
    warmup_task,
)
from daskpri.strategies import Selection, Strategy, get_strategy
from daskpri.table.plugin import RemoteTable
from daskpri.table.staleness import validate_staleness
from daskpri.training import checkpoint
from daskpri.training.cluster import local_cluster
from daskpri.training.evaluation import EvalSet
from daskpri.training.history import HistoryRecorder
from daskpri.training.placement import (
    assign_owners,
    eligible_workers,
    parse_resources,
    partition_bounds,
    reassign_owners,
)
from daskpri.training.schedule import scheduled_rate, validate_schedule
from daskpri.training.transport import StepTimeout, run_direct, wait_tasks

# Failures that mean "a worker (and what it held) is gone", after which a step
# is re-planned on the workers left; anything else is the user's error.
_LOST = (CancelledError, KilledWorker, CommClosedError, OSError)


class Trainer:
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
        :class:`~daskpri.strategies.Strategy`.
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
        or ``"adam"``); ``None`` reads the ``daskpri.trainer`` config.
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
        Steps between evaluations on ``eval_data``.
    partition_size : int, optional
        Samples per partition for data not chunked along ``sample``.
    staleness : str, optional
        Staleness model of the table: ``"keep"``, ``"exp-linear"``,
        ``"exp-quadratic"``.
    device : str, optional
        Force the replicas' device (default: each worker's GPU, else CPU).
    checkpoint_path, checkpoint_every : optional
        Write a checkpoint to ``checkpoint_path`` every ``checkpoint_every``
        steps (atomically; see :meth:`save` and :meth:`resume`).
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
        Metrics along ``step``.
    table_ : xarray.DataArray
        The current priorities along ``sample``.
    step_ : int
        Steps taken over all calls of :meth:`fit`.

    Examples
    --------
    >>> import daskpri
    >>> train, test = daskpri.datasets.load("mnist1d")  # doctest: +SKIP
    >>> model = daskpri.models.build_model("mlp", train)  # doctest: +SKIP
    >>> with daskpri.Trainer(model, strategy="projection", seed=0) as trainer:  # doctest: +SKIP
    ...     history = trainer.fit(train, eval_data=test, max_steps=500)
    """

    def __init__(
        self,
        model: nn.Module,
        strategy: str | Strategy = "projection",
        client: Client | None = None,
        seed: int = 0,
        n_workers: int | None = None,
        resources: Mapping[str, float] | str | None = None,
        *,
        batch_size: int | None = None,
        learning_rate: float | None = None,
        momentum: float | None = None,
        weight_decay: float = 0.0,
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
        if not isinstance(model, nn.Module):
            raise TypeError(f"model should be a torch.nn.Module, but got {type(model).__name__}")
        if client is not None and not isinstance(client, Client):
            raise TypeError(
                f"client should be a distributed.Client, but got {type(client).__name__}"
            )
        self.model = model
        self.strategy = get_strategy(strategy, **strategy_options)
        self.seed = _check_int("seed", seed, minimum=0)
        self.n_workers = (
            None if n_workers is None else _check_int("n_workers", n_workers, minimum=1)
        )
        self.resources = parse_resources(resources)
        self.batch_size = _check_int("batch_size", _config.get("trainer.batch-size", batch_size), 1)
        self.learning_rate = _check_float(
            "learning_rate", _config.get("trainer.learning-rate", learning_rate)
        )
        self.momentum = _check_real("momentum", _config.get("trainer.momentum", momentum), 0.0, 1.0)
        self.weight_decay = _check_real("weight_decay", weight_decay, 0.0, math.inf)
        self.optimizer = _config.get("trainer.optimizer", optimizer)
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(
                f"optimizer should be one of 'sgd', 'adam', but got {self.optimizer!r}"
            )
        self.lr_schedule, self.schedule_steps = validate_schedule(lr_schedule, schedule_steps)
        self.local_steps = _check_int("local_steps", local_steps, 1)
        if self.local_steps > 1 and self.strategy.needs_fresh_priorities:
            raise ValueError(
                f"strategy {self.strategy.name!r} selects by the priorities of the previous "
                f"step, which a round of local_steps={self.local_steps} does not refresh; "
                "use local_steps=1 with it, or a strategy that selects within the step "
                "(uniform, loss, selective-backprop, ...)"
            )
        self.eval_every = _check_int("eval_every", _config.get("trainer.eval-every", eval_every), 1)
        self.partition_size = (
            None if partition_size is None else _check_int("partition_size", partition_size, 1)
        )
        self.staleness = validate_staleness(_config.get("table.staleness", staleness))
        if device is not None:
            try:
                torch.device(device)
            except (RuntimeError, TypeError, ValueError):
                raise ValueError(
                    f"device should name a torch device like 'cpu' or 'cuda:0', but got "
                    f"device={device!r}"
                ) from None
        self.device = device
        if checkpoint_every is not None:
            _check_int("checkpoint_every", checkpoint_every, 1)
            if checkpoint_path is None:
                raise ValueError("checkpoint_every= needs checkpoint_path=, the file to write")
        if checkpoint_path is not None and not isinstance(checkpoint_path, (str, os.PathLike)):
            raise TypeError(
                f"checkpoint_path should be a path, but got {type(checkpoint_path).__name__}"
            )
        self.checkpoint_path = None if checkpoint_path is None else os.fspath(checkpoint_path)
        self.checkpoint_every = checkpoint_every
        self._own_cluster: LocalCluster | None = None
        self._client = client
        if security is not None and client is not None:
            raise ValueError(
                "security= applies to the LocalCluster the trainer starts; a client brings "
                "its own: Client(address, security=Security(...))"
            )
        if security is not None and not isinstance(security, (bool, Security)):
            raise TypeError(
                "security should be a distributed.security.Security or True, but got "
                f"{type(security).__name__}"
            )
        self.security = security
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(
                f"on_nonfinite should be one of 'raise', 'skip', but got {on_nonfinite!r}"
            )
        self.on_nonfinite = on_nonfinite
        self.skipped_steps_ = 0
        self._excluded: set[str] = set()
        self._setup_time = 0.0
        self.transport = _config.get("trainer.transport", transport)
        if self.transport not in ("tasks", "direct"):
            raise ValueError(
                f"transport should be one of 'tasks', 'direct', but got {self.transport!r}"
            )
        self.run_id = f"{self.strategy.name}-{uuid.uuid4().hex[:8]}"
        self.step_ = 0
        self._recorder = HistoryRecorder()
        self._opt: torch.optim.Optimizer | None = None
        self._mean_grad: torch.Tensor | None = None
        self._pending: list[tuple[np.ndarray, np.ndarray, int]] = []
        self._data_key: tuple[Any, ...] | None = None
        self._elapsed = 0.0
        self._parts: dict[int, StoreRef | Future] = {}
        self._table: RemoteTable | None = None
        self._resume_state: dict[str, Any] | None = None
        self._background: concurrent.futures.Future[xr.Dataset] | None = None
        # a plain flag: set from a signal handler, where a lock could deadlock
        self._stop_requested = False

    # -- cluster -------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The client in use (a LocalCluster's, started on first use)."""
        if self._client is None:
            self._own_cluster = local_cluster(
                self.n_workers or 2, resources=self.resources, security=self.security
            )
            self._client = Client(self._own_cluster)
        return self._client

    def close(self) -> None:
        """Release the run's state in the cluster; close a cluster we started."""
        self._release()
        if self._own_cluster is not None:
            self._client.close()  # type: ignore[union-attr]
            self._own_cluster.close()
            self._own_cluster = self._client = None

    def _release(self) -> None:
        """Drop the run's table, replicas and partitions from the cluster."""
        if self._client is not None and self._table is not None:
            try:
                self._table.close()
                self._client.unregister_worker_plugin(self._plugin.name)
            except Exception:  # the cluster may be gone already
                pass
        self._data_key = None
        self._table = None
        self._parts = {}

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
            Evaluated every ``eval_every`` steps and at the end.
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
        try:
            return self._fit(data, eval_data, max_steps=max_steps, max_time=max_time,
                             target_accuracy=target_accuracy, progress=progress)
        finally:
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
        if max_steps is None and max_time is None:
            raise ValueError(
                "fit needs max_steps= or max_time= (target_accuracy= alone may never be reached)"
            )
        if max_steps is not None:
            _check_int("max_steps", max_steps, 0)
        if max_time is not None:
            _check_float("max_time", max_time)
        if target_accuracy is not None and not 0.0 < target_accuracy <= 1.0:
            raise ValueError(f"target_accuracy should be in (0, 1], but got {target_accuracy!r}")
        if target_accuracy is not None and eval_data is None:
            raise ValueError("target_accuracy= needs eval_data= to measure accuracy on")
        ds = open_dataset(data, name="data")
        info = validate_dataset(ds, name="data")
        evalset = None
        if eval_data is not None:
            eds = open_dataset(eval_data, name="eval_data")
            einfo = validate_dataset(eds, name="eval_data")
            if einfo["x_shape"] != info["x_shape"]:
                raise ValueError(
                    f"eval_data.x should have per-sample shape {info['x_shape']} like data.x, "
                    f"but got {einfo['x_shape']}"
                )
            evalset = EvalSet(eds)
        t_setup = time.perf_counter()
        self._prepare(ds, info, data)
        self._setup_time += time.perf_counter() - t_setup
        if evalset is not None:
            evalset.check(self._n_classes)

        from tqdm.auto import tqdm

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
                if evalset is not None and _crossed(before, self.step_, self.eval_every):
                    self._evaluate(evalset, record)
                self._recorder.append(record)
                if self.checkpoint_every and _crossed(before, self.step_, self.checkpoint_every):
                    with self._blame_scheduler():  # saving reads the table from the scheduler
                        self.save(self.checkpoint_path)  # type: ignore[arg-type]
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
                self._flush()
        finally:
            bar.close()
        return self.history_

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

    @contextlib.contextmanager
    def _blame_scheduler(self) -> Iterator[None]:
        """Turn a failure of the cluster into :class:`SchedulerLostError` if the scheduler is gone.

        The user's errors (``ValueError``, ``TypeError``, ``FloatingPointError``)
        pass as they are.
        """
        try:
            yield
        except (ValueError, TypeError, FloatingPointError):
            raise  # the user's input: the scheduler is not to blame
        except Exception:
            self._check_scheduler()
            raise

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
        if self._background is not None and not self._background.done():
            raise RuntimeError("a fit is already running in the background; wait for its future")
        kwargs.setdefault("progress", False)
        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="daskpri-fit")
        self._background = executor.submit(self.fit, data, eval_data, **kwargs)
        executor.shutdown(wait=False)
        return self._background

    def dashboard(self, height: int = 900) -> Any:
        """The live ``/daskpri`` page of this trainer's cluster.

        In Jupyter, an inline frame of the page (served by the scheduler, so
        the browser never talks to the driver); elsewhere, its address.
        """
        from daskpri.dashboard.notebook import show

        return show(self.client, height=height)

    # -- preparation ---------------------------------------------------------------

    def _prepare(self, ds: xr.Dataset, info: dict[str, Any], source: xr.Dataset | str) -> None:
        client = self.client
        workers = client.scheduler_info(n_workers=-1)["workers"]
        if (
            self.resources is None
            and workers
            and all(w.get("resources", {}).get("GPU", 0) > 0 for w in workers.values())
        ):
            self.resources = {"GPU": 1.0}
        addrs = eligible_workers(workers, self.resources, client.scheduler.address)
        if self.n_workers is not None and self._own_cluster is None:
            if len(addrs) < self.n_workers:
                raise ValueError(
                    f"n_workers={self.n_workers} but the cluster has {len(addrs)} suitable workers"
                )
            addrs = addrs[: self.n_workers]
        bounds = partition_bounds(ds, self.partition_size, len(addrs))
        key = (
            str(source) if not isinstance(source, xr.Dataset) else id(source),
            tuple(bounds.tolist()),
        )
        if key == self._data_key:
            return
        if self._data_key is not None:
            self._release()  # new data: a new table, partitions and replicas
        self._n_classes = self._check_model(ds, info)
        sizes = np.diff(bounds)
        owner = assign_owners(len(sizes), len(addrs))
        self._bounds = bounds
        self._slots = addrs
        self._owner_addr = [addrs[s] for s in owner]
        self._source = source
        self._ds = ds
        self._plugin = ReplicaPlugin(
            self.run_id, pickle.dumps(self.model), self._n_classes, device=self.device
        )
        client.register_plugin(self._plugin)
        self._parts = {}
        RemoteTable.ensure_plugin(client)
        self._table = RemoteTable(client, self.run_id)
        self._table.create(
            sizes,
            owner,
            self.strategy,
            seed=self.seed,
            batch_size=self.batch_size,
            staleness=self.staleness,
            n_bins=int(_config.get("table.histogram-bins")),
            info={
                "strategy": self.strategy.name,
                "params": repr(self.strategy),
                "n_workers": len(addrs),
                "n_samples": int(bounds[-1]),
            },
        )
        self._set_up_workers(len(sizes))
        self._data_key = key
        self._init_optimizer()
        if self._resume_state is not None:
            slot_of = {a: i for i, a in enumerate(self._slots)}
            self._restore(
                self._resume_state,
                np.array([slot_of[a] for a in self._owner_addr], dtype=np.int64),
            )
            self._resume_state = None

    def _set_up_workers(self, n_partitions: int) -> None:
        """Place every partition and warm the replicas up, despite workers dying meanwhile.

        A worker lost during set-up is handled as during training: its
        partitions move to the workers left (bounded by ``no-workers-timeout``).
        """
        deadline = time.monotonic() + dask_timeout()
        while True:
            try:
                missing = [p for p in range(n_partitions) if p not in self._parts]
                if missing:
                    self._place_partitions(missing)
                self._warm_up()
                return
            except (KeyError, *_LOST):
                if time.monotonic() > deadline:
                    raise
                self._recover()

    def _check_model(self, ds: xr.Dataset, info: dict[str, Any]) -> int:
        """Classes the labels need, checked against the model's output."""
        n_classes = info.get("n_classes")
        y_max = int(ds["y"].max().compute()) if n_classes is None else None
        x0 = torch.as_tensor(np.asarray(ds["x"].isel(sample=slice(0, 2)).values, dtype=np.float32))
        try:
            with torch.no_grad():
                out = self.model(x0)
        except Exception as e:
            raise ValueError(
                f"the model could not run on data.x of per-sample shape {info['x_shape']}: {e}"
            ) from e
        if out.ndim != 2:
            raise ValueError(
                "the model should output (batch, n_classes) logits, but got shape "
                f"{tuple(out.shape)}"
            )
        width = int(out.shape[1])
        if n_classes is None:
            if width <= (y_max or 0):
                raise ValueError(
                    f"the model outputs {width} classes, but data.y holds label {y_max}; "
                    f"labels should lie in [0, {width})"
                )
            return width
        if width != n_classes:
            raise ValueError(
                f"the model outputs {width} classes, but data has n_classes={n_classes}"
            )
        return int(n_classes)

    def _place_partitions(self, pids: list[int]) -> None:
        """Make partitions ``pids`` available on their owners and check them."""
        client = self.client
        by_worker: dict[str, list[int]] = {}
        for pid in pids:
            by_worker.setdefault(self._owner_addr[pid], []).append(pid)
        path = None if isinstance(self._source, xr.Dataset) else str(self._source)
        for addr, mine in by_worker.items():
            if path is not None:
                for pid in mine:
                    self._parts[pid] = StoreRef(
                        path, int(self._bounds[pid]), int(self._bounds[pid + 1])
                    )
            else:
                arrays = [
                    ArrayPart(
                        np.asarray(self._ds["x"].isel(sample=slice(a, b)).values),
                        np.asarray(self._ds["y"].isel(sample=slice(a, b)).values),
                        int(a),
                    )
                    for a, b in ((self._bounds[p], self._bounds[p + 1]) for p in mine)
                ]
                futures = client.scatter(arrays, workers=[addr], hash=False)
                self._parts.update(zip(mine, futures, strict=True))
        checks = [
            client.submit(
                load_task,
                self._plugin.name,
                pid,
                self._parts[pid],
                pure=False,
                workers=[self._owner_addr[pid]],
                allow_other_workers=True,
                resources=self.resources,
                key=f"daskpri-load-{self.run_id}-{pid}",
            )
            for pid in pids
        ]
        client.gather(checks)

    def _warm_up(self) -> None:
        """Run the strategy once per worker on a few samples, results dropped.

        The first ``torch.func`` call on a fresh worker takes seconds; paying
        it here keeps it out of the history's training time.
        """
        first: dict[str, int] = {}
        for pid, addr in enumerate(self._owner_addr):
            first.setdefault(addr, pid)
        weights = self._weights(version=-2)
        futures = [
            self.client.submit(
                warmup_task,
                self._plugin.name,
                weights,
                self.strategy,
                pid,
                self._parts[pid],
                self.optimizer if self.local_steps > 1 else None,
                workers=[addr],
                allow_other_workers=True,
                resources=self.resources,
                pure=False,
                key=f"daskpri-warmup-{self.run_id}-{pid}",
            )
            for addr, pid in first.items()
        ]
        self.client.gather(futures)

    def _weights(self, version: int) -> Weights:
        """The master's current weights as CPU tensors, for the replicas."""
        return Weights(
            version=version,
            params=torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().clone(),
            buffers={k: v.detach().clone() for k, v in self.model.named_buffers()},
            mean_grad=self._mean_grad if self.strategy.uses_mean_grad else None,
        )

    def _init_optimizer(self) -> None:
        self._opt = make_optimizer(
            self.optimizer, list(self.model.parameters()), self._optimizer_options()
        )
        self._mean_grad = None

    # -- one step --------------------------------------------------------------------

    def _step(self, limit: int | None = None) -> dict[str, Any]:
        """One step, or one round of ``local_steps`` steps (at most ``limit``)."""
        step = self.step_
        count = self.local_steps if limit is None else max(1, min(self.local_steps, limit))
        t_start = time.perf_counter()
        for attempt in range(int(_config.get("trainer.max-retries")) + 1):
            t0 = time.perf_counter()
            # The last step's metrics ride along, for the dashboard in the cluster.
            last = self._recorder.records[-1] if self._recorder.records else None
            rounds = self._remote.step(step, self._pending, metrics=last, count=count)
            self._pending = []
            t_select = time.perf_counter() - t0
            try:
                results = self._run_tasks(step, rounds)
                break
            except (*_LOST, StepTimeout) as e:
                if attempt == int(_config.get("trainer.max-retries")):
                    raise RuntimeError(
                        f"step {step} failed {attempt + 1} times after losing workers: {e}"
                    ) from e
                if isinstance(e, StepTimeout):
                    # alive but stuck: train on without it rather than wait
                    warnings.warn(
                        f"step {step}: {e}; training goes on without them",
                        DaskpriWarning,
                        stacklevel=4,
                    )
                    self._excluded.update(e.addresses)
                self._recover()
        t1 = time.perf_counter()
        n_grad = sum(r.n_grad for r in results)
        loss_sum = sum(r.loss_sum for r in results)
        n_loss = sum(r.n_loss for r in results)
        if self.local_steps > 1:
            update = torch.stack([r.params for r in results if r.params is not None]).mean(0)
        else:
            update = torch.zeros_like(results[0].grad)
            for r in results:
                update += r.grad
        problem = None
        where = f"step {step}" if count == 1 else f"steps {step}-{step + count - 1}"
        if not math.isfinite(loss_sum):
            bad = np.concatenate([r.indices[~np.isfinite(r.priorities)] for r in results])
            problem = f"the training loss became {loss_sum} at {where}" + (
                f"; non-finite priorities for samples {bad[:10].tolist()}" if bad.size else ""
            )
        elif not bool(torch.isfinite(update).all()):
            what = "gradient" if self.local_steps == 1 else "parameters"
            problem = f"the {what} became non-finite at {where} (loss {loss_sum / max(n_loss, 1)})"
        if problem is not None and self.on_nonfinite == "raise":
            raise FloatingPointError(problem + "; " + self._save_last_good())
        skipped = problem is not None
        rate = self._rate() if n_grad and not skipped else 0.0
        if n_grad and not skipped:
            if self.local_steps > 1:
                self._apply_round(update, [r.optimizer_state for r in results])
            else:
                self._apply_gradient(update / n_grad, rate)
        t_opt = time.perf_counter() - t1
        self.step_ += count
        self.skipped_steps_ += count if skipped else 0
        for r in results:
            ok = np.isfinite(r.priorities)
            if ok.any():
                self._pending.append((r.indices[ok], r.priorities[ok], step + count - 1))
        prio = np.concatenate([r.priorities for r in results]) if results else np.empty(0)
        step_time = time.perf_counter() - t_start
        self._elapsed += step_time
        compute = max(r.compute_seconds for r in results)
        n_samples = sum(r.indices.size for r in results)
        prev = self._recorder.records[-1] if self._recorder.records else {}
        return {
            "step": self.step_ - 1,
            "selection_digest": _digest([s for sel in rounds for s in sel]),
            "skipped": float(skipped),
            "time": self._elapsed,
            "loss": loss_sum / max(n_loss, 1),
            "lr": rate,
            "train_accuracy": sum(r.correct for r in results) / max(n_loss, 1),
            "samples": prev.get("samples", 0) + n_samples,
            "grad_samples": prev.get("grad_samples", 0) + n_grad,
            "samples_per_second": n_samples / step_time,
            "step_time": step_time,
            "compute_time": compute,
            "selection_time": t_select,
            "optimizer_time": t_opt,
            "communication_time": max(0.0, step_time - t_select - compute - t_opt),
            "n_workers": len(results),
            "priority_mean": float(prio.mean()) if prio.size else math.nan,
            "priority_max": float(prio.max()) if prio.size else math.nan,
            "worker_samples": [r.indices.size for r in results],
            "worker_compute_time": [r.compute_seconds for r in results],
        }

    def _run_tasks(self, step: int, rounds: list[list[Selection]]) -> list[StepResult]:
        """Each worker's share of a step (or round), as tasks or as direct RPCs."""
        weights = self._weights(version=step)
        local = None
        if self.local_steps > 1:
            assert self._opt is not None
            local = LocalSteps(
                optimizer=self.optimizer,
                options=self._optimizer_options(),
                state=self._opt.state_dict(),
                rates=[
                    scheduled_rate(self.learning_rate, self.lr_schedule, s, self.schedule_steps)
                    for s in range(step, step + len(rounds))
                ],
            )
        args = []
        for slot in range(len(rounds[0])):
            shares = Shares.pack(
                [selections[slot] for selections in rounds], (self.seed, step, slot), self._bounds
            )
            parts = {int(p): self._parts[int(p)] for p in shares.partitions()}
            args.append([self.strategy, shares, parts, local])
        if self.transport == "direct":
            return self._run_direct(weights, args)
        client = self.client
        [wfut] = client.scatter([weights], hash=False)
        futures = [
            client.submit(
                train_task,
                self._plugin.name,
                wfut,
                *a,
                key=f"daskpri-step-{self.run_id}-{step}-{slot}-{uuid.uuid4().hex[:6]}",
                workers=[self._slots[slot]],
                allow_other_workers=True,
                resources=self.resources,
                pure=False,
            )
            for slot, a in enumerate(args)
        ]
        return wait_tasks(
            client, futures, self._slots, self.resources, dask_timeout(), _step_timeout()
        )

    def _run_direct(self, weights: Weights, args: list[list[Any]]) -> list[StepResult]:
        """One RPC per worker, past the scheduler's task machinery.

        Partitions are named by their scattered key (or store reference): the
        worker has them loaded already. A worker that dies mid-call closes its
        connection, which the step's retry treats as a lost worker.
        """
        calls = []
        for slot, a in enumerate(args):
            a[2] = {p: (r.key if isinstance(r, Future) else r) for p, r in a[2].items()}
            calls.append((self._slots[slot], (weights, *a)))
        return run_direct(self.client, calls, self._plugin.name, _step_timeout())

    def _rate(self) -> float:
        """This step's learning rate under the schedule."""
        return scheduled_rate(self.learning_rate, self.lr_schedule, self.step_, self.schedule_steps)

    def _apply_round(self, params: torch.Tensor, states: list[dict[str, Any] | None]) -> None:
        """Take the workers' mean parameters and mean optimizer state after a round."""
        assert self._opt is not None
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(params, self.model.parameters())
        self._opt.load_state_dict(average_states([s for s in states if s is not None]))

    def _optimizer_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"lr": self.learning_rate, "weight_decay": self.weight_decay}
        if self.optimizer == "sgd":
            options["momentum"] = self.momentum
        return options

    def _apply_gradient(self, grad: torch.Tensor, rate: float) -> None:
        set_flat_grad(list(self.model.parameters()), grad)
        assert self._opt is not None
        for group in self._opt.param_groups:
            group["lr"] = rate
        self._opt.step()
        if self.strategy.uses_mean_grad:
            decay = float(getattr(self.strategy, "mean_grad_decay", 0.9))
            if self._mean_grad is None:
                self._mean_grad = grad.clone()
            else:
                self._mean_grad.mul_(decay).add_(grad, alpha=1.0 - decay)

    def _recover(self) -> None:
        """Re-plan after losing workers: move their partitions to live ones.

        More workers may die while this runs (their address then vanishes
        under a scatter, a ``KeyError``): it starts over until the plan holds
        or ``no-workers-timeout`` passes.
        """
        deadline = time.monotonic() + dask_timeout()
        while True:
            try:
                self._replan(deadline)
                return
            except (KeyError, *_LOST):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _replan(self, deadline: float) -> None:
        client = self.client
        while True:
            self._check_scheduler()
            workers = client.scheduler_info(n_workers=-1)["workers"]
            try:
                live = eligible_workers(workers, self.resources, client.scheduler.address)
                live = [a for a in live if a not in self._excluded]
                # The scheduler may still list a worker that just died; data
                # scattered to it would wait for the connect timeout.
                live = self._responsive(live)
                if not live:
                    raise RuntimeError("no suitable worker answers")
                break
            except (RuntimeError, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        old = self._owner_addr
        self._owner_addr = reassign_owners([a if a in live else None for a in old], live)
        self._slots = sorted(set(self._owner_addr))
        slot_of = {a: i for i, a in enumerate(self._slots)}
        moved = [
            pid
            for pid, (a, b) in enumerate(zip(old, self._owner_addr, strict=True))
            if a != b or pid not in self._parts or _lost(self._parts[pid])
        ]
        for pid in moved:
            self._parts.pop(pid, None)
        if moved:
            self._place_partitions(moved)
        self._remote.set_owner(np.array([slot_of[a] for a in self._owner_addr], dtype=np.int64))

    def _responsive(self, addresses: list[str], timeout: float = 2.0) -> list[str]:
        """Those of ``addresses`` whose worker answers an RPC within ``timeout``."""
        client = self.client

        async def answers(address: str) -> bool:
            try:
                await asyncio.wait_for(client.rpc(address).identity(), timeout)
                return True
            except Exception:
                return False

        async def probe() -> list[bool]:
            return list(await asyncio.gather(*(answers(a) for a in addresses)))

        return [a for a, ok in zip(addresses, client.sync(probe), strict=True) if ok]

    def _save_last_good(self) -> str:
        """Checkpoint the model before the failed step, where a path is set."""
        if self.checkpoint_path is None:
            return "the model was not updated with it (no checkpoint_path= to save it to)"
        self.save(self.checkpoint_path)
        return (
            f"the model was not updated with it; its last good state (step {self.step_}) "
            f"is checkpointed to {self.checkpoint_path!r}"
        )

    def _check_scheduler(self) -> None:
        """Raise :class:`SchedulerLostError` if the scheduler does not answer.

        Waits ``daskpri.trainer.scheduler-timeout`` for an answer; the message
        names the checkpoint to resume from.
        """
        client = self.client
        timeout = _seconds(_config.get("trainer.scheduler-timeout"))
        try:
            client.sync(client.scheduler.identity, callback_timeout=timeout)
            return
        except Exception as e:
            cause: BaseException = e
        where = self.checkpoint_path
        if where is not None and os.path.exists(where):
            step = checkpoint.read(where)["step"]
            hint = (
                f"the last checkpoint is {where!r} (step {step}): resume with "
                f"daskpri.Trainer.resume({where!r}, client=...) on a new cluster"
            )
        else:
            hint = (
                "no checkpoint was written: pass checkpoint_path= and checkpoint_every= "
                "to be able to resume"
            )
        raise SchedulerLostError(
            f"lost the scheduler at {client.scheduler.address}: no answer within "
            f"{timeout:g} s (daskpri.trainer.scheduler-timeout); {hint}"
        ) from cause

    def _evaluate(self, evalset: EvalSet, record: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        acc, loss = evalset.evaluate(self.model)
        record["accuracy"], record["eval_loss"] = acc, loss
        record["eval_time"] = time.perf_counter() - t0

    def _flush(self) -> None:
        if self._pending:
            last = self._recorder.records[-1] if self._recorder.records else None
            self._remote.update(self._pending, metrics=last)
            self._pending = []

    # -- checkpoints ---------------------------------------------------------------------

    def _init_params(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "n_workers": self.n_workers,
            "resources": self.resources,
            "batch_size": self.batch_size,
            "learning_rate": self.learning_rate,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "optimizer": self.optimizer,
            "lr_schedule": self.lr_schedule,
            "schedule_steps": self.schedule_steps,
            "local_steps": self.local_steps,
            "eval_every": self.eval_every,
            "partition_size": self.partition_size,
            "staleness": self.staleness,
            "device": self.device,
            "checkpoint_path": self.checkpoint_path,
            "checkpoint_every": self.checkpoint_every,
            "transport": self.transport,
            "on_nonfinite": self.on_nonfinite,
        }

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
        self._flush()
        return checkpoint.write(
            {
                "step": self.step_,
                "elapsed": self._elapsed,
                "model": self.model.state_dict(),
                "model_spec": getattr(self.model, "spec", None),
                "optimizer": self._opt.state_dict(),
                "mean_grad": self._mean_grad,
                "strategy": {"name": self.strategy.name, "params": self.strategy.get_params()},
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

        The file is read weights-only. ``model`` is a module of the run's
        architecture (its weights are replaced); it may be left out for the
        built-in models. Call :meth:`fit` with the same data to go on: the
        step count, history, table and selections continue.
        """
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
        strategy = get_strategy(state["strategy"]["name"], **state["strategy"]["params"])
        trainer = cls(model, strategy=strategy, client=client, **params)
        trainer.step_ = int(state["step"])
        trainer._elapsed = float(state["elapsed"])
        trainer._recorder.records = list(state["history"])
        trainer._resume_state = {
            "optimizer": state["optimizer"],
            "mean_grad": state["mean_grad"],
            "table": checkpoint.from_storable(state["table"]),
        }
        return trainer

    def _restore(self, state: dict[str, Any], owner: np.ndarray) -> None:
        assert self._opt is not None
        self._opt.load_state_dict(state["optimizer"])
        self._mean_grad = state["mean_grad"]
        self._remote.load_state_dict(state["table"])
        # the cluster may have another size now: partitions go where they are
        self._remote.set_owner(owner)

    @property
    def _remote(self) -> RemoteTable:
        if self._table is None:
            raise RuntimeError("the trainer has no table in the cluster yet: call fit first")
        return self._table

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
                "optimizer": self.optimizer,
                "lr_schedule": self.lr_schedule,
                "schedule_steps": self.schedule_steps if self.schedule_steps else 0,
                "local_steps": self.local_steps,
                "n_workers": len(getattr(self, "_slots", ())),
                "resources": repr(self.resources),
                # placing data, building replicas, warm-up: not in ``time``
                "setup_time": self._setup_time,
            }
        )

    @property
    def table_(self) -> xr.DataArray:
        """The current priorities along ``sample`` (fetched from the cluster)."""
        if self._data_key is None:
            raise RuntimeError("table_ is available after fit")
        self._flush()
        p = self._remote.priorities()
        pid = np.repeat(np.arange(len(self._bounds) - 1), np.diff(self._bounds))
        return xr.DataArray(
            p["priority"],
            dims="sample",
            coords={"version": ("sample", p["version"]), "partition": ("sample", pid)},
            name="priority",
            attrs={"strategy": self.strategy.name, "staleness": self.staleness},
        )


def _crossed(before: int, after: int, every: int) -> bool:
    """Whether a multiple of ``every`` lies in ``(before, after]``."""
    return after // every > before // every


def _digest(selections: list[Selection]) -> float:
    """CRC-32 of a step's selected samples (exact in a float64 history)."""
    crc = 0
    for s in selections:
        crc = zlib.crc32(np.ascontiguousarray(s.train, dtype=np.int64).tobytes(), crc)
    return float(crc)


def _lost(ref: StoreRef | Future | None) -> bool:
    """Whether a partition's scattered data is gone (a store is never lost)."""
    return isinstance(ref, Future) and ref.status != "finished"


class SchedulerLostError(RuntimeError):
    """The scheduler stopped answering: the run cannot go on in this cluster."""


def _seconds(value: str | float) -> float:
    from dask.utils import parse_timedelta

    return float(parse_timedelta(value, default="s"))


def _step_timeout() -> float:
    return _seconds(_config.get("trainer.step-timeout"))


def dask_timeout() -> float:
    """The no-workers timeout of the ``daskpri.trainer`` config, in seconds."""
    return _seconds(_config.get("trainer.no-workers-timeout"))


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} should be {kind}, but got {name}={value!r}")
    return int(value)


def _check_real(name: str, value: Any, low: float, high: float) -> float:
    """``value`` as a float if it is a number in ``[low, high)``."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not low <= float(value) < high:
        raise ValueError(
            f"{name} should be a number in [{low:g}, {high:g}), but got {name}={value!r}"
        )
    return float(value)


def _check_float(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{name} should be a positive finite number, but got {name}={value!r}")
    return float(value)
