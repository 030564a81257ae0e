"""`LocalStorage.read_bytes`: a small file whole, up to a limit, never more."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from preemptible.errors import FileTooLargeError
from preemptible.store.io import LocalStorage


@pytest.mark.parametrize("size", [0, 1, 4096, 160_903])
def test_a_file_is_read_whole_up_to_its_limit_and_refused_past_it(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "COMMIT.json"
    path.write_bytes(data)
    storage = LocalStorage(str(tmp_path))
    assert storage.read_bytes(str(path), size) == data
    assert storage.read_bytes(str(path), 64 << 20) == data
    if size:
        with pytest.raises(FileTooLargeError, match=f"is {size} bytes, larger than the {size - 1} expected"):
            storage.read_bytes(str(path), size - 1)


def test_a_file_whose_size_says_nothing_is_read_to_its_end_within_the_limit() -> None:
    storage = LocalStorage("/proc")  # procfs: st_size 0, content there
    data = storage.read_bytes("/proc/self/status", 1 << 20)
    assert data.startswith(b"Name:") and data.endswith(b"\n") and len(data) > 100
    with pytest.raises(FileTooLargeError):
        storage.read_bytes("/proc/self/status", 10)
