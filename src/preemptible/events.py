"""The vocabulary of what happens to a run: one str enum read by the journal, the report file, drill and diagnose.

preemptible's own log lines about these events carry a tag, ``event=<name>`` plus the fields that decide a
verdict (``source=aws``), written by `tag`; ``diagnose`` builds its rules for them from `LOG_VERDICTS`, so a
reworded log line cannot silently stop being recognised (tests/unit/test_events.py checks both ends).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Protocol


class Event(str, Enum):
    """Journal events (the ``event`` key of each JSON line)."""

    START = "start"
    FRESH = "fresh"
    FRESH_AFTER_CORRUPTION = "fresh_after_corruption"
    RESUME = "resume"
    RESTORED = "restored"
    TIER_FALLBACK = "tier_fallback"  # the memory tier could not restore: the durable root does, and why
    WORLD_CHANGED = "world_changed"  # restored at another world size or layout (elastic resume)
    CHECKPOINT_INVALID = "checkpoint_invalid"
    CHECKPOINT_UNVERIFIED = "checkpoint_unverified"
    EPHEMERAL_ROOT = "ephemeral_root"
    SAVE_STARTED = "save_started"
    SAVE_COMMITTED = "save_committed"
    SAVE_SKIPPED = "save_skipped"
    SAVE_FAILED = "save_failed"
    SAVE_ABANDONED = "save_abandoned"
    STATE_DIVERGED = "state_diverged"
    VALIDATED = "validated"
    ROTATED = "rotated"
    PLAN = "plan"
    SAVE_ADVICE = "save_advice"  # no periodic saves, or a cadence > 2x off the Young/Daly advice (once, at start)
    INEXACT_RESUME = "inexact_resume"  # a resume that cannot be bit-identical, and why (`loaders`, `run`)
    LOG = "log"
    PROGRESS = "progress"  # the steps done, after `run.PROGRESS_QUIET_S` with no other event; or drill's aim (held)
    ADVISORY = "advisory"
    NOTICE = "notice"
    INFLIGHT = "inflight"
    PRESTAGED_FLUSH = "prestaged_flush"
    REQUEUE = "requeue"
    TRACKERS = "trackers"
    EXIT = "exit"
    PEER_LOST = (
        "peer_lost"  # a peer (its node lost without notice, or cut off) or the store did not answer (`dist.PeerWatch`)
    )
    DONE = "done"
    JOURNAL_LOST = "journal_lost"
    CADENCE = "cadence"  # an integration took the framework's checkpoint cadence for its periodic saves
    FRAMEWORK_FALLBACK = "framework_fallback"  # an integration let its framework resume from the framework's own file
    RELAY = "relay"  # preemptible run passed a cloud's notice to its command (wrapper log lines only)

    def __str__(self) -> str:
        return self.value


class ExitReason(str, Enum):
    """Why a process left its loop (``reason`` of an ``exit`` event)."""

    NOTICE = "notice"  # a notice: the emergency sequence ran (`emergency.Emergency.respond`)
    LEFT_LOOP = "left the loop"  # a ``break`` or an error in the loop's body: nothing saved

    def __str__(self) -> str:
        return self.value


class SaveReason(str, Enum):
    """Why a save was made (``reason`` in the journal)."""

    PERIODIC = "periodic"
    EMERGENCY = "emergency"
    FINAL = "final"
    MANUAL = "manual"
    ADVISORY = "advisory"
    PRESTAGED = "prestaged"
    BACKGROUND = "background"
    BEST = "best"  # Run(save_on_best=True): the boundary after a new best of the keep_best figure

    def __str__(self) -> str:
        return self.value


class Advisory(str, Enum):
    """What an advisory notice (AWS rebalance recommendation) does (`Run(on_advisory=...)`)."""

    SAVE = "save"  # an early checkpoint at the next boundary; training goes on
    STOP = "stop"  # treated as a notice
    IGNORE = "ignore"

    def __str__(self) -> str:
        return self.value


class EventSink(Protocol):
    """Where events go: the journal (and through it the report file that ``drill`` follows)."""

    def event(self, event: str, step: int | None, **fields: Any) -> Any: ...


class NullSink:
    """Drops every event (a `Checkpointer` used without a journal)."""

    def event(self, event: str, step: int | None, **fields: Any) -> None:
        return None


def tag(event: Event, **fields: Any) -> str:
    """The tag a log line about ``event`` carries: ``event=notice source=aws``."""
    return " ".join([f"event={event.value}", *(f"{k}={v}" for k, v in fields.items())])


LOG_VERDICTS: Mapping[tuple[Event, str, str], str] = {
    (Event.NOTICE, "source", "aws"): "preempted",
    (Event.NOTICE, "source", "gcp"): "preempted",
    (Event.NOTICE, "source", "azure"): "preempted",
    (Event.RELAY, "source", "aws"): "preempted",
    (Event.RELAY, "source", "gcp"): "preempted",
    (Event.RELAY, "source", "azure"): "preempted",
    (Event.NOTICE, "source", "signal"): "terminated",
}
"""What a tagged log line means to ``diagnose``: (event, field, value) -> verdict."""
