"""The memory tier: each node keeps its ranks' shares of a checkpoint in its own memory, and a copy of them on
``replicas`` other nodes, so a reclaimed node's state survives on its peers and a replacement restores from memory.

Layout of one node's tier directory (``MemoryTier.dir``: a ``tmpfs`` such as ``/dev/shm``, which survives the
training process but not the node)::

    <dir>/step-000000000042/part-00003/   the files rank 3 writes in a save (the durable root's partition), and
        COMMIT.json                        the checkpoint's whole manifest (every rank's files and checksums) with
                                           ``memory_part`` (which rank's share this is) and ``memory_files``

A part is the unit: a rank writes its own part into its node's directory and sends it, over the job's own process
group, to the rank ``j * local_world_size`` places on (the same local rank on the ``j``-th next node), which writes
it into its node's directory the same way. A part directory is written under a temporary name and renamed whole
once its ``COMMIT.json`` is in it: a part torn mid-write or mid-transfer has no name a reader looks at. A received
part's bytes are checked against the sender's checksums before that rename. Nothing here goes through a shared
file system: each rank touches only its own node's directory; parts move between nodes through the process group.

At restore every rank says which parts its node holds, step by step (`choose`): the job takes the newest step
whose parts are all held somewhere and that is not older than the newest durable checkpoint, fetches the parts it
lacks from ranks that hold them (point to point), and restores through the durable tier's own verified read path
(`Restorer`): the same checksums, the same probe, the same agreement that every rank restored. Anything else (no
complete step, another world size, a failed check) falls back to the durable root with the reason in the journal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import mmap
import os
import shutil
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from preemptible import dist
from preemptible.checkpoint.commit import records_doc, records_from
from preemptible.checkpoint.reader import Reader
from preemptible.checkpoint.restore import Candidate, Restorer
from preemptible.events import Event, EventSink, NullSink
from preemptible.store import checksum, layout
from preemptible.store.io import LocalStorage
from preemptible.store.layout import FileRecord, Manifest
from preemptible.store.markers import Markers, State
from preemptible.validate import run_probe
from preemptible.writer import FileSpec, Staging, write_bytes, write_files

log = logging.getLogger("preemptible")

MEMORY_DIR_ENV = "PREEMPTIBLE_MEMORY_DIR"
DEFAULT_BASE = "/dev/shm/preemptible"
TIER = "memory"
PART_KEY = "memory_part"
FILES_KEY = "memory_files"
ROOT_KEY = "memory_root"
"""The durable root of the run that saved a part: a tier directory can outlive a job and be named for every job on
a node (``$PREEMPTIBLE_MEMORY_DIR``), and another run's state is no state of this one."""


@dataclass(frozen=True)
class MemoryTier:
    """``Run(memory_tier=MemoryTier(...))``: a checkpoint tier in each node's memory, replicated to peers.

    Args:
        every: a memory save every this many completed steps (besides the durable ``save_every``); None: only the
            emergency save goes to memory (first, before the durable root).
        replicas: copies of each node's parts on other nodes (the next ``replicas`` nodes); capped at nodes - 1.
        keep: steps the tier keeps (>= 1; the durable root backs older ones). A step is dropped only after a newer
            one is protected on every node.
        max_bytes: bound on one node's tier in bytes (own parts and replicas), shared equally by the node's ranks;
            the oldest steps go first, and a save that cannot fit is skipped (journaled). None: the free space of
            the tier's file system, less a tenth, when the save starts.
        dir: the node's tier directory: a path only this node's processes see (``/dev/shm`` on a real node).
            None: ``$PREEMPTIBLE_MEMORY_DIR``, else ``/dev/shm/preemptible-<uid>-<job>`` (the job named after the
            durable root). It must be this user's and writable by no one else (`own_directory`).

    Examples:
        >>> from preemptible import MemoryTier
    >>> tier = MemoryTier(every=10, replicas=1)
        >>> (tier.every, tier.replicas, tier.keep)
        (10, 1, 2)
    """

    every: int | None = None
    replicas: int = 1
    keep: int = 2
    max_bytes: int | None = None
    dir: str | None = None

    def __post_init__(self) -> None:
        checks = (("every", self.every, 1, True), ("replicas", self.replicas, 0, False), ("keep", self.keep, 1, False))
        for name, value, least, optional in (*checks, ("max_bytes", self.max_bytes, 1, True)):
            if value is None and optional:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                none = " (or None: memory saves only on a notice)" if name == "every" else ""
                none = " (or None: no bound but the file system's free space)" if name == "max_bytes" else none
                raise ValueError(f"MemoryTier({name}=...): expected an int >= {least}{none}, found {value!r}")
        if self.dir is not None and (not isinstance(self.dir, (str, os.PathLike)) or not os.fspath(self.dir)):
            raise ValueError(
                f"MemoryTier(dir=...): expected a directory's path (or None: the default), found {self.dir!r}"
            )

    @classmethod
    def of(cls, value: MemoryTier | bool | None) -> MemoryTier | None:
        """``Run(memory_tier=...)``: a `MemoryTier`, True (the defaults), or None/False (off)."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, cls):
            raise TypeError(f"memory_tier: expected a MemoryTier, True or None, found {type(value).__name__}")
        return value

    def directory(self, root: str) -> str:
        if self.dir is not None:
            return os.path.abspath(self.dir)
        if os.environ.get(MEMORY_DIR_ENV):
            return os.path.abspath(os.environ[MEMORY_DIR_ENV])
        return f"{DEFAULT_BASE}-{os.geteuid()}-{checksum.of_bytes(root.encode())[:12]}"


def own_directory(path: str) -> None:
    """Make ``path`` (mode 0700) or check it: a directory, not a link, of this user, that no one else may write.
    Whoever can write a tier can choose the state a job restores (its checksums are in the same files), so the
    tier refuses a directory others could have written.

    Raises:
        PermissionError: saying what was found and what to do.
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    problems = []
    if stat.S_ISLNK(st.st_mode):
        problems.append(f"a symbolic link (to {os.readlink(path)}), not a directory")
    elif not stat.S_ISDIR(st.st_mode):
        problems.append("not a directory")
    if st.st_uid != os.geteuid():
        problems.append(f"owned by uid {st.st_uid}, not this process's {os.geteuid()}")
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022:  # a link's own mode is always 777: not what is wrong
        problems.append(f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")
    if problems:
        raise PermissionError(
            f"memory tier directory {path}: {'; '.join(problems)}; expected a directory of this user that no one "
            "else can write (one made here gets mode 0700): whoever can write it chooses what a job restores. "
            f"Remove it, or set MemoryTier(dir=...) or ${MEMORY_DIR_ENV} to one of your own"
        )


@dataclass(frozen=True)
class _Snapshot:
    """One save as captured on the training thread: its files (live tensors, or copies in the staging arena)."""

    step: int
    reason: str
    specs: list[FileSpec]
    blobs: dict[str, memoryview] | None
    docs: dict[str, bytes]
    nbytes: int
    probe: float | None


# which step is restored: a pure function of what every rank reports --------------------------------------------
@dataclass(frozen=True)
class Holding:
    """What one rank's node holds of one step in its tier: the saving world size and the parts present."""

    world: int
    parts: frozenset[int]


@dataclass
class Choice:
    """The steps the memory tier can restore, newest first, each with the ranks whose node holds each part; and why
    the newer steps cannot."""

    steps: list[int]
    why: str
    holders: dict[int, dict[int, list[int]]] = field(default_factory=dict)  # step -> part -> ranks holding it

    @property
    def step(self) -> int | None:
        return self.steps[0] if self.steps else None


def choose(reports: Sequence[Mapping[int, Holding]], *, world: int, durable: int | None) -> Choice:
    """The steps the memory tier may restore, newest first, given each rank's report of its node's tier (index:
    rank) and the newest committed durable step: those whose every part is held by some node, saved at this world
    size, not older than ``durable``. Empty, with the reasons, when there is none."""
    steps = sorted({s for report in reports for s in report}, reverse=True)
    if not steps:
        return Choice([], "the memory tier holds no step on any node")
    why: list[str] = []
    found: list[int] = []
    holders_of: dict[int, dict[int, list[int]]] = {}
    for step in steps:
        if durable is not None and step < durable:
            why.append(f"step {step} and older are older than the newest durable checkpoint (step {durable})")
            break
        worlds = {report[step].world for report in reports if step in report}
        if worlds != {world}:
            why.append(f"step {step} was saved by {sorted(worlds)} ranks, this job has {world}")
            continue
        holders: dict[int, list[int]] = {}
        for rank, report in enumerate(reports):
            if step in report:
                for part in report[step].parts:
                    holders.setdefault(part, []).append(rank)
        missing = sorted(set(range(world)) - set(holders))
        if missing:
            why.append(f"step {step}: no node holds the parts of ranks {missing}")
            continue
        found.append(step)
        holders_of[step] = holders
    return Choice(found, "; ".join(why), holders_of)


def peers(rank: int, world: int, local_world: int, replicas: int) -> tuple[list[int], list[int]]:
    """Where ``rank`` sends its part (the same local rank on the next nodes) and whose parts it receives."""
    nodes = max(1, world // max(1, local_world))
    k = min(replicas, nodes - 1)
    to = [(rank + j * local_world) % world for j in range(1, k + 1)]
    frm = [(rank - j * local_world) % world for j in range(1, k + 1)]
    return to, frm


# the tier on this node --------------------------------------------------------------------------------------------
class Tier:
    """One process's side of the memory tier (see the module docs). Every method that moves data is collective:
    all ranks call it at the same step."""

    def __init__(self, config: MemoryTier, checkpointer: Any, *, events: EventSink) -> None:
        self.config = config
        self.ck = checkpointer
        self.events = events
        self.dir = config.directory(checkpointer.root)
        self.storage = LocalStorage(self.dir)
        self.timings: dict[str, float] = {}
        """The last save's seconds by phase."""
        self.staging = Staging()
        """The arena a background save copies the state into (one copy of this rank's share, reused)."""
        self._pending: threading.Thread | None = None
        self._group: Any = None
        self.touched: int | None = None
        """The memory step a restore loaded into the live objects and then rejected (a probe or fit check after
        loading): only a whole checkpoint may follow it, never a fresh start on those objects."""

    @classmethod
    def of(cls, config: MemoryTier | None, checkpointer: Any) -> Tier | None:
        """The tier for ``config`` (None: off); its journal is attached when the run opens."""
        return cls(config, checkpointer, events=NullSink()) if config is not None else None

    # where things are
    def step_dir(self, step: int) -> str:
        return os.path.join(self.dir, f"step-{step:012d}")

    def part_dir(self, step: int, part: int) -> str:
        return os.path.join(self.step_dir(step), f"part-{part:05d}")

    @property
    def world(self) -> int:
        return dist.world_size()

    @property
    def rank(self) -> int:
        return dist.rank()

    @staticmethod
    def local_world() -> int:
        try:
            return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            return 1

    def due(self, completed: int) -> bool:
        return self.config.every is not None and completed > 0 and completed % self.config.every == 0

    # what this node holds
    def holdings(self) -> dict[int, Holding]:
        """The steps of this node's tier and the committed parts of each (a part whose manifest does not parse
        counts as absent)."""
        out: dict[int, Holding] = {}
        if not os.path.lexists(self.dir):
            return out
        own_directory(self.dir)
        names = os.listdir(self.dir)
        for name in names:
            step = _step_of(name)
            if step is None:
                continue
            parts: set[int] = set()
            worlds: set[int] = set()
            for part, manifest in self._parts(step):
                parts.add(part)
                worlds.add(manifest.world_size)
            if parts and len(worlds) == 1:
                out[step] = Holding(worlds.pop(), frozenset(parts))
        return out

    def steps(self) -> list[int]:
        """The steps of this node's tier, by directory name alone (retention; `holdings` checks their parts)."""
        try:
            return sorted(s for s in map(_step_of, os.listdir(self.dir)) if s is not None)
        except FileNotFoundError:
            return []

    def _parts(self, step: int) -> list[tuple[int, Manifest]]:
        found = []
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # a stray file named like a step: no step
            for name in os.listdir(self.step_dir(step)):
                part = _part_of(name)
                if part is None:
                    continue
                manifest = self.manifest(step, part)
                if manifest is not None:
                    found.append((part, manifest))
        return found

    def manifest(self, step: int, part: int) -> Manifest | None:
        where = os.path.join(self.part_dir(step, part), layout.COMMIT)
        try:
            with open(where, "rb", opener=_plain_file) as f:  # not a link, not a FIFO that would never answer
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise ValueError("COMMIT.json is not a regular file")
                raw = f.read(64 << 20)
            manifest = Manifest.from_json(raw, where=where, expect_step=step)
        except (OSError, ValueError, Exception) as e:  # a torn or foreign part is no part
            if not isinstance(e, FileNotFoundError):
                log.warning("memory tier: ignoring the part at %s (%s)", where, e)
            return None
        names = manifest.extra.get(FILES_KEY)
        if manifest.extra.get(PART_KEY) != part or not isinstance(names, list):
            return None
        if manifest.extra.get(ROOT_KEY) != self.ck.root:
            log.warning(
                "memory tier: ignoring the part at %s (saved by the run of %r, this run's durable root is %r)",
                where,
                manifest.extra.get(ROOT_KEY),
                self.ck.root,
            )
            return None
        if not all(isinstance(n, str) and n in manifest.files for n in names):  # names the manifest vouches for
            log.warning("memory tier: ignoring the part at %s (it names files its manifest does not list)", where)
            return None
        return manifest

    def usage(self, exclude: int | None = None) -> int:
        """Bytes in this node's tier (all its ranks'), less step ``exclude``'s."""
        skip = self.step_dir(exclude) if exclude is not None else None
        return _tree_bytes(self.dir, skip=skip)

    # saving -------------------------------------------------------------------------------------------------------
    def save(self, state: Mapping[str, Any], step: int, *, reason: str) -> bool:
        """Save ``step`` to this node's tier and its replicas, now (after the one in the background, if any). True
        once every rank's part is on its own node and on its replicas' (protected); False (journaled) when a node
        lacks the room or any rank failed."""
        self.wait()
        group = self._group_for_saves()
        t0 = time.monotonic()
        return self._write(self._capture(state, step, reason, staged=False), group, t0)

    def save_background(self, state: Mapping[str, Any], step: int, *, reason: str) -> None:
        """Copy the state into this tier's staging arena now, and save it from there in a thread while training
        goes on: its transfers use a process group of the tier's own, never the training's collectives."""
        self.wait()
        group = self._group_for_saves()
        t0 = time.monotonic()
        self.staging.busy.acquire()
        try:
            snapshot = self._capture(state, step, reason, staged=True)
        except BaseException:
            self.staging.busy.release()
            raise

        def write() -> None:
            try:
                self._write(snapshot, group, t0)
            except Exception as e:  # journaled; the next save tries again
                log.error("[rank=%d] memory tier: background save of step %d failed: %s", self.rank, step, e)
                self.events.event(Event.SAVE_FAILED, step, reason=reason, error=f"{type(e).__name__}: {e}", tier=TIER)
            finally:
                self.staging.busy.release()

        self._pending = threading.Thread(target=write, name="preemptible-memory-tier", daemon=True)
        self._pending.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background save in flight, if any; False if it is still going after ``timeout``."""
        pending = self._pending
        if pending is None:
            return True
        pending.join(timeout)
        if pending.is_alive():
            log.warning("[rank=%d] memory tier: a background save is still running; leaving it", self.rank)
            return False
        self._pending = None
        return True

    def _group_for_saves(self) -> Any:
        """The tier's own process group (gloo), made by every rank at its first save (a collective call)."""
        if self._group is None and _distributed():
            import torch.distributed as tdist

            self._group = tdist.new_group(backend="gloo")
        return self._group

    def _capture(self, state: Mapping[str, Any], step: int, reason: str, *, staged: bool) -> _Snapshot:
        """What a save writes, planned on the calling (training) thread: the live tensors, or a copy of them in the
        staging arena (``staged``: the caller holds ``staging.busy``)."""
        coord = self.ck.coordinator
        key = coord.round("memory") if coord is not None else "memory/0"
        plan = self.ck.planner.plan(state, key=key, reason=reason)
        probe = run_probe(self.ck.probe, state) if self.ck.probe is not None else None
        if not staged:
            return _Snapshot(step, reason, plan.specs, None, plan.docs, plan.nbytes, probe)
        copy = self.staging.stage(plan, step=step)
        return _Snapshot(step, reason, copy.specs, copy.blobs, copy.docs, plan.nbytes, probe)

    def _write(self, snap: _Snapshot, group: Any, t0: float) -> bool:
        """Write a captured step into this node's tier and replicate it (collective on ``group``)."""
        step, reason = snap.step, snap.reason
        world, rank, local = self.world, self.rank, self.local_world()
        to, frm = peers(rank, world, local, self.config.replicas)
        own_bytes = snap.nbytes + sum(len(d) for d in snap.docs.values())
        sizes = [_with_overhead(n, len(snap.specs)) for n in _gather(own_bytes, group)]
        need = own_bytes + sum(sizes[src] for src in frm)
        if not self._room(step, need, reason, group):
            return False
        t_plan = time.monotonic()
        error = None
        records: dict[str, FileRecord] = {}
        tmp = self.part_dir(step, rank) + f".tmp-{os.getpid()}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            records = write_files(self.storage, tmp, snap.specs, threads=self.ck.threads, blobs=snap.blobs)
            for name, doc in snap.docs.items():
                records[name] = write_bytes(self.storage, tmp, name, doc)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        t_write = time.monotonic()
        reports = _gather_objects({"files": records_doc(records), "probe": snap.probe, "error": error}, group)
        failed = [(r, x["error"]) for r, x in enumerate(reports) if x["error"]]
        if failed:
            shutil.rmtree(tmp, ignore_errors=True)
            why = "; ".join(f"rank {r}: {e}" for r, e in failed)
            self.events.event(Event.SAVE_FAILED, step, reason=reason, error=why, tier=TIER)
            return False
        parts = [records_from(x["files"]) for x in reports]
        manifest = Manifest(
            step=step,
            created=layout.now_iso(time.time()),
            world_size=world,
            checksum_algorithm=checksum.ALGORITHM,
            files={n: r for p in parts for n, r in p.items()},
            probe=reports[0]["probe"],
            extra={"tier": TIER, ROOT_KEY: self.ck.root},
        )
        # The estimate above left out tensor headers and manifests: now that every part's size is known, the
        # step must fit exactly, or it is skipped before this rank's part is committed (the bound holds after).
        if not self._room(step, sum(_part_bytes(manifest, p, parts[p]) for p in (rank, *frm)), reason, group):
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        ok = self._commit_part(tmp, step, rank, manifest, sorted(records))
        t_commit = time.monotonic()
        ok = self._replicate(step, manifest, parts, to=to, frm=frm, group=group) and ok
        t_rep = time.monotonic()
        protected = _all(ok, group)
        self.timings = {
            "capture": round(t_plan - t0, 6),
            "write": round(t_write - t_plan, 6),
            "manifest": round(t_commit - t_write, 6),
            "replicate": round(t_rep - t_commit, 6),
            "agree": round(time.monotonic() - t_rep, 6),
        }
        if protected:
            self._retain(step)
            self._trim(step)  # what the estimate missed (headers, manifests): older steps go for it
            self.events.event(
                Event.SAVE_COMMITTED,
                step,
                reason=reason,
                bytes=own_bytes,
                seconds=round(t_rep - t0, 6),
                timings=self.timings,
                tier=TIER,
                replicas=len(to),
            )
        else:
            self.events.event(Event.SAVE_FAILED, step, reason=reason, error="a part or a replica failed", tier=TIER)
        return protected

    def _room(self, step: int, need: int, reason: str, group: Any) -> bool:
        """Whether every rank has room for its parts of ``step`` (`_make_room`); journaled when one has not."""
        room, why = self._make_room(step, need)
        if _all(room, group):
            return True
        why = why or "another node's memory tier has no room for this step"
        self.events.event(Event.SAVE_SKIPPED, step, reason=reason, why=why, tier=TIER)
        log.warning("[rank=%d] memory tier: step %d not saved: %s", self.rank, step, why)
        return False

    def _make_room(self, step: int, need: int) -> tuple[bool, str]:
        """Drop this rank's parts of older steps, oldest first, until ``need`` more bytes fit its share."""
        own_directory(self.dir)
        local = self.local_world()
        if self.config.max_bytes is not None:
            share = self.config.max_bytes // local
            used = self.usage(exclude=step) // local
        else:
            st = os.statvfs(self.dir)
            share = int(st.f_bavail * st.f_frsize * 0.9) // local
            used = 0
        mine = [s for s in self.steps() if s != step]
        if used + need > share:  # nothing goes unless the step fits once this rank's older parts have gone
            freeable = sum(self._drop(s, dry=True) for s in mine)
            if self.config.max_bytes is not None:
                fits = max(0, used - freeable) + need <= share
            else:
                fits = need <= share + int(freeable * 0.9) // local
            if not fits:
                return False, (
                    f"this node's share of its memory tier is {share} bytes, {used} in use; the step needs {need} "
                    f"more, and dropping every older step would free {freeable}: the older steps are kept"
                )
        while mine and used + need > share:
            old = mine.pop(0)
            freed = self._drop(old)
            if self.config.max_bytes is not None:
                used = max(0, used - freed)
            else:
                used = 0
                st = os.statvfs(self.dir)
                share = int(st.f_bavail * st.f_frsize * 0.9) // local
        if used + need > share:
            return False, f"this node's share of its memory tier is {share} bytes; the step needs {need} more"
        return True, ""

    def agree_any(self, flag: bool) -> bool:
        """Whether any rank says ``flag`` (collective on the job's process group)."""
        return not _all(not flag)

    def discard_newer(self, step: int) -> None:
        """Drop this rank's parts of the steps newer than ``step``, the one the job resumed from: they belong to a
        timeline the job left (a restore from the durable root, or a fresh start), and a later restart must not
        go back to it."""
        for s in self.steps():
            if s > step:
                self._drop(s)

    def clear(self) -> None:
        """Free this rank's share of the tier (its own parts and those it holds for others), after the background
        save in flight; the directory goes with the node's last rank."""
        self.wait()
        for step in self.steps():
            self._drop(step)
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)

    def _trim(self, step: int) -> None:
        if self.config.max_bytes is None:
            return
        local = self.local_world()
        older = [s for s in self.steps() if s < step]
        while older and self.usage() // local > self.config.max_bytes // local:
            self._drop(older.pop(0))

    def _drop(self, step: int, *, dry: bool = False) -> int:
        """Remove this rank's parts of ``step`` (its own and those it holds for others); the bytes freed (``dry``:
        the bytes it would free, removing nothing)."""
        freed = 0
        rank, world, local = self.rank, self.world, self.local_world()
        _, frm = peers(rank, world, local, self.config.replicas)
        try:
            names = os.listdir(self.step_dir(step))
        except OSError:
            names = []
        for part in (rank, *frm):
            final = os.path.basename(self.part_dir(step, part))
            # the part, and any copy of it torn mid-write by an earlier process (``.tmp-<pid>``): never read, but
            # its bytes stay in the node's memory until removed
            for name in (n for n in names if n == final or n.startswith(final + ".tmp-")):
                where = os.path.join(self.step_dir(step), name)
                freed += _tree_bytes(where)
                if not dry:
                    shutil.rmtree(where, ignore_errors=True)
        if dry:
            return freed
        with contextlib.suppress(OSError):
            os.rmdir(self.step_dir(step))  # the last of the node's ranks to drop it
        return freed

    def _retain(self, step: int) -> None:
        steps = self.steps()
        for old in steps[: max(0, len(steps) - self.config.keep)]:
            if old < step:
                self._drop(old)

    def _commit_part(self, tmp: str, step: int, part: int, manifest: Manifest, names: list[str]) -> bool:
        """``COMMIT.json`` into the part's temporary directory, then the directory renamed into place whole."""
        doc = _part_manifest(manifest, part, names)
        try:
            with open(os.path.join(tmp, layout.COMMIT), "wb") as f:
                f.write(doc.to_json())
            final = self.part_dir(step, part)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            return True
        except OSError as e:
            log.error("[rank=%d] memory tier: could not commit part %d of step %d: %s", self.rank, part, step, e)
            shutil.rmtree(tmp, ignore_errors=True)
            return False

    def _replicate(
        self,
        step: int,
        manifest: Manifest,
        parts: list[dict[str, FileRecord]],
        *,
        to: list[int],
        frm: list[int],
        group: Any = None,
    ) -> bool:
        """Send this rank's part to ``to``, receive the parts of ``frm``, check and commit each received one.

        Bytes move with as few copies as the process group allows: a large file goes out straight from its pages
        in the tier (mapped, copy-on-write) and comes in straight into its file in the receiver's tier (mapped);
        the small ones travel together in one message."""
        if not to and not frm:
            return True
        import torch.distributed as tdist

        rank = self.rank
        works: list[Any] = []
        held: list[Any] = []  # what must outlive the transfers: maps, files, buffers
        outgoing = _messages(parts[rank])
        for dst in to:
            for tag, names in enumerate(outgoing):
                tensor = _outgoing(self.part_dir(step, rank), names, parts[rank], held)
                works.append(tdist.isend(tensor, dst, group=group, tag=tag))
        incoming: dict[int, tuple[str, list[tuple[list[str], torch.Tensor]]]] = {}
        for src in frm:
            tmp = self.part_dir(step, src) + f".tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            landing = []
            for tag, names in enumerate(_messages(parts[src])):
                tensor = _incoming(tmp, names, parts[src], held)
                landing.append((names, tensor))
                works.append(tdist.irecv(tensor, src, group=group, tag=tag))
            incoming[src] = (tmp, landing)
        try:
            for w in works:
                if w is not None:
                    w.wait()
            ok = True
            for src, (tmp, landing) in incoming.items():
                ok = self._land(step, src, manifest=manifest, records=parts[src], tmp=tmp, landing=landing) and ok
        finally:
            for h in reversed(held):
                with contextlib.suppress(Exception):
                    h.close()
        return ok

    def _land(
        self,
        step: int,
        part: int,
        *,
        manifest: Manifest,
        records: Mapping[str, FileRecord],
        tmp: str,
        landing: list[tuple[list[str], torch.Tensor]],
    ) -> bool:
        """A received part: every file's bytes checked against its writer's checksum, then committed whole."""
        try:
            for names, tensor in landing:
                view = tensor.numpy().data
                offset = 0
                for name in names:
                    rec = records[name]
                    piece = view[offset : offset + rec.bytes]
                    offset += rec.bytes
                    found = checksum.of_bytes(piece)
                    if found != rec.checksum:
                        raise ValueError(f"{name} arrived with checksum {found}, its writer recorded {rec.checksum}")
                    if len(names) > 1 or not os.path.exists(os.path.join(tmp, name)):  # bundled: written out here
                        with open(os.path.join(tmp, name), "wb") as f:
                            f.write(piece)
        except (OSError, ValueError) as e:
            log.error("[rank=%d] memory tier: the replica of rank %d's part of step %d: %s", self.rank, part, step, e)
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        return self._commit_part(tmp, step, part, manifest, sorted(records))

    # restoring ----------------------------------------------------------------------------------------------------
    def restore(self, state: Mapping[str, Any], *, durable: int | None) -> tuple[int | None, str]:
        """Restore the newest step complete in memory (collective), trying older complete ones if it fails its
        checks. Returns the step, or None and why not (the caller restores from the durable root then)."""
        world = self.world
        mine = self.holdings()
        reports = _gather_objects({s: (h.world, sorted(h.parts)) for s, h in mine.items()})
        decoded = [{int(s): Holding(w, frozenset(p)) for s, (w, p) in r.items()} for r in reports]
        durables = _gather_objects(durable)
        newest_durable = max((d for d in durables if d is not None), default=None)
        choice = choose(decoded, world=world, durable=newest_durable)
        why = [choice.why] if choice.why else []
        for step in choice.steps:
            failed = self._restore_step(state, step, mine, decoded, choice.holders[step])
            if failed is None:
                return step, "complete"
            why.append(failed)
            log.warning("[rank=%d] memory tier: %s", self.rank, failed)
        return None, "; ".join(why) or "the memory tier holds no complete step"

    def _restore_step(
        self,
        state: Mapping[str, Any],
        step: int,
        mine: Mapping[int, Holding],
        reports: Sequence[Mapping[int, Holding]],
        holders: Mapping[int, list[int]],
    ) -> str | None:
        """Fetch what this rank reads of ``step`` and restore it through the verified read path; None when it
        restored, else why not (every rank gets the same answer: `Restorer` agrees across ranks)."""
        rank, world = self.rank, self.world
        held = {part: self.manifest(step, part) for part in mine.get(step, Holding(world, frozenset())).parts}
        doc: dict[str, Any] = {str(part): list(m.extra[FILES_KEY]) for part, m in held.items() if m is not None}
        if held and rank == min(r for ranks in holders.values() for r in ranks):
            doc["manifest"] = next(m for m in held.values() if m is not None).to_json().decode()
        lists = _gather_objects(doc)
        manifest_doc = next(x["manifest"] for x in lists if "manifest" in x)
        manifest = Manifest.from_json(manifest_doc.encode(), where=f"memory tier, step {step}", expect_step=step)
        files_of: dict[int, list[str]] = {}
        for x in lists:
            for part, names in x.items():
                if part != "manifest":
                    if not all(isinstance(n, str) and n in manifest.files for n in names):
                        return f"step {step}: a node's part {part} names files the step's manifest does not list"
                    files_of[int(part)] = list(names)
        t0 = time.monotonic()
        target = os.path.join(self.dir, f"restore-r{rank:05d}")
        shutil.rmtree(target, ignore_errors=True)
        where = os.path.join(target, f"step-{step:012d}")
        os.makedirs(where)
        try:
            fetched: list[str] = []
            bad = None
            try:
                fetched = self._fetch(
                    step, manifest=manifest, files_of=files_of, holders=holders, reports=reports, where=where
                )
                bad = _verify(where, fetched, manifest)
            except Exception as e:
                bad = f"{type(e).__name__}: {e}"
            # IMPORTANT: every byte this rank will read is checked before a live byte changes, and every rank
            # learns whether all did: a damaged step is skipped with the live objects untouched.
            if not _all(bad is None):
                return f"step {step} from memory failed its checksums before loading ({bad or 'on another rank'})"
            with open(os.path.join(where, layout.COMMIT), "wb") as f:
                f.write(manifest_doc.encode())  # the whole manifest, as saved: its seal checked again on open
            t_fetch = time.monotonic()
            try:
                self._restorer(target).restore(state, [Candidate(step, State.COMMITTED, None)], explicit=True)
            except Exception as e:  # every rank gets here together (`Restorer._agree`)
                self.touched = step  # the live objects may hold part of it: only a whole checkpoint may follow
                self._drop(step)  # every rank drops its parts of it: a restart does not meet it again
                return f"step {step} from memory did not restore ({type(e).__name__}: {e})"
        finally:
            shutil.rmtree(target, ignore_errors=True)
        self.events.event(
            Event.RESUME,
            step,
            seconds=round(time.monotonic() - t0, 6),
            tier=TIER,
            fetch_s=round(t_fetch - t0, 6),
            bytes=sum(manifest.files[n].bytes for n in fetched),
        )
        return None

    def _restorer(self, root: str) -> Restorer:
        storage = LocalStorage(root)
        ck = self.ck
        reader = Reader(storage, storage.root, threads=ck.threads)
        reader.only_rank = self.rank  # only the files this rank reads were fetched
        return Restorer(
            reader,
            Markers(storage),
            coordinator=ck.coordinator,
            events=self.events,
            probe=ck.probe,
            probe_rtol=ck.probe_rtol,
            monotonic=time.monotonic,
            now=lambda: layout.now_iso(time.time()),
        )

    def _fetch(
        self,
        step: int,
        *,
        manifest: Manifest,
        files_of: Mapping[int, list[str]],
        holders: Mapping[int, list[int]],
        reports: Sequence[Mapping[int, Holding]],
        where: str,
    ) -> list[str]:
        """Put into ``where`` the files this rank reads (the replicated ones and its own): linked from its node's
        tier where the node holds their part, else received from a rank whose node does. Collective."""
        import torch.distributed as tdist

        world, rank = self.world, self.rank

        def wanted(target: int, part: int) -> list[str]:
            return [n for n in files_of[part] if layout.file_rank(n) in (None, target)]

        works = []
        sends: list[torch.Tensor] = []
        receive: dict[int, tuple[torch.Tensor, list[str]]] = {}
        fetched: list[str] = []
        for target in range(world):
            held_there = reports[target].get(step)
            for part in range(world):
                names = wanted(target, part)
                if not names:
                    continue
                if held_there is not None and part in held_there.parts:
                    if target == rank:  # on this node already
                        for n in names:
                            _link(os.path.join(self.part_dir(step, part), n), os.path.join(where, n))
                        fetched += names
                    continue
                options = holders[part]
                src = options[target % len(options)]
                if src == rank:
                    payload = _read_concat(self.part_dir(step, part), names)
                    sends.append(payload)
                    works.append(tdist.isend(payload, target, tag=part))
                elif target == rank:
                    total = sum(manifest.files[n].bytes for n in names)
                    buf = torch.empty(total, dtype=torch.uint8)
                    receive[part] = (buf, names)
                    works.append(tdist.irecv(buf, src, tag=part))
        for w in works:
            if w is not None:
                w.wait()
        for buf, names in receive.values():
            view = buf.numpy().data
            offset = 0
            for n in names:
                size = manifest.files[n].bytes
                with open(os.path.join(where, n), "wb") as f:
                    f.write(view[offset : offset + size])
                offset += size
            fetched += names
        return fetched


def _tree_bytes(path: str, *, skip: str | None = None) -> int:
    """Bytes of the files under ``path`` (links not followed), leaving out the tree at ``skip``."""
    total = 0
    for dirpath, _, files in os.walk(path):
        if skip is not None and (dirpath == skip or dirpath.startswith(skip + os.sep)):
            continue
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _with_overhead(nbytes: int, files: int) -> int:
    """A part's bytes on the tier, from its state's bytes: tensor headers and the manifest on top (an estimate
    made before writing; the bound is enforced again after)."""
    return nbytes + nbytes // 50 + (files + 2) * 16384


def _part_manifest(manifest: Manifest, part: int, names: list[str]) -> Manifest:
    """A part's ``COMMIT.json``: the step's whole manifest, and which part this is and which files it holds."""
    return dataclasses.replace(manifest, extra={**manifest.extra, PART_KEY: part, FILES_KEY: names})


def _part_bytes(manifest: Manifest, part: int, records: Mapping[str, FileRecord]) -> int:
    """The bytes a part takes on the tier: its files and its ``COMMIT.json``."""
    return sum(r.bytes for r in records.values()) + len(_part_manifest(manifest, part, sorted(records)).to_json())


def _verify(directory: str, names: Sequence[str], manifest: Manifest) -> str | None:
    """Each file's bytes against the manifest's checksum (read whole, once); None when all match, else the first
    that does not."""
    for name in names:
        rec = manifest.files[name]
        path = os.path.join(directory, name)
        with open(path, "rb", opener=_no_follow) as f:
            size = os.fstat(f.fileno()).st_size
            if size != rec.bytes:
                return f"{name} is {size} bytes, its manifest records {rec.bytes}"
            if size == 0:
                found = checksum.of_bytes(b"")
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    found = checksum.of_bytes(mapped)
        if found != rec.checksum:
            return f"{name} hashes to {found}, its manifest records {rec.checksum}"
    return None


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def _plain_file(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


_step_of = layout.parse_step_dir


def _part_of(name: str) -> int | None:
    if name.startswith("part-") and name[5:].isascii() and name[5:].isdigit() and len(name) == 10:
        return int(name[5:])
    return None


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


DIRECT_BYTES = 1 << 20
"""Files at least this large move in a message of their own, mapped on both sides; smaller ones are bundled."""


def _messages(records: Mapping[str, FileRecord]) -> list[list[str]]:
    """A part's files as the messages that carry them (the same list on both sides): the small ones together first,
    then each large one alone."""
    names = sorted(records)
    small = [n for n in names if records[n].bytes < DIRECT_BYTES]
    return [*([small] if small else []), *([n] for n in names if records[n].bytes >= DIRECT_BYTES)]


def _outgoing(directory: str, names: list[str], records: Mapping[str, FileRecord], held: list[Any]) -> torch.Tensor:
    if len(names) == 1 and records[names[0]].bytes >= DIRECT_BYTES:
        f = open(os.path.join(directory, names[0]), "rb")  # noqa: SIM115 (closed with the transfer: `held`)
        held.append(f)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: nothing copied unless written
        held.append(mapped)
        return torch.frombuffer(mapped, dtype=torch.uint8)
    return _read_concat(directory, names) if names else torch.empty(0, dtype=torch.uint8)


def _incoming(directory: str, names: list[str], records: Mapping[str, FileRecord], held: list[Any]) -> torch.Tensor:
    size = sum(records[n].bytes for n in names)
    if len(names) == 1 and size >= DIRECT_BYTES:
        f = open(os.path.join(directory, names[0]), "w+b")  # noqa: SIM115 (closed with the transfer: `held`)
        held.append(f)
        f.truncate(size)
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_WRITE)
        held.append(mapped)
        return torch.frombuffer(mapped, dtype=torch.uint8)
    return torch.empty(size, dtype=torch.uint8)


def _read_concat(directory: str, names: Sequence[str]) -> torch.Tensor:
    sizes = [os.path.getsize(os.path.join(directory, n)) for n in names]
    out = torch.empty(sum(sizes), dtype=torch.uint8)
    view = out.numpy().data
    offset = 0
    for n, size in zip(names, sizes, strict=True):
        with open(os.path.join(directory, n), "rb") as f:
            got = f.readinto(view[offset : offset + size])
        if got != size:
            raise OSError(f"{n}: read {got} of {size} bytes")
        offset += size
    return out


def _distributed() -> bool:
    import torch.distributed as tdist

    return tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1


def _gather(value: int, group: Any = None) -> list[int]:
    if not _distributed():
        return [value]
    import torch.distributed as tdist

    t = torch.zeros(tdist.get_world_size(), dtype=torch.int64)
    t[tdist.get_rank()] = value
    tdist.all_reduce(t, group=group)
    return [int(x) for x in t.tolist()]


def _all(ok: bool, group: Any = None) -> bool:
    if not _distributed():
        return ok
    import torch.distributed as tdist

    t = torch.tensor([1 if ok else 0], dtype=torch.int64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MIN, group=group)
    return bool(t.item())


def _gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (JSON-able), through the process group: JSON on the wire, never pickle."""
    if not _distributed():
        return [json.loads(json.dumps(obj))]
    import torch.distributed as tdist

    raw = json.dumps(obj).encode()
    sizes = _gather(len(raw), group)
    world = tdist.get_world_size()
    buf = torch.zeros(max(sizes), dtype=torch.uint8)
    buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    out = [torch.zeros(max(sizes), dtype=torch.uint8) for _ in range(world)]
    tdist.all_gather(out, buf, group=group)
    return [json.loads(o[:n].numpy().tobytes()) for o, n in zip(out, sizes, strict=True)]
