"""Every exception and warning the public API raises, in one place.

One base class, and each subclass also inherits the builtin a caller already catches, so code written
against ``FileNotFoundError`` or ``ValueError`` keeps working. Messages say what was expected, what was
found and what to do.

The hierarchy (each error also inherits the builtin in brackets)::

    PreemptibleError
    ├── CheckpointNotFoundError        [FileNotFoundError]
    ├── CheckpointCorruptError         [ValueError]
    ├── StateMismatchError             [ValueError]
    ├── StateDivergenceError           [ValueError]
    ├── UnsupportedStateError          [TypeError]
    ├── SaveError                      [OSError]
    │   └── AlreadyCommittedError
    ├── SaveCancelled
    ├── NoticeSourceError              [ValueError]
    ├── ProbeError                     [ValueError]
    ├── FileTooLargeError              [ValueError]
    ├── NotRegularFileError            [ValueError]
    │   └── OutsideRootError
    ├── StorageUnavailableError        [ImportError]
    ├── StorageCredentialsError        [PermissionError]
    ├── CoordinationError              [RuntimeError]
    │   └── RankFailures
    └── LifecycleError                 [RuntimeError]

    CheckpointFallbackWarning          [UserWarning]
"""

from __future__ import annotations

from collections.abc import Sequence


class PreemptibleError(Exception):
    """Base class of every error raised by preemptible."""


class CheckpointNotFoundError(PreemptibleError, FileNotFoundError):
    """A requested checkpoint (or the root itself) does not exist or is not committed."""

    def __init__(self, message: str, *, path: str, step: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.step = step

    def __str__(self) -> str:
        return str(self.args[0])


class CheckpointCorruptError(PreemptibleError, ValueError):
    """A committed checkpoint failed verification (checksum, size, format, manifest).

    Attributes:
        path: the checkpoint directory (or root, when every checkpoint failed).
        step: the step of the failing checkpoint, or None when this lists several.
        failures: ``(step, reason)`` for every checkpoint that failed, newest first.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str,
        step: int | None = None,
        failures: Sequence[tuple[int, str]] = (),
    ) -> None:
        super().__init__(message)
        self.path = path
        self.step = step
        self.failures = list(failures)


class StateMismatchError(PreemptibleError, ValueError):
    """The checkpoint's keys, shapes or dtypes differ from the live objects it should load into.

    Attributes:
        differences: one line per difference, e.g. ``model/fc.weight: shape [4, 8] in checkpoint, [4, 9] live``.
    """

    def __init__(self, message: str, *, path: str, step: int, differences: Sequence[str]) -> None:
        super().__init__(message)
        self.path = path
        self.step = step
        self.differences = list(differences)


class UnsupportedStateError(PreemptibleError, TypeError):
    """A state leaf is neither a tensor/array nor JSON-representable, or a tensor's dtype cannot be stored.

    Attributes:
        key: the key path of the offending leaf, e.g. ``optimizer/param_groups/0/my_hook``.
    """

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class SaveError(PreemptibleError, OSError):
    """A save failed; nothing was committed and earlier checkpoints are intact.

    Attributes:
        path: the directory of the checkpoint that was being written.
        step: its step.
    """

    def __init__(self, message: str, *, path: str, step: int) -> None:
        super().__init__(message)
        self.path = path
        self.step = step

    def __str__(self) -> str:
        return str(self.args[0])


class AlreadyCommittedError(SaveError):
    """Another process committed the same step while this save was writing it: this attempt is dropped, the
    committed checkpoint is left untouched."""


class NoticeSourceError(PreemptibleError, ValueError):
    """A notice source was named or configured wrongly (unknown name, bad signal, wrong thread)."""


class ProbeError(PreemptibleError, ValueError):
    """The probe did not return a number (a float, or a tensor of one element)."""


class FileTooLargeError(PreemptibleError, ValueError):
    """A file read from storage is larger than the bound its reader allows (a tampered or wrong file)."""


class NotRegularFileError(PreemptibleError, ValueError):
    """A path that must be a plain file is a directory, a FIFO, a device or a socket (a tampered checkpoint)."""


class OutsideRootError(NotRegularFileError):
    """A path under the checkpoint root resolves (through a symbolic link) to a place outside it: preemptible never
    reads, writes or deletes through it."""


class StorageUnavailableError(PreemptibleError, ImportError):
    """The fsspec backend for a URL is not installed."""


class StorageCredentialsError(PreemptibleError, PermissionError):
    """An object store's client found no credentials, or the ones it found were refused before any request (the
    message names what to set). Never retried: another try finds the same."""


class SaveCancelled(PreemptibleError):
    """An asynchronous save was abandoned on purpose (a notice left no time to finish it); nothing committed."""


class CoordinationError(PreemptibleError, RuntimeError):
    """Ranks could not coordinate through the store in time (a rank died, hung, or cannot reach the store)."""


class RankFailures(CoordinationError):
    """Ranks failed a round of the store (`preemptible.dist.Coordinator.failures`), or never reported in it: every
    rank raises this same error, naming each failing rank and why.

    Attributes:
        failures: ``(rank, reason)`` of each failing rank, in rank order.
    """

    def __init__(self, message: str, *, failures: Sequence[tuple[int, str]]) -> None:
        super().__init__(message)
        self.failures = list(failures)


class StateDivergenceError(PreemptibleError, ValueError):
    """State treated as replicated differs between ranks: saving it from rank 0 alone would lose the others'.

    Attributes:
        keys: the state entries that differ.
        ranks: the ranks whose digest differs from rank 0's.
    """

    def __init__(self, message: str, *, keys: Sequence[str], ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.keys = list(keys)
        self.ranks = list(ranks)


class LifecycleError(PreemptibleError, RuntimeError):
    """A checkpoint was asked to make a transition its state does not allow (a bug, never a storage fault).

    Attributes:
        state: the checkpoint's state; transition: what was asked.
    """

    def __init__(self, message: str, *, state: str, transition: str) -> None:
        super().__init__(message)
        self.state = state
        self.transition = transition


class CheckpointFallbackWarning(UserWarning):
    """Restore skipped a checkpoint that failed verification and fell back to an older one."""


__all__ = [
    "AlreadyCommittedError",
    "CheckpointCorruptError",
    "CheckpointFallbackWarning",
    "CheckpointNotFoundError",
    "CoordinationError",
    "FileTooLargeError",
    "LifecycleError",
    "NotRegularFileError",
    "NoticeSourceError",
    "OutsideRootError",
    "PreemptibleError",
    "ProbeError",
    "RankFailures",
    "SaveCancelled",
    "SaveError",
    "StateDivergenceError",
    "StateMismatchError",
    "StorageCredentialsError",
    "StorageUnavailableError",
    "UnsupportedStateError",
]
