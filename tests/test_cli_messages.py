"""The command line's errors name what the user typed: the flag, its syntax, what to do.

Parser errors need no cluster; one test starts a LocalCluster of one
in-process worker, to see the advice for too few workers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import dask
import pytest
from distributed import Client, LocalCluster

import daskpri
from daskpri.bench.config import BenchConfig, StrategyOptionError
from daskpri.cli import main
from daskpri.cli._arguments import _parser
from daskpri.training.placement import too_few_workers


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


# -- bench --strategy-option, in its own syntax ------------------------------------


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("foo:k=1", "--strategy-option foo:k=1 names strategy 'foo', which is no strategy of "
                    "daskpri (uniform, projection, "),
        ("projection:k=3", "--strategy-option projection:k=3 names strategy 'projection', which "
                           "is not among the strategies compared (uniform, selective-backprop, "
                           "loss): add it to --strategies, or name one of those"),
        ("selective-backprop@rnn:fraction=0.3",
         "--strategy-option selective-backprop@rnn:fraction=0.3 names model 'rnn' after @, "
         "which is not among the models compared (mlp): name one of those, or add rnn to "
         "--models"),
        ("selective-backprop+stale:fraction=0.3",
         "--strategy-option selective-backprop+stale:fraction=0.3 names strategy "
         "'selective-backprop+stale', an arm of selective-backprop that is not among the "
         "strategies compared (uniform, selective-backprop, loss): list "
         "selective-backprop+stale in --strategies too"),
    ],
)
def test_bench_strategy_option_error_speaks_its_syntax(
    option: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--quick", "--out", str(tmp_path / "out"),
                 "--strategy-option", option]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"daskpri: error: {message}")
    assert "(" not in err.split("--strategy-option ")[1].split(" ")[0]  # no tuple
    assert not (tmp_path / "out").exists()


def test_bench_config_strategy_option_error_names_the_entry_as_given() -> None:
    with pytest.raises(StrategyOptionError) as info:
        BenchConfig(models=("mlp",), strategies=("loss",),
                    strategy_options=(("loss", "epsilon", 0.1, "cnn"),))
    assert str(info.value) == (
        "strategy_options entry ('loss', 'epsilon', 0.1, 'cnn') names model 'cnn' in its fourth "
        "place, which is not among the models compared (mlp): name one of those, or add cnn to "
        "models="
    )
    assert info.value.as_flags().startswith("--strategy-option loss@cnn:epsilon=0.1 names model")


def test_bench_config_refuses_an_entry_that_is_no_tuple() -> None:
    with pytest.raises(ValueError, match=r"strategy_options should hold \(strategy, key, "
                       r"value\[, model\]\) tuples, .* but got 'loss'"):
        BenchConfig(strategies=("loss",), strategy_options=("loss",))


# -- numbers checked by the parser, naming the flag -----------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--batch-size", "0"], "argument --batch-size: should be a positive integer, "
                                         "but got '0'"),
        (["train", "--workers", "0"], "argument --workers: should be a positive integer"),
        (["train", "--local-steps", "-2"], "argument --local-steps: should be a positive integer"),
        (["train", "--eval-every", "0"], "argument --eval-every: should be a positive integer"),
        (["train", "--n-samples", "0"], "argument --n-samples: should be a positive integer"),
        (["train", "--max-steps", "0"], "argument --max-steps: should be a positive integer, "
                                        "but got '0'"),
        (["train", "--learning-rate", "0"], "argument --learning-rate: should be a positive "
                                            "finite number, but got '0'"),
        (["train", "--seed", "-1"], "argument --seed: should be an integer in [0, 4294967295], "
                                    "but got '-1'"),
        (["train", "--patience", "0"], "argument --patience: should be a positive integer"),
        (["train", "--warmup-steps", "-1"], "argument --warmup-steps: should be a non-negative "
                                            "integer"),
        (["train", "--momentum", "1"], "argument --momentum: should be a number in [0, 1), "
                                       "but got '1'"),
        (["train", "--device", "gpu"], "argument --device: should name a torch device like "
                                       "cpu, cuda or cuda:1, but got 'gpu'"),
        (["train", "--patience", "2", "--min-delta", "-1"],
         "argument --min-delta: should be a finite number of 0 or more, but got '-1'"),
        (["train", "--patience", "2", "--monitor", "val_loss"],
         "argument --monitor: invalid choice: 'val_loss'"),
        (["demo", "--workers", "0"], "argument --workers: should be a positive integer"),
        (["demo", "--local-steps", "0"], "argument --local-steps: should be a positive integer"),
        (["demo", "--seed", "x"], "argument --seed: should be an integer in [0, 4294967295]"),
        (["dashboard", "--scheduler", "tcp://127.0.0.1:1", "--address", "999.1.1.1"],
         "argument --address: '999.1.1.1' is no address or name this machine resolves"),
        (["predict", "run.ckpt", "--data", "a.zarr", "--output", "b.zarr", "--device", "gpu"],
         "argument --device: should name a torch device like cpu, cuda or cuda:1, but got "
         "'gpu'"),
        (["evaluate", "run.ckpt", "--device", "cuda:x"],
         "argument --device: should name a torch device like cpu, cuda or cuda:1, but got "
         "'cuda:x'"),
        (["evaluate", "run.ckpt", "--device", "meta"],
         "argument --device: should name a torch device like cpu, cuda or cuda:1, but got "
         "'meta'"),
    ],
)
def test_bad_number_is_refused_by_the_parser_naming_its_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert f"daskpri {argv[0]}: error: {message}" in capsys.readouterr().err


def test_fit_refuses_max_steps_zero_before_a_cluster_starts() -> None:
    train, _ = daskpri.datasets.load("synthetic", n_samples=200)
    trainer = daskpri.Trainer(daskpri.models.build_model("mlp", train))
    with pytest.raises(ValueError, match=r"^max_steps should be a positive integer, the "
                       r"trainer's total steps .* but got max_steps=0$"):
        trainer.fit(train, max_steps=0, progress=False)
    assert trainer._own_cluster is None


# -- report's output, by its flag -----------------------------------------------------


def test_report_output_that_is_the_history_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run.nc"
    run.write_bytes(b"a history")
    assert main(["report", str(run), "-o", str(run)]) == 2
    assert capsys.readouterr().err.startswith(
        f"daskpri: error: -o/--output {str(run)!r} is the history itself")
    assert run.read_bytes() == b"a history"


# -- --traceback after the command, and help for every flag ------------------------------


@pytest.mark.parametrize("before", [True, False])
def test_traceback_is_taken_before_or_after_the_command(before: bool) -> None:
    bad = ["--strategy-option", "k=3", "--strategy-option", "k=4"]
    argv = ["--traceback", "train", *bad] if before else ["train", *bad, "--traceback"]
    with pytest.raises(ValueError, match="--strategy-option k should be given once"):
        main(argv)


def test_traceback_is_off_unless_given() -> None:
    assert _parser().parse_args(["strategies"]).traceback is False


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_flag_has_help(command: str) -> None:
    bare = [a.option_strings or a.dest for a in _subcommands()[command]._actions if not a.help]
    assert not bare


# -- too few workers: what to do ---------------------------------------------------------


def test_too_few_workers_says_to_start_more_or_ask_for_fewer(small_data) -> None:
    train, _ = small_data
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                     dashboard_address=":0") as cluster,
        Client(cluster) as client,
        daskpri.Trainer(daskpri.models.build_model("mlp", train), client=client,
                        n_workers=3) as trainer,
        # workers that join meanwhile would do: the fit waits this long for them
        dask.config.set({"daskpri.trainer.no-workers-timeout": "0.2s"}),
    ):
        address = client.scheduler.address
        with pytest.raises(ValueError) as info:
            trainer.fit(train, max_steps=1, progress=False)
    assert str(info.value) == (
        f"n_workers=3, but the cluster at {address} has 1 worker: start 2 more (dask worker "
        f"{address}), or ask for at most 1 (n_workers=1; daskpri train --workers 1); waited "
        "0.2 s for 3 workers (daskpri.trainer.no-workers-timeout)"
    )


def test_too_few_workers_with_resources_names_them() -> None:
    said = too_few_workers(3, 1, 4, "tcp://h:8786", {"GPU": 1.0})
    assert said == (
        "n_workers=3 with resources={'GPU': 1.0}, but 1 of the 4 workers of the cluster at "
        "tcp://h:8786 has them: start 2 more with them (dask worker tcp://h:8786 --resources "
        "GPU=1), or ask for at most 1 (n_workers=1; daskpri train --workers 1), or ask for "
        "other resources"
    )


def test_a_batch_over_a_workers_share_is_refused_before_the_local_cluster_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["train", "--dataset", "synthetic", "--n-samples", "100", "--workers", "2",
            "--max-steps", "5", "--no-progress"]
    assert main(argv) == 2  # the default batch, 64, over 40 a worker (80 samples train)
    said = capsys.readouterr()
    assert said.err == (
        "daskpri: error: --batch-size 64 is more than a worker's share of the data (40 samples: "
        "80 on 2 workers), and each worker trains a batch a step from its own share; give "
        "--batch-size 40 or less, fewer --workers, or more --n-samples\n")
    assert "dashboard:" not in said.out  # no cluster was started
    assert main([*argv, "--batch-size", "40"]) == 0


@pytest.mark.parametrize("address", ["foo://127.0.0.1:8786", "tcp://127.0.0.1", "tcp://host:port"])
def test_a_scheduler_address_that_is_none_is_bad_input(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # exit 2, as for dashboard --scheduler: not an unreachable scheduler's 1
    assert main(["train", "--scheduler", address, "--dataset", "synthetic", "--n-samples",
                 "200", "--max-steps", "1"]) == 2
    assert capsys.readouterr().err.startswith(
        "daskpri: error: the scheduler's address should be one such as tcp://127.0.0.1:8786, "
        f"but got {address!r} (")
