"""The argparse types of the options, and the ``--strategy-option`` pairs as a dict."""

from __future__ import annotations

import argparse
import math
import socket
from collections.abc import Callable, Sequence
from typing import Any

_OUTPUT_SUFFIXES = (".nc", ".zarr")


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
    from daskpri.training.placement import parse_resources

    try:
        return parse_resources(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _device(text: str) -> str:
    """A torch device's name, checked by torch (imported only where the option is given)."""
    from daskpri.replicas.devices import device_name

    try:
        return device_name(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"should name a torch device like cpu, cuda or cuda:1, but got {text!r}") from None


def _output_path(text: str) -> str:
    if not text.lower().rstrip("/").endswith(_OUTPUT_SUFFIXES):
        raise argparse.ArgumentTypeError(
            "the output should be a path ending in .nc (netCDF) or .zarr (zarr), "
            f"but got {text!r}"
        )
    return text


def _count(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (and at most ``maximum``).

    Examples
    --------
    >>> _count(1)("5")
    5
    >>> _count(1)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: should be a positive integer, but got '0'
    >>> _count(0, 9)("10")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: should be an integer in [0, 9], but got '10'
    """
    if maximum is not None:
        what = f"an integer in [{minimum}, {maximum}]"
    else:
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer of at least {minimum}"
        )

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"should be {what}, but got {text!r}")
        return value

    return parse


#: seeds as the trainer takes them (numpy's SeedSequence of one 32-bit word)
_seed = _count(0, 2**32 - 1)


def _host(text: str) -> str:
    """An argparse type: a host name or address this machine can resolve, kept as given.

    A name that does not resolve is refused here, naming the flag, rather
    than by the server that would listen on it, whose error names no flag.

    Examples
    --------
    >>> _host("127.0.0.1")
    '127.0.0.1'
    >>> _host("")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: should be a host name or address, e.g. 127.0.0.1, but got ''
    """
    example = "e.g. 127.0.0.1, or 0.0.0.0 for every interface"
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"should be a host name or address, e.g. 127.0.0.1, but got {text!r}"
        )
    try:
        socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        why = e.strerror if isinstance(e, socket.gaierror) and e.strerror else str(e)
        if text.startswith("[") and text.endswith("]"):
            example = "an IPv6 address without its brackets, e.g. ::1"
        raise argparse.ArgumentTypeError(
            f"{text!r} is no address or name this machine resolves ({why}); give one of its "
            f"addresses or its name, {example}"
        ) from None
    return text


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
_smoothing = _number(lambda v: 0.0 <= v < 1.0, "a number in [0, 1)")
_delta = _number(lambda v: math.isfinite(v) and v >= 0, "a finite number of 0 or more")
_decay = _delta
_momentum = _smoothing  # (the same range, [0, 1))


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
