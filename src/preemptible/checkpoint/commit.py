"""The commit protocol: data files made durable, every rank's files reported through the store, then
``COMMIT.json`` published by rank 0 alone, last. A directory without it is invisible to restore.

Under several ranks this is a barrier (`preemptible.dist.Coordinator.exchange`): rank 0 commits only if every
rank reported its files durable within the timeout, and every rank learns the outcome. A dead rank means no
commit.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from preemptible import dist
from preemptible.checkpoint.handle import SaveResult
from preemptible.errors import SaveError
from preemptible.store import checksum, layout
from preemptible.store import format as tensor_format
from preemptible.store.io import Storage
from preemptible.store.layout import FileRecord, Manifest
from preemptible.writer import FileSpec, Progress, write_bytes, write_files

log = logging.getLogger("preemptible")


@dataclass
class Job:
    """One save on its way: what it writes and what it has measured so far."""

    step: int
    path: str
    reason: str
    start: float
    extra: dict[str, Any]
    budget: float | None
    deadline: float | None
    progress: Progress
    timings: dict[str, float] = field(default_factory=dict)
    probe: float | None = None
    key: str = "save/0"  # this save's round in the store (the same on every rank: saves happen in lockstep)


def _records_doc(records: Mapping[str, FileRecord]) -> dict[str, list[Any]]:
    return {n: [r.bytes, r.checksum] for n, r in records.items()}


def _records_from(doc: Mapping[str, list[Any]]) -> dict[str, FileRecord]:
    return {n: FileRecord(int(v[0]), str(v[1])) for n, v in doc.items()}


def read_back(storage: Storage, directory: str, records: Mapping[str, FileRecord], *, step: int) -> None:
    """Read every file back and check it hashes as written.

    Raises:
        SaveError: a file reads back differently (the storage altered it).
    """
    buf = memoryview(bytearray(tensor_format.READ_CHUNK_BYTES))
    for name, rec in records.items():
        stream = storage.open_read(storage.join(directory, name))
        hasher = checksum.new()
        try:
            while n := stream.readinto(buf):
                hasher.update(buf[:n])
        finally:
            stream.close()
        if hasher.hexdigest() != rec.checksum:
            raise SaveError(
                f"read-back verification of {name} in step {step} failed: written with checksum {rec.checksum}, "
                f"read back as {hasher.hexdigest()}; the storage altered it on the way. Check the disk or the mount",
                path=directory,
                step=step,
            )


class Committer:
    """Writes one save's files and commits it (see the module docs)."""

    def __init__(
        self,
        storage: Storage,
        root: str,
        *,
        coordinator: dist.Coordinator | None,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        verify_after_save: bool,
    ) -> None:
        self.storage = storage
        self.root = root
        self.coord = coordinator
        self._clock = clock
        self._monotonic = monotonic
        self.verify_after_save = verify_after_save

    def _prepare(self, job: Job, store: Any) -> None:
        """Rank 0 clears leftovers of the step and makes its directory; the others wait until it has."""
        coord = self.coord
        if coord is None or coord.rank == 0:
            if self.storage.exists(job.path):
                log.info("removing uncommitted leftovers of step %d at %s before writing it again", job.step, job.path)
                self.storage.remove_tree(job.path)
            self.storage.makedirs(job.path)
            self.storage.sync_dir(self.root)
            if store is not None:
                store.set(f"{job.key}/ready", str(job.step))
        else:
            coord.collect_one(store, f"{job.key}/ready")

    def write(
        self,
        job: Job,
        specs: list[FileSpec],
        docs: dict[str, bytes],
        blobs: dict[str, memoryview] | None,
        threads: int,
    ) -> SaveResult:
        t0 = self._monotonic()
        coord = self.coord
        store = coord.client() if coord is not None else None
        self._prepare(job, store)
        try:
            records: dict[str, FileRecord] = write_files(
                self.storage, job.path, specs, threads=threads, progress=job.progress, blobs=blobs
            )
            for name, doc in docs.items():
                records[name] = write_bytes(self.storage, job.path, name, doc)
            self.storage.sync_dir(job.path)
            if self.verify_after_save:
                t_read = self._monotonic()
                read_back(self.storage, job.path, records, step=job.step)
                job.timings["read_back"] = self._monotonic() - t_read
            job.progress.add(0)  # last chance to abandon before the commit point
        except BaseException as e:
            if store is not None and coord is not None:
                store.set(f"{job.key}/report/{coord.rank}", json.dumps({"error": f"{type(e).__name__}: {e}"}))
            raise
        t_write = self._monotonic()
        job.timings["write"] = t_write - t0
        world = 1
        if store is not None and coord is not None:
            # IMPORTANT: the commit barrier. Every rank reports its files as durable; rank 0 commits only if all
            # did, within the timeout; everyone learns the outcome. A dead rank means no commit.
            reports = [
                json.loads(x)
                for x in coord.exchange(store, f"{job.key}/report", json.dumps({"files": _records_doc(records)}))
            ]
            errors = [(r, x["error"]) for r, x in enumerate(reports) if "error" in x]
            if coord.rank != 0:
                outcome = coord.collect_one(store, f"{job.key}/outcome")
                if outcome != "committed":
                    raise SaveError(f"step {job.step} was not committed: {outcome}", path=job.path, step=job.step)
                job.timings["total"] = self._monotonic() - job.start
                return SaveResult(
                    step=job.step,
                    path=job.path,
                    bytes=sum(r.bytes for r in records.values()),
                    seconds=self._monotonic() - job.start,
                    timings=dict(job.timings),
                )
            if errors:
                why = "; ".join(f"rank {r}: {e}" for r, e in errors)
                store.set(f"{job.key}/outcome", f"rank(s) failed: {why}")
                raise SaveError(
                    f"step {job.step} was not committed, a rank failed: {why}", path=job.path, step=job.step
                )
            for x in reports:
                records.update(_records_from(x["files"]))
            world = coord.world
        return self._publish(job, records, world, store, t_write)

    def _publish(self, job: Job, records: dict[str, FileRecord], world: int, store: Any, t_write: float) -> SaveResult:
        timings = dict(job.timings)
        timings["total"] = t_write - job.start
        manifest = Manifest(
            step=job.step,
            created=layout.now_iso(self._clock()),
            world_size=world,
            checksum_algorithm=checksum.ALGORITHM,
            files=records,
            timings={k: round(v, 6) for k, v in timings.items()},
            predicted_save_s=job.extra.pop("predicted_save_s", None),
            probe=job.probe,
            extra=job.extra,
        )
        try:
            self.storage.publish(self.storage.join(job.path, layout.COMMIT), manifest.to_json())
        except BaseException as e:
            if store is not None:
                store.set(f"{job.key}/outcome", f"rank 0 could not write COMMIT.json: {e}")
            raise
        if store is not None:
            store.set(f"{job.key}/outcome", "committed")
        end = self._monotonic()
        timings["commit"] = end - t_write
        timings["total"] = end - job.start
        return SaveResult(
            step=job.step,
            path=job.path,
            bytes=manifest.total_bytes,
            seconds=end - job.start,
            timings=timings,
            predicted_s=manifest.predicted_save_s,
        )


def save_error(e: OSError, step: int, path: str, *, root: str, newest: int | None) -> SaveError:
    """The `SaveError` for an I/O failure while saving: what failed, what is still there, what to do."""
    kept = f"step {newest} remains the newest checkpoint" if newest is not None else "no earlier checkpoint exists"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = shutil.disk_usage(root).free
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
