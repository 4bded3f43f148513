"""The defaults of ``daskpri bench`` and of its ``--quick``, in a module that imports nothing.

:class:`~daskpri.bench.config.BenchConfig` fills what is not given from them,
and the command line's help shows them without importing torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FULL_DEFAULTS", "QUICK_DEFAULTS"]

#: Defaults of the full benchmark (``daskpri bench --out DIR``).
FULL_DEFAULTS: dict[str, Any] = {
    "datasets": ("mnist1d",),
    "models": ("mlp", "cnn"),
    # every built-in strategy: the paper's (projection, length), the two, and ours
    "strategies": ("uniform", "projection", "length", "loss", "selective-backprop",
                   "upper-bound", "infobatch"),
    "seeds": 3,
    "workers": (1, 2),
    # doubling from 0.075 to 0.3: every arm's best rate measured on the four models
    # (SGD, momentum 0.9) lay in that range, uniform's in 0.1-0.3
    "learning_rates": (0.075, 0.15, 0.3),
    "budget": 60.0,
    "baseline_budget": None,
}

#: Defaults of ``--quick``: under 5 minutes on 2 cores (one seed, one learning rate).
QUICK_DEFAULTS: dict[str, Any] = {
    "datasets": ("mnist1d",),
    "models": ("mlp",),
    "strategies": ("uniform", "selective-backprop", "loss"),
    "seeds": 1,
    "workers": (1, 2),
    "learning_rates": (0.1,),  # the Trainer's own default for SGD
    "budget": 15.0,
    "baseline_budget": 5.0,
}
