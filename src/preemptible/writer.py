"""Getting a flattened state onto storage fast: file plan, writer threads, staging buffers.

Two paths, one file format:

- **Emergency (direct)**: training has stopped at the boundary, so tensors are written straight from their own
  memory: no snapshot, large writes, several files at once in parallel threads, hashed on the way. Small tensors
  are coalesced into one reusable buffer so 10,000 of them cost a few large writes, not 10,000 small ones.
- **Staged (async)**: the state is copied into preallocated staging buffers that are reused from save to save
  (a fresh allocation costs 4-10x a copy here: page faults), laid out exactly as the files will be, so the
  background writer sends each file as one header plus one large write. One staging copy of the state, no more.
  On CUDA the buffers are pinned and the copy runs on a side stream.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import json
import mmap
import operator
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from preemptible.errors import SaveCancelled
from preemptible.state import FlatState, group_of
from preemptible.store import checksum, compress, direct, layout
from preemptible.store import format as tensor_format
from preemptible.store.compress import Codec
from preemptible.store.io import Storage, WriteStream
from preemptible.store.layout import FileRecord
from preemptible.store.naming import file_stem
from preemptible.store.threads import DEFAULT_THREADS, PlanChanged, parallel_map, stamp, storage_seconds

DEFAULT_MAX_FILE_BYTES = 1 << 30
MIN_PART_BYTES = 64 << 20
COALESCE_BELOW = 1 << 20
ARENA_ALIGN = 4096  # file data regions start page-aligned in the arena, as on disk: direct I/O with no copy
HUGE_PAGE = 2 << 20  # a transparent huge page (x86-64, and arm64 with 4 KiB pages)
HUGE_ARENA_BYTES = 32 << 20  # arenas this large get a mapping of their own, on huge pages (`huge_page_arena`)
METADATA = {"format": "pt", "writer": "preemptible"}
_IS_CPU = operator.attrgetter("is_cpu")


@dataclass
class Progress:
    """Bytes written so far by one save, readable from other threads; and its cancel switch."""

    total: int = 0
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None  # epoch seconds by which the save must be durable, if any
    clock: Callable[[], float] = time.time  # epoch seconds, for the deadline
    monotonic: Callable[[], float] = time.monotonic

    meter: Any = None  # a `preemptible.progress.Meter` that logs how the save goes, if any

    def add(self, n: int) -> None:
        self.done += n  # one writer per file; the GIL keeps the int update whole
        if self.meter is not None:
            self.meter.add(n)
        if self.cancelled.is_set():
            raise SaveCancelled("the save was abandoned before it committed")

    def rate(self, now: float | None = None) -> float | None:
        """Bytes per second so far, or None before any byte."""
        elapsed = (self.monotonic() if now is None else now) - self.started
        return self.done / elapsed if self.done and elapsed > 0 else None


@dataclass(frozen=True)
class FileSpec:
    name: str
    items: tuple[tuple[str, torch.Tensor], ...]
    stored: dict[str, torch.dtype] = field(default_factory=dict)
    prepared: list[Any] | None = field(default=None, compare=False, repr=False)
    """Shared by the specs of one steady-state file, save after save: its safetensors layout and header, made
    once (see `tensor_format.encode`)."""

    @functools.cached_property
    def nbytes(self) -> int:  # once: a save asks more than once, and a file may hold 10,000s of tensors
        stored = self.stored
        return sum(t.nbytes if n not in stored else t.numel() * stored[n].itemsize for n, t in self.items)

    def all_cpu(self) -> bool:
        """Whether every tensor is on the CPU (asked from C: 10,000s of tensors)."""
        return all(map(_IS_CPU, map(operator.itemgetter(1), self.items)))


def plan_files(
    flat: FlatState,
    *,
    threads: int = DEFAULT_THREADS,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    total: int | None = None,
) -> list[FileSpec]:
    """Assign every tensor to a file: grouped by top-level entry, large groups split so threads share the work.

    Deterministic for a given state. Parts aim at a quarter of the state per writer thread (at least 64 MB, at
    most ``max_file_bytes``), so a work queue keeps every thread busy to the end.
    """
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, t in flat.tensors.items():
        groups.setdefault(group_of(name), []).append((name, t))
    total = flat.tensor_bytes if total is None else total
    target = min(max_file_bytes, max(MIN_PART_BYTES, total // max(1, 4 * threads)))
    specs: list[FileSpec] = []
    for group, items in groups.items():
        stem = file_stem(group)
        parts: list[list[tuple[str, torch.Tensor]]] = [[]]
        size = 0
        for item in items:
            n = flat.stored_bytes(*item)
            if parts[-1] and size + n > target:
                parts.append([])
                size = 0
            parts[-1].append(item)
            size += n
        for i, part in enumerate(parts):
            name = stem if len(parts) == 1 else f"{stem}-{i + 1:05d}-of-{len(parts):05d}"
            stored = {n: flat.stored[n] for n, _ in part if n in flat.stored}
            specs.append(FileSpec(f"{name}{layout.TENSOR_SUFFIX}", tuple(part), stored))
    return specs


class _Sink:
    """Writes to a storage stream: small pieces coalesced into a pooled buffer (`direct.PooledBuffer`, taken at
    the first small piece, given back by `release`), unless the stream gathers them itself, as the direct-I/O
    writer does; large ones passed through; counts progress, and the seconds spent in the stream (``io_s``)."""

    def __init__(self, stream: WriteStream, progress: Progress | None) -> None:
        self._stream = stream
        self._progress = progress
        self._buffer: direct.PooledBuffer | None = None
        self._view = memoryview(b"")
        self._used = 0
        self._coalesce = not getattr(stream, "coalesces", False)
        self.io_s = 0.0

    def write(self, data: memoryview) -> None:
        n = len(data)
        if n < COALESCE_BELOW and self._coalesce:
            if self._buffer is None:
                self._buffer = direct.PooledBuffer.take()
                self._view = self._buffer.view
            if self._used + n > len(self._view):
                self.flush()
            self._view[self._used : self._used + n] = data
            self._used += n
            return
        self.flush()
        t0 = stamp()
        self._stream.write(data)
        self.io_s += storage_seconds(t0)
        if self._progress is not None:
            self._progress.add(n)

    def flush(self) -> None:
        if self._used:
            t0 = stamp()
            self._stream.write(self._view[: self._used])
            self.io_s += storage_seconds(t0)
            if self._progress is not None:
                self._progress.add(self._used)
            self._used = 0

    def release(self) -> None:
        buffer, self._buffer = self._buffer, None
        if buffer is not None:
            self._view = memoryview(b"")
            buffer.give_back()


def stored_name(spec: FileSpec, codec: Codec | None) -> str:
    """The file a spec is written to: its own name, or with `compress.SUFFIX` when compressed."""
    return spec.name + compress.SUFFIX if codec is not None else spec.name


def write_tensor_file(
    storage: Storage,
    directory: str,
    spec: FileSpec,
    *,
    progress: Progress | None = None,
    blob: memoryview | None = None,
    codec: Codec | None = None,
    io: list[tuple[int, float]] | None = None,
    fill: Callable[[int], None] | None = None,
) -> FileRecord:
    """Write one tensor file. ``io``: ``(thread, seconds)`` is appended to it, the seconds this file spent in the
    storage stream (its writes, and its close, which makes it durable) on this thread: for the destination's
    measured bandwidth. ``fill``: fills ``blob`` piece by piece as it is written (`ArenaFill`; uncompressed only)."""
    stream = storage.open_write(storage.join(directory, stored_name(spec, codec)))
    sink = _Sink(stream, progress if codec is None else None)
    try:
        if codec is None:
            nbytes, digest, chunks = tensor_format.write(
                sink, spec.items, METADATA, stored=spec.stored, blob=blob, prepared=spec.prepared, fill=fill
            )
            sink.flush()
        else:
            assert fill is None, "a compressed file is written from a whole blob"
            nbytes, digest, stats = compress.write(
                sink,
                spec.items,
                METADATA,
                codec=codec,
                stored=spec.stored,
                blob=blob,
                on_decoded=progress.add if progress is not None else None,
            )
            sink.flush()
            t0 = stamp()
            stream.close()
            stats.io_s = sink.io_s + storage_seconds(t0)  # the sink timed each write
            codec.record(stats)
            if io is not None:
                io.append((threading.get_ident(), stats.io_s))
            return FileRecord(nbytes, digest)
    except BaseException:
        stream.abort()
        raise
    finally:
        sink.release()
    t0 = stamp()
    stream.close()
    if io is not None:
        io.append((threading.get_ident(), sink.io_s + storage_seconds(t0)))  # append: whole under the GIL
    return FileRecord(nbytes, digest, chunks)


def write_bytes(storage: Storage, directory: str, name: str, data: bytes) -> FileRecord:
    stream = storage.open_write(storage.join(directory, name))
    try:
        stream.write(memoryview(data))
    except BaseException:
        stream.abort()
        raise
    stream.close()
    return FileRecord(len(data), checksum.of_bytes(data))


def state_json(flat: FlatState) -> bytes:
    doc = {
        "format": "preemptible.state",
        "version": 1,
        "numpy": sorted(flat.numpy),
        "casts": {n: str(flat.tensors[n].dtype).removeprefix("torch.") for n in sorted(flat.stored)},
        "dtensors": {n: flat.dtensors[n] for n in sorted(flat.dtensors)},
        "tree": flat.tree,
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def write_files(
    storage: Storage,
    directory: str,
    specs: Sequence[FileSpec],
    *,
    threads: int = DEFAULT_THREADS,
    progress: Progress | None = None,
    blobs: dict[str, memoryview] | None = None,
    codec: Codec | None = None,
    io: list[tuple[int, float]] | None = None,
    meanwhile: Callable[[], bool] | None = None,
    fills: Mapping[str, Callable[[int], None]] | None = None,
) -> dict[str, FileRecord]:
    """Write the tensor files, largest first, ``threads`` at a time from one work queue; compressed with
    ``codec`` when given (its frames are encoded by the codec's own threads). ``io``: see `write_tensor_file`.
    ``meanwhile``: the check of the plan, run while the files are written (see `parallel_map`). ``fills``: per
    file, what fills its blob as it is written (`Staging.stage_lazily`).

    The first failure stops the others at their next write and is re-raised with its own type.

    Returns:
        The records by stored file name.
    """
    try:
        ordered = sorted(specs, key=lambda s: -s.nbytes)
    except RuntimeError:  # a tensor without bytes (sparse): a refill that must not be written, if checked
        if meanwhile is not None and not meanwhile():
            raise PlanChanged from None
        raise
    found = blobs or {}
    filling = fills or {}

    def write_one(spec: FileSpec) -> FileRecord:
        fill = filling.get(spec.name)
        if storage.kind != "object":
            return write_tensor_file(
                storage, directory, spec, progress=progress, blob=found.get(spec.name), codec=codec, io=io, fill=fill
            )
        from preemptible.store.objstore import retrying

        def upload() -> FileRecord:  # whole-file retry: a failed or short upload goes up again from the start
            record = write_tensor_file(  # a retry's fill copies nothing again: what it filled stays filled
                storage, directory, spec, progress=None, blob=found.get(spec.name), codec=codec, io=io, fill=fill
            )
            stored = storage.size(storage.join(directory, stored_name(spec, codec)))
            if stored != record.bytes:
                raise ConnectionError(f"{spec.name}: the store holds {stored} bytes of the {record.bytes} uploaded")
            return record

        budget = 30.0  # a background save may keep trying a while; an emergency one only within its deadline
        if progress is not None and progress.deadline is not None:
            budget = max(0.0, min(budget, progress.deadline - progress.clock() - 2.0))
        record = retrying(upload, what=f"upload of {spec.name}", budget_s=budget)
        if progress is not None:
            progress.add(spec.nbytes if codec is not None else record.bytes)
        return record

    records = parallel_map(write_one, ordered, threads=threads, name="preemptible-write", meanwhile=meanwhile)
    return {stored_name(s, codec): r for s, r in zip(ordered, records, strict=True)}


# staging --------------------------------------------------------------------------------------------------
@dataclass
class SavePlan:
    """What this process writes for one save: its tensor files and its state documents.

    One process writes everything. Under several ranks, replicated state is striped (each rank writes some of
    its files) and per-rank state (RNG streams, ...) goes to files and a state document of each rank's own.
    """

    specs: list[FileSpec]
    docs: dict[str, bytes]
    nbytes: int
    total_bytes: int  # tensor bytes of the whole checkpoint (all ranks)
    layout_token: object = None
    """Set by `checkpoint.steady`: plans with the same token have the same staging layout."""
    check: Callable[[], bool] | None = None
    """A check still to make that the plan fits the state, run while its files are written (`checkpoint.steady`);
    False: throw them away and plan again."""
    on_cpu: bool | None = None
    """Whether every tensor is on the CPU, when known already (`checkpoint.steady` knows its plans' devices)."""

    def all_cpu(self) -> bool:
        return self.on_cpu if self.on_cpu is not None else all(spec.all_cpu() for spec in self.specs)


@dataclass
class Staged:
    """A state copied into the staging arena: what the background writer needs, nothing live."""

    specs: list[FileSpec]
    blobs: dict[str, memoryview]
    docs: dict[str, bytes]
    nbytes: int
    step: int | None = None
    staged_at: float = 0.0
    seconds: float = 0.0


_Bucket = tuple[tuple[torch.device, torch.dtype, torch.dtype], list[torch.Tensor], list[int]]


class Staging:
    """One preallocated host arena, reused from save to save, laid out in file order.

    The arena is (re)allocated only when the state's layout changes. ``busy`` is held while a writer reads it,
    so a new snapshot never overwrites bytes that are still being written.

    Args:
        pin: pin the arena (page-locked) so device-to-host copies run asynchronously; default: when CUDA is
            available.
        clock, monotonic: epoch seconds and a monotonic clock (when a snapshot was taken, how long it took).
    """

    def __init__(
        self,
        *,
        pin: bool | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._clock = clock
        self._monotonic = monotonic
        self.busy = threading.Lock()
        self._arena: torch.Tensor | None = None
        self._key: tuple[object, ...] | None = None
        self._token: object = None
        self._buckets: tuple[list[_Bucket], list[FileSpec]] | None = None
        self._buckets_token: object = None
        self._spans: dict[Any, list[tuple[int, int]]] = {}  # per bucket of the cached layout: `_copy_spans`
        self._early_worth: bool | None = None  # for the cached layout: `_early_pays`
        self._fill_plan: list[tuple[list[torch.Tensor], list[int], list[int]]] | None = None  # `stage_lazily`'s
        self._early: tuple[object, list[threading.Thread], list[BaseException]] | None = None
        self._views: dict[str, torch.Tensor] = {}
        self._regions: dict[str, tuple[int, int]] = {}
        self.allocations = 0
        self.current: Staged | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self._arena is None else int(self._arena.numel())

    @staticmethod
    def _layout_key(specs: Sequence[FileSpec]) -> tuple[object, ...]:
        return tuple(
            (
                spec.name,
                tuple([n for n, _ in spec.items]),  # list comprehensions: a state may hold 10,000s of tensors
                tuple([t.shape for _, t in spec.items]),
                tuple([t.dtype for _, t in spec.items]),
                tuple(sorted((n, str(d)) for n, d in spec.stored.items())),
            )
            for spec in specs
        )

    def fits(self, specs: Sequence[FileSpec], token: object = None) -> bool:
        """True when the arena already has this layout: staging into it allocates nothing."""
        if self._arena is not None and token is not None and token is self._token:
            return True
        return self._arena is not None and self._layout_key(specs) == self._key

    def _prepare(self, specs: Sequence[FileSpec], token: object = None) -> None:
        if token is not None and token is self._token and self._arena is not None:
            return  # the same steady-state template as last time: the same layout
        self._token = token
        self._buckets_token = None
        key = self._layout_key(specs)
        if key == self._key:
            return
        offset = 0
        regions: dict[str, tuple[int, int]] = {}
        placements: list[tuple[str, int, tensor_format.Entry]] = []
        files = []
        for spec in specs:
            offset = -(-offset // ARENA_ALIGN) * ARENA_ALIGN
            entries = tensor_format.layout(spec.items, spec.stored)
            files.append(entries)
            size = entries[-1].end if entries else 0
            regions[spec.name] = (offset, offset + size)
            placements += [(spec.name, offset, e) for e in entries]
            offset += size
        self._arena = None  # free the old one first: never two arenas at once
        self._fill_plan = None
        arena = _aligned_empty(max(offset, 1), pin=self.pin)
        self.allocations += 1
        views = {}
        for _, base, e in placements:
            start = base + e.begin
            views[e.name] = arena[start : start + e.nbytes].view(e.dtype).view(e.shape)
        self._arena, self._views, self._regions, self._key = arena, views, regions, key
        # For `stage_lazily`: per file, in its data's order (not its items'): the views, item positions, data ends.
        fill_plan = []
        for spec, entries in zip(specs, files, strict=True):
            position = {n: i for i, (n, _) in enumerate(spec.items)}
            fill_plan.append(
                ([views[e.name] for e in entries], [position[e.name] for e in entries], [e.end for e in entries])
            )
        self._fill_plan = fill_plan

    def _bucket(self, specs: Sequence[FileSpec]) -> tuple[list[_Bucket], list[FileSpec]]:
        """The copies of a layout, grouped by (device, source dtype, stored dtype), and the specs of the staged
        bytes. The same for every save of one steady-state template."""
        views = self._views
        groups: dict[tuple[torch.device, torch.dtype, torch.dtype], tuple[list[torch.Tensor], list[int]]] = {}
        i = 0
        for spec in specs:
            for name, src in spec.items:
                dst = views[name]
                group = groups.setdefault((src.device, src.dtype, dst.dtype), ([], []))
                group[0].append(dst)
                group[1].append(i)
                i += 1
        # The views already hold the stored dtype, so the staged specs carry no casts.
        # Their safetensors layout is the live specs' (the same names, stored dtypes and shapes): one box for both.
        staged_specs = [
            FileSpec(
                s.name,
                tuple([(n, views[n]) for n, _ in s.items]),
                prepared=s.prepared if s.prepared is not None else [],
            )
            for s in specs
        ]
        return [(key, dsts, idx) for key, (dsts, idx) in groups.items()], staged_specs

    @property
    def early(self) -> bool:
        """An early copy (`begin`) is running or not yet taken by `stage`: it holds ``busy``."""
        return self._early is not None

    def begin(self, token: object, srcs: list[torch.Tensor]) -> bool:
        """Start copying ``srcs``, every tensor of a plan of layout ``token`` in file order, on threads, before the
        plan is checked: the check's Python work then runs beside the copy instead of before it (a state of 10,000s
        of small tensors: about a third of a background save's stall). Only when ``busy`` is free (then taken and
        held) and the arena already has this layout, all on CPU. A `stage` of a plan of this ``token`` takes the
        copy; of any other, it waits for it and copies again. `drop_early` waits for it and lets ``busy`` go.
        """
        if token is None or token is not self._buckets_token or token is not self._token or self._buckets is None:
            return False
        buckets = self._buckets[0]
        if any(key[0].type != "cpu" for key, _, _ in buckets) or not self._early_pays(buckets):
            return False
        if not self.busy.acquire(blocking=False):
            return False
        self.current = None  # the arena is being overwritten: it no longer holds the last staged step
        errors: list[BaseException] = []

        def copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
            try:
                _copy_all(dsts, srcs, non_blocking=False)
            except BaseException as e:  # the plan may not be this layout's: judged when it is known
                errors.append(e)

        threads = []
        parts = max(1, min(torch.get_num_threads(), 4) - 1)  # one core for the check meanwhile
        for key, dsts, idx in buckets:
            some = srcs if len(buckets) == 1 else [srcs[i] for i in idx]
            spans = self._spans.get((key, parts))
            if spans is None:
                spans = self._spans[(key, parts)] = _copy_spans(dsts, parts)
            for a, b in spans:
                threads.append(threading.Thread(target=copy, args=(dsts[a:b], some[a:b]), name="preemptible-stage"))
        self._early = (token, threads, errors)
        for t in threads:
            t.start()
        return True

    def _early_pays(self, buckets: list[_Bucket]) -> bool:
        """Whether copying before the check pays: for 10,000s of small tensors the check's Python work is a third of
        the stall. For a state of large tensors the check is short, and the copy runs fastest on the caller's thread,
        on torch's own intra-op threads (warm there: a fresh thread starts its own, about 15% slower for 1.2 GB; with
        the early copy this state's stall went from under to 1.2-1.4x a memcpy of its bytes)."""
        if self._early_worth is None:
            self._early_worth = any(_many_small(dsts) for _, dsts, _ in buckets)
        return self._early_worth

    def _take_early(self, token: object) -> bool:
        """Wait for the early copy; True when it is of ``token`` (then it stands for this stage's copy)."""
        early, self._early = self._early, None
        if early is None:
            return False
        began, threads, errors = early
        for t in threads:
            if t.ident is not None:  # started (one that could not start left `begin` with its error)
                t.join()
        if began is not token:
            return False
        if errors:
            raise errors[0]
        return True

    def drop_early(self) -> None:
        """Wait for an early copy that no `stage` took (a save that failed before staging), and let ``busy`` go."""
        if self._early is not None:
            try:
                self._take_early(None)
            finally:
                self.busy.release()

    def stage(self, plan: SavePlan, *, step: int | None = None, meanwhile: Callable[[], bool] | None = None) -> Staged:
        """Copy every tensor of the plan into the arena (the caller holds ``busy``). Returns what to write.

        ``meanwhile``: the plan's check, made while a CPU copy runs (first, when none does); False: `PlanChanged`
        (the arena then holds no whole state)."""
        t0 = self._monotonic()
        self.current = None  # until the copy is whole
        specs = plan.specs
        token = plan.layout_token
        if self._take_early(token):  # `begin` saw the arena laid out for this token, and only a stage changes it
            if meanwhile is not None and not meanwhile():
                raise PlanChanged
            return self._staged(plan, step, t0)
        buckets = self._laid_out(specs, token)[0]
        srcs_all = [t for spec in specs for _, t in spec.items]
        # no detach per tensor: the copies run under no_grad
        one = len(buckets) == 1
        pairs = {key: (dsts, srcs_all if one else [srcs_all[i] for i in idx]) for key, dsts, idx in buckets}
        cuda_streams: list[torch.cuda.Stream] = []
        for key, (dsts, srcs) in pairs.items():
            device = key[0]
            if device.type == "cuda":
                stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    _copy_all(dsts, srcs, non_blocking=self.pin)
                cuda_streams.append(stream)
            else:
                spans = self._spans.get(key)
                if spans is None:
                    spans = self._spans[key] = _copy_spans(dsts)
                _copy_split(dsts, srcs, spans, meanwhile=meanwhile)
                meanwhile = None
        for stream in cuda_streams:
            stream.synchronize()
        if meanwhile is not None and not meanwhile():
            raise PlanChanged
        return self._staged(plan, step, t0)

    def _laid_out(self, specs: Sequence[FileSpec], token: object) -> tuple[list[_Bucket], list[FileSpec]]:
        """The arena laid out for ``specs``, and its copies by bucket (`_bucket`, kept for a steady-state token)."""
        self._prepare(specs, token)
        assert self._arena is not None
        cached = self._buckets if token is not None and token is self._buckets_token else None
        if cached is None:
            cached = self._bucket(specs)
            self._buckets, self._buckets_token = cached, token
            self._spans = {}
            self._early_worth = None
        return cached

    def lay_out(self, plan: SavePlan) -> bool:
        """Lay the arena out for ``plan`` without copying anything (`Checkpointer.prepare`), its pages touched
        when it is new, so that the first copy into it faults none. False (nothing done) while a save holds it."""
        if not self.busy.acquire(blocking=False):
            return False
        try:
            before = self.allocations
            self._laid_out(plan.specs, plan.layout_token)
            if self.allocations != before and not self.pin:  # pinned memory is resident from the start
                assert self._arena is not None
                self._arena.zero_()
        finally:
            self.busy.release()
        return True

    def stage_lazily(self, plan: SavePlan, *, step: int | None = None) -> tuple[Staged, dict[str, ArenaFill]]:
        """`stage` without the copy, for a blocking save of CPU tensors (the caller holds ``busy``): each file's
        region is filled by the thread that writes it, one piece before it goes out (`ArenaFill`, passed to
        `write_files` as ``fills``).

        Why: the copy of 10,000s of small tensors into the arena (120 MB: 16 ms on 2 threads here) came before the
        first write; filled piece by piece, the disk starts after one piece's copy, and one thread's copies overlap
        the other's writes, as the bounce-buffer copies of large tensors do (`direct.DirectWriter`). The arena holds
        a whole state only once every fill has run to its end: ``current`` stays None (the caller sets it after
        the writes)."""
        t0 = self._monotonic()
        self.current = None
        specs = plan.specs
        fill_plan = self._fills_of(specs, plan.layout_token)
        fills = {
            spec.name: ArenaFill(dsts, [spec.items[i][1] for i in order], ends)
            for spec, (dsts, order, ends) in zip(specs, fill_plan, strict=True)
        }
        staged = self._staged(plan, step, t0)
        self.current = None
        return staged, fills

    def _fills_of(
        self, specs: Sequence[FileSpec], token: object
    ) -> list[tuple[list[torch.Tensor], list[int], list[int]]]:
        """The arena laid out for ``specs``, and per file what fills it (made with the layout, by `_prepare`)."""
        self._laid_out(specs, token)
        assert self._fill_plan is not None
        return self._fill_plan

    def _staged(self, plan: SavePlan, step: int | None, t0: float) -> Staged:
        assert self._arena is not None
        assert self._buckets is not None
        staged_specs = self._buckets[1]
        arena_bytes = memoryview(self._arena.numpy())  # type: ignore[arg-type]
        blobs = {name: arena_bytes[a:b] for name, (a, b) in self._regions.items()}
        staged = Staged(
            staged_specs,
            blobs,
            dict(plan.docs),
            plan.nbytes,
            step=step,
            staged_at=self._clock(),
            seconds=self._monotonic() - t0,
        )
        self.current = staged
        return staged


class ArenaFill:
    """Copies one file's tensors into their arena views, in file order, as far as a data offset asks (each call
    copies the tensors that end at or before it, and the one it falls in): one ``_foreach_copy_``, which lets the
    GIL go, per piece written. Used by the one thread that writes the file."""

    __slots__ = ("_done", "_dsts", "_ends", "_srcs")

    def __init__(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], ends: list[int]) -> None:
        self._dsts, self._srcs, self._ends = dsts, srcs, ends
        self._done = 0  # tensors copied so far

    def __call__(self, upto: int) -> None:
        ends = self._ends
        if not ends:
            return
        stop = len(ends) if upto >= ends[-1] else bisect.bisect_left(ends, upto) + 1
        if stop > self._done:
            _copy_all(self._dsts[self._done : stop], self._srcs[self._done : stop], non_blocking=False)
            self._done = stop


def _aligned_empty(nbytes: int, *, pin: bool) -> torch.Tensor:
    """A page-aligned uint8 buffer (pinned memory is page-aligned already; a plain one is cut from a slightly
    larger allocation). A large one is a mapping of its own on huge pages where Linux has them (`huge_page_arena`)."""
    if pin:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    if nbytes >= HUGE_ARENA_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        return huge_page_arena(nbytes)
    raw = torch.empty(nbytes + ARENA_ALIGN, dtype=torch.uint8)
    skew = (-raw.data_ptr()) % ARENA_ALIGN
    return raw[skew : skew + nbytes]


def huge_page_arena(nbytes: int) -> torch.Tensor:
    """``nbytes`` (not touched yet) on a 2 MiB boundary of an anonymous mapping of its own, advised to use
    transparent huge pages (``madvise(MADV_HUGEPAGE)``, which takes effect where THP is ``always`` or ``madvise``,
    the usual default). The mapping goes back to the kernel when the last view of it is freed.

    Why huge pages: each background save's direct writes pin the arena's pages in the kernel. With 2 MiB pages a
    1.2 GB save here took 0.055 s of system CPU instead of 0.097 and ran 0.92 s instead of 1.06 (medians of 8
    alternating saves), which is what it takes from a training loop beside it. The first copy into a fresh arena
    faults 512 times fewer (1.2 GB: 0.07 s against 0.32) where free huge pages are at hand; on a VM whose balloon
    hands free memory back to its host (free page reporting, as here) they must first come back, and that first
    copy took 1.7-1.9 s instead of 0.3.

    Why a mapping of its own: the advice sticks to the address range. Given to memory from malloc, which may come
    from its heap, it would outlive the arena there, and later small allocations would get huge pages too.
    A kernel without THP refuses the advice (EINVAL): the arena then has ordinary pages."""
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)  # never touched outside the arena
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # holds the mapping until the last view is freed
    skew = (-whole.data_ptr()) % HUGE_PAGE
    with contextlib.suppress(OSError):  # EINVAL from a kernel built without THP
        mapping.madvise(mmap.MADV_HUGEPAGE, skew, nbytes)
    return whole[skew : skew + nbytes]


@torch.no_grad()
def _copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor], *, non_blocking: bool) -> None:
    if len(dsts) > 8 and hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dsts, srcs, non_blocking=non_blocking)
    else:
        for d, s in zip(dsts, srcs, strict=True):
            d.copy_(s, non_blocking=non_blocking)


SPLIT_COPY_MIN = 256
"""CPU copies of at least this many tensors, each under `COALESCE_BELOW` on average, are split across threads."""


def _many_small(dsts: list[torch.Tensor]) -> bool:
    """At least `SPLIT_COPY_MIN` tensors, under `COALESCE_BELOW` bytes on average: a copy torch makes one tensor
    after another on one thread."""
    return len(dsts) >= SPLIT_COPY_MIN and sum(d.nbytes for d in dsts) < COALESCE_BELOW * len(dsts)


def _copy_spans(dsts: list[torch.Tensor], parts: int | None = None) -> list[tuple[int, int]]:
    """How to split a CPU copy into runs of about equal bytes, one per thread (one run: not worth splitting). torch
    copies a large tensor on all its threads, but 10,000s of small ones one after the other on one."""
    parts = min(torch.get_num_threads(), 4) if parts is None else parts
    if parts < 2 or not _many_small(dsts):
        return [(0, len(dsts))]
    nbytes = sum(d.nbytes for d in dsts)
    cuts, acc, share = [0], 0, nbytes / parts
    for i, d in enumerate(dsts):
        acc += d.nbytes
        if acc >= share * len(cuts) and len(cuts) < parts:
            cuts.append(i + 1)
    cuts.append(len(dsts))
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _copy_split(
    dsts: list[torch.Tensor],
    srcs: list[torch.Tensor],
    spans: list[tuple[int, int]],
    *,
    meanwhile: Callable[[], bool] | None = None,
) -> None:
    """`_copy_all` of CPU tensors, the ``spans`` at once on threads of their own (each ``_foreach_copy_`` lets the
    GIL go). The training loop waits for this copy (the stall of a background save), so its cores are free for it.
    ``meanwhile``: see `parallel_map`."""
    parallel_map(
        lambda span: _copy_all(dsts[span[0] : span[1]], srcs[span[0] : span[1]], non_blocking=False),
        spans,
        threads=len(spans),
        name="preemptible-stage",
        meanwhile=meanwhile,
    )
