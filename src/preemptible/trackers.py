"""Experiment trackers across a preemption: what a notice does to them, and how a restart continues them.

- On a notice (after the emergency checkpoint has committed, before the process exits), every TensorBoard
  ``SummaryWriter`` the run knows of is flushed, and the active W&B run is marked as preempting
  (``wandb.run.mark_preempting()``: W&B then shows the run as preempted, not crashed, and expects it back).
- A restart continues the same W&B run: unless the script chose its own, `Run` sets ``WANDB_RUN_ID`` (derived from
  the checkpoint root, so every attempt of the run gets the same) and ``WANDB_RESUME=allow`` before the script's
  ``wandb.init`` reads them. TensorBoard continues at the resumed step: give ``purge_step=run.start_step`` to a
  ``SummaryWriter`` of your own; the framework integrations do it for the framework's writer. Events logged after
  the checkpoint by the attempt that was stopped are then hidden, not shown twice.

Writers are found where they live: given to `Run` (``trackers=[writer]``), or held by a framework's logging
callbacks (the integrations hand them over). W&B needs nothing: its run is global.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("preemptible")

WANDB_ID_ENV = "WANDB_RUN_ID"
WANDB_RESUME_ENV = "WANDB_RESUME"


def wandb_run_id(root: str) -> str:
    """The W&B run id of every attempt of the run kept under ``root`` (stable across restarts and machines that
    name the root alike)."""
    return "pre-" + hashlib.sha256(root.encode()).hexdigest()[:16]


def continue_wandb(root: str) -> str | None:
    """Set ``WANDB_RUN_ID``/``WANDB_RESUME`` for this run unless the script or its launcher set them; returns the id
    in force (None when W&B is not installed: nothing to do)."""
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        return None
    if WANDB_ID_ENV not in os.environ:
        os.environ[WANDB_ID_ENV] = wandb_run_id(root)
        os.environ.setdefault(WANDB_RESUME_ENV, "allow")
    return os.environ[WANDB_ID_ENV]


class Trackers:
    """The trackers of one run: writers to flush, and W&B (found when the notice comes)."""

    def __init__(self, writers: Iterable[Any] = ()) -> None:
        self.writers: list[Any] = []
        for w in writers:
            self.add(w)

    def add(self, writer: Any) -> None:
        """A TensorBoard ``SummaryWriter`` (or anything with ``flush()``) to flush on a notice."""
        if not callable(getattr(writer, "flush", None)):
            raise TypeError(f"expected a tracker with flush() (a SummaryWriter); found {type(writer).__name__}")
        if all(writer is not w for w in self.writers):
            self.writers.append(writer)

    def on_notice(self) -> dict[str, Any]:
        """Flush every writer and mark the W&B run preempting; never raises (the checkpoint is already safe).
        Returns what was done, for the journal."""
        done: dict[str, Any] = {"flushed": 0}
        for writer in self.writers:
            try:
                writer.flush()
                done["flushed"] += 1
            except Exception as e:  # a tracker's failure must not turn a committed stop into a crash
                log.warning("could not flush %s on the notice: %s", type(writer).__name__, e)
        wandb = sys.modules.get("wandb")
        run = getattr(wandb, "run", None) if wandb is not None else None
        if run is not None:
            try:
                run.mark_preempting()
                done["wandb"] = {"id": run.id, "marked_preempting": True}
            except Exception as e:
                log.warning("could not mark the W&B run preempting: %s", e)
                done["wandb"] = {"id": getattr(run, "id", None), "marked_preempting": False, "error": str(e)}
        return done


def purge_from(writer: Any, step: int) -> None:
    """Tell TensorBoard that this writer's run restarts at ``step``: events at ``step`` and later from before the
    restart are hidden (what ``SummaryWriter(purge_step=step)`` does when the writer is made; this is for a writer a
    framework has already made)."""
    import importlib

    proto: Any = importlib.import_module("tensorboard.compat.proto.event_pb2")  # untyped
    file_writer = writer._get_file_writer()
    file_writer.add_event(proto.Event(step=step, session_log=proto.SessionLog(status=proto.SessionLog.START)))
    file_writer.flush()
