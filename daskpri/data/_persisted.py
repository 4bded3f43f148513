"""Which Dask scheduler computes a user's data on the driver: its threads, or a cluster's.

daskpri reads the data it checks (labels, two samples, ``eval_data``) and
the partitions it scatters with the driver's own threads, not through a
default client, whose workers need not see the data's files. Data
persisted on a cluster (``client.persist(ds)``, the Dask way to hold a
dataset in the cluster's memory) has its chunks only there: its graph
holds the cluster's futures, which the driver's threads cannot compute
(``Missing dependency ('xarray-x-...', 0, 0)``), so it is read through the
client those futures belong to.
"""

from __future__ import annotations

from typing import Any

import dask
from distributed import Client, Future


def driver_scheduler(*objs: Any) -> str | Client:
    """``"threads"``, or the client of the cluster that holds ``objs``' persisted chunks.

    For the ``scheduler=`` of a ``compute`` (or ``dask.config.set``) on the
    driver.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"x": ("sample", np.arange(4.0))})
    >>> driver_scheduler(ds), driver_scheduler(ds.chunk({"sample": 2}))
    ('threads', 'threads')
    """
    for obj in objs:
        if not dask.is_dask_collection(obj):
            continue
        graph = obj.__dask_graph__()
        # a persisted collection's futures are the values of materialized layers: the
        # others (a store's Blockwise reads) are not built, which takes a second a
        # 20,000 chunks
        layers = getattr(graph, "layers", {None: graph}).values()
        for layer in layers:
            if getattr(layer, "is_materialized", lambda: True)():
                for value in layer.values():
                    if isinstance(value, Future):
                        return value.client
    return "threads"
