"""Steps (and seconds) to a target accuracy for strategy settings, seed by seed.

Run, for example::

    python benchmarks/steps_to_target.py --dataset mnist1d --model cnn --target 0.9765 \\
        --seeds 10 --eval-every 8 --arm uniform=uniform:0.1 \\
        --arm pf50=selective-backprop:0.1:beta=1,refresh=3,warmup=1,stale_beta=5,prefilter=0.5

Each ``--arm`` is ``LABEL=STRATEGY:LR[:OPTION=VALUE,...]``, the options the
strategy's (checked before the cluster starts) or the trainer's learning-rate
schedule (``lr_schedule``, ``schedule_steps``), gradient clipping
(``max_grad_norm``), label smoothing (``label_smoothing``) and the table's
staleness model (``staleness``). Every
arm runs each seed on one LocalCluster of 2 one-thread workers (batch 64
a worker, 16 local steps unless ``--local-steps`` says otherwise, SGD with
momentum 0.9, partitions of 1,000, as ``daskpri bench`` runs them) until
the test accuracy reaches ``--target`` or ``--max-steps``. It prints each
run's steps and training seconds to the target, then per arm the median
and each seed's steps.

``--target`` may name several targets (``0.9553,0.958,0.96``): a run
stops at the highest, and each is reported. ``--run-out`` runs every arm
to ``--max-steps`` whatever it reaches, and also prints each arm's best
accuracy and the best of its median curve over the seeds (the curve a
``daskpri bench`` target is 97% or 99% of), to see where a longer
budget would put the targets.

Steps to the target depend on the selection alone (a seed selects the
same samples each time), so they compare settings without the machine's
noise; the seconds are one run's, for scale: ``daskpri bench`` measures
time. Evaluations are not charged; how often they run sets the steps'
resolution.
"""

from __future__ import annotations

import argparse
import ast
import math

import numpy as np
import xarray as xr
from dask.distributed import Client

import daskpri
from daskpri.models import build_model
from daskpri.strategies import get_strategy
from daskpri.training.cluster import local_cluster, one_torch_thread
from daskpri.training.schedule import validate_schedule

#: The arm options that go to the trainer, not the strategy.
TRAINER_OPTIONS = ("lr_schedule", "schedule_steps", "max_grad_norm", "label_smoothing",
                   "staleness")


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


def parse_targets(text: str) -> list[float]:
    """``--target``: one accuracy or several, comma-separated, in (0, 1].

    Examples
    --------
    >>> parse_targets("0.96,0.9553")
    [0.9553, 0.96]
    >>> parse_targets("1.5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: a target is an accuracy in (0, 1], but got '1.5'
    """
    out = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"a target is an accuracy in (0, 1], but got {item!r}")
        out.append(value)
    return sorted(set(out))


def median_curve_best(curves: list[np.ndarray]) -> tuple[float, int]:
    """The best of the seeds' median accuracy curve, and its index (evaluations).

    The curves are cut to the shortest, as runs that stopped early end.

    Examples
    --------
    >>> median_curve_best([np.array([0.5, 0.9, 0.8]), np.array([0.7, 0.8]), np.array([0.6, 0.7])])
    (0.8, 1)
    """
    n = min(c.size for c in curves)
    median = np.median(np.stack([c[:n] for c in curves]), axis=0)
    i = int(np.argmax(median))
    return float(median[i]), i


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--target", type=parse_targets, required=True,
                        help="an accuracy, or several comma-separated")
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds run from this one on (more seeds for a second run)")
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument("--local-steps", type=int, default=16,
                        help="steps a worker takes per round trip (evaluations fall at round ends)")
    parser.add_argument("--arm", type=parse_arm, action="append", required=True)
    parser.add_argument("--run-out", action="store_true",
                        help="run to --max-steps, and report each arm's best accuracy")
    args = parser.parse_args()
    if args.local_steps < 1:
        parser.error(f"--local-steps should be a positive integer, but got {args.local_steps}")
    train, test = daskpri.datasets.load(args.dataset)
    targets = args.target
    found: dict[str, list[list[int | None]]] = {}
    curves: dict[str, list[np.ndarray]] = {}
    steps_at: dict[str, np.ndarray] = {}
    with local_cluster(n_workers=2) as cluster, Client(cluster) as client:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for label, strategy, lr, options in args.arm:
                h = run_arm(client, args.model, train, test, seed, strategy, lr, options,
                            eval_every=args.eval_every, max_steps=args.max_steps,
                            target=None if args.run_out else targets[-1],
                            local_steps=args.local_steps)
                acc = h["accuracy"].dropna("step")
                curves.setdefault(label, []).append(acc.values)
                if acc.step.size > steps_at.get(label, np.empty(0)).size:
                    steps_at[label] = acc.step.values
                each = []
                for target in targets:
                    hit = acc.step.values[acc.values >= target]
                    steps = int(hit[0]) + 1 if hit.size else None
                    seconds = float(h["time"].sel(step=hit[0])) if hit.size else None
                    each.append(steps)
                    print(f"{label} seed {seed} to {target:g}: {steps or 'not reached'} steps"
                          + (f", {seconds:.2f} s" if seconds is not None else ""), flush=True)
                if args.run_out:
                    print(f"{label} seed {seed}: best {acc.values.max():.4f}, "
                          f"final {acc.values[-1]:.4f}", flush=True)
                found.setdefault(label, []).append(each)
    for label, runs in found.items():
        for i, target in enumerate(targets):
            steps = [run[i] for run in runs]
            median = np.median([s if s is not None else np.inf for s in steps])
            print(f"{label:20s} to {target:g}: median {median:g} steps; each seed {steps}")
        if args.run_out:
            best, at = median_curve_best(curves[label])
            print(f"{label:20s} best: median {np.median([c.max() for c in curves[label]]):.4f}; "
                  f"median curve's best {best:.4f} at step {int(steps_at[label][at]) + 1} "
                  f"(99%: {0.99 * best:.4f}, 97%: {0.97 * best:.4f})")


if __name__ == "__main__":
    main()
