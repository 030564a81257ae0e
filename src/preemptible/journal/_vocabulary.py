"""What each journal event carries: the fields its writers give it, beside the ones every event has (``t``,
``event``, ``step``, ``rank``; ``file`` added by the reader). The writers (`Journal.event` call sites) and the
readers (report, diagnose, drill, inspect) are both checked against this table (tests/unit/test_journal_vocabulary.py):
a field renamed on one side only, or an event no one writes, fails there.
"""

from __future__ import annotations

from collections.abc import Mapping

from preemptible.events import Event

COMMON = frozenset({"t", "event", "step", "rank", "file"})
"""The fields of every event (``file``: the reader's, the journal file it came from)."""

_NOTICE = frozenset({"source", "kind", "received_at", "deadline", "detail"})  # `Notice.to_json`
_PLAN = frozenset(
    {
        "state_bytes",
        "bandwidth_bytes_per_s",
        "predicted_save_s",
        "window_s",
        "margin_s",
        "fits",
        "recommendations",
        "periodic_interval_s",
        "breakdown",
        "window_source",
        "lost_work_s",
        "size",
        "compression",
        "mtbf_hours",
        "mtbf_assumed",
        "tiers",
    }
)  # `budget.Plan.to_json`

FIELDS: Mapping[Event, frozenset[str]] = {
    Event.START: frozenset({"attempt", "total", "pid", "host", "version", "world_size", "node", "sources", "argv"}),
    Event.FRESH: frozenset(),
    Event.FRESH_AFTER_CORRUPTION: frozenset({"error", "quarantined"}),
    Event.RESUME: frozenset({"seconds", "tier", "fetch_s", "bytes"}),
    Event.TIER_FALLBACK: frozenset({"tier", "why"}),
    Event.RESTORED: frozenset({"seconds", "skipped", "bytes_read", "data_bytes_read"}),
    Event.WORLD_CHANGED: frozenset({"saved_world", "world", "source_rank", "rng", "resharded", "dropped_ranks"}),
    Event.CHECKPOINT_INVALID: frozenset({"error", "stored_probe", "recomputed_probe"}),
    Event.CHECKPOINT_UNVERIFIED: frozenset({"error"}),
    Event.EPHEMERAL_ROOT: frozenset({"why"}),
    Event.SAVE_STARTED: frozenset(
        {"reason", "budget_s", "bytes", "asynchronous", "stall_s", "predicted_s", "compress", "plan", "staged_at"}
    ),
    Event.SAVE_COMMITTED: frozenset(
        {
            "reason",
            "bytes",
            "seconds",
            "predicted_s",
            "throughput_mb_s",
            "timings",
            "budget_s",
            "remaining_s",
            "compression",
            "tier",
            "replicas",
        }
    ),
    Event.SAVE_SKIPPED: frozenset({"reason", "why", "tier"}),
    Event.SAVE_FAILED: frozenset({"reason", "error", "tier"}),
    Event.SAVE_ABANDONED: frozenset({"reason", "written"}),
    Event.STATE_DIVERGED: frozenset({"keys", "ranks", "error"}),
    Event.VALIDATED: frozenset({"by"}),
    Event.ROTATED: frozenset({"deleted", "kept"}),
    Event.PLAN: frozenset({"platform"}) | _PLAN,
    Event.SAVE_ADVICE: frozenset(
        {"advice_s", "cadence_s", "save_s", "mtbf_hours", "mtbf_assumed", "bandwidth_assumed", "state_bytes"}
    ),
    Event.INEXACT_RESUME: frozenset({"what", "why"}),
    Event.LOG: frozenset(),  # and the figures given to `Run.log`, by their own names (`OPEN`)
    Event.PROGRESS: frozenset({"held", "epoch", "batches_done", "epoch_batches"}),  # held: `Run` under `drill`
    Event.ADVISORY: _NOTICE | {"action"},
    Event.NOTICE: _NOTICE | {"remaining_s", "waited_for_optimizer_steps"},
    Event.INFLIGHT: frozenset({"saving", "choice", "bytes_left", "remaining_s", "bandwidth_mb_s"}),
    Event.PRESTAGED_FLUSH: frozenset({"landed", "instead_of", "why", "steps_lost"}),
    Event.REQUEUE: frozenset({"ok", "why"}),
    Event.TRACKERS: frozenset({"flushed", "wandb"}),
    Event.EXIT: frozenset(
        {"code", "reason", "saved", "later_notices", "remaining_s", "exit_process", "node", "role", "agent_pid"}
    ),
    Event.PEER_LOST: frozenset({"missing", "how", "timeout_s", "stalled_s", "node", "code"}),
    Event.DONE: frozenset({"total", "already"}),
    Event.JOURNAL_LOST: frozenset({"lost_events", "why"}),
    Event.CADENCE: frozenset({"save_every", "source"}),
    Event.FRAMEWORK_FALLBACK: frozenset({"framework", "path", "framework_step", "preemptible_step"}),
}
"""Each journal event's own fields. `Event.RELAY` is no journal event: it tags the wrapper's log lines only."""

OPEN = frozenset({Event.LOG})
"""Events that also carry fields named by the user (``run.log(loss=...)``)."""

NOT_JOURNALED = frozenset({Event.RELAY})
"""Events of the vocabulary that only tag log lines (`events.tag`), never written to the journal."""
