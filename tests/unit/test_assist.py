"""`store.assist`: a file's last pieces read by other threads while its own thread reads and hashes from its start.

The helper's share is made deterministic here: the helper reads its pieces when the file offers them, before the
file's own thread reads a byte of data, so each case says exactly which pieces a helper read.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptible.errors import CheckpointCorruptError
from preemptible.store import assist
from preemptible.store import format as tensor_format
from preemptible.store.threads import parallel_map

SMALL = tensor_format.SMALL_TENSOR_BYTES


def write_file(path: Any, items: list[tuple[str, torch.Tensor]]) -> tuple[str, int, str]:
    with open(path, "wb") as f:
        _, digest, _ = tensor_format.write(f, items, {"format": "pt"})
    return str(path), os.path.getsize(path), digest


class Helped:
    """What a read's helper did: pieces read, bytes read."""

    def __init__(self) -> None:
        self.pieces = 0
        self.bytes = 0
        self.offered: list[assist.Piece] = []


def read_helped(
    path: str,
    size: int,
    digest: str,
    *,
    helped: int,
    into: dict[str, torch.Tensor] | None = None,
    chunk: int = tensor_format.READ_CHUNK_BYTES,
    run_cap: int = tensor_format.RUN_BYTES,
    held_bytes: int = assist.HELD_BYTES,
) -> tuple[dict[str, torch.Tensor], Helped]:
    """`tensor_format.read` of a real file, with up to ``helped`` of its last pieces read by a helper first."""
    done = Helped()

    def counted(n: int) -> None:
        done.bytes += n

    with open(path, "rb", buffering=0) as f:

        def offer(pieces: list[assist.Piece], spread: Any) -> assist.Assisted:
            a = assist.Assisted(
                lambda view, at: os.preadv(f.fileno(), [view], at), pieces, spread, counted, held_bytes=held_bytes
            )
            done.offered = list(pieces)
            for _ in range(helped):
                if not a.help():
                    break
                done.pieces += 1
            return a

        def target(run: Any) -> list[torch.Tensor | None]:
            return [into.get(e.name) if into is not None else None for e in run]

        out = tensor_format.read(
            f, size, where=path, expected_checksum=digest, into=target, chunk=chunk, run_cap=run_cap, assist=offer
        )
    return out, done


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    same = a.dtype == b.dtype and a.shape == b.shape
    return same and torch.equal(a.contiguous().view(torch.uint8), b.view(torch.uint8))


@st.composite
def mixed_files(draw: Any) -> list[tuple[str, torch.Tensor]]:
    """Large (a piece each ``chunk``) and small tensors (runs) in any order, some empty; seeded bytes."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    kinds = draw(st.lists(st.sampled_from(["small", "large", "empty", "odd"]), min_size=1, max_size=12))
    items = []
    for i, kind in enumerate(kinds):
        if kind == "small":
            n = draw(st.integers(1, SMALL // 4 - 1))
            t = torch.randn(n, generator=g)
        elif kind == "large":
            t = torch.randn(draw(st.integers(SMALL // 4, 3 * SMALL // 4)), generator=g)
        elif kind == "odd":  # bytes that are no float's: every bit pattern must come back
            t = torch.randint(0, 256, (draw(st.integers(1, 3 * SMALL)),), dtype=torch.uint8, generator=g)
        else:
            t = torch.empty(0, 3)
        items.append((f"t{i}", t))
    return items


@settings(max_examples=40, deadline=None)
@given(
    items=mixed_files(),
    helped=st.integers(0, 60),
    chunk=st.sampled_from([4096, 64 << 10, tensor_format.READ_CHUNK_BYTES]),
    run_cap=st.sampled_from([4096, 100_000, tensor_format.RUN_BYTES]),
    live=st.booleans(),
)
def test_any_share_read_by_a_helper_reads_back_every_byte_and_the_files_checksum(
    tmp_path_factory: Any, *, items: list[tuple[str, torch.Tensor]], helped: int, chunk: int, run_cap: int, live: bool
) -> None:
    path, size, digest = write_file(tmp_path_factory.mktemp("a") / "f.safetensors", items)
    into = {n: torch.full_like(t, 7) for n, t in items} if live else None
    out, done = read_helped(path, size, digest, helped=helped, into=into, chunk=chunk, run_cap=run_cap)
    for name, t in items:
        assert same_bytes(out[name], t), name
        if into is not None and t.numel():
            assert out[name] is into[name], name  # read into the live tensor, by whichever thread
    # the helper took the last pieces, as many as asked (or all), and counted exactly their bytes
    assert done.pieces == min(helped, len(done.offered))
    tail = done.offered[len(done.offered) - done.pieces :]
    assert done.bytes == sum(len(p.view) if p.view is not None else p.nbytes for p in tail)


def test_a_flipped_byte_in_a_helpers_piece_fails_the_files_checksum(tmp_path: Any) -> None:
    items = [("a", torch.randn(SMALL)), ("b", torch.randn(1000)), ("c", torch.randn(SMALL))]
    path, size, digest = write_file(tmp_path / "f.safetensors", items)
    with open(path, "r+b") as f:  # the last byte: the last piece, a helper's
        f.seek(size - 1)
        last = f.read(1)
        f.seek(size - 1)
        f.write(bytes([last[0] ^ 0x10]))
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
        read_helped(path, size, digest, helped=1)
    out, done = read_helped(path, size, None, helped=1)  # type: ignore[arg-type]
    assert done.pieces == 1 and not same_bytes(out["c"], items[2][1])  # the helper did read the flipped byte


@pytest.mark.parametrize("helped", [1, 3, 1000])
def test_a_file_shorter_than_its_header_says_is_truncated_whoever_reads_its_end(tmp_path: Any, helped: int) -> None:
    items = [("a", torch.randn(SMALL)), ("runs", torch.randn(500)), ("b", torch.randn(SMALL))]
    path, size, digest = write_file(tmp_path / "f.safetensors", items)
    os.truncate(path, size - 100)
    with pytest.raises(CheckpointCorruptError, match="file ends early: expected 100 more bytes") as e:
        read_helped(path, size, digest, helped=helped)
    assert e.value.path == path


def test_runs_beyond_what_helpers_may_hold_are_left_to_the_files_thread(tmp_path: Any) -> None:
    items = [(f"s{i}", torch.randn(3000)) for i in range(40)]  # 480 KB of small tensors: runs of up to 64 KiB
    path, size, digest = write_file(tmp_path / "f.safetensors", items)
    out, done = read_helped(path, size, digest, helped=100, run_cap=64 << 10, held_bytes=150_000)
    runs = [p.nbytes for p in done.offered]
    assert all(p.view is None for p in done.offered) and len(runs) > 4
    # as many of the last runs as fit in 150,000 bytes, and then none: the file's thread reads the rest
    fit = 0
    while fit < len(runs) and sum(runs[len(runs) - fit - 1 :]) <= 150_000:
        fit += 1
    assert 0 < done.pieces == fit < len(runs)
    for name, t in items:
        assert same_bytes(out[name], t), name


def test_closing_waits_for_a_helper_still_reading_and_lets_none_start(tmp_path: Any) -> None:
    data = torch.arange(4 * 4096, dtype=torch.uint8)
    path = tmp_path / "raw"
    path.write_bytes(data.numpy().tobytes())
    inside, release = threading.Event(), threading.Event()
    fd = os.open(path, os.O_RDONLY)

    def slow_pread(view: memoryview, at: int) -> int:
        inside.set()
        release.wait()
        return os.preadv(fd, [view], at)

    dest = torch.zeros_like(data)
    view = memoryview(dest.numpy())
    pieces = [assist.Piece(i * 4096, view[i * 4096 : (i + 1) * 4096]) for i in range(4)]
    a = assist.Assisted(slow_pread, pieces, lambda k, b: None, lambda n: None)
    helper = threading.Thread(target=a.help, daemon=True)
    closer = threading.Thread(target=a.close, daemon=True)
    try:
        helper.start()
        assert inside.wait(10)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive()  # a helper is writing into the tensor: close must not return yet
    finally:
        release.set()
    closer.join(10)
    helper.join(10)
    assert not closer.is_alive()
    assert not a.help()  # closed: no helper starts another piece
    assert torch.equal(dest[3 * 4096 :], data[3 * 4096 :]) and not dest[: 3 * 4096].any()
    os.close(fd)


def test_a_helper_waits_for_a_file_still_finding_its_pieces_and_leaves_once_every_file_ended(tmp_path: Any) -> None:
    helpers = assist.Helpers(2)
    dest = torch.zeros(8192, dtype=torch.uint8)
    view = memoryview(dest.numpy())
    src = bytes(range(256)) * 32

    def pread(v: memoryview, at: int) -> int:
        v[:] = src[at : at + len(v)]
        return len(v)

    results: list[bool] = []
    t = threading.Thread(target=lambda: results.append(helpers.help()), daemon=True)
    t.start()
    t.join(0.2)
    assert t.is_alive() and not results  # no file has offered yet, and both may: it waits
    a = assist.Assisted(pread, [assist.Piece(0, view[:4096]), assist.Piece(4096, view[4096:])], None, lambda n: None)  # type: ignore[arg-type]
    helpers.offer(a)
    t.join(10)
    assert results == [True] and bytes(view[4096:]) == src[4096:]  # it read the last piece
    assert a.own(0) and not a.own(1)
    a.wait(1)
    helpers.ended(a)
    t2 = threading.Thread(target=lambda: results.append(helpers.help()), daemon=True)
    t2.start()
    t2.join(0.2)
    assert t2.is_alive()  # one file has neither offered nor ended
    helpers.ended(None)
    t2.join(10)
    assert results == [True, False]


def test_a_map_with_idle_work_runs_every_thread_even_for_one_item_and_raises_idle_errors() -> None:
    calls: list[str] = []

    def idle() -> bool:
        calls.append(threading.current_thread().name)
        return False

    assert parallel_map(lambda x: x + 1, [1], threads=2, name="id", idle=idle) == [2]
    assert sorted(calls) == ["id-0", "id-1"]  # each thread, once no item was left to start

    def broken() -> bool:
        raise KeyError("idle")

    with pytest.raises(KeyError, match="idle"):
        parallel_map(lambda x: x, [1, 2, 3], threads=2, name="id", idle=broken)
