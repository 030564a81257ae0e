"""preemptible: make PyTorch training survive the end of its machine.

Nothing starts on import: signal handlers and threads exist only while a `Guard` or `Run` is active. The names
below load on first use, so the command-line tools that need no torch (``preemptible run``, ``diagnose``,
``emulate``) start in a fraction of a second. Every exception and warning is importable from
`preemptible.errors`; the most common ones are here too.
"""

import importlib
from typing import TYPE_CHECKING, Any

from preemptible._version import __version__

if TYPE_CHECKING:
    from preemptible.budget import Plan, plan
    from preemptible.checkpoint import Checkpointer, SaveHandle, SaveResult
    from preemptible.checkpoint.memtier import MemoryTier
    from preemptible.errors import (
        AlreadyCommittedError,
        CheckpointCorruptError,
        CheckpointNotFoundError,
        PreemptibleError,
        SaveError,
        StateMismatchError,
        UnsupportedStateError,
    )
    from preemptible.export import load
    from preemptible.guard import Guard
    from preemptible.notice import Notice, NoticeKind, NoticeSource
    from preemptible.run import Run
    from preemptible.state import RNGState, Stateful
    from preemptible.store.layout import CheckpointInfo

_EXPORTS = {
    "Plan": "preemptible.budget",
    "plan": "preemptible.budget",
    "CheckpointCorruptError": "preemptible.errors",
    "CheckpointNotFoundError": "preemptible.errors",
    "PreemptibleError": "preemptible.errors",
    "SaveError": "preemptible.errors",
    "AlreadyCommittedError": "preemptible.errors",
    "StateMismatchError": "preemptible.errors",
    "UnsupportedStateError": "preemptible.errors",
    "Guard": "preemptible.guard",
    "MemoryTier": "preemptible.checkpoint.memtier",
    "Notice": "preemptible.notice",
    "NoticeKind": "preemptible.notice",
    "NoticeSource": "preemptible.notice",
    "Run": "preemptible.run",
    "RNGState": "preemptible.state",
    "Stateful": "preemptible.state",
    "Checkpointer": "preemptible.checkpoint",
    "SaveHandle": "preemptible.checkpoint",
    "SaveResult": "preemptible.checkpoint",
    "CheckpointInfo": "preemptible.store.layout",
    "load": "preemptible.export",
}


def __getattr__(name: str) -> Any:
    """Load a name of `__all__` on first use (PEP 562). Submodules are not attributes until imported
    (``import preemptible.state``)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'preemptible' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AlreadyCommittedError",
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "Checkpointer",
    "Guard",
    "MemoryTier",
    "Notice",
    "NoticeKind",
    "NoticeSource",
    "Plan",
    "PreemptibleError",
    "RNGState",
    "Run",
    "SaveError",
    "SaveHandle",
    "SaveResult",
    "StateMismatchError",
    "Stateful",
    "UnsupportedStateError",
    "__version__",
    "load",
    "plan",
]
