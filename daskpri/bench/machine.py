"""What a benchmark records of the machine it runs on.

Cores, CPU model and flags, platform, the versions that matter and the load
average, as :func:`machine_info` gives them to the report.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import Any

import numpy as np


def machine_info() -> dict[str, Any]:
    """Cores, platform and the versions that matter, with the current load average."""
    import dask
    import distributed
    import torch

    import daskpri

    cpuinfo = _cpuinfo()
    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        # float results, so a seed's run, can differ between CPUs of one name
        "cpu": _cpu_model(cpuinfo),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # what a ``score_dtype`` below float32 runs on
        "cpu_low_precision": _cpu_flags(cpuinfo, _LOW_PRECISION_FLAGS),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "numpy": np.__version__,
        "daskpri": daskpri.__version__,
        "cuda": torch.cuda.is_available(),
        # the driver's; the workers of a --scheduler may have others
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average_start": _load(),
    }


#: /proc/cpuinfo flags of bfloat16 and float16 arithmetic
_LOW_PRECISION_FLAGS = ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of Linux's ``/proc/cpuinfo`` (none elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if not line.strip():
            break  # the first processor's block
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_flags(fields: Mapping[str, str], wanted: tuple[str, ...]) -> list[str] | None:
    """Which of ``wanted`` the CPU's flags (``fields``: :func:`_cpuinfo`) list, or ``None``."""
    if "flags" not in fields:
        return None
    flags = set(fields["flags"].split())
    return [f for f in wanted if f in flags]


def _cpu_model(fields: Mapping[str, str]) -> str | None:
    """The CPU's model name, family and model (``fields``: :func:`_cpuinfo`), or ``None``."""
    if "model name" not in fields:
        return None
    family = [f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields]
    return ", ".join([fields["model name"], *family])


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # not on every platform
        return None
