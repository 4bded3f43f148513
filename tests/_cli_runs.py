"""What the CLI's tests share: small runs' arguments, the summary line, the command run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import xarray as xr

#: a small run: 20 steps on synthetic data
SMALL = ["--dataset", "synthetic", "--n-samples", "2000", "--max-steps", "20"]
#: the line a finished run prints
SUMMARY = re.compile(
    r"^(?P<strategy>[\w-]+): 20 steps, final accuracy 0\.\d{4}, best accuracy 0\.\d{4}, "
    r"[\d.]+ s training, [\d,]+ samples/s$",
    re.M,
)


def _open(path: Path) -> xr.Dataset:
    """A history the command wrote, netCDF or Zarr."""
    if path.suffix == ".zarr":
        return xr.open_zarr(path, consolidated=False)
    return xr.open_dataset(path, engine="h5netcdf")


def _cli(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m daskpri *args`` in a process of its own, ``env`` added to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "daskpri", *args], capture_output=True, text=True, timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
