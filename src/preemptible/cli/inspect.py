"""``preemptible inspect ROOT``: every checkpoint under a root, its state, size and timings."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from preemptible.cli.args import existing_directory
from preemptible.store.io import Storage


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="list the checkpoints under a root: step, state, why it was saved, bytes, save and predicted seconds, "
        "the figures last logged before it",
        description="Reads manifests, state documents, tensor headers and the journal, never tensor data (fast); "
        "`preemptible verify` checks every byte.",
    )
    p.add_argument("root", type=existing_directory)
    p.add_argument("--json", action="store_true")


def collect(root: str, *, now: float | None = None) -> dict[str, Any]:
    """What `inspect` shows of ``root`` (the path as the user gave it; ``resolved``: as the checkpointer reads it).
    ``now``: the time an uncommitted leftover's removal is counted from."""
    from preemptible.checkpoint import Checkpointer
    from preemptible.store import layout

    ck = Checkpointer(root)
    now = time.time() if now is None else now
    rows: list[dict[str, Any]] = []
    for info in ck.checkpoints(include_uncommitted=True):
        m = info.manifest
        rows.append(
            {
                "step": info.step,
                "status": info.status,
                "bytes": info.bytes,
                "files": len(m.files) if m else None,
                "ranks": m.world_size if m else None,
                "save_s": info.save_s,
                "predicted_s": info.predicted_save_s,
                "created": info.created,
                "probe": m.probe if m else None,
                "why": info.refused or info.invalid or info.error or _leftover(ck, info, now),
                "restores": _restores(ck, info),
            }
        )
    reasons, figures = _from_journal(ck.storage)
    for row in rows:
        row["reason"] = reasons.get(row["step"])
        earlier = [k for k in figures if k < row["step"]]  # a figure logged during step k: checkpoints after it
        row["figures"] = figures[max(earlier)] if earlier else None
    done_path = ck.storage.join(ck.root, layout.DONE)
    done = None
    if ck.storage.exists(done_path):
        try:
            done = json.loads(ck.storage.read_bytes(done_path, 1 << 16))
        except (OSError, ValueError):
            done = {"error": "unreadable DONE.json"}
    return {"root": root, "resolved": ck.root, "checkpoints": rows, "done": done}


def _restores(ck: Any, info: Any) -> str | None:
    """Where a committed checkpoint restores: on how many ranks (its headers and state documents, not its data)."""
    from preemptible.checkpoint.shards import restorable
    from preemptible.errors import PreemptibleError

    if not info.committed or info.error is not None or info.refused is not None:
        return None
    try:
        opened = ck.reader.open(info.step)
    except (PreemptibleError, OSError, ValueError):
        return None  # `verify` says why
    return restorable(opened.shards, opened.manifest.world_size)


def _leftover(ck: Any, info: Any, now: float) -> str | None:
    """For an uncommitted leftover: what it is, and when it goes."""
    if info.committed or info.refused is not None:
        return None
    try:
        age = now - ck.storage.newest_mtime(info.path)
    except OSError:
        age = 0.0
    left = ck.stale_after_s - age
    when = (
        f"the next run's start removes it (it is older than {ck.stale_after_s / 60:.0f} min)"
        if left <= 0
        else f"a run started after {left / 60:.0f} more min removes it (younger ones may still be being written)"
    )
    return f"uncommitted leftover of a save that never committed: never restored; {when}"


_EVENT_KEYS = frozenset({"t", "event", "step", "rank", "file", "attempt"})


def _from_journal(storage: Storage) -> tuple[dict[int, str], dict[int, dict[str, Any]]]:
    """From the root's journal: why each step was saved (``save_committed``), and the figures last logged with
    ``run.log`` during each step (a later attempt's, where a step was redone)."""
    from preemptible import journal
    from preemptible.events import Event

    reasons: dict[int, str] = {}
    figures: dict[int, dict[str, Any]] = {}
    try:
        for r in journal.records(storage):
            if r.step is None:
                continue
            if r.event == Event.SAVE_COMMITTED and isinstance(r.get("reason"), str):
                reasons[r.step] = r["reason"]
            elif r.event == Event.LOG and r.rank == 0:
                figures[r.step] = {k: v for k, v in r.fields.items() if k not in _EVENT_KEYS}
    except OSError:  # no journal (a bare Checkpointer's root), or unreadable: the manifests still speak
        pass
    return reasons, figures


def _figures(figures: dict[str, Any] | None) -> str:
    if not figures:
        return ""
    return "  " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())


def run(args: argparse.Namespace) -> int:
    doc = collect(args.root)  # (shown as the user gave it: "../ckpt" stays "../ckpt")
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    rows = doc["checkpoints"]
    if not rows:
        print(f"{doc['root']}: no checkpoints")
        return 0
    print(f"{doc['root']}")
    print(
        f"  {'step':>12}  {'status':<11} {'reason':<10} {'MB':>10} {'ranks':>5} {'save s':>8} {'predicted s':>11}  "
        "created"
    )
    for r in rows:
        save = f"{r['save_s']:.2f}" if r["save_s"] is not None else "-"
        pred = f"{r['predicted_s']:.2f}" if r["predicted_s"] is not None else "-"
        ranks = str(r["ranks"]) if r["ranks"] is not None else "-"
        print(
            f"  {r['step']:>12}  {r['status']:<11} {r['reason'] or '-':<10} {r['bytes'] / 1e6:>10.1f} {ranks:>5} "
            f"{save:>8} {pred:>11}  {r['created'] or '-'}{_figures(r['figures'])}"
        )
        for line in (r["restores"], r["why"]):
            if line:
                print(f"  {'':>12}  {line}", file=sys.stdout)
    if doc["done"]:
        print(f"  finished: step {doc['done'].get('step')} at {doc['done'].get('finished')}")
    return 0
