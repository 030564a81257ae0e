"""Elastic restore: a checkpoint read at another world size, or into another wrapper, each rank reading only the
byte ranges of the slices it needs.

A sharded tensor (DTensor, FSDP2 ``fully_shard``) is stored as every rank's local shard in that rank's own file,
and the rank's state document records the tensor's global shape, placements and the global offset of the shard
(`state.dtensor_meta`). ``Shard(0)`` follows ``torch.chunk``'s rule (`state.shard_rows`), so rank ``k`` of ``N``
holds a known run of rows, and the run of a contiguous tensor is one contiguous byte range of its file.

To restore, each rank works out what it needs of every stored tensor (a *target*):

- its live counterpart is a DTensor (or, for an optimizer's moments not created yet, its parameter is): the rows
  that rank holds at the live world size and placement;
- otherwise (a plain model, DDP, evaluation in one process): the whole tensor.

and reads the overlap of its target with each stored piece (a shard, or a replicated tensor stored whole) with
one ranged read per piece, widened only to the piece checksums of the file (`format.Chunks`), which it verifies.
Nothing else of any file is read. Checkpoints written before piece checksums existed are read a whole file at
a time (verifying the file's checksum), then sliced.

Supported: ``Shard(0)`` and ``Replicate`` on a 1-D mesh, on either side, with uneven shards. Anything else (a
2-D mesh, ``Shard(1)``, a global shape that differs) is a `StateMismatchError` naming the tensors, raised
before any live tensor changes.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import struct
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import torch

from preemptible.checkpoint.reader import Opened, Reader, open_tensor, source_rank
from preemptible.errors import CheckpointCorruptError, StateMismatchError
from preemptible.state import group_of, is_dtensor, parse_placement, shard_rows
from preemptible.store import checksum, compress, layout
from preemptible.store import format as tensor_format
from preemptible.store.naming import file_stem, stem_of_file
from preemptible.store.threads import parallel_map

READ_PIECE = 16 << 20  # a ranged read is split into requests of this size (a multiple of every chunk size)


@dataclass(frozen=True)
class Target:
    """What this rank needs of one stored tensor: rows ``[begin, end)`` of dimension 0 (a 0-d tensor is one row),
    laid out like ``template`` (a live DTensor) or, without one, as a plain tensor."""

    shape: tuple[int, ...]  # global
    dtype: torch.dtype  # as stored
    begin: int
    end: int
    template: Any = None
    live: bool = False  # the template is this tensor's own live counterpart (a parameter), not a moment's param

    @property
    def local_shape(self) -> tuple[int, ...]:
        return (self.end - self.begin, *self.shape[1:]) if self.shape else ()


@dataclass(frozen=True)
class Piece:
    """A stored part of a tensor: ``entry`` in ``file``, holding global rows from ``begin``."""

    file: str
    entry: tensor_format.Entry
    begin: int


@dataclass(frozen=True)
class Copy:
    """One ranged read: ``nbytes`` at ``src`` of a stored tensor's data into ``dst`` of a target's."""

    name: str
    piece: Piece
    src: int
    dst: int
    nbytes: int


@dataclass
class Plan:
    """How this rank restores a checkpoint at another layout."""

    saved_world: int
    world: int
    targets: dict[str, Target] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)
    data_offset: dict[str, int] = field(default_factory=dict)  # where each file's tensor data starts
    first_chunk: dict[tuple[str, str], int] = field(default_factory=dict)  # (file, tensor) -> its first piece sum
    frames: dict[str, compress.Index] = field(default_factory=dict)  # compressed files: their frame index
    resharded: list[str] = field(default_factory=list)  # tensors read as other slices than were stored


def rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """A tensor as rows of dimension 0: (rows, elements per row); a 0-d tensor is one row of one element."""
    if not shape:
        return 1, 1
    return shape[0], math.prod(shape[1:])


class Live:
    """The live layout a stored tensor is restored into."""

    def __init__(self, state: Mapping[str, Any], live_dtensors: Mapping[str, Any]) -> None:
        self.dtensors = live_dtensors
        self.params: dict[str, Any] = {}
        for entry, obj in state.items():
            if isinstance(obj, torch.optim.Optimizer):
                i = 0
                for group in obj.param_groups:
                    for p in group["params"]:
                        if is_dtensor(p):
                            self.params[f"{entry}/state/{i}/"] = p
                        i += 1

    def of(self, name: str) -> tuple[Any, bool]:
        """The live DTensor a stored tensor becomes, if any, and whether it is the tensor's own live counterpart
        (else: the parameter an optimizer's per-parameter state belongs to, ``<optimizer>/state/<i>/...``, whose
        state is created lazily at the first step; the same numbering as ``Optimizer.state_dict()``)."""
        if name in self.dtensors:
            return self.dtensors[name], True
        head, sep, _ = name.rpartition("/")
        return (self.params.get(head + sep) if sep else None), False


def needed(opened: Opened, live: Live, world: int) -> bool:
    """Whether the checkpoint as opened must be read another way than whole files into the same layout."""
    if opened.dtensors and opened.manifest.world_size != world:
        return True
    for name, entry in opened.entries.items():
        template, direct = live.of(name)
        meta = opened.dtensors.get(name)
        if meta is None and template is not None and not direct and tuple(template.shape) != entry.shape:
            template = None  # beside the parameter, not shaped like it (the optimizer's step): stays plain
        if (meta is None) != (template is None):
            return True
        if meta is not None and template is not None and meta.get("placements") != list(map(repr, template.placements)):
            return True
    return False


def _supported(meta: Mapping[str, Any]) -> str | None:
    """Why a stored sharded layout cannot be resharded, or None."""
    mesh = meta.get("mesh")
    placements = meta.get("placements")
    if not isinstance(mesh, list) or len(mesh) != 1 or not isinstance(placements, list) or len(placements) != 1:
        return f"a {len(mesh) if isinstance(mesh, list) else '?'}-D mesh with placements {placements}"
    if placements[0] not in ("Shard(dim=0)",) and not str(placements[0]).startswith("Replicate"):
        return f"placement {placements[0]}"
    return None


def _live_supported(t: Any) -> str | None:
    if t.device_mesh.ndim != 1 or len(t.placements) != 1:
        return f"a {t.device_mesh.ndim}-D mesh with placements {list(map(repr, t.placements))}"
    p = repr(t.placements[0])
    if p != "Shard(dim=0)" and not p.startswith("Replicate"):
        return f"placement {p}"
    return None


def open_resharded(reader: Reader, step: int, *, rank: int, world: int, live: Live) -> Opened:
    """Read and check everything but tensor data for a restore at another layout, and plan the ranged reads.

    Raises:
        StateMismatchError: the checkpoint cannot be mapped onto the live layout (naming every tensor).
        CheckpointCorruptError: its documents or headers are damaged, or disagree with each other.
    """
    opened = reader.open_base(step)
    src = opened.source_rank = source_rank(rank, opened.manifest.world_size)
    job = _Resharding(reader, opened, src=src, world=world, live=live)
    job.read_documents()
    job.find_sources()
    wanted = job.wanted_files()
    headers = parallel_map(
        lambda n: _header(reader, opened, job.plan, n), wanted, threads=reader.threads, name="preemptible-head"
    )
    opened.selected = [layout.STATE, *[n for n in job.docs if n != layout.STATE], *wanted]
    pieces = job.pieces(wanted, headers)
    for name in [*pieces, *(n for n in job.sources if n not in pieces)]:  # a shard may hold no rows here
        job.cover(name, pieces.get(name, []))
    if job.mismatched:
        raise _refuse(opened, world, [], job.mismatched)
    opened.reshard = job.plan
    return opened


class _Resharding:
    """The phases of `open_resharded`, and what they find along the way."""

    def __init__(self, reader: Reader, opened: Opened, *, src: int, world: int, live: Live) -> None:
        self.reader = reader
        self.opened = opened
        self.world = world
        self.live = live
        self.saved = opened.manifest.world_size
        self.src = src  # the rank whose own files this rank reads
        self.bad = opened.bad
        self.plan = Plan(saved_world=self.saved, world=world)
        self.docs: dict[str, Any] = {}
        self.sharded_groups: set[str] = set()
        self.metas: dict[str, dict[str, Any]] = {}
        self.sources: dict[str, tuple[tuple[int, ...], list[int]]] = {}  # sharded tensor -> its shape, needed ranks
        self.sharded_targets: dict[str, Target] = {}
        self.stored_dtype: dict[str, torch.dtype] = {}
        self.unsupported: list[str] = []
        self.mismatched: list[str] = []

    def read_documents(self) -> None:
        """The state documents: the shared one, rank 0's (the sharding records) and this rank's source's own;
        the tree merged from them and the sharding records gathered."""
        reader, opened, files = self.reader, self.opened, self.opened.manifest.files
        state_doc = reader.read_doc(opened, layout.STATE)
        docs = {layout.STATE: state_doc}
        first = f"state{layout.rank_suffix(0)}.json"
        own = f"state{layout.rank_suffix(self.src)}.json"
        for name in (first, own):
            if name in files and name not in docs:
                docs[name] = reader.read_doc(opened, name)
        sharded_doc = docs.get(first, state_doc)
        self.sharded_groups = {group_of(n) for n in sharded_doc.get("dtensors") or {}} | {
            group_of(n) for n in state_doc.get("dtensors") or {}
        }
        tree: dict[str, Any] = dict(state_doc["tree"])
        tree.update({k: v for k, v in sharded_doc["tree"].items() if k in self.sharded_groups})
        if own in docs:
            tree.update({k: v for k, v in docs[own]["tree"].items() if k not in self.sharded_groups})
        opened.tree = tree
        for doc in docs.values():
            reader.merge_doc(opened, doc)
        for doc in (state_doc, sharded_doc):
            self.metas.update(doc.get("dtensors") or {})
        opened.dtensors = self.metas
        self.docs = docs

    def target_for(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Target:
        """What this rank needs of stored tensor ``name`` (noting a live layout it cannot be mapped onto)."""
        template, direct = self.live.of(name)
        if template is not None and tuple(template.shape) != shape:
            if direct or name in self.metas:
                self.mismatched.append(f"{name}: global shape {list(shape)} in checkpoint, {list(template.shape)} live")
            template = None  # beside the parameter, not shaped like it (the optimizer's step): stays plain
        n = rows(shape)[0]
        if template is None:
            return Target(shape, dtype, 0, n)
        why = _live_supported(template)
        if why is not None:
            self.unsupported.append(f"{name}: live {why}")
            return Target(shape, dtype, 0, n)
        if repr(template.placements[0]).startswith("Replicate"):
            return Target(shape, dtype, 0, n, template, direct)
        coord = template.device_mesh.get_coordinate()
        begin, end = shard_rows(n, template.device_mesh.size(), coord[0] if coord else 0)
        return Target(shape, dtype, begin, end, template, direct)

    def find_sources(self) -> None:
        """Which ranks' files hold what this rank needs of each sharded tensor; refuses layouts it cannot map."""
        ranks_with_files = {layout.file_rank(n) for n in self.opened.manifest.files} - {None}
        for name, meta in self.metas.items():
            why = _supported(meta)
            if why is not None:
                self.unsupported.append(f"{name}: stored as {why}")
                continue
            try:
                shape = tuple(int(d) for d in meta["shape"])
            except (KeyError, TypeError, ValueError) as err:
                raise self.bad(f"the sharding record of {name!r} is malformed ({err})") from err
            # its dtype is set from the header
            t = self.sharded_targets[name] = self.target_for(name, shape, torch.float32)
            if str(meta["placements"][0]).startswith("Replicate") or self.saved == 1 or not ranks_with_files:
                sources = [self.src]
            else:
                needed_rows = (t.begin, t.end)
                sources = [
                    k for k in range(self.saved) if _overlap(shard_rows(rows(shape)[0], self.saved, k), needed_rows)
                ]
            self.sources[name] = (shape, sources)
        if self.unsupported or self.mismatched:
            raise _refuse(self.opened, self.world, self.unsupported, self.mismatched)

    def wanted_files(self) -> list[str]:
        """The tensor files whose headers are read: the replicated files, the needed ranks' files of sharded
        entries, this rank's source's own files."""
        safe_sharded = {file_stem(g) for g in self.sharded_groups}
        need_ranks = {self.src} | {k for _, ks in self.sources.values() for k in ks}  # src: plain tensors beside
        wanted = []
        for name in self.opened.manifest.files:
            if not layout.is_tensor_file(name):
                continue
            owner = layout.file_rank(name)
            if owner is None:
                wanted.append(name)
            elif stem_of_file(name) in safe_sharded:
                if owner in need_ranks:
                    wanted.append(name)
            elif owner == self.src:
                wanted.append(name)
        return wanted

    def pieces(self, wanted: list[str], headers: list[list[tensor_format.Entry]]) -> dict[str, list[Piece]]:
        """The stored pieces of every tensor this rank reads, from the files' headers (each checked to hold the
        rows its rank's part should)."""
        pieces: dict[str, list[Piece]] = {}
        plain: dict[str, list[tuple[int | None, Piece]]] = {}
        for name, entries in zip(wanted, headers, strict=True):
            owner = layout.file_rank(name)
            self.opened.file_entries[name] = entries
            for e in entries:
                self.stored_dtype[e.name] = e.dtype
                if e.name not in self.sources:
                    plain.setdefault(e.name, []).append((owner, Piece(name, e, 0)))
                    continue
                piece = self._shard_piece(name, owner, e)
                if piece is not None:
                    pieces.setdefault(e.name, []).append(piece)
        for name, candidates in plain.items():
            pieces[name] = [self._pick_plain(name, candidates)]
        return pieces

    def _shard_piece(self, file: str, owner: int | None, e: tensor_format.Entry) -> Piece | None:
        """The piece of a sharded tensor that ``file`` (of rank ``owner``) holds, or None when no rank needed."""
        shape, sources = self.sources[e.name]
        placement = str(self.metas[e.name]["placements"][0])
        if owner is None or placement.startswith("Replicate"):
            begin, end = 0, rows(shape)[0]
        elif owner in sources:
            begin, end = shard_rows(rows(shape)[0], self.saved, owner)
        else:
            return None
        want = (end - begin, *shape[1:]) if shape else ()
        if e.shape != want:
            raise self.bad(
                f"{file} holds {e.name!r} with shape {list(e.shape)}; rank {owner}'s part of a {list(shape)} "
                f"tensor stored as {placement} by {self.saved} rank(s) has shape {list(want)}"
            )
        return Piece(file, e, begin)

    def _pick_plain(self, name: str, candidates: list[tuple[int | None, Piece]]) -> Piece:
        """The one stored copy of a plain tensor read: a tensor in several files is refused, but for per-rank
        copies of a plain tensor beside shards (the optimizer's step): this rank's source's, or the first."""
        owners = [o for o, _ in candidates]
        if (None in owners and len(candidates) > 1) or len(set(owners)) != len(owners):
            raise self.bad(f"tensor {name!r} appears in more than one file: {sorted(p.file for _, p in candidates)}")
        return next((p for o, p in candidates if o in (None, self.src)), min(candidates, key=lambda x: x[0] or 0)[1])

    def cover(self, name: str, found: list[Piece]) -> None:
        """Plan the ranged reads of tensor ``name``'s target from its stored pieces, which must cover it."""
        if name in self.sharded_targets:
            t = dataclasses.replace(self.sharded_targets[name], dtype=self.stored_dtype[name])
        else:
            t = self.target_for(name, found[0].entry.shape, self.stored_dtype[name])
        plan = self.plan
        plan.targets[name] = t
        self.opened.entries[name] = tensor_format.Entry(name, t.dtype, t.local_shape, 0, 0)
        if t.template is not None or name in self.sources:
            plan.resharded.append(name)
        row_bytes = rows(t.shape)[1] * tensor_format.itemsize(t.dtype)
        covered = 0
        for p in sorted(found, key=lambda p: p.begin):
            p_rows = rows(p.entry.shape)[0]
            a, b = max(t.begin, p.begin), min(t.end, p.begin + p_rows)
            if a >= b or row_bytes == 0:
                continue
            if covered >= t.end - t.begin:
                break  # a replicated tensor stored more than once: one copy is enough
            plan.copies.append(Copy(name, p, (a - p.begin) * row_bytes, (a - t.begin) * row_bytes, (b - a) * row_bytes))
            covered += b - a
        if row_bytes and covered != t.end - t.begin:
            raise self.bad(
                f"the stored pieces of {name!r} cover {covered} of the {t.end - t.begin} rows this rank needs"
            )


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return max(a[0], b[0]) < min(a[1], b[1])


def _refuse(opened: Opened, world: int, unsupported: list[str], mismatched: list[str]) -> StateMismatchError:
    lines = [*mismatched, *unsupported]
    shown = "\n".join(f"  {d}" for d in lines[:50])
    more = f"\n  ... and {len(lines) - 50} more" if len(lines) > 50 else ""
    hint = (
        "Resharding supports Shard(0) and Replicate on a 1-D mesh; restore this one with the mesh it was saved "
        f"with ({opened.manifest.world_size} ranks)"
        if unsupported
        else "Build the model exactly as when the checkpoint was saved (only the number of ranks may change)"
    )
    return StateMismatchError(
        f"the checkpoint of step {opened.step} at {opened.directory}, saved by {opened.manifest.world_size} "
        f"rank(s), cannot be restored on {world}:\n{shown}{more}\n{hint}. Nothing was loaded.",
        path=opened.directory,
        step=opened.step,
        differences=lines,
    )


def _header(reader: Reader, opened: Opened, plan: Plan, name: str) -> list[tensor_format.Entry]:
    """A file's header by ranged reads, verified against its piece checksums when the manifest has them."""
    rec = opened.manifest.files[name]
    path = reader.storage.join(opened.files_dir, name)
    if compress.is_compressed(name):  # ranged reads decode only the frames they need, each verified
        try:
            index = compress.read_index(partial(reader.storage.read_range, path), rec.bytes, where=path)
            entries = compress.read_header_frame(partial(reader.storage.read_range, path), index, where=path)
        except CheckpointCorruptError as err:
            raise opened.bad(str(err)) from err
        opened.meta_bytes += len(index.tail) + index.frames[0].stored + compress.TAIL_BYTES
        plan.frames[name] = index
        plan.data_offset[name] = index.frames[0].decoded
        return entries
    head = _read(reader, opened, path, 0, min(8, rec.bytes))
    if len(head) < 8:
        raise opened.bad(f"{name} is {rec.bytes} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", head)
    if n > tensor_format.MAX_HEADER_BYTES or 8 + n > rec.bytes:
        raise opened.bad(f"{name}: header length {n} is impossible for a file of {rec.bytes} bytes")
    raw = _read(reader, opened, path, 8, n)
    opened.meta_bytes += 8 + n
    if rec.chunks is not None:
        found = checksum.of_bytes(head + raw)
        if found != rec.chunks.digest(0):
            raise opened.bad(f"{name}: the header hashes to {found}, COMMIT.json records {rec.chunks.digest(0)}")
    try:
        entries, _ = tensor_format.parse_header(raw, data_bytes=rec.bytes - 8 - n, where=path)
    except CheckpointCorruptError as err:
        raise opened.bad(str(err)) from err
    if rec.chunks is not None:
        count = 1
        for e in sorted(entries, key=lambda e: e.begin):
            plan.first_chunk[(name, e.name)] = count
            count += -(-e.nbytes // rec.chunks.bytes)
        if count != rec.chunks.count:
            raise opened.bad(
                f"{name}: its header makes {count} checksummed pieces, COMMIT.json records {rec.chunks.count}"
            )
    plan.data_offset[name] = 8 + n
    return entries


def _read(reader: Reader, opened: Opened, path: str, offset: int, n: int) -> bytes:
    buf = bytearray(n)
    got = reader.storage.read_range(path, offset, memoryview(buf))
    if got != n:
        raise opened.bad(f"{path} ends early: expected {n} bytes at offset {offset}, found {got} (truncated?)")
    return bytes(buf)


def read_resharded(reader: Reader, opened: Opened) -> dict[str, Any]:
    """Read every planned slice, verifying piece checksums, and rebuild the state (DTensors on the live mesh)."""
    plan: Plan = opened.reshard
    out = {n: _target_tensor(t, n in opened.casts) for n, t in plan.targets.items()}
    whole: dict[str, dict[str, torch.Tensor]] = {}
    lock = threading.Lock()
    counted = [0]

    def count(n: int) -> None:
        with lock:
            counted[0] += n

    def run(c: Copy) -> None:
        dst = tensor_format.byte_view(out[c.name])[c.dst : c.dst + c.nbytes]
        rec = opened.manifest.files[c.piece.file]
        if c.piece.file in plan.frames:
            _ranged_frames(reader, opened, c, dst, frames)
            return
        if rec.chunks is None:  # an older checkpoint: read the file whole once, verifying its checksum
            with lock:
                tensors = whole.get(c.piece.file)
                if tensors is None:
                    tensors = whole[c.piece.file] = _whole(reader, opened, c.piece.file)
                    counted[0] += rec.bytes
            src = tensor_format.byte_view(tensors[c.piece.entry.name])
            dst[:] = src[c.src : c.src + c.nbytes]
            return
        _ranged(reader, opened, c, dst, count=count)

    frames = _Frames(reader, opened, plan.copies, count)
    parallel_map(run, plan.copies, threads=reader.threads, name="preemptible-read")
    opened.data_bytes += counted[0]
    tensors: dict[str, Any] = dict(out)
    for name, dtype in opened.casts.items():
        if name in tensors:
            tensors[name] = tensors[name].to(dtype)
    _wrap(plan, tensors)
    return reader.rebuild(opened, tensors)


def _target_tensor(t: Target, recast: bool) -> torch.Tensor:
    """Where a target is read to: the live shard itself when it has the layout the file holds (no copy later, as
    on the same-size path), else a new tensor."""
    if t.live and not recast:
        local = t.template.to_local()
        if (
            type(local) in (torch.Tensor, torch.nn.Parameter)
            and local.device.type == "cpu"
            and local.dtype == t.dtype
            and tuple(local.shape) == t.local_shape
            and local.is_contiguous()
        ):
            return cast(torch.Tensor, local.detach())
    return torch.empty(t.local_shape, dtype=t.dtype)


def _whole(reader: Reader, opened: Opened, name: str) -> dict[str, torch.Tensor]:
    rec = opened.manifest.files[name]
    path = reader.storage.join(opened.files_dir, name)
    with open_tensor(reader.storage, path, rec, opened) as (source, size, expected):
        try:
            return tensor_format.read(source, size, where=path, expected_checksum=expected)
        except CheckpointCorruptError as e:
            raise opened.bad(str(e)) from e


def _ranged(reader: Reader, opened: Opened, c: Copy, dst: memoryview, *, count: Callable[[int], None]) -> None:
    """Read the checksummed pieces of the file that hold ``c``'s bytes and verify them: the pieces wholly inside
    the range straight into ``dst`` (no copy), the one or two it cuts through into a scratch buffer, then their
    part copied out."""
    plan: Plan = opened.reshard
    rec = opened.manifest.files[c.piece.file]
    assert rec.chunks is not None
    size = rec.chunks.bytes
    e = c.piece.entry
    path = reader.storage.join(opened.files_dir, c.piece.file)
    base = plan.data_offset[c.piece.file] + e.begin
    first = plan.first_chunk[(c.piece.file, e.name)]
    start, stop = c.src, c.src + c.nbytes

    def fetch(lo: int, into: memoryview) -> None:
        """Read the pieces at ``[lo, lo + len(into))`` of the tensor's data into ``into`` and verify each."""
        got = reader.storage.read_range(path, base + lo, into)
        count(got)
        if got != len(into):
            raise opened.bad(f"{c.piece.file} ends early: expected {len(into)} bytes at {base + lo}, found {got}")
        for j in range(0, len(into), size):
            found = checksum.of_bytes(into[j : j + size])
            index = first + (lo + j) // size
            if found != rec.chunks.digest(index):  # type: ignore[union-attr]
                raise opened.bad(
                    f"{c.piece.file}: checksum mismatch in bytes {base + lo + j}-"
                    f"{base + lo + min(j + size, len(into)) - 1} (tensor {e.name!r}): COMMIT.json records "
                    f"{rec.chunks.digest(index)}, the bytes hash to {found} (the file changed after it was "  # type: ignore[union-attr]
                    "written: bit rot, a partial copy, or tampering)"
                )

    inner_lo = -(-start // size) * size  # the pieces wholly inside [start, stop)
    inner_hi = stop if stop == e.nbytes else stop // size * size
    if inner_lo < inner_hi:
        step = max(READ_PIECE, size)
        for lo in range(inner_lo, inner_hi, step):
            hi = min(lo + step, inner_hi)
            fetch(lo, dst[lo - start : hi - start])
    for k in sorted({start // size, (stop - 1) // size}):  # the pieces it cuts through, if any
        lo, hi = k * size, min((k + 1) * size, e.nbytes)
        if inner_lo <= lo and hi <= inner_hi:
            continue
        scratch = tensor_format.byte_view(torch.empty(hi - lo, dtype=torch.uint8))
        fetch(lo, scratch)
        a, b = max(start, lo), min(stop, hi)
        dst[a - start : b - start] = scratch[a - lo : b - lo]


def _span(plan: Plan, c: Copy) -> tuple[int, int]:
    """``c``'s bytes as decoded offsets into its file."""
    lo = plan.data_offset[c.piece.file] + c.piece.entry.begin + c.src
    return lo, lo + c.nbytes


def _frames_of(index: compress.Index, lo: int, hi: int) -> range:
    """The frames that hold decoded bytes ``[lo, hi)``."""
    first = bisect.bisect_right(index.decoded_offsets, lo) - 1
    last = bisect.bisect_left(index.decoded_offsets, hi)
    return range(max(first, 0), last)


class _Frames:
    """Decoded frames of compressed files, each read and verified once however many copies need it, and dropped
    once the last copy that needs it has taken its part (memory: the frames in use, not the file)."""

    def __init__(self, reader: Reader, opened: Opened, copies: list[Copy], count: Callable[[int], None]) -> None:
        self.reader, self.opened, self.count = reader, opened, count
        plan: Plan = opened.reshard
        self.users: dict[tuple[str, int], int] = {}
        for c in copies:
            if c.piece.file in plan.frames:
                for i in _frames_of(plan.frames[c.piece.file], *_span(plan, c)):
                    self.users[(c.piece.file, i)] = self.users.get((c.piece.file, i), 0) + 1
        self.lock = threading.Lock()
        self.decoded: dict[tuple[str, int], Future[bytearray]] = {}

    def take(self, file: str, i: int) -> bytearray:
        key = (file, i)
        with self.lock:
            future = self.decoded.get(key)
            mine = future is None
            if future is None:
                future = self.decoded[key] = Future()
        if mine:
            try:
                future.set_result(self._decode(file, i))
            except BaseException as e:
                future.set_exception(e)
        return future.result()

    def done(self, file: str, i: int) -> None:
        with self.lock:
            self.users[(file, i)] -= 1
            if not self.users[(file, i)]:
                self.decoded.pop((file, i), None)

    def _decode(self, file: str, i: int) -> bytearray:
        plan: Plan = self.opened.reshard
        index = plan.frames[file]
        path = self.reader.storage.join(self.opened.files_dir, file)
        frame = index.frames[i]
        stored = bytearray(frame.stored)
        got = self.reader.storage.read_range(path, index.stored_offsets[i], memoryview(stored))
        self.count(got)
        if got != len(stored):
            raise self.opened.bad(f"{file} ends early: expected {len(stored)} bytes at {index.stored_offsets[i]}")
        out = bytearray(frame.decoded)
        try:
            compress.decode_frame(memoryview(stored), frame, memoryview(out), where=path, at=index.decoded_offsets[i])
        except CheckpointCorruptError as err:
            raise self.opened.bad(str(err)) from err
        return out


def _ranged_frames(reader: Reader, opened: Opened, c: Copy, dst: memoryview, frames: _Frames) -> None:
    """``c``'s bytes from a compressed file: the frames that hold them, decoded (each verified) once, then their
    part copied out."""
    plan: Plan = opened.reshard
    index = plan.frames[c.piece.file]
    lo, hi = _span(plan, c)
    for i in _frames_of(index, lo, hi):
        out = frames.take(c.piece.file, i)
        at = index.decoded_offsets[i]
        a, b = max(lo, at), min(hi, at + index.frames[i].decoded)
        dst[a - lo : b - lo] = memoryview(out)[a - at : b - at]
        frames.done(c.piece.file, i)


def _wrap(plan: Plan, tensors: dict[str, Any]) -> None:
    from torch.distributed.tensor import DTensor

    for name, t in plan.targets.items():
        if t.template is None or name not in tensors:
            continue
        live = t.template
        if t.live and live.to_local().data_ptr() == tensors[name].data_ptr() and tensors[name].numel():
            tensors[name] = live  # read in place: load_state_dict() then copies nothing
            continue
        tensors[name] = DTensor.from_local(
            tensors[name],
            live.device_mesh,
            [parse_placement(repr(p)) for p in live.placements],
            run_check=False,
            shape=torch.Size(t.shape),
            stride=torch.empty(t.shape, device="meta").stride(),
        )
