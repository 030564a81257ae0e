"""Proof that a checkpoint is right, beyond its checksums: the probe loss.

A probe is a function the user gives (``lambda: loss_fn(model(x_fixed), y_fixed)``). At save it runs on the
weights being saved and its value goes into ``COMMIT.json``; after a restore it runs again and must agree
(relative tolerance, default 1e-4). It catches what checksums cannot: a checkpoint written from the wrong
weights, a loader that put tensors in the wrong places, a model built differently than the one saved.

IMPORTANT: a probe never changes training. It runs with gradients off, every module of the state in eval
mode and the random streams forked (torch CPU and CUDA, Python, NumPy); afterwards the modules' modes and the
streams are exactly as before.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from preemptible.errors import ProbeError

Probe = Callable[[], Any]
DEFAULT_RTOL = 1e-4


@contextlib.contextmanager
def _isolated(state: Mapping[str, Any]) -> Iterator[None]:
    modules = [m for m in state.values() if isinstance(m, torch.nn.Module)]
    modes = [(mod, mod.training) for m in modules for mod in m.modules()]
    py_state = random.getstate()
    np_state = None
    try:
        import numpy

        np_state = numpy.random.get_state()
    except ImportError:  # pragma: no cover - numpy is optional
        numpy = None  # type: ignore[assignment]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            for m in modules:
                m.eval()
            yield
    finally:
        for mod, training in modes:
            mod.training = training
        random.setstate(py_state)
        if np_state is not None:
            numpy.random.set_state(np_state)


def run_probe(probe: Probe, state: Mapping[str, Any]) -> float:
    """The probe's value on the live state, leaving training untouched (see the module docstring)."""
    with _isolated(state):
        value = probe()
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ProbeError(f"expected the probe to return one number, found a tensor of shape {list(value.shape)}")
        value = value.detach().float().item()
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ProbeError(f"expected the probe to return a number, found {type(value).__name__}") from None


@dataclass(frozen=True)
class ProbeCheck:
    stored: float
    recomputed: float
    rtol: float

    @property
    def ok(self) -> bool:
        if math.isnan(self.stored) or math.isnan(self.recomputed):
            return False
        return abs(self.recomputed - self.stored) <= self.rtol * max(abs(self.stored), 1e-12)

    def describe(self) -> str:
        return (
            f"probe loss mismatch: stored {self.stored!r} at save, recomputed {self.recomputed!r} now "
            f"(relative difference {abs(self.recomputed - self.stored) / max(abs(self.stored), 1e-12):.2e}, "
            f"tolerance {self.rtol:g})"
        )
