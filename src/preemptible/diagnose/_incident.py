"""One job, several logs: which rank or node failed first, and what followed from it.

When a node of a distributed job goes away, its log says why (a preemption, an OOM kill, a crash) and every other
rank's log says only that it stopped hearing from it: a collective timed out, a connection was reset, torchrun
tore the workers down. `initiating` reads the evidence of all the logs, each line tagged with who wrote it (a
rank or node prefix, or the log it came from) and when (its timestamp, else the last one before it in the same
log), and names the initiating event and the collateral failures, in time order where timestamps allow.

Who wrote a line, from its prefix: ``[rank3]:`` (torchrun), ``preemptible INFO: [rank=3]`` (preemptible's own
lines), ``[default3]:`` (torchrun --tee, a local rank),
``[1,3]<stderr>:`` (mpirun --tag-output; horovodrun's ``[3]<stderr>:``), ``3: `` (srun --label), ``gpu-q-13: ``
(pdsh / the DeepSpeed launcher), ``host:pid:tid [dev] NCCL`` (NCCL's own lines); else from the line's text:
``[Rank 3]`` / ``[PG 0 Rank 3]`` (the c10d watchdog), ``ON host CANCELLED`` (slurmstepd), ``local_rank: 3 (pid``
(torchrun's failure report), ``Sending process 4242 closing signal`` (torchrun's teardown of a worker:
"process 4242"). Whom a line is about, where that is another rank: preemptible's peer watch (``event=peer_lost:
ranks [1] did not answer``: rank 1, where the trouble started) and a notice another rank got (``(seen by rank
1)``: rank 1's, as this one reports it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from preemptible.diagnose._evidence import Evidence
from preemptible.diagnose._rules import CONSEQUENCES, LOST_PEER

_PREFIXES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^.{0,100}?\[rank(\d+)\]:"), "rank"),
    (re.compile(r"^.{0,60}?\bpreemptible \w+: \[rank=(\d+)\] "), "rank"),  # preemptible's own lines
    (re.compile(r"^(?:.{0,40}?\d)?\[(?:\d+,)?(\d+)\]<std(?:out|err)>:"), "rank"),
    (re.compile(r"^\[default(\d+)\]:"), "local rank"),
    (re.compile(r"^(\d+): "), "rank"),
    (re.compile(r"^\s*([a-z][\w-]*\d[\w.-]*):\d+:\d+ \[\d+\] NCCL\b"), "node"),
    (re.compile(r"^slurmstepd-([\w.-]+): "), "node"),  # slurmstepd names its node after a dash
    (re.compile(r"^([a-z][\w-]*\d[\w.-]*): \S"), "node"),
)
_IN_TEXT: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\[(?:PG [^\]]*? )?Rank (\d+)\]"), "rank"),
    (re.compile(r"\bON (\S+) CANCELLED AT\b"), "node"),
    (re.compile(r"srun: error: (\S+): tasks? [\d,-]+:"), "node"),
    (re.compile(r"\blocal_rank: (\d+) \(pid"), "local rank"),
    (re.compile(r"Sending process (\d+) closing signal|Closing process (\d+) via signal"), "process"),
    (re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank"), "rank"),  # torchrun's Root Cause block
)


def actor(line: str) -> str | None:
    """Who wrote ``line`` (or whom it is about): "rank 3", "local rank 3", "node gpu-q-13", or None."""
    for pattern, kind in _PREFIXES:
        m = pattern.search(line)
        if m:
            return f"{kind} {m.group(1)}"
    for pattern, kind in _IN_TEXT:
        m = pattern.search(line[:600])
        if m:
            return f"{kind} {next(g for g in m.groups() if g is not None)}"
    return None


_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                        "Dec"), start=1)}  # fmt: skip
_ISO = re.compile(r"(\d{4})[-/](\d\d)[-/](\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")
_GLOG = re.compile(r"(?<![\w.])[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)")
_SYSLOG = re.compile(r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(\d{1,2}) (\d\d):(\d\d):(\d\d)\b")


_UNTIMED = re.compile(
    r"^(?:preemptible (?:DEBUG|INFO|WARNING|ERROR|CRITICAL): |(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:)"
)
"""Lines of a format with no time in it (preemptible's default ``preemptible LEVEL: ...``, Python's default
``LEVEL:logger:...``): a time in their text is something else's (a notice's deadline), not the line's."""


def untimed(line: str) -> bool:
    """A line of a format with no time in it (`_UNTIMED`)."""
    return _UNTIMED.match(line) is not None


def when(line: str) -> str | None:
    """The line's timestamp as ``MM-DD HH:MM:SS[.ffffff]`` (ISO 8601, glog ``E0526 03:33:41.170000``, syslog
    ``Dec 17 16:03:58``), or None. The year is left out: glog and syslog lines carry none, and times are only
    compared within one job."""
    if untimed(line):
        return None
    head = line[:200]
    m = _ISO.search(head)
    if m:
        _, mo, d, h, mi, s, frac = m.groups()
        return _stamp(int(mo), int(d), (h, mi, s), frac)
    m = _GLOG.search(head)
    if m:
        mo, d, h, mi, s, frac = m.groups()
        return _stamp(int(mo), int(d), (h, mi, s), frac)
    m = _SYSLOG.search(head)
    if m:
        mon, d, h, mi, s = m.groups()
        return _stamp(_MONTHS[mon], int(d), (h, mi, s), None)
    return None


def _stamp(month: int, day: int, hms: tuple[str, str, str], frac: str | None) -> str | None:
    h, mi, s = hms
    if not (1 <= month <= 12 and 1 <= day <= 31 and int(h) < 24 and int(mi) < 60 and int(s) < 61):
        return None
    return f"{month:02d}-{day:02d} {h}:{mi}:{s}" + (f".{frac[:6]:0<6}" if frac else "")


@dataclass(frozen=True)
class Incident:
    """An initiating or collateral event, as ``diagnose --json`` shows it."""

    rank: int | None
    node: str | None
    who: str  # "rank 3", "node gpu-q-13", "local rank 1", or the log's name
    verdict: str
    time: str | None
    evidence: str  # the line
    why: str
    log: str
    line: int | None


_STRENGTH = {"strong": 0, "weak": 1, "hint": 2, "collateral": 3}
_SEQ = re.compile(r"WorkNCCL\(SeqNum=(\d+)")
_LAST_DONE = re.compile(r"last completed NCCL work: (\d+)")


def _who(e: Evidence, several_logs: bool) -> str | None:
    if e.actor is not None and (e.strength == "collateral" or not e.actor.startswith("process ")):
        return e.actor  # ("process N" names the worker torchrun tears down, not the one a signal came from)
    return f"log {e.where}" if several_logs else None


def _event(e: Evidence, who: str, *, why: str | None = None) -> Incident:
    rank = node = None
    kind, _, name = who.rpartition(" ")
    if kind == "rank":
        rank = int(name)
    elif kind == "node":
        node = name
    return Incident(rank, node, who, e.verdict, e.time, e.text, why or e.why, e.where, e.line)


def _order(e: Evidence, precedence: Sequence[str]) -> tuple[Any, ...]:
    return (e.time is None, e.time or "", _STRENGTH.get(e.strength, 4), precedence.index(e.verdict), e.line or 0)


def initiating(
    evidence: Sequence[Evidence], precedence: Sequence[str], *, prefer: str | None = None
) -> tuple[Incident | None, list[Incident]]:
    """The initiating event and the collateral failures, when the evidence comes from two or more ranks, nodes or
    logs; else (None, []).

    The initiating event is the earliest cause (a preemption, OOM, crash, kill or signal; strongest first where
    times tie or are missing) on a rank that had not itself timed out before it: a rank that crashed while its
    peers waited is the one they waited for, and a rank that aborts after its own watchdog fired is a consequence.
    With only timeouts, it is the rank that logged none while lower and higher ranks did, else the rank whose last
    completed collective is behind its peers', else unnamed (the rank that stopped answering did not log).
    ``prefer``: a verdict that explains the others (a preemption, an OOM): the initiating event is one of its."""
    several_logs = len({e.where for e in evidence if e.line is not None}) > 1
    items = [
        e for e in evidence
        if e.line is not None and e.verdict not in ("completed", "unknown") and e.strength != "context"
        and _who(e, several_logs) is not None
    ]  # fmt: skip
    if len({_who(e, several_logs) for e in items}) < 2:
        return None, []
    timeouts = [e for e in items if e.verdict == "collective-timeout"]

    def after_own_timeout(e: Evidence) -> bool:
        own = [t for t in timeouts if _who(t, several_logs) == _who(e, several_logs)]
        if e.time is not None and all(t.time is not None for t in own):
            return any(t.time is not None and t.time <= e.time for t in own)
        return bool(own)

    causes = [
        e for e in items
        if e.strength != "collateral" and e.verdict != "collective-timeout" and not after_own_timeout(e)
        and not e.why.endswith(CONSEQUENCES)
    ]  # fmt: skip
    # a rank another rank's peer watch found gone (preemptible's peer_lost names it): where the trouble started,
    # unless something came before it
    causes += [e for e in timeouts if e.strength == "strong" and e.why.endswith(LOST_PEER)]
    if prefer is not None and any(e.verdict == prefer for e in causes):
        causes = [e for e in causes if e.verdict == prefer]
    if any(not e.reported for e in causes + timeouts):
        causes = [e for e in causes if not e.reported]  # a process's own words before a launcher's summary of it
    first: Incident | None = None
    chosen: Evidence | None = None
    if causes:
        chosen = min(causes, key=lambda e: _order(e, precedence))
        who = _who(chosen, several_logs)
        assert who is not None
        first = _event(chosen, who)
    elif timeouts:
        first, chosen = _straggler(timeouts, several_logs, precedence)
    if first is None:
        return None, []
    seen: set[tuple[str, str]] = {(first.who, first.verdict)}
    collateral: list[Incident] = []
    for e in sorted(items, key=lambda e: _order(e, precedence)):
        who = _who(e, several_logs)
        assert who is not None
        if e is chosen or (who, e.verdict) in seen:
            continue
        seen.add((who, e.verdict))
        collateral.append(_event(e, who))
    return first, collateral


def silent_log(evidence: Sequence[Evidence], names: Sequence[str]) -> tuple[Incident | None, list[Incident]]:
    """Several logs whose evidence says only that a peer went away (a reset connection, a collective that timed out),
    and one log with no word of its own end: that one is the rank the others lost (a SIGKILL, an OOM kill or a lost
    machine ends a process without a word). Else (None, [])."""
    said = {e.where for e in evidence if e.strength != "context"}
    quiet = [n for n in dict.fromkeys(names) if n not in said]

    def lost(e: Evidence) -> bool:
        return e.why.endswith(CONSEQUENCES) or e.verdict == "collective-timeout"

    mine = [e for e in evidence if e.strength in ("strong", "weak", "collateral") and e.line is not None]
    if len(quiet) != 1 or not mine or not all(lost(e) for e in mine):
        return None, []
    why = (
        "its log ends with no word of how (no error, no signal) while its peers lost it: the one they waited for; a "
        "SIGKILL, an OOM kill or a lost machine ends a process silently (read the kernel log and the scheduler's)"
    )
    first = Incident(None, None, f"log {quiet[0]}", "killed", None, "", why, quiet[0], None)
    collateral: dict[str, Incident] = {}
    for e in mine:
        collateral.setdefault(e.where, _event(e, f"log {e.where}"))
    return first, list(collateral.values())


def _straggler(
    timeouts: list[Evidence], several_logs: bool, precedence: Sequence[str]
) -> tuple[Incident, Evidence | None]:
    """With only collective timeouts: who stopped answering."""
    earliest = min(timeouts, key=lambda e: _order(e, precedence))
    ranks: dict[int, list[Evidence]] = {}
    for e in timeouts:
        who = _who(e, several_logs) or ""
        if who.startswith("rank "):
            ranks.setdefault(int(who.split()[1]), []).append(e)
    missing = [r for r in range(min(ranks, default=0), max(ranks, default=-1)) if r not in ranks]
    if len(ranks) >= 2 and len(missing) == 1:
        why = (
            f"rank {missing[0]} logged no timeout while ranks {_span(sorted(ranks))} did: it stopped answering "
            "first (read its log, or py-spy dump its process)"
        )
        return Incident(
            missing[0], None, f"rank {missing[0]}", "collective-timeout", earliest.time, "", why, "", None
        ), None
    done: dict[int, int] = {}
    for rank, lines in ranks.items():
        for e in lines:
            m = _LAST_DONE.search(e.text)
            if m:
                done[rank] = min(done.get(rank, int(m.group(1))), int(m.group(1)))
    if len(set(done.values())) > 1:
        behind = min(done, key=lambda r: done[r])
        line = next(e for e in ranks[behind] if _LAST_DONE.search(e.text))
        why = (
            f"rank {behind}'s last completed collective ({done[behind]}) is behind its peers' "
            f"({max(done.values())}): it stopped first"
        )
        return _event(line, f"rank {behind}", why=why), line
    seqs = {int(m.group(1)) for e in timeouts for m in [_SEQ.search(e.text)] if m}
    same = f" (SeqNum {seqs.pop()})" if len(seqs) == 1 else ""
    why = (
        f"every rank in these logs timed out on the same collective{same}: the rank that stopped answering did not "
        "log here; pass its log too, or find the rank missing from the timeouts"
    )
    # (no line of its own to quote: the first timeout's is a collateral one, listed with the others)
    return Incident(None, None, "unknown", "collective-timeout", earliest.time, "", why, earliest.where, None), None


def _span(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks) if len(ranks) <= 6 else f"{ranks[0]}-{ranks[-1]}"
