"""The program's name, which begins its messages on stderr, and the defaults its help names.

Here, in a module that imports nothing, so that the parser builds its help
without importing the commands (and torch).
"""

from __future__ import annotations

_PROG = "daskpri"

#: ``train``'s steps between checkpoints where --checkpoint-every is not given
_DEFAULT_CHECKPOINT_EVERY = 100
#: ``train``'s steps when neither --max-steps nor --max-time is given
_DEFAULT_MAX_STEPS = 2000
#: the strategy ``demo`` runs against uniform sampling
_DEMO_STRATEGY = "selective-backprop"
