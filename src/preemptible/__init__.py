"""preemptible: make PyTorch training survive the end of its machine.

Nothing starts on import: signal handlers and threads exist only while a `Guard` or `Run` is active.
"""

from preemptible._version import __version__
from preemptible.budget import Plan, plan
from preemptible.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    PreemptibleError,
    SaveError,
    StateMismatchError,
    UnsupportedStateError,
)
from preemptible.guard import Guard
from preemptible.notice import Notice, NoticeKind, NoticeSource
from preemptible.run import Run
from preemptible.state import RNGState, Stateful
from preemptible.store.checkpointer import Checkpointer, SaveHandle, SaveResult
from preemptible.store.layout import CheckpointInfo

__all__ = [
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "Checkpointer",
    "Guard",
    "Notice",
    "Plan",
    "NoticeKind",
    "NoticeSource",
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
    "plan",
]
