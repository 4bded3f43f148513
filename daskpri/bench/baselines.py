"""What daskpri is measured against: a plain PyTorch loop, PyTorch DDP, and plain loops at once.

Both train the model :func:`daskpri.models.build_model` gives, with the
trainer's optimizer (SGD with the same learning rate and momentum) and the same
batch per process, in shuffled epochs, and time themselves as the trainer's
history does: evaluation excluded, everything else included. Each process uses
one torch thread, as a daskpri worker does (the Dask nanny sets
``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import queue as queue_module
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from daskpri.bench.records import Curve
from daskpri.replicas.replica import PRECISIONS
from daskpri.training.cluster import one_torch_thread

__all__ = ["BaselineResult", "start_method", "train_ddp", "train_plain", "train_plain_loops"]

#: How :func:`train_ddp` and :func:`train_plain_loops` may start their processes
#: (``fork`` is left out: a process forked from a parent whose torch has started
#: threads can hang in them).
START_METHODS = ("spawn", "forkserver")


@dataclass
class BaselineResult:
    """The curve of a baseline run and the samples it processed (all processes)."""

    curve: Curve
    samples: int


@dataclass
class _Job:
    """What one process trains: its share of the data and the settings."""

    model: nn.Module
    x: np.ndarray
    y: np.ndarray
    test_x: np.ndarray | None
    test_y: np.ndarray | None
    batch_size: int
    learning_rate: float
    momentum: float
    budget: float
    eval_seconds: float
    seed: int
    device: str = "cpu"
    max_grad_norm: float | None = None
    label_smoothing: float = 0.0
    precision: str = "float32"


def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], 2048):
            correct += int((model(x[i : i + 2048]).argmax(1) == y[i : i + 2048]).sum())
    model.train()
    return correct / max(x.shape[0], 1)


def _loop(job: _Job, *, rank: int = 0, world: int = 1) -> BaselineResult:
    """Shuffled-epoch SGD for ``job.budget`` seconds; with ``world > 1`` under DDP."""
    device = torch.device(job.device)
    model = job.model.to(device)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(job.model)
    opt = torch.optim.SGD(model.parameters(), lr=job.learning_rate, momentum=job.momentum)
    # on the device once, as a daskpri worker holds its partitions
    x = torch.as_tensor(np.asarray(job.x, dtype=np.float32), device=device)
    y = torch.as_tensor(np.asarray(job.y, dtype=np.int64), device=device)
    tx = ty = None
    if job.test_x is not None and job.test_y is not None:
        tx = torch.as_tensor(np.asarray(job.test_x, dtype=np.float32), device=device)
        ty = torch.as_tensor(np.asarray(job.test_y, dtype=np.int64), device=device)
    rng = np.random.default_rng((job.seed, rank))
    perm, pos = rng.permutation(x.shape[0]), 0
    # the forward pass as a daskpri replica's in this precision (the loss in float32)
    dtype = PRECISIONS[job.precision]
    autocast: Any = (contextlib.nullcontext() if dtype is None
                     else torch.autocast(device.type, dtype=dtype))
    times: list[float] = []
    accs: list[float] = []
    losses: list[float] = []
    elapsed, step, next_eval = 0.0, 0, job.eval_seconds
    shared = torch.zeros(2)  # [stop flag, loss sum]: one all-reduce per step
    while True:
        t0 = time.perf_counter()
        if pos + job.batch_size > perm.size:
            perm, pos = rng.permutation(x.shape[0]), 0
        idx = torch.as_tensor(perm[pos : pos + job.batch_size], device=device)
        pos += job.batch_size
        with autocast:
            logits = model(x[idx])
        loss = F.cross_entropy(logits.float(), y[idx], label_smoothing=job.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if job.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), job.max_grad_norm)
        opt.step()
        step += 1
        if world > 1:
            import torch.distributed as dist

            # rank 0's clock decides when all stop
            stop = rank == 0 and elapsed + time.perf_counter() - t0 >= job.budget
            shared[0], shared[1] = float(stop), float(loss.detach())
            dist.all_reduce(shared)
            stop, loss_value = bool(shared[0] > 0), float(shared[1]) / world
        else:
            loss_value = float(loss.detach())
            stop = elapsed + time.perf_counter() - t0 >= job.budget
        elapsed += time.perf_counter() - t0
        times.append(elapsed)
        losses.append(loss_value)
        acc = math.nan
        if tx is not None and ty is not None and (stop or elapsed >= next_eval):
            acc = _evaluate(job.model, tx, ty)
            next_eval = elapsed + job.eval_seconds
        accs.append(acc)
        if stop:
            break
    curve = Curve(times, np.arange(1, step + 1), accs, losses)
    return BaselineResult(curve, step * job.batch_size * world)


def train_plain(
    model: nn.Module,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    batch_size: int,
    learning_rate: float,
    momentum: float,
    budget: float,
    eval_seconds: float,
    seed: int,
    device: str = "cpu",
    max_grad_norm: float | None = None,
    label_smoothing: float = 0.0,
    precision: str = "float32",
) -> BaselineResult:
    """Train ``model`` (in place) in this process for ``budget`` seconds, one torch thread.

    Parameters
    ----------
    model : torch.nn.Module
    train, test : (x, y) pairs of numpy arrays
    batch_size, learning_rate, momentum
        As the trainer's.
    budget : float
        Seconds of training, evaluation excluded.
    eval_seconds : float
        Training seconds between evaluations on ``test`` (a time, not a
        step count: these loops take far shorter steps than the trainer).
    seed : int
        Seeds the shuffles.
    device : str
        Where to train: ``"cpu"``, or ``"cuda"`` to compare with workers
        that train on their GPU. The data is moved there once, and each
        step's loss is read back (which waits for the GPU), so the clock
        takes in the device's work.
    max_grad_norm, label_smoothing, precision
        As the trainer's: the gradient clipped to this norm (``None``: not
        clipped), the training loss's label smoothing, and the forward
        pass's ``torch.autocast`` (``"bfloat16"``; ``"float32"``: none).

    Examples
    --------
    >>> from daskpri.models import build_model
    >>> x, y = np.random.default_rng(0).normal(size=(256, 8)), np.arange(256) % 2
    >>> model = build_model("mlp", {"x_shape": (8,), "n_classes": 2})
    >>> r = train_plain(model, (x, y), (x, y), batch_size=32, learning_rate=0.05,
    ...                 momentum=0.9, budget=0.2, eval_seconds=0.05, seed=0)
    >>> r.samples == 32 * int(r.curve.step[-1])
    True
    """
    with one_torch_thread():
        job = _Job(model, train[0], train[1], test[0], test[1], batch_size, learning_rate,
                   momentum, budget, eval_seconds, seed, device, max_grad_norm,
                   label_smoothing, precision)
        return _loop(job)


def start_method() -> str:
    """How the baselines of many processes start them: ``daskpri.bench.start-method``.

    ``"spawn"`` (the default) starts fresh interpreters, as ``torchrun``
    does; ``"forkserver"`` forks them from :mod:`multiprocessing`'s fork
    server, at once where that server has imported torch
    (:func:`multiprocessing.set_forkserver_preload`). The processes start
    before their budgets do, either way.

    >>> import dask
    >>> with dask.config.set({"daskpri.bench.start-method": "spawn"}):
    ...     start_method()
    'spawn'
    >>> with dask.config.set({"daskpri.bench.start-method": "fork"}):
    ...     start_method()
    Traceback (most recent call last):
    ValueError: daskpri.bench.start-method should be spawn or forkserver, but got 'fork'
    """
    from daskpri import _config

    method = _config.get("bench.start-method")
    if method not in START_METHODS:
        raise ValueError(f"daskpri.bench.start-method should be {' or '.join(START_METHODS)}, "
                         f"but got {method!r}")
    return str(method)


def _process(rank: int, world: int, rendezvous: str, job: _Job, queue: Any, barrier: Any,
             communicate: bool, gloo_ifname: str) -> None:
    """One of ``world`` processes: under DDP (gloo on ``gloo_ifname``), or on its own.

    Under DDP rank 0 sends the curve and every process's samples; on its own
    each process sends its samples (rank 0 its curve too), after starting
    with the others at ``barrier``.
    """
    try:
        # set here, not inherited: a forkserver's process has the server's environment
        os.environ["GLOO_SOCKET_IFNAME"] = gloo_ifname
        torch.set_num_threads(1)
        # torch.multiprocessing hands a process the model's tensors in shared memory:
        # without a copy of its own every process would step the same parameters
        # (DDP then applies each averaged update once per process)
        job = dataclasses.replace(job, model=copy.deepcopy(job.model))
        if not communicate:
            barrier.wait(timeout=120)
            result = _loop(job, rank=rank)
            queue.put(("ok", result.curve.to_dict() if rank == 0 else None, result.samples))
            return
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=rendezvous, rank=rank, world_size=world
        )
        try:
            result = _loop(job, rank=rank, world=world)
        finally:
            dist.destroy_process_group()
        if rank == 0:
            queue.put(("ok", result.curve.to_dict(), result.samples))
    except BaseException:
        queue.put(("error", f"rank {rank}: {traceback.format_exc()}", 0))


def train_ddp(
    model: nn.Module,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    processes: int = 2,
    **options: Any,
) -> BaselineResult:
    """Train ``model`` with PyTorch DDP on ``processes`` local processes (gloo).

    Each process holds a contiguous share of ``train`` (as daskpri places
    partitions) and a batch of ``batch_size`` per step; rank 0 evaluates on
    ``test`` (its clock, evaluation excluded, decides when all stop).

    Parameters
    ----------
    processes : int
        Processes, each with one torch thread, started as
        :func:`start_method` says (spawned by default).
    **options
        ``batch_size``, ``learning_rate``, ``momentum``, ``budget``,
        ``eval_seconds`` and ``seed`` as for :func:`train_plain`, and
        ``timeout``: seconds to wait for the processes (default
        ``3 * budget + 120``).

    Raises
    ------
    RuntimeError
        If a process fails or the run takes longer than ``timeout``.
    """
    return _spawn(model, train, test, processes=processes, communicate=True, **options)


def train_plain_loops(
    model: nn.Module,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    processes: int = 2,
    **options: Any,
) -> BaselineResult:
    """``processes`` plain loops at once, each on its share of ``train``, none talking.

    What the machine gives ``processes`` one-thread trainers over one, with
    no communication at all: a reference for a data-parallel run's
    samples/s here (not a strict bound: a daskpri worker's step is not the
    plain loop's, and uses memory differently). Started together (a
    barrier), each trains its own copy of ``model`` for ``budget`` seconds;
    the samples are all processes', the curve rank 0's (its model saw only
    its share: not a result to compare accuracies with). Parameters and
    errors as :func:`train_ddp`.
    """
    return _spawn(model, train, test, processes=processes, communicate=False, **options)


def _spawn(
    model: nn.Module,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    processes: int,
    communicate: bool,
    batch_size: int,
    learning_rate: float,
    momentum: float,
    budget: float,
    eval_seconds: float,
    seed: int,
    timeout: float | None = None,
    max_grad_norm: float | None = None,
    label_smoothing: float = 0.0,
    precision: str = "float32",
) -> BaselineResult:
    import torch.multiprocessing as mp

    what = "DDP" if communicate else "plain-loops"
    if processes < 2:
        raise ValueError(f"processes should be at least 2, but got processes={processes}")
    ctx: Any = mp.get_context(start_method())  # a SpawnContext or a ForkServerContext
    queue = ctx.Queue()
    barrier = ctx.Barrier(processes)
    # The processes meet through a file: a tcp:// rendezvous starts torch's
    # store server on every interface, whatever address it is given.
    rendezvous_dir = tempfile.mkdtemp(prefix="daskpri-ddp-")
    rendezvous = "file://" + os.path.join(rendezvous_dir, "store")
    x, y = train
    bounds = np.linspace(0, len(y), processes + 1).astype(int)
    procs = []
    # loopback only, unless the user's environment names another interface
    ifname = os.environ.get("GLOO_SOCKET_IFNAME") or ("lo0" if sys.platform == "darwin" else "lo")
    for rank in range(processes):
        a, b = bounds[rank], bounds[rank + 1]
        job = _Job(model, x[a:b], y[a:b], test[0] if rank == 0 else None,
                   test[1] if rank == 0 else None, batch_size, learning_rate, momentum,
                   budget, eval_seconds, seed, max_grad_norm=max_grad_norm,
                   label_smoothing=label_smoothing, precision=precision)
        p = ctx.Process(target=_process,
                        args=(rank, processes, rendezvous, job, queue, barrier, communicate,
                              ifname))
        p.start()
        procs.append(p)
    limit = 3 * budget + 120 if timeout is None else timeout
    deadline = time.monotonic() + limit
    curve, samples, finished = None, 0, False
    try:
        for _ in range(1 if communicate else processes):
            while True:
                try:
                    status, payload, n = queue.get(timeout=1.0)
                    break
                except queue_module.Empty:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the {what} run did not finish within {limit:g} s") from None
                    codes = [p.exitcode for p in procs]
                    if any(c not in (None, 0) for c in codes):
                        raise RuntimeError(
                            f"a {what} process died (exit codes {codes})") from None
            if status != "ok":
                raise RuntimeError(f"the {what} run failed in {payload}")
            curve = payload if payload is not None else curve
            samples += int(n)
        finished = True
    finally:
        for p in procs:
            p.join(timeout=30 if finished else 0)  # the others of a failed run may wait
            if p.is_alive():
                p.terminate()
                p.join()
        shutil.rmtree(rendezvous_dir, ignore_errors=True)
    assert curve is not None
    return BaselineResult(Curve.from_dict(curve), samples)
