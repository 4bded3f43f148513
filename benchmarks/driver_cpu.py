"""The driver's CPU per round: what a LocalCluster's own process costs its workers.

Run: ``python benchmarks/driver_cpu.py [--dataset mnist1d] [--model mlp]
[--strategy uniform] [--local-steps 512] [--workers 2] [--rounds 30]
[--driver-threads N]``.

In a LocalCluster the scheduler runs in the driver's process, on the
client's event loop ("IO loop"), and the workers compute on the same
machine's cores: every millisecond of CPU the driver's process spends per
round is taken from them. This trains ``uniform`` (or ``--strategy``) for a
few rounds, then measures the CPU time of each thread of this process over
``--rounds`` more (Linux ``/proc/self/task``), per round: the IO loop (the
table's selection, messages), the fit (the driver's side of a round), and
threads Python did not start (torch's OpenMP pool, for one), and the
median over those rounds of each round's wall time beyond its slowest
worker's compute (the history's ``step_time - compute_time``: the time the
workers wait between rounds). Prints a markdown table.
``--driver-threads`` sets ``torch.set_num_threads`` first (default:
torch's own, the machine's cores).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import daskpri
from daskpri.training.cluster import local_cluster

TICK = os.sysconf("SC_CLK_TCK")


def cpu_by_thread() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--strategy", default="uniform")
    parser.add_argument("--local-steps", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--driver-threads", type=int, default=None)
    args = parser.parse_args()
    if args.driver_threads is not None:
        import torch

        torch.set_num_threads(args.driver_threads)

    train, _ = daskpri.datasets.load(args.dataset)
    model = daskpri.models.build_model(args.model, train, seed=0)
    steps = args.local_steps
    from distributed import Client

    with local_cluster(args.workers) as cluster, Client(cluster) as client:
        trainer = daskpri.Trainer(model, strategy=args.strategy, client=client, seed=0,
                                  local_steps=steps, learning_rate=0.1)
        with trainer:
            trainer.fit(train, max_steps=3 * steps, progress=False)  # partitions loaded, warm
            before, t0 = cpu_by_thread(), time.perf_counter()
            trainer.fit(train, max_steps=(3 + args.rounds) * steps, progress=False)
            after, wall = cpu_by_thread(), time.perf_counter() - t0
            names = {t.native_id: t.name for t in threading.enumerate()}
            h = trainer.history_.isel(step=slice(-args.rounds, None))
            # the round's wall time beyond its slowest worker's compute
            gap = 1e3 * float((h["step_time"] - h["compute_time"]).median())
    ms = {tid: 1e3 * (after[tid] - before.get(tid, 0.0)) / args.rounds for tid in after}
    loop = sum(v for tid, v in ms.items() if names.get(tid) == "IO loop")
    fit = ms.get(threading.main_thread().native_id, 0.0)
    other = sum(v for tid, v in ms.items() if tid not in names)
    total = sum(ms.values())
    print(f"{args.dataset} {args.model}, {args.strategy}, {args.workers} workers, "
          f"{steps} local steps, driver torch threads {args.driver_threads or 'default'}; "
          f"ms of CPU per round, over {args.rounds} rounds of {1e3 * wall / args.rounds:.1f} ms\n")
    print("| IO loop (scheduler, comms) | fit | threads not Python's | all | share of a core "
          "| round's wall time beyond its slowest worker's compute, median |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {loop:.1f} | {fit:.1f} | {other:.1f} | {total:.1f} | "
          f"{total / (1e3 * wall / args.rounds):.0%} | {gap:.1f} ms |")


if __name__ == "__main__":
    main()
