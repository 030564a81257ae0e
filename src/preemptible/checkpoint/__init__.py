"""Checkpoints: the `Checkpointer` façade and the modules under it (partition, commit, reader, restore, handle)."""

from preemptible.checkpoint.checkpointer import Checkpointer
from preemptible.checkpoint.handle import SaveHandle, SaveResult

__all__ = ["Checkpointer", "SaveHandle", "SaveResult"]
