"""A small disk that fills: a tmpfs of its own, for the tests of a full disk."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(parent: Path, size: str) -> Iterator[Path]:
    """A directory in ``parent`` on a tmpfs of ``size`` (``"64k"``), unmounted after.

    The test is skipped, saying why, where a tmpfs cannot be mounted (not
    root, not Linux, no ``mount`` command, a mount refused).
    """
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("a full disk is made by mounting a small tmpfs, which takes root on Linux")
    path = parent / "disk"
    path.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("a full disk is made by mounting a small tmpfs: there is no mount command")
    if done.returncode:
        pytest.skip(f"a full disk is made by mounting a small tmpfs, which failed here: "
                    f"{done.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode:
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True)
