"""Train a prioritized run and its uniform baseline side by side.

Run: ``python examples/prioritized_vs_uniform.py [--scheduler tcp://HOST:8786]``

Without ``--scheduler`` it starts a LocalCluster of two workers on loopback.
Open the printed dashboard address to watch the workers. The model class is
defined here, in ``__main__``: daskpri ships it to the workers by value.
"""

from __future__ import annotations

import argparse

import torch
from distributed import Client, LocalCluster

import daskpri


class SmallMLP(torch.nn.Module):
    """A user's own module (any ``torch.nn.Module`` returning logits)."""

    def __init__(self, n_in: int, n_classes: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_in, 300), torch.nn.ReLU(), torch.nn.Linear(300, n_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", help="address of a running dask scheduler")
    parser.add_argument("--max-time", type=float, default=30.0, help="seconds per run")
    args = parser.parse_args()

    train, test = daskpri.datasets.load("mnist1d")
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0",
            preload=["daskpri.training.worker_signals"],  # Ctrl-C stops the fit, not them
        )
        client = Client(cluster)
    print("dashboard:", client.dashboard_link)

    histories = {}
    for strategy in ("selective-backprop", "uniform"):
        torch.manual_seed(0)  # the same initial weights for both runs
        model = SmallMLP(train.sizes["feature"], int(train.attrs["n_classes"]))
        with daskpri.Trainer(model, strategy=strategy, client=client, seed=0) as trainer:
            histories[strategy] = trainer.fit(train, eval_data=test, max_time=args.max_time)
    best = float(histories["uniform"]["accuracy"].max())
    target = 0.97 * best
    for name, h in histories.items():
        t = daskpri.time_to_accuracy(h, target)
        reached = f"reached {target:.3f} after {t:.1f} s" if t == t else f"{target:.3f} not reached"
        print(f"{name:>20}: best accuracy {float(h['accuracy'].max()):.3f}, {reached}")
    client.close()


if __name__ == "__main__":
    main()
