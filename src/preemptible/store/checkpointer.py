"""Checkpointer: save, list, verify and restore committed checkpoints under one root.

The commit protocol (DESIGN.md): data files go straight into ``step-N/``, each made durable; ``COMMIT.json``
is published last. A directory without it is invisible to restore. Restore verifies every checksum *before*
touching the live objects, so a bad checkpoint never half-loads, and falls back to the next newest one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from preemptible import dist
from preemptible.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    SaveError,
    StateMismatchError,
)
from preemptible.journal import Journal
from preemptible.notice import Clock
from preemptible.state import RNGState, apply, capture, check_state, differences, flatten, unflatten
from preemptible.store import checksum, layout, retention
from preemptible.store import format as tensor_format
from preemptible.store.io import FileTooLargeError, Storage, storage_for
from preemptible.store.layout import CheckpointInfo, FileRecord, Manifest
from preemptible.writer import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_THREADS,
    plan_files,
    state_json,
    write_bytes,
    write_files,
)

log = logging.getLogger("preemptible")

STALE_AFTER_S = 15 * 60
"""Uncommitted leftovers younger than this may belong to a machine still inside its notice window."""


class CheckpointFallbackWarning(UserWarning):
    """Restore skipped a checkpoint that failed verification and fell back to an older one."""


@dataclass(frozen=True, kw_only=True)
class SaveResult:
    """What a finished save did.

    Attributes:
        step: the step saved.
        path: its directory.
        bytes: bytes written (0 when the step was already committed).
        seconds: wall time from the call to the commit.
        timings: seconds by phase (capture, write, commit).
        skipped: True when the step was already committed and nothing was written.
    """

    step: int
    path: str
    bytes: int
    seconds: float
    timings: Mapping[str, float] = field(default_factory=dict)
    skipped: bool = False

    @property
    def throughput(self) -> float:
        """Bytes per second (0 when skipped)."""
        return self.bytes / self.seconds if self.seconds > 0 and not self.skipped else 0.0


class SaveHandle:
    """A save in progress or done: ``done()``, ``wait()`` (re-raises the save's own exception)."""

    def __init__(self, step: int, *, result: SaveResult | None = None, error: BaseException | None = None) -> None:
        self.step = step
        self._result = result
        self._error = error

    def done(self) -> bool:
        return self._result is not None or self._error is not None

    def wait(self, timeout: float | None = None) -> SaveResult:
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    @property
    def result(self) -> SaveResult | None:
        return self._result


class Checkpointer:
    """Saves and restores training state under ``root``.

    Args:
        root: a local directory (created on first save).
        keep: committed checkpoints to keep (>= 2), besides the newest validated one.
        journal: where to record saves and fallbacks (optional).
        threads: writer threads for tensor files.
        max_file_bytes: split tensor files larger than this.
        stale_after_s: uncommitted leftovers older than this are deleted; younger ones are left alone.
        clock: epoch seconds. monotonic: a monotonic clock for durations.
    """

    def __init__(
        self,
        root: str,
        *,
        keep: int = 2,
        journal: Journal | None = None,
        threads: int = DEFAULT_THREADS,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        stale_after_s: float = STALE_AFTER_S,
        storage_options: dict[str, Any] | None = None,
        clock: Clock = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep < 2:
            raise ValueError(
                f"expected keep >= 2 (the previous checkpoint must stay until the newest has validated), found {keep}"
            )
        self.storage: Storage = storage_for(root, storage_options)
        self.root = self.storage.root
        self.keep = keep
        self.journal = journal
        self.threads = threads
        self.max_file_bytes = max_file_bytes
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._monotonic = monotonic
        self._writing: set[int] = set()

    def __repr__(self) -> str:
        return f"Checkpointer({self.root!r}, keep={self.keep})"

    # paths -------------------------------------------------------------------------------------------------
    def path_of(self, step: int) -> str:
        return self.storage.join(self.root, layout.step_dir(step))

    def _commit_path(self, step: int) -> str:
        return self.storage.join(self.path_of(step), layout.COMMIT)

    def is_committed(self, step: int) -> bool:
        return self.storage.exists(self._commit_path(step))

    def _event(self, event: str, step: int | None, **fields: Any) -> None:
        if self.journal is not None:
            self.journal.event(event, step, **fields)

    # listing -----------------------------------------------------------------------------------------------
    def checkpoints(self, *, include_uncommitted: bool = False) -> list[CheckpointInfo]:
        """Every committed checkpoint under the root, oldest first (and leftovers, if asked)."""
        out = []
        for name in self.storage.listdir(self.root):
            step = layout.parse_step_dir(name)
            if step is None:
                continue
            path = self.storage.join(self.root, name)
            if not self.storage.isdir(path):
                continue
            info = self._info(step, path)
            if info.committed or include_uncommitted:
                out.append(info)
        return sorted(out, key=lambda c: c.step)

    def _info(self, step: int, path: str) -> CheckpointInfo:
        commit = self.storage.join(path, layout.COMMIT)
        if not self.storage.exists(commit):
            size = 0
            for name in self.storage.listdir(path):
                with contextlib.suppress(OSError):
                    size += self.storage.size(self.storage.join(path, name))
            return CheckpointInfo(step=step, path=path, committed=False, bytes=size)
        validated = self.storage.exists(self.storage.join(path, layout.VALID))
        try:
            manifest = self._manifest(step)
        except CheckpointCorruptError as e:
            return CheckpointInfo(step=step, path=path, committed=True, validated=validated, error=str(e))
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
        )

    def latest(self) -> int | None:
        """The newest committed step, or None."""
        infos = self.checkpoints()
        return infos[-1].step if infos else None

    def _manifest(self, step: int) -> Manifest:
        where = self._commit_path(step)
        try:
            raw = self.storage.read_bytes(where, layout.MAX_MANIFEST_BYTES)
        except FileTooLargeError as e:
            raise CheckpointCorruptError(f"{where}: {e}", path=where, step=step) from e
        except FileNotFoundError as e:
            raise CheckpointNotFoundError(
                f"no committed checkpoint of step {step} under {self.root}: {layout.COMMIT} is missing",
                path=where,
                step=step,
            ) from e
        return Manifest.from_json(raw, where=where, expect_step=step)

    # saving ------------------------------------------------------------------------------------------------
    def save(
        self,
        state: Mapping[str, Any],
        step: int,
        *,
        blocking: bool = True,
        reason: str = "manual",
        deadline: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> SaveHandle:
        """Write ``state`` as the checkpoint of ``step`` and commit it.

        A step that is already committed is not written again (``SaveResult.skipped``). Uncommitted leftovers of
        the same step are removed first.

        Args:
            state: names to stateful objects or dicts (see `preemptible.state`).
            step: completed steps (the next step to run after a restore).
            blocking: only True is supported by this version; the save is finished when this returns.
            reason: recorded in the journal: ``periodic``, ``emergency``, ``final``, ``manual``.
            deadline: epoch seconds by which the save must be durable, for the journal's budget figures.
            extra: additional JSON keys for COMMIT.json.

        Raises:
            SaveError: an I/O failure (disk full, permission); nothing was committed.
            UnsupportedStateError: a leaf that cannot be stored, naming its key.
        """
        if not blocking:
            raise NotImplementedError(
                "blocking=False needs the staging writer, which this version does not have; use blocking=True"
            )
        check_state(state)
        start = self._monotonic()
        path = self.path_of(step)
        if self.is_committed(step):
            self._event("save_skipped", step, reason=reason, why="already committed")
            return SaveHandle(step, result=SaveResult(step=step, path=path, bytes=0, seconds=0.0, skipped=True))
        budget = deadline - self._clock() if deadline is not None else None
        self._event("save_started", step, reason=reason, budget_s=budget)
        self._writing.add(step)
        try:
            result = self._write(state, step, path, start, extra or {})
        except BaseException as e:
            self._abandon(path)
            self._event("save_failed", step, reason=reason, error=f"{type(e).__name__}: {e}")
            if isinstance(e, OSError) and not isinstance(e, SaveError):
                raise self._save_error(e, step, path) from e
            raise
        finally:
            self._writing.discard(step)
        remaining = deadline - self._clock() if deadline is not None else None
        self._event(
            "save_committed",
            step,
            reason=reason,
            bytes=result.bytes,
            seconds=round(result.seconds, 6),
            throughput_mb_s=round(result.throughput / 1e6, 3),
            timings={k: round(v, 6) for k, v in result.timings.items()},
            budget_s=budget,
            remaining_s=remaining,
        )
        self.rotate()
        return SaveHandle(step, result=result)

    def _write(
        self, state: Mapping[str, Any], step: int, path: str, start: float, extra: Mapping[str, Any]
    ) -> SaveResult:
        captured = capture(state)
        flat = flatten(captured)
        t_capture = self._monotonic()
        if self.storage.exists(path):
            log.info("removing uncommitted leftovers of step %d at %s before writing it again", step, path)
            self.storage.remove_tree(path)
        self.storage.makedirs(path)
        self.storage.sync_dir(self.root)
        specs = plan_files(flat, max_file_bytes=self.max_file_bytes)
        records: dict[str, FileRecord] = write_files(self.storage, path, specs, threads=self.threads)
        records[layout.STATE] = write_bytes(self.storage, path, layout.STATE, state_json(flat))
        self.storage.sync_dir(path)
        t_write = self._monotonic()
        timings = {"capture": t_capture - start, "write": t_write - t_capture, "total": t_write - start}
        manifest = Manifest(
            step=step,
            created=layout.now_iso(self._clock()),
            world_size=dist.world_size(),
            checksum_algorithm=checksum.ALGORITHM,
            files=records,
            timings={k: round(v, 6) for k, v in timings.items()},
            extra=dict(extra),
        )
        self.storage.publish(self._commit_path(step), manifest.to_json())
        end = self._monotonic()
        timings["commit"] = end - t_write
        timings["total"] = end - start
        return SaveResult(step=step, path=path, bytes=manifest.total_bytes, seconds=end - start, timings=timings)

    def _abandon(self, path: str) -> None:
        try:
            self.storage.remove_tree(path)
        except OSError as e:  # leftovers are harmless: invisible without COMMIT.json, cleaned later
            log.warning("could not remove the failed save's leftovers at %s (%s)", path, e)

    def _save_error(self, e: OSError, step: int, path: str) -> SaveError:
        newest = self.latest()
        kept = f"step {newest} remains the newest checkpoint" if newest is not None else "no earlier checkpoint exists"
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                free = shutil.disk_usage(self.root).free
                space = f"{free / 1e6:.1f} MB free now"
            except OSError:
                space = "free space unknown"
            what = (
                f"no space left while writing step {step} to {path} ({space}); nothing was committed and "
                f"{kept}. Free space, lower keep=, or point the root at a larger volume"
            )
        else:
            what = (
                f"writing step {step} to {path} failed: {e}; nothing was committed and {kept}. Check that the "
                "root is writable and mounted"
            )
        return SaveError(what, path=path, step=step)

    # rotation and cleanup ----------------------------------------------------------------------------------
    def rotate(self) -> list[int]:
        """Delete committed checkpoints beyond the retention policy and stale leftovers. Returns deleted steps."""
        infos = self.checkpoints(include_uncommitted=True)
        kept = retention.keep_steps(infos, self.keep)
        deleted = []
        for info in infos:
            if info.committed and info.step not in kept:
                # IMPORTANT: the marker goes first, so a crash mid-delete leaves an invisible leftover, never a
                # committed checkpoint with missing files.
                self.storage.remove(self.storage.join(info.path, layout.VALID))
                self.storage.remove(self.storage.join(info.path, layout.COMMIT))
                self.storage.remove_tree(info.path)
                deleted.append(info.step)
        deleted += self.cleanup(infos)
        if deleted:
            self._event("rotated", None, deleted=deleted, kept=sorted(kept))
        return deleted

    def cleanup(self, infos: list[CheckpointInfo] | None = None) -> list[int]:
        """Delete uncommitted leftovers older than ``stale_after_s``; younger ones may still be being written."""
        if infos is None:
            infos = self.checkpoints(include_uncommitted=True)
        leftovers = [c for c in infos if not c.committed]
        mtimes = {c.step: self.storage.newest_mtime(c.path) for c in leftovers}
        stale = retention.stale_leftovers(
            leftovers, mtimes, now=self._clock(), older_than_s=self.stale_after_s, protect=self._writing
        )
        for step in stale:
            log.info("removing stale uncommitted leftovers of step %d (older than %.0f s)", step, self.stale_after_s)
            self.storage.remove_tree(self.path_of(step))
        return stale

    # loading -----------------------------------------------------------------------------------------------
    def load(self, step: int) -> dict[str, Any]:
        """Read and fully verify checkpoint ``step`` into fresh objects (nothing live is touched).

        Raises:
            CheckpointNotFoundError: no committed checkpoint of that step.
            CheckpointCorruptError: anything fails verification, naming the file and the reason.
        """
        manifest = self._manifest(step)
        directory = self.path_of(step)

        def bad(why: str) -> CheckpointCorruptError:
            return CheckpointCorruptError(f"checkpoint of step {step} at {directory}: {why}", path=directory, step=step)

        if manifest.checksum_algorithm != checksum.ALGORITHM:
            raise bad(
                f"checksum algorithm {manifest.checksum_algorithm!r} is unknown here (expected "
                f"{checksum.ALGORITHM!r}); upgrade preemptible"
            )
        if layout.STATE not in manifest.files:
            raise bad(f"the manifest lists no {layout.STATE}")
        for name, rec in manifest.files.items():
            p = self.storage.join(directory, name)
            if not self.storage.exists(p):
                raise bad(f"file {name} listed in COMMIT.json is missing")
            size = self.storage.size(p)
            if size != rec.bytes:
                raise bad(f"file {name} is {size} bytes, COMMIT.json records {rec.bytes} (truncated or replaced)")
        tensors: dict[str, Any] = {}
        for name, rec in manifest.files.items():
            if not name.endswith(layout.TENSOR_SUFFIX):
                continue
            p = self.storage.join(directory, name)
            stream = self.storage.open_read(p)
            try:
                part = tensor_format.read(stream, rec.bytes, where=p, expected_checksum=rec.checksum)
            except CheckpointCorruptError as e:
                raise bad(str(e)) from e
            finally:
                stream.close()
            clash = tensors.keys() & part.keys()
            if clash:
                raise bad(f"tensor {sorted(clash)[0]!r} appears in more than one file")
            tensors.update(part)
        rec = manifest.files[layout.STATE]
        p = self.storage.join(directory, layout.STATE)
        raw = self.storage.read_bytes(p, max(rec.bytes, 0))
        found = checksum.of_bytes(raw)
        if found != rec.checksum:
            raise bad(f"{layout.STATE} checksum mismatch: COMMIT.json records {rec.checksum}, file hashes to {found}")
        try:
            doc = json.loads(raw)
            tree, numpy_names = doc["tree"], set(doc.get("numpy", []))
        except (ValueError, KeyError, TypeError) as e:
            raise bad(f"{layout.STATE} is not a preemptible state document ({e})") from e
        try:
            loaded = unflatten(tree, tensors, numpy_names)
        except CheckpointCorruptError as e:
            raise bad(str(e)) from e
        if not isinstance(loaded, dict):
            raise bad(f"{layout.STATE} holds a {type(loaded).__name__}, expected an object of state entries")
        return loaded

    def verify(self, step: int) -> CheckpointInfo:
        """Fully verify checkpoint ``step`` (manifest, sizes, checksums) and mark it validated.

        Raises:
            CheckpointNotFoundError, CheckpointCorruptError.
        """
        self.load(step)
        self._mark_valid(step, by="verify")
        return self._info(step, self.path_of(step))

    def _mark_valid(self, step: int, *, by: str) -> None:
        doc = {"validated_at": layout.now_iso(self._clock()), "by": by, "checksums": True, "probe": None}
        try:
            self.storage.publish(self.storage.join(self.path_of(step), layout.VALID), json.dumps(doc).encode())
        except OSError as e:
            log.warning("could not record that step %d validated (%s); it stays unvalidated", step, e)

    def restore(self, state: Mapping[str, Any], step: int | None = None) -> int | None:
        """Load the newest committed checkpoint that verifies into ``state``, in place.

        Every entry of ``state`` must be in the checkpoint (extra entries in the checkpoint are ignored), with
        matching tensor keys, shapes and dtypes. A checkpoint that fails verification is skipped with a
        `CheckpointFallbackWarning`, and the next newest is tried.

        Args:
            state: names to stateful objects or dicts, as given to `save`.
            step: restore exactly this step (no fallback).

        Returns:
            The restored step, or None when the root holds no committed checkpoint.

        Raises:
            CheckpointCorruptError: committed checkpoints exist but none verifies (lists each and why).
            CheckpointNotFoundError: ``step`` was given and is not committed.
            StateMismatchError: the checkpoint does not fit the live objects (names every difference).
        """
        check_state(state)
        if step is not None:
            candidates = [step]
            if not self.is_committed(step):
                have = [c.step for c in self.checkpoints()]
                raise CheckpointNotFoundError(
                    f"no committed checkpoint of step {step} under {self.root}; committed steps: {have or 'none'}",
                    path=self.path_of(step),
                    step=step,
                )
        else:
            candidates = [c.step for c in reversed(self.checkpoints())]
        if not candidates:
            return None
        failures: list[tuple[int, str]] = []
        for candidate in candidates:
            t0 = self._monotonic()
            try:
                loaded = self.load(candidate)
            except CheckpointCorruptError as e:
                failures.append((candidate, str(e)))
                self._event("checkpoint_invalid", candidate, error=str(e))
                if step is not None:
                    raise
                warnings.warn(
                    f"skipping the checkpoint of step {candidate}: {e}; trying the next newest",
                    CheckpointFallbackWarning,
                    stacklevel=2,
                )
                continue
            self._check_fits(state, loaded, candidate)
            apply(state, loaded)
            self._mark_valid(candidate, by="restore")
            self._event(
                "restored", candidate, seconds=round(self._monotonic() - t0, 6), skipped=[s for s, _ in failures]
            )
            return candidate
        lines = "\n".join(f"  step {s}: {why}" for s, why in failures)
        raise CheckpointCorruptError(
            f"none of the {len(failures)} committed checkpoints under {self.root} verifies:\n{lines}\n"
            "Nothing was loaded. Restore from a backup, or move the root aside to start fresh deliberately.",
            path=self.root,
            failures=failures,
        )

    def _check_fits(self, state: Mapping[str, Any], loaded: Mapping[str, Any], step: int) -> None:
        missing = [name for name in state if name not in loaded]
        diffs = [f"{name}: missing from checkpoint (it holds {sorted(loaded)})" for name in missing]
        for name, obj in state.items():
            if name in loaded and not isinstance(obj, (dict, RNGState)):
                diffs += differences(capture({name: obj}), {name: loaded[name]})
        if diffs:
            shown = "\n".join(f"  {d}" for d in diffs[:50])
            more = f"\n  ... and {len(diffs) - 50} more" if len(diffs) > 50 else ""
            raise StateMismatchError(
                f"the checkpoint of step {step} at {self.path_of(step)} does not fit the live objects "
                f"({len(diffs)} difference{'s' if len(diffs) != 1 else ''}):\n{shown}{more}\n"
                "Build the model and optimizer exactly as when the checkpoint was saved, or start a new root.",
                path=self.path_of(step),
                step=step,
                differences=diffs,
            )
