"""The device a worker's replica trains on: one accelerator per worker process.

``dask worker --nworkers 2 --resources GPU=1`` on a host of two GPUs starts
two worker processes that each see both GPUs. Where the run's device names
only an accelerator's kind (``"cuda"`` or ``"xpu"``, or no device on a
worker with a ``GPU`` resource) and a worker's process sees several devices
of it, the worker processes of a host share them out
(:func:`spread_device`): each takes the one at its place among them, as the
scheduler lists them, ordered by their nannies' addresses (a nanny restarts
its worker under a new address, which then takes the same device). Without
this, every process took device 0, and the other GPUs idled.
``CUDA_VISIBLE_DEVICES`` holds as torch applies it (a process that sees one
GPU trains on it), and a numbered device (``"cuda:1"``) is taken as given.

Each process's choice is kept on the scheduler (its metadata, under
``("daskpri", "devices", host)``), and a process that chooses later takes
the device its live peers hold least, its place's where that is one of
those: one that joins after others left, whose place's GPU a peer holds,
takes one that none holds rather than share. Processes that start
together choose at once, by place alone (each sees none of the others'
choices). Each choice also drops the records of processes gone since, on
any host (:func:`kept_devices`): a long-lived scheduler of autoscaled
workers keeps one per live process, not one per process that ever chose.
Start one process per GPU with ``CUDA_VISIBLE_DEVICES`` set to pin each
for good.

Examples
--------
>>> peers = ["tcp://10.0.0.5:40417", "tcp://10.0.0.5:39811"]  # nannies of one host
>>> [spread_device("cuda", 2, me, peers) for me in peers]
['cuda:1', 'cuda:0']
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from distributed.comm.addressing import get_address_host
from distributed.core import clean_exception
from distributed.protocol import pickle

if TYPE_CHECKING:  # torch is the workers': the scheduler keeps their devices without it
    import torch

logger = logging.getLogger(__name__)

#: accelerator kinds of which a process may see several, numbered from 0
SPREAD_KINDS = ("cuda", "xpu")

#: where on the scheduler (its metadata, below the host) each process's choice is kept
DEVICES_KEY = ("daskpri", "devices")


def spread_device(
    kind: str, count: int, me: str, peers: Collection[str],
    held: Mapping[str, str] | None = None,
) -> str:
    """The device of ``kind`` for worker process ``me`` among ``peers``, those of its host.

    Each takes the device at its place among ``me`` and ``peers`` sorted
    by address (ports as numbers), modulo ``count``: as many processes as
    devices train on one each, and more share them round the host. Where
    ``held`` says which devices ``peers`` chose before, ``me`` takes the one
    they hold least: its place's where that is one of those, else the
    lowest numbered.

    Parameters
    ----------
    kind : {"cuda", "xpu"}
        The accelerator kind the worker trains on.
    count : int
        How many devices of ``kind`` the worker's process sees (torch's
        ``device_count()``, within ``CUDA_VISIBLE_DEVICES``).
    me : str
        The worker process: its nanny's address (its own, where it has no
        nanny).
    peers : collection of str
        The worker processes on the same host that train on ``kind``,
        likewise (``me`` among them or not).
    held : mapping of str to str, optional
        The devices processes of the host chose (``{nanny: "cuda:1"}``):
        those of ``peers`` other than ``me``, of ``kind`` and below
        ``count``, count; others (processes gone since) do not.

    Returns
    -------
    str
        A numbered device, ``"cuda:1"`` say.

    Raises
    ------
    ValueError
        If ``kind`` is not an accelerator kind or ``count`` not positive.

    Examples
    --------
    >>> nannies = ["tcp://10.0.0.5:9000", "tcp://10.0.0.5:10000", "tcp://10.0.0.5:8999"]
    >>> [spread_device("cuda", 4, n, nannies) for n in nannies]
    ['cuda:1', 'cuda:2', 'cuda:0']
    >>> [spread_device("cuda", 2, n, nannies) for n in nannies]  # three on two: one shared
    ['cuda:1', 'cuda:0', 'cuda:0']
    >>> # 8999 and 9000 chose cuda:0 and cuda:1 by place; 8999 left and 10000 joined
    >>> live = ["tcp://10.0.0.5:9000", "tcp://10.0.0.5:10000"]
    >>> spread_device("cuda", 2, live[1], live)  # by place alone: 9000's, cuda:0 idle
    'cuda:1'
    >>> spread_device("cuda", 2, live[1], live, {live[0]: "cuda:1", nannies[2]: "cuda:0"})
    'cuda:0'
    >>> spread_device("xpu", 1, "tcp://10.0.0.5:9000", nannies)
    'xpu:0'
    >>> spread_device("cpu", 2, "tcp://10.0.0.5:9000", nannies)
    Traceback (most recent call last):
    ...
    ValueError: kind should be one of 'cuda', 'xpu', but got kind='cpu'
    """
    if kind not in SPREAD_KINDS:
        raise ValueError(
            f"kind should be one of {', '.join(map(repr, SPREAD_KINDS))}, but got kind={kind!r}"
        )
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count should be a positive integer, but got count={count!r}")
    order = sorted({me, *peers}, key=_address_order)
    place = order.index(me) % count
    uses = [0] * count
    for peer, device in (held or {}).items():
        peer_kind, _, index = str(device).partition(":")
        if peer != me and peer in order and peer_kind == kind and index.isdigit():
            if int(index) < count:
                uses[int(index)] += 1
    least = min(uses)
    return f"{kind}:{place if uses[place] == least else uses.index(least)}"


def _address_order(address: str) -> tuple[str, int, str]:
    """A sort key of ``address`` that orders its port as a number.

    >>> sorted(["tcp://h:10000", "tcp://h:9000"], key=_address_order)
    ['tcp://h:9000', 'tcp://h:10000']
    """
    head, _, port = address.rpartition(":")
    return (head, int(port), address) if port.isdigit() else (address, -1, address)


def device_count(kind: str) -> int:
    """How many devices of accelerator ``kind`` this process sees (0 where torch has none)."""
    import torch

    module = getattr(torch, kind, None)
    if module is None or not module.is_available():
        return 0
    return int(module.device_count())


def spread_kind(worker: Any, requested: str | None) -> str | None:
    """The accelerator kind whose devices ``worker``'s host shares out, if any.

    ``requested`` is the run's ``device``: a bare ``"cuda"`` or ``"xpu"``,
    or ``None`` on a worker with a ``GPU`` resource where CUDA is available,
    names a kind; where this process sees more than one device of it, the
    worker processes of the host share them out (:func:`spread_device`).
    ``None`` where there is nothing to choose (:func:`worker_device` then
    decides).
    """
    import torch

    if requested is None:
        kind = "cuda" if _has_gpu_resource(worker) else None
    else:
        device = torch.device(requested)
        kind = device.type if device.index is None and device.type in SPREAD_KINDS else None
    if kind is None or device_count(kind) < 2:
        return None
    return kind


async def host_workers(
    worker: Any, resources: Mapping[str, float] | None, *, gpu: bool = False
) -> tuple[str, list[str]]:
    """``worker``'s process, and those of its host that train with it, as the scheduler lists them.

    Each process is named by its nanny's address (its own where it has
    none): a nanny restarts its worker under a new address. Those listed
    are the workers on ``worker``'s host that have ``resources`` (and a
    ``GPU`` resource where ``gpu``): those that build the run's replica on
    the same kind of device.

    Returns
    -------
    (str, list of str)
        ``worker``'s name, and those of its host's processes (``worker``'s
        own among them).
    """
    info = await worker.scheduler.identity(n_workers=-1)
    host = get_address_host(worker.address)
    need = dict(resources or {})
    me = worker.nanny or worker.address
    peers = {me}
    for address, w in info.get("workers", {}).items():
        have = w.get("resources") or {}
        if (w.get("host") == host and all(have.get(k, 0) >= v for k, v in need.items())
                and (not gpu or have.get("GPU", 0) > 0)):
            peers.add(w.get("nanny") or address)
    return me, sorted(peers, key=_address_order)


async def choose_device(
    worker: Any, kind: str, count: int, resources: Mapping[str, float] | None, *,
    gpu: bool = False,
) -> torch.device:
    """The device of ``kind`` (``count`` of them) that ``worker`` takes among its host's processes.

    What :class:`~daskpri.replicas.worker.ReplicaPlugin` runs where
    :func:`spread_kind` names a kind: :func:`host_workers` (``resources``
    and ``gpu`` as there), then :func:`spread_device` with the devices its
    peers chose, as the scheduler keeps them; this process's choice is kept
    there in turn, with the records of processes no longer among the
    scheduler's workers dropped, in one step on the scheduler
    (:func:`kept_devices`).

    Raises
    ------
    RuntimeError
        If the scheduler fails to keep the choice (it cannot import daskpri, say).
    """
    import torch

    me, peers = await host_workers(worker, resources, gpu=gpu)
    # the scheduler's metadata: what a process that joins later finds its peers hold
    host = get_address_host(worker.address)
    held = await worker.scheduler.get_metadata(keys=[*DEVICES_KEY, host], default=None)
    device = spread_device(kind, count, me, peers, held if isinstance(held, dict) else None)
    # kept, and the records of the host's departed processes dropped, in one step of the
    # scheduler's event loop: a read here and a write of the host's whole dict after it
    # would drop a record that a peer wrote in between (set_metadata deletes nothing)
    answer = await worker.scheduler.run_function(
        function=pickle.dumps(_keep_device), kwargs=pickle.dumps(
            {"host": host, "me": me, "device": device}))
    if answer.get("status") != "OK":
        _, error, _ = clean_exception(**answer)
        raise RuntimeError(f"the scheduler did not keep worker {worker.address}'s device "
                           f"{device}: {type(error).__name__}: {error}")
    logger.info("daskpri: worker %s trains on %s, one of %d %s devices shared by the host's %d "
                "worker processes", worker.address, device, count, kind.upper(), len(peers))
    return torch.device(device)


def kept_devices(
    held: Mapping[str, Any] | None, live: Mapping[str, Collection[str]],
    host: str, me: str, device: str,
) -> dict[str, dict[str, str]]:
    """The devices to keep on the scheduler, by host then process, once ``me`` chose ``device``.

    Those of ``held`` (by host, then by nanny) whose processes are ``live``
    (the scheduler's workers, likewise by host), and ``me``'s on ``host``:
    the records of processes gone since, and of hosts none of whose
    processes is left, are dropped, so the scheduler keeps one per live
    process, not one per process that ever chose.

    Examples
    --------
    >>> held = {"h": {"tcp://h:1": "cuda:0", "tcp://h:2": "cuda:1"}, "g": {"tcp://g:1": "cuda:0"}}
    >>> kept_devices(held, {"h": ["tcp://h:2", "tcp://h:3"]}, "h", "tcp://h:3", "cuda:0")
    {'h': {'tcp://h:2': 'cuda:1', 'tcp://h:3': 'cuda:0'}}
    """
    kept: dict[str, dict[str, str]] = {}
    for where, records in (held or {}).items():
        alive = live.get(where, ())
        if isinstance(records, Mapping):
            records = {p: d for p, d in records.items() if p in alive and p != me}
            if records:
                kept[where] = records
    kept.setdefault(host, {})[me] = device
    return kept


def _keep_device(host: str, me: str, device: str, dask_scheduler: Any) -> None:
    """Keep ``me``'s ``device`` on the scheduler, dropping the records of departed processes.

    Run on the scheduler (``Scheduler.run_function``), synchronously: no other
    message is handled between its read and its write, so no record of a
    process that is among the scheduler's workers is lost.
    """
    live: dict[str, set[str]] = {}
    for ws in dask_scheduler.workers.values():
        live.setdefault(ws.host, set()).add(ws.nanny or ws.address)
    held = dask_scheduler.get_metadata(keys=list(DEVICES_KEY), default=None)
    dask_scheduler.set_metadata(keys=list(DEVICES_KEY), value=kept_devices(
        held if isinstance(held, dict) else None, live, host, me, device))


def device_name(device: Any) -> str:
    """``device`` checked as the name of a torch device that holds values: its name.

    >>> device_name("cuda:1"), device_name("cpu")
    ('cuda:1', 'cpu')
    >>> device_name("abacus")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: 'abacus' names no torch device
    """
    import torch

    try:
        if not isinstance(device, str | torch.device):
            raise TypeError
        found = torch.device(device)
        if found.type == "meta":  # (tensors of shapes, without values)
            raise TypeError
    except (RuntimeError, TypeError):
        raise ValueError(f"{device!r} names no torch device") from None
    return str(found)


def lacking_gpu(requested: str, where: str) -> str | None:
    """Why ``where`` (this process) cannot run on device ``requested``; ``None`` where it can.

    A CUDA device numbered past the GPUs the process sees (``CUDA_VISIBLE_DEVICES``).

    >>> lacking_gpu("cpu", "this process") is None
    True
    """
    import torch

    device = torch.device(requested)
    if device.type != "cuda" or (device.index or 0) < torch.cuda.device_count():
        return None
    return (f"device={requested!r}, but {where} has {torch.cuda.device_count()} CUDA "
            f"device(s) (torch {torch.__version__}, built with CUDA {torch.version.cuda})")


def worker_device(worker: Any, requested: str | None = None) -> torch.device:
    """The device a worker trains on, where its host has none to share out.

    ``requested`` wins; else the GPU that the worker's ``GPU`` resource
    stands for (``cuda:0`` of the worker's ``CUDA_VISIBLE_DEVICES``) when
    CUDA is available, else the CPU. (Where the process sees several GPUs,
    :func:`spread_kind` names the kind and :func:`spread_device` the GPU.)
    """
    import torch

    if requested is not None:
        lacking = lacking_gpu(requested, f"worker {getattr(worker, 'address', '?')}")
        if lacking is not None:
            raise RuntimeError(
                f"{lacking}; leave device unset to train on each worker's GPU where its GPU "
                "resource names one, else on its CPU"
            )
        return torch.device(requested)
    if _has_gpu_resource(worker) and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def _has_gpu_resource(worker: Any) -> bool:
    resources = getattr(getattr(worker, "state", None), "total_resources", {}) or {}
    return bool(resources.get("GPU", 0) > 0)
