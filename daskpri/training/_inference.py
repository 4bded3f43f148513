"""The trainer's model scored and run on other data: :meth:`evaluate` and :meth:`predict`.

A mixin of :class:`~daskpri.training.trainer.Trainer`. Both take data as
``fit`` does (in memory or a path) and need no cluster: ``evaluate`` scores
on the driver, as a fit scores its ``eval_data`` (or, ``chunked``, a task
per chunk where Dask computes); ``predict`` runs the model chunk by chunk
where the result is computed, lazily where the data is. Each runs the model
on the device of the process that computes (:func:`run_device`): a Dask
worker's GPU where its ``GPU`` resource names one, as its replicas train.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import dask
import dask.array as da
import numpy as np
import torch
import xarray as xr
from distributed import Client, default_client
from torch import nn

from daskpri import _config
from daskpri.data._persisted import driver_scheduler
from daskpri.data.io import open_dataset, validate_dataset
from daskpri.replicas.devices import device_name
from daskpri.training._checks import check_label_range, check_model, model_output_width
from daskpri.training._chunk_tasks import (  # noqa: F401  (PREDICT_BATCH*: re-exported)
    PREDICT_BATCH,
    PREDICT_BATCH_ACCELERATED,
    Sent,
    _logits,
    _scored,
    run_device,
)
from daskpri.training._probe import cannot_read
from daskpri.training.errors import FIT_RUNNING as _FIT_RUNNING
from daskpri.training.evaluation import EvalSet
from daskpri.training.placement import check_workers_see, eligible_workers
from daskpri.training.transport import ask_workers

#: Samples a task of ``evaluate(chunked=True)`` takes of data in memory, not chunked
EVALUATE_CHUNK = 10_000


def _batch_size(value: Any) -> int | None:
    """``batch_size`` checked: None or a positive integer."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | np.integer)
                              or value < 1):
        raise ValueError(f"batch_size should be a positive integer, but got batch_size={value!r}")
    return None if value is None else int(value)


def _device_arg(device: Any) -> str | None:
    """``device`` checked as a torch device's name (or ``None``): what a task is sent.

    >>> _device_arg("cuda:1"), _device_arg(torch.device("cpu")), _device_arg(None)
    ('cuda:1', 'cpu', None)
    >>> _device_arg("abacus")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: device should name a torch device like 'cpu', ..., but got 'abacus'
    """
    if device is None:
        return None
    try:
        return device_name(device)
    except ValueError:
        raise ValueError(
            "device should name a torch device like 'cpu', 'cuda' or 'cuda:1' (or be None: "
            "each Dask worker's GPU where its GPU resource names one, as its replicas "
            f"train, else its CPU; the driver's as daskpri.trainer.eval-device), but got "
            f"{device!r}"
        ) from None


def _default_client() -> Client | None:
    """The client that a compute of a graph made now would use (None: Dask's own schedulers)."""
    try:
        client = default_client()
    except ValueError:
        return None
    return client if dask.config.get("scheduler", None) in (None, "dask.distributed") else None


def _model_in_graph(model: nn.Module, client: Client | None = None) -> Any:
    """``model`` as the argument of a graph's tasks, where they compute.

    On a distributed cluster (``client``, else the default client), scattered
    to a worker and named by its future; else the object itself, for Dask's
    threads. distributed's scheduler unpickles each graph it is given: a
    torch module in it had the scheduler import torch (seconds of its event
    loop, some 200 MiB) and hold the weights; a future is only a key. Each
    worker that runs a task fetches the model once.
    """
    sent = Sent(model)  # (pickled whole on each hop: see Sent)
    client = client if client is not None else _default_client()
    if client is None:
        return dask.delayed(sent, pure=False)
    return client.scatter(sent, hash=False)


def _whole_samples(x: da.Array) -> tuple[da.Array, str]:
    """``x`` in chunks of samples whole along its other dimensions, and their blockwise index."""
    return x.rechunk({i: -1 for i in range(1, x.ndim)}), "abcdefghij"[: x.ndim - 1]


def _chunk_scores(
    ds: xr.Dataset, model: nn.Module, batch_size: int | None, n_classes: int,
    device: str | None = None, client: Client | None = None, name: str = "data",
    resources: dict[str, float] | None = None,
) -> dict[str, float]:
    """:meth:`InferenceMixin.evaluate`'s figures, scored a task per chunk of ``ds``'s samples
    (computed by ``client``'s cluster, on its workers with ``resources`` where given, else
    where Dask computes)."""
    x, y = ds["x"].data, ds["y"].data
    if not isinstance(x, da.Array):
        x = da.from_array(x, chunks=(EVALUATE_CHUNK,) + x.shape[1:])
    x, inner = _whole_samples(x)
    y = da.asarray(y).rechunk((x.chunks[0],))
    # each chunk's first sample, a chunk of one each: blocks aligned by their order
    starts = da.from_array(np.cumsum((0, *x.chunks[0][:-1])), chunks=1)
    parts = da.blockwise(
        _scored, "sk", x, "s" + inner, y, "s", starts, "s", _model_in_graph(model, client),
        None, batch_size, None, n_classes, None, device, None, name, None, new_axes={"k": 3},
        adjust_chunks={"s": 1},
        align_arrays=False, concatenate=True, dtype=np.float64,
        meta=np.empty((0, 0), np.float64),
    )
    total = parts.sum(axis=0)
    # (client.compute's resources hold every task of the graph: dask.annotate's are lost
    # to the array graph's optimization)
    summed = total.compute() if client is None else client.compute(
        total, resources=resources).result()
    correct, loss, n = (float(v) for v in summed)
    return {"accuracy": correct / max(n, 1.0), "loss": loss / max(n, 1.0), "samples": int(n)}


class ChunkedEvalSet:
    """A fit's ``eval_data`` scored on its cluster, a task per chunk (``eval_chunked=True``).

    As :meth:`InferenceMixin.evaluate` scores with ``chunked=True``: each
    evaluation sends a copy of the master model, and each chunk's task
    scores it on its worker's device (a ``GPU``-tagged worker's GPU, else
    its CPU), checking its chunk's ``x``; the driver reads only the labels,
    once (:meth:`check`). A store's chunks are read by the workers, by its
    path, at each evaluation; data in the driver's memory is sent to the
    cluster once, as the fit starts (:meth:`place`), in chunks of
    :data:`EVALUATE_CHUNK` samples. Where the run asks for ``resources``
    (``GPU``), the tasks run on the workers that have them, as its steps do.

    Parameters
    ----------
    ds : xarray.Dataset
        ``x`` and ``y`` along ``sample`` (opened, not read).
    path : str, optional
        The store it was opened from, which every worker should read.
    """

    def __init__(self, ds: xr.Dataset, path: str | None = None) -> None:
        self.ds = ds[["x", "y"]]
        self.path = path
        self.n_classes: int | None = None
        self.resources: dict[str, float] | None = None

    def check(self, n_classes: int) -> None:
        """Raise ``ValueError`` on labels out of ``[0, n_classes)``: read here, as a fit's are."""
        check_label_range(self.ds, n_classes, "eval_data")
        self.n_classes = n_classes

    def place(self, client: Client, resources: dict[str, float] | None = None) -> None:
        """Check that the workers of ``client`` with ``resources`` read the store; send data
        in memory there.

        Raises ``FileNotFoundError`` naming the workers that cannot read the
        store, before the fit's first step.
        """
        self.resources = resources
        if self.path is not None:
            workers = eligible_workers(client.scheduler_info(n_workers=-1)["workers"],
                                       resources, client.scheduler.address)
            timeout = _config.get_seconds("trainer.probe-timeout")
            found = ask_workers(client, workers, cannot_read, self.path, timeout=timeout)
            check_workers_see({a: r for a, r in found.items() if r is None or isinstance(r, str)},
                              len(workers), self.path, name="eval_data")
        elif not isinstance(self.ds["x"].data, da.Array):
            chunked = self.ds.chunk({"sample": EVALUATE_CHUNK})
            self.ds = client.persist(chunked, resources=resources)

    def evaluate(self, model: nn.Module, client: Client | None = None) -> tuple[float, float]:
        """Accuracy and mean loss of ``model`` (a copy, on the CPU, sent to the tasks)."""
        if self.n_classes is None:
            raise RuntimeError("ChunkedEvalSet.check(n_classes) comes before evaluate")
        with torch.no_grad():
            scored = copy.deepcopy(model).cpu().eval()
        scores = _chunk_scores(self.ds, scored, None, self.n_classes, None, client,
                               name="eval_data", resources=self.resources)
        return scores["accuracy"], scores["loss"]


class InferenceMixin:
    """:meth:`evaluate` and :meth:`predict`, for :class:`~daskpri.training.trainer.Trainer`."""

    # set by Trainer.__init__
    model: nn.Module
    step_: int
    _fitting: threading.Lock  # held from a fit's call to its end: one at a time

    def evaluate(
        self, data: xr.Dataset | str, *, batch_size: int | None = None, chunked: bool = False,
        device: str | torch.device | None = None,
    ) -> dict[str, float]:
        """Accuracy and mean loss of the model on ``data``, scored as a fit scores ``eval_data``.

        On the driver, where a fit evaluates: on its GPU where it has one,
        else its CPU (``daskpri.trainer.eval-device``), the model in
        evaluation mode and left as it was. No cluster is needed: a trainer
        never fitted scores its model as given. With ``chunked=True``, data
        too large for the driver is scored a task per chunk of samples, as
        :meth:`predict` runs: on the default client's workers (or threads
        where there is none), a copy of the model on each worker's device
        (its GPU where its ``GPU`` resource names one, else its CPU).

        Parameters
        ----------
        data : xarray.Dataset or path
            ``x`` and ``y`` along ``sample``, as ``fit`` takes them; read
            whole on the driver (but with ``chunked``). Its labels should lie
            within the model's classes (the data's ``n_classes``, else the
            model's output width).
        batch_size : int, optional
            Samples per forward pass (256 on the CPU, 4096 on a GPU).
        chunked : bool, default False
            Score chunk by chunk through Dask rather than whole on the
            driver (only the labels are read there, for their check). Where
            ``data`` is in memory and not chunked, its samples are taken in
            chunks of 10,000. The figures are those of the driver's scoring:
            the accuracy exactly, the loss to float32's rounding.
        device : str or torch.device, optional
            Where to run the model, as :meth:`predict` takes it: by default
            the driver's evaluation device, or with ``chunked`` each
            worker's.

        Returns
        -------
        dict
            ``{"accuracy": ..., "loss": ..., "samples": ...}``: the fraction
            of samples whose largest logit is their label, the mean
            cross-entropy (without the fit's label smoothing, as the history's
            ``eval_loss``) and the number of samples scored.

        Raises
        ------
        ValueError
            If ``data`` is refused (as ``fit`` refuses ``eval_data``),
            ``batch_size`` is not a positive integer, or ``device`` names no
            torch device, or a GPU that the process that runs the model
            lacks. With ``chunked``, a value of ``x`` that is not finite (or
            such a GPU) is found by a chunk's task, and raised from there,
            naming its sample (or the worker).
        TypeError
            If ``chunked`` is not a bool.
        FileNotFoundError
            If ``data`` names a path where there is nothing.
        RuntimeError
            If a fit of this trainer is running: its model changes with
            every step.

        Examples
        --------
        >>> import daskpri
        >>> from daskpri.models import build_model
        >>> train, test = daskpri.datasets.load("synthetic", n_samples=1000)
        >>> trainer = daskpri.Trainer(build_model("mlp", train, seed=0))
        >>> scores = trainer.evaluate(test)
        >>> sorted(scores), scores["samples"]
        (['accuracy', 'loss', 'samples'], 200)
        >>> chunked = trainer.evaluate(test.chunk({"sample": 50}), chunked=True)
        >>> chunked["accuracy"] == scores["accuracy"], chunked["samples"]
        (True, 200)
        >>> trainer.close()
        """
        batch_size = _batch_size(batch_size)
        device = _device_arg(device)
        if not isinstance(chunked, bool):
            raise TypeError(f"chunked should be True or False, but got chunked={chunked!r}")
        if not self._fitting.acquire(blocking=False):
            raise RuntimeError(_FIT_RUNNING.replace("before fitting again", "before evaluating"))
        try:
            ds = open_dataset(data, name="data")
            info = validate_dataset(ds, name="data")
            if not chunked:
                # read once, whole: the checks (labels, finite values) then read memory
                ds = ds[["x", "y"]].compute(scheduler=driver_scheduler(ds))
                check_model(self.model, ds, info)
                evalset = EvalSet(ds, batch_size=batch_size, device=run_device(device))
                accuracy, loss = evalset.evaluate(self.model)
                return {"accuracy": accuracy, "loss": loss, "samples": int(evalset.y.shape[0])}
            width = check_model(self.model, ds, info)  # the labels read here, not x
            with torch.no_grad():  # as it is now, apart from the trainer's
                model = copy.deepcopy(self.model).cpu().eval()
        finally:
            self._fitting.release()
        # the copy scored where Dask computes: the trainer may fit meanwhile
        return _chunk_scores(ds, model, batch_size, width, device)

    def predict(
        self, data: xr.Dataset | str, *, batch_size: int | None = None,
        device: str | torch.device | None = None,
    ) -> xr.DataArray:
        """The model's logits for each sample of ``data``: a DataArray along (sample, class).

        Lazy where ``data``'s ``x`` is (a zarr store or netCDF file given by
        path, chunked data): a Dask array, one task per chunk of samples,
        computed where you compute it (your client's cluster, or threads),
        each worker receiving the model once. In memory where ``x`` is. The
        model is a copy of the trainer's as it is at the call, run in
        evaluation mode: a later ``fit`` does not change the result. It runs
        where each chunk is computed: on a Dask worker's GPU where the
        worker has a ``GPU`` resource and CUDA (the device its replicas train
        on), else on its CPU; on the driver (data in memory, or Dask's local
        threads) on ``daskpri.trainer.eval-device``, its GPU where it has
        one.

        Parameters
        ----------
        data : xarray.Dataset or path
            ``x`` along ``sample``, as ``fit`` takes it; ``y`` is not needed
            (nor read).
        batch_size : int, optional
            Samples per forward pass (default 256 on a CPU, 4096 on a GPU).
        device : str or torch.device, optional
            Run the model there rather than as above, for example
            ``"cpu"``, or ``"cuda:1"`` on workers of several GPUs; checked
            as a device's name at the call, and where each chunk runs.

        Returns
        -------
        xarray.DataArray
            ``logits``, float32, dimensions ``("sample", "class")``, with
            ``data``'s coordinates along ``sample`` and ``class`` numbered
            from 0; its ``step`` attribute is the trainer's step at the call.
            ``.argmax("class")`` gives the predicted classes.

        Raises
        ------
        ValueError
            If ``data`` is refused (its layout, or a model that cannot run
            on two of its samples), ``batch_size`` is not a positive
            integer, or ``device`` names no torch device, or a GPU that the
            process that runs the model lacks (for lazy data, raised as the
            chunks compute, naming the worker).
        FileNotFoundError
            If ``data`` names a path where there is nothing.
        RuntimeError
            If a fit of this trainer is running: its model changes with
            every step.

        Examples
        --------
        >>> import daskpri
        >>> from daskpri.models import build_model
        >>> train, test = daskpri.datasets.load("synthetic", n_samples=1000)
        >>> trainer = daskpri.Trainer(build_model("mlp", train, seed=0))
        >>> logits = trainer.predict(test.chunk({"sample": 50}))
        >>> logits.dims, logits.shape, logits.chunks[0][:2]
        (('sample', 'class'), (200, 10), (50, 50))
        >>> predicted = logits.argmax("class").compute(scheduler="threads")
        >>> trainer.close()
        """
        batch = _batch_size(batch_size)
        device = _device_arg(device)
        if not self._fitting.acquire(blocking=False):
            raise RuntimeError(_FIT_RUNNING.replace("before fitting again", "before predicting"))
        try:
            ds = open_dataset(data, name="data", labels=False)
            info = validate_dataset(ds, name="data", labels=False)
            width = model_output_width(self.model, ds, info)
            with torch.no_grad():  # as it is now, apart from the trainer's
                model = copy.deepcopy(self.model).cpu().eval()
            step = self.step_
        finally:
            self._fitting.release()
        x = ds["x"]
        if isinstance(x.data, da.Array):
            arr, inner = _whole_samples(x.data)
            values: Any = da.blockwise(
                _logits, "sc", arr, "s" + inner, _model_in_graph(model), None,
                batch, None, device, None, new_axes={"c": width}, concatenate=True,
                dtype=np.float32,
                meta=np.empty((0, 0), np.float32),
            )
        else:
            values = _logits(np.asarray(x.values), Sent(model), batch, device)
        coords = {name: c for name, c in x.coords.items() if c.dims == ("sample",)}
        return xr.DataArray(
            values, dims=("sample", "class"), coords={**coords, "class": np.arange(width)},
            name="logits",
            attrs={"long_name": "the model's logits", "step": step},
        )
