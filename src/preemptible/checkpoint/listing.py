"""What a checkpoint root holds: its step directories, committed or not, each described by a `CheckpointInfo`.

Read only: nothing here writes to the root. `Checkpointer.checkpoints` and the lifecycle (`Lifecycle`) list
through it.
"""

from __future__ import annotations

import contextlib

from preemptible.checkpoint.reader import Reader
from preemptible.errors import CheckpointCorruptError, CheckpointNotFoundError, NotRegularFileError
from preemptible.store import layout
from preemptible.store.io import Storage
from preemptible.store.layout import CheckpointInfo
from preemptible.store.markers import Markers, State


class Listing:
    """The checkpoints under ``root`` on ``storage``, as its markers and manifests describe them."""

    def __init__(self, storage: Storage, root: str, *, markers: Markers, reader: Reader) -> None:
        self.storage = storage
        self.root = root
        self.markers = markers
        self.reader = reader

    def path_of(self, step: int) -> str:
        return self.storage.join(self.root, layout.step_dir(step))

    def files_dir(self, step: int) -> str:
        """Where the files of committed checkpoint ``step`` are (see `Checkpointer.files_dir`)."""
        return self.reader.manifest(step).file_dir(self.storage.join, self.path_of(step))

    def is_committed(self, step: int) -> bool:
        return self.storage.exists(self.storage.join(self.path_of(step), layout.COMMIT))

    def latest(self) -> int | None:
        """The newest committed step, or None."""
        infos = self.checkpoints()
        return infos[-1].step if infos else None

    def checkpoints(self, *, include_uncommitted: bool = False) -> list[CheckpointInfo]:
        """Every committed checkpoint under the root, oldest first (and leftovers, if asked)."""
        out: list[CheckpointInfo] = []
        for name in self.storage.listdir(self.root):
            out += self._entry(name, include_uncommitted=include_uncommitted)
        return sorted(out, key=lambda c: (c.step, c.committed))

    def _entry(self, name: str, *, include_uncommitted: bool) -> list[CheckpointInfo]:
        """What the root's entry ``name`` adds to the listing (nothing, for a name that is no checkpoint's)."""
        step = layout.parse_step_dir(name)
        attempt = layout.parse_attempt_dir(name)
        if step is None and attempt is None:
            return []
        path = self.storage.join(self.root, name)
        target = self.storage.escapes(path)
        if target is not None:
            return [self._refused(name, path, target, step or attempt or 0)] if include_uncommitted else []
        if not self.storage.isdir(path):
            return []
        if attempt is not None:  # a local save attempt that never got renamed into place
            if not include_uncommitted:
                return []
            return [CheckpointInfo(step=attempt, path=path, committed=False, bytes=self.bytes_in(path))]
        assert step is not None
        out = []
        info = self.info(step, path)
        if info.committed or include_uncommitted:
            out.append(info)
        if include_uncommitted and info.manifest is not None and info.manifest.prefix:
            out += self._losing_attempts(info)
        return out

    def _refused(self, name: str, path: str, target: str, step: int) -> CheckpointInfo:
        """An entry that is a link: listed as refused, never read, restored or deleted through."""
        where = "inside the root" if target.startswith(self.root.rstrip("/") + "/") else "outside the root"
        why = f"{name} is a link to {target}, {where}: never read, restored or deleted through"
        return CheckpointInfo(step=step, path=path, committed=False, refused=why)

    def bytes_in(self, path: str) -> int:
        size = 0
        for name in self.storage.listdir(path):
            with contextlib.suppress(OSError):
                size += self.storage.size(self.storage.join(path, name))
        return size

    def _losing_attempts(self, info: CheckpointInfo) -> list[CheckpointInfo]:
        """Object stores: attempt prefixes under a committed step that its COMMIT.json does not name."""
        assert info.manifest is not None
        return [
            CheckpointInfo(step=info.step, path=p, committed=False, bytes=self.bytes_in(p))
            for name in self.storage.listdir(info.path)
            if layout.PREFIX_RE.fullmatch(name) and name != info.manifest.prefix
            for p in [self.storage.join(info.path, name)]
        ]

    def info(self, step: int, path: str) -> CheckpointInfo:
        """Checkpoint ``step`` at ``path``, as its markers and manifest describe it."""
        try:
            verdict = self.markers.read(path)
        except NotRegularFileError as e:  # COMMIT.json itself a link out of the root, or not a file
            return CheckpointInfo(step=step, path=path, committed=True, error=str(e))
        if verdict.state is State.UNCOMMITTED:
            return CheckpointInfo(step=step, path=path, committed=False, bytes=self.bytes_in(path))
        validated = verdict.state is State.VALIDATED
        try:
            manifest = self.reader.manifest(step)
        except CheckpointCorruptError as e:
            return CheckpointInfo(
                step=step, path=path, committed=True, validated=validated, error=str(e), invalid=verdict.invalid_reason
            )
        except CheckpointNotFoundError:  # deleted a moment ago (rotation): no longer a checkpoint
            return CheckpointInfo(step=step, path=path, committed=False)
        return CheckpointInfo(
            step=step,
            path=path,
            committed=True,
            validated=validated,
            bytes=manifest.total_bytes,
            created=manifest.created,
            save_s=manifest.timings.get("total"),
            predicted_save_s=manifest.predicted_save_s,
            manifest=manifest,
            invalid=verdict.invalid_reason,
        )
