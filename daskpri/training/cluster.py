"""The LocalCluster daskpri starts when it is given no client."""

from __future__ import annotations

from typing import Any

from distributed import LocalCluster
from distributed.security import Security


def local_cluster(
    n_workers: int,
    *,
    resources: dict[str, float] | None = None,
    security: Security | bool | None = None,
) -> LocalCluster:
    """A LocalCluster of ``n_workers`` one-thread worker processes on 127.0.0.1.

    Its scheduler, workers and dashboard bind to loopback (LocalCluster's own
    default is every interface for the dashboard). ``security`` (``True`` for
    temporary credentials) switches it to TLS.
    """
    tls: dict[str, Any] = {}
    if security not in (None, False):
        tls = {"security": security, "protocol": "tls://"}
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
        resources=resources,
        **tls,
    )
