"""The driver's memory and the time of ``Trainer.evaluate`` on a large store, whole or chunked.

Run: ``python benchmarks/evaluate_chunked.py driver`` then ``... chunked``
(``--samples 2000000 --store /tmp/evaluate-chunked.zarr``). The store, random
float32 features in 40 dimensions and 10 labels, in chunks of 100,000
samples, is written once. ``driver`` scores it on the driver, read whole;
``chunked`` a task per chunk on a LocalCluster of 2 one-thread workers.
Prints the scores, the seconds of the call and the driver's peak resident
memory above what it held before the call (sampled every 20 ms).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np
import psutil
import xarray as xr
from distributed import Client, LocalCluster

import daskpri
from daskpri.data.store import to_store
from daskpri.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("where", choices=("driver", "chunked"))
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--store", default="/tmp/evaluate-chunked.zarr")
    args = parser.parse_args()
    if not os.path.exists(args.store):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.samples, 40), dtype=np.float32)
        ds = xr.Dataset({"x": (("sample", "feature"), x),
                         "y": ("sample", rng.integers(0, 10, args.samples))},
                        attrs={"n_classes": 10})
        to_store(ds.chunk({"sample": 100_000}), args.store)
        del ds, x
    train, _ = daskpri.datasets.load("mnist1d", n_samples=4000)
    trainer = daskpri.Trainer(build_model("mlp", train, seed=0))
    cluster = client = None
    if args.where == "chunked":
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0")
        client = Client(cluster)
    me = psutil.Process()
    before = peak = me.memory_info().rss
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, me.memory_info().rss)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.perf_counter()
    scores = trainer.evaluate(args.store, chunked=args.where == "chunked")
    seconds = time.perf_counter() - t0
    done.set()
    watcher.join()
    print(f"{args.where}: {scores}, {seconds:.1f} s, the driver's peak RSS "
          f"+{(peak - before) / 2**20:.0f} MiB")
    trainer.close()
    if client is not None and cluster is not None:
        client.close()
        cluster.close()


if __name__ == "__main__":
    main()
