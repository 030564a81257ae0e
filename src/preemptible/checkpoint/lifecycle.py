"""The lifecycle operations of a `Checkpointer`: verify, rotate, clean up, quarantine.

The states and their files are `preemptible.store.markers`'; which checkpoints may go is
`preemptible.store.retention`'s pure policy; deleting is `preemptible.store.deletion`'s. `Lifecycle` applies them
to one root.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Set

from preemptible.checkpoint import shards as shard_records
from preemptible.checkpoint.commit import Job, read_back
from preemptible.checkpoint.listing import Listing
from preemptible.checkpoint.reader import Reader
from preemptible.errors import CheckpointCorruptError, SaveError
from preemptible.events import Event, EventSink
from preemptible.store import deletion, layout, retention
from preemptible.store.io import Storage
from preemptible.store.layout import CheckpointInfo
from preemptible.store.markers import Markers, State, Transition

log = logging.getLogger("preemptible")


class Lifecycle:
    """Verification, retention, cleanup and quarantine of the checkpoints under one root.

    ``writing``: the steps this process is saving now (never cleaned up as stale); ``now``: the time as the
    markers record it; ``clock``: epoch seconds.
    """

    def __init__(
        self,
        storage: Storage,
        root: str,
        *,
        listing: Listing,
        markers: Markers,
        reader: Reader,
        events: EventSink,
        keep: int,
        keep_best: tuple[str, str] | None,
        stale_after_s: float,
        writing: Set[int],
        clock: Callable[[], float],
    ) -> None:
        self.storage = storage
        self.root = root
        self.listing = listing
        self.markers = markers
        self.reader = reader
        self.events = events
        self.keep = keep
        self.keep_best = keep_best
        self.stale_after_s = stale_after_s
        self._writing = writing
        self._clock = clock

    def _now(self) -> str:
        return layout.now_iso(self._clock())

    def validate_at_save(self, job: Job) -> None:
        """Verify a checkpoint just saved (its files read back from storage) when older ones wait for it."""
        directory = job.path
        try:
            manifest = self.reader.manifest(job.step)
            if "read_back" not in job.timings:  # verify_after_save already read everything back before the commit
                read_back(self.storage, manifest.file_dir(self.storage.join, directory), manifest.files, step=job.step)
        except (CheckpointCorruptError, SaveError) as e:
            self.events.event(Event.CHECKPOINT_INVALID, job.step, error=str(e))
            self.markers.record(directory, Transition.CONTENT_FAIL, now=self._now(), reason=str(e), by="save")
            return
        except OSError as e:
            self.events.event(Event.CHECKPOINT_UNVERIFIED, job.step, error=f"{type(e).__name__}: {e}")
            return
        probe = (
            {"stored": manifest.probe, "computed": "at save, on the weights saved"}
            if manifest.probe is not None
            else None
        )
        self.markers.record(directory, Transition.VERIFY_PASS, now=self._now(), by="save", probe=probe)
        self.events.event(Event.VALIDATED, job.step, by="save")

    def rotate(self, *, just_saved: Job | None = None) -> list[int]:
        """Apply retention (`preemptible.store.retention`): delete committed checkpoints it allows to go, and stale
        leftovers. A checkpoint goes only once a newer one has validated; when older ones wait for that, the one
        ``just_saved`` is verified first (its files read back). Returns the deleted steps."""
        infos = self._vouched_only(self.listing.checkpoints(include_uncommitted=True))
        if just_saved is not None and retention.needs_validation(infos, self.keep, self.keep_best):
            newest = max((c for c in infos if c.committed), key=lambda c: c.step, default=None)
            if newest is not None and newest.step == just_saved.step and newest.status == "committed":
                self.validate_at_save(just_saved)
                infos = self._vouched_only(self.listing.checkpoints(include_uncommitted=True))
        decision = retention.decide(infos, self.keep, self.keep_best)
        by_step = {c.step: c for c in infos if c.committed}
        doomed = [s for s in decision.delete if not by_step[s].invalid or self._condemned_here(by_step[s])]
        states = {c.step: self.markers.read(c.path).state for c in infos if c.step in doomed}
        for step in doomed:
            deletion.delete_checkpoint(self.storage, self.root, step, states[step])
        deleted = doomed + self.cleanup(infos)
        if deleted:
            kept = sorted(c.step for c in infos if c.committed and c.step not in doomed)
            self.events.event(Event.ROTATED, None, deleted=deleted, kept=kept)
        return deleted

    def _vouched_only(self, infos: list[CheckpointInfo]) -> list[CheckpointInfo]:
        """``infos`` with "validated" (and "invalid") kept only where this process found so against the bytes:
        retention deletes on a verdict performed here, never on a marker read from storage alone (a forged, copied
        or stale VALID.json or INVALID.json)."""
        return [
            dataclasses.replace(c, validated=False) if c.validated and not self.markers.vouched(c.path) else c
            for c in infos
        ]

    def _condemned_here(self, info: CheckpointInfo) -> bool:
        """Whether checkpoint ``info``, marked invalid by its INVALID.json, fails a content check now, in this
        process (its bytes read and checked): rotation deletes an invalid checkpoint only then, never on a marker
        read from storage alone. A pass, or an I/O error, keeps it."""
        if self.markers.condemned(info.path):
            return True
        try:
            opened = self.reader.open(info.step)
            self.reader.rebuild(opened, self.reader.read_tensors(opened, None))
        except CheckpointCorruptError as e:
            self.markers.record(info.path, Transition.CONTENT_FAIL, now=self._now(), reason=str(e), by="rotation")
            return self.markers.condemned(info.path)
        except OSError:
            return False
        log.warning(
            "step %d is marked invalid (%s) but its files pass a check now: not deleted", info.step, info.invalid
        )
        return False

    def mark_finished(self, step: int) -> None:
        """Leave ``DONE.json`` in the root: the run finished all its steps (a wrapper tells "done" from "preempted")."""
        doc = json.dumps({"step": step, "finished": self._now()}).encode() + b"\n"
        self.storage.publish(self.storage.join(self.root, layout.DONE), doc)

    def clear_finished(self) -> None:
        """Remove ``DONE.json``: the run is training again."""
        self.storage.remove(self.storage.join(self.root, layout.DONE))

    def quarantine(self) -> str | None:
        """Move every checkpoint directory aside to ``<root>/quarantine/<utc>/`` (for a deliberate fresh start
        when none verifies: kept for inspection, out of the way of new saves). Returns where, or None."""
        infos = self.listing.checkpoints(include_uncommitted=True)
        if not infos:
            return None
        stamp = self._now().replace(":", "").replace("-", "")
        target = self.storage.join(self.root, "quarantine", stamp)
        self.storage.makedirs(target)
        for info in infos:
            self.storage.move(info.path, self.storage.join(target, info.path.rstrip("/").rsplit("/", 1)[-1]))
        self.storage.sync_dir(self.root)
        return target

    def cleanup(self, infos: list[CheckpointInfo] | None = None) -> list[int]:
        """Delete uncommitted leftovers older than ``stale_after_s``; younger ones may still be being written."""
        if infos is None:
            infos = self.listing.checkpoints(include_uncommitted=True)
        leftovers = [c for c in infos if not c.committed and c.refused is None]
        mtimes = {c.path: self.storage.newest_mtime(c.path) for c in leftovers}
        stale = retention.stale_leftovers(
            leftovers, mtimes, now=self._clock(), older_than_s=self.stale_after_s, protect=self._writing
        )
        for info in stale:
            log.info(
                "removing stale uncommitted leftovers of step %d at %s (older than %.0f s)",
                info.step,
                info.path,
                self.stale_after_s,
            )
            deletion.delete_leftover(self.storage, info.path)
        return sorted({info.step for info in stale})

    def verify_report(self, step: int, *, mark: bool = True) -> tuple[CheckpointInfo, list[str]]:
        """`verify`, plus notes that do not fail it (files the manifest does not list, a probe left to check)."""
        directory = self.listing.path_of(step)
        before = self.markers.read(directory)
        try:
            opened = self.reader.open(step)  # every rank's files; a sharded root's records and their cover checked
            # the bytes as stored (a sharded tensor: each rank's shard), no live state needed: nothing is placed
            self.reader.rebuild(opened, self.reader.read_tensors(opened, None))
        except CheckpointCorruptError as e:
            if mark and before.state is not State.UNCOMMITTED:
                self.markers.record(directory, Transition.CONTENT_FAIL, now=self._now(), reason=str(e), by="verify")
            raise
        notes = [shard_records.restorable(opened.shards, opened.manifest.world_size)]
        notes += [f"extra file not in COMMIT.json (ignored): {n}" for n in opened.extra_files]
        notes += [f"sharded tensor whose cover of the whole is not checked here: {u}" for u in opened.unchecked]
        if before.state is State.INVALID:
            notes.append(
                f"marked invalid earlier ({before.invalid_reason}); its files pass now, but a checkpoint that failed "
                "stays invalid: save the step again to replace it"
            )
        elif opened.manifest.probe is not None:
            notes.append("probe value stored: checked by the next restore, which has the model")
        elif mark:
            self.markers.record(directory, Transition.VERIFY_PASS, now=self._now(), by="verify", probe=None)
        return self.listing.info(step, directory), notes

    def verify(self, step: int, *, mark: bool = True) -> CheckpointInfo:
        """Fully verify checkpoint ``step``: manifest, sizes, headers, every checksum; record the verdict.

        A pass marks it validated, unless it carries a probe value (that needs the model: the next restore checks
        it, and until then it stays ``committed``). A content failure marks it invalid (removing any earlier
        ``VALID.json``). An I/O error marks nothing. ``mark=False`` leaves every file untouched.

        Raises:
            CheckpointNotFoundError, CheckpointCorruptError, OSError (could not verify).
        """
        return self.verify_report(step, mark=mark)[0]
