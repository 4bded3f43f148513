"""Priority strategies: one base class, a registry by name.

Examples
--------
>>> from daskpri.strategies import get_strategy
>>> get_strategy("loss", epsilon=0.5)
Loss(epsilon=0.5, renew=0.0, batch_size=None)
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from daskpri.strategies.base import Batch, Computed, SelectContext, Selection, Strategy
from daskpri.strategies.infobatch import InfoBatch
from daskpri.strategies.length import Length
from daskpri.strategies.loss import Loss
from daskpri.strategies.projection import Projection
from daskpri.strategies.selective_backprop import SelectiveBackprop
from daskpri.strategies.uniform import Uniform
from daskpri.strategies.upper_bound import UpperBound

#: The registered strategy classes by name: the built-in ones, then those
#: of :func:`register_strategy`.
STRATEGIES: dict[str, type[Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Register a :class:`Strategy` subclass under its ``name`` (a decorator).

    A name of your own may be registered again (a notebook cell run twice
    defines the class anew); a built-in strategy's name is refused, since
    every run in this process asking for it would get the other class.

    Parameters
    ----------
    cls : type
        A :class:`Strategy` subclass with a non-empty ``name``.

    Returns
    -------
    type
        ``cls`` itself, so that it may be used as a class decorator.

    Raises
    ------
    TypeError
        If ``cls`` is not a :class:`Strategy` subclass.
    ValueError
        If its ``name`` is empty or a built-in strategy's.

    Examples
    --------
    >>> @register_strategy
    ... class MyUniform(Uniform):
    ...     name = "my-uniform"
    >>> get_strategy("my-uniform", batch_size=8)
    MyUniform(batch_size=8)
    >>> del STRATEGIES["my-uniform"]  # this example's only: leave the registry as it was
    >>> class Mine(Uniform):
    ...     name = "uniform"
    >>> register_strategy(Mine)
    Traceback (most recent call last):
    ...
    ValueError: 'uniform' is a built-in strategy's name: give Mine another name
    """
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"register_strategy takes a Strategy subclass, but got {cls!r}")
    if not cls.name:
        raise ValueError(f"{cls.__name__}.name should be a non-empty string")
    if cls.name in _BUILT_IN and STRATEGIES.get(cls.name) is not cls:
        raise ValueError(f"{cls.name!r} is a built-in strategy's name: give {cls.__name__} "
                         "another name")
    STRATEGIES[cls.name] = cls
    return cls


_BUILT_IN: frozenset[str] = frozenset()
for _cls in (Uniform, Projection, Length, Loss, SelectiveBackprop, UpperBound, InfoBatch):
    register_strategy(_cls)
_BUILT_IN = frozenset(STRATEGIES)


def unknown_options(strategy: str, options: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The options registered strategy ``strategy`` takes, and those of ``options`` it does not.

    A strategy that takes any keyword (``**options``) takes them all.

    Parameters
    ----------
    strategy : str
        A name in :data:`STRATEGIES`.
    options : mapping of str to object
        Keyword arguments meant for its constructor.

    Returns
    -------
    allowed : list of str
        The keyword arguments its constructor takes (the names in
        ``options``, for one taking ``**options``).
    unknown : list of str
        Those of ``options`` it does not take, sorted.

    Examples
    --------
    >>> unknown_options("loss", {"epsilon": 0.5, "eps": 1})
    (['epsilon', 'renew', 'batch_size'], ['eps'])
    """
    params = inspect.signature(STRATEGIES[strategy]).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return list(options), []
    allowed = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return allowed, sorted(set(options) - set(allowed))


def check_strategy_options(
    strategy: str, options: Mapping[str, Any], *, given_as: str = "--strategy-option"
) -> None:
    """Name the options ``strategy`` takes when ``options`` holds others.

    Checked before any cluster starts (the CLI's ``--strategy-option``).

    Parameters
    ----------
    strategy : str
        A name in :data:`STRATEGIES`.
    options : mapping of str to object
        Keyword arguments meant for its constructor.
    given_as : str, default "--strategy-option"
        How the message names where ``options`` came from.

    Raises
    ------
    ValueError
        If ``options`` holds a keyword the strategy does not take.

    Examples
    --------
    >>> check_strategy_options("loss", {"epsilon": 0.5})
    >>> check_strategy_options("loss", {"eps": 0.5})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: strategy 'loss' takes the options epsilon, renew, ..., but got --strategy-option eps
    """
    allowed, unknown = unknown_options(strategy, options)
    if unknown:
        raise ValueError(
            f"strategy {strategy!r} takes the options {', '.join(allowed) or 'none'}, "
            f"but got {given_as} {', '.join(unknown)}"
        )


def get_strategy(strategy: str | Strategy, **options: Any) -> Strategy:
    """A strategy object from a registered name (with ``options``) or as given.

    Parameters
    ----------
    strategy : str or Strategy
        A name in :data:`STRATEGIES`, or a strategy object (returned as it
        is).
    **options
        Keyword arguments of the named strategy's constructor; none with a
        strategy object.

    Returns
    -------
    Strategy
        A new strategy of that name built with ``options``, or ``strategy``
        itself.

    Raises
    ------
    TypeError
        If ``strategy`` is neither a name nor a Strategy object (a Strategy
        class among them: an instance is wanted).
    ValueError
        If the name is not registered, the strategy does not take one of
        ``options``, or options come with a strategy object.

    Examples
    --------
    >>> get_strategy("uniform", batch_size=32)
    Uniform(batch_size=32)
    >>> get_strategy("uniform", progress=False)
    Traceback (most recent call last):
    ...
    ValueError: strategy 'uniform' takes the options batch_size, but got the option progress
    """
    if isinstance(strategy, Strategy):
        if options:
            raise ValueError(
                "strategy options are given to the strategy object itself, but got "
                f"{sorted(options)} beside {strategy!r}"
            )
        return strategy
    allowed = ", ".join(repr(s) for s in STRATEGIES)
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        raise TypeError(
            f"strategy should be a Strategy object or a registered name, but got the class "
            f"{strategy.__name__}: pass {strategy.__name__}(...), an instance"
        )
    if not isinstance(strategy, str):
        raise TypeError(
            f"strategy should be a registered name ({allowed}) or a Strategy object, but got "
            f"{type(strategy).__name__} {strategy!r}"
        )
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy should be one of {allowed}, but got {strategy!r}")
    check_strategy_options(strategy, options, given_as="the option")
    return STRATEGIES[strategy](**options)


__all__ = [
    "STRATEGIES",
    "Batch",
    "Computed",
    "InfoBatch",
    "Length",
    "Loss",
    "Projection",
    "SelectContext",
    "Selection",
    "SelectiveBackprop",
    "Strategy",
    "Uniform",
    "UpperBound",
    "get_strategy",
    "register_strategy",
]
