from __future__ import annotations

import io
import itertools
import json
import struct
from typing import Any
from unittest import mock

import orjson
import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptible.errors import CheckpointCorruptError, UnsupportedStateError
from preemptible.state import flatten
from preemptible.store import format as tensor_format


class Buffer(io.BytesIO):
    def write(self, data):  # type: ignore[no-untyped-def, override]
        return super().write(bytes(data))


def write_to_bytes(items: list[tuple[str, torch.Tensor]]) -> tuple[bytes, str]:
    buf = Buffer()
    _, digest, _ = tensor_format.write(buf, items, {"format": "pt"})
    return buf.getvalue(), digest


def read_bytes(data: bytes, checksum: str | None = None) -> dict[str, torch.Tensor]:
    return tensor_format.read(io.BytesIO(data), len(data), where="test", expected_checksum=checksum)


def sample() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("w", torch.randn(5, 3, generator=g)),
        ("b16", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("h", torch.randn(2, 2, generator=g).half()),
        ("d", torch.randn(3, generator=g).double()),
        ("i", torch.arange(5, dtype=torch.int64)),
        ("u8", torch.arange(3, dtype=torch.uint8)),
        ("flag", torch.tensor([True, False, True])),
        ("scalar", torch.tensor(3.5)),
        ("empty", torch.empty(0, 4)),
        ("noncontig", torch.randn(4, 6, generator=g).t()),
    ]


def test_our_files_are_read_by_safetensors_and_back() -> None:
    items = sample()
    data, digest = write_to_bytes(items)
    theirs = safetensors.torch.load(data)
    ours = read_bytes(data, digest)
    for name, t in items:
        assert torch.equal(theirs[name], t), name
        assert torch.equal(ours[name], t), name
        assert ours[name].dtype == t.dtype
        assert ours[name].shape == t.shape


def test_we_read_files_written_by_safetensors() -> None:
    items = dict(sample())
    items["noncontig"] = items["noncontig"].contiguous()
    data = safetensors.torch.save(items)
    ours = read_bytes(data)
    for name, t in items.items():
        assert torch.equal(ours[name], t), name


def test_tensors_are_aligned_to_their_item_size() -> None:
    data, _ = write_to_bytes(sample())
    (n,) = struct.unpack("<Q", data[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__")
    for name, info in header.items():
        size = tensor_format.itemsize(tensor_format.CODES[info["dtype"]])
        assert info["data_offsets"][0] % size == 0, name


def test_unsupported_dtype_names_the_key() -> None:
    with pytest.raises(UnsupportedStateError) as info:
        flatten({"model": {"z": torch.zeros(2, dtype=torch.complex64)}})
    assert info.value.key == "model/z"
    assert "complex64" in str(info.value)


def test_tied_tensors_are_stored_once() -> None:
    shared = torch.randn(3)
    flat = flatten({"model": {"a": shared, "b": shared, "c": shared.clone()}})
    assert len(flat.tensors) == 2


def corrupt_header(data: bytes, edit) -> bytes:  # type: ignore[no-untyped-def]
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def _first_tensor(h: dict) -> dict:  # type: ignore[type-arg]
    return next(v for k, v in h.items() if k != "__metadata__")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda h: _first_tensor(h).update(data_offsets=[0, 10**12]), "needs"),
        (lambda h: _first_tensor(h).update(shape=[-1]), "malformed"),
        (lambda h: _first_tensor(h).update(dtype="Q99"), "malformed"),
        (lambda h: _first_tensor(h).update(data_offsets=[4, 64]), "needs"),
        (lambda h: h.update(extra={"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}), "gap or overlap"),
        (lambda h: h.update(__metadata__={"a": 1}), "__metadata__"),
    ],
)
def test_hostile_headers_are_rejected(edit, message: str) -> None:  # type: ignore[no-untyped-def]
    data, _ = write_to_bytes([("a", torch.zeros(4, 4)), ("b", torch.ones(3))])
    with pytest.raises(CheckpointCorruptError, match=message):
        read_bytes(corrupt_header(data, edit))


def test_header_length_is_bounded() -> None:
    data = struct.pack("<Q", 2**62) + b"{}"
    with pytest.raises(CheckpointCorruptError, match="impossible"):
        read_bytes(data)


def test_truncated_and_flipped_files_are_detected() -> None:
    data, digest = write_to_bytes(sample())
    with pytest.raises(CheckpointCorruptError):
        read_bytes(data[:-5], digest)
    flipped = bytearray(data)
    flipped[-3] ^= 0x01
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
        read_bytes(bytes(flipped), digest)


def test_duplicate_names_in_header_are_rejected() -> None:
    raw = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}'
    raw += b" " * (-len(raw) % 8)
    data = struct.pack("<Q", len(raw)) + raw + b"\x01\x02"
    with pytest.raises(CheckpointCorruptError, match="duplicate"):
        read_bytes(data)


# The header's duplicate keys are found from its text when it parses without the slower duplicate-naming hook:
# every way a duplicate can hide (inside an entry, at the top level, escaped names, space before a colon, a value
# that starts with a colon, out-of-order offsets) must still be refused, and every header without one must read as
# it always did.
_NAMES = st.text(alphabet='ab:\\"é ', min_size=1, max_size=4)


@st.composite
def _header_texts(draw: st.DrawFn) -> tuple[bytes, int, bool, list[tuple[str, int, int]]]:
    names = draw(st.lists(_NAMES, min_size=1, max_size=5))
    sizes = draw(st.lists(st.integers(0, 3), min_size=len(names), max_size=len(names)))
    order = draw(st.permutations(range(len(names))))
    spaced = draw(st.sets(st.integers(0, 5 * len(names) + 1), max_size=2))  # keys written with space before ":"
    keys = itertools.count()

    def colon() -> str:
        return (
            draw(st.sampled_from([" :", "\t:", "\n :"]))
            if next(keys) in spaced
            else draw(st.sampled_from([":", ":\n"]))
        )

    members, offsets, cursor = [], {}, 0
    for i in order:  # the data laid out in this order, the header listing them in the drawn one
        offsets[i] = (cursor, cursor + sizes[i])
        cursor += sizes[i]
    inner_dup = draw(st.booleans()) and draw(st.booleans())
    for i, name in enumerate(names):
        b, e = offsets[i]
        fields = [f'"dtype"{colon()}"U8"', f'"shape"{colon()}[{sizes[i]}]', f'"data_offsets"{colon()}[{b},{e}]']
        if inner_dup and i == 0:
            fields.append(f'"dtype"{colon()}"U8"')
        members.append(f"{json.dumps(name)}{colon()}{{{','.join(fields)}}}")
    meta_value = draw(st.sampled_from(['"pt"', '":pt"', '"a\\"b"']))
    members.append(f'"__metadata__"{colon()}{{"format"{colon()}{meta_value}}}')
    text = "{" + ",".join(members) + "}"
    duplicated = inner_dup or len(set(names)) != len(names)
    expected = sorted((names[i], *offsets[i]) for i in range(len(names)))
    return text.encode(), cursor, duplicated, expected


@settings(max_examples=300, deadline=None)
@given(_header_texts())
def test_header_duplicates_are_refused_however_written(
    header: tuple[bytes, int, bool, list[tuple[str, int, int]]],
) -> None:
    raw, data_bytes, duplicated, expected = header
    if duplicated:
        with pytest.raises(CheckpointCorruptError, match="duplicate key"):
            tensor_format.parse_header(raw, data_bytes=data_bytes, where="test")
        return
    entries, meta = tensor_format.parse_header(raw, data_bytes=data_bytes, where="test")
    assert [e.begin for e in entries] == sorted(e.begin for e in entries)  # in file order, as readers walk it
    assert sorted((e.name, e.begin, e.end) for e in entries) == expected
    assert set(meta) == {"format"}


# Headers are parsed with orjson, falling back to json where orjson refuses: whatever the text, the outcome must be
# json's (the same entries, or a CheckpointCorruptError), including where the two parsers differ (NaN, numbers past
# 64 bits, lone surrogates, exponents out of range).
_ODD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-0", "0.0", "4.0", str(2**64), str(2**70), "-1", "1E2"]
_ODD_STRINGS = ['"U8"', '"F32"', '"\\ud800"', '"\\u00e9"', '"a\\"b"', '""']


@st.composite
def _odd_headers(draw: st.DrawFn) -> tuple[bytes, int]:
    def value(depth: int = 0) -> str:
        kind = draw(st.sampled_from(["number", "string", "list"] if depth < 2 else ["number", "string"]))
        if kind == "number":
            return draw(st.sampled_from([*_ODD_NUMBERS, str(draw(st.integers(0, 9)))]))
        if kind == "string":
            return draw(st.sampled_from(_ODD_STRINGS))
        return "[" + ",".join(value(depth + 1) for _ in range(draw(st.integers(0, 3)))) + "]"

    members, cursor = [], 0
    for i in range(draw(st.integers(1, 3))):
        size = draw(st.integers(0, 3))
        fields = {"dtype": '"U8"', "shape": f"[{size}]", "data_offsets": f"[{cursor},{cursor + size}]"}
        cursor += size
        if draw(st.booleans()):  # one field made odd
            fields[draw(st.sampled_from(sorted(fields)))] = value()
        name = draw(st.sampled_from([f'"t{i}"', f'"\\ud800{i}"', f'"\\u00e9{i}"']))
        members.append(name + ":{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}")
    if draw(st.booleans()):
        members.append('"__metadata__":{"format":' + value() + "}")
    return ("{" + ",".join(members) + "}").encode(), cursor


class _JsonOnly:
    """orjson as if it refused everything: parse_header then reads with json alone (the reference)."""

    JSONDecodeError = orjson.JSONDecodeError

    @staticmethod
    def loads(raw: bytes) -> Any:
        raise orjson.JSONDecodeError("refused", "", 0)


def _outcome(raw: bytes, data_bytes: int) -> Any:
    try:
        entries, meta = tensor_format.parse_header(raw, data_bytes=data_bytes, where="test")
    except CheckpointCorruptError:
        return "corrupt"
    return [tuple(e) for e in entries], meta


@settings(max_examples=300, deadline=None)
@given(_odd_headers())
def test_headers_read_as_json_reads_them_whatever_the_numbers_and_strings(header: tuple[bytes, int]) -> None:
    raw, data_bytes = header
    fast = _outcome(raw, data_bytes)
    with mock.patch.object(tensor_format, "orjson", _JsonOnly):
        reference = _outcome(raw, data_bytes)
    assert repr(fast) == repr(reference)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 70_000), min_size=1, max_size=12),
    chunk=st.sampled_from([1, 4096, 65_536, 200_000, tensor_format.READ_CHUNK_BYTES, 64 << 20]),
    run_cap=st.sampled_from([1, 4096, 65_536, 200_000, tensor_format.RUN_BYTES, 64 << 20]),
    into=st.booleans(),
)
def test_runs_of_small_tensors_read_back_whatever_the_read_size(
    sizes: list[int], chunk: int, run_cap: int, into: bool
) -> None:
    g = torch.Generator().manual_seed(len(sizes))
    items = [(f"t{i}", torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g)) for i, n in enumerate(sizes)]
    data, digest = write_to_bytes(items)
    targets = {name: torch.empty_like(t) for name, t in items}
    out = tensor_format.read(
        io.BytesIO(data),
        len(data),
        where="test",
        expected_checksum=digest,
        chunk=chunk,
        run_cap=run_cap,
        into=(lambda run: [targets[e.name] for e in run]) if into else None,
    )
    for name, t in items:
        assert torch.equal(out[name], t), name
        if into:
            assert out[name] is targets[name]


@st.composite
def mixed_tensors(draw: Any) -> tuple[list[tuple[str, torch.Tensor]], dict[str, torch.dtype]]:
    """Tensors of a few dtypes and sizes around the patched small-tensor line: contiguous, strided, 0-d, empty,
    and some written cast (as bf16 moments are)."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    items, stored = [], {}
    for i in range(draw(st.integers(1, 24))):
        dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.uint8]))
        n = draw(st.integers(0, 900))
        t = (torch.randn(n, generator=g) * 100).to(dtype)
        kind = draw(st.sampled_from(["flat", "2d", "strided", "scalar"]))
        if kind == "2d" and n % 3 == 0:
            t = t.reshape(3, n // 3)
        elif kind == "strided" and n >= 2:
            t = t[::2]
        elif kind == "scalar":
            t = t[:1].reshape(()) if n else torch.tensor(7, dtype=dtype)
        if dtype == torch.float32 and draw(st.booleans()):
            stored[f"t{i}"] = torch.bfloat16
        items.append((f"t{i}", t))
    return items, stored


@settings(max_examples=80, deadline=None)
@given(case=mixed_tensors(), gather=st.sampled_from([8, 24, 64, 1000, 4096]))
def test_written_pieces_are_each_tensors_bytes_in_layout_order_however_gathered(
    case: tuple[list[tuple[str, torch.Tensor]], dict[str, torch.dtype]], gather: int
) -> None:
    """Runs of small tensors are gathered into a pooled buffer in pieces of its whole size (here patched small, so
    that tensors are cut across pieces); the bytes are each tensor's, as stored, in layout order, and the buffer
    goes back to the pool whether the pieces are read to the end or closed early."""
    from preemptible.store import direct

    items, stored = case
    entries = tensor_format.layout(items, stored)
    by_name = dict(items)
    expected = b"".join(
        bytes(tensor_format.byte_view(tensor_format.host(by_name[e.name].to(e.dtype)))) for e in entries
    )
    with (
        mock.patch.object(tensor_format, "GATHER_BYTES", gather),
        mock.patch.object(tensor_format, "SMALL_TENSOR_BYTES", 1200),
    ):
        held = direct.PooledBuffer._made - len(direct.PooledBuffer._idle)
        pieces = list(map(bytes, tensor_format._tensor_pieces(entries, by_name, 100)))
        assert b"".join(pieces) == expected
        assert all(len(p) <= max(gather, 100) for p in pieces)
        assert direct.PooledBuffer._made - len(direct.PooledBuffer._idle) == held
        stream = tensor_format._tensor_pieces(entries, by_name, 100)
        if next(stream, None) is not None:
            stream.close()  # stopped early
        assert direct.PooledBuffer._made - len(direct.PooledBuffer._idle) == held
    data, digest = write_to_bytes([(n, t.to(stored.get(n, t.dtype))) for n, t in items])
    out = read_bytes(data, digest)
    for name, t in items:
        assert torch.equal(out[name], t.to(stored.get(name, t.dtype))), name


def test_a_run_of_small_tensors_goes_out_in_whole_aligned_pieces_of_the_pooled_buffer() -> None:
    """10,000 small float tensors (0-d ones among them): every piece but the last is the pooled buffer whole, its
    memory page-aligned (a direct-I/O writer sends it from there), and the tensor at each cut is split exactly."""
    from preemptible.store import direct

    g = torch.Generator().manual_seed(3)
    items = [
        (f"t{i:05d}", torch.randn(700 + i % 9, generator=g) if i % 4 else torch.tensor(float(i))) for i in range(10_000)
    ]
    entries = tensor_format.layout(items)
    by_name = dict(items)
    seen = []
    for piece in tensor_format._tensor_pieces(entries, by_name, tensor_format.CHUNK_BYTES):
        assert direct.address(piece) is not None and direct.address(piece) % direct.ALIGN == 0
        seen.append(bytes(piece))
    total = entries[-1].end
    assert [len(p) for p in seen] == [tensor_format.GATHER_BYTES] * (total // tensor_format.GATHER_BYTES) + [
        total % tensor_format.GATHER_BYTES
    ]
    assert b"".join(seen) == b"".join(bytes(tensor_format.byte_view(t)) for _, t in items)


@pytest.mark.parametrize("kind", ["large", "strided small"])
def test_a_tensor_that_changed_size_after_the_layout_is_refused_by_name(kind: str) -> None:
    """A tensor whose bytes no longer match its entry (its shape changed after the save was planned) is an error
    naming it, never a file whose data disagrees with its header."""
    big = kind == "large"
    items = [("a", torch.zeros(100_000 if big else 10)), ("b", torch.zeros(7))]
    entries = tensor_format.layout(items)
    changed = torch.zeros(99_999) if big else torch.zeros(18)[::2]  # strided: one element short of the entry's 10
    with pytest.raises(ValueError, match="'a' holds"):
        list(tensor_format._tensor_pieces(entries, {"a": changed, "b": items[1][1]}, 1 << 20))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_one_element_sliced_with_a_step_is_saved_beside_a_strided_one(tmp_path: Any, dtype: torch.dtype) -> None:
    """``x[::2]`` of two elements is contiguous to torch but has a stride of 2, which no byte view can take. Beside a
    strided tensor of its dtype its run is gathered tensor by tensor, through a byte view of each: the save failed
    with torch's "must be 1 to view ... as Byte"."""
    from preemptible import Checkpointer

    g = torch.Generator().manual_seed(1)
    one = (torch.randn(2, generator=g) * 50).to(dtype)[::2]
    assert one.is_contiguous() and one.stride() == (2,)
    assert bytes(tensor_format.byte_view(one)) == bytes(tensor_format.byte_view(one.clone()))
    state = {"w": {"one": one, "strided": (torch.randn(8, generator=g) * 50).to(dtype)[::2]}}
    Checkpointer(str(tmp_path)).save(state, 1)
    fresh = {"w": {k: torch.zeros_like(v) for k, v in state["w"].items()}}
    assert Checkpointer(str(tmp_path)).restore(fresh) == 1
    assert all(torch.equal(fresh["w"][k], v) for k, v in state["w"].items())


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.text(max_size=12) | st.from_regex(r"[a-z0-9_./\-]{1,20}", fullmatch=True), max_size=12),
    shapes=st.lists(st.lists(st.integers(0, 2**40), max_size=3), min_size=12, max_size=12),
    metadata=st.none() | st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
)
def test_header_bytes_are_what_json_writes_whatever_the_names(
    names: list[str], shapes: list[list[int]], metadata: dict[str, str] | None
) -> None:
    """orjson writes printable-ASCII headers (the fast path); json the rest: the bytes are json's either way."""
    dtypes = list(tensor_format.DTYPES)
    entries, at = [], 0
    for i, name in enumerate(dict.fromkeys(names)):
        n = len(shapes[i]) + i
        entries.append(tensor_format.Entry(name, dtypes[i % len(dtypes)], tuple(shapes[i]), at, at + n))
        at += n
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    for e in entries:
        header[e.name] = {
            "dtype": tensor_format.DTYPES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [e.begin, e.end],
        }
    expected = json.dumps(header, separators=(",", ":")).encode()
    got = tensor_format.header_bytes(entries, metadata)
    (length,) = struct.unpack("<Q", got[:8])
    assert got[8 : 8 + len(expected)] == expected
    assert got[8 + len(expected) : 8 + length].strip(b" ") == b"" and (8 + length) % tensor_format.HEADER_ALIGN == 0


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), max_size=30), size=st.integers(1, 16), seed=st.randoms())
def test_chunk_spans_cut_each_tensor_into_pieces_of_at_most_the_size_in_file_order(
    sizes: list[int], size: int, seed: Any
) -> None:
    ends = list(itertools.accumulate(sizes))
    entries = [
        tensor_format.Entry(f"t{i}", torch.uint8, (n,), end - n, end)
        for i, (n, end) in enumerate(zip(sizes, ends, strict=True))
    ]
    seed.shuffle(entries)
    spans = tensor_format.chunk_spans(entries, size)
    expected = [(b, min(b + size, end)) for n, end in zip(sizes, ends, strict=True) for b in range(end - n, end, size)]
    assert spans == expected
    assert all(0 < e - b <= size for b, e in spans)


LAYOUT_DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int64, torch.bool]


@settings(max_examples=150, deadline=None)
@given(
    tensors=st.lists(
        st.tuples(st.sampled_from(LAYOUT_DTYPES), st.lists(st.integers(0, 4), max_size=3), st.booleans()),
        max_size=25,
    ),
    cast=st.sampled_from([None, torch.bfloat16, torch.float64]),
)
def test_layout_orders_by_item_size_keeping_ties_in_order_and_packs_back_to_back(
    tensors: list[tuple[torch.dtype, list[int], bool]], cast: torch.dtype | None
) -> None:
    """Each tensor in the dtype it is stored in (``stored`` when given), largest items first, ties as given, each
    right after the one before."""
    items = [(f"t{i}", torch.zeros(shape, dtype=dtype)) for i, (dtype, shape, _) in enumerate(tensors)]
    stored = {f"t{i}": cast for i, (_, _, cast_it) in enumerate(tensors) if cast_it and cast is not None}
    entries = tensor_format.layout(items, stored)
    typed = [(name, t, stored.get(name, t.dtype)) for name, t in items]
    ordered = sorted(typed, key=lambda x: -x[2].itemsize)
    at = 0
    assert len(entries) == len(ordered)
    for e, (name, t, dtype) in zip(entries, ordered, strict=True):
        n = t.numel() * dtype.itemsize
        assert e == tensor_format.Entry(name, dtype, tuple(t.shape), at, at + n)
        assert type(e.shape) is tuple
        at += n
