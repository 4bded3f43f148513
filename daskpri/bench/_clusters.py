"""The benchmark's clusters: one at a time, a LocalCluster per worker count or a given scheduler."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from distributed import Client, LocalCluster
from distributed.security import Security

from daskpri.training._interrupts import interrupts_held
from daskpri.training._waiting import workers_awaited
from daskpri.training.cluster import connect, local_cluster, stop_heartbeats
from daskpri.training.placement import all_have_gpus, cluster_workers


class _Clusters:
    """One cluster at a time: a LocalCluster per worker count, or the given scheduler.

    ``on_interrupt`` is called at the first interrupt as a LocalCluster
    starts, at once (the interrupt itself is raised once it has started):
    ``daskpri bench`` says there that it heard it.
    """

    def __init__(self, scheduler: str | None, security: Security | None = None,
                 on_interrupt: Callable[[], None] | None = None) -> None:
        self.scheduler = scheduler
        self.security = security  # the given scheduler's TLS credentials; None: Dask's config
        self.on_interrupt = on_interrupt
        self._cluster: LocalCluster | None = None
        self._client: Client | None = None
        self._n = 0

    def client(self, n_workers: int, *, for_ddp: bool = False) -> Client:
        """A client of ``n_workers`` workers (``for_ddp``: DDP's runs are what need that many)."""
        if self.scheduler is not None:
            if self._client is None:
                # a server that accepts and never answers would hold Client(...) for good
                self._client = connect(self.scheduler, self.security)

            def enough(workers: Mapping[str, Any]) -> None:
                if len(workers) < n_workers:
                    have = len(workers)
                    raise ValueError(
                        f"the benchmark needs {n_workers} workers"
                        + (" (DDP's overhead runs pair 2 processes with 2 workers)"
                           if for_ddp else "")
                        + f", but the scheduler at {self.scheduler} has {have}; start more or "
                        f"pass --workers up to {have}" + (" and --no-ddp" if for_ddp else "")
                    )

            # workers still starting (or an adaptive cluster's) are waited for, as a fit does
            with workers_awaited(self._client, enough, f"{n_workers} worker(s)",
                                 need=n_workers):
                return self._client
        if self._client is None or self._n != n_workers:
            self.close()
            # started whole, as a trainer starts its own: a Ctrl-C in the middle of
            # LocalCluster(...) left it half made, owned by none (its workers, still
            # starting, died of it); held, it is raised once the cluster is ours to close
            with interrupts_held(self.on_interrupt):
                self._cluster = local_cluster(n_workers)
                self._client = Client(self._cluster)
                self._n = n_workers
        return self._client

    def device(self) -> str:
        """Where the plain PyTorch loop trains to compare with this cluster's workers.

        ``"cuda"`` where the given scheduler's workers all have a ``GPU``
        resource and this process has CUDA: the trainer then asks for
        ``GPU=1`` and its replicas train on the workers' GPUs. The
        LocalClusters the benchmark starts have no GPU resource, so their
        workers, and the loop, use the CPU.
        """
        import torch

        if self.scheduler is None or not torch.cuda.is_available():
            return "cpu"
        return "cuda" if all_have_gpus(cluster_workers(self.client(1))) else "cpu"

    def close(self) -> None:
        """Close a LocalCluster we started (a given scheduler's client stays)."""
        if self._cluster is not None:
            with interrupts_held():  # (a close interrupted half-way would never end)
                if self._client is not None:
                    stop_heartbeats(self._client)
                    self._client.close()
                self._cluster.close()
                self._cluster = self._client = None

    def __enter__(self) -> _Clusters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self._client is not None:
            self._client.close()
            self._client = None
