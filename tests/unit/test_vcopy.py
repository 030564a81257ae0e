"""`vcopy.scatter`: a run's bytes copied out to their tensors by one system call per 1,024 of them, or by memmove
where the kernel has no such call or refuses it; `vcopy.gather`: the same the other way round."""

from __future__ import annotations

import ctypes
import errno
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptible.store import format as tensor_format
from preemptible.store import vcopy

needs_syscall = pytest.mark.skipif(not vcopy.available(), reason="process_vm_readv is missing or refused here")


@contextmanager
def counted(cut: Callable[[int], int] = lambda n: n) -> Iterator[list[int]]:
    """The real system call, each call's count of destinations (a scatter) or sources (a gather) recorded; ``cut``:
    how many of them it is given."""
    real = vcopy._Call.readv
    assert real is not None
    calls: list[int] = []

    def spy(*args: int) -> int:
        pid, local, n, remote, m, flags = args
        if n >= m:  # a scatter: many destinations ("local")
            calls.append(n)
            return real(pid, local, cut(n), remote, m, flags)
        calls.append(m)  # a gather: many sources ("remote")
        return real(pid, local, n, remote, cut(m), flags)

    with mock.patch.object(vcopy._Call, "readv", spy):
        yield calls


def scattered(sizes: list[int], seed: int) -> tuple[numpy.ndarray, list[numpy.ndarray]]:
    src = numpy.random.default_rng(seed).integers(0, 256, sum(sizes), dtype=numpy.uint8)
    dsts = [numpy.full(n, 0xEE, dtype=numpy.uint8) for n in sizes]
    vcopy.scatter(src.ctypes.data, [d.ctypes.data for d in dsts], sizes)
    return src, dsts


def gathered(sizes: list[int], seed: int) -> tuple[numpy.ndarray, list[numpy.ndarray]]:
    rng = numpy.random.default_rng(seed)
    srcs = [rng.integers(0, 256, n, dtype=numpy.uint8) for n in sizes]
    dst = numpy.full(sum(sizes) + 8, 0xEE, dtype=numpy.uint8)  # 8 bytes past the end: never written
    vcopy.gather(dst.ctypes.data, [a.ctypes.data for a in srcs], sizes)
    assert (dst[sum(sizes) :] == 0xEE).all()
    return dst[: sum(sizes)], srcs


def assert_copied(src: numpy.ndarray, dsts: list[numpy.ndarray]) -> None:
    at = 0
    for i, d in enumerate(dsts):
        assert numpy.array_equal(d, src[at : at + len(d)]), f"destination {i} of {len(dsts)}"
        at += len(d)
    assert at == len(src)


@needs_syscall
@pytest.mark.parametrize("copy", [scattered, gathered], ids=["scatter", "gather"])
@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), max_size=40) | st.integers(1000, 2300).map(lambda n: [1 + n % 7] * n),
    seed=st.integers(0, 2**31),
)
def test_every_piece_gets_its_own_bytes_by_system_call(
    copy: Callable[[list[int], int], tuple[numpy.ndarray, list[numpy.ndarray]]], sizes: list[int], seed: int
) -> None:
    """A scatter's destinations, or a gather's sources, each matched with its bytes of the one buffer."""
    with counted() as calls:
        whole, pieces = copy(sizes, seed)
    assert_copied(whole, pieces)
    # one call per IOV_MAX pieces; a group of fewer than MIN_COPIES (the last) is made by memmove
    groups = [min(vcopy.IOV_MAX, len(sizes) - a) for a in range(0, len(sizes), vcopy.IOV_MAX)]
    assert calls == [n for n in groups if n >= vcopy.MIN_COPIES]


@pytest.mark.parametrize("copy", [scattered, gathered], ids=["scatter", "gather"])
@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), max_size=40), seed=st.integers(0, 2**31))
def test_every_piece_gets_its_own_bytes_by_memmove_where_the_call_is_missing(
    copy: Callable[[list[int], int], tuple[numpy.ndarray, list[numpy.ndarray]]], sizes: list[int], seed: int
) -> None:
    with mock.patch.object(vcopy._Call, "readv", None):
        whole, pieces = copy(sizes, seed)
        assert not vcopy.available()
    assert_copied(whole, pieces)


def failing(err: int, result: int = -1) -> Callable[..., int]:
    """A kernel that answers every call with ``result`` and ``err``: refusals cannot be had here for real (no
    seccomp filter can be put on this process from a test and taken off again)."""

    def call(*args: Any) -> int:
        ctypes.set_errno(err)
        return result

    return call


@pytest.mark.parametrize("err", [errno.EPERM, errno.ENOSYS, errno.EACCES])
def test_a_refused_call_falls_back_to_memmove_for_good(err: int) -> None:
    with mock.patch.object(vcopy._Call, "readv", failing(err)):
        src, dsts = scattered([100] * 50, seed=1)
        assert not vcopy.available()  # not asked again
    assert_copied(src, dsts)


@pytest.mark.parametrize(("err", "result"), [(errno.ENOMEM, -1), (0, 10)])  # 10: inside the first destination
def test_a_passing_failure_or_a_short_copy_is_made_again_by_memmove(err: int, result: int) -> None:
    fake = failing(err, result)
    with mock.patch.object(vcopy._Call, "readv", fake):
        src, dsts = scattered([100] * 50, seed=2)
        assert vcopy._Call.readv is fake  # tried again next time
    assert_copied(src, dsts)


@needs_syscall
def test_a_copy_the_kernel_cut_short_goes_on_from_where_it_stopped() -> None:
    with counted(cut=lambda n: max(1, n // 3)) as calls:  # the first third of the destinations, for real
        src, dsts = scattered([1 + i % 50 for i in range(100)], seed=3)
    assert_copied(src, dsts)
    assert calls[:3] == [100, 67, 45]  # each call picks up after the last whole destination


@needs_syscall
def test_a_gather_the_kernel_cut_short_goes_on_from_where_it_stopped() -> None:
    with counted(cut=lambda n: max(1, n // 3)) as calls:
        dst, srcs = gathered([1 + i % 50 for i in range(100)], seed=4)
    assert_copied(dst, srcs)
    assert calls[:3] == [100, 67, 45]


@needs_syscall
def test_a_source_the_process_cannot_read_is_an_error_not_a_crash() -> None:
    arrays = [numpy.full(16, i, dtype=numpy.uint8) for i in range(vcopy.MIN_COPIES)]
    srcs = [a.ctypes.data for a in arrays]
    srcs[3] = 16  # never mapped: the kernel copies the first three, then answers EFAULT
    dst = numpy.zeros(16 * vcopy.MIN_COPIES, dtype=numpy.uint8)
    with pytest.raises(OSError, match="cannot read, at source 3") as info:
        vcopy.gather(dst.ctypes.data, srcs, [16] * vcopy.MIN_COPIES)
    assert info.value.errno == errno.EFAULT
    assert (dst[32:48] == 2).all()
    assert vcopy.available()


@needs_syscall
def test_a_destination_the_process_cannot_write_is_an_error_not_a_crash() -> None:
    src = numpy.arange(16 * vcopy.MIN_COPIES, dtype=numpy.uint8)
    arrays = [numpy.zeros(16, dtype=numpy.uint8) for _ in range(vcopy.MIN_COPIES)]
    dsts = [a.ctypes.data for a in arrays]
    dsts[3] = 16  # the first page is never mapped: the kernel copies the first three, then answers EFAULT
    with pytest.raises(OSError, match="cannot write, at destination 3") as info:
        vcopy.scatter(src.ctypes.data, dsts, [16] * vcopy.MIN_COPIES)
    assert info.value.errno == errno.EFAULT
    assert numpy.array_equal(arrays[2], src[32:48])
    assert vcopy.available()


@needs_syscall
@pytest.mark.parametrize("into", [True, False])
def test_a_file_of_thousands_of_small_tensors_reads_back_through_the_system_call(into: bool) -> None:
    g = torch.Generator().manual_seed(3)
    items = [(f"t{i}", torch.randn(1 + i % 40, generator=g)) for i in range(3000)]  # runs cross IOV_MAX
    buf = io.BytesIO()
    _, digest, _ = tensor_format.write(buf, items, {"format": "pt"})
    data = buf.getvalue()
    targets = {name: torch.empty_like(t) for name, t in items}
    with counted() as calls:
        out = tensor_format.read(
            io.BytesIO(data),
            len(data),
            where="test",
            expected_checksum=digest,
            into=(lambda run: [targets[e.name] for e in run]) if into else None,
        )
    assert sum(calls) >= len(items) - vcopy.MIN_COPIES * len(calls)  # nearly all by the call; some small runs not
    for name, t in items:
        assert torch.equal(out[name], t), name
        assert (out[name] is targets[name]) == into


@needs_syscall
def test_a_file_of_thousands_of_small_tensors_is_written_through_the_system_call() -> None:
    """A write gathers its runs of small tensors by `vcopy.gather`: the same bytes as by memmove."""
    g = torch.Generator().manual_seed(5)
    items = [(f"t{i}", torch.randn(1 + i % 40, generator=g)) for i in range(3000)]  # a run crosses IOV_MAX
    by_call, by_memmove = io.BytesIO(), io.BytesIO()
    with counted() as calls:
        _, digest, _ = tensor_format.write(by_call, items, {"format": "pt"})
    with mock.patch.object(vcopy._Call, "readv", None):
        _, digest2, _ = tensor_format.write(by_memmove, items, {"format": "pt"})
    assert by_call.getvalue() == by_memmove.getvalue() and digest == digest2
    assert sum(calls) >= len(items) - vcopy.MIN_COPIES * len(calls)  # nearly all by the call
