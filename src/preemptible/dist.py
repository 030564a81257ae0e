"""Rank and world helpers that degrade to "rank 0 of 1", and the stop-step agreement seam.

Every code path runs in one process too: without an initialised process group, and without torchrun's
``RANK``/``WORLD_SIZE`` variables, this is rank 0 of a world of 1.
"""

from __future__ import annotations

import os
from typing import Protocol


def _dist_ready() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed support
        return False
    return bool(dist.is_available() and dist.is_initialized())


def rank() -> int:
    """This process's global rank (0 without a process group or launcher)."""
    if _dist_ready():
        import torch.distributed as dist

        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """The number of processes in the job (1 without a process group or launcher)."""
    if _dist_ready():
        import torch.distributed as dist

        return int(dist.get_world_size())
    return int(os.environ.get("WORLD_SIZE", "1"))


class Agreement(Protocol):
    """Decides, at a step boundary, whether this rank stops now.

    ``should_stop(completed, noticed)`` is called by the main thread with the number of completed steps and
    whether this rank knows of a notice. Every rank that returns True returns it at the same ``completed``.
    """

    def should_stop(self, completed: int, noticed: bool) -> bool: ...

    @property
    def stop_step(self) -> int | None: ...

    def close(self) -> None: ...


class LocalAgreement:
    """One process: stop at the first boundary after the notice."""

    def __init__(self) -> None:
        self._stop_step: int | None = None

    def should_stop(self, completed: int, noticed: bool) -> bool:
        if self._stop_step is None and noticed:
            self._stop_step = completed
        return self._stop_step is not None and completed >= self._stop_step

    @property
    def stop_step(self) -> int | None:
        return self._stop_step

    def close(self) -> None:
        pass
