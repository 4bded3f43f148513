"""The names daskpri offers (datasets, models, optimizers), in a module that imports nothing.

The modules that use them (:mod:`daskpri.data.datasets`,
:mod:`daskpri.models`, the trainer's settings) import them from here, and so
does the command line's parser: ``daskpri --help`` and a mistyped argument
are answered without importing torch, xarray or distributed.

Examples
--------
>>> from daskpri._choices import DATASETS, MODELS
>>> "mnist1d" in DATASETS, MODELS
(True, ('mlp', 'cnn'))
"""

from __future__ import annotations

__all__ = ["DATASETS", "LEARNING_RATES", "MODELS", "MONITORS", "PRECISIONS", "TAKES_ROOT"]

#: The names :func:`daskpri.datasets.load` takes.
DATASETS = ("mnist1d", "digits", "mnist5k", "mnist", "cifar10", "synthetic")

#: The datasets read from files in a directory the user names (``root``).
TAKES_ROOT = ("mnist", "cifar10")

#: The names :func:`daskpri.models.build_model` takes.
MODELS = ("mlp", "cnn")

#: Each optimizer's learning rate where neither the argument nor the config
#: (``daskpri.trainer.learning-rate``, null by default) gives one. SGD's
#: (with the default momentum 0.9) from ``daskpri bench``: every arm's best
#: rate on its four models lay in 0.075-0.3, uniform's in 0.1-0.3; Adam's and
#: AdamW's are torch's own.
LEARNING_RATES = {"sgd": 0.1, "adam": 0.001, "adamw": 0.001}

#: The figures of ``eval_data`` that :class:`daskpri.EarlyStopping` can watch
#: (the history's variables), and whether a better one is higher or lower.
MONITORS = {"accuracy": "max", "eval_loss": "min"}

#: The precisions the workers train in (the Trainer's ``precision``): float32,
#: or bfloat16 under ``torch.autocast``.
PRECISIONS = ("float32", "bfloat16")
