"""The pure parts of a drill's stop mid-epoch and its step-by-step comparison: where `MidEpochAim` holds, and the
first differing step `first_divergence` names."""

from __future__ import annotations

from typing import Any

from preemptible.drill import first_divergence, spliced
from preemptible.loaders import MidEpochAim, length


def _holds(aim: MidEpochAim, epochs: list[int], known_length: bool) -> tuple[int, int] | None:
    """Runs the boundaries of ``epochs`` (batches in each) through ``aim``: the (epoch, batches done) it holds at."""
    for epoch, n in enumerate(epochs):
        for done in range(1, n + 1):
            if aim.due(epoch, done, n if known_length else None):
                return epoch, done
        aim.ended(epoch, n)
    return None


def test_the_aim_is_the_middle_of_the_second_epoch_or_of_the_only_one() -> None:
    aim = MidEpochAim()
    aim.epochs = 3
    assert _holds(aim, [8, 8, 8], known_length=True) == (1, 4)
    one = MidEpochAim()
    one.epochs = 1
    assert _holds(one, [5], known_length=True) == (0, 2)
    assert _holds(MidEpochAim(), [2], known_length=True) == (0, 1)  # epochs unknown: the first epoch


def test_a_loader_without_a_length_is_measured_by_the_epoch_before() -> None:
    aim = MidEpochAim()
    aim.epochs = 3
    assert _holds(aim, [6, 6, 6], known_length=False) == (1, 3)
    single = MidEpochAim()
    single.epochs = 1
    assert _holds(single, [6], known_length=False) is None  # no length, no earlier epoch: no middle known


def test_an_epoch_of_one_batch_has_no_middle() -> None:
    aim = MidEpochAim()
    aim.epochs = 4
    assert _holds(aim, [1, 1, 1, 1], known_length=True) is None


def test_a_length_is_none_when_the_loader_has_none() -> None:
    assert length([1, 2, 3]) == 3
    assert length(iter([1, 2, 3])) is None


def _figures(**by_step: float) -> dict[int, list[dict[str, Any]]]:
    return {int(k[1:]): [{"loss": v}] for k, v in by_step.items()}


def test_the_first_differing_step_is_named_with_its_figure_and_both_values() -> None:
    reference = _figures(s0=1.0, s1=0.9, s2=0.8, s3=0.7)
    ours = _figures(s0=1.0, s1=0.9, s2=0.8000001, s3=0.6)
    d = first_divergence(ours, reference, resumed_at=2)
    assert d is not None and (d.step, d.figure, d.ours, d.reference) == (2, "loss", 0.8000001, 0.8)
    assert not d.before_the_stop and "the first after the resume at step 2" in d.describe()
    assert first_divergence(reference, dict(reference), resumed_at=2) is None


def test_a_difference_before_the_stop_says_the_script_is_not_deterministic() -> None:
    d = first_divergence(_figures(s0=1.0, s1=2.0), _figures(s0=1.5, s1=2.0), resumed_at=1)
    assert d is not None and d.before_the_stop and "not deterministic" in d.describe()


def test_a_figure_logged_by_one_run_only_and_an_int_against_a_float_differ() -> None:
    d = first_divergence({0: [{"loss": 1.0}]}, {0: [{"loss": 1.0, "acc": 0.5}]}, resumed_at=0)
    assert d is not None and d.figure == "acc" and "acc not logged in the drilled run" in d.describe()
    assert d.to_json()["ours"] is None
    d = first_divergence({3: [{"seen": 1}]}, {3: [{"seen": 1.0}]}, resumed_at=0)
    assert d is not None and d.figure == "seen"


def test_the_drilled_run_is_the_first_start_before_the_resume_and_the_restart_from_it() -> None:
    first = _figures(s0=1.0, s1=2.0, s2=3.0, s3=4.0)  # killed after step 3; the last checkpoint was at 2
    restart = _figures(s2=3.5, s3=4.5, s4=5.5)
    assert spliced(first, restart, 2) == _figures(s0=1.0, s1=2.0, s2=3.5, s3=4.5, s4=5.5)


def test_the_step_a_framework_stopped_in_before_logging_it_is_not_a_difference() -> None:
    """The HF Trainer logs a step's figures after ``on_step_end``, where the process stopped: the drilled run never
    logged the step before the resume (3, resumed at 4). Any other step missing from the drilled run differs."""
    reference = _figures(s0=1.0, s1=0.9, s2=0.8, s3=0.7, s4=0.6)
    ours = _figures(s0=1.0, s1=0.9, s2=0.8, s4=0.6)
    assert first_divergence(ours, reference, resumed_at=4) is None
    d = first_divergence(ours, reference, resumed_at=5)  # step 3 is not the one before the resume: a difference
    assert d is not None and d.step == 3 and "not logged in the drilled run" in d.describe()
