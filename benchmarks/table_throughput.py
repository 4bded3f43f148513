"""Throughput of the priority table's own operations (no cluster, no RPC).

Run: ``python benchmarks/table_throughput.py [--samples 1000000]``.
Prints priority updates per second (in batches, as the trainer sends them),
and the time of a top-k over all samples for each staleness model, the
fast path (a worker's contiguous samples, as a slice) and an index array.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from daskpri.table.table import PriorityTable


def best_of(fn, repeat: int = 20) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=10_000, help="updates per call")
    parser.add_argument("--k", type=int, default=64)
    args = parser.parse_args()

    n = args.samples
    rng = np.random.default_rng(0)
    sizes = np.full(args.partitions, n // args.partitions)
    sizes[-1] += n - sizes.sum()
    table = PriorityTable(sizes)
    order = rng.permutation(n)
    values = rng.random(n)

    def update_all(step: int) -> None:
        for i in range(0, n, args.batch):
            table.update(order[i : i + args.batch], values[i : i + args.batch], step=step)

    step = iter(range(1, 10_000))
    t = best_of(lambda: update_all(next(step)), repeat=5)
    print(f"updates: {n / t / 1e6:.1f} M priorities/s (batches of {args.batch}, {n} samples)")
    everything = np.arange(n)
    exclude = rng.choice(n, 100, replace=False)
    for model in ("keep", "exp-linear", "exp-quadratic"):
        table.staleness = model
        t_slice = best_of(lambda: table.topk(args.k, slice(0, n), step=10, exclude=exclude))
        t_array = best_of(lambda: table.topk(args.k, everything, step=10, exclude=exclude), 5)
        print(
            f"top-{args.k} of {n} [{model}]: {t_slice * 1e3:.2f} ms (contiguous), "
            f"{t_array * 1e3:.2f} ms (index array)"
        )
    t = best_of(lambda: table.summaries(step=10), repeat=3)
    print(f"summaries of {args.partitions} partitions: {t * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
