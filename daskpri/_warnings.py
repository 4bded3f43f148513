"""Warning classes of daskpri (the test suite turns them into errors), and :func:`warn`."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: daskpri's own files: a warning points past them, at the user's line
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def in_package(filename: str) -> bool:
    """Whether ``filename`` (a frame's) is one of daskpri's own files."""
    return os.path.abspath(filename).startswith(_PACKAGE)


class DaskpriWarning(UserWarning):
    """A warning issued by daskpri itself.

    Filter on it to silence or raise daskpri's warnings alone.

    Examples
    --------
    >>> import warnings
    >>> import daskpri
    >>> issubclass(daskpri.DaskpriWarning, UserWarning)
    True
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", daskpri.DaskpriWarning)  # as the test suite does
    """


def warn(message: str, category: type[Warning] = DaskpriWarning) -> None:
    """Warn, pointing at the first line outside daskpri that led here.

    A fixed ``stacklevel`` points at the user's line through one call path
    only (``Trainer(...)`` and ``Trainer.resume(...)`` reach the same check
    at different depths) and breaks when code moves between modules.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn("a note")
    >>> caught[0].category.__name__, caught[0].filename.startswith(_PACKAGE)
    ('DaskpriWarning', False)
    """
    origin: Origin | None = getattr(_thread, "origin", None)
    if origin is not None:  # a thread's work for a call made elsewhere: that call's line
        where = origin.module_globals
        warnings.warn_explicit(
            message, category, origin.filename, origin.lineno, module=where.get("__name__"),
            registry=where.setdefault("__warningregistry__", {}), module_globals=where,
        )
        return
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=(_PACKAGE,))
        return
    level, frame = 2, sys._getframe(1)  # 2: warn's caller
    while frame.f_back is not None and in_package(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


@dataclass(frozen=True)
class Origin:
    """A line outside daskpri, where the warnings of work done for it point."""

    filename: str
    lineno: int
    module_globals: dict[str, Any]


_thread = threading.local()


def caller() -> Origin | None:
    """The first line outside daskpri that led here (None if there is none).

    Examples
    --------
    >>> caller().filename == __file__  # doctest: +SKIP
    True
    """
    frame = sys._getframe(1)
    while frame is not None and in_package(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    return Origin(frame.f_code.co_filename, frame.f_lineno, frame.f_globals)


@contextlib.contextmanager
def warnings_from(origin: Origin | None) -> Iterator[None]:
    """Point this thread's :func:`warn` at ``origin`` while the block runs.

    For a thread that works for a call made in another
    (:meth:`~daskpri.Trainer.fit_in_background`): its own stack, outside
    daskpri, is the thread pool's, whose line would say nothing to the
    user; the call's line does (a notebook's cell).
    """
    _thread.origin = origin
    try:
        yield
    finally:
        _thread.origin = None
