"""Each strategy on MNIST-1D with the MLP and the CNN: final accuracy and time.

Run: ``python benchmarks/strategies_mnist1d.py [--steps 1000] [--workers 2]``.
One LocalCluster, runs one after another (never two jobs at once). Prints a
markdown table; time is training wall time (evaluation excluded).
"""

from __future__ import annotations

import argparse

from distributed import Client, LocalCluster

import daskpri
from daskpri.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--strategies", default=",".join(daskpri.STRATEGIES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    train, test = daskpri.datasets.load("mnist1d")
    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        print(
            f"mnist1d: {train.sizes['sample']} train, {test.sizes['sample']} test samples; "
            f"{args.workers} workers; {args.steps} steps; batch 64 per worker; seed {args.seed}"
        )
        print("| model | strategy | final acc. | best acc. | time (s) | samples/s | grad samples |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for model_name in args.models.split(","):
            for strategy in args.strategies.split(","):
                model = build_model(model_name, train, seed=args.seed)
                with daskpri.Trainer(
                    model, strategy=strategy, client=client, seed=args.seed
                ) as trainer:
                    h = trainer.fit(train, eval_data=test, max_steps=args.steps, progress=False)
                acc = h["accuracy"].dropna("step")
                t = float(h["time"][-1])
                print(
                    f"| {model_name} | {strategy} | {float(acc[-1]):.3f} | {float(acc.max()):.3f} "
                    f"| {t:.1f} | {float(h['samples'][-1]) / t:.0f} "
                    f"| {int(h['grad_samples'][-1])} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
