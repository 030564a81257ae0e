"""`parallel_map`, which every save's and restore's files go through: order, failures, and thread start."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from preemptible.writer import parallel_map


def test_results_come_in_order_and_the_first_failure_is_raised_with_its_type() -> None:
    assert parallel_map(lambda x: x * x, list(range(50)), threads=3, name="t") == [x * x for x in range(50)]

    def fail(x: int) -> int:
        if x == 7:
            raise KeyError("seven")
        return x

    with pytest.raises(KeyError, match="seven"):
        parallel_map(fail, list(range(20)), threads=2, name="t")


def test_every_thread_is_started_before_any_works() -> None:
    seen: list[set[str]] = []

    def first(x: int) -> int:
        if not seen:  # pure Python, GIL held: the threads alive when the first item starts
            seen.append({t.name for t in threading.enumerate() if t.name.startswith("pm-")})
        return x

    for _ in range(20):
        seen.clear()
        parallel_map(first, list(range(4)), threads=3, name="pm")
        assert seen == [{"pm-0", "pm-1", "pm-2"}]


def test_a_thread_that_cannot_start_fails_the_map_and_leaves_no_work_running(monkeypatch: Any) -> None:
    # Running out of threads cannot be caused for real in a test: the second start fails.
    real_start = threading.Thread.start
    starts: list[str] = []
    done: list[int] = []

    def start(self: threading.Thread) -> None:
        starts.append(self.name)
        if len(starts) == 2:
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="can't start new thread"):
        parallel_map(done.append, list(range(10)), threads=3, name="pm")
    assert done == []  # the thread that started stopped before its first item
    assert threading.active_count() == before  # and was joined
