"""Where things run: the cluster's workers, their resources, partition owners.

Pure helpers (no futures are created here) so the placement rules are tested
without a cluster; :func:`cluster_workers` alone asks the scheduler, for the
workers they place on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from daskpri import _config

if TYPE_CHECKING:
    import xarray as xr
    from distributed import Client


def parse_resources(resources: Mapping[str, float] | str | None) -> dict[str, float] | None:
    """``{"GPU": 1}`` from a mapping or from ``"GPU=1,MEM=2"`` (the CLI's form).

    Examples
    --------
    >>> parse_resources("GPU=1")
    {'GPU': 1.0}
    """
    if resources is None:
        return None
    if isinstance(resources, str):
        out: dict[str, float] = {}
        for item in filter(None, (s.strip() for s in resources.split(","))):
            key, sep, text = item.partition("=")
            try:
                out[key.strip()] = float(text)
            except ValueError:
                sep = ""
            if not sep or not key.strip():
                raise ValueError(
                    f"resources should look like 'GPU=1' or 'GPU=1,MEM=4', but got {resources!r}"
                ) from None
        resources = out
    if not isinstance(resources, Mapping):
        raise TypeError(f"resources should be a dict like {{'GPU': 1}}, but got {resources!r}")
    for name, amount in resources.items():
        if not isinstance(name, str) or not isinstance(amount, (int, float)) or amount <= 0:
            raise ValueError(
                "resources should map names to positive amounts, like {'GPU': 1}, "
                f"but got {dict(resources)!r}"
            )
    return {k: float(v) for k, v in resources.items()} or None


def cluster_workers(client: Client) -> dict[str, dict[str, Any]]:
    """Every worker the scheduler knows now, by address: its identity's ``workers``.

    Asked of the scheduler directly. ``client.scheduler_info(n_workers=-1)``
    fetches the same into the client's cache and returns the cache, which
    the client's periodic poll (every
    ``distributed.client.scheduler-info-interval``, asking for no workers)
    may have overwritten in between: it then says the cluster has no
    workers (5 of 500 calls with a 5 ms poll; now and then a test failed
    so with the default 2 s).
    """
    return client.sync(listed_workers, client)


async def listed_workers(client: Client) -> dict[str, dict[str, Any]]:
    """:func:`cluster_workers` on the client's event loop."""
    return dict((await client.scheduler.identity(n_workers=-1))["workers"])


def all_have_gpus(workers: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether there are workers and every one has a ``GPU`` resource.

    Then a run asks for ``{"GPU": 1}`` where it was given no resources, and
    its replicas train on the workers' GPUs.

    >>> all_have_gpus({"tcp://a": {"resources": {"GPU": 1}}, "tcp://b": {"resources": {}}})
    False
    >>> all_have_gpus({"tcp://a": {"resources": {"GPU": 1}}}), all_have_gpus({})
    (True, False)
    """
    return bool(workers) and all(
        w.get("resources", {}).get("GPU", 0) > 0 for w in workers.values()
    )


def eligible_workers(
    workers: Mapping[str, Mapping[str, Any]], resources: dict[str, float] | None, address: str
) -> list[str]:
    """Sorted addresses of the workers that have ``resources`` and are not paused.

    ``workers`` is :func:`cluster_workers`'s. Raises
    ``ValueError`` naming the resource and how to start such workers when
    none has it, instead of letting tasks wait forever, and naming their
    memory when all that have it are paused (Dask pauses a worker whose
    memory is over ``distributed.worker.memory.pause`` of its limit). A
    fit calls it until it passes, up to ``daskpri.trainer.no-workers-timeout``
    (:mod:`daskpri.training._waiting`), at its start as after losing workers.

    >>> eligible_workers({"tcp://a": {"status": "paused"}, "tcp://b": {}}, None, "tcp://s")
    ['tcp://b']
    >>> eligible_workers({"tcp://a": {"status": "paused", "memory_limit": 2**30,
    ...                               "metrics": {"memory": 900 * 2**20}}}, None, "tcp://s")
    Traceback (most recent call last):
    ValueError: the workers ... are paused by Dask: tcp://a uses 900.00 MiB of its 1.00 GiB ...
    """
    if not workers:
        raise RuntimeError(
            f"the cluster at {address} has no workers; start some with `dask worker {address}` "
            "(a LocalCluster's workers killed by Ctrl-C or Jupyter's interrupt do not come "
            "back: start it with preload=['daskpri.training.worker_signals'] to keep them; "
            "an adaptive cluster starts one for the task that a fit keeps pending as it waits "
            "for workers (at its start, or after losing its own), if its maximum allows: adapt "
            "it with maximum=1 or more)"
        )
    ok = [
        addr
        for addr, info in workers.items()
        if all(info.get("resources", {}).get(k, 0) >= v for k, v in (resources or {}).items())
    ]
    if ok:
        # a paused worker (its memory over distributed.worker.memory.pause) runs no
        # task and takes no scattered data: a scatter to it waits 30 s, then fails
        running = [a for a in ok if workers[a].get("status") != "paused"]
        if not running:
            raise ValueError(paused_workers(
                # their memory at their last heartbeat, as the scheduler saw it pause them
                {a: (workers[a].get("metrics", {}).get("memory"), workers[a].get("memory_limit"))
                 for a in ok},
                address, "are paused by Dask",
            ))
        ok = running
    if not resources:
        return sorted(ok)
    if not ok:
        have = sorted({k for info in workers.values() for k in info.get("resources", {})})
        want = ",".join(f"{k}={v:g}" for k, v in resources.items())
        raise ValueError(
            f"resources={resources!r} were asked for, but none of the {len(workers)} workers "
            f"of the cluster at {address} has them (resources found: {have or 'none'}); "
            f"start workers with `dask worker {address} --resources {want}`, or "
            f"LocalCluster(resources={resources!r}), or drop resources="
        )
    return sorted(ok)


def paused_workers(
    workers: Mapping[str, tuple[int | None, int | None]], address: str, why: str
) -> str:
    """Why a run cannot use ``workers``, that ``why``.

    ``workers`` map an address to its worker's process memory (``None``:
    not measured) and memory limit, in bytes.

    Examples
    --------
    >>> print(paused_workers({"tcp://a": (2**28 - 2**24, 2**28)},
    ...                      "tcp://s", "are paused by Dask"))  # doctest: +ELLIPSIS
    the workers ... tcp://s ... are paused by Dask: tcp://a uses 240.00 MiB of its 256.00 MiB ...
    """
    from dask.utils import format_bytes

    def use(memory: int | None, limit: int | None) -> str:
        if not limit:
            return "has no memory limit"
        if memory is None:
            return f"has a memory limit of {format_bytes(limit)}"
        return f"uses {format_bytes(memory)} of its {format_bytes(limit)} memory limit"

    each = "; ".join(f"{a} {use(*m)}" for a, m in sorted(workers.items()))
    return (
        f"the workers of the cluster at {address} that could train this run {why}: {each}; "
        "a worker whose memory is over distributed.worker.memory.pause (80% of its limit by "
        "default) runs no task and takes no data, and each holds torch, a replica of the model and "
        f"its share of the data; start workers with a larger limit (dask worker {address} "
        "--memory-limit 4GB, or 0 for none), or free their memory"
    )


def check_workers_see(
    cannot_read: Mapping[str, str | None], n_workers: int, path: str, name: str = "data"
) -> None:
    """Raise ``FileNotFoundError`` naming the workers that cannot read the store at ``path``.

    The workers read a store's partitions themselves, by path (the driver
    sends no data): a path on the driver's machine alone, or one that a
    worker mounts elsewhere, fails there. Every worker is asked at once
    before the run is set up (the probe of
    :mod:`daskpri.training._cluster_checks`), so a fit says so once, with
    what to do, rather than with a failed load task (and its traceback in
    the worker's log) for every partition. ``cannot_read`` is each
    answering worker's reason (None: it can), of the run's ``n_workers``; a
    worker that does not answer is left to the set-up (a lost worker).
    ``name`` is the argument the store was given as: ``"eval_data"`` for
    a fit's ``eval_data`` scored on the cluster (``eval_chunked``).

    Examples
    --------
    >>> check_workers_see({"tcp://a": None, "tcp://b": "permission denied"}, 3, "/d.zarr")
    Traceback (most recent call last):
    FileNotFoundError: data names '/d.zarr', which 1 of the 3 workers cannot read (tcp://b: ...
    """
    cannot = {a: why for a, why in cannot_read.items() if isinstance(why, str)}
    if not cannot:
        return
    each = "; ".join(f"{a}: {why}" for a, why in sorted(cannot.items()))
    otherwise = ("have the driver score it (fit without eval_chunked=True)" if name == "eval_data"
                 else "pass the data in memory (xr.open_dataset(path).load()), which is sent "
                      "to them once")
    raise FileNotFoundError(
        f"{name} names {path!r}, which {len(cannot)} of the {n_workers} workers cannot "
        f"read ({each}); the workers read a store themselves, by its path: put it where "
        f"every worker sees it at that path (a shared file system), or {otherwise}"
    )


#: chunks holding fewer samples than this on average are grouped into partitions
SMALL_CHUNK = 100


def partition_bounds(ds: xr.Dataset, partition_size: int | None, n_workers: int) -> np.ndarray:
    """Offsets ``[0, ..., n_samples]`` of the partitions of ``ds``.

    With ``partition_size=None`` the data is cut into as many pieces for
    every worker, of at most ``daskpri.trainer.partition-size`` samples,
    their sizes a sample apart, so that the workers hold equal shares (each
    trains a batch a step). A dataset chunked along ``sample`` into at least
    ``n_workers`` chunks is cut at its chunks instead: one partition a
    chunk, or, where its chunks hold fewer than ``SMALL_CHUNK`` samples on
    average (a store written a sample or a few at a time), runs of whole
    chunks, cut at the chunk boundaries nearest the pieces' (a partition
    a chunk of one sample made thousands of tasks: a fit of 20 steps from
    2,400 such chunks took 22.7 s on 2 cores, 9.4 s grouped;
    ``benchmarks/small_chunks.py``). Fewer chunks
    than workers (a netCDF file's contiguous variables open as one) would
    leave workers without data: such data is cut as if unchunked. A given
    ``partition_size`` cuts pieces of that size.

    Examples
    --------
    >>> import xarray as xr
    >>> ds = xr.Dataset({"x": ("sample", np.zeros(10)), "y": ("sample", np.zeros(10))})
    >>> partition_bounds(ds.chunk({"sample": -1}), None, 2).tolist()  # one chunk
    [0, 5, 10]
    >>> ds = xr.Dataset({"x": ("sample", np.zeros(1000)), "y": ("sample", np.zeros(1000))})
    >>> partition_bounds(ds.chunk({"sample": 400}), None, 2).tolist()  # at its chunks
    [0, 400, 800, 1000]
    >>> partition_bounds(ds.chunk({"sample": 1}), None, 2).tolist()  # runs of chunks
    [0, 500, 1000]
    >>> ds = ds.isel(sample=slice(10))
    >>> partition_bounds(ds, None, 3).tolist()  # three equal shares
    [0, 3, 6, 10]
    >>> partition_bounds(ds, 4, 2).tolist()  # as given
    [0, 4, 8, 10]
    """
    n = ds.sizes["sample"]
    chunks = ds["x"].chunksizes.get("sample") if ds["x"].chunks is not None else None
    if partition_size is None:
        even = even_bounds(n, _config.get_int("trainer.partition-size", 1), n_workers)
        if chunks is None or len(chunks) < n_workers:
            return even
        edges = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
        if n >= SMALL_CHUNK * len(chunks):
            return edges
        return _snap(even, edges, n_workers)
    if not isinstance(partition_size, (int, np.integer)) or partition_size < 1:
        raise ValueError(
            "partition_size should be a positive integer, but got "
            f"partition_size={partition_size!r}"
        )
    return np.unique(np.append(np.arange(0, n, partition_size), n)).astype(np.int64)


def _snap(bounds: np.ndarray, edges: np.ndarray, n_workers: int) -> np.ndarray:
    """``bounds`` moved each to the nearest of ``edges`` (chunk boundaries).

    Where two land on one edge, fewer partitions remain; where fewer than
    ``n_workers`` would, every chunk is a partition, as before.

    Examples
    --------
    >>> _snap(np.array([0, 5, 10]), np.array([0, 4, 8, 10]), 2).tolist()
    [0, 4, 10]
    """
    nearest = np.searchsorted(edges, bounds)
    below = np.clip(nearest - 1, 0, len(edges) - 1)
    nearest = np.clip(nearest, 0, len(edges) - 1)
    pick = np.where(bounds - edges[below] <= edges[nearest] - bounds, below, nearest)
    snapped = np.unique(edges[pick])
    if len(snapped) - 1 < n_workers:
        return edges
    return snapped.astype(np.int64)


def even_bounds(n_samples: int, largest: int, n_workers: int) -> np.ndarray:
    """Offsets of ``n_samples`` cut into as many pieces for every worker.

    The pieces hold at most ``largest`` samples, their sizes a sample apart:
    every worker trains a batch a step, so shares of the data that differed
    would see some samples more often than others.

    Examples
    --------
    >>> even_bounds(2500, 1000, 2).tolist()  # not 1000, 1000 and 500
    [0, 625, 1250, 1875, 2500]
    """
    size = min(largest, math.ceil(n_samples / n_workers))
    count = min(n_samples, math.ceil(math.ceil(n_samples / size) / n_workers) * n_workers)
    return (np.arange(count + 1, dtype=np.int64) * n_samples) // max(count, 1)


def assign_owners(sizes: np.ndarray | int, n_slots: int) -> np.ndarray:
    """Worker slot of each partition: contiguous blocks, balanced by samples.

    ``sizes`` are the partitions' sample counts (an int: that many
    partitions of one size). A partition goes to the slot in whose share
    of the samples its middle falls, where that gives the largest share
    fewer samples than blocks of equal numbers of partitions do (and leaves
    no slot without one); otherwise the blocks have equal numbers.

    Examples
    --------
    >>> assign_owners(5, 2).tolist()
    [0, 0, 0, 1, 1]
    >>> assign_owners(np.array([1000, 1000, 500]), 2).tolist()  # 1000 and 1500
    [0, 1, 1]
    """
    if isinstance(sizes, (int, np.integer)):
        sizes = np.ones(int(sizes), dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    by_count = (np.arange(sizes.size) * n_slots // max(sizes.size, 1)).astype(np.int64)
    total = int(sizes.sum())
    if not total:
        return by_count
    middles = np.cumsum(sizes) - sizes / 2
    owner = np.minimum((middles * n_slots / total).astype(np.int64), n_slots - 1)
    if np.unique(owner).size < min(n_slots, sizes.size):
        return by_count

    def largest(o: np.ndarray) -> int:
        return int(np.bincount(o, weights=sizes, minlength=n_slots).max())

    return owner if largest(owner) < largest(by_count) else by_count


def reassign_owners(owner_addr: list[str | None], live: list[str]) -> list[str]:
    """Give partitions whose worker is gone to the least-loaded live workers.

    Partitions on live workers stay where they are (their data is there).

    Examples
    --------
    >>> reassign_owners(["a", "b", "b", None], ["a", "c"])
    ['a', 'c', 'a', 'c']
    """
    live_set = set(live)
    load = {w: 0 for w in live}
    for a in owner_addr:
        if a in live_set:
            load[a] += 1
    out: list[str] = []
    for a in owner_addr:
        if a in live_set:
            out.append(str(a))
        else:
            target = min(live, key=lambda w: (load[w], live.index(w)))
            load[target] += 1
            out.append(target)
    return out


def rebalance_owners(owner_addr: list[str], workers: list[str]) -> list[str]:
    """Move partitions to the least-loaded of ``workers`` until loads differ by one at most.

    Each move takes the last partition of the most loaded worker, so
    partitions that stay keep their data where it is. For workers that
    joined a run: ``owner_addr`` names only workers in ``workers``.

    Examples
    --------
    >>> rebalance_owners(["a", "a", "a", "a", "b"], ["a", "b", "c"])
    ['a', 'a', 'b', 'c', 'b']
    >>> rebalance_owners(["a", "b"], ["a", "b", "c"])  # fewer partitions than workers
    ['a', 'b']
    """
    out = list(owner_addr)
    held: dict[str, list[int]] = {w: [] for w in workers}
    for pid, a in enumerate(out):
        held[a].append(pid)
    while True:
        most = max(workers, key=lambda w: (len(held[w]), -workers.index(w)))
        least = min(workers, key=lambda w: (len(held[w]), workers.index(w)))
        if len(held[most]) - len(held[least]) <= 1:
            return out
        pid = held[most].pop()
        held[least].append(pid)
        out[pid] = least


def too_few_workers(
    wanted: int, have: int, total: int, address: str, resources: dict[str, float] | None
) -> str:
    """Why a run of ``wanted`` workers cannot start on a cluster with ``have`` that fit it.

    Examples
    --------
    >>> print(too_few_workers(3, 1, 1, "tcp://10.0.0.1:8786", None))  # doctest: +ELLIPSIS
    n_workers=3, but the cluster at tcp://10.0.0.1:8786 has 1 worker: start 2 more ...
    """
    workers = "worker" if total == 1 else "workers"
    fewer = f"ask for at most {have} (n_workers={have}; daskpri train --workers {have})"
    more = wanted - have
    if not resources:
        return (f"n_workers={wanted}, but the cluster at {address} has {total} {workers}: "
                f"start {more} more (dask worker {address}), or {fewer}")
    want = ",".join(f"{k}={v:g}" for k, v in resources.items())
    return (f"n_workers={wanted} with resources={resources!r}, but {have} of the {total} "
            f"{workers} of the cluster at {address} {'has' if have == 1 else 'have'} them: "
            f"start {more} more with them (dask worker {address} --resources {want}), or "
            f"{fewer}, or ask for other resources")
