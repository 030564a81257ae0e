"""Which checkpoints to keep: a pure function over what is on storage. Deleting is the caller's business."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from preemptible.store.layout import CheckpointInfo


def keep_steps(checkpoints: Iterable[CheckpointInfo], keep: int) -> set[int]:
    """The committed steps to keep: the ``keep`` newest, plus the newest validated one.

    The newest validated checkpoint is the last one known good; it stays until a newer one has validated, so
    a run can always fall back to something that has loaded correctly before.
    """
    if keep < 1:
        raise ValueError(f"expected keep >= 1, found {keep}")
    committed = sorted((c for c in checkpoints if c.committed), key=lambda c: c.step, reverse=True)
    kept = {c.step for c in committed[:keep]}
    validated = [c.step for c in committed if c.validated]
    if validated:
        kept.add(validated[0])
    return kept


def stale_leftovers(
    checkpoints: Iterable[CheckpointInfo],
    mtimes: dict[int, float | None],
    *,
    now: float,
    older_than_s: float,
    protect: Collection[int] = (),
) -> list[int]:
    """Uncommitted directories safe to delete: untouched for longer than ``older_than_s``.

    A younger one may belong to a machine still writing during its notice window; it is left alone.
    """
    out = []
    for c in checkpoints:
        if c.committed or c.step in protect:
            continue
        mtime = mtimes.get(c.step)
        if mtime is not None and now - mtime > older_than_s:
            out.append(c.step)
    return out
