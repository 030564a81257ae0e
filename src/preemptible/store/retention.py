"""Which checkpoints to keep: a pure policy over what is on storage. Deleting is `preemptible.store.deletion`'s.

The rules (the property tests' oracle):

- The ``keep`` newest checkpoints that are not known bad (committed or validated) are kept, and so is the newest
  validated one.
- IMPORTANT: a checkpoint is deleted only when a *newer* one has passed verification (checksums, and its probe
  when it has one) since it was committed. Until the newest checkpoint has validated, the older ones stay, so a
  run can always fall back to something that has loaded correctly before.
- A checkpoint that failed a content check (invalid) or whose manifest cannot be read never counts towards
  ``keep`` and is never the "newest validated"; it goes by the same rule (once a newer one has validated).
- With ``best=(figure, "min" | "max")``, the good checkpoint whose ``COMMIT.json`` records the best value of that
  figure (``figures``, from ``Run.log``; the newest of equals) is kept too.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from preemptible.store.layout import CheckpointInfo


@dataclass(frozen=True)
class Decision:
    """What retention decided: steps to keep and committed steps to delete (oldest first)."""

    keep: frozenset[int]
    delete: tuple[int, ...]
    blocked: tuple[int, ...] = ()
    """Beyond ``keep`` but not deletable yet: no newer checkpoint has validated. A save may verify the newest to
    unblock them (see `needs_validation`)."""


Best = tuple[str, str]
"""``(figure, "min" | "max")``: which checkpoint is the best, by a figure logged with ``Run.log``."""


def figure_of(c: CheckpointInfo, name: str) -> float | None:
    """The value of figure ``name`` recorded with checkpoint ``c`` (a finite number), or None."""
    figures = c.manifest.extra.get("figures") if c.manifest is not None else None
    value = figures.get(name) if isinstance(figures, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)  # an int beyond a float's range (10**400) is no figure to rank by
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def best_step(checkpoints: Iterable[CheckpointInfo], best: Best) -> int | None:
    """The good checkpoint with the best value of the figure (the newest of equals), or None."""
    name, mode = best
    scored = [
        (v, c.step)
        for c in checkpoints
        if c.committed and c.status in ("committed", "validated") and (v := figure_of(c, name)) is not None
    ]
    if not scored:
        return None
    sign = 1.0 if mode == "min" else -1.0
    return min(scored, key=lambda vs: (sign * vs[0], -vs[1]))[1]


def decide(checkpoints: Iterable[CheckpointInfo], keep: int, best: Best | None = None) -> Decision:
    """Apply the rules above to the committed checkpoints among ``checkpoints``."""
    if keep < 1:
        raise ValueError(f"expected keep >= 1, found {keep}")
    committed = sorted((c for c in checkpoints if c.committed), key=lambda c: c.step, reverse=True)
    good = [c for c in committed if c.status in ("committed", "validated")]
    kept = {c.step for c in good[:keep]}
    if best is not None and (step := best_step(committed, best)) is not None:
        kept.add(step)
    validated = [c.step for c in committed if c.status == "validated"]
    if validated:
        kept.add(validated[0])
    newest_validated = validated[0] if validated else None
    delete, blocked = [], []
    for c in reversed(committed):
        if c.step in kept:
            continue
        if newest_validated is not None and newest_validated > c.step:
            delete.append(c.step)
        else:
            blocked.append(c.step)
    return Decision(keep=frozenset(kept), delete=tuple(delete), blocked=tuple(blocked))


def keep_steps(checkpoints: Iterable[CheckpointInfo], keep: int, best: Best | None = None) -> set[int]:
    """The committed steps that stay (everything `decide` does not delete)."""
    infos = list(checkpoints)
    deleted = set(decide(infos, keep, best).delete)
    return {c.step for c in infos if c.committed and c.step not in deleted}


def needs_validation(checkpoints: Iterable[CheckpointInfo], keep: int, best: Best | None = None) -> bool:
    """True when older checkpoints wait for a newer one to validate (verifying the newest would free them)."""
    return bool(decide(checkpoints, keep, best).blocked)


def stale_leftovers(
    checkpoints: Iterable[CheckpointInfo],
    mtimes: dict[str, float | None],
    *,
    now: float,
    older_than_s: float,
    protect: Collection[int] = (),
) -> list[CheckpointInfo]:
    """Uncommitted leftovers safe to delete: untouched for longer than ``older_than_s`` (``mtimes`` by path).

    A younger one may belong to a machine still writing during its notice window; it is left alone.
    """
    out = []
    for c in checkpoints:
        if c.committed or c.step in protect or c.refused is not None:
            continue
        mtime = mtimes.get(c.path)
        if mtime is not None and now - mtime > older_than_s:
            out.append(c)
    return out
