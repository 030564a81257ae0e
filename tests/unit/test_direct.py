"""`direct.read_pieces`, which reads back a file just written to verify it: the same bytes whatever the size, with
O_DIRECT where the file system takes it, ordinary reads otherwise."""

from __future__ import annotations

import fcntl
import io
import mmap
import os
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemptible.store import direct
from preemptible.store.io import LocalStorage


def _takes_o_direct(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | direct.O_DIRECT))
    except OSError:
        return False
    return bool(direct.O_DIRECT)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, direct.BOUNCE_BYTES - 1, 2 * direct.BOUNCE_BYTES + 5000])
def test_a_file_reads_back_exactly_whatever_its_size(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    storage = LocalStorage(str(tmp_path))
    stream = storage.open_read(str(path))
    flags: list[int] = []
    try:
        parts = []
        for piece in direct.read_pieces(stream, memoryview(bytearray(1000))):
            flags.append(fcntl.fcntl(stream.fileno(), fcntl.F_GETFL))  # type: ignore[attr-defined]
            parts.append(bytes(piece))
    finally:
        stream.close()
    assert b"".join(parts) == data
    if size and _takes_o_direct(path):  # from the disk, in the aligned buffer's pieces
        assert all(f & direct.O_DIRECT for f in flags)
        assert [len(p) for p in parts[:-1]] == [direct.BOUNCE_BYTES] * (len(parts) - 1)


def test_other_streams_and_direct_io_off_take_ordinary_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(10_000)
    pieces = [bytes(p) for p in direct.read_pieces(io.BytesIO(data), memoryview(bytearray(4096)))]
    assert b"".join(pieces) == data and [len(p) for p in pieces] == [4096, 4096, 1808]
    monkeypatch.setenv(direct.ENV, "0")
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    with open(path, "rb", buffering=0) as f:
        got = b"".join(bytes(p) for p in direct.read_pieces(f, memoryview(bytearray(3000))))
        assert not fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & direct.O_DIRECT
    assert got == data


def _pool() -> tuple[int, int]:
    """(buffers made, buffers idle) in this process."""
    return direct.PooledBuffer._made, len(direct.PooledBuffer._idle)


def test_a_periodic_save_readies_the_buffers_an_emergency_save_needs_and_every_save_gives_them_back(
    tmp_path: Path,
) -> None:
    import torch

    from preemptible import Checkpointer

    threads = _pool()[0] + 2  # more than this process has made so far: the emergency save needs new ones
    state = {"w": {f"t{i}": torch.randn(50_000) for i in range(4 * threads)}}  # 200 KB each, not page-aligned
    ck = Checkpointer(str(tmp_path / "ck"), threads=threads, max_file_bytes=400_000)
    ck.save(state, 1, blocking=False).wait()  # a periodic save, on its one writer thread
    made, idle = _pool()
    assert made >= threads and idle == made  # made ready, and none held after the save
    assert all(b.touched for b in direct.PooledBuffer._idle)  # every page faulted in, after the commit
    ck.save(state, 2).wait()  # the emergency save: `threads` writers at once, every byte through a buffer
    assert _pool() == (made, made)  # nothing new to make (and fault in) in the notice window; all given back
    fresh = {"w": {k: torch.zeros_like(v) for k, v in state["w"].items()}}
    assert ck.restore(fresh) == 2
    assert all(torch.equal(fresh["w"][k], v) for k, v in state["w"].items())  # the bytes went through intact


def test_a_reader_that_stops_early_and_a_writer_that_aborts_give_their_buffer_back(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(3 * direct.BOUNCE_BYTES))
    direct.PooledBuffer.reserve(1)
    made, idle = _pool()
    with LocalStorage(str(tmp_path)).open_read(str(path)) as stream:
        pieces = direct.read_pieces(stream, memoryview(bytearray(4096)))
        next(pieces)
        assert _pool() == (made, idle - 1)  # held while it is read
        pieces.close()  # the caller stops after the first piece (a checksum failed, say)
    assert _pool() == (made, idle)
    fd = direct.open_direct(str(tmp_path / "g.bin"))
    if fd is not None:
        writer = direct.DirectWriter(str(tmp_path / "g.bin"), fd)
        writer.write(memoryview(b"x" * 5000))
        writer.abort()
        assert _pool() == (made, idle)


# DirectWriter: pieces whose memory is block-aligned go to the disk from where they lie; the rest goes through its
# bounce buffer. Whatever the mix, the file holds exactly the bytes given, in order.
def _writer(path: Path) -> direct.DirectWriter:
    """A writer on an O_DIRECT descriptor where the file system takes one (an ordinary one otherwise: the same
    calls, without the alignment rule)."""
    fd = direct.open_direct(str(path))
    if fd is None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    return direct.DirectWriter(str(path), fd)


def _aligned_source(nbytes: int) -> memoryview:
    """``nbytes`` of random bytes in page-aligned, writable memory (as an arena or a pooled buffer is)."""
    source = memoryview(mmap.mmap(-1, nbytes))
    source[:] = os.urandom(nbytes)
    return source


class _Spy:
    """What each `DirectWriter._write_all` call sent, by where it lay: in the writer's bounce buffer or not."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[tuple[str, int]]] = []
        real = direct.DirectWriter._write_all

        def spy(writer: direct.DirectWriter, *views: memoryview) -> None:
            self.calls.append(
                [("bounce" if direct.address(v) == writer._buf_addr else "direct", len(v)) for v in views if v]
            )
            real(writer, *views)

        monkeypatch.setattr(direct.DirectWriter, "_write_all", spy)

    def sent(self, where: str) -> int:
        return sum(n for call in self.calls for w, n in call if w == where)


def test_an_aligned_piece_after_a_header_goes_out_from_where_it_lies_with_the_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(monkeypatch)
    header = os.urandom(3 * direct.ALIGN)  # bytes: not writable memory, so it is copied into the bounce buffer
    data = _aligned_source(2 * direct.BOUNCE_BYTES + 3 * direct.ALIGN + 100)
    writer = _writer(tmp_path / "f.safetensors")
    writer.write(memoryview(header))
    writer.write(data)
    writer.close()
    assert (tmp_path / "f.safetensors").read_bytes() == header + bytes(data)
    # The header and the piece's whole blocks in one call, none of the piece copied; its last 100 bytes padded.
    assert spy.calls[0] == [("bounce", len(header)), ("direct", len(data) - 100)]
    assert spy.calls[1:] == [[("bounce", direct.ALIGN)]]
    assert spy.sent("bounce") == len(header) + direct.ALIGN


_WRITES = st.lists(
    st.tuples(
        st.integers(0, 3 * direct.ALIGN + 7),  # bytes
        st.sampled_from(["aligned", "unaligned", "read-only"]),
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=_WRITES, cap=st.sampled_from([None, 1, 2, 3]))
def test_a_file_holds_exactly_what_was_written_whatever_the_pieces(
    tmp_path: Path, writes: list[tuple[int, str]], cap: int | None
) -> None:
    """Any mix of aligned, unaligned and read-only pieces, and a kernel that writes at most ``cap`` blocks per
    call (short writes are legal, if rare: the writer goes on where the last call stopped)."""
    real_writev = os.writev

    def short(views: list[memoryview]) -> list[memoryview]:
        if cap is None:
            return views
        out, left = [], cap * direct.ALIGN
        for v in views:
            if left <= 0:
                break
            out.append(v[:left])
            left -= len(out[-1])
        return out

    source = _aligned_source(4 * direct.ALIGN + 8)
    path = tmp_path / "f.bin"
    expected = b""
    with (
        mock.patch.object(direct.os, "write", lambda fd, v: real_writev(fd, short([memoryview(v)]))),
        mock.patch.object(direct.os, "writev", lambda fd, vs: real_writev(fd, short(list(vs)))),
    ):
        writer = _writer(path)
        for nbytes, kind in writes:
            piece = source[:nbytes] if kind == "aligned" else source[7 : 7 + nbytes]
            if kind == "read-only":
                piece = memoryview(bytes(piece))
            writer.write(piece)
            expected += bytes(piece)
        writer.close()
    assert path.read_bytes() == expected
