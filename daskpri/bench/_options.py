"""A benchmark's strategy options: each entry checked, and refusals said as they were given.

:class:`~daskpri.bench.config.BenchConfig` checks its ``strategy_options``
here, and ``daskpri bench`` says a refusal as its ``--strategy-option`` was
typed (:meth:`StrategyOptionError.as_flags`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["StrategyOptionError", "checked_options", "entry_refused", "strategy_of"]


def strategy_of(arm: str) -> str:
    """The strategy of arm ``arm``: ``NAME`` of ``NAME+LABEL``, else ``arm`` itself.

    Examples
    --------
    >>> strategy_of("selective-backprop+stale"), strategy_of("loss")
    ('selective-backprop', 'loss')
    """
    return arm.partition("+")[0]


class StrategyOptionError(ValueError):
    """A ``strategy_options`` entry refused, said in Python's terms or in the command line's.

    ``str(error)`` names the entry as the tuple given and the other fields as
    :class:`BenchConfig`'s (``strategies=``); :meth:`as_flags` names it as
    ``daskpri bench --strategy-option STRATEGY[@MODEL]:KEY=VALUE`` was typed,
    and the fields as their flags (``--strategies``).

    Examples
    --------
    >>> from daskpri.bench import BenchConfig
    >>> try:
    ...     BenchConfig(strategies=("loss",), strategy_options=(("projection", "k", 1),))
    ... except StrategyOptionError as e:
    ...     print(e.as_flags())  # doctest: +ELLIPSIS
    --strategy-option projection:k=1 names strategy 'projection', which is not among the ...
    """

    #: how each placeholder of a message reads, in Python's terms and the command line's
    _TERMS: dict[str, tuple[str, str]] = {
        "strategies": ("strategies=", "--strategies"),
        "models": ("models=", "--models"),
        "batch_size": ("batch_size=", "--batch-size "),
        "model_place": ("in its fourth place", "after @"),
    }

    def __init__(self, template: str, *entries: tuple[Any, ...], **values: Any) -> None:
        self.template, self.entries, self.values = template, entries, values
        super().__init__(self._say(flags=False))

    def as_flags(self) -> str:
        """The message as the command line's user typed the option."""
        return self._say(flags=True)

    def _say(self, *, flags: bool) -> str:
        spelled = [_spell_option(e, flags=flags) for e in self.entries]
        terms = {k: v[flags] for k, v in self._TERMS.items()}
        return self.template.format(*spelled, **terms, **self.values)


def _spell_option(entry: tuple[Any, ...], *, flags: bool) -> str:
    """A ``strategy_options`` entry as given: the tuple, or the ``--strategy-option`` text.

    Examples
    --------
    >>> _spell_option(("loss", "epsilon", 0.1, "mlp"), flags=True)
    '--strategy-option loss@mlp:epsilon=0.1'
    >>> _spell_option(("loss", "epsilon", 0.1, None), flags=False)
    "strategy_options entry ('loss', 'epsilon', 0.1)"
    """
    strategy, key, value, model = entry
    if not flags:
        return f"strategy_options entry {entry[:3] if model is None else entry!r}"
    return f"--strategy-option {strategy}{'' if model is None else '@' + str(model)}:{key}={value}"


def checked_options(
    given: Iterable[Any], strategies: tuple[str, ...], models: tuple[str, ...]
) -> tuple[tuple[Any, ...], ...]:
    """``strategy_options`` as 4-tuples, each naming an arm and a model compared, once.

    Raises :class:`StrategyOptionError`, which says what is wrong both in
    Python's terms and as ``daskpri bench --strategy-option`` was typed.
    """
    from daskpri.strategies import STRATEGIES

    options: list[tuple[Any, ...]] = []
    for raw in given:
        entry = tuple(raw) if isinstance(raw, Sequence) and not isinstance(raw, str) else (raw,)
        if len(entry) == 3:
            entry = (*entry, None)
        if len(entry) != 4:
            raise ValueError(
                "strategy_options should hold (strategy, key, value[, model]) tuples, e.g. "
                f"('selective-backprop', 'fraction', 0.33), but got {raw!r}"
            )
        name, key, _, model = entry
        # the names go in as values, not into the template: a name may hold braces
        said = {"name": name, "key": key, "value": entry[2], "model": model,
                "base": strategy_of(str(name)), "compared": ", ".join(strategies),
                "known": ", ".join(STRATEGIES), "models_compared": ", ".join(models)}
        if name not in strategies:
            if said["base"] not in STRATEGIES:
                problem = ("which is no strategy of daskpri ({known}) nor an arm NAME+LABEL "
                           "of one: name one of the strategies compared ({compared})")
            elif said["base"] != name:
                problem = ("an arm of {base} that is not among the strategies compared "
                           "({compared}): list {name} in {strategies} too, as a second arm of "
                           "{base}")
            else:
                problem = ("which is not among the strategies compared ({compared}): add it "
                           "to {strategies}, or name one of those")
            raise StrategyOptionError("{0} names strategy {name!r}, " + problem, entry, **said)
        if model is not None and model not in models:
            raise StrategyOptionError(
                "{0} names model {model!r} {model_place}, which is not among the models "
                "compared ({models_compared}): name one of those, or add {model} to {models}",
                entry, **said,
            )
        if key == "batch_size":
            # every arm, uniform's included, runs at the config's batch_size, which
            # its gradients-per-step accounting and its trainer are given
            raise StrategyOptionError(
                "{0} sets batch_size, the samples per worker per step of every arm, which "
                "is the benchmark's own: give {batch_size}{value!r} instead", entry, **said,
            )
        for earlier in options:
            if (earlier[0], earlier[1], earlier[3]) == (name, key, model):
                on = "" if model is None else " on model {model!r}"
                raise StrategyOptionError(
                    "{1} gives option {key} of {name}" + on + " a second time, after {0}: give "
                    "each option of an arm (on a model) once", earlier, entry, **said,
                )
        options.append(entry)
    return tuple(options)


def entry_refused(
    options: Sequence[tuple[Any, ...]], name: str, model: str, message: str
) -> tuple[Any, ...] | None:
    """The entry of ``options`` for arm ``name`` on ``model`` whose key ``message`` names.

    The one given for ``model`` before one given for every model (it is
    the one the arm takes); ``None`` where ``message`` names no key given.

    Examples
    --------
    >>> options = [("loss", "epsilon", 2.0, None), ("loss", "epsilon", 3.0, "cnn")]
    >>> entry_refused(options, "loss", "cnn", "epsilon should be ..., but got epsilon=3.0")
    ('loss', 'epsilon', 3.0, 'cnn')
    >>> entry_refused(options, "loss", "mlp", "epsilon should be ...")
    ('loss', 'epsilon', 2.0, None)
    >>> entry_refused(options, "loss", "mlp", "renew should be ...") is None
    True
    """
    mine = [e for e in options if e[0] == name and e[3] in (None, model)]
    for entry in sorted(mine, key=lambda e: e[3] is None):
        if re.search(rf"(?<![\w-]){re.escape(str(entry[1]))}(?![\w-])", message):
            return entry
    return None
