"""What a benchmark measures: :class:`BenchConfig`, validated, with ``--quick`` defaults."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from numbers import Real
from typing import Any

from daskpri._choices import PRECISIONS

# the defaults: in a module of their own, for the command line's help without torch
from daskpri.bench._defaults import FULL_DEFAULTS as FULL_DEFAULTS
from daskpri.bench._defaults import QUICK_DEFAULTS as QUICK_DEFAULTS
from daskpri.bench._options import (
    StrategyOptionError,
    checked_options,
    entry_refused,
    strategy_of,
)
from daskpri.training._checks import check_choice, check_float, check_int, check_real
from daskpri.training.rounds import in_whole_rounds, whole_rounds

__all__ = [
    "FULL_DEFAULTS",
    "QUICK_DEFAULTS",
    "BenchConfig",
    "StrategyOptionError",
    "default_eval_every",
    "strategy_of",
]

#: steps between evaluations where none is given, rounded to whole rounds
EVAL_EVERY = 20

@dataclass(frozen=True)
class BenchConfig:
    """The protocol's parameters; every field is checked on construction.

    Parameters
    ----------
    datasets, models, strategies : tuple of str
        What is compared, each named once; ``"uniform"`` is always run (added
        first if absent).
        A strategy named ``NAME+LABEL`` (e.g. ``"selective-backprop+stale"``)
        is a second arm of strategy ``NAME``, with its own options, compared
        in the same runs as ``NAME``'s (``LABEL``: letters, digits, ``_.-``).
    seeds : int
        Seeds ``first_seed .. first_seed + seeds - 1``; each seeds the
        model's weights and the trainer's selections (the data split is the
        same for all).
    first_seed : int
        The first seed (0): a second benchmark with other seeds draws other
        weights and selections, where the same seeds would repeat the first
        one's steps.
    workers : tuple of int
        Worker counts, each once (kept in increasing order). The comparison
        runs on the largest; the others rerun every arm at its chosen
        learning rate for the scaling table.
    learning_rates : tuple of float
        The sweep, for uniform and each strategy, each value once (kept in
        increasing order); each arm keeps one, as ``pick`` says.
    pick : {"time", "final"}
        How each arm's learning rate is chosen: ``"time"``, the one that
        reaches the highest target (of ``target_fractions``) soonest, in
        median seconds over the seeds, the target taken from uniform's best
        accuracy at any learning rate swept; ``"final"``, the one of best
        median final accuracy (uniform's best accuracy at its pick then
        sets the targets). ``"time"`` tunes the baseline for what it is
        compared on: with ``"final"`` and a long budget, uniform can keep a
        small learning rate that ends higher but reaches a target later.
    budget : float
        Seconds of training (the history's ``time``) of every run.
    baseline_budget : float, optional
        Seconds of the plain PyTorch loop and DDP runs (default ``budget``).
    batch_size : int
        Samples per worker per step of uniform (and the strategies' default).
    momentum : float
        SGD momentum of every run (the trainer's default).
    max_grad_norm : float, optional
        Clip every run's gradients to this L2 norm (the trainer's
        ``max_grad_norm``; the plain loop and DDP clip theirs alike);
        ``None``: no clipping.
    label_smoothing : float
        Label smoothing of every run's training loss, in ``[0, 1)`` (the
        trainer's ``label_smoothing``; the plain loop and DDP smooth theirs
        alike); 0: none.
    precision : {"float32", "bfloat16"}
        The precision of every run's training passes (the trainer's
        ``precision``; the plain loop and DDP run their forward passes
        under the same ``torch.autocast``).
    eval_every : int, optional
        Steps between evaluations on the test set (daskpri runs); ``None``
        takes :func:`default_eval_every`. A run evaluates at the end of a
        round of ``local_steps`` steps, the round in which a multiple of
        ``eval_every`` falls, so with ``local_steps`` above 1 it should be
        at most ``local_steps`` (every round) or a multiple of it: 20 with
        rounds of 16 would evaluate 4 rounds in 5, and a run that reached a
        target in a round left out would count it a round later.
    baseline_eval_seconds : float
        Training seconds between evaluations of the plain PyTorch and DDP
        runs, whose steps are far shorter than the trainer's.
    target_fractions : tuple of float
        Targets, as fractions of the tuned uniform baseline's median best
        accuracy, each once.
    budget_fractions : tuple of float
        Fractions of ``budget`` at which the accuracy is compared, each once.
    n_samples : int, optional
        Samples of each dataset, train and test together (default: its own).
    partition_size : int
        The largest partition: the trainer cuts in-memory data into as many
        partitions for every worker, of at most this many samples
        (``daskpri.trainer.partition-size``).
    ddp : bool
        Whether to measure PyTorch DDP (2 processes, gloo, 127.0.0.1).
    local_steps : int
        The trainer's ``local_steps`` in every daskpri run whose strategy
        allows it (``projection`` and ``length`` always take 1).
    staleness : {"keep", "exp-linear", "exp-quadratic"}
        The priority table's staleness model in every daskpri run (the
        trainer's ``staleness``): how priorities not recomputed lately are
        estimated where a strategy reads them.
    strategy_options : tuple of (strategy, key, value[, model])
        Options given to a strategy's arms, e.g. ``("selective-backprop",
        "fraction", 0.33)``; with a fourth element, only on that model's runs
        (``("selective-backprop", "fraction", 0.25, "mlp")``), which then
        take it over an option of the same key given for every model. An
        arm ``NAME+LABEL`` takes the options given for ``NAME+LABEL``, not
        ``NAME``'s.
    quick : bool
        Whether the ``--quick`` defaults were used (said in the report).
    scheduler : str, optional
        A running scheduler to use instead of a LocalCluster per worker count.

    Examples
    --------
    >>> BenchConfig.from_options(quick=True).strategies
    ('uniform', 'selective-backprop', 'loss')
    >>> BenchConfig(seeds=0)
    Traceback (most recent call last):
    ...
    ValueError: seeds should be a positive integer, but got seeds=0
    >>> BenchConfig(strategies=["uniform", "loss", "uniform"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: strategies should not repeat an item, but got 'uniform' twice in strategies=[...]
    """

    datasets: tuple[str, ...] = FULL_DEFAULTS["datasets"]
    models: tuple[str, ...] = FULL_DEFAULTS["models"]
    strategies: tuple[str, ...] = FULL_DEFAULTS["strategies"]
    seeds: int = 3
    first_seed: int = 0
    workers: tuple[int, ...] = (1, 2)
    learning_rates: tuple[float, ...] = FULL_DEFAULTS["learning_rates"]
    budget: float = 60.0
    baseline_budget: float | None = None
    batch_size: int = 64
    momentum: float = 0.9
    max_grad_norm: float | None = None
    label_smoothing: float = 0.0
    precision: str = "float32"
    eval_every: int | None = None
    baseline_eval_seconds: float = 0.25
    target_fractions: tuple[float, ...] = (0.97, 0.99)
    pick: str = "time"
    budget_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    n_samples: int | None = None
    partition_size: int = 1000
    ddp: bool = True
    local_steps: int = 1
    staleness: str = "keep"
    strategy_options: tuple[tuple[Any, ...], ...] = ()
    quick: bool = False
    scheduler: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        from daskpri.data.datasets import DATASETS
        from daskpri.models import MODELS
        from daskpri.strategies import STRATEGIES

        object.__setattr__(self, "datasets", _names("datasets", self.datasets, DATASETS))
        object.__setattr__(self, "models", _names("models", self.models, MODELS))
        strategies = _arm_names(self.strategies, tuple(STRATEGIES))
        if "uniform" not in strategies:
            strategies = ("uniform", *strategies)
        object.__setattr__(self, "strategies", strategies)
        check_int("seeds", self.seeds, 1)
        check_int("first_seed", self.first_seed, 0)
        from daskpri.training._settings import MAX_SEED

        last = self.first_seed + self.seeds - 1
        if last > MAX_SEED:  # else refused by the Trainer of the first run past it, hours in
            raise ValueError(
                f"first_seed should leave every seed at most {MAX_SEED} (the largest a "
                f"Trainer takes), but got first_seed={self.first_seed} and seeds={self.seeds}: "
                f"the last seed would be {last}"
            )
        check_int("batch_size", self.batch_size, 1)
        check_int("partition_size", self.partition_size, 1)
        check_int("local_steps", self.local_steps, 1)
        every = default_eval_every(self.local_steps) if self.eval_every is None else self.eval_every
        check_int("eval_every", every, 1)
        _check_eval_grid(every, self.local_steps)
        object.__setattr__(self, "eval_every", every)
        from daskpri.table.staleness import validate_staleness

        validate_staleness(self.staleness)
        options = checked_options(self.strategy_options, strategies, self.models)
        object.__setattr__(self, "strategy_options", tuple(options))
        from daskpri.strategies import check_strategy_options, get_strategy

        for name in strategies:  # bad options fail here, before any run
            for model in self.models:
                given = dict(self.options_of(name, model))
                try:
                    check_strategy_options(strategy_of(name), given)
                    get_strategy(strategy_of(name), **given)
                except (TypeError, ValueError) as e:
                    entry = entry_refused(options, name, model, str(e))
                    if isinstance(e, ValueError) and entry is not None:
                        # the strategy names its parameter: say which entry (which flag) set it
                        raise StrategyOptionError("{0}: {problem}", entry,
                                                  problem=str(e)) from None
                    if name == strategy_of(name):
                        raise
                    raise type(e)(f"arm {name!r}: {e}") from None
        if self.n_samples is not None:
            check_int("n_samples", self.n_samples, 1)
        # kept in increasing order: the comparison runs on the last (main_workers)
        workers = _items("workers", self.workers, "worker counts",
                         lambda n: check_int("workers", n, 1))
        object.__setattr__(self, "workers", tuple(sorted(workers)))
        rates = _items("learning_rates", self.learning_rates, "numbers",
                       lambda lr: check_float("learning_rates", lr))
        object.__setattr__(self, "learning_rates", tuple(sorted(rates)))
        check_float("budget", self.budget)
        if self.max_grad_norm is not None:
            check_float("max_grad_norm", self.max_grad_norm)
        check_real("label_smoothing", self.label_smoothing, 0.0, 1.0)
        check_choice("precision", self.precision, PRECISIONS)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum should be in [0, 1), but got momentum={self.momentum!r}")
        check_float("baseline_eval_seconds", self.baseline_eval_seconds)
        if self.baseline_budget is not None:
            check_float("baseline_budget", self.baseline_budget)
        from daskpri.bench.protocol import PICKS

        if self.pick not in PICKS:
            raise ValueError(
                f"pick should be one of {', '.join(map(repr, PICKS))}, but got pick={self.pick!r}"
            )
        for name in ("target_fractions", "budget_fractions"):
            given = getattr(self, name)
            fractions = _items(name, given, "numbers in (0, 1]",
                               partial(_check_fraction, name, given))
            object.__setattr__(self, name, fractions)

    @classmethod
    def from_options(cls, quick: bool = False, **options: Any) -> BenchConfig:
        """A config from the options given; ``None`` means the (quick) default.

        Examples
        --------
        >>> BenchConfig.from_options(quick=True, budget=None, seeds=2).seeds
        2
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"BenchConfig takes {sorted(known)}, but got {unknown}")
        values = dict(QUICK_DEFAULTS if quick else FULL_DEFAULTS)
        values.update({k: v for k, v in options.items() if v is not None})
        return cls(quick=quick, **values)

    @property
    def seed_range(self) -> range:
        """The seeds of the runs.

        Examples
        --------
        >>> list(BenchConfig(seeds=3, first_seed=10).seed_range)
        [10, 11, 12]
        """
        return range(self.first_seed, self.first_seed + self.seeds)

    @property
    def seed_span(self) -> str:
        """The seeds as the report names them.

        Examples
        --------
        >>> BenchConfig(seeds=10, first_seed=20).seed_span, BenchConfig(seeds=1).seed_span
        ('20–29', '0')
        """
        last = self.first_seed + self.seeds - 1
        return f"{self.first_seed}–{last}" if self.seeds > 1 else f"{self.first_seed}"

    @property
    def main_workers(self) -> int:
        """The worker count of the comparison (the largest of ``workers``)."""
        return self.workers[-1]

    @property
    def baseline_seconds(self) -> float:
        """Seconds of the plain PyTorch and DDP runs."""
        return self.budget if self.baseline_budget is None else self.baseline_budget

    def to_dict(self) -> dict[str, Any]:
        """The fields, as JSON takes them."""
        return {
            k: [list(e) if isinstance(e, tuple) else e for e in v] if isinstance(v, tuple) else v
            for k, v in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchConfig:
        """The config that :meth:`to_dict` gave ``d`` (as a results.json stores it).

        Fields it lacks (a file written before they existed) keep their
        defaults; every field is checked again.

        Examples
        --------
        >>> cfg = BenchConfig(strategies=("uniform", "loss"), seeds=2, strategy_options=(
        ...     ("loss", "epsilon", 0.5),))
        >>> BenchConfig.from_dict(cfg.to_dict()) == cfg
        True
        """
        def tupled(v: Any) -> Any:
            return tuple(tupled(e) for e in v) if isinstance(v, list) else v

        return cls(**{f.name: tupled(d[f.name]) for f in fields(cls) if f.name in d})

    def options_of(self, strategy: str, model: str | None = None) -> tuple[tuple[str, Any], ...]:
        """The ``(key, value)`` options of ``strategy``'s arms on ``model``'s runs.

        Options given for the model override those given for every model.

        Examples
        --------
        >>> cfg = BenchConfig(strategies=("selective-backprop",), strategy_options=(
        ...     ("selective-backprop", "fraction", 0.5), ("selective-backprop", "refresh", 4),
        ...     ("selective-backprop", "fraction", 0.25, "mlp")))
        >>> cfg.options_of("selective-backprop", "mlp")
        (('fraction', 0.25), ('refresh', 4))
        >>> cfg.options_of("selective-backprop", "cnn")
        (('fraction', 0.5), ('refresh', 4))
        """
        chosen: dict[str, Any] = {}
        for scoped in (False, True):
            for name, k, v, only in self.strategy_options:
                if name == strategy and (only is not None) == scoped and only in (None, model):
                    chosen[k] = v
        return tuple(chosen.items())


#: the label of an arm ``NAME+LABEL``
_LABEL = re.compile(r"[A-Za-z0-9_.-]+")


def default_eval_every(local_steps: int) -> int:
    """Steps between evaluations where none is given: about 20, in whole rounds.

    Examples
    --------
    >>> [default_eval_every(k) for k in (1, 4, 8, 16, 512)]
    [20, 20, 16, 16, 512]
    """
    return whole_rounds(EVAL_EVERY, local_steps)


def _check_eval_grid(eval_every: int, local_steps: int) -> None:
    """Raise ``ValueError`` where evaluations would leave out some rounds and not others.

    Examples
    --------
    >>> _check_eval_grid(32, 16), _check_eval_grid(4, 16), _check_eval_grid(20, 1)
    (None, None, None)
    >>> _check_eval_grid(20, 16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: eval_every should be at most local_steps=16 (every round) or a multiple of it ...
    """
    if in_whole_rounds(eval_every, local_steps):
        return
    raise ValueError(
        f"eval_every should be at most local_steps={local_steps} (every round) or a multiple "
        f"of it ({local_steps}, {2 * local_steps}, ...), but got eval_every={eval_every}: runs "
        f"evaluate at the end of a round, so {eval_every} would evaluate some rounds and not "
        "others, and a target reached in one left out would count a round later"
    )


def _items(
    name: str, values: Any, what: str, check: Callable[[Any], object]
) -> tuple[Any, ...]:
    """``values`` as a tuple, once sure it holds at least one item, each passing ``check``, once.

    A repeated item is more likely a slip than what was meant (as ``daskpri
    bench --workers 1,1`` is refused), and dropping it would hide the slip.

    Examples
    --------
    >>> _items("workers", [2, 1], "worker counts", lambda n: check_int("workers", n, 1))
    (2, 1)
    >>> _items("workers", (), "worker counts", lambda n: None)
    Traceback (most recent call last):
    ...
    ValueError: workers should be a non-empty sequence of worker counts, but got workers=()
    >>> _items("rates", (0.1, 0.05, 0.10), "numbers", lambda lr: None)
    Traceback (most recent call last):
    ...
    ValueError: rates should not repeat an item, but got 0.1 twice in rates=(0.1, 0.05, 0.1)
    """
    iterable = isinstance(values, Iterable) and not isinstance(values, (str, bytes))
    items = tuple(values) if iterable else ()
    if not items:
        raise ValueError(
            f"{name} should be a non-empty sequence of {what}, but got {name}={values!r}"
        )
    for item in items:
        check(item)
    for item in items:
        n = sum(1 for other in items if other == item)
        if n > 1:
            times = "twice" if n == 2 else f"{n} times"
            raise ValueError(
                f"{name} should not repeat an item, but got {item!r} {times} in {name}={values!r}"
            )
    return items


def _check_fraction(name: str, given: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < float(value) <= 1.0:
        raise ValueError(
            f"{name} should be numbers in (0, 1], but got {value!r} in {name}={given!r}"
        )


def _arm_names(values: Sequence[str], allowed: Sequence[str]) -> tuple[str, ...]:
    """``values`` as arm names: strategies, or ``NAME+LABEL`` variants of them."""
    return _items("strategies", values, "names", lambda value: _check_arm(value, allowed))


def _check_arm(value: Any, allowed: Sequence[str]) -> None:
    name, plus, label = str(value).partition("+")
    if name not in allowed:
        raise ValueError(
            f"strategies should be among {', '.join(map(repr, allowed))} (or NAME+LABEL "
            f"for a second arm of one), but got {value!r}"
        )
    if plus and not _LABEL.fullmatch(label):
        raise ValueError(
            f"a strategy's second arm should be named NAME+LABEL, its label made of "
            f"letters, digits and _.-, but got {value!r}"
        )
    if plus and name == "uniform":
        raise ValueError(
            f"uniform is the baseline and takes no second arm, but got {value!r}"
        )


def _names(name: str, values: Sequence[str], allowed: Sequence[str]) -> tuple[str, ...]:
    """``values``, names among ``allowed``, as a tuple."""

    def check(value: Any) -> None:
        if value not in allowed:
            raise ValueError(
                f"{name} should be among {', '.join(map(repr, allowed))}, but got {value!r}"
            )

    return _items(name, values, "names", check)
