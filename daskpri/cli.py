"""The ``daskpri`` command line: ``train``, ``demo`` and ``strategies``.

Examples
--------
Train on a LocalCluster of two workers and keep the history::

    daskpri train --dataset mnist1d --model mlp --strategy projection \\
        --workers 2 --max-steps 2000 --output run.nc

Train on a running cluster, on workers started with ``--resources GPU=1``::

    daskpri train --scheduler tcp://HOST:8786 --resources GPU=1 --max-time 600

Compare selective backprop with uniform sampling for the same time budget::

    daskpri demo --max-time 45

or with rounds of 16 local steps, keeping a quarter of the candidates::

    daskpri demo --local-steps 16 --strategy-option fraction=0.25
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import xarray as xr
from distributed import Client

import daskpri
from daskpri import _config
from daskpri.bench import command as bench_command
from daskpri.data.datasets import DATASETS
from daskpri.data.io import to_store
from daskpri.models import MODELS
from daskpri.strategies import STRATEGIES, check_strategy_options, get_strategy
from daskpri.table.staleness import STALENESS_MODELS
from daskpri.training._checks import check_eval_every, check_float, check_int
from daskpri.training.cluster import (
    drop_abandoned_gathers,
    local_cluster,
    one_torch_thread,
    stop_heartbeats,
)
from daskpri.training.history import time_to_accuracy
from daskpri.training.placement import parse_resources
from daskpri.training.schedule import SCHEDULES

__all__ = ["main"]

_PROG = "daskpri"
_OUTPUT_SUFFIXES = (".nc", ".zarr")
_CONNECT_TIMEOUT = 10.0  # seconds; a scheduler that does not answer by then is taken as down
_DEFAULT_MAX_STEPS = 2000  # when neither --max-steps nor --max-time is given
_DEMO_STRATEGY = "selective-backprop"
_DEMO_TARGET_FRACTION = 0.97  # of the best accuracy the uniform baseline reached


class _ConnectError(Exception):
    """The scheduler named by ``--scheduler`` could not be reached."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``daskpri`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after the program name; ``None`` reads ``sys.argv``.

    Returns
    -------
    int
        The exit status: 0 on success, 2 for bad input (argparse exits with
        ``SystemExit(2)`` itself for bad arguments), 1 when the scheduler
        cannot be reached, 130 when interrupted.

    Examples
    --------
    >>> main(["strategies"])  # doctest: +ELLIPSIS
    uniform             Uniform(batch_size=None)
    ...
    """
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    except _ConnectError as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130


# -- parser ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Prioritized data-parallel SGD for PyTorch on Dask clusters."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train a model and report its history")
    train.set_defaults(run=_train)
    data = train.add_argument_group("data and model")
    data.add_argument("--dataset", choices=DATASETS, default="mnist1d")
    data.add_argument("--model", choices=MODELS, default="mlp")
    data.add_argument("--n-samples", type=int, metavar="N",
                      help="samples of the dataset, train and test together")
    data.add_argument("--root", metavar="DIR", help="directory of the mnist or cifar10 files")
    data.add_argument("--seed", type=int, default=0, help="seeds data, weights and selections")
    run = train.add_argument_group("training")
    run.add_argument("--strategy", choices=list(STRATEGIES), default="projection")
    run.add_argument("--strategy-option", type=_strategy_option, action="append", default=[],
                     metavar="KEY=VALUE", help="a strategy parameter, e.g. k=32 (repeatable)")
    run.add_argument("--max-steps", type=int, metavar="N",
                     help=f"total steps (default {_DEFAULT_MAX_STEPS} unless --max-time is given)")
    run.add_argument("--max-time", type=float, metavar="S", help="seconds of training")
    run.add_argument("--target-accuracy", type=float, metavar="A",
                     help="stop once the test accuracy reaches A, in (0, 1]")
    run.add_argument("--batch-size", type=int, metavar="N", help="samples per worker per step")
    run.add_argument("--local-steps", type=int, default=1, metavar="K",
                     help="optimizer steps each worker takes per round trip (local SGD; "
                     "default 1: synchronous)")
    run.add_argument("--staleness", choices=STALENESS_MODELS,
                     help="how the priority table estimates priorities not recomputed "
                          "lately (default: daskpri.table.staleness, keep)")
    run.add_argument("--learning-rate", type=float, metavar="LR")
    run.add_argument("--optimizer", choices=("sgd", "adam"))
    run.add_argument("--eval-every", type=int, metavar="N", help="steps between evaluations")
    run.add_argument("--lr-schedule", choices=SCHEDULES, default="constant",
                     help="learning rate: constant, or decaying to zero over --max-steps")
    ckpt = train.add_argument_group("checkpoints")
    ckpt.add_argument("--checkpoint", metavar="PATH",
                      help="checkpoint file, written atomically every --checkpoint-every steps")
    ckpt.add_argument("--checkpoint-every", type=int, metavar="N",
                      help="steps between checkpoints (default 100 with --checkpoint)")
    ckpt.add_argument("--resume", metavar="PATH",
                      help="continue the run checkpointed at PATH (same --dataset and --seed); "
                      "--max-steps counts from the run's start")
    cluster = train.add_argument_group("cluster")
    cluster.add_argument("--scheduler", metavar="ADDRESS",
                         help="a running scheduler, e.g. tcp://HOST:8786 (default: a LocalCluster)")
    cluster.add_argument("--workers", type=int, metavar="N",
                         help="LocalCluster workers (2), or the scheduler's workers to use (all)")
    cluster.add_argument("--resources", type=_resources, metavar="NAME=AMOUNT[,...]",
                         help="resources each training task needs, e.g. GPU=1")
    cluster.add_argument("--transport", choices=("direct", "tasks"),
                         help="steps as RPCs to the workers (direct, default) or as Dask tasks")
    tls = train.add_argument_group("TLS (with --scheduler; the LocalCluster's is --tls)")
    tls.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate of the cluster")
    tls.add_argument("--tls-cert", metavar="PEM", help="this client's certificate")
    tls.add_argument("--tls-key", metavar="PEM", help="this client's private key")
    tls.add_argument("--tls", action="store_true",
                     help="start the LocalCluster with TLS (temporary credentials)")
    out = train.add_argument_group("output")
    out.add_argument("--output", type=_output_path, metavar="PATH",
                     help="write the history to PATH (.nc for netCDF, .zarr for zarr)")
    out.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    demo = sub.add_parser(
        "demo", help=f"{_DEMO_STRATEGY} against uniform sampling for the same time budget"
    )
    demo.set_defaults(run=_demo)
    demo.add_argument("--workers", type=int, default=2, metavar="N")
    demo.add_argument("--max-time", type=float, default=45.0, metavar="S",
                      help="seconds of training for each run (default 45)")
    demo.add_argument("--dataset", choices=DATASETS, default="mnist1d")
    demo.add_argument("--model", choices=MODELS, default="mlp")
    demo.add_argument("--root", metavar="DIR", help="directory of the mnist or cifar10 files")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--local-steps", type=int, default=1, metavar="K",
                      help="optimizer steps each worker takes per round trip, for both runs "
                      "(default 1: synchronous)")
    demo.add_argument("--strategy-option", type=_strategy_option, action="append", default=[],
                      metavar="KEY=VALUE",
                      help=f"a {_DEMO_STRATEGY} parameter, e.g. fraction=0.25 (repeatable)")

    dash = sub.add_parser("dashboard", help="serve the live /daskpri page of a scheduler")
    dash.set_defaults(run=_dashboard_command)
    dash.add_argument("--scheduler", required=True, metavar="ADDRESS",
                      help="the scheduler whose runs to show, e.g. tcp://127.0.0.1:8786")
    dash.add_argument("--port", type=int, default=5006, help="port to listen on (0: any free)")
    dash.add_argument("--address", metavar="HOST",
                      help="interface to listen on (default 127.0.0.1; 0.0.0.0 opens it to "
                           "the network)")

    report = sub.add_parser("report", help="a static HTML report of a run's history")
    report.set_defaults(run=_report)
    report.add_argument("history", help="history from `daskpri train --output` (.nc or .zarr)")
    report.add_argument("-o", "--output", required=True, metavar="HTML")
    report.add_argument("--baseline", metavar="PATH", help="another run's history to compare with")
    report.add_argument("--title")

    strategies = sub.add_parser("strategies", help="list the strategies and their defaults")
    strategies.set_defaults(run=_strategies)

    bench = sub.add_parser(
        "bench", help="the strategies against uniform, scaling and overhead, side by side"
    )
    bench_command.add_arguments(bench)
    bench.set_defaults(run=_bench)
    return parser


def _strategy_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"a strategy option should look like KEY=VALUE, e.g. k=32, but got {text!r}"
        )
    return key, _parse_value(value.strip())


def _parse_value(text: str) -> Any:
    """``text`` as an int, else a float, else a bool, else None, else itself.

    Examples
    --------
    >>> [_parse_value(s) for s in ["32", "0.02", "true", "None", "top"]]
    [32, 0.02, True, None, 'top']
    """
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    lower = text.lower()
    if lower in ("true", "false"):
        return lower == "true"
    if lower == "none":
        return None
    return text


def _resources(text: str) -> dict[str, float] | None:
    try:
        return parse_resources(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _output_path(text: str) -> str:
    if not text.lower().rstrip("/").endswith(_OUTPUT_SUFFIXES):
        raise argparse.ArgumentTypeError(
            "the output should be a path ending in .nc (netCDF) or .zarr (zarr), "
            f"but got {text!r}"
        )
    return text


# -- commands --------------------------------------------------------------------


def _train(args: argparse.Namespace) -> int:
    options = dict(args.strategy_option)
    check_strategy_options(args.strategy, options)
    train, test = daskpri.datasets.load(
        args.dataset, root=args.root, seed=args.seed, n_samples=args.n_samples
    )
    model = daskpri.models.build_model(args.model, train, seed=args.seed)
    max_steps = args.max_steps
    if max_steps is None and args.max_time is None:
        max_steps = _DEFAULT_MAX_STEPS
    tls_files = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if any(tls_files) and (args.scheduler is None or not all(tls_files)):
        raise ValueError(
            "--tls-ca-file, --tls-cert and --tls-key go together, with --scheduler; "
            "for a LocalCluster with TLS, use --tls"
        )
    if args.tls and args.scheduler is not None:
        raise ValueError("--tls starts a LocalCluster with TLS; with --scheduler, use --tls-*")
    security = None
    if all(tls_files):
        from distributed.security import Security

        security = Security(tls_ca_file=args.tls_ca_file, tls_client_cert=args.tls_cert,
                            tls_client_key=args.tls_key, require_encryption=True)
    if args.checkpoint_every is not None and args.checkpoint is None:
        raise ValueError("--checkpoint-every needs --checkpoint PATH, the file to write")
    if args.lr_schedule != "constant" and max_steps is None:
        raise ValueError(f"--lr-schedule {args.lr_schedule} decays over --max-steps; give it")
    schedule_steps = None if args.lr_schedule == "constant" else max_steps
    checkpoints = {}
    if args.checkpoint is not None:
        checkpoints = {"checkpoint_path": args.checkpoint,
                       "checkpoint_every": args.checkpoint_every or 100}
    client = None if args.scheduler is None else _connect(args.scheduler, security)
    trainer = None
    try:
        if args.resume is not None:
            # the run's own parameters come from the checkpoint; where to
            # write the next checkpoints and the transport may change
            trainer = daskpri.Trainer.resume(
                args.resume, client=client,
                **({"transport": args.transport} if args.transport else {}), **checkpoints,
            )
            print(f"resumed {args.resume} at step {trainer.step_}", flush=True)
        else:
            trainer = daskpri.Trainer(
                model, strategy=args.strategy, client=client, seed=args.seed,
                n_workers=args.workers, resources=args.resources, batch_size=args.batch_size,
                learning_rate=args.learning_rate, optimizer=args.optimizer,
                local_steps=args.local_steps, staleness=args.staleness,
                lr_schedule=args.lr_schedule, schedule_steps=schedule_steps,
                eval_every=args.eval_every, transport=args.transport,
                security=True if args.tls else None, **checkpoints, **options,
            )
        print(f"dashboard: {_dashboard(trainer.client)}", flush=True)
        # a LocalCluster's workers have this machine's cores
        local = one_torch_thread() if client is None else contextlib.nullcontext()
        with _interruptible(trainer), local:
            history = trainer.fit(
                train, eval_data=test, max_steps=max_steps, max_time=args.max_time,
                target_accuracy=args.target_accuracy, progress=not args.no_progress,
            )
        print(_summary(history), flush=True)
        if args.output is not None:
            history.attrs.update(dataset=args.dataset, model=args.model)
            to_store(history, args.output)
            print(f"history written to {args.output}", flush=True)
    finally:
        if trainer is not None:
            trainer.close()
        if client is not None:
            client.close()
    return 0


@contextlib.contextmanager
def _interruptible(trainer: daskpri.Trainer) -> Iterator[None]:
    """Ctrl-C stops ``trainer``'s fit even where its ``KeyboardInterrupt`` is lost.

    Python raises the interrupt in whatever the main thread runs at that
    moment; inside a finalizer or a callback it is printed and dropped, and
    the run would go on to its budget. The handler also asks the trainer to
    stop after its step in flight, and the interrupt is raised again then.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield  # signals go to the main thread; an ignored SIGINT stays ignored
        return
    interrupted = False  # no lock: the handler may run inside anything, itself included

    def handler(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted = True
        trainer.stop()
        drop_abandoned_gathers()  # a gather the interrupt leaves behind ends with the cluster
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        # None: a handler not set from Python, which cannot be put back; the default then
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    if interrupted:  # fit returned: the interrupt was lost on the way
        raise KeyboardInterrupt


def _demo(args: argparse.Namespace) -> int:
    # Checked here, as argparse leaves them, so that bad values fail before a cluster starts.
    check_int("workers", args.workers, 1)
    check_float("max_time", args.max_time)
    check_int("local_steps", args.local_steps, 1)
    # the trainer rounds its configured period to whole rounds, so that both runs are evaluated
    # evenly; a bad one is refused here, before a cluster starts
    check_eval_every(None, _config.get("trainer.eval-every"), args.local_steps)
    options = dict(args.strategy_option)
    check_strategy_options(_DEMO_STRATEGY, options)
    get_strategy(_DEMO_STRATEGY, **options)  # its values, checked before the cluster starts
    train, test = daskpri.datasets.load(args.dataset, root=args.root, seed=args.seed)
    histories: dict[str, xr.Dataset] = {}
    cluster = local_cluster(args.workers)  # the trainer's: loopback, torch-friendly workers
    try:
        with Client(cluster) as client, one_torch_thread():  # the workers have the cores
            print(f"dashboard: {_dashboard(client)}", flush=True)
            given = ", ".join(f"{k}={v}" for k, v in options.items())
            print(f"{_DEMO_STRATEGY}" + (f" ({given})" if given else "")
                  + f" against uniform, {args.local_steps} local step"
                  + ("s" if args.local_steps > 1 else "") + f" per round, {args.max_time:g} s each",
                  flush=True)
            try:
                for strategy in (_DEMO_STRATEGY, "uniform"):
                    # The same initial weights for both runs: only the sampling differs.
                    model = daskpri.models.build_model(args.model, train, seed=args.seed)
                    with daskpri.Trainer(model, strategy=strategy, client=client,
                                         seed=args.seed, local_steps=args.local_steps,
                                         **(options if strategy == _DEMO_STRATEGY else {}),
                                         ) as trainer, _interruptible(trainer):
                        histories[strategy] = trainer.fit(train, eval_data=test,
                                                          max_time=args.max_time)
                    print(_summary(histories[strategy]), flush=True)
            finally:
                stop_heartbeats(client)
    finally:
        cluster.close()
    print(_comparison(histories[_DEMO_STRATEGY], histories["uniform"]), flush=True)
    return 0


def _bench(args: argparse.Namespace) -> int:
    return bench_command.run(args)


def _strategies(args: argparse.Namespace) -> int:
    width = max(len(name) for name in STRATEGIES) + 2
    for name in STRATEGIES:
        print(f"{name:<{width}}{get_strategy(name)!r}")
    return 0


# -- helpers ---------------------------------------------------------------------


def _connect(address: str, security: Any = None) -> Client:
    try:
        return Client(address, timeout=_CONNECT_TIMEOUT, security=security)
    except (OSError, TimeoutError, ValueError) as e:
        raise _ConnectError(f"could not connect to the scheduler at {address}: {e}") from e


def _dashboard_command(args: argparse.Namespace) -> int:
    from daskpri.dashboard.remote import ROUTE, make_server

    if not 0 <= args.port < 65536:
        raise ValueError(f"port should be in [0, 65536), but got port={args.port}")
    server = make_server(args.scheduler, address=args.address, port=args.port)
    server.start()
    print(f"daskpri dashboard: http://{server.address}:{server.port}{ROUTE}", flush=True)
    try:
        server.io_loop.start()
    finally:
        server.stop()
    return 0


def _report(args: argparse.Namespace) -> int:
    from daskpri.dashboard.report import write_report

    path = write_report(args.history, args.output, baseline=args.baseline, title=args.title)
    print(f"report written to {path}")
    return 0


def _dashboard(client: Client) -> str:
    try:
        link = client.dashboard_link
    except KeyError:  # a scheduler without an HTTP server reports no dashboard port
        link = None
    return link or "none (the scheduler runs without one)"


def _summary(history: xr.Dataset) -> str:
    """One line: strategy, steps, final and best accuracy, time, samples/s."""
    name = history.attrs.get("strategy", "run")
    if history.sizes["step"] == 0:
        return f"{name}: 0 steps"
    # a record per step, or per round of local steps: its last step is numbered
    steps = int(history["step"].values[-1]) + 1
    acc = history["accuracy"].values
    seen = acc[~np.isnan(acc)]
    final = seen[-1] if seen.size else math.nan
    best = seen.max() if seen.size else math.nan
    seconds = float(history["time"].values[-1])
    rate = float(history["samples"].values[-1]) / seconds if seconds > 0 else math.nan
    return (
        f"{name}: {steps} steps, final accuracy {final:.4f}, best accuracy {best:.4f}, "
        f"{seconds:.1f} s training, {rate:,.0f} samples/s"
    )


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
