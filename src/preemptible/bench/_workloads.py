"""The states the benchmarks save and restore, and the training job that runs beside a save."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from preemptible.state import capture, flatten


def large_state(params: float = 100e6, side: int = 4096) -> dict[str, Any]:
    """A model of about ``params`` parameters with AdamW state (fp32: ~12 bytes per parameter)."""
    layers = max(1, round(params / (side * side)))
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3  # random moments: no compressible pages flattering any writer
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": opt}


def small_state(count: int = 10_000, total_bytes: float = 120e6) -> dict[str, Any]:
    """About ``count`` tensors: ``count / 4`` small parameters, each with AdamW's step, exp_avg and exp_avg_sq."""
    n = max(1, count // 4)
    per = max(1, int(total_bytes / 12 / n))
    params = [torch.nn.Parameter(torch.randn(per)) for _ in range(n)]
    model = torch.nn.ParameterList(params)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": opt}


def plain(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.state_dict() for k, v in state.items()}


def flat_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in flatten(capture(state)).tensors.items()}


def _dcp() -> Any:
    """torch.distributed.checkpoint, typed loosely (its package does not re-export its names for mypy)."""
    import torch.distributed.checkpoint as dcp

    return dcp


def train_steps(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    *,
    seconds: float = 0.0,
    until: Callable[[], bool] | None = None,
) -> list[float]:
    """Training steps' wall times: steps for ``seconds``, or until ``until()`` is true after one (at least one)."""
    clock = time.perf_counter
    end = clock() + seconds
    times: list[float] = []
    while True:
        t = clock()
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        now = clock()
        times.append(now - t)
        if until() if until is not None else now >= end:
            return times
