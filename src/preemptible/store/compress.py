"""Compressed tensor files (``.safetensors.zst``): a safetensors file cut into frames, byte-grouped, zstd-compressed.

Why byte grouping: a float's bytes differ in kind. The byte holding the sign and most of the exponent takes few
values across a tensor; the low mantissa bytes are close to random. Compressed as they lie, they mix and zstd finds
little (fp32 weights: about 7% saved); grouped by position (all first bytes, then all second bytes, ...), the
exponent bytes shrink to a third and the mantissa bytes are stored as they are (fp32: 16-24% saved, bf16: about a
third), the result ZipNN published. A plane whose first 64 KiB does not compress is stored raw without trying the
rest, so incompressible bytes cost a copy, not a compression.

Layout of a file (all integers little-endian)::

    8 bytes    magic  b"PTZST\\x00\\x01\\n"
    frames     back to back; frame i holds planes 0..g-1, each zstd-compressed or raw
    index      JSON: {"format": "preemptible.zst", "version": 1, "codec": "zstd", "decoded_bytes": D,
                      "checksum_algorithm": "xxh3-64", "frames": [[decoded, g, xxh3, stored_0, ..., stored_g-1]]}
    8 bytes    length of the index
    8 bytes    magic  b"PTZIDX\\x01\\n"

The decoded frames, concatenated, are exactly the plain safetensors file (frame 0 is its header, raw or
compressed); each data frame holds bytes of one item size ``g`` (tensors are laid out by item size) and is at most
`FRAME_BYTES`. Plane ``p`` of a frame is byte ``p`` of every item; a plane whose stored length equals its decoded
length (``decoded / g``) is raw, a shorter one is one zstd frame. Each frame records the XXH3-64 of its decoded
bytes, so a reader verifies every frame it decodes (and a ranged reader only those it needs); ``COMMIT.json``
records the checksum of the stored file, as for plain files.

Frames are encoded in parallel threads (zstd and NumPy release the GIL) and written in order, a bounded number in
flight, so a 10 GB tensor never needs more than a few frames of memory. Decoding is parallel the same way.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import operator
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from preemptible.errors import CheckpointCorruptError
from preemptible.store import bounds, checksum
from preemptible.store import format as tensor_format
from preemptible.store.threads import Pool

SUFFIX = ".zst"
MAGIC = b"PTZST\x00\x01\n"
TAIL_MAGIC = b"PTZIDX\x01\n"
FORMAT = "preemptible.zst"
VERSION = 1
FRAME_BYTES = 4 << 20
SAMPLE_BYTES = 64 << 10
RAW_ABOVE = 0.97
"""A plane whose sample compresses to more than this share of itself is stored raw."""
MAX_INDEX_BYTES = bounds.MAX_INDEX_BYTES
MAX_FRAME_BYTES = bounds.MAX_FRAME_BYTES
DEFAULT_LEVEL = 1
TAIL_BYTES = 16


def available() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError(
            "compressed checkpoints need the zstandard package (a dependency of preemptible): pip install zstandard"
        ) from e
    return zstandard


@dataclass(frozen=True)
class Frame:
    decoded: int
    group: int
    sum: str
    planes: tuple[int, ...]

    @property
    def stored(self) -> int:
        return sum(self.planes)

    def to_doc(self) -> list[Any]:
        return [self.decoded, self.group, self.sum, *self.planes]


def frame_spans(entries: Sequence[tensor_format.Entry], head: int, frame_bytes: int) -> list[tuple[int, int, int]]:
    """The frames of a file whose header is ``head`` bytes: ``(begin, end, group)`` in decoded offsets. The header
    is one frame (group 1); the data region is cut at every change of item size and every ``frame_bytes``."""
    spans = [(0, head, 1)]
    runs: list[list[int]] = []  # [begin, end, group] of runs of one item size, data offsets
    for e in sorted(entries, key=lambda e: e.begin):
        if not e.nbytes:
            continue
        g = e.dtype.itemsize
        if runs and runs[-1][2] == g and runs[-1][1] == e.begin:
            runs[-1][1] = e.end
        else:
            runs.append([e.begin, e.end, g])
    step = max(8, frame_bytes - frame_bytes % 8)
    for begin, end, g in runs:
        spans += [(head + b, head + min(b + step, end), g) for b in range(begin, end, step)]
    return spans


# encoding --------------------------------------------------------------------------------------------------
_local = threading.local()


def _compressor(level: int) -> Any:
    key = f"c{level}"
    c = getattr(_local, key, None)
    if c is None:
        c = _zstd().ZstdCompressor(level=level)
        setattr(_local, key, c)
    return c


def _decompressor() -> Any:
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = _zstd().ZstdDecompressor()
    return d


def encode_frame(data: np.ndarray, group: int, level: int = DEFAULT_LEVEL) -> tuple[list[Any], Frame]:
    """One frame: its stored parts (bytes or views of ``data``/its grouped copy) and its record."""
    digest = checksum.of_bytes(data.data)
    if group > 1:
        grouped = np.ascontiguousarray(data.reshape(-1, group).T)
        planes = [grouped[p] for p in range(group)]
    else:
        planes = [data]
    cctx = _compressor(level)
    parts: list[Any] = []
    for plane in planes:
        n = len(plane)
        if n >= 2 * SAMPLE_BYTES and len(cctx.compress(plane[:SAMPLE_BYTES])) > RAW_ABOVE * SAMPLE_BYTES:
            parts.append(plane.data)
            continue
        out = cctx.compress(plane)
        parts.append(out if len(out) < n else plane.data)
    return parts, Frame(len(data), group, digest, tuple(len(p) for p in parts))


@dataclass
class Stats:
    """What one compressed file (or save) measured."""

    decoded: int = 0
    stored: int = 0
    encode_s: float = 0.0  # CPU-thread seconds spent encoding frames
    io_s: float = 0.0  # seconds the file's thread spent in the storage's writes and close (set by its writer)

    def add(self, other: Stats) -> None:
        self.decoded += other.decoded
        self.stored += other.stored
        self.encode_s += other.encode_s
        self.io_s += other.io_s

    @property
    def ratio(self) -> float | None:
        return self.stored / self.decoded if self.decoded else None


@dataclass
class Codec:
    """Compression settings of one save, and the threads that encode its frames."""

    level: int = DEFAULT_LEVEL
    threads: int = 2
    frame_bytes: int = FRAME_BYTES
    stats: Stats = field(default_factory=Stats)
    _pool: Pool | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pool(self) -> Pool:
        with self._lock:
            if self._pool is None:
                self._pool = Pool(self.threads, "preemptible-zstd")
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def record(self, stats: Stats) -> None:
        with self._lock:
            self.stats.add(stats)


def write(
    sink: tensor_format.Sink,
    items: Sequence[tuple[str, torch.Tensor]],
    metadata: Mapping[str, str] | None = None,
    *,
    codec: Codec,
    stored: Mapping[str, torch.dtype] | None = None,
    blob: memoryview | None = None,
    on_decoded: Callable[[int], None] | None = None,
) -> tuple[int, str, Stats]:
    """Stream a compressed tensor file of ``items`` to ``sink``.

    Returns:
        ``(stored bytes, checksum of the stored bytes, stats)``.
    """
    entries, head, pieces = tensor_format.encode(items, metadata, stored=stored, blob=blob)
    spans = frame_spans(entries, len(head), codec.frame_bytes)
    stats = Stats()
    hasher = checksum.new()
    frames: list[Frame] = []
    window = 2 * max(1, codec.threads)
    free: list[np.ndarray] = []
    inflight: deque[tuple[Future[tuple[list[Any], Frame, float]], np.ndarray]] = deque()
    pool = codec.pool()
    total = 0

    def put(data: memoryview | bytes) -> None:
        nonlocal total
        sink.write(data if isinstance(data, memoryview) else memoryview(data))
        hasher.update(data)
        total += len(data)

    def job(buf: np.ndarray, group: int) -> tuple[list[Any], Frame, float]:
        t0 = time.thread_time()
        parts, frame = encode_frame(buf, group, codec.level)
        return parts, frame, time.thread_time() - t0

    def drain(keep: int) -> None:
        while len(inflight) > keep:
            future, buf = inflight.popleft()
            parts, frame, cpu = future.result()
            for part in parts:
                put(part)
            frames.append(frame)
            stats.encode_s += cpu
            stats.decoded += frame.decoded
            if on_decoded is not None:
                on_decoded(frame.decoded)
            free.append(buf)

    put(MAGIC)
    stream = _Reframer([memoryview(head)], pieces)
    try:
        for begin, end, group in spans:
            n = end - begin
            buf = free.pop() if free else np.empty(max(codec.frame_bytes, len(head)), dtype=np.uint8)
            if len(buf) < n:
                buf = np.empty(n, dtype=np.uint8)
            view = buf[:n]
            stream.fill(view.data)
            inflight.append((pool.submit(job, view, group), buf))
            drain(window)
        drain(0)
    finally:
        pieces.close()  # a pooled buffer goes back (the last piece was copied out by now)
        _cancel_and_wait(inflight)
    put(_index_and_trailer(frames))
    stats.stored = total
    return total, hasher.hexdigest(), stats


def _cancel_and_wait(inflight: Iterable[tuple[Future[Any], np.ndarray]]) -> None:
    """Cancel the frames still queued and wait for those running: no thread may still read a buffer of ours."""
    for future, _ in inflight:
        future.cancel()
    for future, _ in inflight:
        if not future.cancelled():
            future.exception()


def _index_and_trailer(frames: Sequence[Frame]) -> bytes:
    """The file's last bytes: the index of its frames, its length, and the trailer's magic."""
    index = json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "codec": "zstd",
            "decoded_bytes": sum(f.decoded for f in frames),
            "checksum_algorithm": checksum.ALGORITHM,
            "frames": [f.to_doc() for f in frames],
        },
        separators=(",", ":"),
    ).encode()
    return index + struct.pack("<Q", len(index)) + TAIL_MAGIC


class _Reframer:
    """Copies a stream of pieces of any size into consecutive buffers of the sizes asked for."""

    def __init__(self, *sources: Iterable[memoryview]) -> None:
        self._sources = [iter(s) for s in sources]
        self._piece = memoryview(b"")

    def fill(self, out: memoryview) -> None:
        got = 0
        while got < len(out):
            if not len(self._piece):
                self._piece = self._next()
                continue
            take = min(len(out) - got, len(self._piece))
            out[got : got + take] = self._piece[:take]
            self._piece = self._piece[take:]
            got += take

    def _next(self) -> memoryview:
        while self._sources:
            piece = next(self._sources[0], None)
            if piece is None:
                self._sources.pop(0)
                continue
            return piece
        raise RuntimeError("the tensor data ended before the layout did (the state changed while it was written?)")


# decoding --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Index:
    frames: tuple[Frame, ...]
    decoded_bytes: int
    stored_offsets: tuple[int, ...]  # where each frame starts in the file
    decoded_offsets: tuple[int, ...]
    tail: bytes  # the index and trailer as stored: the last bytes of the file's checksum


def _corrupt(where: str, why: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"{where}: {why}", path=where)


def parse_index(tail: bytes, size: int, *, where: str) -> Index:
    """Check the index and trailer (the file's last bytes, ``tail``) against the file's ``size``."""
    if len(tail) < TAIL_BYTES or tail[-8:] != TAIL_MAGIC:
        raise _corrupt(
            where,
            f"expected a compressed tensor file ending in {TAIL_MAGIC!r}; found {bytes(tail[-8:])!r} (truncated?)",
        )
    (n,) = struct.unpack("<Q", tail[-16:-8])
    if n + TAIL_BYTES != len(tail):
        raise _corrupt(where, f"index length {n} does not match the {len(tail) - TAIL_BYTES} bytes before the trailer")
    try:
        doc = json.loads(tail[:n].decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("codec") != "zstd":
            raise ValueError(f"not a {FORMAT} index with codec zstd")
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}; this preemptible reads version {VERSION}")
        if doc.get("checksum_algorithm") != checksum.ALGORITHM:
            raise ValueError(f"checksum algorithm {doc.get('checksum_algorithm')!r}, expected {checksum.ALGORITHM}")
        frames = [_frame(raw, k) for k, raw in enumerate(doc["frames"])]
        if not frames or sum(f.decoded for f in frames) != doc["decoded_bytes"]:
            raise ValueError("the frames do not add up to decoded_bytes")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise _corrupt(where, f"the index of the compressed file is malformed ({e})") from e
    stored, decoded = [len(MAGIC)], [0]
    for f in frames:
        stored.append(stored[-1] + f.stored)
        decoded.append(decoded[-1] + f.decoded)
    if stored[-1] + len(tail) != size:
        raise _corrupt(
            where, f"frames and index cover {stored[-1] + len(tail)} bytes but the file holds {size} (truncated?)"
        )
    return Index(tuple(frames), decoded[-1], tuple(stored[:-1]), tuple(decoded[:-1]), bytes(tail))


def _frame(raw: Any, k: int) -> Frame:
    """Frame ``k`` of an index, checked (raises ValueError): sizes, planes, checksum, and a decoded size within what
    a frame holds (the first frame holds the safetensors header: it may be as large as the largest header)."""
    decoded, group, digest, *planes = raw
    ints = (decoded, group, *planes)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ints):
        raise ValueError(f"frame {str(raw)[:80]}: sizes must be non-negative integers")
    if group not in (1, 2, 4, 8) or len(planes) != group or decoded % group:
        raise ValueError(f"frame {str(raw)[:80]}: {len(planes)} planes for a group of {group}")
    if any(p > decoded // group for p in planes) or not isinstance(digest, str) or len(digest) != 16:
        raise ValueError(f"frame {str(raw)[:80]}: a plane larger than itself, or a malformed checksum")
    limit = 8 + tensor_format.MAX_HEADER_BYTES if k == 0 else MAX_FRAME_BYTES
    if decoded > limit:
        raise ValueError(f"frame {k} decodes to {decoded} bytes, more than the {limit} a frame holds")
    return Frame(decoded, group, digest, tuple(planes))


def read_index(read_range: Callable[[int, memoryview], int], size: int, *, where: str) -> Index:
    """Read and check the index of a file of ``size`` bytes with ``read_range(offset, buffer)``."""
    if size < len(MAGIC) + TAIL_BYTES:
        raise _corrupt(where, f"file is {size} bytes, too short for a compressed tensor file")
    trailer = bytearray(TAIL_BYTES)
    if read_range(size - TAIL_BYTES, memoryview(trailer)) != TAIL_BYTES:
        raise _corrupt(where, "file ends early (truncated?)")
    (n,) = struct.unpack("<Q", trailer[:8])
    if trailer[8:] != TAIL_MAGIC:
        raise _corrupt(
            where, f"expected a compressed tensor file ending in {TAIL_MAGIC!r}; found {bytes(trailer[8:])!r}"
        )
    if n > MAX_INDEX_BYTES or n + TAIL_BYTES + len(MAGIC) > size:
        raise _corrupt(where, f"index length {n} is impossible for a file of {size} bytes (limit {MAX_INDEX_BYTES})")
    tail = bytearray(n + TAIL_BYTES)
    if read_range(size - len(tail), memoryview(tail)) != len(tail):
        raise _corrupt(where, "file ends early (truncated?)")
    return parse_index(bytes(tail), size, where=where)


def decode_frame(stored: memoryview, frame: Frame, out: memoryview, *, where: str, at: int) -> None:
    """Decode one frame's stored bytes into ``out`` (its decoded size) and verify its checksum."""
    n = frame.decoded // frame.group
    dst = np.frombuffer(out, dtype=np.uint8)
    grid = dst.reshape(-1, frame.group) if frame.group > 1 else None
    pos = 0
    dctx = _decompressor()
    for p, length in enumerate(frame.planes):
        part = stored[pos : pos + length]
        pos += length
        if length == n:
            plane = np.frombuffer(part, dtype=np.uint8)
        else:
            try:
                raw = dctx.decompress(part, max_output_size=n)
            except Exception as e:  # zstd's own error type
                raise _corrupt(where, f"frame at decoded byte {at}: plane {p} does not decompress ({e})") from e
            if len(raw) != n:
                raise _corrupt(where, f"frame at decoded byte {at}: plane {p} decodes to {len(raw)} bytes, not {n}")
            plane = np.frombuffer(raw, dtype=np.uint8)
        if grid is None:
            dst[:] = plane
        else:
            grid[:, p] = plane
    found = checksum.of_bytes(out)
    if found != frame.sum:
        raise _corrupt(
            where,
            f"checksum mismatch in decoded bytes {at}-{at + frame.decoded} (the file records {frame.sum}, the bytes "
            f"decode to {found}): the file changed after it was written",
        )


class DecodedSource:
    """The decoded bytes of a compressed file, read from its stored stream: frames decoded ``ahead`` at a time in
    the pool, each checked against its checksum; once the last frame is read, the whole stored file is checked
    against ``expected_checksum`` (COMMIT.json's), before its last bytes are handed out."""

    def __init__(
        self,
        stream: Any,
        index: Index,
        *,
        where: str,
        expected_checksum: str | None,
        pool: Pool | None,
        ahead: int = 4,
        on_stored: Callable[[int], None] | None = None,
    ) -> None:
        self._stream = stream
        self._index = index
        self._where = where
        self._expected = expected_checksum
        self._pool = pool
        self._ahead = max(1, ahead)
        self._hasher = checksum.new()
        self._next = 0
        self._pending: deque[tuple[Future[None] | None, bytearray]] = deque()
        self._current = memoryview(b"")
        self._on_stored = on_stored
        magic = bytearray(len(MAGIC))
        self._fill(memoryview(magic))
        if bytes(magic) != MAGIC:
            raise _corrupt(where, f"expected a compressed tensor file starting with {MAGIC!r}, found {bytes(magic)!r}")

    @property
    def size(self) -> int:
        return self._index.decoded_bytes

    def _fill(self, buf: memoryview) -> None:
        got = 0
        while got < len(buf):
            k = self._stream.readinto(buf[got:])
            if not k:
                raise _corrupt(self._where, f"file ends early: expected {len(buf) - got} more bytes (truncated?)")
            got += k
        self._hasher.update(buf)
        if self._on_stored is not None:
            self._on_stored(len(buf))

    def _submit(self) -> None:
        while self._next < len(self._index.frames) and len(self._pending) < self._ahead:
            i = self._next
            frame = self._index.frames[i]
            stored = bytearray(frame.stored)
            self._fill(memoryview(stored))
            out = bytearray(frame.decoded)
            at = self._index.decoded_offsets[i]
            if self._pool is None:
                decode_frame(memoryview(stored), frame, memoryview(out), where=self._where, at=at)
                self._pending.append((None, out))
            else:
                future = self._pool.submit(
                    decode_frame, memoryview(stored), frame, memoryview(out), where=self._where, at=at
                )
                self._pending.append((future, out))
            self._next += 1
            if self._next == len(self._index.frames):
                self._finish()

    def _finish(self) -> None:
        self._hasher.update(self._index.tail)
        found = self._hasher.hexdigest()
        if self._expected is not None and found != self._expected:
            raise _corrupt(
                self._where,
                f"checksum mismatch: COMMIT.json records {self._expected}, the file hashes to {found} (the file "
                "changed after it was written: bit rot, a partial copy, or tampering)",
            )

    def readinto(self, buffer: memoryview) -> int:
        if not len(self._current):
            self._submit()
            if not self._pending:
                return 0
            future, out = self._pending.popleft()
            if future is not None:
                future.result()
            self._current = memoryview(out)
            self._submit()
        take = min(len(buffer), len(self._current))
        buffer[:take] = self._current[:take]
        self._current = self._current[take:]
        return take

    def close(self) -> None:
        for future, _ in self._pending:
            if future is not None:
                future.cancel()
                if not future.cancelled():
                    future.exception()
        self._pending.clear()
        self._stream.close()


def read_header_frame(
    read_range: Callable[[int, memoryview], int], index: Index, *, where: str
) -> list[tensor_format.Entry]:
    """The tensor entries of a compressed file, from its first frame alone."""
    frame = index.frames[0]
    stored = bytearray(frame.stored)
    if read_range(index.stored_offsets[0], memoryview(stored)) != len(stored):
        raise _corrupt(where, "file ends early (truncated?)")
    out = bytearray(frame.decoded)
    decode_frame(memoryview(stored), frame, memoryview(out), where=where, at=0)
    return tensor_format.read_header(_Bytes(memoryview(out)), index.decoded_bytes, where=where)


class _Bytes:
    def __init__(self, data: memoryview) -> None:
        self._data = data

    def readinto(self, buffer: memoryview) -> int:
        take = min(len(buffer), len(self._data))
        buffer[:take] = self._data[:take]
        self._data = self._data[take:]
        return take


def is_compressed(name: str) -> bool:
    return name.endswith(SUFFIX)


# measuring ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """Compression measured on a sample of a state on this CPU: stored/decoded bytes, and decoded bytes per
    second that one thread encodes."""

    ratio: float
    rate: float
    sampled: int


SAMPLE_TENSORS = 8
SAMPLE_PER_TENSOR = 2 << 20


def measure(
    items: Iterable[tuple[torch.Tensor, torch.dtype]],
    *,
    level: int = DEFAULT_LEVEL,
    clock: Callable[[], float] = time.thread_time,
) -> Measured | None:
    """Encode a sample of the state (the first 2 MiB of each of its 8 largest tensors, in their stored dtype) as a
    save would, on this thread: its ratio (deterministic for given tensors) and the rate (a measurement). None
    when the state holds no bytes to sample."""
    decoded = stored = 0
    seconds = 0.0
    for t, dtype in largest(items, SAMPLE_TENSORS):
        n = max(1, SAMPLE_PER_TENSOR // dtype.itemsize)
        flat = t.detach().reshape(-1)[:n].to(device="cpu", dtype=dtype).contiguous()
        data = flat.view(torch.uint8).numpy()
        t0 = clock()
        _, frame = encode_frame(data, dtype.itemsize if dtype.itemsize in (2, 4, 8) else 1, level)
        seconds += clock() - t0
        decoded += frame.decoded
        stored += frame.stored
    if not decoded:
        return None
    return Measured(stored / decoded, decoded / max(seconds, 1e-6), decoded)


def largest(items: Iterable[tuple[torch.Tensor, torch.dtype]], n: int) -> list[tuple[torch.Tensor, torch.dtype]]:
    """The ``n`` largest non-empty tensors by their bytes in the dtype given with each, largest first, equal ones in
    their order (as a stable sort by decreasing size gives them). Sized from C (``map``), with no full sort: an
    emergency save of 10,000 small tensors measures its compression first: 2.8 ms to pick them, against 4.9 sorted."""
    pairs = list(items)
    sizes = list(
        map(
            operator.mul,
            map(torch.Tensor.numel, map(operator.itemgetter(0), pairs)),
            map(operator.attrgetter("itemsize"), map(operator.itemgetter(1), pairs)),
        )
    )
    keep = heapq.nlargest(n, itertools.compress(range(len(pairs)), sizes), key=sizes.__getitem__)
    return [pairs[i] for i in keep]


# deciding -------------------------------------------------------------------------------------------------
WORTH_IT = 0.9
"""Compress only when the prediction is at least 10% faster: a measurement is never exact."""
BACKGROUND_CPU_S = 0.25
"""A background save may spend at most this much CPU on compression (it competes with training for the cores)."""
MIN_AUTO_BYTES = 64 << 20
"""Below this, auto never compresses: at a few hundred MB/s it would save hundredths of a second, and the
bandwidth a small save measures is mostly its fixed costs."""
ASSUMED_OBJECT_BANDWIDTH = 200e6
"""An object store's bandwidth before a save has measured it (a few hundred MB/s per machine in the clouds)."""


@dataclass(frozen=True)
class Choice:
    """Whether one save compresses, and why: the prediction both ways from measured numbers."""

    on: bool
    why: str
    ratio: float | None = None
    rate: float | None = None  # decoded bytes/s one thread encodes
    bandwidth: float | None = None  # bytes/s the destination takes
    threads: int = 1
    plain_s: float | None = None
    compressed_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "on": self.on,
            "why": self.why,
            "ratio": _round(self.ratio, 4),
            "rate_mb_s": _round(self.rate / 1e6 if self.rate else None, 1),
            "bandwidth_mb_s": _round(self.bandwidth / 1e6 if self.bandwidth else None, 1),
            "threads": self.threads,
            "plain_s": _round(self.plain_s, 3),
            "compressed_s": _round(self.compressed_s, 3),
        }


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def weighed_bandwidth(bandwidth: float | None, *, object_store: bool) -> float | None:
    """The bandwidth auto weighs a save against: the destination's measured one; before any, an object store's
    `ASSUMED_OBJECT_BANDWIDTH`; None for a local destination not measured yet (auto leaves compression off there,
    and the state is not even sampled: `Measurements.codec`)."""
    return ASSUMED_OBJECT_BANDWIDTH if bandwidth is None and object_store else bandwidth


def check_setting(setting: object) -> bool | str:
    """A ``compress=`` setting, checked: True, False or ``"auto"`` (the one place that checks it).

    Raises:
        ValueError: anything else.
    """
    if setting not in (True, False, "auto"):
        raise ValueError(f"expected compress=True, False or 'auto', found {setting!r}")
    return setting


def choose(
    nbytes: int,
    *,
    setting: bool | str,
    measured: Measured | None,
    bandwidth: float | None,
    threads: int,
    cores: int,
    background: bool,
    object_store: bool,
) -> Choice:
    """Compress this save? ``setting`` True/False decides; ``"auto"`` predicts the save both ways:

    - plain: ``nbytes / bandwidth``;
    - compressed: encoding and writing overlap, so the slower of ``nbytes / (rate * threads)`` and
      ``nbytes * ratio / bandwidth``, with ``threads`` no more than the cores;

    and compresses when that is at least 10% faster. A background save also needs its encoding to cost at most
    `BACKGROUND_CPU_S` of CPU, and encodes on one thread: it must not slow training down. Before a save has
    measured the destination, a local one is taken as fast (off) and an object store as `ASSUMED_OBJECT_BANDWIDTH`.
    """
    check_setting(setting)
    workers = 1 if background else max(1, min(threads, cores))
    bandwidth = weighed_bandwidth(bandwidth, object_store=object_store)
    plain = packed = None
    if measured is not None and bandwidth and nbytes > 0:
        plain = nbytes / bandwidth
        packed = max(nbytes / (measured.rate * workers), nbytes * measured.ratio / bandwidth)
    ratio, rate = (measured.ratio, measured.rate) if measured is not None else (None, None)
    base = Choice(False, "", ratio, rate, bandwidth, workers, plain, packed)
    if setting is True or setting is False:
        return dataclasses.replace(base, on=bool(setting), why=f"compress={setting}")
    unweighed = _cannot_weigh(nbytes, bandwidth, measured)
    if unweighed is not None or measured is None or plain is None or packed is None or bandwidth is None:
        return dataclasses.replace(base, why=unweighed or "nothing to compress")
    if packed >= WORTH_IT * plain:
        why = (
            f"compressed {packed:.2f} s vs plain {plain:.2f} s: the destination ({bandwidth / 1e6:.0f} MB/s) is fast "
            f"enough for this state (ratio {measured.ratio:.2f}, {measured.rate / 1e6:.0f} MB/s per thread)"
        )
        return dataclasses.replace(base, why=why)
    cpu = nbytes / measured.rate
    if background and cpu > BACKGROUND_CPU_S:
        why = (
            f"a background save would spend {cpu:.2f} s of CPU compressing beside training (limit {BACKGROUND_CPU_S} s)"
        )
        return dataclasses.replace(base, why=why)
    why = f"compressed {packed:.2f} s vs plain {plain:.2f} s (ratio {measured.ratio:.2f}, {bandwidth / 1e6:.0f} MB/s)"
    return dataclasses.replace(base, on=True, why=why)


def _cannot_weigh(nbytes: int, bandwidth: float | None, measured: Measured | None) -> str | None:
    """Why auto leaves a save plain without weighing it, or None when it can weigh it."""
    if not available():
        return "the zstandard package is not installed"
    if nbytes <= 0:
        return "nothing to compress"
    if nbytes < MIN_AUTO_BYTES:
        return f"state under {MIN_AUTO_BYTES >> 20} MiB"
    if bandwidth is None:
        return "local storage not measured yet (the first save measures it)"
    return "nothing to compress" if measured is None else None
