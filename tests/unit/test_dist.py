"""dist: rank helpers without a launcher, one coordinator per process, rounds in lockstep, the barrier, the
shared-root check: against a real TCPStore on loopback (ranks as threads)."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as c10d

from preemptible import dist
from preemptible.errors import CoordinationError
from preemptible.store.io import LocalStorage


def test_one_process_is_rank_0_of_1_and_has_no_coordinator() -> None:
    assert (dist.rank(), dist.world_size()) == (0, 1)
    assert dist.coordinator() is None


@pytest.fixture
def server() -> Any:
    return c10d.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def coordinators(server: Any, world: int, timeout_s: float = 5.0) -> list[dist.Coordinator]:
    return [
        dist.Coordinator(rank_=r, world=world, address=("127.0.0.1", server.port), timeout_s=timeout_s)
        for r in range(world)
    ]


def on_every_rank(coords: list[dist.Coordinator], fn: Any) -> list[Any]:
    out: list[Any] = [None] * len(coords)
    errors: list[BaseException] = []

    def body(r: int) -> None:
        try:
            out[r] = fn(coords[r])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(len(coords))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return out


def test_the_coordinator_is_one_per_process_and_per_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    first = dist.coordinator()
    assert first is not None and first is dist.coordinator()
    assert (first.rank, first.world) == (1, 2)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a torchrun restart is another launch
    assert dist.coordinator() is not first


def test_rounds_count_per_kind_in_lockstep(server: Any) -> None:
    (c,) = coordinators(server, 1)
    assert [c.round("save"), c.round("save"), c.round("restore"), c.round("save")] == [
        "save/1",
        "save/2",
        "restore/1",
        "save/3",
    ]


def test_exchange_returns_every_rank_s_value_in_rank_order(server: Any) -> None:
    coords = coordinators(server, 3)
    got = on_every_rank(coords, lambda c: c.exchange(c.client(), c.round("x"), f"v{c.rank}"))
    assert got == [["v0", "v1", "v2"]] * 3


def test_a_missing_rank_is_a_coordination_error_naming_it(server: Any) -> None:
    coords = coordinators(server, 3, timeout_s=0.5)
    with pytest.raises(CoordinationError, match=r"ranks \['2'\]"):
        on_every_rank(coords[:2], lambda c: c.exchange(c.client(), "lonely", "x"))


def test_shared_root_check_passes_on_one_root_and_names_blind_ranks(server: Any, tmp_path: Path) -> None:
    coords = coordinators(server, 2)
    on_every_rank(coords, lambda c: dist.check_shared_root(LocalStorage(str(tmp_path / "shared")), c))
    server2 = c10d.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    coords = coordinators(server2, 2)
    roots = {0: tmp_path / "node0", 1: tmp_path / "node1"}  # a node-local path: each rank sees its own
    with pytest.raises(CoordinationError, match=r"rank\(s\) \[1\] cannot see"):
        on_every_rank(coords, lambda c: dist.check_shared_root(LocalStorage(str(roots[c.rank])), c))


def test_read_answers_an_existing_key_and_names_a_missing_one(server: Any) -> None:
    (c,) = coordinators(server, 1)
    store = c.client()
    store.set("here", "value")
    assert dist.read(store, "here") == "value"
    with pytest.raises(CoordinationError, match=r"expected key 'gone'.*found none"):
        dist.read(store, "gone")
    assert not store.check(["gone"])  # reading creates nothing


def test_the_announcing_thread_blocks_without_polling_and_close_wakes_it(server: Any) -> None:
    """No notice: the announcer sits in one wait on the board's flag (no timed wake-ups); close() ends it."""
    from preemptible.notice import Flag

    waits: list[float | None] = []

    class CountingFlag(Flag):
        def wait(self, timeout: float | None = None, *, unless: Any = None) -> bool:
            waits.append(timeout)
            return super().wait(timeout, unless=unless)

    (c,) = coordinators(server, 1)
    flag = CountingFlag()
    agreement = dist.StoreAgreement(c, record=lambda n: None, local_notice=lambda: None, local_event=flag)
    try:
        assert agreement._announcer.is_alive()
    finally:
        agreement.close()
    assert not agreement._announcer.is_alive() and not agreement._thread.is_alive()
    assert waits and len(waits) <= 2 and all(t == dist.WATCH_S for t in waits), waits


def test_flag_wake_ends_a_wait_whose_unless_now_holds_with_no_lost_wakeup() -> None:
    """close() sets its flag, then wakes: whether the waiter checked ``unless`` before or after, it returns."""
    from preemptible.notice import Flag

    for _ in range(50):  # both interleavings, many times
        flag = Flag()
        closed = threading.Event()
        done: list[bool] = []
        t = threading.Thread(
            target=lambda f=flag, c=closed, d=done: d.append(f.wait(None, unless=c.is_set)), daemon=True
        )
        t.start()
        closed.set()
        flag.wake()
        t.join(30)
        assert done == [False]  # woken, not set
    flag = Flag()
    flag.set()
    assert flag.wait(None, unless=lambda: True) is True


def test_a_rank_that_fails_its_part_of_a_commit_is_named_alike_on_every_rank(server: Any, tmp_path: Path) -> None:
    """The commit round carries each failing rank and why to every rank: the failing rank raises its own error, every
    other rank the same `SaveError`, whose cause is one `RankFailures` listing them; nothing is committed."""
    import time

    from preemptible.checkpoint.commit import Committer, Job
    from preemptible.errors import RankFailures, SaveError
    from preemptible.store.io import LocalStorage
    from preemptible.writer import Progress

    class Refusing(LocalStorage):
        def open_write(self, path: str) -> Any:
            raise OSError(28, "No space left on device")

    def commit(coord: dist.Coordinator) -> Any:
        storage = (Refusing if coord.rank == 1 else LocalStorage)(str(tmp_path))
        committer = Committer(
            storage,
            str(tmp_path),
            coordinator=coord,
            clock=time.time,
            monotonic=time.monotonic,
            verify_after_save=False,
        )
        job = Job(
            step=7,
            path=str(tmp_path / "step-000000007"),
            reason="manual",
            start=time.monotonic(),
            extra={},
            budget=None,
            deadline=None,
            progress=Progress(),
            key="save/1",
        )
        try:
            return committer.write(job, [], {f"rank{coord.rank}.json": b"{}"}, None, 1)
        except OSError as e:  # SaveError is one
            return e

    outcomes = on_every_rank(coordinators(server, 3), commit)
    own = outcomes.pop(1)
    assert type(own) is OSError and own.errno == 28
    assert all(type(e) is SaveError for e in outcomes), outcomes
    assert len({str(e) for e in outcomes}) == 1
    assert "rank 1: " in str(outcomes[0]) and "No space left on device" in str(outcomes[0])
    causes = [e.__cause__ for e in outcomes]
    assert all(isinstance(c, RankFailures) for c in causes)
    assert {tuple(r for r, _ in c.failures) for c in causes} == {(1,)}
    assert not (tmp_path / "step-000000007" / "COMMIT.json").exists()


def test_a_round_outcome_names_its_failing_ranks_in_one_form() -> None:
    doc = dist.failures_doc([(1, "disk full"), (3, 'a "quoted" reason')])
    assert dist.failures_from(doc) == [(1, "disk full"), (3, 'a "quoted" reason')]
    assert dist.failures_from("something else") == [(0, "something else")]


@pytest.mark.parametrize("lockstep", [True, False])
def test_a_timed_save_falls_due_at_one_step_on_every_rank(server: Any, lockstep: bool) -> None:
    """save_interval_s under several ranks (`dist.IntervalAgreement`): only rank 0's clock says when; every rank
    gets True at the same steps, each after the step rank 0's clock fell due at, and never again until rank 0's clock
    says so. ``lockstep``: a collective at every step (DDP); without it, ranks run apart and the agreed step is still
    one every rank reaches. Ranks as threads, against a real TCPStore; each loop ends after its third timed save (the
    same step on every rank, if the property holds)."""
    import time

    world, interval, cap = 3, 6, 20_000
    coords = coordinators(server, world, timeout_s=60.0)  # connects on a loaded machine: not what is tested
    barrier = threading.Barrier(world)
    announced: list[int] = []

    def rank_loop(c: dist.Coordinator) -> list[int]:
        agreement = dist.IntervalAgreement(c, timeout_s=10.0)
        saved, last, completed = [], 0, 0
        try:
            while len(saved) < 3 and completed < cap:
                completed += 1
                time.sleep(0.001)  # a step's work
                if lockstep:
                    barrier.wait(30)
                elapsed = c.rank == 0 and completed - last >= interval  # rank 0's injected clock: one step = 1 s
                if elapsed and not agreement._announced:
                    announced.append(completed)
                if agreement.due(completed, elapsed):
                    saved.append(completed)
                    last = completed
        finally:
            agreement.close()
        return saved

    saves = on_every_rank(coords, rank_loop)
    assert len(saves[0]) == 3 and all(s == saves[0] for s in saves), saves  # the same steps on every rank
    assert len(announced) == 3, announced  # one round per announcement: none lost, none made up
    for announced_at, step, previous in zip(announced, saves[0], [0, *saves[0]], strict=False):
        assert previous + interval <= announced_at < step
        if lockstep:  # rank 0 waits for the step at once; the others cannot be past its step: the next one
            assert step == announced_at + 1, (announced, saves[0])


def test_a_timed_save_agreement_with_a_silent_rank_is_a_coordination_error(server: Any) -> None:
    """Rank 1 never starts its agreement (it died): rank 0 is told, within the timeout, instead of hanging."""
    import time

    c0, _ = coordinators(server, 2, timeout_s=60.0)  # the connect; the agreement itself waits 1 s
    agreement = dist.IntervalAgreement(c0, timeout_s=1.0)
    try:
        assert agreement.due(3, False) is False  # nothing due, no traffic
        with pytest.raises(CoordinationError, match=r"ranks \[1\].*interval-step"):
            for completed in range(4, 4000):
                agreement.due(completed, True)
                time.sleep(0.01)
    finally:
        agreement.close()
