"""The save schedule alone: what each boundary does, decided from the step, a fake clock and two questions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from preemptible.schedule import Due, SaveSchedule, StepTimer


def run_boundaries(schedule: SaveSchedule, steps: range, *, seconds_per_step: float = 1.0) -> list[Due]:
    out = []
    for completed in steps:
        due = schedule.due(completed, completed * seconds_per_step)
        if due is Due.SAVE:
            schedule.saved(completed * seconds_per_step)
        out.append(due)
    return out


def test_the_first_boundary_prepares_once_then_nothing_without_saves() -> None:
    assert run_boundaries(SaveSchedule(), range(1, 5)) == [Due.PREPARE, Due.NOTHING, Due.NOTHING, Due.NOTHING]


def test_save_every_counts_completed_steps_and_the_final_step_is_left_to_the_final_save() -> None:
    schedule = SaveSchedule(save_every=3, total=9, prepared=True)
    dues = run_boundaries(schedule, range(1, 10))
    assert [i + 1 for i, d in enumerate(dues) if d is Due.SAVE] == [3, 6]  # 9 is the end: the final save covers it


def test_save_interval_counts_seconds_since_the_last_save_on_the_injected_clock() -> None:
    schedule = SaveSchedule(save_interval_s=2.5, prepared=True)
    dues = run_boundaries(schedule, range(1, 11))
    assert [i + 1 for i, d in enumerate(dues) if d is Due.SAVE] == [3, 6, 9]


def test_a_save_due_mid_accumulation_is_owed_until_the_optimizer_step() -> None:
    schedule = SaveSchedule(save_every=4, prepared=True)
    accumulating = iter([True, True, False])
    asked: list[int] = []

    def ask() -> bool:
        asked.append(1)
        return next(accumulating)

    dues = [schedule.due(c, 0.0, accumulating=ask, limit=8) for c in (4, 5, 6)]
    assert dues == [Due.NOTHING, Due.NOTHING, Due.SAVE]
    assert schedule.owed is None and len(asked) == 3


def test_an_owed_save_waits_at_most_limit_boundaries() -> None:
    schedule = SaveSchedule(save_every=4, prepared=True)
    dues = [schedule.due(c, 0.0, accumulating=lambda: True, limit=2) for c in (4, 5, 6)]
    assert dues == [Due.NOTHING, Due.NOTHING, Due.SAVE]


def test_accumulation_is_asked_only_when_a_save_falls_due() -> None:
    schedule = SaveSchedule(save_every=10, prepared=True)

    def never_asked() -> bool:
        raise AssertionError("walked the parameters at a boundary with nothing due")

    assert [schedule.due(c, 0.0, accumulating=never_asked, limit=4) for c in (1, 2, 3)] == [Due.NOTHING] * 3


def test_prestage_every_and_its_owed_refresh() -> None:
    schedule = SaveSchedule(prestage_every=2, prepared=True)
    answers = iter([True, False])
    dues = [schedule.due(c, 0.0, accumulating=lambda: next(answers)) for c in (2, 3)]
    assert dues == [Due.NOTHING, Due.PRESTAGE]


def test_save_on_best_asks_only_when_on() -> None:
    assert SaveSchedule(save_on_best=True, prepared=True).due(1, 0.0, new_best=lambda: True) is Due.BEST
    assert SaveSchedule(prepared=True).due(1, 0.0, new_best=lambda: True) is Due.NOTHING


@given(
    every=st.integers(1, 7),
    total=st.integers(0, 60),
    stalls=st.lists(st.booleans(), min_size=60, max_size=60),
    limit=st.integers(1, 5),
)
def test_every_due_save_is_made_within_limit_boundaries_and_none_at_or_after_the_end(
    every: int, total: int, stalls: list[bool], limit: int
) -> None:
    schedule = SaveSchedule(save_every=every, total=total, prepared=True)
    made: list[int] = []
    for completed in range(1, total + 1):
        due = schedule.due(completed, 0.0, accumulating=lambda c=completed: stalls[c - 1], limit=limit)
        if due is Due.SAVE:
            made.append(completed)
    assert all(c < total for c in made)
    for k in range(every, total, every):
        assert any(k <= c < k + limit + every for c in made) or k + limit >= total, (k, made)


def test_step_timer_is_a_moving_average_of_boundaries() -> None:
    timer = StepTimer()
    timer.start(10.0)
    timer.boundary(12.0)
    assert timer.step_time == 2.0
    timer.boundary(13.0)
    assert timer.step_time == 0.9 * 2.0 + 0.1 * 1.0


def test_under_several_ranks_the_agreement_decides_the_timed_save_and_is_asked_at_every_boundary() -> None:
    """``agreed``: the rank's own clock only feeds the agreement (`dist.IntervalAgreement`), which says where the
    save falls; it is asked at every boundary before the end (it must see every step), never at or after it."""
    asked: list[tuple[int, bool]] = []

    def agreed(completed: int, elapsed: bool) -> bool:
        asked.append((completed, elapsed))
        return completed == 5  # the step the ranks agreed on, whatever this rank's clock said

    schedule = SaveSchedule(save_interval_s=2.5, total=8, prepared=True, agreed=agreed)
    dues = run_boundaries(schedule, range(1, 9))
    assert [i + 1 for i, d in enumerate(dues) if d is Due.SAVE] == [5]
    assert [c for c, _ in asked] == [1, 2, 3, 4, 5, 6, 7]
    assert [c for c, elapsed in asked if elapsed] == [3, 4, 5]  # 2.5 s since 0; since the save at 5, 2 s by 7


def test_every_n_epochs_is_due_after_each_nth_epoch_but_not_the_last() -> None:
    schedule = SaveSchedule(save_every_epochs=2)
    assert [e for e in range(1, 8) if schedule.epoch_due(e, last=e == 7)] == [2, 4, 6]
    assert schedule.periodic
    assert not SaveSchedule().epoch_due(2, last=False)
