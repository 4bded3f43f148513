"""``daskpri bench``'s configuration: bad values refused, early and by name.

BenchConfig's validation, the evaluation grid, and the command's checks of
its input and of the cluster before any run starts.
"""

from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest

from daskpri.bench import BenchConfig
from daskpri.cli import main


def test_config_names_the_bad_value():
    with pytest.raises(ValueError, match="strategies should be among .* but got 'nope'"):
        BenchConfig(strategies=("nope",))
    with pytest.raises(ValueError, match="budget should be a positive finite number"):
        BenchConfig(budget=-1.0)
    with pytest.raises(ValueError, match="max_grad_norm should be a positive finite number, "
                       "but got max_grad_norm=0.0"):
        BenchConfig(max_grad_norm=0.0)
    with pytest.raises(ValueError, match=r"label_smoothing should be a number in \[0, 1\), "
                       r"but got label_smoothing=1\.0"):
        BenchConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match="precision should be one of 'float32', 'bfloat16', "
                       "but got 'float16'"):
        BenchConfig(precision="float16")
    with pytest.raises(ValueError, match="staleness should be one of 'keep', 'exp-linear', "
                       "'exp-quadratic', but got 'linear'"):
        BenchConfig(staleness="linear")
    with pytest.raises(ValueError, match="pick should be one of 'time', 'final', but got "
                       "pick='fastest'"):
        BenchConfig(pick="fastest")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"strategies": ["uniform", "loss", "uniform"]},
         r"strategies should not repeat an item, but got 'uniform' twice in "
         r"strategies=\['uniform', 'loss', 'uniform'\]"),
        ({"strategies": ("loss", "loss+b", "loss")},
         r"strategies should not repeat an item, but got 'loss' twice in "
         r"strategies=\('loss', 'loss\+b', 'loss'\)"),
        ({"datasets": ("mnist1d", "mnist1d", "mnist1d")},
         r"datasets should not repeat an item, but got 'mnist1d' 3 times in "
         r"datasets=\('mnist1d', 'mnist1d', 'mnist1d'\)"),
        ({"models": ("mlp", "cnn", "mlp")},
         r"models should not repeat an item, but got 'mlp' twice in "
         r"models=\('mlp', 'cnn', 'mlp'\)"),
        ({"workers": (2, 1, 2)},
         r"workers should not repeat an item, but got 2 twice in workers=\(2, 1, 2\)"),
        ({"learning_rates": [0.1, 0.05, 0.10]},
         r"learning_rates should not repeat an item, but got 0.1 twice in "
         r"learning_rates=\[0.1, 0.05, 0.1\]"),
        ({"target_fractions": (0.99, 0.99)},
         r"target_fractions should not repeat an item, but got 0.99 twice in "
         r"target_fractions=\(0.99, 0.99\)"),
        ({"budget_fractions": (0.5, 1.0, 1)},
         r"budget_fractions should not repeat an item, but got 1.0 twice in "
         r"budget_fractions=\(0.5, 1.0, 1\)"),
    ],
)
def test_config_refuses_a_repeated_item(options: dict[str, object], match: str):
    with pytest.raises(ValueError, match=match):
        BenchConfig(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"datasets": ()}, r"datasets should be a non-empty sequence of names, but got "
                           r"datasets=\(\)"),
        ({"strategies": "uniform"}, r"strategies should be a non-empty sequence of names, "
                                    r"but got strategies='uniform'"),
        ({"workers": []}, r"workers should be a non-empty sequence of worker counts, but got "
                          r"workers=\[\]"),
        ({"workers": 2}, r"workers should be a non-empty sequence of worker counts, but got "
                         r"workers=2"),
        ({"learning_rates": ()}, r"learning_rates should be a non-empty sequence of numbers, "
                                 r"but got learning_rates=\(\)"),
        ({"target_fractions": ()}, r"target_fractions should be a non-empty sequence of "
                                   r"numbers in \(0, 1\], but got target_fractions=\(\)"),
        ({"budget_fractions": (0.5, 2.0)}, r"budget_fractions should be numbers in \(0, 1\], "
                                           r"but got 2.0 in budget_fractions=\(0.5, 2.0\)"),
    ],
)
def test_config_refuses_an_empty_list_or_a_bad_item(options: dict[str, object], match: str):
    with pytest.raises(ValueError, match=match):
        BenchConfig(**options)  # type: ignore[arg-type]


def test_config_keeps_each_item_once_as_given_and_orders_workers_and_rates():
    cfg = BenchConfig(models=["cnn", "mlp"], strategies=["loss", "uniform"],
                      workers=[2, 1], learning_rates=[0.2, 0.05])
    assert cfg.models == ("cnn", "mlp")
    assert cfg.strategies == ("loss", "uniform")
    assert cfg.workers == (1, 2) and cfg.main_workers == 2
    assert cfg.learning_rates == (0.05, 0.2)
    assert hash(cfg) == hash(BenchConfig(models=("cnn", "mlp"), strategies=("loss", "uniform"),
                                         workers=(1, 2), learning_rates=(0.05, 0.2)))


def test_default_evaluations_are_evenly_spaced_in_whole_rounds():
    from daskpri.training.rounds import crossed

    for k in (1, 2, 3, 5, 8, 13, 16, 24, 100, 512):
        every = BenchConfig(local_steps=k).eval_every
        assert every is not None
        ends = range(k, 300 * k + 1, k)  # a run evaluates at the end of a round
        evaluated = [end for end in ends if crossed(end - k, end, every)]
        assert len(set(np.diff(evaluated))) == 1, (k, every)  # no round left out of the pattern
        assert every % k == 0 and (abs(every - 20) <= k / 2 or every == k), (k, every)


def test_an_evaluation_grid_that_leaves_out_some_rounds_is_refused(tmp_path: Path, capsys):
    with pytest.raises(ValueError, match=r"eval_every should be at most local_steps=16 \(every "
                       r"round\) or a multiple of it \(16, 32, \.\.\.\), but got eval_every=20"):
        BenchConfig(local_steps=16, eval_every=20)
    assert BenchConfig(local_steps=16, eval_every=4).eval_every == 4  # every round
    assert BenchConfig(local_steps=16, eval_every=48).eval_every == 48
    assert BenchConfig(eval_every=7).eval_every == 7  # steps are rounds
    assert main(["bench", "--out", str(tmp_path), "--local-steps", "16", "--eval-every",
                 "20"]) == 2
    # the command line's error names the flags
    assert ("--eval-every should be at most --local-steps 16 (every round) or a multiple of it "
            "(16, 32, ...), but got --eval-every 20") in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_seeds_past_the_largest_a_trainer_takes_are_refused_before_any_run(tmp_path: Path,
                                                                          capsys):
    assert BenchConfig(first_seed=2**32 - 3, seeds=3).seed_range.stop == 2**32
    # the third seed's runs would have been refused by their Trainer, after the others'
    with pytest.raises(ValueError, match="but got first_seed=4294967294 and seeds=3"):
        BenchConfig(first_seed=2**32 - 2, seeds=3)
    assert main(["bench", "--out", str(tmp_path / "b"), "--first-seed", str(2**32 - 2),
                 "--seeds", "3"]) == 2
    assert ("--first-seed should leave every seed at most 4294967295 (the largest a Trainer "
            "takes), but got --first-seed 4294967294 and --seeds 3: the last seed would be "
            "4294967296") in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_bench_rejects_bad_input_before_any_cluster_starts(tmp_path: Path, capsys):
    assert main(["bench", "--out", str(tmp_path), "--models", "resnet"]) == 2
    assert "models should be among 'mlp', 'cnn', but got 'resnet'" in capsys.readouterr().err
    assert main(["bench", "--quick", "--out", ""]) == 2
    assert "--out should name a directory, but got an empty path" in capsys.readouterr().err
    # named by their flags
    assert main(["bench", "--out", str(tmp_path), "--baseline-budget", "-5"]) == 2
    assert ("--baseline-budget should be a positive finite number, but got --baseline-budget "
            "-5.0") in capsys.readouterr().err
    assert main(["bench", "--out", str(tmp_path), "--budget", "0"]) == 2
    assert "--budget should be a positive finite number, but got --budget 0.0" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--out", str(tmp_path), "--workers", "one"])


@pytest.mark.parametrize(("options", "error"), [
    (["--datasets", "mnist"], "--datasets mnist needs --root DIR, the directory of its files"),
    (["--root", "."], "--root is only read for --datasets mnist, cifar10, but the datasets are "
                      "mnist1d"),
    (["--datasets", "mnist1d,mnist", "--root", "/no/such/dir"],
     "--root '/no/such/dir' is not a directory"),
    (["--scheduler", "notanaddress"],
     "--scheduler 'notanaddress': missing port number in address 'notanaddress'; give the "
     "scheduler's address, e.g. tcp://127.0.0.1:8786"),
    (["--datasets", "synthetic", "--n-samples", "100"],
     "--n-samples: synthetic has 80 training samples, fewer than a batch of 64 on each of 2 "
     "workers (128); give a larger --n-samples, or a smaller --batch-size"),
    # the Trainer refused uniform@1008's batch at its first run, after uniform's
    (["--datasets", "synthetic", "--n-samples", "2000", "--strategies", "projection",
      "--strategy-option", "projection:k=1000"],
     "--strategies: arm projection (k=1000) on mlp computes 1008 gradients a step on each "
     "worker, the batch of its baseline uniform@1008, but a worker of 2 holds as few as 800 "
     "samples of synthetic; give its --strategy-option fewer, or a larger --n-samples"),
])
def test_bench_refuses_what_it_cannot_run_and_leaves_no_directory(
    tmp_path: Path, capsys, options: list[str], error: str
):
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--no-progress", "--out", str(out), *options]) == 2
    assert error in capsys.readouterr().err
    assert not out.exists()


def test_a_strategy_options_bad_value_is_named_as_it_was_given(capsys):
    # the strategy's own check names its parameter; the error says which --strategy-option
    for given in (["selective-backprop:fraction=2"],
                  ["selective-backprop:fraction=0.5", "selective-backprop@mlp:fraction=2"]):
        option = given[-1]  # the mlp runs' own takes over the one of every model
        assert main(["bench", "--out", "x", "--strategies", "selective-backprop",
                     *(a for o in given for a in ("--strategy-option", o))]) == 2
        assert (f"daskpri: error: --strategy-option {option}: fraction should be a number in "
                "(0, 1], but got fraction=2\n") == capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^strategy_options entry \('loss', 'epsilon', 2\): "
                       r"epsilon should be"):
        BenchConfig(strategies=("loss",), strategy_options=(("loss", "epsilon", 2),))


def test_bench_keeps_a_report_it_could_not_make_again(tmp_path: Path, capsys):
    (tmp_path / "results.md").write_text("# an earlier report\n")
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 2
    assert (f"--out {str(tmp_path)!r} holds a benchmark's report (results.md) without its "
            "results.json") in capsys.readouterr().err
    assert (tmp_path / "results.md").read_text() == "# an earlier report\n"
    # --report-only takes the options from results.json: others would be ignored, so refused
    assert main(["bench", "--out", str(tmp_path), "--report-only", "--budget", "5"]) == 2
    assert "with --report-only, give only --out" in capsys.readouterr().err


def test_the_command_in_the_report_gives_the_learning_rates_as_typed():
    from daskpri.bench.command import _command_line
    from daskpri.cli._arguments import _parser

    args = _parser().parse_args(["bench", "--out", "o", "--learning-rates", "0.1234567,0.3",
                                 "--first-seed", "0", "--workers", "1,2"])
    command = _command_line(args)
    assert "--first-seed 0 " in command  # a zero is given, not left out
    assert "--learning-rates 0.1234567,0.3 --workers 1,2" in command


def _write_mnist(root: Path, n_train: int, n_test: int) -> None:
    """MNIST's four IDX files, of random images."""
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        (root / f"{prefix}-images-idx3-ubyte").write_bytes(
            bytes([0, 0, 8, 3]) + np.array([n, 28, 28], ">u4").tobytes() + images.tobytes())
        (root / f"{prefix}-labels-idx1-ubyte").write_bytes(
            bytes([0, 0, 8, 1]) + np.array([n], ">u4").tobytes() + labels.tobytes())


def test_bench_on_a_scheduler_checks_its_workers_for_every_run_before_the_first(
    tmp_path: Path, capsys
):
    from distributed import LocalCluster

    _write_mnist(tmp_path, 200, 20)
    out = tmp_path / "bench"
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                     host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster,
        # (a worker that joins meanwhile would do: the benchmark waits this long for one)
        dask.config.set({"daskpri.trainer.no-workers-timeout": "0.2s"}),
    ):
        # one worker is all --workers 1 asks for, but DDP's overhead runs pair two processes
        # with two: refused before any run, and nothing left in --out; the data came from
        # --root (mnist needs it)
        assert main(["bench", "--quick", "--no-progress", "--workers", "1", "--datasets", "mnist",
                     "--root", str(tmp_path), "--scheduler", cluster.scheduler_address,
                     "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert ("the benchmark needs 2 workers (DDP's overhead runs pair 2 processes with 2 "
            f"workers), but the scheduler at {cluster.scheduler_address} has 1; start more or "
            "pass --workers up to 1 and --no-ddp; waited 0.2 s for 2 worker(s)") in err
    assert not out.exists()


def test_bench_takes_the_precision_of_every_run_from_its_flag_or_the_config():
    from daskpri.bench.command import config_from_args
    from daskpri.cli._arguments import _parser

    def config(*flags):
        return config_from_args(_parser().parse_args(["bench", "--quick", "--out", "o", *flags]))

    assert config().precision == "float32"
    assert config("--precision", "bfloat16").precision == "bfloat16"
    with dask.config.set({"daskpri.trainer.precision": "bfloat16"}):
        assert config().precision == "bfloat16"
