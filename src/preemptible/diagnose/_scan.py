"""Evidence from one log, line by line: tracebacks, torchrun's and mpirun's failure reports, container status
blocks and the rules (`_rules`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timezone

from preemptible.diagnose._evidence import Evidence, exit_evidence
from preemptible.diagnose._incident import actor, untimed, when
from preemptible.diagnose._input import LogInput, read_alone
from preemptible.diagnose._match import (
    collateral_for,
    exit_rule,
    is_collective_timeout,
    is_oom,
    is_peer_lost,
    is_time_limit,
    machine_gone,
    platform_marks,
    present,
    rule_for,
    spot_context,
)
from preemptible.diagnose._rules import (
    CANCELLED,
    COLLECTIVE_FRAME,
    END_HOOK,
    LOST_PEER,
    PARENT_GONE,
    PEER_LOST,
    PEER_NODE,
    RELAYED,
    SPAWN_CHILD_FRAME,
    SPOT_CONTEXT,
    STORE_LOST,
    peer_lost,
)

_NATIVE_FRAME = re.compile(r"^frame #\d+: ")
_TRACEBACK_START = re.compile(
    r"Traceback \(most recent call last\):|^[A-Za-z_][\w.]*\s{2,}Traceback \(most recent call last\)\s*$"
)
"""Python's traceback header, or IPython's (the exception's name, padding, then the header without its colon)."""
_BARE_EXCEPTION = re.compile(
    r"^([A-Za-z_][\w.]*\.)?([A-Z]\w*)?(Error|Exception): ?\S|^([A-Za-z_][\w.]*\.)?[A-Z]\w*(Error|Exception):\s*$"
)
"""An exception's line with no traceback before it (its message on the line, or on the lines after its name)."""
_FRAME = re.compile(r'^File "[^"]*", line \d+|^\S+ in [\w<>.]+\(|^\d+ frames$')
"""A frame whose indentation the log lost, or IPython's (``path in function(args)``, Colab's ``N frames``)."""
_QUEUE_CLOSED = re.compile(
    r"\bEnqueue operation was cancelled\b|\bCancelledError\b.*\b(queue|Queue)\b.*\b(closed|cancell?ed)\b"
)
_TIMED_OUT = re.compile(r"\btimed?[ -]?out\b|Timeout\b", re.I)
_CHAINED = re.compile(r"(During handling of the above exception|The above exception was the direct cause)")
_EXCEPTION_LINE = re.compile(
    r"^(\[[^\]]*\]:?\s*)?([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure|Warning)\b|[A-Za-z_][\w.]*Error)(:.*)?$"
)
_FLAT_FRAME = re.compile(r'File "[^"]*", line \d+(, in [\w<>.]+)?')
_FLAT_EXCEPTION = re.compile(r"(?<![\w.])[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(?=: |:?\s*$)")
"""A flattened traceback's frame, and its exception (its name, then its message or the line's end)."""
_ASIDE = re.compile(r"^(Exception ignored in\b|Error in atexit\._run_exitfuncs:)|^Exception in thread\b")
"""The line before a traceback that did not end the process: an exception in a ``__del__``, an ``atexit`` callback
or a weakref callback ("Exception ignored in: ...", "Error in atexit._run_exitfuncs:"), or in a thread other than the
main one."""
_WORK_THREAD = re.compile(r"^Exception in thread .*\(\w*train", re.I)
"""A thread that ran the work itself (Python names its target: ``Thread-4 (__training_thread_function)``, a GUI's
training thread): its exception ends the run as the main thread's would."""
_IN_A_THREAD = (
    "in a thread other than the main one: that thread died, the process went on (at a run's end, most often its "
    "teardown's threads: a queue or a logger closing under them)"
)
_IGNORED = (
    "in a destructor or an exit handler, which Python ignored: most often printed as the interpreter shuts down at "
    "the program's end"
)
_SIGTERM_AS_INTERRUPT = re.compile(r"\bKeyboardInterrupt: terminated\b")
_SIGTERM_AS_INTERRUPT_WHY = (
    "a SIGTERM the program's handler turned into KeyboardInterrupt('terminated') (uvicorn's, vLLM's): a stop from "
    "outside, not a user's Ctrl-C"
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
    prefixes, after a leading timestamp (`_STAMP_PREFIX`) and under a Markdown quote's ``> `` (a log pasted into an
    issue or a forum)."""
    line = _STAMP_PREFIX.sub("", _QUOTE.sub("", line))
    return re.sub(r"^((\[[^\]]*\](<std(out|err)>)?:)+\s?|\d+: |std(out|err): )", "", line).rstrip()


_STAMP_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\d[T ])?\d\d:\d\d:\d\d([.,]\d+)?(Z|[+-]\d\d:?\d\d)? +")
"""A timestamp the log's writer put before each line (GitHub Actions', Jenkins' timestamper): the rules that read a
line from its start (the shell's ``Killed``, Jenkins' ``Finished: ABORTED``) read it after the timestamp."""


_QUOTE = re.compile(r"^>( |$)")


_TIMESTAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")


_OWN_STOP = re.compile(r"\bnotice \(.*\) received; stopping at step (\d+)")
_OWN_RESUME = re.compile(r"\] resumed from the checkpoint of step (\d+)")


class TimeWindow:
    """The earliest and latest timestamps (``2026-11-30T19:05:23``, ``2026-11-30 19:05:23``) in the logs read,
    taken as UTC when they carry no zone: which attempt of a run the logs belong to. Also the steps preemptible's
    own lines name (``... received; stopping at step 85``, ``resumed from the checkpoint of step 85``): they place
    a log that carries no timestamps."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.stops: set[int] = set()
        self.resumes: set[int] = set()

    def see(self, line: str) -> None:
        if "step" in line:
            for pattern, steps in ((_OWN_STOP, self.stops), (_OWN_RESUME, self.resumes)):
                own = pattern.search(line)
                if own is not None and len(steps) < 64:
                    steps.add(int(own.group(1)))
        match = None if untimed(line) else _TIMESTAMP.search(line[:80])
        if match is None:
            return
        try:
            y, mo, d, h, mi, sec = (int(g) for g in match.groups())
            t = datetime(y, mo, d, h, mi, sec, tzinfo=timezone.utc).timestamp()
        except ValueError:
            return
        self.first = t if self.first is None else min(self.first, t)
        self.last = t if self.last is None else max(self.last, t)


_OOM_KILLED_REASON = re.compile(r"\bReason:\s*OOMKilled\b")


def scan_lines(lines: Iterable[str], where: str, window: TimeWindow | None = None) -> list[Evidence]:
    """Evidence from one log's lines (and their time range into ``window``)."""
    scan = _Scan(where, window)
    numbered = lines.numbered() if isinstance(lines, LogInput) else enumerate(lines, start=1)
    for number, raw in numbered:
        scan.read(number, raw)
    found = scan.finish()
    if window is not None and isinstance(lines, LogInput):
        for edge in lines.edges:
            window.see(edge)
    first_stamp = next((e.time for e in found if e.time is not None), None)
    if first_stamp is not None:  # lines before the log's first timestamp happened at or before it
        found = [replace(e, time=first_stamp) if e.time is None else e for e in found]
    return found


class _Scan:
    """The state of reading one log: where in a traceback or a launcher's failure report the reader is, and the
    evidence so far. `read` takes each line; the evidence of a line is tagged with its writer and time when the
    next line comes (or at `finish`)."""

    def __init__(self, where: str, window: TimeWindow | None) -> None:
        self.where = where
        self.window = window
        self.found: list[Evidence] = []
        self.kept = _Kept()
        self.in_traceback = False
        self.prev_indented = False  # the previous line was a traceback frame or source line (an excerpt may start
        # mid-traceback)
        self.oom_reason_at: int | None = None  # index in ``found`` of a "Reason: OOMKilled" in a container status
        self.block = ""  # "" | "root" | "failures": where we are in torchrun's error summary
        self.traceback_at: tuple[int, str] | None = None  # where the traceback being read started
        self.traceback_by: tuple[str | None, str | None] = (None, None)  # its writer and time
        self.aside = ""  # "ignored" | "thread": the traceback being read did not end the process (see `_ASIDE`)
        self.chained_aside = ""  # the aside of the traceback last read, for one chained to it
        self.in_end_hook = False  # the traceback being read runs in an end-of-training hook (see `_rules.END_HOOK`)
        self.in_collective = False  # ... and passes through a torch.distributed collective (`_rules.COLLECTIVE_FRAME`)
        self.in_spawn = False  # ... or through a multiprocessing child's start (`_rules.SPAWN_CHILD_FRAME`)
        self.found_in: frozenset[str] = frozenset()  # the needles (`_match.present`) of the line being read
        self.prev_line = ""  # the line before this one (when it was read)
        self.spot = False  # a line said the work runs on spot/preemptible capacity
        self.platforms: set[str] = set()  # the platforms whose marks a line showed (`_rules.PLATFORM_MARKS`)
        self.who: str | None = None
        self.stamp: str | None = None
        self.mpi_first: int | None = None  # mpirun named the first process to fail: its exit code follows
        self.mark = 0  # found[mark:] came from the previous line: tag them with its writer and time
        self.last = 0
        self.number = 0  # the line being read: its number and text (trimmed)
        self.text = ""

    def read(self, number: int, raw: str) -> None:
        """Read one line (``number``: 1-based; lines no rule could act on may have been skipped)."""
        self.kept.tag(self.found, self.mark, self.who, self.stamp)
        self.mark = len(self.found)
        if self.oom_reason_at is not None and self.oom_reason_at >= self.mark:
            self.oom_reason_at = None  # (its evidence was past the cap)
        if number <= self.last:
            return  # a chunk's first line given again as the line before a keyword's
        if number != self.last + 1:
            self.prev_indented = False  # lines were skipped (no rule could act on them): none of them is known
            self.prev_line = ""
        self.last = number
        self.who, self.stamp = actor(raw), when(raw) or self.stamp
        if self.window is not None:
            self.window.see(raw)
        line = _strip_prefix(raw)
        self.number, self.text = number, raw.strip()[:400]
        self.found_in = present(line)  # the rules' needles in the line: found once, used by every reader below
        self._platform(line)
        if _NATIVE_FRAME.match(line):
            if "WorkNCCL::checkTimeout" in line:  # the watchdog's own frame: it was timing out a collective
                self._add("collective-timeout", "weak", "NCCL's watchdog was timing out a collective (its stack)")
            return  # a frame of a native stack (c10's "Exception raised from ..."): a function's name, not an event
        if line.startswith("^C"):  # a terminal echoes Ctrl-C before whatever the process then prints
            self._add("interrupted", "strong", "a user's interrupt (^C: Ctrl-C at the terminal)")
            line = line[2:]
            self.found_in = present(line)
        was_indented, self.prev_indented = self.prev_indented, line[:1] in (" ", "\t") and bool(line.strip())
        prev, self.prev_line = self.prev_line, line
        if self._flattened(line, prev) or self._traceback(line, was_indented, prev):
            return
        if self._launcher_report(line):
            return
        if _OOM_KILLED_REASON.search(line):
            self.oom_reason_at = len(self.found)  # the rule below records it; an "Exit Code: 0" after it downgrades it
        if self._torchrun_summary(line):
            return
        self._rules(line)

    def _platform(self, line: str) -> None:
        """A line that says where the job runs (`_rules.PLATFORM_MARKS`), once per log and platform: read before
        anything else (a traceback's frame, a container's status line), since it is no event of its own."""
        found_in = self.found_in
        for mark in platform_marks(line, found_in) if found_in else ():
            if mark.platform not in self.platforms:
                self.platforms.add(mark.platform or "")
                self._add(mark.verdict, mark.strength, mark.why, mark.platform)

    def finish(self) -> list[Evidence]:
        """The evidence of the whole log, each kind capped (`MAX_EVIDENCE_PER_KIND`)."""
        if self.in_traceback:
            self._cut_traceback()
        self.kept.tag(self.found, self.mark, self.who, self.stamp)
        self.found += self.kept.beyond.values()
        return self.found

    def _cut_traceback(self) -> None:
        """A traceback the log cuts off before its exception: a hint, at its first line, by that line's writer (the
        lines that ended it are not all read when a long log is streamed)."""
        if self.aside:  # cut off, but Python went on from it: an exit handler's, a destructor's or another thread's
            why = f"a traceback {_IGNORED}" if self.aside == "ignored" else f"a traceback {_IN_A_THREAD}"
            self.aside = ""
            number, text = self.traceback_at if self.traceback_at is not None else (None, "")
            self.found.append(Evidence("completed", "hint", why, self.where, number, text))
            return
        cut = [_cut_traceback(self.traceback_at, self.where)]
        self.kept.tag(cut, 0, *self.traceback_by)
        self.found[self.mark : self.mark] = cut  # (before this line's own evidence, which is tagged later)
        self.mark += len(cut)

    def _add(self, verdict: str, strength: str, why: str, platform: str | None = None) -> None:
        self.found.append(Evidence(verdict, strength, why, self.where, self.number, self.text, platform))

    def _about(
        self, who: str, verdict: str, strength: str, why: str, platform: str | None, *, reported: bool = False
    ) -> None:
        """Evidence of this line about another rank than the one that wrote it (``who``), at this line's time."""
        self.found.append(
            Evidence(verdict, strength, why, self.where, self.number, self.text, platform, who, self.stamp, reported)
        )

    def _peer_lost(self, line: str) -> bool:
        """preemptible's peer watch (``event=peer_lost``): each rank it found gone is where the trouble started; the
        rank that wrote the line exits 76 because of it. A store that did not answer says this rank was cut off or
        the store's node was lost. True when the line is one."""
        found = peer_lost(line)
        if found is None:
            return False
        missing, store = found
        for rank in missing:
            self._about(f"rank {rank}", "collective-timeout", "strong", f"rank {rank} {LOST_PEER}", "preemptible")
        if missing:
            why = f"its peer watch found rank(s) {', '.join(map(str, missing))} gone: it exits 76 ({PEER_NODE})"
            self._add("collective-timeout", "collateral", why, "preemptible")
        elif store is not None:
            self._add("collective-timeout", "strong", f"this rank {STORE_LOST}", "preemptible")
        else:
            self._add("collective-timeout", "strong", f"a peer {LOST_PEER}", "preemptible")
        return True

    def _traceback(self, line: str, was_indented: bool, prev: str) -> bool:
        """Follow a Python traceback; True when the line is part of one (and its exception, if any, recorded)."""
        if _TRACEBACK_START.search(line) and line.rstrip().endswith(("last):", "last)")):
            # (a traceback flattened onto one line, "...last): File ...", is `_flattened`'s)
            self.in_traceback, self.traceback_at, self.in_end_hook = True, (self.number, self.text), False
            self.traceback_by = (self.who, self.stamp)
            if not _CHAINED.match(prev):  # (a chained traceback's aside and collective are its first part's)
                self.aside = _aside_of(prev)
                self.in_collective = self.in_spawn = False
            else:
                self.aside = self.aside or self.chained_aside
            return line.rstrip().endswith(":")  # (IPython's names the exception: a rule may read it, ^C's)
        if COLLECTIVE_FRAME.match(line):
            self.in_collective = True  # (also in a traceback whose start an excerpt cut off)
        if SPAWN_CHILD_FRAME.match(line):
            self.in_spawn = True
        if not self.in_traceback and was_indented and _EXCEPTION_LINE.match(line):
            self.in_traceback = True  # the exception line of a traceback whose start was cut off
        if not self.in_traceback:
            return False
        if END_HOOK.match(line) and not self.in_end_hook:
            self.in_end_hook = True
            self._add("completed", "strong", "the training loop had ended: this traceback runs in its end-of-training "
                      "hook (what failed there failed after the run's work was done)")  # fmt: skip
        if line[:1] in (" ", "\t") or not line.strip() or _CHAINED.match(line) or _FRAME.match(line):
            return True  # frames (indented, or not where a log lost its indentation), source lines, carets, "During
            # handling of ..." between chained tracebacks
        match = _EXCEPTION_LINE.match(line)  # else: neither a frame nor the exception; read it as any other line
        if match is None and not read_alone(line):
            return True  # another process's output interleaved (multiprocessing's "Process actor_6:"): skipped
        self.in_traceback = False
        if match is None:
            self.in_collective = self.in_spawn = False
            self._cut_traceback()
            return False
        ended = self._exception(line, match)
        self.in_collective = self.in_spawn = False
        return ended

    def _flattened(self, line: str, prev: str) -> bool:
        """A traceback flattened onto one line (a cloud console's or a JSON logger's entry, a copy that lost its line
        breaks): its exception, after its last frame, is read as a traceback's is; a line that ends before one, as a
        traceback the log cuts off. True when the line is recorded."""
        if self.in_traceback or "Traceback (most recent call last)" not in line:
            return False  # (a substring test first: this runs on every line)
        start = _TRACEBACK_START.search(line)
        if start is None or line.rstrip().endswith(("last):", "last)")):
            return False
        rest = line[start.end() :]
        frames = list(_FLAT_FRAME.finditer(rest))
        tail = rest[frames[-1].end() :] if frames else rest
        exception = _FLAT_EXCEPTION.search(tail)
        self.aside = _aside_of(prev)
        if exception is None:
            self.traceback_at = (self.number, self.text)
            self._cut_traceback()
            return False  # (the rest is read as text: what it names, a path or a platform, may still count)
        text = tail[exception.start() :].strip()
        match = _EXCEPTION_LINE.match(text)
        if match is None or not self._exception(text, match):
            self.aside = ""
            return False  # an exception the rules name (a signal, an OOM, a time limit): read as any other line
        return True

    def _aside(self, name: str) -> bool:
        """An exception Python printed and went on from (`_ASIDE`); True when it is recorded (as at most a hint)."""
        aside, self.aside = self.aside, ""
        self.chained_aside = aside  # (a traceback chained to this one is printed under the same header)
        if not aside:
            return False
        if aside == "thread":
            self._add("completed", "hint", f"unhandled {name} {_IN_A_THREAD}")
        else:  # "ignored": Python printed it and went on; it changed nothing about how the process ended
            self._add("completed", "hint", f"{name} {_IGNORED}")
        return True

    def _not_a_failure(self, name: str, line: str) -> bool:
        """An exception that says how the process was stopped, not that it failed: a user's interrupt, or an input
        queue cancelled under its threads as the program closed it; True when recorded (in any thread)."""
        if name == "KeyboardInterrupt" and _SIGTERM_AS_INTERRUPT.search(line):
            self.aside = ""
            self._add("terminated", "strong", _SIGTERM_AS_INTERRUPT_WHY)
            return True
        if name == "KeyboardInterrupt":
            self.aside = ""
            self._add("interrupted", "strong", "a user's interrupt (KeyboardInterrupt: Ctrl-C, a notebook's stop)")
            return True
        if _QUEUE_CLOSED.search(line):
            self.aside = ""
            why = ("an input queue was cancelled under its threads: the program closed its queues on its way out (at "
                   "the end of training; after another error, that error decides)")  # fmt: skip
            self._add("completed", "weak", why)
            return True
        return False

    def _exception(self, line: str, match: re.Match[str]) -> bool:
        """The exception line that ends a traceback; True when it is recorded as the crash (or as nothing)."""
        found_in = self.found_in
        ended = exit_rule(line, self.where, self.number, self.text, found_in)
        if ended is not None:
            self.found.append(ended)  # a worker's death reported as an exception: the signal or code is the cause
            return True
        name = match.group(2).rsplit(".", 1)[-1]
        if self._not_a_failure(name, line):
            return True
        if self.aside == "thread" and (is_collective_timeout(line, found_in) or is_oom(line, found_in)):
            self.aside = ""  # a timed-out collective or an OOM is one whichever thread met it
        if self._aside(name) or (name in _NOT_A_CRASH and name != "SignalException"):
            return True  # (torchrun's wrapper error: its summary below names the cause)
        if is_collective_timeout(line, found_in) or (self.in_collective and _TIMED_OUT.search(line)):
            # (a timeout raised inside a torch.distributed barrier or all-reduce, in any words, is the same)
            self._add("collective-timeout", "strong", f"unhandled {name}: a collective timed out (a rank stopped "
                      "answering)", "torchrun")  # fmt: skip
            return True
        if (
            name == "SignalException"
            or is_oom(line, found_in)
            or is_time_limit(line, found_in)
            or machine_gone(line, found_in)
        ):
            return False  # read as any other line: the rules name the signal, the OOM, the time limit, the machine
        if is_peer_lost(line, found_in):
            self._add("crashed", "weak", f"unhandled {name}: {PEER_LOST}", "torchrun")  # another rank's end caused it
        elif self.in_spawn and name in ("EOFError", "UnpicklingError"):
            self._add("crashed", "weak", f"unhandled {name}: {PARENT_GONE}")  # (what ended the parent is the cause)
        elif name == "CancelledError":
            self._add("crashed", "weak", f"unhandled {name}: {CANCELLED}")  # (what cancelled it is the cause)
        else:
            self._add("crashed", "strong", f"unhandled {name}")
        return True  # nothing in a crash's message counts as other evidence ("... preemption ...")

    def _launcher_report(self, line: str) -> bool:
        """torchrun's error summary, mpirun's first failed process and a container's status block; True when the
        line belongs to their structure."""
        if _ROOT_CAUSE.search(line):
            self.block = "root"
            return True
        if _FAILURES.search(line):
            self.block = "failures"
            return True
        mpi = _MPI_FIRST.search(line)
        if mpi:
            self.mpi_first = int(mpi.group(1))
            return True
        mpi_exit = _MPI_EXIT.match(line) if self.mpi_first is not None else None
        if mpi_exit:
            ended = exit_evidence(int(mpi_exit.group(1)), "mpirun: the first process to fail, exit code", self.where,
                                  self.number, self.text, strong=True)  # fmt: skip
            self.found.append(replace(ended, actor=f"rank {self.mpi_first}"))
            self.mpi_first = None
            return True
        status = _STATUS_LINE.search(line)
        if status:
            self._container_exit(int(next(g for g in status.groups() if g is not None)))
            return True
        return False

    def _container_exit(self, code: int) -> None:
        if code == 0 and self.oom_reason_at is not None:
            # a container that exited 0 with reason OOMKilled: a process inside its cgroup was OOM-killed, but the
            # main process finished; the exit code is what happened to the run
            self.found[self.oom_reason_at] = replace(
                self.found[self.oom_reason_at], strength="weak", why="OOMKilled reason, but the main process exited 0"
            )
            self.found.append(Evidence("completed", "strong", "container exit code 0: the main process finished",
                                       self.where, self.number, self.text, "k8s", reported=True))  # fmt: skip
        else:
            self.found.append(exit_evidence(code, "container exit code", self.where, self.number, self.text))
        self.oom_reason_at = None

    def _torchrun_summary(self, line: str) -> bool:
        """Inside torchrun's summary: only its root cause's exit code counts; True when the line is read."""
        if re.fullmatch(r"\s*={10,}\s*", line):
            self.block = ""  # the summary's frame
            return True
        if self.block == "failures":
            code_match = _EXITCODE.search(line)
            if code_match and 0 < int(code_match.group(1)) < 128:  # a rank that failed on its own (torchrun's
                # teardown ends the others with a signal): the cause, when the summary's root cause is not given
                self.found.append(exit_evidence(int(code_match.group(1)), "torchrun: a rank failed, exitcode",
                                                self.where, self.number, self.text))  # fmt: skip
            return True  # the other ranks' signals: torchrun's own teardown after the first failure
        code_match = _EXITCODE.search(line)
        if code_match and self.block == "root":
            code = int(code_match.group(1))
            self.found.append(exit_evidence(code, "torchrun root cause: exitcode", self.where, self.number, self.text,
                                            strong=True))  # fmt: skip
            return True
        return False

    def _rules(self, line: str) -> None:
        """Any other line: preemptible's peer watch, an exit it reports, else the first rule it matches, else a
        collateral rule, else a bare exception."""
        if self._peer_lost(line):
            return
        found_in = self.found_in
        if found_in and not self.spot and spot_context(line, found_in):
            self.spot = True  # (once per log: it is a fact about the machine, not an event)
            self._add(SPOT_CONTEXT.verdict, SPOT_CONTEXT.strength, SPOT_CONTEXT.why)
        ended = exit_rule(line, self.where, self.number, self.text, found_in) if found_in else None
        rule = rule_for(line, found_in) if found_in else None
        if ended is not None:
            self.found.append(ended)
            if (
                rule is not None
                and rule.strength == "strong"
                and (rule.verdict != ended.verdict or ended.strength != "strong")
            ):
                self._add(rule.verdict, rule.strength, rule.why, rule.platform)  # the same line names the cause
            return
        if rule is not None:
            relayed = RELAYED.search(line) if rule.platform == "preemptible" else None
            if relayed is None:
                self._add(rule.verdict, rule.strength, rule.why, rule.platform)
                return
            # another rank's notice, as this rank learned it through the store: about that rank, and its own line
            # (if given) before this one
            why = f"{rule.why} (rank {relayed.group(1)} got it; this rank learned it through the job's store)"
            self._about(f"rank {relayed.group(1)}", rule.verdict, rule.strength, why, rule.platform, reported=True)
            return
        collateral = collateral_for(line, found_in)
        if collateral is not None:
            self._add(collateral.verdict, "collateral", collateral.why, collateral.platform)
        elif _BARE_EXCEPTION.match(line):
            self._add("crashed", "weak", "an exception reported at the top level (its traceback is not in the log)")


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


def _aside_of(prev: str) -> str:
    """What the line before a traceback says of it (`_ASIDE`): "ignored" (an exit handler's, a destructor's), "thread"
    (another thread's, unless the thread ran the work itself, `_WORK_THREAD`), else ""."""
    aside = _ASIDE.match(prev)
    if aside is None or (not aside.group(1) and _WORK_THREAD.search(prev)):
        return ""
    return "ignored" if aside.group(1) else "thread"


def _cut_traceback(at: tuple[int, str] | None, where: str) -> Evidence:
    number, text = at if at is not None else (None, "")
    why = "a traceback the log cuts off before its exception (the process may have crashed)"
    return Evidence("crashed", "hint", why, where, number, text)
