"""What a fit asks each worker and the scheduler before it sets a run up: one probe.

:func:`probe` runs in each of the run's workers (one direct call to each) and in
the scheduler (one ``client.run_on_scheduler``), and answers every question
the checks before the set-up have (:mod:`daskpri.training._cluster_checks`)
in one small dict: the process's daskpri and torch versions, its devices,
the modules it cannot import, why it cannot read the data's store.

This module is sent by value (``cloudpickle.register_pickle_by_value``
below), not by reference: a worker of another daskpri, which may have no
such module or a different one, still runs this code and says which
daskpri it has, where a reference would fail to unpickle there with a bare
``No module named 'daskpri.training._probe'``. So it imports nothing of
daskpri at module level, and what it calls it defines here.
"""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle

#: the accelerator kinds, counted by ``torch.<kind>.device_count()``
ACCELERATORS = ("cuda", "mps", "xpu")


def probe(kinds: tuple[str, ...], modules: list[str], path: str | None,
          bfloat16: bool = False) -> dict[str, Any]:
    """This process's answers to a fit's checks before its set-up.

    Parameters
    ----------
    kinds : tuple of str
        The accelerator kinds whose devices to count (``()``: none).
    modules : list of str
        The modules to try to find (those of the model's and strategy's classes).
    path : str or None
        The data's store, which the process should be able to read (None: none).
    bfloat16 : bool
        Whether to read the CPU's flags (a run in ``precision="bfloat16"``).

    Returns
    -------
    dict
        ``daskpri`` and ``torch``: their versions (None where not installed),
        ``devices``: ``{kind: count}``, ``unimportable``: the modules not found,
        ``cannot_read``: why ``path`` cannot be read (None: it can, or no path),
        ``cpu_bfloat16``: whether its CPU computes in bfloat16 (:func:`cpu_bfloat16`;
        None where not asked).

    Examples
    --------
    >>> answer = probe(("cuda",), ["json", "no_such_module_here"], "/no/such/store")
    >>> answer["unimportable"], answer["cannot_read"], sorted(answer["devices"])
    (['no_such_module_here'], 'no such file or directory', ['cuda'])
    >>> import daskpri
    >>> answer["daskpri"] == daskpri.__version__
    True
    """
    return {
        "daskpri": _version("daskpri"),
        "torch": _version("torch"),
        "devices": device_counts(kinds) if kinds else {},
        "unimportable": unimportable(modules),
        "cannot_read": None if path is None else cannot_read(path),
        "cpu_bfloat16": cpu_bfloat16() if bfloat16 else None,
    }


def _version(name: str) -> str | None:
    """The version of package ``name`` that this process runs or would import (None: none).

    An imported module's ``__version__``; else, without importing it (torch
    takes seconds and hundreds of MB, which a worker of a small memory
    limit may not have before its nanny restarts it), the ``__version__``
    that the module's file sets, or the installed distribution's version:
    the copy that a ``PYTHONPATH`` may put first is the one read.
    """
    import importlib.metadata
    import importlib.util

    module = sys.modules.get(name)
    if module is not None:
        return str(getattr(module, "__version__", "unknown"))
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    try:
        with open(str(spec.origin), encoding="utf-8") as f:
            found = literal_version(f.read())
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        found = None
    if found is not None:
        return found
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def literal_version(source: str) -> str | None:
    """The string that a module's ``source`` assigns to ``__version__`` at top level, if any.

    Examples
    --------
    >>> literal_version("'''A package.'''\\n__version__ = '1.2.3'\\n")
    '1.2.3'
    >>> print(literal_version("from ._version import __version__"))
    None
    """
    import ast

    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)):
            return node.value.value
    return None


def device_counts(kinds: tuple[str, ...] = ACCELERATORS) -> dict[str, int]:
    """This process's devices of each accelerator kind.

    Examples
    --------
    >>> sorted(device_counts())
    ['cuda', 'mps', 'xpu']
    """
    import torch

    counts = {}
    for kind in kinds:
        module = getattr(torch, kind, None)
        try:
            counts[kind] = int(module.device_count()) if module is not None else 0
        except Exception:  # a backend torch was built without
            counts[kind] = 0
    return counts


#: the CPU flags (Linux's /proc/cpuinfo) of bfloat16 arithmetic, which torch's CPU
#: kernels use for bfloat16 autocast; without one torch emulates it, slower than float32
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bfloat16(cpuinfo: str | None = None) -> bool | None:
    r"""Whether this CPU has bfloat16 instructions (``None``: unknown, not Linux).

    ``cpuinfo`` is the text of ``/proc/cpuinfo`` (read where None).

    Examples
    --------
    >>> cpu_bfloat16("processor : 0\nflags : fpu sse avx2 avx512f\n")
    False
    >>> cpu_bfloat16("processor : 0\nflags : fpu avx512f avx512_bf16 amx_tile\n")
    True
    >>> cpu_bfloat16("processor : 0\n") is None
    True
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":  # the first processor's
            return any(flag in value.split() for flag in BFLOAT16_FLAGS)
    return None


def unimportable(names: list[str]) -> list[str]:
    """Those of ``names`` that this process cannot import.

    Examples
    --------
    >>> unimportable(["json", "json.nothing", "nothing.json"])
    ['json.nothing', 'nothing.json']
    """
    import importlib.util

    missing = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a parent package missing, or a broken one
            spec = None
        if spec is None:
            missing.append(name)
    return missing


def cannot_read(path: str) -> str | None:
    """Why this process cannot read ``path`` (``None``: it can).

    Examples
    --------
    >>> cannot_read("/"), cannot_read("/no/such/store")
    (None, 'no such file or directory')
    """
    import os

    if not os.path.exists(path):
        return "no such file or directory"
    if not os.access(path, os.R_OK):
        return "permission denied"
    return None


# distributed pickles a function by reference unless its module is registered so
cloudpickle.register_pickle_by_value(sys.modules[__name__])
