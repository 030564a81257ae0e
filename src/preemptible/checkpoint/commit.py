"""The commit protocol: data files made durable, every rank's files reported through the store, then the commit,
by rank 0 alone, last. A directory without ``COMMIT.json`` is invisible to restore.

Each save attempt writes into a place of its own, so that no process ever writes into a committed checkpoint
(two machines on one root: a reclaimed one still saving the step its replacement has committed). On a local file
system that is ``step-N.part-<token>/``, which gets ``COMMIT.json`` and is then renamed to ``step-N`` by a rename
that cannot replace an existing directory. On an object store (no rename) the data goes under
``step-N/a-<token>/`` and ``COMMIT.json``, which names that prefix, is created conditionally. The attempt that
finds the step committed already fails with `AlreadyCommittedError` and removes only its own files.

Under several ranks this is a barrier (`preemptible.dist.commit_barrier`): rank 0 commits only if every
rank reported its files durable within the timeout, and every rank learns the outcome. A dead rank means no
commit.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from preemptible import dist, phases
from preemptible.checkpoint.handle import SaveResult
from preemptible.errors import AlreadyCommittedError, RankFailures, SaveError
from preemptible.store import checksum, direct, layout
from preemptible.store import format as tensor_format
from preemptible.store.compress import Choice, Codec
from preemptible.store.io import Storage
from preemptible.store.layout import FileRecord, Manifest
from preemptible.writer import FileSpec, Progress, write_bytes, write_files

log = logging.getLogger("preemptible")

OUTCOME_POLL_S = 5.0
"""A rank waiting for rank 0's outcome of a save looks at the storage this often while the store says nothing."""


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
    token: str = ""  # this attempt's own name, chosen by rank 0 (`layout.new_token`)
    write_dir: str = ""  # where this attempt writes its files (see the module docs); empty until prepared
    codec: Codec | None = None  # compresses the tensor files, when this save does
    choice: Choice | None = None  # why it does or does not
    stored_here: int = 0  # bytes of tensor files this rank wrote (all ranks' are in the result)
    check: Callable[[], bool] | None = None  # the plan's check, made while its files are written (`SavePlan.check`)
    fills: Mapping[str, Callable[[int], None]] | None = None  # fill the staged files as they are written (`ArenaFill`)


def busiest(io: list[tuple[int, float]]) -> float:
    """The seconds the busiest writer thread spent in the storage's streams: the time the destination took to
    take in a save's files. Threads that write at once share the destination, so their seconds overlap rather
    than add; one that ran out of files early leaves it to the others."""
    by_thread: dict[int, float] = {}
    for thread, seconds in io:
        by_thread[thread] = by_thread.get(thread, 0.0) + seconds
    return max(by_thread.values())


def records_doc(records: Mapping[str, FileRecord]) -> dict[str, dict[str, Any]]:
    return {n: r.to_doc() for n, r in records.items()}


def records_from(doc: Mapping[str, Any]) -> dict[str, FileRecord]:
    out = {}
    for n, v in doc.items():
        record = FileRecord.from_doc(v)
        if record is None:
            raise ValueError(f"a rank reported a malformed file record for {n}: {str(v)[:120]}")
        out[n] = record
    return out


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
            for piece in direct.read_pieces(stream, buf):
                hasher.update(piece)
        finally:
            stream.close()
        if hasher.hexdigest() != rec.checksum:
            raise SaveError(
                f"read-back verification of {name} in step {step} failed: written with checksum {rec.checksum}, "
                f"read back as {hasher.hexdigest()}; the storage altered it on the way. Check the disk or the mount",
                path=directory,
                step=step,
            )


COMMITTED = "committed"
"""Rank 0's outcome of a commit round when it committed; otherwise the failing ranks (`dist.failures_doc`)."""


def not_committed(job: Job, failures: list[tuple[int, str]]) -> SaveError:
    """The error every rank raises when ranks failed a save's commit round: the same message on every rank, naming
    each failing rank and why; its cause is the `RankFailures` that carries them (``.__cause__.failures``)."""
    why = "; ".join(f"rank {r}: {e}" for r, e in failures)
    error = SaveError(f"step {job.step} was not committed, a rank failed: {why}", path=job.path, step=job.step)
    error.__cause__ = RankFailures(f"ranks failed the commit of step {job.step}: {why}", failures=failures)
    return error


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
        self.protocol = protocol_for(storage, root)
        self.coord = coordinator
        self._clock = clock
        self._monotonic = monotonic
        self.verify_after_save = verify_after_save

    def _prepare(self, job: Job, store: dist.StoreClient | None) -> None:
        """Rank 0 names this attempt and makes its directory; the others learn the name once it exists."""
        coord = self.coord
        if coord is None or coord.rank == 0:
            job.token = layout.new_token()
            job.write_dir = self.protocol.attempt_dir(job)
            self.storage.makedirs(job.write_dir)
            if store is not None:
                store.set(f"{job.key}/ready", job.token)
        else:
            assert store is not None  # several ranks: `write` borrowed one
            job.token = coord.collect_one(store, f"{job.key}/ready")
            job.write_dir = self.protocol.attempt_dir(job)

    def write(
        self,
        job: Job,
        specs: list[FileSpec],
        docs: dict[str, bytes],
        blobs: dict[str, memoryview] | None,
        threads: int,
    ) -> SaveResult:
        with dist.session(self.coord) as store:
            return self._write(job, specs, docs, blobs=blobs, threads=threads, store=store)

    def _write(
        self,
        job: Job,
        specs: list[FileSpec],
        docs: dict[str, bytes],
        *,
        blobs: dict[str, memoryview] | None,
        threads: int,
        store: dist.StoreClient | None,
    ) -> SaveResult:
        t0 = self._monotonic()
        coord = self.coord
        self._prepare(job, store)
        io: list[tuple[int, float]] = []  # each tensor file's thread and seconds in the storage stream
        try:
            records: dict[str, FileRecord] = write_files(
                self.storage,
                job.write_dir,
                specs,
                threads=threads,
                progress=job.progress,
                blobs=blobs,
                codec=job.codec,
                io=io,
                meanwhile=job.check,
                fills=job.fills,
            )
            job.stored_here = sum(r.bytes for r in records.values())
            for name, doc in docs.items():
                records[name] = write_bytes(self.storage, job.write_dir, name, doc)
            self.storage.sync_dir(job.write_dir)
            if self.verify_after_save:
                t_read = self._monotonic()
                read_back(self.storage, job.write_dir, records, step=job.step)
                job.timings["read_back"] = self._monotonic() - t_read
            job.progress.add(0)  # last chance to abandon before the commit point
        except BaseException as e:
            if store is not None and coord is not None:
                error = json.dumps({"error": f"{type(e).__name__}: {e}"})
                dist.commit_barrier(coord, store, f"{job.key}/report", error, wait=False)
            raise
        t_write = self._monotonic()
        job.timings["write"] = t_write - t0
        if io:
            job.timings["io"] = busiest(io)
        world = 1
        if store is not None and coord is not None:
            phases.reached("written", job.step, coord.rank, job.reason)
            # IMPORTANT: the commit barrier. Every rank reports its files as durable; rank 0 commits only if all
            # did, within the timeout; everyone learns the outcome. A dead rank means no commit.
            gathered = dist.commit_barrier(
                coord, store, f"{job.key}/report", json.dumps({"files": records_doc(records)})
            )
            if coord.rank != 0:
                outcome = self._await_outcome(job, records, coord, store)
                if outcome != COMMITTED:
                    raise not_committed(job, dist.failures_from(outcome))
                job.timings["total"] = self._monotonic() - job.start
                return SaveResult(
                    step=job.step,
                    path=job.path,
                    bytes=sum(r.bytes for r in records.values()),
                    seconds=self._monotonic() - job.start,
                    timings=dict(job.timings),
                )
            assert gathered is not None
            reports = [json.loads(x) for x in gathered]
            failures = [(r, str(x["error"])) for r, x in enumerate(reports) if "error" in x]
            if failures:
                store.set(f"{job.key}/outcome", dist.failures_doc(failures))
                raise not_committed(job, failures)
            for x in reports:
                records.update(records_from(x["files"]))
            world = coord.world
        return self._publish(job, records, world, store, t_write)

    def _await_outcome(
        self, job: Job, records: Mapping[str, FileRecord], coord: dist.Coordinator, store: dist.StoreClient
    ) -> str:
        """Rank 0's outcome of this save, from the store; or from the storage when the store cannot tell it.

        The store's host may go right after the commit (or before), and a node that vanishes closes no connection:
        a TCPStore call on such a connection can outlast its own timeout. So the wait runs in a thread of its own,
        and every `OUTCOME_POLL_S` without an answer this rank looks at the step's ``COMMIT.json``: if it names
        this rank's files, the save committed (and the blocked client is abandoned: `Coordinator.abandon`). After
        the coordinator's timeout with neither, the failure of this round."""
        key = f"{job.key}/outcome"
        box: dict[str, Any] = {}

        def wait() -> None:
            try:
                box["outcome"] = coord.collect_one(store, key)
            except Exception as e:
                box["error"] = e

        waiter = threading.Thread(target=wait, name="preemptible-outcome", daemon=True)
        waiter.start()
        deadline = time.monotonic() + coord.timeout_s
        while True:
            waiter.join(OUTCOME_POLL_S)
            if "outcome" in box:
                return str(box["outcome"])
            if self._committed_on_storage(job, records):
                why = box.get("error") or f"no answer in {OUTCOME_POLL_S:.0f} s"
                log.warning(
                    "the store did not say whether step %d committed (%s); its COMMIT.json names this rank's "
                    "files: committed",
                    job.step,
                    why,
                )
                if waiter.is_alive():
                    coord.abandon(store, f"no answer to the outcome of step {job.step} ({why})")
                return COMMITTED
            if "error" in box and not box.get("rechecked"):
                box["rechecked"] = True  # a connection that failed at once: give rank 0's commit one more look
                time.sleep(OUTCOME_POLL_S)
                continue
            if "error" in box or time.monotonic() >= deadline:
                if waiter.is_alive():
                    coord.abandon(store, f"no answer to the outcome of step {job.step} in {coord.timeout_s:.0f} s")
                why = box.get("error") or f"no answer within {coord.timeout_s:.0f} s"
                return dist.failures_doc([(0, f"rank 0's outcome never came: {why}")])

    def _committed_on_storage(self, job: Job, records: Mapping[str, FileRecord]) -> bool:
        """Whether the step's ``COMMIT.json`` is this very attempt's: it names this rank's files, with their
        checksums, under this attempt's prefix."""
        where = self.storage.join(job.path, layout.COMMIT)
        try:
            if not self.storage.exists(where):
                return False
            manifest = Manifest.from_json(self.storage.read_bytes(where, 64 << 20), where=where, expect_step=job.step)
        except Exception as e:
            log.debug("could not read %s: %s", where, e)
            return False
        return manifest.prefix == self.protocol.prefix(job) and all(
            name in manifest.files and manifest.files[name].checksum == rec.checksum for name, rec in records.items()
        )

    def _publish(
        self, job: Job, records: dict[str, FileRecord], world: int, store: dist.StoreClient | None, t_write: float
    ) -> SaveResult:
        timings = dict(job.timings)
        timings["total"] = t_write - job.start
        compressed = any(layout.COMPRESSED_SUFFIX in n for n in records)
        manifest = Manifest(
            format_version=layout.FORMAT_VERSION if compressed else layout.PLAIN_FORMAT_VERSION,
            step=job.step,
            created=layout.now_iso(self._clock()),
            world_size=world,
            checksum_algorithm=checksum.ALGORITHM,
            files=records,
            timings={k: round(v, 6) for k, v in timings.items()},
            predicted_save_s=job.extra.pop("predicted_save_s", None),
            probe=job.probe,
            extra=job.extra,
            prefix=self.protocol.prefix(job),
        )
        try:
            self.protocol.commit(job, manifest.to_json())
        except BaseException as e:
            if store is not None:
                store.set(f"{job.key}/outcome", dist.failures_doc([(0, f"could not commit: {e}")]))
            raise
        phases.reached("committed", job.step, self.coord.rank if self.coord is not None else 0, job.reason)
        if store is not None:
            store.set(f"{job.key}/outcome", COMMITTED)
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


class CommitProtocol:
    """How an attempt gets a place of its own and is committed on one kind of storage (see the module docs);
    chosen once per storage by `protocol_for`."""

    def __init__(self, storage: Storage, root: str) -> None:
        self.storage = storage
        self.root = root

    def attempt_dir(self, job: Job) -> str:
        """Where this attempt writes its files."""
        raise NotImplementedError

    def prefix(self, job: Job) -> str:
        """COMMIT.json's ``prefix``: where inside the step its files are ("" when they are in the step itself)."""
        raise NotImplementedError

    def commit(self, job: Job, manifest: bytes) -> None:
        """Make the attempt the checkpoint of its step: the commit point.

        Raises:
            AlreadyCommittedError: another process committed the step meanwhile.
        """
        try:
            self._commit(job, manifest)
        except FileExistsError as e:
            raise AlreadyCommittedError(
                f"step {job.step} was committed at {job.path} by another process while this one was saving it (two "
                "machines on one root: a reclaimed one and its replacement?). Its checkpoint was left as it is and "
                "this attempt's files were removed; check that only one job writes to this root",
                path=job.path,
                step=job.step,
            ) from e

    def _commit(self, job: Job, manifest: bytes) -> None:
        raise NotImplementedError


class RenameCommit(CommitProtocol):
    """A local file system: ``step-N.part-<token>/`` gets ``COMMIT.json``, then is renamed to ``step-N`` by a rename
    that cannot replace an existing directory."""

    def attempt_dir(self, job: Job) -> str:
        return self.storage.join(self.root, layout.attempt_dir(job.step, job.token))

    def prefix(self, job: Job) -> str:
        return ""

    def _commit(self, job: Job, manifest: bytes) -> None:
        storage = self.storage
        storage.publish(storage.join(job.write_dir, layout.COMMIT), manifest)
        if storage.exists(job.path) and not storage.exists(storage.join(job.path, layout.COMMIT)):
            # no COMMIT.json: an uncommitted leftover of the older layout, or a deletion cut short
            log.info("removing uncommitted leftovers at %s before committing step %d", job.path, job.step)
            storage.remove_tree(job.path)
        storage.commit_dir(job.write_dir, job.path)


class ConditionalCommit(CommitProtocol):
    """An object store (no rename): the data under ``step-N/a-<token>/``, and ``COMMIT.json``, which names that
    prefix, created only if absent."""

    def attempt_dir(self, job: Job) -> str:
        return self.storage.join(job.path, layout.attempt_prefix(job.token))

    def prefix(self, job: Job) -> str:
        return layout.attempt_prefix(job.token)

    def _commit(self, job: Job, manifest: bytes) -> None:
        self.storage.publish_new(self.storage.join(job.path, layout.COMMIT), manifest)


def protocol_for(storage: Storage, root: str) -> CommitProtocol:
    """The commit protocol of ``storage``'s kind."""
    return RenameCommit(storage, root) if storage.kind == "local" else ConditionalCommit(storage, root)


def save_error(
    e: OSError, step: int, path: str, *, root: str, newest: int | None, object_store: bool = False
) -> SaveError:
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
        check = (
            "the bucket (or container) exists and these credentials may write to it"
            if object_store
            else "the root is writable and mounted"
        )
        what = f"writing step {step} to {path} failed: {e}; nothing was committed and {kept}. Check that {check}"
    return SaveError(what, path=path, step=step)
