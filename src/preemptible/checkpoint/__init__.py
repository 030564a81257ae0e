"""Checkpoints: the `Checkpointer` façade (save, list, verify, rotate, restore) and the parts it owns.

The write side (saver, planner, arena, commit, steady) and the read side (reader, restore, reshard, shards,
readonly) are modules of this package; `docs/architecture.md` maps them. The names below load on first use (PEP
562), so that importing a read-side module loads nothing of the write side.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from preemptible.checkpoint.checkpointer import Checkpointer
    from preemptible.checkpoint.handle import SaveHandle, SaveResult

_EXPORTS = {
    "Checkpointer": "preemptible.checkpoint.checkpointer",
    "SaveHandle": "preemptible.checkpoint.handle",
    "SaveResult": "preemptible.checkpoint.handle",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'preemptible.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Checkpointer", "SaveHandle", "SaveResult"]
