"""The program's name, which begins the command's messages on stderr."""

from __future__ import annotations

_PROG = "daskpri"
