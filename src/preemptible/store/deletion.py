"""Deleting checkpoints: the mechanism under the retention policy (which decides; this only carries it out)."""

from __future__ import annotations

import logging

from preemptible.store import layout
from preemptible.store.io import Storage
from preemptible.store.markers import Markers, State, Transition, advance

log = logging.getLogger("preemptible")


def delete_checkpoint(
    storage: Storage, root: str, step: int, state: State, *, transition: Transition = Transition.ROTATE
) -> None:
    """Delete the checkpoint of ``step`` (in ``state``): its commit first, then the directory. ``transition``:
    rotation (retention let it go) or replacement (a new save of a step marked invalid).

    Raises:
        LifecycleError: the transition is not legal from ``state`` (e.g. replacing a checkpoint that is not invalid).
    """
    advance(state, transition)
    directory = storage.join(root, layout.step_dir(step))
    Markers(storage).retract(directory)
    storage.remove_tree(directory)


def delete_leftover(storage: Storage, path: str) -> None:
    """Delete an uncommitted leftover (a save attempt that died or lost the race, or an older layout's step
    directory without ``COMMIT.json``) at ``path``."""
    storage.remove_tree(path)
