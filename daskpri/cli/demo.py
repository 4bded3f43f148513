"""``daskpri demo``: selective backprop against uniform sampling, for the same time."""

from __future__ import annotations

import argparse
import math

import numpy as np
import xarray as xr
from distributed import Client

import daskpri
from daskpri import _config
from daskpri.cli._argtypes import _strategy_options
from daskpri.cli._interrupt import StopAtOnce, _close, _heard_as_cluster_starts, _interruptible
from daskpri.cli._prog import _DEMO_STRATEGY
from daskpri.cli._summary import _dashboard_lines, _summary
from daskpri.strategies import check_strategy_options, get_strategy
from daskpri.training._checks import check_eval_every, check_float, check_int
from daskpri.training._cleanup import close_cluster
from daskpri.training._interrupts import interrupts_held
from daskpri.training.cluster import local_cluster, one_torch_thread
from daskpri.training.history import time_to_accuracy

_DEMO_TARGET_FRACTION = 0.97  # of the best accuracy the uniform baseline reached


def _demo(args: argparse.Namespace) -> int:
    # Checked here, as argparse leaves them, so that bad values fail before a cluster starts.
    check_int("workers", args.workers, 1)
    check_float("max_time", args.max_time)
    check_int("local_steps", args.local_steps, 1)
    # the trainer rounds its configured period to whole rounds, so that both runs are evaluated
    # evenly; a bad one is refused here, before a cluster starts
    check_eval_every(None, _config.get("trainer.eval-every"), args.local_steps)
    options = _strategy_options(args.strategy_option)
    check_strategy_options(_DEMO_STRATEGY, options)
    get_strategy(_DEMO_STRATEGY, **options)  # its values, checked before the cluster starts
    train, test = daskpri.datasets.load(args.dataset, root=args.root, seed=args.seed)
    histories: dict[str, xr.Dataset] = {}
    cluster = None
    at_once = False  # a second Ctrl-C: the workers are killed, not waited for
    try:
        # started as a trainer starts its own: a Ctrl-C in the middle of LocalCluster(...)
        # would leave the worker processes it had started running, owned by no one; held,
        # it is raised once the cluster has started, and the cluster closed below
        with interrupts_held(_heard_as_cluster_starts):
            cluster = local_cluster(args.workers)  # the trainer's: loopback, torch-friendly
        # not the default client, nor the current one (`with Client`): closed below, inside
        # the block, the current one's close would leave Dask's config on a closed client
        client = Client(cluster, set_as_default=False)
        with one_torch_thread():  # the workers have the cores
            print("\n".join(_dashboard_lines(client)), flush=True)
            given = ", ".join(f"{k}={v}" for k, v in options.items())
            print(f"{_DEMO_STRATEGY}" + (f" ({given})" if given else "")
                  + f" against uniform, {args.local_steps} local step"
                  + ("s" if args.local_steps > 1 else "") + f" per round, {args.max_time:g} s each",
                  flush=True)
            try:
                for strategy in (_DEMO_STRATEGY, "uniform"):
                    # The same initial weights for both runs: only the sampling differs.
                    model = daskpri.models.build_model(args.model, train, seed=args.seed)
                    trainer = daskpri.Trainer(model, strategy=strategy, client=client,
                                              seed=args.seed, local_steps=args.local_steps,
                                              **(options if strategy == _DEMO_STRATEGY else {}))
                    at_once = False
                    try:
                        with _interruptible(trainer):
                            histories[strategy] = trainer.fit(train, eval_data=test,
                                                              max_time=args.max_time)
                    except StopAtOnce:
                        at_once = True
                        raise
                    finally:
                        try:
                            _close(trainer, at_once=at_once, ours=True)
                        except StopAtOnce:  # a Ctrl-C as the close waited: at once too
                            at_once = True
                            raise
                    print(_summary(histories[strategy]), flush=True)
            finally:
                # a worker stuck in the step a second Ctrl-C left answers nothing: killed
                with interrupts_held():  # (a close interrupted half-way would never end)
                    close_cluster(client, cluster, kill_workers=at_once)
    finally:
        if cluster is not None:
            with interrupts_held():  # (a close interrupted half-way would never end)
                cluster.close()
    print(_comparison(histories[_DEMO_STRATEGY], histories["uniform"]), flush=True)
    return 0


def _comparison(prioritized: xr.Dataset, uniform: xr.Dataset) -> str:
    """Time to 97% of the uniform baseline's best accuracy, for both runs."""
    best = float(np.nanmax(uniform["accuracy"].values, initial=-np.inf))
    if not math.isfinite(best):
        return "no accuracy was measured, so there is no target to compare against"
    target = _DEMO_TARGET_FRACTION * best
    parts = []
    times = {}
    for name, history in ((_DEMO_STRATEGY, prioritized), ("uniform", uniform)):
        acc = history["accuracy"].values
        final = acc[~np.isnan(acc)][-1] if (~np.isnan(acc)).any() else math.nan
        times[name] = time_to_accuracy(history, target)
        reached = "not reached" if math.isnan(times[name]) else f"{times[name]:.1f} s"
        parts.append(f"{name} accuracy {final:.4f}, time to target {reached}")
    if math.isnan(times[_DEMO_STRATEGY]):
        speedup = f"not reached by {_DEMO_STRATEGY}"
    else:
        speedup = f"{times['uniform'] / times[_DEMO_STRATEGY]:.2f}x"
    return (
        f"target {target:.4f} ({_DEMO_TARGET_FRACTION:.0%} of uniform's best {best:.4f}): "
        + "; ".join(parts) + f"; speedup {speedup}"
    )
