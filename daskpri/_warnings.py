"""Warning classes of daskpri (the test suite turns them into errors), and :func:`warn`."""

from __future__ import annotations

import os
import sys
import warnings

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
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=(_PACKAGE,))
        return
    level, frame = 2, sys._getframe(1)  # 2: warn's caller
    while frame.f_back is not None and in_package(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
