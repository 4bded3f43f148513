"""The ``daskpri`` command line: ``train``, ``demo`` and ``strategies``.

Examples
--------
Train on a LocalCluster of two workers and keep the history::

    daskpri train --dataset mnist1d --model mlp --strategy selective-backprop \\
        --workers 2 --max-steps 2000 --output run.nc

Train on a running cluster, on workers started with ``--resources GPU=1``::

    daskpri train --scheduler tcp://HOST:8786 --resources GPU=1 --max-time 600

Compare selective backprop with uniform sampling for the same time budget::

    daskpri demo --max-time 45

or with rounds of 16 local steps, keeping a third of the candidates::

    daskpri demo --local-steps 16 --strategy-option fraction=0.33
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import xarray as xr
from distributed import Client

import daskpri
from daskpri import _config
from daskpri.bench import command as bench_command
from daskpri.bench.report import RESULTS_JSON
from daskpri.data.datasets import DATASETS
from daskpri.data.io import check_destination, to_store
from daskpri.models import MODELS
from daskpri.strategies import STRATEGIES, check_strategy_options, get_strategy
from daskpri.table.staleness import STALENESS_MODELS
from daskpri.training import checkpoint
from daskpri.training._checks import check_eval_every, check_float, check_int
from daskpri.training.cluster import (
    SchedulerUnreachable,
    connect,
    drop_abandoned_gathers,
    local_cluster,
    one_torch_thread,
    stop_heartbeats,
)
from daskpri.training.history import time_to_accuracy
from daskpri.training.placement import parse_resources
from daskpri.training.recovery import SchedulerLostError
from daskpri.training.schedule import SCHEDULES
from daskpri.training.trainer import LEARNING_RATES

__all__ = ["main"]

_PROG = "daskpri"
_OUTPUT_SUFFIXES = (".nc", ".zarr")
_DEFAULT_CHECKPOINT_EVERY = 100
_DEFAULT_MAX_STEPS = 2000  # when neither --max-steps nor --max-time is given
_DEMO_STRATEGY = "selective-backprop"
_DEMO_TARGET_FRACTION = 0.97  # of the best accuracy the uniform baseline reached


#: The file system's refusals of a path the user gave (for example a file
#: where a directory should be), told in one line rather than a traceback.
_PATH_ERRORS = (
    FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError
)


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
        cannot be reached or the run fails (a NaN loss, a lost scheduler),
        130 when interrupted.

    Examples
    --------
    >>> main(["strategies"])  # doctest: +ELLIPSIS
    uniform             Uniform(batch_size=None)
    ...
    """
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, TypeError) as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    except _PATH_ERRORS as e:  # a path the user gave, found bad on the way
        where = "" if e.filename is None else f"{e.filename}: "
        print(f"{_PROG}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except (SchedulerUnreachable, FloatingPointError, SchedulerLostError) as e:
        # the last two: a run that stopped, saying why and what was checkpointed
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
    data.add_argument("--dataset", choices=DATASETS, default="mnist1d",
                      help="the data (default mnist1d; mnist and cifar10 read --root)")
    # None defaults, here and below: with --resume, an option given is told from one left out
    data.add_argument("--model", choices=MODELS, help="default mlp")
    data.add_argument("--n-samples", type=int, metavar="N",
                      help="samples of the dataset, train and test together")
    data.add_argument("--root", metavar="DIR", help="directory of the mnist or cifar10 files")
    data.add_argument("--seed", type=int,
                      help="seeds data, weights and selections (default 0)")
    run = train.add_argument_group("training")
    run.add_argument("--strategy", choices=list(STRATEGIES), help="default selective-backprop")
    run.add_argument("--strategy-option", type=_strategy_option, action="append", default=[],
                     metavar="KEY=VALUE", help="a strategy parameter, e.g. k=32 (repeatable)")
    run.add_argument("--max-steps", type=_count(0), metavar="N",
                     help=f"total steps (default {_DEFAULT_MAX_STEPS} unless --max-time is given)")
    run.add_argument("--max-time", type=_seconds, metavar="S", help="seconds of training")
    run.add_argument("--target-accuracy", type=_accuracy, metavar="A",
                     help="stop once the test accuracy reaches A, in (0, 1]")
    run.add_argument("--batch-size", type=int, metavar="N", help="samples per worker per step")
    run.add_argument("--local-steps", type=int, metavar="K",
                     help="optimizer steps each worker takes per round trip (local SGD; "
                     "default 1: synchronous)")
    run.add_argument("--staleness", choices=STALENESS_MODELS,
                     help="how the priority table estimates priorities not recomputed "
                          "lately (default: daskpri.table.staleness, keep)")
    own_rates = ", ".join(f"{rate:g} for {name}" for name, rate in LEARNING_RATES.items())
    run.add_argument("--learning-rate", type=float, metavar="LR",
                     help="the optimizer's learning rate (default: daskpri.trainer.learning-rate, "
                          f"null: {own_rates})")
    run.add_argument("--optimizer", choices=tuple(LEARNING_RATES),
                     help="the driver's optimizer (default: daskpri.trainer.optimizer, sgd)")
    run.add_argument("--max-grad-norm", type=_norm, metavar="NORM",
                     help="clip each optimizer step's gradient to this L2 norm (default: "
                          "daskpri.trainer.max-grad-norm, null: no clipping)")
    run.add_argument("--eval-every", type=int, metavar="N", help="steps between evaluations")
    run.add_argument("--lr-schedule", choices=SCHEDULES,
                     help="learning rate: constant (the default), or decaying to zero over "
                     "--max-steps (or --schedule-steps)")
    run.add_argument("--schedule-steps", type=_count(1), metavar="N",
                     help="the steps --lr-schedule decays over (default --max-steps); with "
                          "--resume, a longer schedule than the run's, to train past its end")
    ckpt = train.add_argument_group("checkpoints")
    ckpt.add_argument("--checkpoint", metavar="PATH",
                      help="checkpoint file, written atomically every --checkpoint-every steps")
    ckpt.add_argument("--checkpoint-every", type=_count(1), metavar="N",
                      help=f"steps between checkpoints (default {_DEFAULT_CHECKPOINT_EVERY} "
                      "with --checkpoint; with --resume, the run's own)")
    ckpt.add_argument("--resume", metavar="PATH",
                      help="continue the run checkpointed at PATH (same --dataset and "
                      "--n-samples; its model, strategy, seed and optimization come from the "
                      "checkpoint); --max-steps counts from the run's start")
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
    demo.add_argument("--dataset", choices=DATASETS, default="mnist1d",
                      help="the data (default mnist1d; mnist and cifar10 read --root)")
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
    dash.add_argument("--port", type=int, default=5006,
                      help="port to listen on (default 5006; 0: any free)")
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


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``.

    Examples
    --------
    >>> _count(1)("5")
    5
    >>> _count(1)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: should be a positive integer, but got '0'
    """
    what = {0: "a non-negative integer", 1: "a positive integer"}.get(
        minimum, f"an integer of at least {minimum}"
    )

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"should be {what}, but got {text!r}")
        return value

    return parse


def _number(ok: Callable[[float], bool], what: str) -> Callable[[str], float]:
    """An argparse type: a number for which ``ok`` holds (NaN and text never do).

    Examples
    --------
    >>> _seconds("1.5"), _accuracy("0.9")
    (1.5, 0.9)
    >>> _seconds("inf")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: should be a positive finite number of seconds, but got 'inf'
    >>> _accuracy("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: should be a number in (0, 1], but got 'nan'
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isnan(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"should be {what}, but got {text!r}")
        return value

    return parse


_seconds = _number(lambda v: math.isfinite(v) and v > 0, "a positive finite number of seconds")
_norm = _number(lambda v: math.isfinite(v) and v > 0, "a positive finite number")
_accuracy = _number(lambda v: 0.0 < v <= 1.0, "a number in (0, 1]")


def _strategy_options(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """The ``--strategy-option`` pairs as a dict; a key given twice is refused.

    Examples
    --------
    >>> _strategy_options([("k", 32), ("renew", 0.02)])
    {'k': 32, 'renew': 0.02}
    >>> _strategy_options([("k", 32), ("k", 16)])
    Traceback (most recent call last):
    ...
    ValueError: --strategy-option k should be given once, but got k=32 and k=16
    """
    options: dict[str, Any] = {}
    for key, value in pairs:
        if key in options:
            raise ValueError(
                f"--strategy-option {key} should be given once, but got "
                f"{key}={options[key]!r} and {key}={value!r}"
            )
        options[key] = value
    return options


# -- commands --------------------------------------------------------------------


def _train(args: argparse.Namespace) -> int:
    options = _strategy_options(args.strategy_option)
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
    # where the run's results go: checked before it runs, not found bad after it
    if args.output is not None:
        _check_destination("--output", args.output, kind="store")
    if args.checkpoint is not None:
        _check_destination("--checkpoint", args.checkpoint)
    if args.resume is None:
        settings = _new_run(args, options, max_steps)
        seed, model_name = settings["seed"], args.model or "mlp"
    else:
        state = _read_checkpoint(args.resume)
        settings = _resumed_run(args, options, max_steps, state)
        # the data of a resumed run is split by the run's own seed
        seed, model_name = state["trainer"]["seed"], state["model_spec"]["name"]
    security = None
    if all(tls_files):
        from distributed.security import Security

        security = Security(tls_ca_file=args.tls_ca_file, tls_client_cert=args.tls_cert,
                            tls_client_key=args.tls_key, require_encryption=True)
    train, test = daskpri.datasets.load(
        args.dataset, root=args.root, seed=seed, n_samples=args.n_samples
    )
    if args.resume is not None:
        _check_resumed_data(args, state, train)
    client = None if args.scheduler is None else connect(args.scheduler, security)
    trainer = None
    try:
        if args.resume is None:
            model = daskpri.models.build_model(model_name, train, seed=seed)
            trainer = daskpri.Trainer(model, client=client, **settings)
        else:
            trainer = daskpri.Trainer.resume(args.resume, client=client, **settings)
            print(f"resumed {args.resume} at step {trainer.step_}", flush=True)
        print(f"dashboard: {_dashboard(trainer.client)}", flush=True)
        # a LocalCluster's workers have this machine's cores
        local = one_torch_thread() if client is None else contextlib.nullcontext()
        try:
            with _interruptible(trainer), local:
                history = trainer.fit(
                    train, eval_data=test, max_steps=max_steps, max_time=args.max_time,
                    target_accuracy=args.target_accuracy, progress=not args.no_progress,
                )
        except (KeyboardInterrupt, SchedulerLostError) as e:
            interrupted = isinstance(e, KeyboardInterrupt)
            if args.output is not None:  # the history so far is the driver's: kept
                _write_interrupted(trainer, args.output, args.dataset, model_name,
                                   "interrupted" if interrupted else "the scheduler lost")
            path = trainer.checkpoint_path  # --checkpoint's, or a resumed run's own
            if path is not None and interrupted:  # a lost scheduler's error names it
                step = trainer.checkpointed_step_
                print(f"no checkpoint written to {path}" if step is None else
                      f"the checkpoint in {path} is of step {step}", flush=True)
            raise
        print(_summary(history), flush=True)
        if args.output is not None:
            history.attrs.update(dataset=args.dataset, model=model_name)
            to_store(history, args.output)
            print(f"history written to {args.output}", flush=True)
    finally:
        if trainer is not None:
            trainer.close()
        if client is not None:
            client.close()
    return 0


def _new_run(
    args: argparse.Namespace, options: dict[str, Any], max_steps: int | None
) -> dict[str, Any]:
    """The trainer's arguments for a new run (the trainer checks their values)."""
    strategy = args.strategy or "selective-backprop"
    if "batch_size" in options:
        size = options["batch_size"]
        raise ValueError(
            f"--strategy-option batch_size={size} is the trainer's batch: a strategy's "
            "batch_size is the samples per worker per step, which --batch-size sets (and "
            f"the history records); give --batch-size {size}"
        )
    check_strategy_options(strategy, options)
    if args.checkpoint_every is not None and args.checkpoint is None:
        raise ValueError("--checkpoint-every needs --checkpoint PATH, the file to write")
    lr_schedule = args.lr_schedule or "constant"
    if lr_schedule == "constant" and args.schedule_steps is not None:
        raise ValueError("--schedule-steps is the length of a decaying --lr-schedule "
                         f"({', '.join(s for s in SCHEDULES if s != 'constant')}); give one")
    schedule_steps = args.schedule_steps or max_steps
    if lr_schedule != "constant" and schedule_steps is None:
        raise ValueError(f"--lr-schedule {lr_schedule} decays over --max-steps (or "
                         "--schedule-steps); give one")
    checkpoints = {}
    if args.checkpoint is not None:
        checkpoints = {"checkpoint_path": args.checkpoint,
                       "checkpoint_every": args.checkpoint_every or _DEFAULT_CHECKPOINT_EVERY}
    return dict(
        strategy=strategy, seed=0 if args.seed is None else args.seed,
        n_workers=args.workers, resources=args.resources, batch_size=args.batch_size,
        learning_rate=args.learning_rate, optimizer=args.optimizer,
        max_grad_norm=args.max_grad_norm,
        local_steps=1 if args.local_steps is None else args.local_steps,
        staleness=args.staleness, lr_schedule=lr_schedule,
        schedule_steps=None if lr_schedule == "constant" else schedule_steps,
        eval_every=args.eval_every, transport=args.transport,
        security=True if args.tls else None, **checkpoints, **options,
    )


#: What ``train --resume`` may be given: the data, the budget, the outputs and
#: where the run goes on; the rest of the run comes from its checkpoint.
_RESUMABLE = (
    "--dataset, --n-samples and --root (the run's data), --max-steps, --max-time, "
    "--target-accuracy, --output, --no-progress, --scheduler, --workers, --resources, "
    "--transport, --tls, --tls-*, --eval-every, --checkpoint, --checkpoint-every and "
    "--schedule-steps"
)


def _checkpointed(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpointed run was started with, by the ``train`` option that sets it."""
    params = state["trainer"]
    return {
        "--model": (state["model_spec"] or {}).get("name"),
        "--strategy": state["strategy"]["name"],
        "--seed": params["seed"],
        "--batch-size": params["batch_size"],
        "--learning-rate": params["learning_rate"],
        "--optimizer": params["optimizer"],
        "--max-grad-norm": params.get("max_grad_norm"),  # absent before the option: none
        "--local-steps": params["local_steps"],
        "--staleness": params["staleness"],
        "--lr-schedule": params["lr_schedule"],
    }


def _read_checkpoint(path: str) -> dict[str, Any]:
    """The checkpoint at ``path``; ``ValueError`` where the file is not one ``train`` wrote."""
    state = checkpoint.read(path)  # refuses a file without all --resume reads (LAYOUT)
    if state["model_spec"] is None:
        raise ValueError(
            f"the run in {path!r} trained a model of its own, not a built-in one: resume it "
            "from Python, with daskpri.Trainer.resume(path, model=...)"
        )
    return state


def _resumed_run(
    args: argparse.Namespace, options: dict[str, Any], max_steps: int | None,
    state: dict[str, Any],
) -> dict[str, Any]:
    """``Trainer.resume``'s overrides; what the checkpoint fixes may only be repeated."""
    given = []
    for flag, theirs in _checkpointed(state).items():
        ours = getattr(args, flag[2:].replace("-", "_"))
        if ours is not None and ours != theirs:
            given.append(f"{flag} {ours} (the run's: {theirs})")
    name, params = state["strategy"]["name"], state["strategy"]["params"]
    for key, value in options.items():
        if key not in params or params[key] != value:
            theirs = f"{key}={params[key]}" if key in params else f"{name} takes no {key}"
            given.append(f"--strategy-option {key}={value} (the run's: {theirs})")
    if given:
        raise ValueError(
            f"--resume continues the run in {args.resume!r} as it was started, but got "
            f"{'; '.join(given)}. With --resume, give only {_RESUMABLE}"
        )
    step = state["step"]
    if max_steps is not None and max_steps <= step:
        default = "" if args.max_steps is not None else f" (the default, {_DEFAULT_MAX_STEPS})"
        raise ValueError(
            f"--max-steps counts the run's steps from its start, and the run in "
            f"{args.resume!r} is at step {step} already, but got --max-steps {max_steps}"
            f"{default}: give more than {step} to go on"
        )
    overrides: dict[str, Any] = {}
    schedule, end = state["trainer"]["lr_schedule"], state["trainer"]["schedule_steps"]
    if args.schedule_steps is not None:
        if schedule == "constant":
            raise ValueError(f"--schedule-steps: the run in {args.resume!r} trains at a constant "
                             "learning rate, which has no schedule to stretch")
        end = overrides["schedule_steps"] = args.schedule_steps
    if schedule != "constant" and end is not None and max_steps is not None and max_steps > end:
        default = "" if args.max_steps is not None else " (the default)"
        raise ValueError(
            f"--max-steps {max_steps}{default} goes past the end of the run's {schedule} "
            "learning-rate "
            f"schedule at step {end}, after which it would train at learning rate 0: give "
            f"--max-steps {end} or less, or --schedule-steps {max_steps} to stretch the "
            "schedule to the new end"
        )
    if args.checkpoint is not None:
        every = state["trainer"]["checkpoint_every"] or _DEFAULT_CHECKPOINT_EVERY
        overrides.update(checkpoint_path=args.checkpoint,
                         checkpoint_every=args.checkpoint_every or every)
    elif args.checkpoint_every is not None:
        if state["trainer"]["checkpoint_path"] is None:
            raise ValueError(
                f"--checkpoint-every needs --checkpoint PATH, the file to write: the run in "
                f"{args.resume!r} was saved by hand and writes no checkpoints of its own"
            )
        overrides["checkpoint_every"] = args.checkpoint_every  # to the run's own file
    # where the run goes on may change
    for key, value in (("n_workers", args.workers), ("resources", args.resources),
                       ("transport", args.transport), ("eval_every", args.eval_every),
                       ("security", True if args.tls else None)):
        if value is not None:
            overrides[key] = value
    return overrides


def _check_resumed_data(args: argparse.Namespace, state: dict[str, Any],
                        train: xr.Dataset) -> None:
    """Refuse data other than the resumed run's, before the cluster starts.

    The checkpoint holds what the run trained on: its model's sample shape
    and classes, and its table's sample count.
    """
    from daskpri.models import _shape_and_classes

    spec = state["model_spec"]
    theirs = (tuple(spec["in_shape"]), int(spec["n_classes"]),
              int(np.asarray(state["table"]["table"]["offsets"])[-1]))
    shape, n_classes = _shape_and_classes(train)
    ours = (tuple(shape), int(n_classes), int(train.sizes["sample"]))
    if ours != theirs:
        def said(shape: tuple[int, ...], classes: int, n: int) -> str:
            return f"{n} samples of shape {shape} in {classes} classes"

        given = f"--dataset {args.dataset}" + (
            f" --n-samples {args.n_samples}" if args.n_samples is not None else "")
        raise ValueError(
            f"--resume: the run in {args.resume!r} trained on {said(*theirs)}, but {given} "
            f"gives {said(*ours)}; give the --dataset and --n-samples the run was started with"
        )


def _write_interrupted(
    trainer: daskpri.Trainer, path: str, dataset: str, model: str, why: str = "interrupted"
) -> None:
    """Write the history of a fit that ended early (``why``) to ``path``, and say so."""
    history = trainer.history_
    if history.sizes["step"] == 0:
        print(f"{why} before the first step: no history to write", flush=True)
        return
    history.attrs.update(dataset=dataset, model=model)
    try:
        to_store(history, path)
    except Exception as e:  # the interrupt goes on; its history is what is lost
        print(f"{_PROG}: could not write the history to {path}: {e}", file=sys.stderr)
        return
    print(f"{why} at step {trainer.step_}: the history so far written to {path}", flush=True)


def _check_destination(flag: str, path: str, *, kind: str = "file") -> None:
    """Refuse ``path`` (a ``"file"``, ``"store"`` or ``"directory"``) before the work it is for.

    Its directories may be missing (they are made), but those that exist
    should be directories.
    """
    target = os.path.abspath(path)
    if kind == "store":
        check_destination(target, name=flag)
    elif kind == "file" and os.path.isdir(target):
        raise ValueError(
            f"{flag} should be a file's path, but got {flag} {path!r}, which is a directory"
        )
    elif kind == "directory" and os.path.lexists(target) and not os.path.isdir(target):
        raise ValueError(
            f"{flag} should be a directory, but got {flag} {path!r}, which is a file"
        )
    parent = os.path.dirname(target)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(
            f"{flag} should be a path under directories, but got {flag} {path!r}, "
            f"and {parent!r} is a file"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"{flag} should be a path this process may write, but got {flag} {path!r}, "
            f"and {parent!r} is not writable"
        )


@contextlib.contextmanager
def _interruptible(trainer: daskpri.Trainer) -> Iterator[None]:
    """Ctrl-C ends ``trainer``'s fit after its step in flight; a second Ctrl-C at once.

    The first interrupt asks the trainer to stop: the fit ends as at the
    end of its budget (it evaluates, writes its checkpoint at the step it
    ended on, and returns), and ``KeyboardInterrupt`` is raised then. Raised
    at once instead, it would land in whatever the main thread runs: in the
    middle of a step, whose checkpoint could not be written, or in a
    finalizer or a callback, where Python prints and drops it. The second
    interrupt, for a step that does not end, raises at once.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield  # signals go to the main thread; an ignored SIGINT stays ignored
        return
    interrupted = False  # no lock: the handler may run inside anything, itself included

    def handler(signum: int, frame: Any) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            trainer.stop()
            print(f"{_PROG}: stopping after the step in flight (Ctrl-C again to stop at once)",
                  file=sys.stderr, flush=True)
            return
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
    options = _strategy_options(args.strategy_option)
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
    if not args.out.strip():  # an unset shell variable, more likely than the current directory
        raise ValueError("--out should name a directory, but got an empty path; give --out . "
                         "for the current directory")
    _check_destination("--out", args.out, kind="directory")
    earlier = os.path.join(args.out, RESULTS_JSON)
    if args.report_only and args.resume:
        raise ValueError("--report-only makes no runs, and --resume makes the rest: pass one")
    if args.merge is not None and (args.report_only or args.resume):
        raise ValueError("--merge writes a new report in --out from the benchmarks it names: "
                         "pass it without --resume and --report-only")
    if not args.resume and not args.report_only and os.path.exists(earlier):
        # its runs may be hours of measurement: replaced only when asked to
        raise ValueError(
            f"--out {args.out!r} holds the results of an earlier benchmark ({earlier}); "
            + ("give --merge another --out (or remove that file)" if args.merge is not None else
               "pass --resume to go on with it, or give another --out (or remove that file) to "
               "start afresh")
        )
    report = [f for f in ("results.md", "results.html")
              if os.path.exists(os.path.join(args.out, f))]
    if not args.resume and not args.report_only and report:
        # a report without its results.json: written over, it could not be made again
        raise ValueError(
            f"--out {args.out!r} holds a benchmark's report ({', '.join(report)}) without its "
            f"{RESULTS_JSON}; give another --out (or remove those files)"
        )
    return bench_command.run(args)


def _strategies(args: argparse.Namespace) -> int:
    width = max(len(name) for name in STRATEGIES) + 2
    for name in STRATEGIES:
        print(f"{name:<{width}}{get_strategy(name)!r}")
    return 0


# -- helpers ---------------------------------------------------------------------


def _dashboard_command(args: argparse.Namespace) -> int:
    from daskpri.dashboard.remote import ROUTE, make_server

    if not 0 <= args.port < 65536:
        raise ValueError(f"port should be in [0, 65536), but got port={args.port}")
    try:
        server = make_server(args.scheduler, address=args.address, port=args.port)
    except OSError as e:
        if e.errno not in (errno.EADDRINUSE, errno.EACCES):  # taken, or privileged
            raise
        where = _config.get("dashboard.address", args.address)
        raise ValueError(
            f"--port {args.port} cannot be listened on at {where}: {e.strerror}; give "
            "another --port, or --port 0 for any free one"
        ) from None
    server.start()
    print(f"daskpri dashboard: http://{server.address}:{server.port}{ROUTE}", flush=True)
    try:
        server.io_loop.start()
    finally:
        server.stop()
    return 0


def _report(args: argparse.Namespace) -> int:
    from daskpri.dashboard.report import write_report

    _check_destination("--output", args.output)
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
