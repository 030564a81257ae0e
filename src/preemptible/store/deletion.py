"""Deleting checkpoints: the mechanism under the retention policy (which decides; this only carries it out)."""

from __future__ import annotations

import logging

from preemptible.store import layout
from preemptible.store.io import Storage
from preemptible.store.markers import Markers, State, Transition, advance

log = logging.getLogger("preemptible")


def delete_checkpoint(storage: Storage, root: str, step: int, state: State) -> None:
    """Delete the checkpoint of ``step`` (in ``state``): its commit first, then the directory.

    Raises:
        LifecycleError: ``state`` cannot be rotated out (quarantined or already deleted).
    """
    advance(state, Transition.ROTATE)
    directory = storage.join(root, layout.step_dir(step))
    Markers(storage).retract(directory)
    storage.remove_tree(directory)


def delete_leftover(storage: Storage, root: str, step: int) -> None:
    """Delete an uncommitted leftover of ``step`` (a save that died, or a failed one being retried)."""
    storage.remove_tree(storage.join(root, layout.step_dir(step)))
