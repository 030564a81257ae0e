"""What the test scripts share (each runs as a program: its own directory is on ``sys.path``): a digest of a state,
and the wait at a marked step for the test's SIGKILL."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import torch

import preemptible.state
from preemptible.checkpoint import Checkpointer


def digest(state: dict[str, Any]) -> str:
    """sha256 of every tensor of the state's ``state_dict``s, by key (16 hex digits)."""
    h = hashlib.sha256()
    for key, value in preemptible.state.flatten(preemptible.state.capture(state)).tensors.items():
        h.update(key.encode())
        h.update(value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def hang_for_kill(marker: str, step: int, *, root: str | None = None, committed: int | None = None) -> None:
    """Write ``marker`` (the step) and wait there to be killed: a SIGKILL at a known step. With ``committed``, first
    wait (at most a minute) until preemptible's step ``committed`` under ``root`` has landed."""
    if committed is not None and root is not None:
        for _ in range(600):
            if (Checkpointer(root).latest() or -1) >= committed:
                break
            time.sleep(0.1)
    part = Path(f"{marker}.part")
    part.write_text(str(step))
    part.replace(marker)
    while True:  # killed here
        time.sleep(1)
