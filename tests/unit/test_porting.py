"""The porting page's first item (docs/porting.md, "Carry state"): what a loop keeps in variables of its own (a
learning rate annealed by hand, the best loss so far, a recurrent hidden state passed from batch to batch) survives a
stop and a resume when it lives in a plain dict given to `Run`, and the resumed run ends bit-identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from preemptible import Run

STEPS = 12
STOP = 7


def train(root: Path, stop_at: int | None = None) -> tuple[torch.nn.Module, dict[str, Any], Run]:
    torch.manual_seed(0)
    rnn = torch.nn.GRU(3, 5, batch_first=True)
    head = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(5, 1))
    model = torch.nn.ModuleDict({"rnn": rnn, "head": head})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    carry: dict[str, Any] = {"lr": 0.5, "best": None, "hidden": None}
    run = Run(root, sources=(), exit_on_notice=False, model=model, optimizer=optimizer, carry=carry)
    for step in run.steps(STEPS):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(2, 4, 3, generator=g), torch.randn(2, 1, generator=g)
        hidden = carry["hidden"]
        out, hidden = rnn(x, hidden)
        loss = torch.nn.functional.mse_loss(head(out[:, -1]), y)
        optimizer.zero_grad()
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = carry["lr"]
        optimizer.step()
        carry["hidden"] = hidden.detach()  # passed on to the next batch, as a language model's loop does
        if carry["best"] is None or loss.item() < carry["best"]:
            carry["best"] = loss.item()
        if step % 3 == 2:
            carry["lr"] /= 4.0  # annealed by hand, not by a scheduler
        if stop_at is not None and step + 1 == stop_at:
            run.guard.trigger(source="test")
    return model, carry, run


def test_a_loop_s_own_variables_in_a_plain_dict_resume_exactly(tmp_path: Path) -> None:
    reference, ref_carry, _ = train(tmp_path / "ref")
    _, _, first = train(tmp_path / "ckpt", stop_at=STOP)
    assert first.preempted and first.step == STOP
    model, carry, second = train(tmp_path / "ckpt")
    assert second.resumed_from == STOP
    assert carry["lr"] == ref_carry["lr"] and carry["best"] == ref_carry["best"]
    assert torch.equal(carry["hidden"], ref_carry["hidden"])
    for a, b in zip(reference.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
