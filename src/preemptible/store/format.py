"""Tensor files in safetensors format, written and read by our own streaming code.

Layout (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N bytes of JSON
header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`` padded with
spaces to a multiple of 8, then the tensors' raw bytes back to back. ``safetensors.torch.load_file`` and any
other safetensors reader open our files.

The writer streams each tensor's own memory to the sink (no intermediate copy of the state) and hashes it on
the way. The reader treats every file as hostile: it bounds the header, checks every offset against the file
size and the dtype/shape, and reads into tensors it allocates itself (or into ones the caller gives it).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import operator
import struct
import threading
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple, Protocol

import orjson
import torch

from preemptible.errors import CheckpointCorruptError, UnsupportedStateError
from preemptible.store import bounds, checksum, direct, vcopy
from preemptible.store.assist import Assisted, Piece, ShortRead
from preemptible.store.layout import Chunks
from preemptible.store.threads import Pool
from preemptible.store.vcopy import memmove as _memmove

MAX_HEADER_BYTES = bounds.MAX_HEADER_BYTES
MAX_DIMS = bounds.MAX_DIMS
MAX_EXTENT = bounds.MAX_EXTENT
CHUNK_BYTES = 16 * 1024 * 1024  # writes: large, for the disk
HASH_BYTES = 1 << 20  # writes hash a piece in parts that stay in the CPU's cache for both of their checksums
READ_CHUNK_BYTES = 512 << 10
"""Reads of large tensors: a piece read and then hashed while it is still in the CPU's cache. Warm restores of 1.2 GB
in 64 MiB tensors here (2 MiB of L2 per core), median of six: 512 KiB 158 ms, 1 MiB 168, 2 MiB 168."""
RUN_BYTES = 2 << 20
"""Reads of runs of small tensors: up to this much is read, hashed and scattered at once (10,000 tensors of 120 MB,
median of six: 2 MiB 105 ms, 512 KiB 113; the scatter's per-run costs weigh more than the cache here)."""
MIN_SUM_CHUNK = 16 << 10  # ranged reads verify whole chunks: small enough that a slice reads little more than itself
MAX_SUMS_PER_FILE = 4096  # ... and few enough that COMMIT.json stays small (16 hex digits per chunk)

DTYPES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
}
for _name, _code in (
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
):
    if isinstance(getattr(torch, _name, None), torch.dtype):
        DTYPES[getattr(torch, _name)] = _code
CODES: dict[str, torch.dtype] = {code: dtype for dtype, code in DTYPES.items()}


class Sink(Protocol):
    def write(self, data: memoryview) -> None: ...


class Source(Protocol):
    def readinto(self, buffer: memoryview) -> int: ...


def check_dtype(tensor: torch.Tensor, key: str) -> None:
    if tensor.dtype not in DTYPES:
        raise UnsupportedStateError(
            f"tensor {key!r} has dtype {tensor.dtype}, which the safetensors format cannot hold; expected one of "
            f"{', '.join(str(d).removeprefix('torch.') for d in DTYPES)}. Store it as a view of a supported dtype "
            "(e.g. torch.view_as_real for complex) in your state_dict()",
            key=key,
        )


def host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the same values (the tensor itself when it already is one)."""
    t = tensor.detach()
    if not t.is_cpu:
        t = t.cpu()
    return t if t.is_contiguous() else t.contiguous()


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    if flat.stride(0) != 1:  # one element, sliced with a step (x[::2] of two): contiguous to torch, but not viewable
        flat = flat.as_strided((1,), (1,))
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]


class Entry(NamedTuple):
    """One tensor of a file's header. A named tuple: a restore makes one per tensor, 10,000s of them."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def layout(items: Sequence[tuple[str, torch.Tensor]], stored: Mapping[str, torch.dtype] | None = None) -> list[Entry]:
    """Order tensors by decreasing item size (so each lands aligned to its dtype) and assign offsets.

    ``stored`` gives the dtype a tensor is written in when it differs from its own (bf16 moments).
    """
    # Column by column, each from C (``map``): a file may hold 10,000s of small tensors.
    names = [name for name, _ in items]
    tensors = [t for _, t in items]
    dtypes = list(map(_DTYPE, tensors))
    if stored:
        dtypes = [stored.get(name, dtype) for name, dtype in zip(names, dtypes, strict=True)]
    sizes = list(map(_ITEMSIZE, dtypes))
    order = sorted(range(len(names)), key=sizes.__getitem__, reverse=True)  # stable: ties keep their order
    if order != list(range(len(names))):
        names = [names[i] for i in order]
        tensors = [tensors[i] for i in order]
        dtypes = [dtypes[i] for i in order]
        sizes = [sizes[i] for i in order]
    ends = list(itertools.accumulate(map(operator.mul, map(torch.Tensor.numel, tensors), sizes)))
    return list(map(Entry, names, dtypes, map(tuple, map(_SHAPE, tensors)), [0, *ends[:-1]], ends))


def sum_chunk_bytes(data_bytes: int) -> int:
    """The piece size for a file of ``data_bytes``: at least `MIN_SUM_CHUNK`, a power of two, and at most about
    `MAX_SUMS_PER_FILE` pieces."""
    size = MIN_SUM_CHUNK
    while size * MAX_SUMS_PER_FILE < data_bytes:
        size *= 2
    return size


def chunk_spans(entries: Iterable[Entry], size: int) -> list[tuple[int, int]]:
    """The data pieces `Chunks` covers, as ``(begin, end)`` offsets into the data region, in file order."""
    ordered = sorted(entries, key=_BEGIN)  # `layout`'s are in order already: one pass
    begins, ends = list(map(_BEGIN, ordered)), list(map(_END, ordered))
    if max(map(operator.sub, ends, begins), default=0) <= size:  # each tensor one span (10,000s of small ones)
        return [(b, e) for b, e in zip(begins, ends, strict=True) if e > b]
    spans = []
    for begin, end in zip(begins, ends, strict=True):
        spans += [(b, min(b + size, end)) for b in range(begin, end, size)]
    return spans


_ITEMSIZE = operator.attrgetter("itemsize")
_SHAPE = operator.attrgetter("shape")
_BEGIN = operator.attrgetter("begin")
_END = operator.attrgetter("end")


class _ChunkHasher:
    """Fed the data region in order, in pieces of any size: one XXH3-64 per chunk span."""

    def __init__(self, spans: Sequence[tuple[int, int]]) -> None:
        self._ends = [end for _, end in spans]
        self._i = 0  # the span being hashed
        self._pos = 0  # data bytes fed so far
        self._partial = False  # whether ``_h`` holds the start of span ``_i``
        self._h = checksum.new()
        self.sums: list[str] = []

    def update(self, piece: memoryview) -> None:
        ends, i, n = self._ends, self._i, len(piece)
        base = self._pos  # the data offset of piece[0]
        at = 0
        if self._partial:  # the rest of the span an earlier piece began
            at = min(ends[i] - base, n)
            self._h.update(piece[:at])
            if base + at < ends[i]:
                self._pos = base + n
                return
            self.sums.append(self._h.hexdigest())
            self._h.reset()
            self._partial = False
            i += 1
        # IMPORTANT: 4096 spans per file: each whole span in the piece is one call, not an update-digest-reset
        digest, sums, last = checksum.of_bytes, self.sums, len(ends)
        while i < last and ends[i] - base <= n:
            end = ends[i] - base
            sums.append(digest(piece[at:end]))
            at = end
            i += 1
        if at < n:  # a span that goes on in the next piece
            self._h.update(piece[at:])
            self._partial = True
        self._i, self._pos = i, base + n


HEADER_ALIGN = 4096


def header_bytes(entries: Iterable[Entry], metadata: Mapping[str, str] | None = None) -> bytes:
    """The 8-byte length and the JSON header, padded with spaces (as the format allows) so that the tensor data
    starts on a 4096-byte boundary: aligned for direct I/O and for memory-mapping readers."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    for e in entries:
        header[e.name] = {"dtype": DTYPES[e.dtype], "shape": e.shape, "data_offsets": (e.begin, e.end)}
    raw = _orjson_or_none(header) if _plain_text(header, metadata) else None
    if raw is None:
        raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % HEADER_ALIGN)
    return struct.pack("<Q", len(raw)) + raw


def _plain_text(header: Mapping[str, Any], metadata: Mapping[str, str] | None) -> bool:
    """Whether every key and metadata value is printable ASCII: then orjson writes the header as json does with
    these separators, byte for byte (only ``"`` and ``\\`` escaped), in a quarter of the time (a file of 6,000 small
    tensors: 3 ms instead of 12, holding the interpreter lock while another writer thread waits). Otherwise json
    writes it (``\\uXXXX`` for the rest, as the files written so far have it)."""
    texts = [*header, *(metadata or {}), *(metadata or {}).values()]
    return all(isinstance(t, str) for t in texts) and (text := "".join(texts)).isascii() and text.isprintable()


def _orjson_or_none(header: Mapping[str, Any]) -> bytes | None:
    try:
        return orjson.dumps(header)
    except TypeError:  # a type orjson does not take (a subclass of tuple for a shape): json says what it takes
        return None


def prepare(
    items: Sequence[tuple[str, torch.Tensor]],
    metadata: Mapping[str, str] | None = None,
    *,
    stored: Mapping[str, torch.dtype] | None = None,
    prepared: list[Any] | None = None,
) -> tuple[list[Entry], bytes, list[tuple[int, int]]]:
    """A file's layout, header and checksum spans: Python work per tensor, the same for every file of the same
    names, dtypes and shapes. Taken from the box ``prepared`` when it holds them, else made (and kept there)."""
    if prepared:
        return prepared[0], prepared[1], prepared[2]
    entries = layout(items, stored)
    head = header_bytes(entries, metadata)
    spans = chunk_spans(entries, sum_chunk_bytes(entries[-1].end if entries else 0))
    if prepared is not None:
        prepared[:] = [entries, head, spans]
    return entries, head, spans


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def encode(
    items: Sequence[tuple[str, torch.Tensor]],
    metadata: Mapping[str, str] | None = None,
    *,
    stored: Mapping[str, torch.dtype] | None = None,
    blob: memoryview | None = None,
    chunk: int = CHUNK_BYTES,
    prepared: list[Any] | None = None,
    fill: Callable[[int], None] | None = None,
) -> tuple[list[Entry], bytes, Generator[memoryview, None, None]]:
    """A safetensors file of ``items`` as its entries, its header bytes and its data in pieces (in file order).

    Without ``blob`` each tensor's bytes come from its own memory: a contiguous CPU tensor without any copy, others
    (GPU, strided, or cast to a ``stored`` dtype) through a temporary of that one tensor. With ``blob``, the
    tensor data is already laid out in file order in one buffer (a staging arena) and goes out in large pieces;
    ``fill(end)``, when given, is called before each piece goes out, to put the data below ``end`` into the blob
    (`writer.ArenaFill`).

    ``prepared``: a box (a list) shared by files of the same names, dtypes and shapes (one steady-state file, save
    after save): its layout and header are computed once, kept in the box and reused.

    IMPORTANT: a piece may live in a reused buffer: the consumer must be done with it before taking the next, and
    must close the pieces (``.close()``) if it stops before their end, so that the buffer goes back to its pool.
    """
    by_name = dict(items)
    if prepared is not None:
        entries, head, _ = prepare(items, metadata, stored=stored, prepared=prepared)
    else:
        entries = layout(items, stored)
        head = header_bytes(entries, metadata)
    if blob is not None:
        if len(blob) != (entries[-1].end if entries else 0):
            raise ValueError(f"staged blob holds {len(blob)} bytes, the layout needs {entries[-1].end}")
        pieces: Generator[memoryview, None, None] = (
            (blob[s : s + chunk] for s in range(0, len(blob), chunk)) if fill is None else _filled(blob, chunk, fill)
        )
    else:
        pieces = _tensor_pieces(entries, by_name, chunk)
    return entries, head, pieces


def _filled(blob: memoryview, chunk: int, fill: Callable[[int], None]) -> Generator[memoryview, None, None]:
    """The blob in pieces, each filled before it goes out; the next piece's fill runs on a helper thread while this
    one is hashed and written, so that a writer alone at the end of a save (the other threads done) keeps its disk
    busy instead of taking turns at copying and writing. The helper is done before the pieces end or are closed:
    nothing writes into the blob after its writer stops (the pool's exit waits for it)."""
    ends = [min(start + chunk, len(blob)) for start in range(0, len(blob), chunk)]
    if not ends:
        return
    fill(ends[0])
    if len(ends) == 1:
        yield blob
        return
    with Pool(1, "preemptible-fill") as ahead:
        pending: Future[None] | None = None
        start = 0
        for k, end in enumerate(ends):
            if pending is not None:
                pending.result()  # this piece's fill: its error (a tensor that changed shape) is the write's
            pending = ahead.submit(fill, ends[k + 1]) if k + 1 < len(ends) else None
            yield blob[start:end]
            start = end


def write(
    sink: Sink,
    items: Sequence[tuple[str, torch.Tensor]],
    metadata: Mapping[str, str] | None = None,
    *,
    stored: Mapping[str, torch.dtype] | None = None,
    blob: memoryview | None = None,
    chunk: int = CHUNK_BYTES,
    prepared: list[Any] | None = None,
    fill: Callable[[int], None] | None = None,
) -> tuple[int, str, Chunks]:
    """Stream a safetensors file of ``items`` to ``sink`` (see `encode`), hashing on the way (the whole file, and
    its `Chunks`).

    Returns:
        ``(bytes written, checksum, chunk checksums)``.
    """
    box = prepared if prepared is not None else []
    entries, head, spans = prepare(items, metadata, stored=stored, prepared=box)
    pieces = encode(items, metadata, stored=stored, blob=blob, chunk=chunk, prepared=box, fill=fill)[2]
    hasher = checksum.new()
    hasher.update(head)
    data_bytes = entries[-1].end if entries else 0
    size = sum_chunk_bytes(data_bytes)
    pieces_hasher = _ChunkHasher(spans)
    sink.write(memoryview(head))
    total = len(head)
    try:
        for piece in pieces:
            for at in range(0, len(piece), HASH_BYTES):  # both sums of each part while it is still in the CPU's cache
                part = piece[at : at + HASH_BYTES]
                hasher.update(part)
                pieces_hasher.update(part)
            sink.write(piece)
            total += len(piece)
    finally:
        pieces.close()
    return total, hasher.hexdigest(), Chunks(size, checksum.of_bytes(head) + "".join(pieces_hasher.sums))


SMALL_TENSOR_BYTES = 256 << 10
BATCH_BYTES = 8 << 20  # a read's buffer for runs of small tensors (of which reads use a few MiB)
GATHER_BYTES = direct.BOUNCE_BYTES  # a write's: a pooled buffer, whole
_scratch = threading.local()


def _batch_buffer() -> torch.Tensor:
    buf: torch.Tensor | None = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = torch.empty(BATCH_BYTES, dtype=torch.uint8)
    return buf


def _tensor_pieces(
    entries: Sequence[Entry], by_name: Mapping[str, torch.Tensor], chunk: int
) -> Generator[memoryview, None, None]:
    """Each tensor's bytes in layout order. Large tensors go out from their own memory. Runs of small ones of one
    dtype (a Python step per tiny tensor would cost more than its bytes) are gathered into a page-aligned buffer
    from the pool (`direct.PooledBuffer`, taken at the first run, given back when the pieces end or are closed), in
    pieces of exactly its size while the run lasts: a direct-I/O writer sends such a piece to the disk from where
    it lies instead of copying it into its bounce buffer, and a save's new threads fault no new buffer.

    IMPORTANT: a yielded piece may live in the pooled buffer: the consumer must write it before the next one.
    """
    pooled: direct.PooledBuffer | None = None
    try:
        i, n = 0, len(entries)
        while i < n:
            e = entries[i]
            if not 0 < e.end - e.begin < SMALL_TENSOR_BYTES:
                yield from _own_pieces(by_name[e.name], e, chunk)
                i += 1
                continue
            j = i + 1
            while j < n and entries[j].dtype is e.dtype and 0 < entries[j].end - entries[j].begin < SMALL_TENSOR_BYTES:
                j += 1
            if pooled is None:
                pooled = direct.PooledBuffer.take()
            run = entries[i:j]
            tensors = list(map(by_name.__getitem__, [x.name for x in run]))
            if _raw(run, tensors):
                yield from _gather_raw(pooled, run, tensors)
            else:
                yield from _gather_each(pooled, run, tensors, chunk)
            i = j
    finally:
        if pooled is not None:
            pooled.give_back()


def _own_pieces(t: torch.Tensor, e: Entry, chunk: int) -> Iterable[memoryview]:
    """A tensor's bytes from its own memory (through a copy only when it lives elsewhere, or is cast)."""
    if t.dtype != e.dtype:
        t = t.detach().to(device="cpu", dtype=e.dtype)
    data = byte_view(host(t))
    if len(data) != e.end - e.begin:
        raise ValueError(
            f"tensor {e.name!r} holds {len(data)} bytes where its file's layout has {e.end - e.begin}: it changed "
            "shape or dtype after the save was planned"
        )
    return (data[start : start + chunk] for start in range(0, len(data), chunk))


_IS_CPU = operator.attrgetter("is_cpu")
_DTYPE = operator.attrgetter("dtype")
_NBYTES = operator.attrgetter("nbytes")
_ENTRY_NAME = operator.itemgetter(0)  # an Entry's name


def _raw(run: Sequence[Entry], tensors: list[torch.Tensor]) -> bool:
    """Whether every tensor of the run can be copied as raw bytes: contiguous on the CPU, in the run's dtype, of
    exactly its entry's bytes. Asked in C (``map``), not tensor by tensor in Python: 10,000s of tensors."""
    dtype = run[0].dtype
    return (
        all(map(_IS_CPU, tensors))
        and all(map(torch.Tensor.is_contiguous, tensors))
        and all(map(operator.is_, map(_DTYPE, tensors), itertools.repeat(dtype)))
        and list(map(_NBYTES, tensors)) == [x.end - x.begin for x in run]
    )


def _gather_raw(pooled: direct.PooledBuffer, run: Sequence[Entry], tensors: list[torch.Tensor]) -> Iterable[memoryview]:
    """A run (`_raw`) copied into the pooled buffer, cut into pieces of the buffer's whole size: the tensors that
    end inside a piece by one `vcopy.gather` (a system call per 1,024 of them, without the GIL: two threads that
    write runs of small tensors gather at once), the one that crosses its end in two parts, by memmove."""
    view, base = pooled.view, pooled.addr
    begins = [x.begin for x in run]
    ends = [x.end for x in run]
    ptrs = list(map(torch.Tensor.data_ptr, tensors))
    sizes = list(map(operator.sub, ends, begins))
    back_to_back = begins[1:] == ends[:-1]  # as `layout` lays a file out
    origin, stop_at = begins[0], ends[-1]
    k, done = 0, 0  # the next tensor to copy, and how many of its bytes are copied already (a cut one)
    while origin < stop_at:
        stop = min(origin + GATHER_BYTES, stop_at)
        if done:  # more of the tensor cut at the last piece's end (all of it, unless it is larger than a piece)
            part = min(ends[k] - begins[k] - done, stop - origin)
            _memmove(base, ptrs[k] + done, part)
            done += part
            if begins[k] + done < ends[k]:
                yield view[: stop - origin]
                origin = stop
                continue
            k, done = k + 1, 0
        whole = bisect.bisect_right(ends, stop, lo=k)  # tensors k..whole-1 end inside this piece
        if back_to_back and whole > k:
            vcopy.gather(base + begins[k] - origin, ptrs[k:whole], sizes[k:whole])
        else:
            list(
                map(
                    _memmove,
                    map(operator.add, itertools.repeat(base - origin), begins[k:whole]),
                    ptrs[k:whole],
                    sizes[k:whole],
                )
            )
        k = whole
        if k < len(run) and begins[k] < stop:  # it crosses the end: its first part
            done = stop - begins[k]
            _memmove(base + begins[k] - origin, ptrs[k], done)
        yield view[: stop - origin]
        origin = stop


def _gather_each(
    pooled: direct.PooledBuffer, run: Sequence[Entry], tensors: list[torch.Tensor], chunk: int
) -> Iterable[memoryview]:
    """A run that is not all raw (a tensor on a GPU, strided, or cast), gathered tensor by tensor: each as its own
    pieces, copied into the pooled buffer, which goes out whenever it is full."""
    view = pooled.view
    used = 0
    for e, t in zip(run, tensors, strict=True):
        for piece in _own_pieces(t, e, chunk):
            left = piece
            while left:
                take = min(len(left), GATHER_BYTES - used)
                view[used : used + take] = left[:take]
                used += take
                left = left[take:]
                if used == GATHER_BYTES:
                    yield view[:used]
                    used = 0
    if used:
        yield view[:used]


def _corrupt(where: str, why: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"{where}: {why}", path=where)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen = dict(pairs)
    if len(seen) != len(pairs):
        keys: set[str] = set()
        for k, _ in pairs:
            if k in keys:
                raise ValueError(f"duplicate key {k!r}")
            keys.add(k)
    return seen


def _keys_unique(raw: bytes, doc: dict[str, Any]) -> bool:
    """Whether a header parsed without `_no_duplicates` had no key twice, told from its text (True only when
    certain). Every key is followed by its colon, and a colon anywhere else is inside a string: so the text holds
    no more keys than the parsed objects (two levels deep, as a header is) exactly when it holds no more colons,
    and then none was dropped. Our own headers have no colon in a name; others' fall to the slower parse."""
    keys = len(doc)
    for value in doc.values():
        if type(value) is dict:
            keys += len(value)
    return raw.count(b":") == keys


def _loads(raw: bytes) -> Any:
    """A header's JSON: orjson's parse (twice as fast as json's on 10,000s of entries), or json's where orjson
    refuses (NaN, a number out of range, a lone surrogate), so what is read is what json reads. The two differ
    only where neither gives a header (a number past 64 bits is a float in one and an int in the other, and
    both are refused as a shape or offset); a test holds them to that."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw.decode("utf-8"))


_BY_OFFSETS = operator.itemgetter(3, 4)  # an Entry's (begin, end)
_NEW_ENTRY = tuple.__new__


def parse_header(raw: bytes, *, data_bytes: int, where: str) -> tuple[list[Entry], dict[str, str]]:
    """Validate a header against the number of data bytes that follow it.

    Raises:
        CheckpointCorruptError: anything out of place, naming the tensor.
    """
    try:
        doc = _loads(raw)
        if type(doc) is dict and not _keys_unique(raw, doc):  # the parse that names a duplicate, 1.6x as slow
            doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise _corrupt(where, f"header is not valid JSON ({e})") from e
    except RecursionError as e:
        raise _corrupt(where, "header is nested too deeply to be a safetensors header") from e
    if not isinstance(doc, dict):
        raise _corrupt(where, f"expected a JSON object as header, found {type(doc).__name__}")
    meta = doc.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _corrupt(where, "expected __metadata__ to map strings to strings")
    entries: list[Entry] = []
    append = entries.append
    cursor, in_order = 0, True
    for name, info in doc.items():  # IMPORTANT: 10,000s of entries in a real state; each check kept cheap
        entry = _entry(name, info, where)
        if entry.begin != cursor:
            in_order = False
        cursor = entry.end
        append(entry)
    if not in_order:  # offsets out of order need not be wrong (safetensors orders by name); gaps and overlaps are
        entries.sort(key=_BY_OFFSETS)
        cursor = _contiguous_end(entries, where)
    if cursor != data_bytes:
        raise _corrupt(where, f"tensors cover {cursor} data bytes but the file holds {data_bytes}")
    return entries, meta


def _entry(name: str, info: Any, where: str) -> Entry:
    """One header entry, checked: a known dtype, a shape and offsets of non-negative ints within torch's limits,
    and offsets that hold exactly the shape's bytes."""
    try:
        dtype = CODES[info["dtype"]]
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        if type(begin) is not int or type(end) is not int or begin < 0 or end < 0:  # bool is not int here
            raise ValueError("shape and offsets must be non-negative integers")
        for d in shape:
            if type(d) is not int or d < 0:
                raise ValueError("shape and offsets must be non-negative integers")
        if len(shape) > MAX_DIMS:
            raise ValueError(f"{len(shape)} dimensions, more than torch's {MAX_DIMS}")
        numel = math.prod(shape)
        extent = numel if numel else math.prod(max(d, 1) for d in shape)
        if extent * dtype.itemsize >= MAX_EXTENT or begin >= MAX_EXTENT or end >= MAX_EXTENT:
            raise ValueError("a shape or offset too large for any tensor (its strides would overflow)")
    except (KeyError, TypeError, ValueError) as e:
        raise _corrupt(where, f"tensor {name!r} has a malformed header entry {str(info)[:120]} ({e})") from e
    want = numel * dtype.itemsize
    if end - begin != want:
        raise _corrupt(
            where,
            f"tensor {name!r}: shape {list(shape)} of {info['dtype']} needs {want} bytes, offsets give {end - begin}",
        )
    return _NEW_ENTRY(Entry, (name, dtype, shape, begin, end))


def _contiguous_end(entries: Sequence[Entry], where: str) -> int:
    """Entries in offset order must follow each other without gap or overlap: where the last one ends."""
    cursor = 0
    for entry in entries:
        if entry.begin != cursor:
            raise _corrupt(
                where, f"tensor {entry.name!r} starts at byte {entry.begin}, expected {cursor} (gap or overlap)"
            )
        cursor = entry.end
    return cursor


def read_header(source: Source, size: int, *, where: str) -> list[Entry]:
    """Read and check only the header of a file of ``size`` bytes (the stream is left after it)."""
    entries, _ = _header(source, size, where, None)
    return entries


def _header(source: Source, size: int, where: str, hasher: Any) -> tuple[list[Entry], dict[str, str]]:
    if size < 8:
        raise _corrupt(where, f"file is {size} bytes, shorter than the 8-byte header length")
    head = _read_exact(source, 8, where)
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise _corrupt(where, f"header length {n} is impossible for a file of {size} bytes (limit {MAX_HEADER_BYTES})")
    raw = _read_exact(source, n, where)
    if hasher is not None:
        hasher.update(head)
        hasher.update(raw)
    return parse_header(raw, data_bytes=size - 8 - n, where=where)


def read(
    source: Source,
    size: int,
    *,
    where: str,
    expected_checksum: str | None = None,
    into: Into | None = None,
    entries: Sequence[Entry] | None = None,
    chunk: int = READ_CHUNK_BYTES,
    run_cap: int = RUN_BYTES,
    assist: Callable[[list[Piece], Callable[[int, torch.Tensor], object]], Assisted] | None = None,
) -> dict[str, torch.Tensor]:
    """Read a whole safetensors file of ``size`` bytes, verifying its checksum on the way.

    Args:
        into: optional; given entries, returns for each a contiguous CPU tensor of its dtype and shape to read
            into (e.g. the live parameter), or None to allocate a fresh one (asked once per run of small tensors).
        entries: the header as `read_header` parsed it already, in offset order as it returns them (its bytes are
            still read and hashed, so a header changed since is caught by the checksum).
        chunk: the size of the reads of large tensors (a tensor ``SMALL_TENSOR_BYTES`` or more).
        run_cap: the most bytes of small tensors read at once (capped at ``BATCH_BYTES``).
        assist: optional; given the file's pieces in file order and how to spread a run of small tensors from its
            own buffer, returns what lets other threads read pieces from the end (`assist.Assisted`, which calls
            ``spread`` from those threads). ``source`` must then seek.

    Raises:
        CheckpointCorruptError: truncated, malformed, or checksum mismatch.
    """
    hasher = checksum.new()
    entries, data = _read_and_hash_header(source, size, where, hasher, entries)
    # A run of small tensors is read, hashed and scattered in pieces of at most ``run_cap`` bytes: each stays in the
    # CPU's cache for all three, and a restore's fresh threads fault in no more of their buffers.
    segments = _segments(entries, max(1, min(run_cap, BATCH_BYTES)), where)
    reading = _Reading(source, where, hasher, data=data, into=into, chunk=chunk)
    if assist is not None:
        reading.offer(segments, assist)
    try:
        for seg in segments:
            if isinstance(seg, Entry):
                reading.large(seg)
            else:
                reading.run(seg)
    finally:
        if reading.assisted is not None:
            reading.assisted.close()  # no helper writes into these tensors once this read has ended, well or not
    if expected_checksum is not None:
        _check_checksum(hasher.hexdigest(), expected_checksum, where)
    return reading.out


def _read_and_hash_header(
    source: Source, size: int, where: str, hasher: Any, entries: Sequence[Entry] | None
) -> tuple[Sequence[Entry], int]:
    """Read the header into ``hasher`` (parsing it unless ``entries`` were given): the entries and where the data
    starts."""
    if entries is None:
        parsed, _ = _header(source, size, where, hasher)
        return parsed, size - (parsed[-1].end if parsed else 0)  # parse_header: the entries cover the data
    head = _read_exact(source, 8, where)
    (n,) = struct.unpack("<Q", head)
    if 8 + n > size:
        raise _corrupt(where, f"header length {n} is impossible for a file of {size} bytes")
    hasher.update(head)
    hasher.update(_read_exact(source, n, where))
    return entries, 8 + n


def _check_checksum(found: str, expected: str, where: str) -> None:
    if found != expected:
        raise _corrupt(
            where,
            f"checksum mismatch: COMMIT.json records {expected}, the file hashes to "
            f"{found} (the file changed after it was written: bit rot, a partial copy, or tampering)",
        )


class _Reading:
    """One `read` of a file's data, segment by segment in file order: ``pos`` is where the source is, ``k`` the next
    piece of those offered to helpers (``assisted``), ``out`` the tensors read so far."""

    def __init__(self, source: Source, where: str, hasher: Any, *, data: int, into: Into | None, chunk: int) -> None:
        self.source = source
        self.where = where
        self.hasher = hasher
        self.data = data  # where the tensors' bytes start
        self.pos = data
        self.into = into
        self.chunk = chunk
        self.k = 0
        self.out: dict[str, torch.Tensor] = {}
        self.large_targets: dict[str, torch.Tensor] = {}
        self.assisted: Assisted | None = None

    def offer(
        self,
        segments: list[Entry | list[Entry]],
        assist: Callable[[list[Piece], Callable[[int, torch.Tensor], object]], Assisted],
    ) -> None:
        """Offer every piece to helper threads, which read pieces from the end (`assist`)."""
        pieces: list[Piece] = []
        runs: dict[int, list[Entry]] = {}  # the runs of small tensors, by piece
        chunk, data = self.chunk, self.data
        for seg in segments:
            if isinstance(seg, Entry):
                target = self.large_targets[seg.name] = _large_target(seg, self.into)
                view = byte_view(target.detach())
                pieces += [Piece(data + seg.begin + s, view[s : s + chunk]) for s in range(0, len(view), chunk)]
            else:
                runs[len(pieces)] = seg
                pieces.append(Piece(data + seg[0].begin, None, seg[-1].end - seg[0].begin))
        self.assisted = assist(pieces, lambda k, buf: _spread(buf, runs[k], self.into, self.where))

    def _mine(self) -> bool:
        return self.assisted is None or self.assisted.own(self.k)

    def _seek(self, offset: int) -> None:
        if self.pos != offset:  # a helper read the pieces before it
            self.pos = offset
            self.source.seek(offset)  # type: ignore[attr-defined]

    def run(self, seg: list[Entry]) -> None:
        """A run of small tensors: read into one buffer, hashed, spread to the tensors."""
        if self._mine():
            nbytes = seg[-1].end - seg[0].begin
            self._seek(self.data + seg[0].begin)
            buf = _batch_buffer()[:nbytes]
            view = byte_view(buf)
            _readinto_exact(self.source, view, self.where)
            self.hasher.update(view)
            targets = _spread(buf, seg, self.into, self.where)
            self.pos += nbytes
        else:  # a helper read it into a buffer of its own and spread it
            assert self.assisted is not None
            buf, targets = _helped(self.assisted, self.k, self.where)  # type: ignore[misc]
            self.hasher.update(byte_view(buf))
        self.out.update(zip(map(_ENTRY_NAME, seg), targets, strict=True))
        self.k += 1

    def large(self, e: Entry) -> None:
        """A large tensor: read in chunks straight into its target."""
        found = self.large_targets.get(e.name)
        target = found if found is not None else _large_target(e, self.into)
        view = byte_view(target.detach())
        for start in range(0, len(view), self.chunk):
            piece = view[start : start + self.chunk]
            if self._mine():
                self._seek(self.data + e.begin + start)
                _readinto_exact(self.source, piece, self.where)
                self.pos += len(piece)
            else:  # a helper's: read into its place already, or soon
                assert self.assisted is not None
                _helped(self.assisted, self.k, self.where)
            self.hasher.update(piece)
            self.k += 1
        self.out[e.name] = target


Into = Callable[[Sequence[Entry]], Sequence[torch.Tensor | None]]


def _segments(entries: Sequence[Entry], run_cap: int, where: str) -> list[Entry | list[Entry]]:
    """A file's tensors in the order they are read: a large one (or an empty one) alone, small ones in runs of at
    most ``run_cap`` bytes."""
    segments: list[Entry | list[Entry]] = []
    run: list[Entry] = []
    run_bytes = cursor = 0
    for e in entries:
        begin, end = e.begin, e.end
        if begin != cursor:  # parse_header leaves them in order, back to back; the bytes are read so
            raise ValueError(f"{where}: entries out of offset order ({e.name!r} at byte {begin}, expected {cursor})")
        cursor = end
        nbytes = end - begin
        if 0 < nbytes < SMALL_TENSOR_BYTES:
            if run and run_bytes + nbytes > run_cap:
                segments.append(run)
                run, run_bytes = [], 0
            run.append(e)
            run_bytes += nbytes
            continue
        if run:
            segments.append(run)
            run, run_bytes = [], 0
        segments.append(e)
    if run:
        segments.append(run)
    return segments


def _large_target(e: Entry, into: Into | None) -> torch.Tensor:
    target = into((e,))[0] if into is not None else None
    return target if target is not None else torch.empty(e.shape, dtype=e.dtype)


def _helped(assisted: Assisted, k: int, where: str) -> object:
    """What a helper made of piece ``k``, once it is read."""
    try:
        return assisted.wait(k)
    except ShortRead as e:
        why = f"file ends early: expected {e.missing} more bytes at byte {e.offset} (truncated?)"
        raise _corrupt(where, why) from e


def _spread(buf: torch.Tensor, run: list[Entry], into: Into | None, where: str) -> list[torch.Tensor]:
    """Many small tensors stored back to back, read into ``buf``: copied out to their tensors (`vcopy.scatter`: a
    restore scatters 10,000s of them)."""
    sizes = [x.end - x.begin for x in run]
    given = into(run) if into is not None else [None] * len(run)
    targets = [  # None: a tensor of its own, not a view into one shared block: it owns (and frees) its memory
        t if t is not None else torch.empty(e.shape, dtype=e.dtype) for t, e in zip(given, run, strict=True)
    ]  # one target per entry, or a ValueError
    # IMPORTANT: a raw copy, so each target must be a contiguous CPU tensor of exactly its entry's bytes (what
    # `into` promises, and what torch.empty gives; the size is checked here).
    found = list(map(_NBYTES, targets))
    if found != sizes:
        i = next(i for i, (a, b) in enumerate(zip(found, sizes, strict=True)) if a != b)
        raise ValueError(f"{where}: a target of {found[i]} bytes for tensor {run[i].name!r} of {sizes[i]}")
    vcopy.scatter(buf.data_ptr(), list(map(torch.Tensor.data_ptr, targets)), sizes)  # the run is back to back
    return targets


def _read_exact(source: Source, n: int, where: str) -> bytes:
    buf = bytearray(n)
    _readinto_exact(source, memoryview(buf), where)
    return bytes(buf)


def _readinto_exact(source: Source, buf: memoryview, where: str) -> None:
    got = 0
    while got < len(buf):
        k = source.readinto(buf[got:])
        if not k:
            raise _corrupt(where, f"file ends early: expected {len(buf) - got} more bytes (truncated?)")
        got += k
