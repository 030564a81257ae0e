"""Every rank's journal file, for the ranks and nodes of each attempt and how it ended across them.

An attempt is one launch of the whole job: rank 0's journal file (`journal.attempts`), and the files of every rank
that ran with it. They are matched by the attempt number each rank's ``start`` event records (rank 0's, taken by
every rank of the launch through the store), else by the nearest start time: under torchrun's elastic restart a
rank's file starts at its own time, and a replacement node's rank counts its restarts from 0, so neither a file's
name nor a restart count says which launch it belongs to. Each file is folded into a `RankEnd` as its records
stream by: memory grows with the number of files, never with their length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from preemptible.events import Event, SaveReason
from preemptible.journal import Record, parse_step

MAX_RANK_FILES = 20000
"""Journal files of other ranks than 0 folded (a few values each); beyond, they are counted under ``skipped``."""
_MAX_MISSING = 64
_MAX_TEXT = 300
_SEEN_BY = re.compile(r"\s*\(seen by rank (\d+)\)$")
"""How a rank's notice detail says another rank got the notice (`preemptible.dist`)."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else type(value).__name__
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _code(value: Any) -> int | str | None:
    return value if parse_step(value) is not None else _text(value)


@dataclass
class RankEnd:
    """One rank's process start (its journal file): the launch it belongs to, its node, how it ended."""

    rank: int
    file: str
    start: float
    number: int | None = None
    """The attempt number its ``start`` event recorded (the same on every rank of one launch)."""
    node: int | None = None
    """Its node (torchrun's group rank) as its ``start``, ``exit`` or ``peer_lost`` event says, else None."""
    code: int | str | None = None
    role: str | None = None
    reason: str | None = None
    lost: dict[str, Any] | None = None
    """Its peer watch's finding (``peer_lost``): the ranks that did not answer, how, when."""
    notice: dict[str, Any] | None = None
    """The first notice it stopped on: its source, detail, time and the rank that got it (this one, unless its
    detail says another rank saw it)."""
    done: bool = False
    committed: float | None = None
    """When it journaled the emergency save's commit (the first)."""

    @property
    def ended(self) -> str:
        """How this rank's process ended, in a word or two."""
        if self.done:
            return "finished"
        if self.lost is not None:
            return "peer lost"
        if self.reason is not None:
            return self.reason
        return "no exit event"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "exit_code": self.code,
            "role": self.role,
            "ended": self.ended,
            "journal": self.file,
        }


class Ranks:
    """Folds every rank's records into one `RankEnd` per journal file."""

    def __init__(self, skipped: dict[str, int]) -> None:
        self.files: dict[str, RankEnd] = {}
        self.skipped = skipped
        self._dropped: str | None = None  # the last file left out (records come file by file)

    def add(self, r: Record) -> None:
        if r.rank is None or r.time is None:
            return  # (counted by `journal.attempts` and the report's reader)
        end = self.files.get(r.file)
        if end is None:
            if len(self.files) >= MAX_RANK_FILES:
                if r.file != self._dropped:
                    self._dropped = r.file
                    self.skipped["rank_files"] = self.skipped.get("rank_files", 0) + 1
                return
            end = self.files[r.file] = RankEnd(rank=r.rank, file=r.file, start=r.time)
        end.start = min(end.start, r.time)
        kind = r.event
        if kind in (Event.START, Event.EXIT, Event.PEER_LOST) and parse_step(r.get("node")) is not None:
            end.node = r.get("node")
        if kind == Event.START:
            end.number = parse_step(r.get("attempt"))
        elif kind == Event.EXIT:
            end.code, end.role, end.reason = _code(r.get("code")), _text(r.get("role")), _text(r.get("reason"))
        elif kind == Event.PEER_LOST and end.lost is None:
            missing = r.get("missing")
            ranks = [m for m in missing if parse_step(m) is not None] if isinstance(missing, list) else []
            end.lost = {"missing": ranks[:_MAX_MISSING], "how": _text(r.get("how")), "t": r.time}
            end.code = _code(r.get("code"))
        elif kind == Event.NOTICE and end.notice is None:
            detail = _text(r.get("detail"))
            seen = _SEEN_BY.search(detail or "")
            end.notice = {
                "source": _text(r.get("source")),
                "detail": detail[: seen.start()] if seen and detail else detail,
                "by": int(seen.group(1)) if seen else r.rank,
                "t": r.time,
            }
        elif kind == Event.DONE:
            end.done = True
        elif kind == Event.SAVE_COMMITTED and r.get("reason") == SaveReason.EMERGENCY and end.committed is None:
            end.committed = r.time

    def assign(self, files: list[str], numbers: list[int | None], starts: list[float]) -> list[list[RankEnd]]:
        """Each attempt's ranks (attempt ``i``: rank 0's journal ``files[i]``, its attempt number and start), by
        rank: a file goes to the attempt whose number it recorded, the nearest start among those (or among all,
        for a file with no number, or a number no attempt has)."""
        out: list[list[RankEnd]] = [[] for _ in files]
        own = {name: i for i, name in enumerate(files)}
        by_number: dict[int, list[int]] = {}
        for i, number in enumerate(numbers):
            if number is not None:
                by_number.setdefault(number, []).append(i)
        everyone = list(range(len(files)))
        for end in self.files.values():
            at = own.get(end.file)
            if at is None and files:
                pool = by_number.get(end.number, everyone) if end.number is not None else everyone
                at = min(pool, key=lambda k: abs(starts[k] - end.start))
            if at is not None:
                out[at].append(end)
        for ends in out:
            ends.sort(key=lambda e: (e.rank, e.start))
        return out


def _where(rank: int, ends: list[RankEnd]) -> str:
    node = next((e.node for e in ends if e.rank == rank and e.node is not None), None)
    return f"rank {rank}" if node is None else f"node {node} (rank {rank})"


def ended(ends: list[RankEnd]) -> str | None:
    """How an attempt of several ranks ended, across them: finished; a notice on the node that got it; a peer
    lost (the ranks that did not answer, or the store that did not); else an exit reason; None when no rank
    journaled an end (killed without a word, or the machines went)."""
    if any(e.done for e in ends):
        return "finished"
    notices = [e for e in ends if e.notice is not None]
    losses = [e for e in ends if e.lost is not None]
    first_notice = min((e.notice["t"] for e in notices if e.notice), default=None)
    first_loss = min((e.lost["t"] for e in losses if e.lost), default=None)
    if first_notice is not None and (first_loss is None or first_notice <= first_loss):
        return f"notice ({notice_of(ends).get('source')}) on {_where(notice_of(ends)['by'], ends)}"
    if first_loss is not None:
        missing = sorted({m for e in losses if e.lost for m in e.lost["missing"]})
        if missing:
            gone = ", ".join(_where(m, ends) for m in missing[:8]) + (" and more" if len(missing) > 8 else "")
            finders = ", ".join(str(e.rank) for e in losses if e.lost and e.lost["missing"])
            return f"peer lost: {gone} did not answer rank {finders}"
        return f"peer lost: the job's store did not answer {_where(losses[0].rank, ends)}"
    reasons = [e.reason for e in ends if e.reason is not None]
    return reasons[0] if reasons else None


def notice_of(ends: list[RankEnd]) -> dict[str, Any]:
    """The notice an attempt stopped on, as the rank that got it journaled it (the reclaimed node's rank when
    the exits say so): source, detail, time and ``by``, that rank."""
    reclaimed = next((e.rank for e in ends if e.role == "reclaimed"), None)
    seen = [e.notice for e in ends if e.notice is not None]
    by = reclaimed if reclaimed is not None else min((n["by"] for n in seen), default=0)
    own = next((e.notice for e in ends if e.rank == by and e.notice is not None), None)
    return own or (seen[0] if seen else {"source": None, "detail": None, "by": by, "t": None})


def summary_of_ranks(ranks: list[dict[str, Any]]) -> str:
    """An attempt's ranks (`RankEnd.to_json`) grouped by how they ended: ``exit 0 (reclaimed): rank 1 (node 1);
    exit 76 (survivor): rank 0 (node 0)``."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in ranks:
        how = r["ended"] if r["ended"] == "finished" or r["exit_code"] is None else f"exit {r['exit_code']}"
        why = r["role"] or ("peer lost" if r["ended"] == "peer lost" else None)
        groups.setdefault(how + (f" ({why})" if why else ""), []).append(r)
    parts = []
    for how, group in groups.items():
        numbers = sorted({r["rank"] for r in group})
        nodes = sorted({r["node"] for r in group if r["node"] is not None})
        on = f" (node{'s' if len(nodes) > 1 else ''} {_span(nodes)})" if nodes else ""
        parts.append(f"{how}: rank{'s' if len(numbers) > 1 else ''} {_span(numbers)}{on}")
    return "; ".join(parts)


def _span(numbers: list[int]) -> str:
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}"
    shown = ", ".join(str(n) for n in numbers[:16])
    return shown + (f" and {len(numbers) - 16} more" if len(numbers) > 16 else "")
