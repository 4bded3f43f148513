"""Mean test accuracy by step for strategy settings: where each one levels off.

Run, for example::

    python benchmarks/accuracy_by_step.py --dataset mnist5k --model mlp --seeds 5 \\
        --max-steps 640 --arm uniform=uniform:0.4 \\
        --arm sb=selective-backprop:0.2:fraction=0.25,refresh=4

Each ``--arm`` is ``LABEL=STRATEGY:LR[:OPTION=VALUE,...]`` as in
``steps_to_target.py``. Every arm runs each seed for ``--max-steps`` steps
on one LocalCluster of 2 one-thread workers (batch 64 a worker, 16 local
steps, SGD with momentum 0.9, partitions of 1,000, as ``daskpri bench``
runs them), evaluating every ``--eval-every`` steps. It prints, per arm,
the test accuracy averaged over seeds at a few steps and the mean of each
seed's best. ``steps_to_target.py`` says when a setting first reaches a
target; this says whether it gets there to stay: a setting that is ahead
early and then levels off below the target reaches it late or never.
Steps depend on the selection alone (a seed selects the same samples each
time), not on the machine's speed.
"""

from __future__ import annotations

import argparse

import numpy as np
from dask.distributed import Client
from steps_to_target import parse_arm, run_arm

import daskpri
from daskpri.training.cluster import local_cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--max-steps", type=int, default=640)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument("--at", default="48,96,128,160,192,256,320,400,512,640",
                        help="the steps printed (comma-separated; each a multiple of --eval-every)")
    parser.add_argument("--arm", type=parse_arm, action="append", required=True)
    args = parser.parse_args()
    at = [int(s) for s in args.at.split(",")]
    if any(s % args.eval_every or s > args.max_steps or s < 1 for s in at):
        parser.error(f"--at should list steps that are multiples of --eval-every "
                     f"({args.eval_every}) up to --max-steps ({args.max_steps}), but got {args.at}")
    train, test = daskpri.datasets.load(args.dataset)
    curves: dict[str, list[np.ndarray]] = {}
    bests: dict[str, list[float]] = {}
    with local_cluster(n_workers=2) as cluster, Client(cluster) as client:
        for seed in range(args.seeds):
            for label, strategy, lr, options in args.arm:
                h = run_arm(client, args.model, train, test, seed, strategy, lr, options,
                            eval_every=args.eval_every, max_steps=args.max_steps)
                acc = h["accuracy"].dropna("step")
                # the history's step of an evaluation is the step it followed, from 0
                curves.setdefault(label, []).append(acc.sel(step=[s - 1 for s in at]).values)
                bests.setdefault(label, []).append(float(acc.max()))
                print(f"{label} seed {seed}: best {float(acc.max()):.4f}", flush=True)
    width = max(len(label) for label in curves)
    print(" " * width + "".join(f"{s:>8d}" for s in at) + "    best")
    for label, rows in curves.items():
        mean = np.mean(np.stack(rows), axis=0)
        best = np.mean(bests[label])
        print(f"{label:{width}s}" + "".join(f"{m:8.4f}" for m in mean) + f"  {best:.4f}")


if __name__ == "__main__":
    main()
