"""Warning classes of daskpri (the test suite turns them into errors)."""

from __future__ import annotations


class DaskpriWarning(UserWarning):
    """A warning issued by daskpri itself."""
