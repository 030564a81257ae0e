"""Run.epochs / Run.batches / Run.start_step / Run.boundary: epoch-structured loops over a shuffling DataLoader,
stopped by a notice at any step (mid-epoch, at an epoch's last batch, at the very end), resume to exactly the state
of a run that was never stopped: weights, optimizer, scheduler (stepped once per epoch), and the batches seen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

import preemptible
from preemptible.errors import PreemptibleError

EPOCHS, BATCHES = 3, 5  # 15 steps


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, DataLoader[Any]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(BATCHES * 4, 4, generator=g), torch.randn(BATCHES * 4, 1, generator=g))
    return model, optimizer, scheduler, DataLoader(data, batch_size=4, shuffle=True)


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step on a batch: forward, backward, the optimizer's step."""
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def train(root: Path, stop_at: int | None = None) -> tuple[dict[str, Any], list[tuple[int, float]], preemptible.Run]:
    """One process's life: returns the final state, the (epoch, first value) of every batch trained on, the run."""
    model, optimizer, scheduler, loader = build()
    run = preemptible.Run(root, sources=(), exit_on_notice=False, model=model, optimizer=optimizer, scheduler=scheduler)
    seen: list[tuple[int, float]] = []
    with run:
        for epoch in run.epochs(EPOCHS):
            for x, y in run.batches(loader):
                seen.append((epoch, float(x[0, 0])))
                optimizer_step(model, optimizer, x, y)
                if stop_at is not None and run.step + 1 == stop_at:
                    run.guard.trigger(source="test")
            if run.preempted:
                break
            scheduler.step()  # once per epoch, never twice, never skipped
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    return state, seen, run


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return bool(a == b)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[tuple[int, float]]]:
    state, seen, run = train(tmp_path_factory.mktemp("ref") / "ckpt")
    assert run.step == EPOCHS * BATCHES and not run.preempted
    return state, seen


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop_at=st.integers(min_value=1, max_value=EPOCHS * BATCHES))
def test_a_stop_at_any_step_resumes_to_the_uninterrupted_state(
    stop_at: int, reference: tuple[dict[str, Any], list[tuple[int, float]]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("stop") / "ckpt"
    _, first_seen, first = train(root, stop_at)
    assert first.preempted and first.step == stop_at
    state, rest_seen, second = train(root)
    assert second.resumed_from == stop_at and not second.preempted
    assert first_seen + rest_seen == reference[1]  # the same batches, in the same order, each once
    assert same(state, reference[0])


@pytest.mark.parametrize("stop_at", [BATCHES, 2 * BATCHES, 3 * BATCHES])
def test_a_stop_at_an_epoch_s_last_batch_runs_its_end_of_epoch_work_once_after_the_resume(
    stop_at: int, reference: tuple[dict[str, Any], list[tuple[int, float]]], tmp_path: Path
) -> None:
    train(tmp_path / "ckpt", stop_at)
    state, _seen, _ = train(tmp_path / "ckpt")
    assert state["scheduler"]["last_epoch"] == EPOCHS == reference[0]["scheduler"]["last_epoch"]
    assert same(state, reference[0])


def test_a_finished_run_runs_nothing_more(tmp_path: Path) -> None:
    train(tmp_path / "ckpt")
    _, seen, run = train(tmp_path / "ckpt")
    assert seen == [] and run.start_step == EPOCHS * BATCHES


def test_start_step_restores_before_the_loop_and_once(tmp_path: Path) -> None:
    train(tmp_path / "ckpt", stop_at=7)
    model, optimizer, scheduler, _loader = build()
    run = preemptible.Run(tmp_path / "ckpt", sources=(), model=model, optimizer=optimizer, scheduler=scheduler)
    try:
        assert run.start_step == 7 and run.resumed_from == 7
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        assert run.start_step == 7  # no second restore
        assert same(weights, model.state_dict())
    finally:
        run.close()


def test_boundary_drives_a_loop_of_your_own(tmp_path: Path) -> None:
    model, _optimizer, _, _ = build()
    run = preemptible.Run(tmp_path / "ckpt", sources=(), save_every=2, exit_on_notice=False, model=model)
    with run:
        step = run.start_step
        stopped = False
        while not stopped:
            step += 1
            if step == 5:
                run.guard.trigger(source="test")
            stopped = run.boundary(step)
    assert run.preempted and run.step == 5
    assert [c.step for c in run.checkpointer.checkpoints()][-2:] == [4, 5]


def test_a_mid_epoch_checkpoint_without_the_epoch_s_streams_is_a_clear_error(tmp_path: Path) -> None:
    model, _optimizer, _scheduler, loader = build()
    run = preemptible.Run(tmp_path / "ckpt", sources=(), model=model)
    with run:
        run.position.entry.update(epoch=0, done=2, rng=None)  # as a checkpoint written outside run.batches() holds it
        with pytest.raises(PreemptibleError, match="expected the random streams of epoch 0"):
            next(iter(run.batches(loader)))


def train_with_draws(root: Path, stop_at: int | None = None) -> tuple[dict[str, Any], preemptible.Run]:
    """As `train`, with what real scripts do between boundaries: a peek at a batch through an iterator of its own
    before `run.batches` (the DDP tutorial's ``b_sz``: its iterator draws a seed from the global stream), a draw
    between batches, and a draw at the epoch's end; each one changes what is trained or kept."""
    model, optimizer, scheduler, loader = build()
    kept: dict[str, Any] = {"peeked": 0.0, "ends": 0.0}
    run = preemptible.Run(
        root, sources=(), exit_on_notice=False, model=model, optimizer=optimizer, scheduler=scheduler, kept=kept
    )
    with run:
        for _ in run.epochs(EPOCHS):
            kept["peeked"] += float(next(iter(loader))[0].sum())  # a draw before run.batches
            for x, y in run.batches(loader):
                noisy = x + 0.01 * torch.randn_like(x)  # a draw between boundaries
                optimizer_step(model, optimizer, noisy, y)
                if stop_at is not None and run.step + 1 == stop_at:
                    run.guard.trigger(source="test")
            if run.preempted:
                break
            kept["ends"] += float(torch.rand(1))  # a draw at the epoch's end
            scheduler.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "kept": dict(kept)}
    return state, run


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop_at=st.integers(min_value=1, max_value=EPOCHS * BATCHES - 1))
def test_draws_before_between_and_after_the_batches_resume_exactly(
    stop_at: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Whatever the loop draws from the global streams outside the batches, a resumed run draws the same: the peek
    before `run.batches` in the resumed epoch must not shift the streams the rest of that epoch trains with."""
    reference, _ = train_with_draws(tmp_path_factory.mktemp("ref") / "ckpt")
    root = tmp_path_factory.mktemp("stop") / "ckpt"
    _, first = train_with_draws(root, stop_at)
    assert first.preempted and first.step == stop_at
    resumed, second = train_with_draws(root)
    assert second.resumed_from == stop_at and not second.preempted
    assert same(resumed["model"], reference["model"]) and same(resumed["optimizer"], reference["optimizer"])


def test_save_every_epochs_saves_after_each_epoch_s_end_work_and_resumes_into_the_next(tmp_path: Path) -> None:
    """``save_every_epochs=1``: a checkpoint after each epoch's end work (here: scheduler.step()), none after the
    last (the final save is that one). A crash after the first epoch (no notice: the loop is left) resumes at the
    second epoch's first batch, with the scheduler stepped once, and ends as a run never stopped."""
    from conftest import journal

    def life(root: Path, crash_in_epoch: int | None) -> tuple[dict[str, Any], preemptible.Run]:
        model, optimizer, scheduler, loader = build()
        run = preemptible.Run(
            root, sources=(), save_every_epochs=1, async_save=False, model=model, optimizer=optimizer,
            scheduler=scheduler,
        )  # fmt: skip
        with run:
            for epoch in run.epochs(EPOCHS):
                for x, y in run.batches(loader):
                    if epoch == crash_in_epoch:
                        break  # as a SIGKILL would: nothing saved from here
                    optimizer_step(model, optimizer, x, y)
                if epoch == crash_in_epoch:
                    break
                scheduler.step()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        return state, run

    reference, _ = life(tmp_path / "ref", None)
    saves = [(e["step"], e["reason"]) for e in journal(tmp_path / "ref") if e["event"] == "save_committed"]
    assert saves == [(BATCHES, "periodic"), (2 * BATCHES, "periodic"), (3 * BATCHES, "final")]
    _, first = life(tmp_path / "run", crash_in_epoch=1)
    assert first.step == BATCHES
    state, second = life(tmp_path / "run", None)
    assert second.resumed_from == BATCHES
    assert same(state, reference)


def test_a_resume_whose_loader_changed_length_says_it_is_not_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped mid-epoch, resumed with a loader of another length (another batch size): the batches skipped are not
    the ones done. A warning names it, once, and the journal's ``inexact_resume`` event carries it to `report`."""
    from conftest import journal
    from preemptible.cli import main

    model, optimizer, _, loader = build()
    run = preemptible.Run(tmp_path, sources=(), exit_on_notice=False, model=model, optimizer=optimizer)
    with run:
        for _ in run.epochs(EPOCHS):
            for x, y in run.batches(loader):
                optimizer_step(model, optimizer, x, y)
                if run.step + 1 == 3:
                    run.guard.trigger(source="test")
            if run.preempted:
                break
    model, optimizer, _, loader = build()
    smaller = DataLoader(loader.dataset, batch_size=2, shuffle=True)
    run = preemptible.Run(tmp_path, sources=(), exit_on_notice=False, model=model, optimizer=optimizer)
    with run, caplog.at_level("WARNING", logger="preemptible"):
        for _ in run.epochs(1):
            for _batch in run.batches(smaller):
                pass
    assert run.resumed_from == 3
    warned = [r.getMessage() for r in caplog.records if "not exact" in r.getMessage()]
    assert len(warned) == 1 and "had 5 batches" in warned[0] and "has 10 now" in warned[0], warned
    events = [e for e in journal(tmp_path) if e["event"] == "inexact_resume"]
    assert [(e["step"], e["what"]) for e in events] == [(3, "data position")]
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 0
    assert "! resume not exact (data position): epoch 0 had 5 batches" in capsys.readouterr().out
    main(["diagnose", "--root", str(tmp_path)])
    assert "resume not exact: data position: epoch 0 had 5 batches" in capsys.readouterr().out


def test_streams_a_checkpoint_holds_that_this_process_cannot_restore_are_named() -> None:
    """A checkpoint written on a GPU machine, resumed on one without CUDA: the GPU streams cannot come back."""
    from preemptible.state import RNGState

    rng = RNGState()
    saved = rng.state_dict()
    rng.load_state_dict(saved)
    assert rng.unrestored == []
    if not torch.cuda.is_available():
        rng.load_state_dict({**saved, "cuda": [torch.zeros(16, dtype=torch.uint8)]})
        assert len(rng.unrestored) == 1 and "1 CUDA device(s)" in rng.unrestored[0]


def test_an_exact_resume_journals_nothing_inexact(tmp_path: Path) -> None:
    from conftest import journal

    train(tmp_path / "ckpt", stop_at=7)
    train(tmp_path / "ckpt")
    assert not [e for e in journal(tmp_path / "ckpt") if e["event"] == "inexact_resume"]


def test_a_break_out_of_the_batches_after_the_optimizer_step_counts_that_step(tmp_path: Path) -> None:
    """pytorch/examples' ``--dry-run``: ``break`` after one trained batch of each epoch. Each of those batches was
    trained (its optimizer stepped), so the final checkpoint is of step 2, not 0; a break before the step counts
    nothing."""
    from conftest import journal

    model, optimizer, _, loader = build()
    run = preemptible.Run(tmp_path, sources=(), model=model, optimizer=optimizer)
    with run:
        for epoch in run.epochs(3):
            for x, y in run.batches(loader):
                if epoch == 2:
                    break  # before any work: not a step
                optimizer_step(model, optimizer, x, y)
                break  # --dry-run
    assert run.step == 2
    assert [e["step"] for e in journal(tmp_path) if e["event"] == "save_committed"] == [2]


def test_batches_done_continues_the_epoch_s_batch_index_after_a_resume(tmp_path: Path) -> None:
    """``enumerate(run.batches(loader), run.batches_done)``: the same index for each batch as a run never stopped
    (code keyed on it, e.g. ``if i % 100 == 0``, then runs at the same batches)."""

    def indices(stop_at: int | None) -> list[tuple[int, int]]:
        model, optimizer, _, loader = build()
        run = preemptible.Run(tmp_path, sources=(), exit_on_notice=False, model=model, optimizer=optimizer)
        seen = []
        with run:
            for epoch in run.epochs(EPOCHS):
                for i, (x, y) in enumerate(run.batches(loader), run.batches_done):
                    seen.append((epoch, i))
                    optimizer_step(model, optimizer, x, y)
                    if run.step + 1 == stop_at:
                        run.guard.trigger(source="test")
                if run.preempted:
                    break
        return seen

    first = indices(stop_at=7)
    assert first[-1] == (1, 1)  # stopped after the second batch of epoch 1
    rest = indices(stop_at=None)
    assert first + rest == [(e, i) for e in range(EPOCHS) for i in range(BATCHES)]
