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
    """Base class of every error raised by preemptible.

    Raised for misuse the other errors do not name (calling `Run.log` outside ``run.steps()``, say); catch it to catch
    every error of preemptible.

    What to do: the message says what was expected and what was found.
    """


class CheckpointNotFoundError(PreemptibleError, FileNotFoundError):
    """A requested checkpoint (or the root itself) does not exist or is not committed.

    Raised by a restore or `load` of a step that is not there, or of a root that holds no committed checkpoint.

    What to do: check the root's path (``preemptible inspect ROOT`` lists its checkpoints), or leave ``step`` out for
    the newest.
    """

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

    Raised by a restore, `load`, ``verify`` or ``export`` when a checkpoint fails its checks; a restore first falls back
    to older checkpoints and raises only when none verifies.

    What to do: run ``preemptible verify ROOT`` to see every failing file and why; restore an older step (``step=``), or
    start fresh with ``allow_fresh_start=True`` if nothing under the root can be trusted.
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

    Raised by a restore before any live tensor changes, when the checkpoint does not fit the live objects.

    What to do: restore into the same model and optimizer shapes (the message lists every difference), or load the
    checkpoint with `load` and adapt it by hand.
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

    Raised at a save by a state leaf that cannot be stored (a lambda, an open file, a tensor dtype with no stored form).

    What to do: leave that object out of the state, or give its owner ``state_dict()``/``load_state_dict()`` that return
    plain values; the message names the key path.
    """

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class SaveError(PreemptibleError, OSError):
    """A save failed; nothing was committed and earlier checkpoints are intact.

    Attributes:
        path: the directory of the checkpoint that was being written.
        step: its step.

    Raised by a save that failed (storage full or unreachable, a write error), blocking or from `SaveHandle.wait`.

    What to do: fix the storage the message names (space, credentials, the mount); training may go on, and the next save
    tries again; ``preemptible plan ROOT`` measures the storage.
    """

    def __init__(self, message: str, *, path: str, step: int) -> None:
        super().__init__(message)
        self.path = path
        self.step = step

    def __str__(self) -> str:
        return str(self.args[0])


class AlreadyCommittedError(SaveError):
    """Another process committed the same step while this save was writing it: this attempt is dropped, the
    committed checkpoint is left untouched.

    Raised by a save of a step another process (another rank, a restarted job sharing the root) committed first.

    What to do: nothing for the checkpoint (the committed one is whole); give each job its own root, and check that only
    one launch writes to this one.
    """


class NoticeSourceError(PreemptibleError, ValueError):
    """A notice source was named or configured wrongly (unknown name, bad signal, wrong thread).

    Raised by `Run`, `Guard` and ``preemptible run`` when ``sources`` names an unknown source, a bad signal, or a source
    is started off the main thread.

    What to do: use the names the message lists (``signal``, ``aws``, ``gcp``, ``azure``, ``slurm``, ...), and create
    `Run` in the main thread.
    """


class ProbeError(PreemptibleError, ValueError):
    """The probe did not return a number (a float, or a tensor of one element).

    Raised at a save or a restore when ``probe=`` returned something other than a number.

    What to do: make the probe return a float (``loss.item()``) or a one-element tensor.
    """


class FileTooLargeError(PreemptibleError, ValueError):
    """A file read from storage is larger than the bound its reader allows (a tampered or wrong file).

    Raised by any reader of a checkpoint or journal that meets a file larger than its bound allows.

    What to do: the file is not one preemptible wrote (tampered with, or another tool's): remove it, or restore another
    step.
    """


class NotRegularFileError(PreemptibleError, ValueError):
    """A path that must be a plain file is a directory, a FIFO, a device or a socket (a tampered checkpoint).

    Raised by a reader that finds a directory, a FIFO, a device or a socket where a checkpoint's file must be.

    What to do: the checkpoint was tampered with or damaged: restore another step; ``preemptible verify ROOT`` names
    every such file.
    """


class OutsideRootError(NotRegularFileError):
    """A path under the checkpoint root resolves (through a symbolic link) to a place outside it: preemptible never
    reads, writes or deletes through it.

    Raised when a path under the root leads outside it through a symbolic link: nothing is read, written or deleted
    through it.

    What to do: replace the link with the directory itself, or point the root at the real directory.
    """


class StorageUnavailableError(PreemptibleError, ImportError):
    """The fsspec backend for a URL is not installed.

    Raised at once by a URL root whose fsspec backend is not installed.

    What to do: run the ``pip install`` line the message gives (``'preemptible[s3]'``, ``[gcs]`` or ``[azure]``).
    """


class StorageCredentialsError(PreemptibleError, PermissionError):
    """An object store's client found no credentials, or the ones it found were refused before any request (the
    message names what to set). Never retried: another try finds the same.

    Raised by an object-store root (``s3://``, ``gs://``, ``az://``) whose client found no credentials or had them
    refused.

    What to do: set what the message names (``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``,
    ``AZURE_STORAGE_CONNECTION_STRING``, or ``storage_options=``).
    """


class SaveCancelled(PreemptibleError):
    """An asynchronous save was abandoned on purpose (a notice left no time to finish it); nothing committed.

    Raised from `SaveHandle.wait` of an asynchronous save a notice abandoned to make room for the emergency save.

    What to do: nothing: the emergency save that replaced it commits a newer step.
    """


class CoordinationError(PreemptibleError, RuntimeError):
    """Ranks could not coordinate through the store in time (a rank died, hung, or cannot reach the store).

    Raised when the ranks of a job could not agree through the job's store in time (a stop step, a restore, a save's
    commit).

    What to do: look for the rank that went away (its log, ``preemptible diagnose`` over the ranks' logs); restart the
    job: every rank resumes from the newest checkpoint all of them verify. ``Run(peer_timeout_s=)`` sets how long to
    wait.
    """


class RankFailures(CoordinationError):
    """Ranks failed a round of the store (`preemptible.dist.Coordinator.failures`), or never reported in it: every
    rank raises this same error, naming each failing rank and why.

    Attributes:
        failures: ``(rank, reason)`` of each failing rank, in rank order.

    Raised on every rank of a job when a coordinated round (a save's commit, a restore) failed on some ranks.

    What to do: read each rank's reason in the message (``failures``); fix that rank's cause (storage, memory); the
    round left no partial checkpoint.
    """

    def __init__(self, message: str, *, failures: Sequence[tuple[int, str]]) -> None:
        super().__init__(message)
        self.failures = list(failures)


class StateDivergenceError(PreemptibleError, ValueError):
    """State treated as replicated differs between ranks: saving it from rank 0 alone would lose the others'.

    Attributes:
        keys: the state entries that differ.
        ranks: the ranks whose digest differs from rank 0's.

    Raised at a save when state that should be the same on every rank (a replicated model under DDP) differs between
    ranks.

    What to do: find why the ranks diverged (a rank-dependent seed, a non-synchronised buffer); state that is meant to
    differ goes in ``per_rank``.
    """

    def __init__(self, message: str, *, keys: Sequence[str], ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.keys = list(keys)
        self.ranks = list(ranks)


class LifecycleError(PreemptibleError, RuntimeError):
    """A checkpoint was asked to make a transition its state does not allow (a bug, never a storage fault).

    Attributes:
        state: the checkpoint's state; transition: what was asked.

    Raised on a transition a checkpoint's state does not allow (marking an uncommitted checkpoint valid, say): a bug,
    never a storage fault.

    What to do: report it with the traceback and ``preemptible inspect ROOT``; the checkpoints on storage are not
    changed by it.
    """

    def __init__(self, message: str, *, state: str, transition: str) -> None:
        super().__init__(message)
        self.state = state
        self.transition = transition


class CheckpointFallbackWarning(UserWarning):
    """Restore skipped a checkpoint that failed verification and fell back to an older one.

    Warned by a restore or `load` that skipped the newest checkpoint.

    What to do: nothing to resume (the older checkpoint verified); look at why the newest failed (``preemptible verify
    ROOT``, the journal's ``checkpoint_invalid`` event) before the next preemption: bad storage or a save cut short.
    """


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
