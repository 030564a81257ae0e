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

import io
import os
import re
import signal
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from preemptible.logrules import EXIT_RULES, RULES

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
_STATUS_LINE = re.compile(r"^\s*Exit Code:\s*(\d+)\s*$|\bExited \((\d+)\)|\bexited with code (\d+)\b")


def _strip_prefix(line: str) -> str:
    """``[rank0]: ...`` / ``[default0]:...`` (torchrun) and ``0: ...`` (srun --label) prefixes."""
    return re.sub(r"^(\[[^\]]*\]:\s?|\d+: )", "", line).rstrip()


def _oom(line: str) -> bool:
    return any(r.verdict == "oom" and r.pattern.search(line) for r in RULES)


def _collective_timeout(line: str) -> bool:
    return any(r.verdict == "collective-timeout" and r.pattern.search(line) for r in RULES)


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


def _exit_rule(line: str, where: str, number: int, text: str) -> Evidence | None:
    """Evidence from a line that reports how a process ended (`logrules.EXIT_RULES`)."""
    for rule in EXIT_RULES:
        m = rule.pattern.search(line)
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
    for number, raw in enumerate(lines, start=1):
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
            ended = _exit_rule(line, where, number, text)
            if ended is not None:
                found.append(ended)  # a worker's death reported as an exception: the signal or code is the cause
                continue
            name = match.group(2).rsplit(".", 1)[-1]
            if name == "KeyboardInterrupt":
                found.append(Evidence("terminated", "weak", "interrupted (SIGINT / Ctrl-C)", where, number, text))
                continue
            if name in _NOT_A_CRASH and name != "SignalException":
                continue  # torchrun's wrapper error: its summary below names the cause
            if _collective_timeout(line):
                why = f"unhandled {name}: a collective timed out (a rank stopped answering)"
                found.append(Evidence("collective-timeout", "strong", why, where, number, text, "torchrun"))
                continue
            if name != "SignalException" and not _oom(line):
                found.append(Evidence("crashed", "strong", f"unhandled {name}", where, number, text))
                continue  # nothing in a crash's message counts as other evidence ("... preemption ...")
        if _ROOT_CAUSE.search(line):
            block = "root"
            continue
        if _FAILURES.search(line):
            block = "failures"
            continue
        status = _STATUS_LINE.search(line)
        if status:
            code = int(next(g for g in status.groups() if g is not None))
            if code == 0 and oom_reason_at is not None:
                # a container that exited 0 with reason OOMKilled: a process inside its cgroup was OOM-killed, but the
                # main process finished; the exit code is what happened to the run
                found[oom_reason_at] = Evidence(
                    "oom", "weak", "OOMKilled reason, but the main process exited 0", where, found[oom_reason_at].line,
                    found[oom_reason_at].text, "k8s",
                )  # fmt: skip
                found.append(_exit_evidence(0, "container exit code", where, number, text))
                found[-1] = Evidence("completed", "strong", "container exit code 0: the main process finished",
                                     where, number, text, "k8s")  # fmt: skip
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
        ended = _exit_rule(line, where, number, text)
        if ended is not None:
            found.append(ended)
            continue
        for rule in RULES:
            if rule.pattern.search(line):
                found.append(Evidence(rule.verdict, rule.strength, rule.why, where, number, text, rule.platform))
                break
        else:
            if _BARE_EXCEPTION.match(line):
                why = "an exception reported at the top level (its traceback is not in the log)"
                found.append(Evidence("crashed", "weak", why, where, number, text))
    if in_traceback:
        found.append(_cut_traceback(traceback_at, where))
    return found


def _cut_traceback(at: tuple[int, str] | None, where: str) -> Evidence:
    number, text = at if at is not None else (None, "")
    why = "a traceback the log cuts off before its exception (the process may have crashed)"
    return Evidence("crashed", "hint", why, where, number, text)


def _exit_evidence(code: int, what: str, where: str, line: int | None, text: str, *, strong: bool = False) -> Evidence:
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
        lines += ["", "how to confirm:"] + [f"  - {c}" for c in self.confirm]
        if self.notes:
            lines += ["", "not read:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(lines)


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
    deciding = [e for e in evidence if e.verdict == verdict]
    strongest = next((e for e in deciding if e.strength == "strong"), deciding[0] if deciding else None)
    summary = strongest.why if strongest is not None else "no recognised evidence"
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
    confirm = _confirm(verdict, platforms)
    return Diagnosis(verdict, summary, evidence, exit_code, checkpoint, lost, exact, confirm, notes)


def _decide(evidence: Sequence[Evidence]) -> str:
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
        if e.verdict == "crashed" and not e.why.startswith(("exit", "torchrun root cause", "container exit")):
            return True
    return False


def _confirm(verdict: str, platforms: set[str]) -> list[str]:
    items = CONFIRM[verdict]
    tags = {"slurm": "SLURM", "k8s": "Kubernetes", "aws": "AWS", "gcp": "GCP", "azure": "Azure"}
    named = {tags[p] for p in platforms if p in tags}
    if not named:
        return items
    platform_items = [i for i in items if i.split(":", 1)[0] in named]
    generic = [i for i in items if i.split(":", 1)[0] not in tags.values()]
    return platform_items + generic or items


MAX_LOG_BYTES = 64 << 20
"""What one input may contribute: of a longer file, its last 64 MiB (how a run ended is at its end); of a stream,
its first 64 MiB."""
MAX_LINE_CHARS = 4096
"""A longer line is scanned by its first 4096 characters; the rest is skipped without being kept."""


class LogInput:
    """The lines of one log, read as a stream with bounded memory (a line at a time, each cut at
    `MAX_LINE_CHARS`) and bounded length (`MAX_LOG_BYTES`). ``note`` says what was left out, once it is read."""

    def __init__(self, name: str, stream: BinaryIO, *, limit: int = MAX_LOG_BYTES, owned: bool = True) -> None:
        self.name = name
        self._stream = stream
        self._limit = limit
        self._owned = owned
        self.note: str | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self._lines()
        finally:
            if self._owned:
                self._stream.close()

    def _lines(self) -> Iterator[str]:
        stream, limit = self._stream, self._limit
        budget = limit
        try:
            size = os.fstat(stream.fileno()).st_size if stat.S_ISREG(os.fstat(stream.fileno()).st_mode) else None
        except (OSError, ValueError, io.UnsupportedOperation):
            size = None
        if size is not None and size > limit:
            stream.seek(size - limit)
            budget -= len(stream.readline(limit))  # the first line is cut: start at the next whole one
            self.note = f"{self.name}: {size / 2**20:.0f} MiB; only its last {limit >> 20} MiB were read"
        while budget > 0:
            line = stream.readline(min(MAX_LINE_CHARS + 1, budget))
            if not line:
                return
            budget -= len(line)
            if len(line) > MAX_LINE_CHARS and not line.endswith(b"\n"):
                while budget > 0:  # skip the rest of an over-long line, a piece at a time
                    rest = stream.readline(min(1 << 16, budget))
                    budget -= len(rest)
                    if not rest or rest.endswith(b"\n"):
                        break
            yield line[:MAX_LINE_CHARS].decode("utf-8", errors="replace").rstrip("\r\n")
        if self.note is None:
            self.note = f"{self.name}: stopped after its first {limit >> 20} MiB (the rest was not read)"


def read_log(path: str, *, limit: int = MAX_LOG_BYTES) -> LogInput:
    """A log file (or ``-``, standard input) as a `LogInput`. Raises OSError if it cannot be opened."""
    if path == "-":
        return LogInput("stdin", sys.stdin.buffer, limit=limit, owned=False)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a directory, expected a log file", path)
    return LogInput(Path(path).name, open(path, "rb"), limit=limit)
