"""The command line's argparse parser: its subcommands and their arguments.

It imports none of the commands, nor torch, xarray or distributed: each
command's module is imported as it runs (:func:`_later`), so that ``daskpri
--help`` and an argument refused are answered at once.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from daskpri._choices import DATASETS, LEARNING_RATES, MODELS, MONITORS, PRECISIONS
from daskpri.bench import command as bench_command
from daskpri.cli._argtypes import (
    _accuracy,
    _count,
    _decay,
    _delta,
    _device,
    _host,
    _momentum,
    _norm,
    _output_path,
    _resources,
    _seconds,
    _seed,
    _smoothing,
    _strategy_option,
)
from daskpri.cli._prog import _DEFAULT_CHECKPOINT_EVERY, _DEFAULT_MAX_STEPS, _DEMO_STRATEGY, _PROG
from daskpri.cli._tls import add_tls_arguments
from daskpri.strategies import STRATEGIES
from daskpri.table.staleness import STALENESS_MODELS
from daskpri.training.schedule import SCHEDULES

_TRACEBACK_HELP = "on an error, show Python's full traceback, not one line (for a bug report)"


def _later(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command ``name`` of ``module``, imported when it runs rather than when parsing.

    Examples
    --------
    >>> run = _later("daskpri.cli.strategies", "_strategies")
    >>> run.__qualname__
    'daskpri.cli.strategies._strategies'
    """

    def run(args: argparse.Namespace) -> int:
        command: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(module), name)
        return command(args)

    run.__qualname__ = f"{module}.{name}"
    return run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Prioritized data-parallel SGD for PyTorch on Dask clusters."
    )
    parser.add_argument("--traceback", action="store_true", help=_TRACEBACK_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train a model and report its history")
    train.set_defaults(run=_later("daskpri.cli.train", "_train"))
    data = train.add_argument_group("data and model")
    data.add_argument("--dataset", choices=DATASETS,
                      help="a built-in dataset (default mnist1d; mnist and cifar10 read --root)")
    data.add_argument("--data", metavar="PATH",
                      help="train on your own data instead: a zarr store or netCDF file with "
                      "features x and integer labels y along a dimension 'sample'")
    data.add_argument("--eval-data", metavar="PATH",
                      help="with --data, the held-out data to evaluate on (same layout)")
    data.add_argument("--eval-chunked", action="store_true",
                      help="score the held-out data on the cluster, a task per chunk on each "
                      "worker's device, not whole on this machine (a store is read by the "
                      "workers, by its path)")
    # None defaults, here and below: with --resume, an option given is told from one left out
    data.add_argument("--model", choices=MODELS, help="default mlp")
    data.add_argument("--n-samples", type=_count(1), metavar="N",
                      help="samples of the dataset, train and test together")
    data.add_argument("--root", metavar="DIR", help="directory of the mnist or cifar10 files")
    data.add_argument("--seed", type=_seed,
                      help="seeds data, weights and selections (default 0)")
    run = train.add_argument_group("training")
    run.add_argument("--strategy", choices=list(STRATEGIES), help="default selective-backprop")
    run.add_argument("--strategy-option", type=_strategy_option, action="append", default=[],
                     metavar="KEY=VALUE", help="a strategy parameter, e.g. k=32 (repeatable)")
    run.add_argument("--max-steps", type=_count(1), metavar="N",
                     help=f"total steps (default {_DEFAULT_MAX_STEPS} unless --max-time is given)")
    run.add_argument("--max-time", type=_seconds, metavar="S", help="seconds of training")
    run.add_argument("--target-accuracy", type=_accuracy, metavar="A",
                     help="stop once the test accuracy reaches A, in (0, 1]")
    run.add_argument("--patience", type=_count(1), metavar="N",
                     help="stop once the test accuracy (or --monitor) has not improved for N "
                          "evaluations in a row (early stopping)")
    run.add_argument("--monitor", choices=tuple(MONITORS),
                     help="with --patience, the test figure watched (default accuracy)")
    run.add_argument("--min-delta", type=_delta, metavar="D",
                     help="with --patience, the least gain that counts as an improvement "
                          "(default 0)")
    run.add_argument("--restore-best", action="store_true",
                     help="with --patience, end with the weights of the best evaluation (as "
                          "the --checkpoint written at the end holds them)")
    run.add_argument("--batch-size", type=_count(1), metavar="N",
                     help="samples per worker per step")
    run.add_argument("--local-steps", type=_count(1), metavar="K",
                     help="optimizer steps each worker takes per round trip (local SGD; "
                     "default 1: synchronous)")
    run.add_argument("--staleness", choices=STALENESS_MODELS,
                     help="how the priority table estimates priorities not recomputed "
                          "lately (default: daskpri.table.staleness, keep)")
    own_rates = ", ".join(f"{rate:g} for {name}" for name, rate in LEARNING_RATES.items())
    run.add_argument("--learning-rate", type=_norm, metavar="LR",
                     help="the optimizer's learning rate (default: daskpri.trainer.learning-rate, "
                          f"null: {own_rates})")
    run.add_argument("--optimizer", choices=tuple(LEARNING_RATES),
                     help="the driver's optimizer (default: daskpri.trainer.optimizer, sgd; "
                          "adamw: Adam with decoupled weight decay)")
    run.add_argument("--momentum", type=_momentum, metavar="M",
                     help="SGD's momentum, in [0, 1) (default: daskpri.trainer.momentum, 0.9)")
    run.add_argument("--weight-decay", type=_decay, metavar="WD",
                     help="the optimizer's weight decay (default: 0.01 for adamw, torch's, "
                          "else 0)")
    run.add_argument("--max-grad-norm", type=_norm, metavar="NORM",
                     help="clip each optimizer step's gradient to this L2 norm (default: "
                          "daskpri.trainer.max-grad-norm, null: no clipping)")
    run.add_argument("--label-smoothing", type=_smoothing, metavar="EPS",
                     help="label smoothing of the training loss, in [0, 1) (default: "
                          "daskpri.trainer.label-smoothing, 0: none); the losses ranked and "
                          "recorded stay the plain cross-entropy")
    run.add_argument("--precision", choices=PRECISIONS,
                     help="the workers' training passes: float32, or bfloat16 under "
                          "torch.autocast, for GPUs from Ampere on and CPUs with AMX or "
                          "AVX512-BF16 (default: daskpri.trainer.precision, float32)")
    run.add_argument("--eval-every", type=_count(1), metavar="N",
                     help="steps between evaluations")
    run.add_argument("--lr-schedule", choices=SCHEDULES,
                     help="learning rate: constant (the default), or decaying to zero over "
                     "--max-steps (or --schedule-steps)")
    run.add_argument("--warmup-steps", type=_count(0), metavar="N",
                     help="steps over which the learning rate first rises linearly to "
                          "--learning-rate, before --lr-schedule (default 0: none)")
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
                      "--n-samples, or --data; its model, strategy, seed and optimization come "
                      "from the checkpoint); --max-steps counts from the run's start")
    cluster = train.add_argument_group("cluster")
    cluster.add_argument("--device", type=_device, metavar="DEVICE",
                         help="the device every worker trains on, e.g. cpu or cuda:1 (default: "
                              "a worker's GPU where its GPU resource names one, else its CPU)")
    cluster.add_argument("--scheduler", metavar="ADDRESS",
                         help="a running scheduler, e.g. tcp://HOST:8786 (default: a LocalCluster)")
    cluster.add_argument("--workers", type=_count(1), metavar="N",
                         help="LocalCluster workers (2), or the scheduler's workers to use (all)")
    cluster.add_argument("--resources", type=_resources, metavar="NAME=AMOUNT[,...]",
                         help="resources each training task needs, e.g. GPU=1")
    cluster.add_argument("--transport", choices=("direct", "tasks"),
                         help="steps as RPCs to the workers (direct, default) or as Dask tasks")
    tls = train.add_argument_group("TLS (with --scheduler; the LocalCluster's is --tls)")
    add_tls_arguments(tls)
    tls.add_argument("--tls", action="store_true",
                     help="start the LocalCluster with TLS (temporary credentials)")
    out = train.add_argument_group("output")
    out.add_argument("--output", type=_output_path, metavar="PATH",
                     help="write the history to PATH (.nc for netCDF, .zarr for zarr)")
    out.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    demo = sub.add_parser(
        "demo", help=f"{_DEMO_STRATEGY} against uniform sampling for the same time budget"
    )
    demo.set_defaults(run=_later("daskpri.cli.demo", "_demo"))
    demo.add_argument("--workers", type=_count(1), default=2, metavar="N",
                      help="LocalCluster workers (default 2)")
    demo.add_argument("--max-time", type=_seconds, default=45.0, metavar="S",
                      help="seconds of training for each run (default 45)")
    demo.add_argument("--dataset", choices=DATASETS, default="mnist1d",
                      help="the data (default mnist1d; mnist and cifar10 read --root)")
    demo.add_argument("--model", choices=MODELS, default="mlp", help="default mlp")
    demo.add_argument("--root", metavar="DIR", help="directory of the mnist or cifar10 files")
    demo.add_argument("--seed", type=_seed, default=0,
                      help="seeds data, weights and selections of both runs (default 0)")
    demo.add_argument("--local-steps", type=_count(1), default=1, metavar="K",
                      help="optimizer steps each worker takes per round trip, for both runs "
                      "(default 1: synchronous)")
    demo.add_argument("--strategy-option", type=_strategy_option, action="append", default=[],
                      metavar="KEY=VALUE",
                      help=f"a {_DEMO_STRATEGY} parameter, e.g. fraction=0.25 (repeatable)")

    dash = sub.add_parser("dashboard", help="serve the live /daskpri page of a scheduler")
    dash.set_defaults(run=_later("daskpri.cli.dashboard", "_dashboard_command"))
    dash.add_argument("--scheduler", required=True, metavar="ADDRESS",
                      help="the scheduler whose runs to show, e.g. tcp://127.0.0.1:8786")
    dash.add_argument("--port", type=int, default=5006,
                      help="port to listen on (default 5006; 0: any free)")
    dash.add_argument("--address", type=_host, metavar="HOST",
                      help="interface to listen on (default 127.0.0.1; 0.0.0.0 opens it to "
                           "the network)")
    add_tls_arguments(dash.add_argument_group("TLS (with a tls:// --scheduler)"))

    report = sub.add_parser("report", help="a static HTML report of a run's history")
    report.set_defaults(run=_later("daskpri.cli.report", "_report"))
    report.add_argument("history", help="history from `daskpri train --output` (.nc or .zarr)")
    report.add_argument("-o", "--output", required=True, metavar="HTML",
                        help="the page to write, e.g. report.html (a self-contained HTML file; "
                             "an earlier report there is replaced, any other file refused)")
    report.add_argument("--baseline", metavar="PATH", help="another run's history to compare with")
    report.add_argument("--title", help="the page's title (default: names the run's strategy)")

    evaluate = sub.add_parser(
        "evaluate", help="a checkpoint's model: its accuracy and loss on held-out data")
    evaluate.set_defaults(run=_later("daskpri.cli.evaluate", "_evaluate"))
    evaluate.add_argument("checkpoint", metavar="CHECKPOINT",
                          help="a checkpoint of `daskpri train --checkpoint` (read weights-only)")
    held_out = evaluate.add_argument_group(
        "data (default: the test split of mnist1d, as train's default)")
    held_out.add_argument("--dataset", choices=DATASETS,
                          help="a built-in dataset's test split, split by the run's seed as "
                               "train split it (give train's --n-samples and --root too)")
    held_out.add_argument("--n-samples", type=_count(1), metavar="N",
                          help="samples of the dataset, train and test together, as given to "
                               "train")
    held_out.add_argument("--root", metavar="DIR", help="directory of the mnist or cifar10 files")
    held_out.add_argument("--data", metavar="PATH",
                          help="held-out data of your own instead: a zarr store or netCDF file "
                               "with x and y along 'sample', as train's --eval-data")
    evaluate.add_argument("--batch-size", type=_count(1), metavar="N",
                          help="samples per forward pass (default 256 on a CPU, 4096 on a GPU)")
    evaluate.add_argument("--device", type=_device, metavar="DEVICE",
                          help="a torch device to run the model on, e.g. cpu or cuda:1 "
                               "(default: here, this machine's GPU where it has one; with "
                               "--scheduler, each worker's GPU where its GPU resource names "
                               "one; else the CPU)")
    evaluate.add_argument("--json", action="store_true",
                          help="print one JSON object (checkpoint, step, strategy, data, "
                               "accuracy, loss, samples) rather than a line of text")
    evaluate.add_argument("--scheduler", metavar="ADDRESS",
                          help="score a task per chunk of samples on a running cluster's "
                               "workers, which read --data (default: here, whole)")
    add_tls_arguments(evaluate.add_argument_group("TLS (with a tls:// --scheduler)"))

    predict = sub.add_parser(
        "predict", help="a checkpoint's model: its logits and predicted classes on data")
    predict.set_defaults(run=_later("daskpri.cli.evaluate", "_predict"))
    predict.add_argument("checkpoint", metavar="CHECKPOINT",
                         help="a checkpoint of `daskpri train --checkpoint` (read weights-only)")
    predict.add_argument("--data", required=True, metavar="PATH",
                         help="a zarr store or netCDF file with x along 'sample' (labels y, if "
                              "any, are not read)")
    predict.add_argument("--output", required=True, type=_output_path, metavar="PATH",
                         help="where to write logits (sample, class) and predicted (sample): "
                              ".zarr or .nc, a path where nothing is yet")
    predict.add_argument("--batch-size", type=_count(1), metavar="N",
                         help="samples per forward pass (default 256 on a CPU, 4096 on a GPU)")
    predict.add_argument("--device", type=_device, metavar="DEVICE",
                         help="a torch device to run the model on, e.g. cpu or cuda:1 "
                              "(default: each worker's GPU where its GPU resource names one, "
                              "or this machine's without --scheduler; else the CPU)")
    predict.add_argument("--scheduler", metavar="ADDRESS",
                         help="compute on a running cluster's workers, which read --data "
                              "(default: this process's threads)")
    predict.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_tls_arguments(predict.add_argument_group("TLS (with a tls:// --scheduler)"))

    strategies = sub.add_parser("strategies", help="list the strategies and their defaults")
    strategies.set_defaults(run=_later("daskpri.cli.strategies", "_strategies"))

    bench = sub.add_parser(
        "bench", help="the strategies against uniform, scaling and overhead, side by side"
    )
    bench_command.add_arguments(bench)
    bench.set_defaults(run=_later("daskpri.cli.bench", "_bench"))
    for command in sub.choices.values():
        # also after the command, where it is as likely typed; SUPPRESS: left out there, it
        # leaves the value given before the command as it is
        command.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                             help=_TRACEBACK_HELP)
    return parser
