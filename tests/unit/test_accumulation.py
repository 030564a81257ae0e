"""Gradient accumulation: a notice that lands between two optimizer steps stops the loop at the optimizer step that
ends the accumulation (a checkpoint earlier holds the data position after batches whose gradients it lacks), waits
no longer than the accumulation seen, and a resume from it ends bit-identical to a run never stopped."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import committed_steps, journal, make_model
from preemptible import Run
from preemptible.accumulation import MAX_DEFER, OptimizerSteps, real_optimizers

EVERY = 4


def parts(seed: int = 0) -> dict[str, Any]:
    model = make_model(seed=seed)
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def micro_batch(p: dict[str, Any], step: int, *, optimizer_steps: bool = True) -> None:
    """One batch of an accumulation over `EVERY`: backward every batch, the optimizer step every `EVERY`th."""
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
    loss = torch.nn.functional.mse_loss(p["model"](x), y) / EVERY
    loss.backward()
    if optimizer_steps and (step + 1) % EVERY == 0:
        p["optimizer"].step()
        p["optimizer"].zero_grad()


def test_a_notice_mid_accumulation_stops_at_its_optimizer_step_and_resumes_exactly(tmp_path: Path) -> None:
    reference = parts()
    torch.manual_seed(1)
    for step in Run(tmp_path / "ref", **reference).steps(24):
        micro_batch(reference, step)
    p = parts()
    torch.manual_seed(1)
    run = Run(tmp_path / "ck", exit_on_notice=False, **p)
    ran = []
    for step in run.steps(24):
        micro_batch(p, step)
        ran.append(step)
        if step == 8:  # boundary 9: one batch into the third accumulation
            run.guard.trigger(source="test")
    assert ran == list(range(12)) and committed_steps(tmp_path / "ck") == [12]
    (notice,) = [e for e in journal(tmp_path / "ck") if e["event"] == "notice"]
    assert notice["step"] == 12 and notice["waited_for_optimizer_steps"] == 3
    q = parts(seed=5)
    run = Run(tmp_path / "ck", **q)
    for step in run.steps(24):
        micro_batch(q, step)
    assert run.resumed_from == 12
    for a, b in zip(reference["model"].parameters(), q["model"].parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_wait_is_bounded_by_the_accumulation_seen_and_then_says_the_resume_is_not_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = parts()
    run = Run(tmp_path, exit_on_notice=False, **p)
    with caplog.at_level(logging.WARNING, logger="preemptible"):
        for step in run.steps(100):
            micro_batch(p, step, optimizer_steps=step < 12)  # from step 12 on, gradients pile up, never applied
            if step == 13:
                run.guard.trigger(source="test")
    assert committed_steps(tmp_path) == [14 - 1 + 2 * EVERY]  # waited twice the period seen, then stopped anyway
    assert "the resume will not be exact" in caplog.text


def test_a_loop_without_gradients_or_stepping_every_batch_stops_at_once(tmp_path: Path) -> None:
    p = parts()
    run = Run(tmp_path, exit_on_notice=False, **p)
    for step in run.steps(50):
        if step >= 3:
            micro_batch(p, EVERY - 1)  # a batch that ends with an optimizer step, every time
        if step == 5:
            run.guard.trigger(source="test")
    assert committed_steps(tmp_path) == [6]
    (notice,) = [e for e in journal(tmp_path) if e["event"] == "notice"]
    assert "waited_for_optimizer_steps" not in notice


class Wrapping(torch.optim.Optimizer):
    """A wrapper in the shape of Accelerate's: an Optimizer holding the real one as ``.optimizer``, stepping it only
    when it really steps (the e2e tests run Accelerate's own)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self, closure: Any = None) -> None:
        pass  # accumulating: the real optimizer is not stepped


def test_optimizer_steps_are_counted_through_a_wrapper_and_the_hooks_go_with_close() -> None:
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = Wrapping(inner)
    assert real_optimizers({"m": model, "o": wrapped, "again": inner}) == [inner]
    steps = OptimizerSteps({"o": wrapped})
    assert steps.limit == MAX_DEFER
    model(torch.ones(1, 8)).sum().backward()
    wrapped.step()  # the wrapper's step while accumulating: not an optimizer step
    assert not steps.boundary(1) and steps.accumulating(False)
    inner.step()
    assert steps.boundary(2) and not steps.accumulating(True)
    inner.step()
    assert steps.boundary(6) and steps.period == 4 and steps.limit == 8
    steps.close()
    inner.step()
    assert steps.count == 2


def test_a_periodic_save_that_falls_due_mid_accumulation_is_made_at_its_optimizer_step(tmp_path: Path) -> None:
    p = parts()
    for step in Run(tmp_path, save_every=6, keep=10, async_save=False, **p).steps(24):
        micro_batch(p, step)
    assert committed_steps(tmp_path) == [8, 12, 20, 24]  # due at 6, 12 and 18; 24: the final save


def test_an_epoch_s_leftover_batches_joining_the_next_epoch_s_accumulation_are_waited_for(tmp_path: Path) -> None:
    """The plain idiom over epochs: ``enumerate(run.batches(loader))``, a step every 3 batches, 10 batches an epoch.
    The last batch of an epoch joins the next epoch's first accumulation: a gap of 4 where 3 were seen so far. A
    notice at the epoch's end waits across it, and the resume is exact."""
    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(40, 8, generator=g), torch.randn(40, 2, generator=g))

    def train(root: Path, notice_at: int | None) -> tuple[Run, dict[str, Any]]:
        p = parts()
        torch.manual_seed(2)
        loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
        run = Run(root, exit_on_notice=False, **p)
        for _ in run.epochs(3):
            for i, (x, y) in enumerate(run.batches(loader)):
                (torch.nn.functional.mse_loss(p["model"](x), y) / 3).backward()
                if (i + 1) % 3 == 0:
                    p["optimizer"].step()
                    p["optimizer"].zero_grad()
                if run.step + 1 == notice_at:
                    run.guard.trigger(source="test")
        return run, p

    _, reference = train(tmp_path / "ref", None)
    run, _ = train(tmp_path / "ck", 10)  # the epoch's last batch: steps were at 3, 6 and 9; the next is at 13
    assert run.preempted and committed_steps(tmp_path / "ck") == [13]
    _, resumed = train(tmp_path / "ck", None)
    for a, b in zip(reference["model"].parameters(), resumed["model"].parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_pre_stage_that_falls_due_mid_accumulation_is_made_at_its_optimizer_step(tmp_path: Path) -> None:
    p = parts()
    run = Run(tmp_path, prestage_every=2, exit_on_notice=False, **p)
    staged = []
    for step in run.steps(11):
        micro_batch(p, step)
        current = run.checkpointer.staging.current
        staged.append(None if current is None else current.step)
    # due at 2, 4, 6, 8 and 10: staged at 4 and 8; the one due at 10 waits for 12, which never comes
    assert sorted({s for s in staged if s is not None}) == [4, 8] and staged[-1] == 8
