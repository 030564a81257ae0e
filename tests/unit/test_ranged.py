"""Piece checksums and ranged reads, the ground elastic restore stands on (the torchrun tests are in
tests/e2e/test_reshard.py).

Properties: the pieces a file's checksums cover are the same however its bytes were streamed (direct, staged, any
piece size); a ranged read returns exactly the bytes asked for and reads at most one piece more on each side; a
flipped byte fails every read whose pieces hold it and no other.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from unittest import mock

import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemptible.checkpoint import reshard
from preemptible.checkpoint.reader import Opened, Reader
from preemptible.errors import CheckpointCorruptError
from preemptible.state import shard_rows
from preemptible.store import format as tensor_format
from preemptible.store import layout
from preemptible.store.io import LocalStorage
from preemptible.store.layout import FileRecord, Manifest
from preemptible.writer import FileSpec, write_tensor_file

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
sizes = st.lists(st.integers(0, 30_000), min_size=1, max_size=6)


def tensors(lengths: list[int]) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(sum(lengths))
    return [(f"t{i}", torch.randn(n, generator=g)) for i, n in enumerate(lengths)]


@given(rows=st.integers(0, 300), world=st.integers(1, 17))
def test_shard_rows_is_torch_chunks_rule(rows: int, world: int) -> None:
    parts = torch.arange(rows).chunk(world) if rows else ()
    for rank in range(world):
        begin, end = shard_rows(rows, world, rank)
        want = parts[rank].tolist() if rank < len(parts) else []
        assert list(range(begin, end)) == want


@SETTINGS
@given(lengths=sizes, piece=st.integers(1, 50_000), part=st.integers(1, 70_000))
def test_piece_checksums_do_not_depend_on_how_the_bytes_were_streamed(
    lengths: list[int], piece: int, part: int
) -> None:
    items = tensors(lengths)
    direct = io.BytesIO()
    with mock.patch.object(tensor_format, "HASH_BYTES", part):  # the parts a written piece is hashed in
        _, digest, chunks = tensor_format.write(direct, items, chunk=piece)  # type: ignore[arg-type]
    # the same bytes from one staged buffer, in pieces of another size
    entries = tensor_format.layout(items)
    blob = b"".join(
        t.numpy().tobytes() for _, t in sorted(items, key=lambda x: next(e.begin for e in entries if e.name == x[0]))
    )
    staged = io.BytesIO()
    _, digest2, chunks2 = tensor_format.write(staged, items, blob=memoryview(blob), chunk=max(1, piece // 3))  # type: ignore[arg-type]
    assert (digest2, chunks2) == (digest, chunks)
    # independently: the header, then each tensor cut every chunks.bytes from its own start
    raw = direct.getvalue()
    head = 8 + int.from_bytes(raw[:8], "little")
    want = [xxhash.xxh3_64_hexdigest(raw[:head])]
    for e in sorted(entries, key=lambda e: e.begin):
        want += [
            xxhash.xxh3_64_hexdigest(raw[head + b : head + min(b + chunks.bytes, e.end)])
            for b in range(e.begin, e.end, chunks.bytes)
        ]
    assert chunks.sums == "".join(want)
    assert xxhash.xxh3_64_hexdigest(raw) == digest  # the whole-file checksum is unchanged (xxhsum -H3 checks it)


def test_piece_size_grows_with_the_file_so_the_manifest_stays_small() -> None:
    assert tensor_format.sum_chunk_bytes(0) == tensor_format.MIN_SUM_CHUNK
    assert tensor_format.sum_chunk_bytes(64 << 20) == tensor_format.MIN_SUM_CHUNK
    assert tensor_format.sum_chunk_bytes(1 << 30) == 256 << 10
    for n in (1, 10**6, 10**9, 10**11):
        assert -(-n // tensor_format.sum_chunk_bytes(n)) <= tensor_format.MAX_SUMS_PER_FILE


def opened_file(tmp: Path, lengths: list[int]) -> tuple[Reader, Opened, list[tensor_format.Entry], bytes]:
    storage = LocalStorage(str(tmp))
    items = tensors(lengths)
    rec = write_tensor_file(storage, str(tmp), FileSpec("t.safetensors", tuple(items)))
    manifest = Manifest(step=1, created="", world_size=1, checksum_algorithm="xxh3-64", files={"t.safetensors": rec})
    opened = Opened(step=1, directory=str(tmp), manifest=manifest, files_dir=str(tmp))
    opened.reshard = reshard.Plan(saved_world=1, world=1)
    reader = Reader(storage, str(tmp), threads=1)
    entries = reshard._header(reader, opened, opened.reshard, "t.safetensors")
    opened.file_entries["t.safetensors"] = entries
    return reader, opened, entries, (tmp / "t.safetensors").read_bytes()


def read(reader: Reader, opened: Opened, e: tensor_format.Entry, a: int, b: int) -> tuple[bytes, int]:
    out = bytearray(b - a)
    counted = []
    copy = reshard.Copy(e.name, reshard.Piece("t.safetensors", e, 0), a, 0, b - a)
    reshard._ranged(reader, opened, copy, memoryview(out), count=counted.append)
    return bytes(out), sum(counted)


@SETTINGS
@given(lengths=sizes, data=st.data())
def test_a_ranged_read_returns_exactly_its_bytes_and_little_more(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], data: st.DataObject
) -> None:
    reader, opened, entries, raw = opened_file(tmp_path_factory.mktemp("f"), lengths)
    head = opened.reshard.data_offset["t.safetensors"]
    size = opened.manifest.files["t.safetensors"].chunks.bytes  # type: ignore[union-attr]
    for e in entries:
        if not e.nbytes:
            continue
        a = data.draw(st.integers(0, e.nbytes - 1))
        b = data.draw(st.integers(a + 1, e.nbytes))
        got, counted = read(reader, opened, e, a, b)
        assert got == raw[head + e.begin + a : head + e.begin + b]
        assert b - a <= counted <= b - a + 2 * size


@SETTINGS
@given(lengths=sizes.filter(lambda x: sum(x) > 0), data=st.data())
def test_a_flipped_byte_fails_exactly_the_reads_that_cover_its_piece(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], data: st.DataObject
) -> None:
    tmp = tmp_path_factory.mktemp("f")
    reader, opened, entries, raw = opened_file(tmp, lengths)
    head = opened.reshard.data_offset["t.safetensors"]
    size = opened.manifest.files["t.safetensors"].chunks.bytes  # type: ignore[union-attr]
    e = data.draw(st.sampled_from([e for e in entries if e.nbytes]))
    at = data.draw(st.integers(0, e.nbytes - 1))
    damaged = bytearray(raw)
    damaged[head + e.begin + at] ^= 0x01
    (tmp / "t.safetensors").write_bytes(bytes(damaged))
    a = data.draw(st.integers(0, e.nbytes - 1))
    b = data.draw(st.integers(a + 1, e.nbytes))
    covers = a // size <= at // size < -(-b // size)
    if covers:
        with pytest.raises(CheckpointCorruptError, match="checksum mismatch in bytes"):
            read(reader, opened, e, a, b)
    else:
        assert read(reader, opened, e, a, b)[0] == raw[head + e.begin + a : head + e.begin + b]


def test_a_header_changed_after_the_commit_is_refused(tmp_path: Path) -> None:
    reader, opened, _, raw = opened_file(tmp_path, [100, 5000])
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"]["writer"] = "someone"  # same length: only the checksum can tell
    text = json.dumps(header, separators=(",", ":")).encode()
    (tmp_path / "t.safetensors").write_bytes(raw[:8] + text.ljust(n) + raw[8 + n :])
    with pytest.raises(CheckpointCorruptError, match="the header hashes to"):
        reshard._header(reader, opened, opened.reshard, "t.safetensors")


@pytest.mark.parametrize(
    ("chunks", "why"),
    [
        ({"bytes": 0, "sums": "00" * 8}, "bytes"),
        ({"bytes": 20000, "sums": "00" * 8}, "not a power of two"),
        ({"bytes": 1, "sums": "00" * 8}, "a piece per byte"),
        ({"bytes": 16384, "sums": "xyz"}, "sums"),
        ("abc", "not an object"),
    ],
)
def test_malformed_piece_checksums_in_a_manifest_are_refused(chunks: object, why: str) -> None:
    doc = {"bytes": 10, "checksum": "0" * 16, "chunks": chunks}
    assert FileRecord.from_doc(doc) is None, why
    manifest = Manifest(
        step=1, created="", world_size=1, checksum_algorithm="xxh3-64", files={"state.json": FileRecord(10, "0" * 16)}
    )
    body = json.loads(manifest.to_json())
    body.pop(layout.SELF_CHECKSUM)
    body["files"]["state.json"] = doc
    with pytest.raises(CheckpointCorruptError, match="optional 'chunks'"):
        Manifest.from_json(json.dumps(layout.seal(body)).encode(), where="COMMIT.json")


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        ({"mesh": [2, 2], "placements": ["Replicate()", "Shard(dim=0)"]}, "a 2-D mesh"),
        ({"mesh": [4], "placements": ["Shard(dim=1)"]}, "placement Shard(dim=1)"),
        ({"mesh": [4], "placements": ["_StridedShard(dim=0, sf=2)"]}, "placement _StridedShard"),
    ],
)
def test_layouts_that_cannot_be_resharded_are_named(meta: dict[str, object], why: str) -> None:
    found = reshard._supported(meta)
    assert found is not None and found.startswith(why)
    assert reshard._supported({"mesh": [3], "placements": ["Shard(dim=0)"]}) is None
    assert reshard._supported({"mesh": [3], "placements": ["Replicate()"]}) is None
