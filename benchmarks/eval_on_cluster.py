"""Seconds per evaluation of a fit: ``eval_data`` scored on the driver, or on the cluster.

Run: ``python benchmarks/eval_on_cluster.py``. On a LocalCluster of 2
one-thread workers, 40 steps of ``uniform`` on MNIST-1D (4,000 test
samples), evaluated every 5 steps, for the MLP and the CNN: ``eval_data``
in the driver's memory scored there (the default), ``eval_chunked=True``
on a zarr store the workers read (chunks of 1,000 samples), and on the
same data sent from the driver's memory. Prints the median seconds of
an evaluation (the history's ``eval_time``, the first left out) and the
last accuracy, which should agree.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
from distributed import Client, LocalCluster

import daskpri
from daskpri.data.io import to_store
from daskpri.models import build_model


def main() -> None:
    train, test = daskpri.datasets.load("mnist1d", seed=0)
    store = to_store(test.chunk({"sample": 1000}), os.path.join(tempfile.mkdtemp(), "t.zarr"))
    ways = [("driver", {"eval_data": test}),
            ("cluster, store", {"eval_data": store, "eval_chunked": True}),
            ("cluster, memory", {"eval_data": test, "eval_chunked": True})]
    with (LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                       dashboard_address="127.0.0.1:0") as cluster,
          Client(cluster) as client):
        for model in ("mlp", "cnn"):
            for name, kwargs in ways:
                trainer = daskpri.Trainer(build_model(model, train, seed=0), strategy="uniform",
                                          client=client, eval_every=5)
                history = trainer.fit(train, max_steps=40, progress=False, **kwargs)
                times = history["eval_time"].dropna("step").values
                accuracy = history["accuracy"].dropna("step").values[-1]
                print(f"{model} {name}: {np.median(times[1:]):.3f} s an evaluation of "
                      f"{test.sizes['sample']:,} samples, accuracy {accuracy:.4f}", flush=True)
                trainer.close()


if __name__ == "__main__":
    main()
