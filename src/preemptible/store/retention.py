"""Which checkpoints to keep: a pure policy over what is on storage. Deleting is `preemptible.store.deletion`'s.

The rules (the property tests' oracle):

- The ``keep`` newest checkpoints that are not known bad (committed or validated) are kept, and so is the newest
  validated one.
- IMPORTANT: a checkpoint is deleted only when a *newer* one has passed verification (checksums, and its probe
  when it has one) since it was committed. Until the newest checkpoint has validated, the older ones stay, so a
  run can always fall back to something that has loaded correctly before.
- A checkpoint that failed a content check (invalid) or whose manifest cannot be read never counts towards
  ``keep`` and is never the "newest validated"; it goes by the same rule (once a newer one has validated).
"""

from __future__ import annotations

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


def decide(checkpoints: Iterable[CheckpointInfo], keep: int) -> Decision:
    """Apply the rules above to the committed checkpoints among ``checkpoints``."""
    if keep < 1:
        raise ValueError(f"expected keep >= 1, found {keep}")
    committed = sorted((c for c in checkpoints if c.committed), key=lambda c: c.step, reverse=True)
    good = [c for c in committed if c.status in ("committed", "validated")]
    kept = {c.step for c in good[:keep]}
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


def keep_steps(checkpoints: Iterable[CheckpointInfo], keep: int) -> set[int]:
    """The committed steps that stay (everything `decide` does not delete)."""
    infos = list(checkpoints)
    deleted = set(decide(infos, keep).delete)
    return {c.step for c in infos if c.committed and c.step not in deleted}


def needs_validation(checkpoints: Iterable[CheckpointInfo], keep: int) -> bool:
    """True when older checkpoints wait for a newer one to validate (verifying the newest would free them)."""
    return bool(decide(checkpoints, keep).blocked)


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
