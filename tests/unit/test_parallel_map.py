"""`parallel_map`, which every save's and restore's files go through: order, failures, and thread start."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from preemptible.store.threads import parallel_map


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


def test_the_callers_check_runs_while_the_threads_work_and_a_failed_one_stops_them() -> None:
    """``meanwhile`` runs in the calling thread once the workers go; False stops them before their next item and
    raises PlanChanged after every one has finished what it had started."""
    from preemptible.store.threads import PlanChanged

    started = threading.Event()
    release = threading.Event()
    done: list[int] = []

    def work(x: int) -> int:
        started.set()
        release.wait(30)  # the first items wait for the check: it runs while they work
        done.append(x)
        return x

    def check(verdict: bool) -> bool:
        assert started.wait(30)  # a worker is inside an item already
        release.set()
        return verdict

    assert parallel_map(work, list(range(6)), threads=2, name="t", meanwhile=lambda: check(True)) == list(range(6))
    started.clear()
    release.clear()
    done.clear()
    with pytest.raises(PlanChanged):
        parallel_map(work, list(range(50)), threads=2, name="t", meanwhile=lambda: check(False))
    assert 1 <= len(done) < 50  # stopped at their next item, each one started finished
    assert not [t for t in threading.enumerate() if t.name.startswith("t-")]
    with pytest.raises(PlanChanged):  # one thread: the check comes first, and nothing is done
        parallel_map(done.append, [1], threads=1, name="t", meanwhile=lambda: False)
