"""Reading a committed checkpoint as untrusted input: manifest, sizes, state documents, headers, then tensor data.

`Reader.open` reads everything but the tensor data (cheap) and checks it; `Reader.read` reads the data, verifying
every checksum on the way, straight into live tensors where they fit. Every content failure is a
`CheckpointCorruptError` naming the file and why; I/O errors pass through with their own type.
"""

from __future__ import annotations

import io
import json
import operator
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from preemptible.checkpoint import shards as shard_records
from preemptible.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    FileTooLargeError,
    NotRegularFileError,
    StateMismatchError,
)
from preemptible.progress import Meter
from preemptible.state import PlainFit, group_of, unflatten
from preemptible.store import assist, checksum, compress, layout, tagged_json
from preemptible.store import format as tensor_format
from preemptible.store.io import Storage
from preemptible.store.layout import FileRecord, Manifest
from preemptible.store.naming import file_stem, stem_of_file
from preemptible.store.threads import Pool, parallel_map

OBJECT_READ_CHUNK = 32 << 20
PARSED_MANIFESTS = 8  # a root keeps a few checkpoints; more are re-parsed


@dataclass
class Opened:
    """A committed checkpoint whose manifest, state.json and tensor headers have been read and checked."""

    step: int
    directory: str
    manifest: Manifest
    files_dir: str = ""  # where the manifest's files are: the directory, or its attempt prefix on object stores
    tree: Any = None
    numpy: set[str] = field(default_factory=set)
    casts: dict[str, torch.dtype] = field(default_factory=dict)
    entries: dict[str, tensor_format.Entry] = field(default_factory=dict)
    extra_files: list[str] = field(default_factory=list)
    file_entries: dict[str, list[tensor_format.Entry]] = field(default_factory=dict)
    selected: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dtensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    shards: dict[str, list[shard_records.Record]] = field(default_factory=dict)
    """Sharded tensors' records by name, one per rank opened, each checked against its stored shard."""
    unchecked: list[str] = field(default_factory=list)
    """Sharded tensors whose cover of the whole could not be checked here (their layout), one line each."""
    entry_owner: dict[str, int | None] = field(default_factory=dict)
    source_rank: int | None = None  # the rank whose per-rank state this rank restores (None: every rank's)
    reshard: Any = None  # a `reshard.Plan` when the checkpoint is restored at another layout
    meta_bytes: int = 0  # bytes read of manifest, state documents and headers
    data_bytes: int = 0  # bytes read of tensor files (headers included when a file is read whole)

    def bad(self, why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"checkpoint of step {self.step} at {self.directory}: {why}", path=self.directory, step=self.step
        )


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_NAME = operator.itemgetter(0)  # an Entry's name


def _placeholder(meta: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in meta:
        raise CheckpointCorruptError(f"state.json refers to tensor {name!r}, which no tensor file holds", path=name)
    return meta[name]


def _dtype(name: str) -> torch.dtype:
    """The dtype a cast restores a stored tensor to: a floating dtype the format holds (a save casts an optimizer's
    moments to bf16 and back, nothing else; quantized or bit dtypes cannot even be allocated)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or dtype not in tensor_format.DTYPES or not dtype.is_floating_point:
        raise ValueError(f"a cast to {name[:40]!r}: expected a floating dtype the format holds")
    return dtype


class Reader:
    """Reads checkpoints under one root."""

    def __init__(self, storage: Storage, root: str, *, threads: int) -> None:
        self.storage = storage
        self.root = root
        self.threads = threads
        self.only_rank: int | None = None
        """A checkpoint laid out for this one rank (the memory tier's, `preemptible.checkpoint.memtier`): the other
        ranks' own files may be absent, and only the files this rank reads must be present."""
        self.bar: bool | None = False
        """Show a progress bar while reading: False (log lines for long reads), None (when stderr is a terminal)."""
        self._parsed: dict[str, tuple[bytes, Manifest]] = {}
        """Manifests parsed lately, by path, with the bytes they were parsed from: a restore lists the checkpoints
        (each manifest parsed) and then opens one, and a large state's manifest takes milliseconds to check."""

    def path_of(self, step: int) -> str:
        return self.storage.join(self.root, layout.step_dir(step))

    def committed_steps(self) -> list[int]:
        """The steps under the root with a ``COMMIT.json``, for an error that names what there is (one listing, and
        one existence check per step directory)."""
        steps = sorted(n for n in map(layout.parse_step_dir, self.storage.listdir(self.root)) if n is not None)
        return [n for n in steps if self.storage.exists(self.storage.join(self.path_of(n), layout.COMMIT))]

    def manifest(self, step: int) -> Manifest:
        where = self.storage.join(self.path_of(step), layout.COMMIT)
        try:
            raw = self.storage.read_bytes(where, layout.MAX_MANIFEST_BYTES)
        except (FileTooLargeError, NotRegularFileError) as e:
            raise CheckpointCorruptError(f"{where}: {e}", path=where, step=step) from e
        except FileNotFoundError as e:
            try:
                there: object = self.committed_steps() or "none"
            except OSError:  # the message must not hide the error it explains
                there = "unknown (the root could not be listed)"
            raise CheckpointNotFoundError(
                f"no committed checkpoint of step {step} under {self.root}: {layout.COMMIT} is missing; committed "
                f"steps: {there}",
                path=where,
                step=step,
            ) from e
        known = self._parsed.get(where)
        if known is not None and known[0] == raw:  # the very bytes parsed and checked before: the same manifest
            return known[1]
        manifest = Manifest.from_json(raw, where=where, expect_step=step)
        if len(self._parsed) >= PARSED_MANIFESTS:
            self._parsed.clear()
        self._parsed[where] = (raw, manifest)
        return manifest

    def open_base(self, step: int) -> Opened:
        """The manifest, checked, and every file it lists present with its recorded size."""
        manifest = self.manifest(step)
        directory = self.path_of(step)
        opened = Opened(step=step, directory=directory, manifest=manifest)
        opened.files_dir = manifest.file_dir(self.storage.join, directory)
        bad = opened.bad
        if manifest.checksum_algorithm != checksum.ALGORITHM:
            raise bad(
                f"checksum algorithm {manifest.checksum_algorithm!r} is unknown here (expected "
                f"{checksum.ALGORITHM!r}); upgrade preemptible"
            )
        if layout.STATE not in manifest.files:
            raise bad(f"the manifest lists no {layout.STATE}")
        for name, rec in manifest.files.items():
            if self.only_rank is not None and layout.file_rank(name) not in (None, self.only_rank):
                continue
            p = self.storage.join(opened.files_dir, name)
            try:
                if not self.storage.exists(p):
                    raise bad(f"file {name} listed in COMMIT.json is missing")
                size = self.storage.size(p)
            except NotRegularFileError as e:  # a link that leaves the root
                raise bad(str(e)) from e
            if size != rec.bytes:
                raise bad(f"file {name} is {size} bytes, COMMIT.json records {rec.bytes} (truncated or replaced)")
        markers = (layout.COMMIT, layout.VALID, layout.INVALID)
        opened.extra_files = sorted(
            n
            for n in self.storage.listdir(directory)
            if n not in manifest.files
            and n not in markers
            and not n.startswith(tuple(m + ".tmp-" for m in markers))
            and not layout.PREFIX_RE.fullmatch(n)  # attempts' files: ours, or a loser's left for cleanup
        )
        return opened

    def read_doc(self, opened: Opened, name: str) -> dict[str, Any]:
        """One state document, its checksum checked, its shape checked."""
        rec = opened.manifest.files[name]
        bad = opened.bad
        try:
            raw = self.storage.read_bytes(self.storage.join(opened.files_dir, name), max(rec.bytes, 0))
        except (FileTooLargeError, NotRegularFileError) as e:
            raise bad(str(e)) from e
        opened.meta_bytes += len(raw)
        found = checksum.of_bytes(raw)
        if found != rec.checksum:
            raise bad(f"{name} checksum mismatch: COMMIT.json records {rec.checksum}, file hashes to {found}")
        try:
            doc = json.loads(raw)
            tree = doc["tree"]
            if not isinstance(doc, dict) or not isinstance(tree, dict) or next(iter(tree), "").startswith("$"):
                raise TypeError("the tree is not an object of state entries")
            for key in ("dtensors", "casts"):
                if not isinstance(doc.get(key) or {}, dict):
                    raise TypeError(f"{key!r} is not an object")
            doc["casts"] = {str(n): _dtype(str(d)) for n, d in (doc.get("casts") or {}).items()}
            doc["numpy"] = {str(n) for n in doc.get("numpy") or []}
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as e:
            raise bad(f"{name} is not a preemptible state document ({type(e).__name__}: {e})") from e
        return dict(doc)

    @staticmethod
    def merge_doc(opened: Opened, doc: Mapping[str, Any]) -> None:
        opened.numpy |= doc["numpy"]
        opened.dtensors.update(doc.get("dtensors") or {})
        opened.casts.update(doc["casts"])

    def open(self, step: int, rank: int | None = None, *, entry: str | None = None) -> Opened:
        """Everything but the tensor data: manifest, file sizes, state documents, tensor headers. Cheap.

        ``rank``: read what that rank needs (the replicated files, and its own per-rank files, or those of rank
        ``rank % N`` when the checkpoint was written by N <= rank ranks); None: every file (verification).
        ``entry``: only that state entry (`preemptible.load`): the tree is cut to it and only the tensor files of
        the entries its tensors are stored under are opened.

        Raises:
            CheckpointNotFoundError: also when ``entry`` is not in the checkpoint.
        """
        opened = self.open_base(step)
        opened.selected = _select(opened.manifest, rank, opened)
        opened.tree = {}
        records: dict[int | None, dict[str, Any]] = {}  # each document's sharding records, by its rank
        docs = {name: self.read_doc(opened, name) for name in opened.selected if name.endswith(".json")}
        shared = docs[layout.STATE]["tree"] if layout.STATE in docs else {}
        for name, doc in docs.items():
            tree = doc["tree"]
            for key in shared.keys() & tree.keys():  # a rank's document may repeat a shared entry, never change it
                if name != layout.STATE and shared[key] != tree[key]:
                    raise opened.bad(f"{name} holds entry {key!r} other than {layout.STATE} does")
            if rank is None or name == layout.STATE or not (opened.tree.keys() & tree.keys()):
                opened.tree.update(tree)
            self.merge_doc(opened, doc)
            records.setdefault(layout.file_rank(name), {}).update(doc.get("dtensors") or {})
        if entry is not None:
            if entry not in opened.tree:
                raise CheckpointNotFoundError(
                    f"the checkpoint of step {step} has no entry {entry!r}; it holds {sorted(opened.tree)}",
                    path=opened.directory,
                )
            opened.tree = {entry: opened.tree[entry]}
            stems = {file_stem(group_of(n)) for n in tagged_json.tensor_names(opened.tree)}
            opened.selected = [n for n in opened.selected if not layout.is_tensor_file(n) or stem_of_file(n) in stems]
        for name in opened.selected:
            if not layout.is_tensor_file(name):
                continue
            rec = opened.manifest.files[name]
            p = self.storage.join(opened.files_dir, name)
            entries, meta = read_tensor_header(self.storage, p, rec, opened)
            opened.meta_bytes += meta
            owner = layout.file_rank(name)
            by_name = {e.name: e for e in entries}  # a header's names are unique (parse_header)
            for clash in opened.entries.keys() & by_name.keys():
                # per-rank files of different ranks may each hold a tensor of one name (a shard, a per-rank entry);
                # a file every rank reads and any other file may not: which copy holds it would be a guess
                if opened.entry_owner.get(clash) == owner or owner is None or opened.entry_owner.get(clash) is None:
                    raise opened.bad(f"tensor {clash!r} appears in more than one file")
            opened.entries.update(by_name)
            opened.entry_owner.update(dict.fromkeys(by_name, owner))
            opened.file_entries[name] = entries
        self._check_shards(opened, records, every_rank=rank is None and entry is None)
        return opened

    @staticmethod
    def _check_shards(opened: Opened, records: Mapping[int | None, Mapping[str, Any]], *, every_rank: bool) -> None:
        """Every sharding record of the documents read, checked against the shard its rank stored (`shards.check`);
        with ``every_rank`` (all files opened), their cover of each whole tensor too (`shards.cover`)."""
        stored: dict[tuple[int | None, str], tuple[int, ...]] = {}
        stems: set[tuple[int | None, str]] = set()  # (owner, stem) of the tensor files opened
        for name, entries in opened.file_entries.items():
            owner = layout.file_rank(name)
            stems.add((owner, stem_of_file(name)))
            for e in entries:
                stored[(owner, e.name)] = e.shape
        for owner, metas in records.items():
            for name, meta in metas.items():
                # IMPORTANT: a record describes the shard its own rank's file holds (a one-process checkpoint: the
                # files every rank reads), never a tensor of another file: else its rows would be filled by nothing
                shape = stored.get((owner, name))
                if shape is None:
                    if (owner, file_stem(group_of(name))) in stems:
                        raise opened.bad(
                            f"the sharding record of {name!r}"
                            + (f" (rank {owner})" if owner is not None else "")
                            + " has no shard in its own file"
                        )
                    continue  # not among the files opened (an entry of another state entry); no reader uses it
                opened.shards.setdefault(name, []).append(shard_records.check(name, meta, shape, owner, opened.bad))
        if every_rank and opened.shards:
            opened.unchecked = shard_records.cover(opened.shards, opened.manifest.world_size, opened.bad)

    @staticmethod
    def rewrap(opened: Opened, tensors: dict[str, Any], live: Mapping[str, Any]) -> None:
        """Local shards back into DTensors: the live DTensor when its shard was read in place, else a new one on
        the live state's device mesh (an optimizer's moments, created lazily, have no live DTensor yet)."""
        from torch.distributed.tensor import DTensor

        from preemptible.state import parse_placement

        mesh = next((t.device_mesh for t in live.values()), None)
        for name, meta in opened.dtensors.items():
            local = tensors.get(name)
            if local is None:
                continue
            existing = live.get(name)
            if existing is not None and existing.to_local().data_ptr() == local.data_ptr():
                tensors[name] = existing
                continue
            if mesh is None:  # not the checkpoint's fault: nothing here can place it (never a content failure)
                why = (
                    f"{name} is sharded (DTensor) in the checkpoint, but the live state has no device mesh to place "
                    "it on: restore it under the same kind of launch (torchrun, fully_shard), or read it whole with "
                    "preemptible.load()"
                )
                raise StateMismatchError(
                    f"the checkpoint of step {opened.step} at {opened.directory}: {why}",
                    path=opened.directory,
                    step=opened.step,
                    differences=[why],
                )
            tensors[name] = DTensor.from_local(
                local,
                mesh,
                [parse_placement(p) for p in meta["placements"]],
                run_check=False,
                shape=torch.Size(meta["shape"]),
                stride=tuple(meta["stride"]),
            )

    def skeleton(self, opened: Opened) -> dict[str, Any]:
        """The stored state with shape-and-dtype placeholders (meta tensors) instead of data."""
        meta = {
            n: torch.empty(e.shape, dtype=opened.casts.get(n, e.dtype), device="meta")
            for n, e in opened.entries.items()
        }
        try:
            tree = tagged_json.decode(opened.tree, lambda name, is_numpy: _placeholder(meta, name))
        except CheckpointCorruptError as e:
            raise opened.bad(str(e)) from e
        if not isinstance(tree, dict):
            raise opened.bad(f"{layout.STATE} holds a {type(tree).__name__}, expected an object of state entries")
        return tree

    def read(
        self,
        opened: Opened,
        into: Mapping[str, torch.Tensor] | None,
        *,
        sharded: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The state entries of an opened checkpoint, every byte checked; sharded tensors become DTensors on the
        live state's mesh (``sharded``: the live DTensors by name)."""
        tensors = self.read_tensors(opened, into)
        if opened.dtensors:
            self.rewrap(opened, tensors, sharded or {})
        return self.rebuild(opened, tensors)

    def read_fitted(self, opened: Opened, fit: PlainFit) -> dict[str, Any]:
        """The state entries `plain_fit` built, once the read has put every byte in place (checked)."""
        tensors = self.read_tensors(opened, fit.targets, exact=True)
        try:
            loaded: dict[str, Any] = fit.complete(tensors, opened.numpy)
        except CheckpointCorruptError as e:
            raise opened.bad(str(e)) from e
        return loaded

    def read_tensors(
        self, opened: Opened, into: Mapping[str, torch.Tensor] | None, *, exact: bool = False
    ) -> dict[str, torch.Tensor]:
        """The tensors of an opened checkpoint by name (a sharded one: this rank's shard), every byte checked.

        ``into``: live tensors by name to read into where they fit (contiguous, on the CPU, of the stored dtype and
        shape); the others are new. ``exact``: `plain_fit` named them, so each fits but those stored in another
        dtype (``opened.casts``), and is not checked again here."""
        into = into or {}
        placed = _placement(into, opened.casts, exact=exact)

        def read_file(name: str) -> dict[str, torch.Tensor]:
            assisted: assist.Assisted | None = None
            fd = -1

            def offer(pieces: list[assist.Piece], spread: Callable[[int, torch.Tensor], object]) -> assist.Assisted:
                nonlocal assisted
                assisted = assist.Assisted(partial(_pread, fd), pieces, spread, meter.add)
                helpers.offer(assisted)
                return assisted

            try:  # IMPORTANT: every file ends (`helpers.ended`), or a thread waiting for its pieces waits forever
                rec = opened.manifest.files[name]
                p = self.storage.join(opened.files_dir, name)
                # an object store's reads are requests each: as large as the buffers allow; a disk's stay in the cache
                remote = self.storage.kind == "object"
                chunk = OBJECT_READ_CHUNK if remote else tensor_format.READ_CHUNK_BYTES
                compressed = compress.is_compressed(name)
                with open_tensor(
                    self.storage, p, rec, opened, pool=pool, on_stored=meter.add if compressed else None
                ) as (source, size, expected):
                    # a local file's chunks can be read by any thread (pread); a stream or a decoder's only in order
                    local = not compressed and not remote and isinstance(source, io.FileIO)
                    fd = source.fileno() if isinstance(source, io.FileIO) else -1
                    try:
                        return tensor_format.read(
                            source if compressed else _Counted(source, meter.add),
                            size,
                            where=p,
                            expected_checksum=expected,
                            into=placed,
                            entries=opened.file_entries.get(name),
                            chunk=chunk,
                            run_cap=chunk if remote else tensor_format.RUN_BYTES,
                            assist=offer if local else None,
                        )
                    except CheckpointCorruptError as e:
                        raise opened.bad(str(e)) from e
            finally:
                helpers.ended(assisted)

        names = sorted(
            (n for n in opened.selected if layout.is_tensor_file(n)),
            key=lambda n: -opened.manifest.files[n].bytes,
        )
        tensors: dict[str, torch.Tensor] = {}
        total = sum(opened.manifest.files[n].bytes for n in names)
        opened.data_bytes += total
        meter = Meter(f"read of step {opened.step}", total, bar=self.bar)
        pool = decoding_pool(names, self.threads)
        helpers = assist.Helpers(len(names))  # a thread with no file left to start reads the others' last chunks
        try:
            for part in parallel_map(
                read_file, names, threads=self.threads, name="preemptible-read", idle=helpers.help
            ):
                tensors.update(part)
        finally:
            meter.close()
            if pool is not None:
                pool.shutdown(wait=True)
        _cast_back(opened, tensors, into)
        return tensors

    @staticmethod
    def rebuild(opened: Opened, tensors: Mapping[str, Any]) -> dict[str, Any]:
        """The state entries from the checkpoint's tree and the tensors read for it."""
        try:
            loaded = unflatten(opened.tree, tensors, opened.numpy)
        except CheckpointCorruptError as e:
            raise opened.bad(str(e)) from e
        if not isinstance(loaded, dict):
            raise opened.bad(f"{layout.STATE} holds a {type(loaded).__name__}, expected an object of state entries")
        return loaded


class _Counted:
    """A source that reports the bytes read through it."""

    def __init__(self, source: tensor_format.Source, add: Callable[[int], None]) -> None:
        self._source = source
        self._add = add

    def readinto(self, buffer: memoryview) -> int:
        n = self._source.readinto(buffer)
        self._add(n)
        return n

    def seek(self, offset: int) -> int:
        return self._source.seek(offset)  # type: ignore[attr-defined, no-any-return]


def _pread(fd: int, buffer: memoryview, offset: int) -> int:
    return os.preadv(fd, [buffer], offset)


def decoding_pool(names: list[str], threads: int) -> Pool | None:
    """Threads that decode the frames of compressed files (None when there are none)."""
    if not any(compress.is_compressed(n) for n in names):
        return None
    return Pool(max(2, threads), "preemptible-unzstd")


def read_tensor_header(
    storage: Storage, path: str, rec: FileRecord, opened: Opened
) -> tuple[list[tensor_format.Entry], int]:
    """A tensor file's entries, and the bytes read to get them (its header; a compressed file's index too)."""
    try:
        if compress.is_compressed(path):
            index = compress.read_index(partial(storage.read_range, path), rec.bytes, where=path)
            entries = compress.read_header_frame(partial(storage.read_range, path), index, where=path)
            return entries, len(index.tail) + index.frames[0].stored + compress.TAIL_BYTES
        stream = storage.open_read(path)
        try:
            entries = tensor_format.read_header(stream, rec.bytes, where=path)
        finally:
            stream.close()
        return entries, rec.bytes - (entries[-1].end if entries else 0)
    except NotRegularFileError as e:
        raise opened.bad(str(e)) from e
    except CheckpointCorruptError as e:
        raise opened.bad(str(e)) from e


@contextmanager
def open_tensor(
    storage: Storage,
    path: str,
    rec: FileRecord,
    opened: Opened | None,
    *,
    pool: Pool | None = None,
    on_stored: Callable[[int], None] | None = None,
) -> Iterator[tuple[tensor_format.Source, int, str | None]]:
    """A tensor file as the plain safetensors bytes it holds: ``(source, size, checksum to expect of them)``.

    A plain file is read as it is, its checksum COMMIT.json's. A compressed one is decoded on the way; its frames
    are verified as they are decoded and the stored file against COMMIT.json's checksum once its last frame is
    read (so the expected checksum of the decoded bytes is None).
    """

    def bad(e: Exception) -> CheckpointCorruptError:
        return opened.bad(str(e)) if opened is not None else CheckpointCorruptError(str(e), path=path)

    try:
        if compress.is_compressed(path):
            index = compress.read_index(partial(storage.read_range, path), rec.bytes, where=path)
            source: Any = compress.DecodedSource(
                storage.open_read(path),
                index,
                where=path,
                expected_checksum=rec.checksum,
                pool=pool,
                on_stored=on_stored,
            )
            size, expected = index.decoded_bytes, None
        else:
            source, size, expected = storage.open_read(path), rec.bytes, rec.checksum
    except NotRegularFileError as e:
        raise bad(e) from e
    except CheckpointCorruptError as e:
        raise bad(e) from e
    try:
        yield source, size, expected
    finally:
        source.close()


def _select(manifest: Manifest, rank: int | None, opened: Opened) -> list[str]:
    """The files one rank reads (see `_open`)."""
    names = list(manifest.files)
    if rank is None:
        return names
    ranks = {layout.file_rank(n) for n in names} - {None}
    own = rank if rank in ranks else source_rank(rank, manifest.world_size)
    if ranks and own != rank:
        opened.notes.append(
            f"the checkpoint was written by {manifest.world_size} rank(s) and holds no per-rank state of rank "
            f"{rank}: rank {own}'s is used instead, and its random streams are reseeded from rank {own}'s"
        )
    opened.source_rank = own
    return [n for n in names if layout.file_rank(n) in (None, own)]


def source_rank(rank: int, saved_world: int) -> int:
    """Whose per-rank state (RNG streams, a data loader's position, ...) a rank restores: its own when the
    checkpoint has it, else that of rank ``rank % saved_world`` (a job that grew)."""
    return rank if rank < saved_world else rank % saved_world


def _placement(
    into: Mapping[str, torch.Tensor], casts: Mapping[str, torch.dtype], *, exact: bool
) -> Callable[[Sequence[tensor_format.Entry]], list[torch.Tensor | None]]:
    """For `Reader.read_tensors`: the live tensors a run of stored tensors is read into (None: a new one).

    Checked: only those exactly of the stored dtype and shape, contiguous, on the CPU. ``exact``: `plain_fit` named
    them, so each is read into as it is, but those stored in another dtype (cast after the read)."""
    get = into.get

    def target(e: tensor_format.Entry) -> torch.Tensor | None:
        # What tensor_format.read copies raw bytes into: exactly this dtype and shape, contiguous, on the CPU.
        t = get(e.name)
        if (
            t is not None
            and t.dtype is e.dtype
            and type(t) in _PLAIN
            and t.shape == e.shape
            and t.is_cpu
            and t.is_contiguous()
        ):
            return t
        return None

    def checked(run: Sequence[tensor_format.Entry]) -> list[torch.Tensor | None]:
        return [target(e) for e in run]

    if not exact:
        return checked
    trusted = {n: t for n, t in into.items() if n not in casts} if casts else into

    def fitted(run: Sequence[tensor_format.Entry]) -> list[torch.Tensor | None]:
        return list(map(trusted.get, map(_NAME, run)))  # in C: a run is up to thousands of small tensors

    return fitted


def _cast_back(opened: Opened, tensors: dict[str, torch.Tensor], into: Mapping[str, torch.Tensor]) -> None:
    """Tensors stored in another dtype (bf16 moments) back into the optimizer's own dtype: into the live tensor
    where it fits, else a new one."""
    for name, dtype in opened.casts.items():
        stored = tensors.get(name)
        if stored is None:
            raise opened.bad(f"state.json casts tensor {name!r}, which no tensor file holds")
        live = into.get(name)
        if live is not None and live.dtype == dtype and live.shape == stored.shape:
            tensors[name] = live.detach().copy_(stored)
        else:
            tensors[name] = stored.to(dtype)
