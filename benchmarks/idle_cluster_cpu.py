"""What an idle LocalCluster of daskpri's costs its machine in CPU, a second.

Run: ``python benchmarks/idle_cluster_cpu.py [--workers 2] [--seconds 20]
[--dask-defaults]``.

Starts ``daskpri.training.cluster.local_cluster`` (with ``--dask-defaults``,
under Dask's own settings: ``daskpri.local-cluster`` set to ``{}``), lets it
settle, then measures over ``--seconds`` the CPU time (user + system, from
``/proc``) of each thread of this process (the scheduler's and the nannies'
event loop is the "IO loop") and of the worker processes together. With
nothing to compute, all of it is Dask's periodic work: in a LocalCluster it
runs on the cores the workers train on.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import dask.config
from distributed import Client

from daskpri.training.cluster import local_cluster

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(stat_path: str) -> float:
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def threads() -> dict[int, float]:
    """CPU seconds of each thread of this process."""
    return {int(t): _cpu(f"/proc/self/task/{t}/stat") for t in os.listdir("/proc/self/task")}


def workers(pids: list[int]) -> float:
    """CPU seconds of the worker processes together."""
    return sum(_cpu(f"/proc/{pid}/stat") for pid in pids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--dask-defaults", action="store_true")
    args = parser.parse_args()
    settings = {"daskpri.local-cluster": {}} if args.dask_defaults else {}
    with dask.config.set(settings), local_cluster(args.workers) as cluster, Client(
        cluster
    ) as client:
        pids = list(client.run(os.getpid).values())
        time.sleep(3)  # started and settled
        t0, w0, start = threads(), workers(pids), time.perf_counter()
        time.sleep(args.seconds)
        t1, w1, wall = threads(), workers(pids), time.perf_counter() - start
        names = {t.native_id: t.name for t in threading.enumerate()}
    per_s = {tid: 1e3 * (t1[tid] - t0.get(tid, 0.0)) / wall for tid in t1}
    loop = sum(v for tid, v in per_s.items() if names.get(tid) == "IO loop")
    rest = sum(per_s.values()) - loop
    kind = "Dask's defaults" if args.dask_defaults else "daskpri.local-cluster"
    print(f"idle LocalCluster of {args.workers} workers, {kind}; ms of CPU a second "
          f"over {wall:.0f} s\n")
    print("| driver: IO loop (scheduler, nannies) | driver: other threads | workers |")
    print("| --- | --- | --- |")
    print(f"| {loop:.1f} | {rest:.1f} | {1e3 * (w1 - w0) / wall:.1f} |")


if __name__ == "__main__":
    main()
