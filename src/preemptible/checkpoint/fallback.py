"""The one fallback loop: try candidate checkpoints newest first until one succeeds.

`Restorer.restore` (which also marks what fails, and agrees with the other ranks) and the readers of
`preemptible.export` (load, export) both fall back through `fall_back`; each says what an attempt is and what a
failed one means (a warning, a marker, an error).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

C = TypeVar("C")
R = TypeVar("R")


def fall_back(
    candidates: Iterable[C],
    attempt: Callable[[C], R],
    *,
    ok: Callable[[R], bool],
    failed: Callable[[C, R, C | None], None],
) -> tuple[C, R] | None:
    """``attempt`` each candidate, in order (newest first), until one is ``ok``; returns it and its result, or None
    when none was. ``failed(candidate, result, following)`` after each that was not (``following``: the candidate
    tried next, None after the last) records it, warns, or raises to stop."""
    items = list(candidates)
    for i, cand in enumerate(items):
        result = attempt(cand)
        if ok(result):
            return cand, result
        failed(cand, result, items[i + 1] if i + 1 < len(items) else None)
    return None
