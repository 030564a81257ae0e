"""Was this run preempted, and what did it lose? A verdict from logs, an exit code and the run's journal.

Every recognised line becomes `Evidence`: the verdict it points to, how strongly (``strong``: it names the
cause, e.g. SLURM's "DUE TO PREEMPTION"; ``weak``: a symptom, e.g. exit code 143, which says SIGTERM but not who
sent it), and where it was found. The verdict is the highest-ranked verdict among the strong evidence, else
among the weak, in the order of `VERDICTS` (a preemption explains a SIGTERM, an OOM explains a SIGKILL, ...).

Lines inside a Python traceback count only as the crash they report: a traceback that mentions "preemption"
is a crash, not a preemption. torchrun's summary counts only its "Root Cause" entry as the cause: the other
ranks' ``exitcode: -15`` there is torchrun tearing them down after the first failure.
"""

from __future__ import annotations

import functools
import io
import os
import re
import signal
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from preemptible.incident import Event, actor, initiating, when
from preemptible.logrules import COLLATERAL_RULES, EXIT_RULES, PEER_LOST, RULES, needles
from preemptible.remedy import for_platforms, remedy

VERDICTS = (
    "preempted", "time-limit", "oom", "collective-timeout", "crashed", "terminated", "killed", "completed", "unknown"
)  # fmt: skip
"""In order of precedence: the first with evidence wins."""


@dataclass(frozen=True)
class Evidence:
    verdict: str
    strength: str  # "strong" names the cause; "weak" is a symptom; "hint" counts only when nothing else does
    why: str  # what the line means, in words
    where: str  # file name, "exit code" or "journal"
    line: int | None  # 1-based line number in ``where`` (None for the exit code)
    text: str  # the line itself (trimmed)
    platform: str | None = None  # slurm, k8s, aws, gcp, azure, torchrun, docker, kernel, preemptible
    actor: str | None = None  # who wrote the line: "rank 3", "node gpu-q-13" (see `incident.actor`)
    time: str | None = None  # the line's timestamp, else the last one before it in the same log (`incident.when`)
    reported: bool = False  # an exit code or signal as a launcher, shell or scheduler reports it, not the process


_EXIT_SIGNALS = {int(s): s.name for s in signal.Signals}
_TRACEBACK_START = re.compile(r"Traceback \(most recent call last\):")
_BARE_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*\.)?([A-Z]\w*)?(Error|Exception): \S")
_CHAINED = re.compile(r"(During handling of the above exception|The above exception was the direct cause)")
_EXCEPTION_LINE = re.compile(
    r"^(\[[^\]]*\]:?\s*)?([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure|Warning)\b|[A-Za-z_][\w.]*Error)(:.*)?$"
)
_NOT_A_CRASH = ("SignalException", "KeyboardInterrupt", "SystemExit", "ChildFailedError")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\)")
_FAILURES = re.compile(r"^\s*Failures:")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
# kubectl describe pod ("Exit Code:    137"), docker ps / compose ("Exited (137) 2 minutes ago", "exited with code 137")
# mpirun: "The first process to do so was:" / "Process name: [[50371,1],0]" / "Exit code:    1"
_MPI_FIRST = re.compile(r"^\s*Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_MPI_EXIT = re.compile(r"^\s*Exit code:\s*(-?\d+)\s*$")
_STATUS_LINE = re.compile(r"^\s*Exit Code:\s*(\d+)\s*$|\bExited \((\d+)\)|\bexited with code (\d+)\b")


def _strip_prefix(line: str) -> str:
    """``[rank0]: ...`` / ``[default0]:...`` (torchrun), ``[1,0]<stderr>:`` (mpirun) and ``0: ...`` (srun --label)
    prefixes."""
    return re.sub(r"^((\[[^\]]*\](<std(out|err)>)?:)+\s?|\d+: )", "", line).rstrip()


_RULES = [(rule, rule.needles) for rule in RULES]
_EXITS = [(rule, needles(rule.pattern)) for rule in EXIT_RULES]
_COLLATERAL = [(rule, rule.needles) for rule in COLLATERAL_RULES]


_NEEDLES = sorted({n for _, found_in in _RULES + _EXITS + _COLLATERAL if found_in for n in found_in})


def _present(line: str) -> frozenset[str]:
    """The rules' needles (`logrules.needles`) that are in ``line``, lowercased: one pass for all the rules."""
    low = line.lower()
    return frozenset(n for n in _NEEDLES if n in low)


def _hit(
    pattern: re.Pattern[str], found_in: tuple[str, ...] | None, line: str, present: frozenset[str]
) -> re.Match[str] | None:
    """``pattern.search(line)``, skipped when none of its needles is ``present`` in the line."""
    if found_in is not None and present.isdisjoint(found_in):
        return None
    return pattern.search(line)


def _oom(line: str, present: frozenset[str]) -> bool:
    return any(r.verdict == "oom" and _hit(r.pattern, n, line, present) for r, n in _RULES)


def _collective_timeout(line: str, present: frozenset[str]) -> bool:
    return any(r.verdict == "collective-timeout" and _hit(r.pattern, n, line, present) for r, n in _RULES)


_TIMESTAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")


class TimeWindow:
    """The earliest and latest timestamps (``2026-11-30T19:05:23``, ``2026-11-30 19:05:23``) in the logs read,
    taken as UTC when they carry no zone: which attempt of a run the logs belong to."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None

    def see(self, line: str) -> None:
        match = _TIMESTAMP.search(line[:80])
        if match is None:
            return
        try:
            y, mo, d, h, mi, sec = (int(g) for g in match.groups())
            t = datetime(y, mo, d, h, mi, sec, tzinfo=timezone.utc).timestamp()
        except ValueError:
            return
        self.first = t if self.first is None else min(self.first, t)
        self.last = t if self.last is None else max(self.last, t)


_SIGNAL_NAMES = {"Killed": "SIGKILL", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Aborted": "SIGABRT"}
_OOM_KILLED_REASON = re.compile(r"\bReason:\s*OOMKilled\b")


def _exit_rule(line: str, where: str, number: int, text: str, present: frozenset[str]) -> Evidence | None:
    """Evidence from a line that reports how a process ended (`logrules.EXIT_RULES`); ``present``: its needles."""
    for rule, found_in in _EXITS:
        m = _hit(rule.pattern, found_in, line, present)
        if m is None:
            continue
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        if "code" in groups:
            code = int(groups["code"])
        elif "signum" in groups:
            code = -int(groups["signum"])
        else:
            name = groups.get("signame") or groups.get("signame2") or ""
            name = _SIGNAL_NAMES.get(name.strip(), name.strip())
            try:
                code = -int(signal.Signals[name])
            except KeyError:
                continue
        return _exit_evidence(code, rule.what, where, number, text, strong=rule.strong)
    return None


def scan_lines(lines: Iterable[str], where: str, window: TimeWindow | None = None) -> list[Evidence]:
    """Evidence from one log's lines (and their time range into ``window``)."""
    found: list[Evidence] = []
    in_traceback = False
    prev_indented = False  # the previous line was a traceback frame or source line (an excerpt may start mid-traceback)
    oom_reason_at: int | None = None  # index in ``found`` of a "Reason: OOMKilled" in a container status block
    block = ""  # "" | "root" | "failures": where we are in torchrun's error summary
    traceback_at: tuple[int, str] | None = None  # where the traceback being read started
    who: str | None = None
    stamp: str | None = None
    mpi_first: int | None = None  # mpirun named the first process to fail: its exit code follows
    mark = 0  # found[mark:] came from the previous line: tag them with its writer and time
    numbered = lines.numbered() if isinstance(lines, LogInput) else enumerate(lines, start=1)
    last = 0
    kept = _Kept()
    for number, raw in numbered:
        kept.tag(found, mark, who, stamp)
        mark = len(found)
        if oom_reason_at is not None and oom_reason_at >= mark:
            oom_reason_at = None  # (its evidence was past the cap)
        if number <= last:
            continue  # a chunk's first line given again as the line before a keyword's
        if number != last + 1:
            prev_indented = False  # lines were skipped (no rule could act on them): none of them is known
        last = number
        who, stamp = actor(raw), when(raw) or stamp
        if window is not None:
            window.see(raw)
        line = _strip_prefix(raw)
        text = raw.strip()[:400]
        was_indented, prev_indented = prev_indented, line[:1] in (" ", "\t") and bool(line.strip())
        if _TRACEBACK_START.search(line) and line.rstrip().endswith("last):"):
            in_traceback, traceback_at = (
                True,
                (number, text),
            )  # (a traceback flattened into one line, "...last):\n  File ...", is read as text)
            continue
        if not in_traceback and was_indented and _EXCEPTION_LINE.match(line):
            in_traceback = True  # the exception line of a traceback whose start was cut off
        match = None
        if in_traceback:
            if line[:1] in (" ", "\t") or not line.strip() or _CHAINED.match(line):
                continue  # frames, source lines, carets, "During handling of ..." between chained tracebacks
            in_traceback = False
            match = _EXCEPTION_LINE.match(line)  # else: neither a frame nor the exception; read it as any other line
            if match is None:
                found.append(_cut_traceback(traceback_at, where))
        if match is not None:
            present = _present(line)
            ended = _exit_rule(line, where, number, text, present)
            if ended is not None:
                found.append(ended)  # a worker's death reported as an exception: the signal or code is the cause
                continue
            name = match.group(2).rsplit(".", 1)[-1]
            if name == "KeyboardInterrupt":
                found.append(Evidence("terminated", "weak", "interrupted (SIGINT / Ctrl-C)", where, number, text))
                continue
            if name in _NOT_A_CRASH and name != "SignalException":
                continue  # torchrun's wrapper error: its summary below names the cause
            if _collective_timeout(line, present):
                why = f"unhandled {name}: a collective timed out (a rank stopped answering)"
                found.append(Evidence("collective-timeout", "strong", why, where, number, text, "torchrun"))
                continue
            if name != "SignalException" and not _oom(line, present):
                if any(r.why == PEER_LOST and _hit(r.pattern, n, line, present) for r, n in _COLLATERAL):
                    why = f"unhandled {name}: {PEER_LOST}"  # a crash, but one that another rank's end caused
                    found.append(Evidence("crashed", "weak", why, where, number, text, "torchrun"))
                else:
                    found.append(Evidence("crashed", "strong", f"unhandled {name}", where, number, text))
                continue  # nothing in a crash's message counts as other evidence ("... preemption ...")
        if _ROOT_CAUSE.search(line):
            block = "root"
            continue
        if _FAILURES.search(line):
            block = "failures"
            continue
        mpi = _MPI_FIRST.search(line)
        if mpi:
            mpi_first = int(mpi.group(1))
            continue
        mpi_exit = _MPI_EXIT.match(line) if mpi_first is not None else None
        if mpi_exit:
            ended = _exit_evidence(int(mpi_exit.group(1)), "mpirun: the first process to fail, exit code", where,
                                   number, text, strong=True)  # fmt: skip
            found.append(replace(ended, actor=f"rank {mpi_first}"))
            mpi_first = None
            continue
        status = _STATUS_LINE.search(line)
        if status:
            code = int(next(g for g in status.groups() if g is not None))
            if code == 0 and oom_reason_at is not None:
                # a container that exited 0 with reason OOMKilled: a process inside its cgroup was OOM-killed, but the
                # main process finished; the exit code is what happened to the run
                found[oom_reason_at] = replace(
                    found[oom_reason_at], strength="weak", why="OOMKilled reason, but the main process exited 0"
                )
                found.append(Evidence("completed", "strong", "container exit code 0: the main process finished",
                                      where, number, text, "k8s", reported=True))  # fmt: skip
            else:
                found.append(_exit_evidence(code, "container exit code", where, number, text))
            oom_reason_at = None
            continue
        if _OOM_KILLED_REASON.search(line):
            oom_reason_at = len(found)  # the rule below records it; an "Exit Code: 0" after it downgrades it
        if re.fullmatch(r"\s*={10,}\s*", line):
            block = ""  # the summary's frame
            continue
        if block == "failures":
            continue  # the other ranks' codes and signals: torchrun's own teardown after the first failure
        code_match = _EXITCODE.search(line)
        if code_match and block == "root":
            code = int(code_match.group(1))
            found.append(_exit_evidence(code, "torchrun root cause: exitcode", where, number, text, strong=True))
            continue
        present = _present(line)
        ended = _exit_rule(line, where, number, text, present) if present else None
        if ended is not None:
            found.append(ended)
            continue
        for rule, found_in in _RULES if present else ():
            if _hit(rule.pattern, found_in, line, present):
                found.append(Evidence(rule.verdict, rule.strength, rule.why, where, number, text, rule.platform))
                break
        else:
            collateral = next((r for r, n in _COLLATERAL if _hit(r.pattern, n, line, present)), None)
            if collateral is not None:
                found.append(Evidence(collateral.verdict, "collateral", collateral.why, where, number, text,
                                      collateral.platform))  # fmt: skip
            elif _BARE_EXCEPTION.match(line):
                why = "an exception reported at the top level (its traceback is not in the log)"
                found.append(Evidence("crashed", "weak", why, where, number, text))
    if in_traceback:
        found.append(_cut_traceback(traceback_at, where))
    kept.tag(found, mark, who, stamp)
    found += kept.beyond.values()
    if window is not None and isinstance(lines, LogInput):
        for edge in lines.edges:
            window.see(edge)
    first_stamp = next((e.time for e in found if e.time is not None), None)
    if first_stamp is not None:  # lines before the log's first timestamp happened at or before it
        found = [replace(e, time=first_stamp) if e.time is None else e for e in found]
    return found


MAX_EVIDENCE_PER_KIND = 50
"""Evidence kept per (verdict, strength, meaning) from one log: the first 50 and the last; a log that repeats a
line a million times is still read in bounded memory."""


class _Kept:
    """The evidence of one log, each kind capped at `MAX_EVIDENCE_PER_KIND` (and its last)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}
        self.beyond: dict[tuple[str, str, str], Evidence] = {}  # the last of each kind past the cap

    def tag(self, found: list[Evidence], start: int, who: str | None, stamp: str | None) -> None:
        """Tag ``found[start:]`` (the evidence of one line) with its writer and time, and cap each kind."""
        new = found[start:]
        del found[start:]
        for item in new:
            e = replace(item, actor=who, time=stamp) if item.actor is None and item.time is None else item
            kind = (e.verdict, e.strength, e.why)
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if self.counts[kind] <= MAX_EVIDENCE_PER_KIND:
                found.append(e)
            else:
                self.beyond[kind] = e


def _cut_traceback(at: tuple[int, str] | None, where: str) -> Evidence:
    number, text = at if at is not None else (None, "")
    why = "a traceback the log cuts off before its exception (the process may have crashed)"
    return Evidence("crashed", "hint", why, where, number, text)


def _exit_evidence(code: int, what: str, where: str, line: int | None, text: str, *, strong: bool = False) -> Evidence:
    """Evidence from how a process ended (``code``: an exit code, or minus a signal number), as reported."""
    return replace(_ended(code, what, where, line, text, strong=strong), reported=True)


def _ended(code: int, what: str, where: str, line: int | None, text: str, *, strong: bool = False) -> Evidence:
    signum = -code if code < 0 else code - 128 if code > 128 else None
    name = _EXIT_SIGNALS.get(signum) if signum is not None else None
    strength = "strong" if strong else "weak"
    if code == 0:
        return Evidence("completed", "weak", f"{what} 0: a clean exit", where, line, text)
    if name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
        return Evidence(
            "terminated",
            strength,
            f"{what} {code}: died of {name}; the code does not say who sent it",
            where,
            line,
            text,
        )
    if name == "SIGKILL":
        return Evidence(
            "killed",
            strength,
            f"{what} {code}: SIGKILL (an OOM kill, a grace period that ran out, or kill -9)",
            where,
            line,
            text,
        )
    if name in ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"):
        return Evidence("crashed", "strong", f"{what} {code}: died of {name}", where, line, text)
    if code == 124:
        return Evidence("time-limit", "weak", f"{what} 124: timeout(1) ran out", where, line, text)
    return Evidence("crashed", strength, f"{what} {code}: the program reported a failure", where, line, text)


# the journal -------------------------------------------------------------------------------------------------
@dataclass
class JournalFacts:
    """What one process start (an attempt) of a run wrote in its journal (rank 0)."""

    file: str | None = None
    notice: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None
    done: bool = False
    last_step: int | None = None
    committed_after_notice: int | None = None
    last_committed: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    attempt: int | None = None
    attempts: int = 0
    chosen_by: str = ""


def _attempts(records: list[dict[str, Any]]) -> list[tuple[int, str, list[dict[str, Any]]]]:
    """Rank 0's journal files in start order, each one attempt: (number, file, events). The number is the one the
    start event recorded; journals older than attempt numbers count by file order."""
    files = sorted({str(r["file"]) for r in records})
    out = []
    for i, name in enumerate(files, start=1):
        events = [r for r in records if r["file"] == name]
        start = next((e for e in events if e.get("event") == "start"), {})
        number = start.get("attempt")
        out.append((number if isinstance(number, int) and not isinstance(number, bool) else i, name, events))
    return out


def _span(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    times = []
    for e in events:
        try:
            times.append(datetime.fromisoformat(str(e["t"]).replace("Z", "+00:00")).timestamp())
        except (KeyError, ValueError):
            continue
    return (min(times), max(times)) if times else None


def _choose(
    attempts: list[tuple[int, str, list[dict[str, Any]]]], attempt: int | str | None, window: TimeWindow | None
) -> tuple[int, str]:
    """Which attempt to judge (its index in ``attempts``) and why."""
    if isinstance(attempt, int):
        for i, (number, _, _) in enumerate(attempts):
            if number == attempt:
                return i, f"--attempt {attempt}"
        raise ValueError(
            f"expected --attempt between 1 and {len(attempts)} (the run's process starts in its journal); "
            f"found {attempt}"
        )
    last = len(attempts) - 1
    if attempt == "last" or window is None or window.first is None or window.last is None:
        return last, "--attempt last" if attempt == "last" else "the last (the logs carry no timestamps)"
    spans = [_span(events) for _, _, events in attempts]
    best, overlap = None, -1.0
    for i, span in enumerate(spans):
        if span is None:
            continue
        # an attempt lasts from its first event until a minute after its last (a killed process journals no end),
        # but not into the next attempt; log timestamps have whole seconds
        following = next((x[0] for x in spans[i + 1 :] if x is not None), None)
        end = span[1] + 60.0 if following is None else min(span[1] + 60.0, following)
        lo, hi = max(span[0], window.first), min(end, window.last + 1.0)
        if hi > lo and hi - lo >= overlap:
            best, overlap = i, hi - lo
    if best is None:
        return last, "the last (the logs' times match no attempt)"
    return best, "the logs' time range"


def journal_facts(root: str, *, attempt: int | str | None = None, window: TimeWindow | None = None) -> JournalFacts:
    """The facts of one attempt of the run under ``root``: ``attempt`` (a number, or "last"), else the one whose
    time range the logs' timestamps fall in, else the last.

    Raises:
        ValueError: ``attempt`` names no attempt in the journal.
    """
    from preemptible import journal as journal_mod
    from preemptible.checkpoint import Checkpointer
    from preemptible.store.io import storage_for

    storage = storage_for(root)
    records = [r for r in journal_mod.read(storage) if r.get("rank", 0) == 0]
    facts = JournalFacts()
    ck = Checkpointer(root, storage=storage)
    committed = [c.step for c in ck.checkpoints()]
    facts.last_committed = max(committed) if committed else None
    if not records:
        if isinstance(attempt, int):
            raise ValueError(f"expected --attempt {attempt} in the journal under {root}; found no journal")
        return facts
    attempts = _attempts(records)
    index, facts.chosen_by = _choose(attempts, attempt, window)
    facts.attempt, facts.file, events = attempts[index]
    facts.attempts = len(attempts)
    facts.events = events
    steps = [int(e["step"]) for e in events if isinstance(e.get("step"), int)]
    facts.last_step = max(steps) if steps else None
    mine: list[int] = []
    for e in events:
        kind = e.get("event")
        if kind in ("resume", "save_committed") and isinstance(e.get("step"), int):
            mine.append(int(e["step"]))
        if kind == "notice" and facts.notice is None:
            facts.notice = e
        elif kind == "save_committed" and facts.notice is not None:
            facts.committed_after_notice = int(e["step"])
        elif kind == "exit":
            facts.exit = e
        elif kind == "done":
            facts.done = True
    if index != len(attempts) - 1:  # an earlier attempt: what it had saved by its end, not what later ones did
        facts.last_committed = max(mine) if mine else None
    return facts


def _journal_evidence(facts: JournalFacts) -> list[Evidence]:
    out: list[Evidence] = []
    where = f"journal {facts.file}"
    if facts.notice is not None:
        n = facts.notice
        source = str(n.get("source"))
        detail = n.get("detail") or "no detail"
        text = f"{source} notice ({n.get('kind')}, {detail}) at step {n.get('step')}, t={n.get('t')}"
        if source in ("aws", "gcp", "azure"):
            out.append(
                Evidence(
                    "preempted",
                    "strong",
                    f"the {source} metadata service announced the reclaim",
                    where,
                    None,
                    text,
                    source,
                )
            )
        else:
            out.append(
                Evidence(
                    "terminated",
                    "strong",
                    f"a {n.get('detail') or source} reached the run; who sent it is not recorded",
                    where,
                    None,
                    text,
                    "preemptible",
                )
            )
    if facts.done:
        out.append(
            Evidence("completed", "strong", "the run finished all its steps (DONE)", where, None, "done", "preemptible")
        )
    if facts.exit is not None and facts.exit.get("reason") == "notice":
        saved = facts.exit.get("saved")
        out.append(
            Evidence(
                "terminated",
                "weak",
                "the run exited on purpose after the notice",
                where,
                None,
                f"exit at step {facts.exit.get('step')} with code {facts.exit.get('code')}, "
                f"{'checkpoint saved' if saved else 'no checkpoint saved'}, t={facts.exit.get('t')}",
                "preemptible",
            )
        )
    return out


# the verdict -------------------------------------------------------------------------------------------------
CONFIRM: dict[str, list[str]] = {
    "preempted": [
        "SLURM: sacct -j $JOBID -o JobID,State,ExitCode,Reason (State PREEMPTED)",
        "AWS: EventBridge/CloudTrail for the instance id: 'EC2 Spot Instance Interruption Warning', BidEvictedEvent",
        "GCP: gcloud compute operations list --filter='operationType=compute.instances.preempted'",
        "Azure: the VM's Activity Log (Spot eviction) or Scheduled Events history",
        "Kubernetes: kubectl get events --field-selector involvedObject.name=$POD; kubectl describe node",
    ],
    "time-limit": [
        "SLURM: sacct -j $JOBID -o JobID,State,Elapsed,Timelimit (State TIMEOUT); save ahead with --signal=USR1@120",
        "Kubernetes: kubectl describe job (DeadlineExceeded, activeDeadlineSeconds)",
    ],
    "oom": [
        "dmesg -T | grep -i -E 'out of memory|oom-kill' on the node",
        "SLURM: sacct -j $JOBID -o JobID,State,MaxRSS,ReqMem (State OUT_OF_MEMORY)",
        "Kubernetes: kubectl describe pod $POD (Last State: Terminated, Reason: OOMKilled) vs resources.limits.memory",
        "GPU: the traceback's 'Tried to allocate' figure against torch.cuda.max_memory_allocated()",
    ],
    "collective-timeout": [
        "which rank stopped answering: the watchdog lines name the collective's SeqNum on every rank; the rank whose "
        "last completed SeqNum is lowest (or that logged nothing) is the one to look at",
        "that rank's own log, before the timeout: a hang (py-spy dump --pid), a crash, or a node that went away",
        "rerun with TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 (flight recorder), NCCL_DEBUG=INFO",
    ],
    "crashed": [
        "read the first traceback (the root cause; later ones are usually consequences)",
        "torchrun: the 'Root Cause (first observed failure)' block names the rank and its error file",
        "NCCL: rerun with NCCL_DEBUG=INFO TORCH_NCCL_ASYNC_ERROR_HANDLING=1 to see the failing collective",
    ],
    "terminated": [
        "who sent the signal: the scheduler's accounting (sacct Reason; kubectl get events; docker events)",
        "SLURM: sacct -j $JOBID -o JobID,State,ExitCode (CANCELLED by <uid> means scancel)",
        "Kubernetes: kubectl get events for Killing/Evicted/Preempted, and the node's events (a drain or a shutdown)",
        "on spot machines, the cloud's interruption record for the instance (a SIGTERM there is often a reclaim)",
    ],
    "killed": [
        "OOM first: dmesg -T | grep -i oom (a SIGKILL without an OOM record is a grace period that ran out or kill -9)",
        "the grace period: terminationGracePeriodSeconds, SLURM KillWait, docker stop -t, torchrun's shutdown timeout",
        "whether a SIGTERM came before it in the logs (then the process did not exit in time)",
    ],
    "completed": ["the journal's done event / DONE.json in the checkpoint root; the final step in the logs"],
    "unknown": [
        "pass the scheduler's log (slurm-$JOBID.out, kubectl logs --previous), the exit code (--exit-code) and --root",
    ],
}


@dataclass
class Diagnosis:
    verdict: str
    summary: str
    evidence: list[Evidence]
    exit_code: int | None
    checkpoint: dict[str, Any]
    steps_lost: int | None
    steps_lost_exact: bool
    confirm: list[str]
    notes: list[str] = field(default_factory=list)
    """What was left out of the inputs (a log over `MAX_LOG_BYTES`)."""
    initiating: Event | None = None
    """With logs of several ranks or nodes: which failed first, and how (see `incident.initiating`)."""
    collateral: list[Event] = field(default_factory=list)
    """What the other ranks or nodes then logged because of it, in time order where timestamps allow."""
    fix: list[str] = field(default_factory=list)
    """What to change for this verdict (see `remedy`)."""
    verify: list[str] = field(default_factory=list)
    """The commands that show the fix worked."""

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["evidence"] = [asdict(e) for e in self.evidence]
        return doc

    def render(self) -> str:
        lines = [f"verdict: {self.verdict}  ({self.summary})", "", "evidence:"]
        if not self.evidence:
            lines.append("  none recognised")
        for e in self.evidence:
            at = f"{e.where}:{e.line}" if e.line is not None else e.where
            lines.append(f"  [{e.strength:6s} {e.verdict}] {at}: {e.text}")
            lines.append(f"      {e.why}")
        lines += ["", "checkpoint:"]
        ck = self.checkpoint
        if not ck:
            lines.append("  no journal given (--root): cannot tell what was saved or lost")
        elif ck.get("journal") is None and ck.get("last_committed") is None:
            lines.append(
                f"  nothing under {ck.get('root')}: expected journal/*.jsonl and step-*/ written by preemptible.Run; "
                "is this the run's checkpoint root?"
            )
        else:
            if ck.get("attempts"):
                lines.append(f"  attempt {ck['attempt']} of {ck['attempts']} (chosen by {ck['attempt_chosen_by']})")
            lines.append(f"  newest committed step: {ck.get('last_committed')}")
            if ck.get("notice_step") is not None:
                after = ck.get("committed_after_notice")
                lines.append(
                    f"  notice at step {ck['notice_step']}: "
                    + (
                        f"checkpoint committed at step {after}"
                        if after is not None
                        else "no checkpoint committed after it"
                    )
                )
            if self.steps_lost is not None:
                qual = "" if self.steps_lost_exact else "at least "
                lines.append(f"  steps lost: {qual}{self.steps_lost} (last step reached {ck.get('last_step')})")
        if self.initiating is not None:
            lines += ["", "initiating:", "  " + _event_line(self.initiating)]
            if self.collateral:
                lines += ["", f"collateral ({len(self.collateral)}):"] + [
                    "  " + _event_line(c) for c in self.collateral
                ]
        lines += ["", "how to confirm:"] + [f"  - {c}" for c in self.confirm]
        lines += ["", "fix:"] + [f"  - {c}" for c in self.fix]
        if self.verify:
            lines += ["", "verify with:"] + [f"  $ {c}" for c in self.verify]
        if self.notes:
            lines += ["", "not read:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(lines)


def _event_line(e: Event) -> str:
    at = f" at {e.time}" if e.time else ""
    where = f" ({e.log}:{e.line})" if e.line is not None else ""
    text = f"\n      {e.evidence[:200]}" if e.evidence else ""
    return f"{e.who}{at}: {e.verdict}: {e.why}{where}{text}"


def diagnose(
    logs: Iterable[tuple[str, Iterable[str]] | LogInput] = (),
    *,
    exit_code: int | None = None,
    root: str | None = None,
    attempt: int | str | None = None,
) -> Diagnosis:
    """The verdict for ``logs`` (pairs of a name and its lines), an exit code and a checkpoint root. ``attempt``:
    which process start of the run to judge (a number, or "last"); default: the one the logs' timestamps fall in,
    else the last.

    Raises:
        ValueError: ``attempt`` names no attempt in the journal.
    """
    evidence: list[Evidence] = []
    notes: list[str] = []
    window = TimeWindow()
    for log_input in logs:
        if isinstance(log_input, LogInput):
            evidence += scan_lines(log_input, log_input.name, window)
            if log_input.note is not None:
                notes.append(log_input.note)
        else:
            name, lines = log_input
            evidence += scan_lines(lines, name, window)
    facts = journal_facts(root, attempt=attempt, window=window) if root is not None else None
    if facts is not None:
        evidence += _journal_evidence(facts)
    if exit_code is not None:
        evidence.append(_exit_evidence(exit_code, "exit code", "exit code", None, str(exit_code)))
    verdict = _decide(evidence)
    first, collateral = initiating(evidence, VERDICTS, prefer=verdict if verdict in _EXPLAINS else None)
    if first is not None and first.verdict != "collective-timeout" and verdict not in _EXPLAINS:
        verdict = first.verdict  # several ranks or nodes: what happened first, not what ranks highest
    deciding = [e for e in evidence if e.verdict == verdict and e.strength != "collateral"]
    strongest = next((e for e in deciding if e.strength == "strong"), deciding[0] if deciding else None)
    summary = strongest.why if strongest is not None else "no recognised evidence"
    if first is not None and first.who == "unknown":
        summary += "; every rank in these logs was waiting: the one that stopped answering is not among them"
    elif first is not None:
        summary += f"; first: {first.who}" + (f", then {len(collateral)} collateral" if collateral else "")
    if verdict == "terminated" and any(e.verdict == "killed" for e in evidence):
        summary += "; then killed after the grace period"
    checkpoint: dict[str, Any] = {}
    lost: int | None = None
    exact = False
    if facts is not None:
        checkpoint = {
            "root": root,
            "journal": facts.file,
            "last_committed": facts.last_committed,
            "notice_step": facts.notice.get("step") if facts.notice else None,
            "committed_after_notice": facts.committed_after_notice,
            "last_step": facts.last_step,
            "exit": facts.exit,
            "attempt": facts.attempt,
            "attempts": facts.attempts,
            "attempt_chosen_by": facts.chosen_by,
        }
        if facts.last_step is not None:
            base = facts.last_committed or 0
            lost = max(0, facts.last_step - base)
            exact = facts.exit is not None or facts.done  # a hard kill may have gone further than the journal saw
    platforms = {e.platform for e in evidence if e.platform}
    confirm = for_platforms(CONFIRM[verdict], platforms)
    todo = remedy(verdict, platforms, root, saved_at=facts.committed_after_notice if facts is not None else None)
    return Diagnosis(
        verdict, summary, evidence, exit_code, checkpoint, lost, exact, confirm, notes,
        initiating=first, collateral=collateral, fix=todo["fix"], verify=todo["verify"],
    )  # fmt: skip


_EXPLAINS = ("preempted", "time-limit", "oom")
"""Verdicts that explain what other ranks then logged (a SIGTERM, a SIGKILL, a timeout): with several logs, one of
these anywhere is the verdict, and the initiating event is chosen among its evidence."""


def _decide(evidence: Sequence[Evidence]) -> str:
    """The verdict: the first of `VERDICTS` among the strong evidence, else the weak, else the hints. A crash that
    only says a peer went away (`logrules.PEER_LOST`) counts only when nothing else does: the peer's end is the
    cause, and another line may name it."""
    causal = [e for e in evidence if not e.why.endswith(PEER_LOST)]
    verdict = _decide_among(causal) if causal else "unknown"
    return verdict if verdict != "unknown" else _decide_among(evidence)


def _decide_among(evidence: Sequence[Evidence]) -> str:
    for strength in ("strong", "weak", "hint"):
        present = {e.verdict for e in evidence if e.strength == strength}
        for verdict in VERDICTS:
            if verdict in present:
                if verdict == "collective-timeout" and _crash_came_first(evidence):
                    return "crashed"  # a rank crashed and its peers then waited for it: the crash is the cause
                return verdict
    return "unknown"


def _crash_came_first(evidence: Sequence[Evidence]) -> bool:
    """In one log, a crash's line before the first collective timeout's (not a signal's exit code: an aborting
    watchdog ends the process with SIGABRT after the timeout)."""
    for e in evidence:
        if e.strength != "strong" or e.line is None:
            continue
        if e.verdict == "collective-timeout":
            return False
        if e.verdict == "crashed" and not e.reported:
            return True
    return False


MAX_LOG_BYTES = 4 << 30
"""What one input may contribute: of a longer file, its last 4 GiB (how a run ended is at its end); of a stream,
its first 4 GiB."""
MAX_LINE_CHARS = 4096
"""A longer line is scanned by its first 4096 characters; the rest is skipped without being kept."""
SCAN_CHUNK = 4 << 20
"""Bytes read at a time. Memory stays a few chunks, whatever the log's length."""
EDGE_LINES = 256
"""Lines at each end of a log whose timestamps bound its time range (`TimeWindow`), whatever rules they match."""


@functools.cache
def scan_keywords() -> tuple[bytes, ...] | None:
    """Lowercase strings one of which is in every line a rule or the scanner's own structure (tracebacks,
    torchrun's summary, mpirun's report, container status) can act on; None if some rule has no needle."""
    words = {"traceback", "error", "exception", "interrupt", "exit", "failure", "root cause", "==========",
             "process name", "oomkilled", "local_rank"}  # fmt: skip
    for _, found_in in _RULES + _EXITS + _COLLATERAL:
        if found_in is None:
            return None
        words.update(found_in)
    kept: list[str] = []
    for word in sorted(words, key=len):
        if not any(k in word for k in kept):  # finding the shorter one finds this one's lines too
            kept.append(word)
    return tuple(k.encode() for k in kept)


class LogInput:
    """The lines of one log, read as a stream with bounded memory (`SCAN_CHUNK` bytes at a time, each line cut at
    `MAX_LINE_CHARS`) and bounded length (`MAX_LOG_BYTES`). ``note`` says what was left out, once it is read.

    Iterating gives every line. `numbered` gives only the lines a rule could act on (one of `scan_keywords` in
    them, found in each chunk at C speed) with the line before each, and keeps the first and last `EDGE_LINES`
    lines in ``edges`` for their timestamps: how a long log is read in seconds per gigabyte."""

    def __init__(self, name: str, stream: BinaryIO, *, limit: int = MAX_LOG_BYTES, owned: bool = True) -> None:
        self.name = name
        self._stream = stream
        self._limit = limit
        self._owned = owned
        self.note: str | None = None
        self.edges: list[str] = []

    def __iter__(self) -> Iterator[str]:
        for _, line in self._read(keywords=None):
            yield line

    def numbered(self) -> Iterator[tuple[int, str]]:
        """(1-based line number, line) of the lines any rule could match, and of the line before each."""
        return self._read(keywords=scan_keywords())

    def _read(self, keywords: tuple[bytes, ...] | None) -> Iterator[tuple[int, str]]:
        try:
            yield from self._chunks(keywords)
        finally:
            if self._owned:
                self._stream.close()

    def _start(self) -> int:
        """Seek to the last `limit` bytes of a longer regular file; the byte budget to read."""
        stream, limit = self._stream, self._limit
        try:
            mode = os.fstat(stream.fileno()).st_mode
            size = os.fstat(stream.fileno()).st_size if stat.S_ISREG(mode) else None
        except (OSError, ValueError, io.UnsupportedOperation):
            size = None
        if size is None or size <= limit:
            return limit
        stream.seek(size - limit)
        self.note = f"{self.name}: {size / 2**20:.0f} MiB; only its last {limit >> 20} MiB were read"
        return limit - len(stream.readline(limit))  # the first line is cut: start at the next whole one

    def _chunks(self, keywords: tuple[bytes, ...] | None) -> Iterator[tuple[int, str]]:
        budget = self._start()
        number = 0  # lines before ``buf``
        carry = b""  # the unfinished last line of the previous chunk (at most MAX_LINE_CHARS of it)
        skipping = False  # inside an over-long line: its rest is dropped up to the newline
        tail: list[bytes] = []
        while True:
            data = self._stream.read(min(SCAN_CHUNK, budget)) if budget > 0 else b""
            budget -= len(data)
            if skipping:
                nl = data.find(b"\n")
                if nl < 0 and data:
                    continue
                data, skipping = data[nl:] if nl >= 0 else b"", False
            buf = carry + data
            end = len(buf) if not data else buf.rfind(b"\n")  # at the end of input, the rest is a line
            if end < 0:  # no newline yet: the line goes on in the next chunk
                carry = buf
                if len(buf) > MAX_LINE_CHARS:
                    carry, skipping = buf[:MAX_LINE_CHARS], True
                continue
            carry = buf[end + 1 :]
            if len(carry) > MAX_LINE_CHARS:
                carry, skipping = carry[:MAX_LINE_CHARS], True
            if end > 0 or data:
                if not self.edges and number == 0:
                    self.edges = [_decode(b) for b in _first_lines(buf, end, EDGE_LINES)]
                before = tail[-1] if tail else None  # the last line of the previous chunk
                tail = (tail + _last_lines(buf, end, EDGE_LINES))[-EDGE_LINES:]
                yield from _pick(buf, end, number, keywords, before)
                number += buf.count(b"\n", 0, end) + 1
            if not data:
                break
        self.edges += [_decode(b) for b in tail]
        if budget <= 0 and self.note is None and self._stream.read(1):
            self.note = f"{self.name}: stopped after its first {self._limit >> 20} MiB (the rest was not read)"


def _decode(line: bytes) -> str:
    return line[:MAX_LINE_CHARS].decode("utf-8", errors="replace").rstrip("\r\n")


def _first_lines(buf: bytes, end: int, n: int) -> list[bytes]:
    lines: list[bytes] = []
    start = 0
    while start <= end and len(lines) < n:
        stop = buf.find(b"\n", start, end)
        stop = end if stop < 0 else stop
        lines.append(buf[start:stop])
        start = stop + 1
    return lines


def _last_lines(buf: bytes, end: int, n: int) -> list[bytes]:
    lines: list[bytes] = []
    stop = end
    while stop >= 0 and len(lines) < n:
        start = buf.rfind(b"\n", 0, stop) + 1
        lines.append(buf[start:stop])
        stop = start - 1
    return lines[::-1]


def _pick(
    buf: bytes, end: int, number: int, keywords: tuple[bytes, ...] | None, before: bytes | None
) -> Iterator[tuple[int, str]]:
    """The lines of ``buf[:end]`` (numbered from ``number`` + 1) that hold a keyword, with the line before each
    (``before``: the line before ``buf``); every line when ``keywords`` is None."""
    if keywords is None:
        for i, line in enumerate(buf[:end].split(b"\n"), start=number + 1):
            yield i, _decode(line)
        return
    low = buf[:end].lower()
    starts: set[int] = set()
    for word in keywords:
        at = low.find(word)
        while at >= 0:
            start = low.rfind(b"\n", 0, at) + 1
            starts.add(start)
            if start > 0:
                starts.add(low.rfind(b"\n", 0, start - 1) + 1)  # the line before: is it a traceback's frame?
            stop = low.find(b"\n", at)
            at = low.find(word, stop + 1) if stop >= 0 else -1
    del low
    if 0 in starts and before is not None:
        yield number, _decode(before)
    counted, lines = 0, number
    for start in sorted(starts):
        lines += buf.count(b"\n", counted, start)
        counted = start
        stop = buf.find(b"\n", start, end)
        yield lines + 1, _decode(buf[start : stop if stop >= 0 else end])


def read_log(path: str, *, limit: int = MAX_LOG_BYTES) -> LogInput:
    """A log file (or ``-``, standard input) as a `LogInput`. Raises OSError if it cannot be opened."""
    if path == "-":
        return LogInput("stdin", sys.stdin.buffer, limit=limit, owned=False)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a directory, expected a log file", path)
    return LogInput(Path(path).name, open(path, "rb"), limit=limit)
