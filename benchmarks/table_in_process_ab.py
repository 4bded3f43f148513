"""The table called over a comm or in the driver's process, side by side.

Run: ``python benchmarks/table_in_process_ab.py [--pairs 6] [--seconds 15]
[--strategy selective-backprop] [--local-steps 1]``. One LocalCluster of 2
workers; each pair trains the MNIST-1D MLP for the same training time with
``daskpri.table.in-process`` off and on, in alternating order, and prints
each run's samples per second of training time and the paired ratios
(in process / over the comm), so that drift of the machine cancels out.
"""

from __future__ import annotations

import argparse

import dask
import numpy as np
from distributed import Client

import daskpri
from daskpri.training.cluster import local_cluster, one_torch_thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--strategy", default="selective-backprop")
    parser.add_argument("--local-steps", type=int, default=1)
    args = parser.parse_args()

    train, _ = daskpri.datasets.load("mnist1d")
    rates: dict[bool, list[float]] = {False: [], True: []}
    with one_torch_thread(), local_cluster(2) as cluster, Client(cluster) as client:
        for i in range(args.pairs):
            for in_process in (False, True) if i % 2 == 0 else (True, False):
                with dask.config.set({"daskpri.table.in-process": in_process}):
                    model = daskpri.models.build_model("mlp", train, seed=0)
                    with daskpri.Trainer(model, strategy=args.strategy, client=client, seed=0,
                                         local_steps=args.local_steps) as trainer:
                        h = trainer.fit(train, max_time=args.seconds, progress=False)
                rate = float(h["samples"].values[-1]) / float(h["time"].values[-1])
                rates[in_process].append(rate)
                print(f"pair {i}, in process {in_process}: {trainer.step_} steps, "
                      f"{rate:,.0f} samples/s", flush=True)
    comm, inproc = np.array(rates[False]), np.array(rates[True])
    ratios = inproc / comm
    print(f"over the comm: median {np.median(comm):,.0f} samples/s")
    print(f"in process:    median {np.median(inproc):,.0f} samples/s")
    print(f"in process / over the comm, paired: median {np.median(ratios):.3f} "
          f"[{ratios.min():.3f}-{ratios.max():.3f}]")


if __name__ == "__main__":
    main()
