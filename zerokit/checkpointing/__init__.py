"""``zerokit.checkpointing``: the old name of :mod:`zerokit.activation_checkpointing`, kept so that code written
against it still imports.

The package was renamed to stand apart from :mod:`zerokit.checkpoint` (saved training state). This alias
re-exports its names, and its modules answer under the old name too (``zerokit.checkpointing.measure`` is
``zerokit.activation_checkpointing.measure``). New code imports :mod:`zerokit.activation_checkpointing`.
"""
import sys

from ..activation_checkpointing import *  # noqa: F401,F403
from ..activation_checkpointing import __all__  # noqa: F401
from ..activation_checkpointing import function, measure, policies, torch_peers

for _module in (function, measure, policies, torch_peers):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module
