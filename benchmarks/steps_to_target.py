"""Steps (and seconds) to a target accuracy for strategy settings, seed by seed.

Run, for example::

    python benchmarks/steps_to_target.py --dataset mnist1d --model cnn --target 0.9765 \\
        --seeds 10 --eval-every 8 --arm uniform=uniform:0.1 \\
        --arm pf50=selective-backprop:0.1:beta=1,refresh=3,warmup=1,stale_beta=5,prefilter=0.5

Each ``--arm`` is ``LABEL=STRATEGY:LR[:OPTION=VALUE,...]``, the options the
strategy's (checked before the cluster starts) or the trainer's learning-rate
schedule (``lr_schedule``, ``schedule_steps``) and gradient clipping
(``max_grad_norm``). Every arm runs each seed on one LocalCluster of 2
one-thread workers (batch 64 a worker, 16 local steps unless
``--local-steps`` says otherwise, SGD with momentum 0.9, partitions of
1,000, as
``daskpri bench`` runs them) until the test accuracy reaches ``--target``
or ``--max-steps``. It prints each run's steps and training seconds to the
target, then per arm the median and each seed's steps.

Steps to the target depend on the selection alone (a seed selects the
same samples each time), so they compare settings without the machine's
noise; the seconds are one run's, for scale: ``daskpri bench`` measures
time. Evaluations are not charged; how often they run sets the steps'
resolution.
"""

from __future__ import annotations

import argparse
import ast

import numpy as np
import xarray as xr
from dask.distributed import Client

import daskpri
from daskpri.models import build_model
from daskpri.strategies import get_strategy
from daskpri.training.cluster import local_cluster, one_torch_thread
from daskpri.training.schedule import validate_schedule

#: The arm options that go to the trainer, not the strategy.
TRAINER_OPTIONS = ("lr_schedule", "schedule_steps", "max_grad_norm")


def parse_arm(text: str) -> tuple[str, str, float, dict]:
    """``LABEL=STRATEGY:LR[:OPTION=VALUE,...]`` as (label, strategy, lr, options).

    Examples
    --------
    >>> parse_arm("pf=selective-backprop:0.1:beta=1,prefilter=0.5")
    ('pf', 'selective-backprop', 0.1, {'beta': 1, 'prefilter': 0.5})
    >>> parse_arm("uc=uniform:0.4:lr_schedule=cosine,schedule_steps=400")[3]
    {'lr_schedule': 'cosine', 'schedule_steps': 400}
    >>> parse_arm("u=uniform:0.2")
    ('u', 'uniform', 0.2, {})
    """
    label, sep, rest = text.partition("=")
    parts = rest.split(":", 2)
    if not sep or len(parts) < 2:
        raise argparse.ArgumentTypeError(
            f"an arm should read LABEL=STRATEGY:LR[:OPTION=VALUE,...], but got {text!r}"
        )
    options = {}
    for item in parts[2].split(",") if len(parts) == 3 and parts[2] else []:
        key, _, value = item.partition("=")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    try:
        lr = float(parts[1])
        # an unknown strategy or option fails here, not later
        get_strategy(parts[0], **{k: v for k, v in options.items() if k not in TRAINER_OPTIONS})
        validate_schedule(options.get("lr_schedule", "constant"), options.get("schedule_steps"))
    except (ValueError, TypeError, KeyError) as e:
        raise argparse.ArgumentTypeError(f"arm {text!r}: {e}") from None
    if not lr > 0:
        raise argparse.ArgumentTypeError(
            f"arm {text!r}: the learning rate should be a number > 0, but got {parts[1]!r}"
        )
    return label, parts[0], lr, options


def run_arm(client: Client, model_name: str, train: xr.Dataset, test: xr.Dataset, seed: int,
            strategy: str, lr: float, options: dict, *, eval_every: int, max_steps: int,
            target: float | None = None, local_steps: int = 16) -> xr.Dataset:
    """One seed of one arm, as ``daskpri bench`` runs it: its training history.

    On 2 one-thread workers of ``client``: batch 64 a worker,
    ``local_steps`` local steps (16, as the bench's protocol), SGD with
    momentum 0.9, partitions of 1,000; it stops at the test accuracy
    ``target`` (if given) or at ``max_steps``.
    """
    model = build_model(model_name, train, seed=seed)
    with one_torch_thread(), daskpri.Trainer(
        model, strategy=strategy, client=client, seed=seed, n_workers=2,
        learning_rate=lr, momentum=0.9, eval_every=eval_every,
        local_steps=local_steps, partition_size=1000, **options,
    ) as trainer:
        return trainer.fit(train, eval_data=test, max_steps=max_steps,
                           target_accuracy=target, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--target", type=float, required=True)
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds run from this one on (more seeds for a second run)")
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument("--local-steps", type=int, default=16,
                        help="steps a worker takes per round trip (evaluations fall at round ends)")
    parser.add_argument("--arm", type=parse_arm, action="append", required=True)
    args = parser.parse_args()
    if args.local_steps < 1:
        parser.error(f"--local-steps should be a positive integer, but got {args.local_steps}")
    train, test = daskpri.datasets.load(args.dataset)
    found: dict[str, list[int | None]] = {}
    with local_cluster(n_workers=2) as cluster, Client(cluster) as client:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for label, strategy, lr, options in args.arm:
                h = run_arm(client, args.model, train, test, seed, strategy, lr, options,
                            eval_every=args.eval_every, max_steps=args.max_steps,
                            target=args.target, local_steps=args.local_steps)
                acc = h["accuracy"].dropna("step")
                hit = acc.step.values[acc.values >= args.target]
                steps = int(hit[0]) + 1 if hit.size else None
                seconds = float(h["time"].sel(step=hit[0])) if hit.size else None
                found.setdefault(label, []).append(steps)
                print(f"{label} seed {seed}: {steps or 'not reached'} steps"
                      + (f", {seconds:.2f} s" if seconds is not None else ""), flush=True)
    for label, steps in found.items():
        median = np.median([s if s is not None else np.inf for s in steps])
        print(f"{label:20s} median {median:g} steps; each seed {steps}")


if __name__ == "__main__":
    main()
