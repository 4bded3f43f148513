"""``python -m daskpri``: the same command line as the ``daskpri`` script."""

from __future__ import annotations

import sys

from daskpri.cli import _command

# The guard matters: LocalCluster's worker processes are spawned, and spawning
# imports this module again as ``__mp_main__``, which must not start a run.
if __name__ == "__main__":
    sys.exit(_command())
