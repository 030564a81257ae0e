"""Bit-exact resume, component by component: a run preempted at step k and resumed ends exactly where an
uninterrupted run ends (weights, optimizer state, schedulers, GradScaler, dropout RNG, data loader order)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from preemptible import Run
from preemptible.state import capture, flatten

Setup = Callable[[], tuple[dict[str, Any], Callable[[int], None]]]


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 6, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def plain_training(
    model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any
) -> tuple[dict[str, Any], Callable[[int], None]]:
    """The state to save and one fp32 training step on the deterministic batch ``i``."""

    def step(i: int) -> None:
        x, y = batch(i)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()

    return {"model": model, "optimizer": opt, "scheduler": sched}, step


def sgd_momentum_steplr() -> tuple[dict[str, Any], Callable[[int], None]]:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)

    return plain_training(model, opt, sched)


def adamw_onecycle() -> tuple[dict[str, Any], Callable[[int], None]]:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-2, total_steps=40)

    return plain_training(model, opt, sched)


def adam_cosine_gradscaler() -> tuple[dict[str, Any], Callable[[int], None]]:
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=7)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=4)

    def step(i: int) -> None:
        x, y = batch(i)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()

    return {"model": model, "optimizer": opt, "scheduler": sched, "scaler": scaler}, step


def stateful_dataloader() -> tuple[dict[str, Any], Callable[[int], None]]:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    order = torch.Generator()
    loader = StatefulDataLoader(data, batch_size=8, shuffle=True, generator=order)
    state: dict[str, Any] = {"it": None}
    seen: list[float] = []

    def fresh_iterator(epoch: int | None) -> Any:
        # The data-loader recipe of docs/porting.md: (1) seed each epoch's shuffle from the epoch number, as
        # DistributedSampler.set_epoch does, so an epoch's order never depends on how the previous one was
        # reached; (2) make iterators under a forked RNG: a new iterator draws a seed from the global RNG, and a
        # resumed run makes one more iterator than an uninterrupted one.
        if epoch is not None:
            order.manual_seed(1000 + epoch)
        with torch.random.fork_rng():
            return iter(loader)

    def step(i: int) -> None:
        if state["it"] is None:  # first step of this process: a fresh epoch, or resume the restored one
            state["it"] = fresh_iterator(i // 8 if i % 8 == 0 else None)
        try:
            x, y = next(state["it"])
        except StopIteration:
            state["it"] = fresh_iterator(i // 8)
            x, y = next(state["it"])
        seen.append(float(x[0, 0]))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step.seen = seen  # type: ignore[attr-defined]
    return {"model": model, "optimizer": opt, "loader": loader}, step


SETUPS: dict[str, Setup] = {
    "sgd-momentum-steplr": sgd_momentum_steplr,
    "adamw-onecycle": adamw_onecycle,
    "adam-cosine-gradscaler": adam_cosine_gradscaler,
    "stateful-dataloader": stateful_dataloader,
}


def final_state(objs: dict[str, Any]) -> dict[str, Any]:
    flat = flatten(capture({k: v for k, v in objs.items() if k != "seen"}))
    return {"tensors": flat.tensors, "tree": flat.tree}


def train(root: Path, total: int, preempt_at: int | None) -> dict[str, Any]:
    torch.manual_seed(0)
    objs, step_fn = SETUPS[root.parent.name.split("__")[0]]()
    run = Run(root, save_every=6, exit_on_notice=False, **objs)
    for step in run.steps(total):
        step_fn(step)
        if step == preempt_at:
            run.guard.trigger(source="test")
    return {**objs, "seen": getattr(step_fn, "seen", [])}


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_preempted_and_resumed_equals_uninterrupted(tmp_path: Path, name: str) -> None:
    total = 31
    ref_root = tmp_path / f"{name}__ref" / "ckpt"
    reference = train(ref_root, total, None)
    root = tmp_path / f"{name}__run" / "ckpt"
    first = train(root, total, preempt_at=17)  # stops after step 17, checkpoint of step 18
    assert not torch.equal(
        flatten(capture({"m": first["model"]})).tensors["m/0.weight"],
        flatten(capture({"m": reference["model"]})).tensors["m/0.weight"],
    )
    torch.manual_seed(123)  # the resumed process starts from different RNG state: restore must fix it
    resumed = train(root, total, None)
    a, b = final_state(reference), final_state(resumed)
    assert a["tree"] == b["tree"]  # schedulers, scaler, loader position, every non-tensor leaf
    assert a["tensors"].keys() == b["tensors"].keys()
    for k in a["tensors"]:
        assert torch.equal(a["tensors"][k], b["tensors"][k]), k
    if name == "stateful-dataloader":
        assert first["seen"] + resumed["seen"] == reference["seen"]
