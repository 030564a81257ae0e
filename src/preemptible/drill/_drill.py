"""The drill's steps, in order (the package docs, `preemptible.drill`, say what each does and why)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from preemptible import relay
from preemptible.drill._child import SLACK_S, Child, clean_exit, event_time, newest_committed, on_storage
from preemptible.drill._compare import (
    MTIME_SLACK_S,
    explain_difference,
    final_state,
    first_divergence,
    logged_figures,
    spliced,
)
from preemptible.drill._report import DrillReport
from preemptible.errors import PreemptibleError
from preemptible.events import Event, ExitReason, SaveReason
from preemptible.journal import Record
from preemptible.sources import detect

SOURCES = ("signal", "sigint", "slurm", "aws", "gcp", "azure")
SIGNALS = {"signal": signal.SIGTERM, "sigint": signal.SIGINT, "slurm": signal.SIGUSR1}
ENDPOINT_ENV = {
    "aws": "PREEMPTIBLE_AWS_ENDPOINT",
    "gcp": "PREEMPTIBLE_GCP_ENDPOINT",
    "azure": "PREEMPTIBLE_AZURE_ENDPOINT",
}
ROOT_ENV = "PREEMPTIBLE_ROOT"
DEFAULT_AT_S = 3.0
MID_EPOCH = relay.MID_EPOCH
"""``--at mid-epoch`` (the default under ``--reference``): stop where the run reports the middle of an epoch."""


def default_window(source: str) -> float:
    return {"aws": detect.WINDOWS["aws"], "gcp": detect.WINDOWS["gcp"], "azure": detect.WINDOWS["azure"]}.get(
        source, detect.WINDOWS["slurm"] if source == "slurm" else detect.WINDOWS["local"]
    )


_STOP_SAVES = (SaveReason.EMERGENCY, SaveReason.PRESTAGED)
"""The saves that answer a notice."""


class Drill:
    """Rehearses one preemption of ``command``; `run` returns the `DrillReport`.

    Args:
        command: the training command (it must use `preemptible.Run`).
        source: how the notice comes: ``signal`` (SIGTERM), ``sigint``, ``slurm`` (SIGUSR1), ``aws``, ``gcp``,
            ``azure`` (through that cloud's emulator).
        at: seconds after the loop starts to deliver the notice, ``"random"`` (uniformly 1-10 s), or
            ``"mid-epoch"``: when the run holds at the middle of an epoch (`preemptible.loaders.MidEpochAim`); a loop
            not built of ``run.epochs``/``run.batches`` falls back to `DEFAULT_AT_S`. Default: ``"mid-epoch"`` with
            ``reference``, else `DEFAULT_AT_S`.
        window: the notice window to grade against (default: the platform's: AWS 120 s, GCP/Azure 30 s, ...).
        root: the checkpoint root, to check the commit on storage as well (default: what the run reports).
        reference: also run the command uninterrupted and compare the final states and the figures logged at
            each step (needs a command that ends).
        kill: a crash rehearsal: SIGKILL the command instead of a notice, and check the restart resumed from the
            last committed checkpoint (no emergency save, no window).
        nodes: rehearse scenario 1 of a multi-node job on this many simulated nodes (2-4, ``source="aws"``; needs
            root and network namespaces): the notice to the last node only, a replacement for it, the resume
            (`preemptible.drill._nodes`). ``at`` then defaults to the first committed checkpoint.
        start_timeout: how long to wait for the command's `Run` to enter its loop.
        progress: called with a line of text as the drill goes.
        clock, monotonic, sleep: epoch seconds, a monotonic clock and a sleep (injected by tests).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        source: str = "signal",
        at: float | str | None = None,
        window: float | None = None,
        root: str | None = None,
        reference: bool = False,
        kill: bool = False,
        nodes: int | None = None,
        start_timeout: float = 120.0,
        finish_timeout: float = 1800.0,
        progress: Callable[[str], None] = lambda _line: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.clock, self.monotonic, self.sleep = clock, monotonic, sleep
        if not command:
            raise PreemptibleError("expected a command after '--' (e.g. preemptible drill -- python train.py)")
        if source not in SOURCES:
            raise PreemptibleError(f"expected --source to be one of {', '.join(SOURCES)}; found {source!r}")
        if at is not None and at not in ("random", MID_EPOCH) and (not isinstance(at, (int, float)) or at < 0):
            raise PreemptibleError(f"expected --at to be seconds >= 0, 'random' or '{MID_EPOCH}'; found {at!r}")
        if nodes is not None:
            from preemptible.drill._nodes import namespaces_problem, nodes_problem, torchrun_parts

            problem = nodes_problem(nodes, source=source, reference=reference, kill=kill, at=at, root=root)
            if problem is None:
                torchrun_parts(command)  # raises for a command torchrun cannot take
                problem = namespaces_problem()
            if problem is not None:
                raise PreemptibleError(problem)
        elif at is None:
            at = MID_EPOCH if reference else DEFAULT_AT_S
        self.command = list(command)
        self.source = source
        self.at = at
        self.window = window if window is not None else default_window(source)
        self.root = root
        self.reference = reference
        self.kill = kill
        self.nodes = nodes
        self.start_timeout = start_timeout
        self.finish_timeout = finish_timeout
        self.progress = progress
        self._workdir = ""
        self._emulator: Any = None
        self._loop_s: float | None = None
        """How long the reference run's loop lasted (from entering it to ``done``), when it ran."""
        self._reference_child: Child | None = None
        self._since: float | None = None
        """The drill's start on the file system's clock, less `MTIME_SLACK_S` (`files_written_aside`)."""

    # set-up -------------------------------------------------------------------------------------------------
    def _env(self, label: str, **extra: str) -> tuple[dict[str, str], str]:
        report_path = os.path.join(self._workdir, f"{label}.report.json")
        env = {k: v for k, v in os.environ.items() if k not in (relay.NOTICE_FILE_ENV, ROOT_ENV, relay.AIM_ENV)}
        env.update({relay.REPORT_FILE_ENV: report_path, "PYTHONUNBUFFERED": "1", **extra})
        if self.source in SIGNALS or label == "reference" or self.kill:
            env[detect.SOURCES_ENV] = "signal"
            env[detect.GRACE_ENV] = f"{self.window:g}"
        else:
            from preemptible.emulate import EMULATORS

            if self._emulator is not None:
                self._emulator.close()
            # A fresh emulator per start: the previous one still answers with its notice.
            self._emulator = EMULATORS[self.source](host="127.0.0.1", port=0).start()
            env[detect.SOURCES_ENV] = f"signal,{self.source}"
            env[ENDPOINT_ENV[self.source]] = self._emulator.url
        return env, report_path

    def _start(self, label: str, **extra: str) -> Child:
        env, report_path = self._env(label, **extra)
        self.progress(f"drill: starting the command ({label})")
        return Child(self.command, env, report_path, os.path.join(self._workdir, f"{label}.log"), self)

    def _deliver(self, child: Child) -> float:
        if self.kill:
            t = self.clock()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGKILL)  # the whole process group, as a machine's end takes it
            self.progress(f"drill: sent SIGKILL to process group {child.proc.pid} (a crash: no notice)")
            return t
        if self.source in SIGNALS:
            sig = SIGNALS[self.source]
            t = self.clock()
            os.kill(child.proc.pid, sig)
            self.progress(f"drill: sent {sig.name} to pid {child.proc.pid}")
            return t
        t = self.clock()
        self._emulator.notice()
        self.progress(f"drill: the {self.source} emulator now announces the notice")
        return t

    def _delay(self) -> float:
        """Seconds from the loop's start to the notice. ``random``: 1-10 s, within the reference run's loop (its
        first fifth to four fifths) when that was shorter."""
        if self.at == MID_EPOCH:  # a loop with no epochs to aim at
            return DEFAULT_AT_S if self._loop_s is None else min(DEFAULT_AT_S, 0.5 * self._loop_s)
        if isinstance(self.at, (int, float)):
            return float(self.at)
        loop = self._loop_s
        if loop is not None and loop < 12.5:
            return random.uniform(min(1.0, 0.2 * loop), min(10.0, 0.8 * loop))
        return random.uniform(1.0, 10.0)

    def _too_late(self, delay: float, ended: str) -> str:
        """Why a notice ``delay`` s into the loop rehearses nothing, and what to change."""
        earlier = f"--at {0.5 * self._loop_s:.1f}" if self._loop_s is not None else "a smaller --at"
        return (
            f"{ended}, before the notice {delay:g} s into it: there was no training left to stop. Deliver it "
            f"earlier ({earlier}) or make the run longer (more steps or epochs, a slower --step-time)"
        )

    # the drill ----------------------------------------------------------------------------------------------
    def run(self) -> DrillReport:
        if self.nodes is not None:
            from preemptible.drill._nodes import NodesDrill

            return NodesDrill(self).run()
        report = DrillReport(
            self.source, self.window, self.command, root=self.root, mode="kill" if self.kill else "notice"
        )
        self._workdir = tempfile.mkdtemp(prefix="preemptible-drill-")
        self._since = time.time() - MTIME_SLACK_S  # the file system's clock: for the files the runs write
        children: list[Child] = []
        try:
            reference_root = self._reference(report, children) if self.reference else None
            if not self.reference or reference_root is not None:
                self._drill(report, children, reference_root)
        finally:
            for c in children:
                c.kill()
            if self._emulator is not None:
                self._emulator.close()
            shutil.rmtree(self._workdir, ignore_errors=True)
        return report

    def _reference(self, report: DrillReport, children: list[Child]) -> str | None:
        """Runs the command to its end on a root of its own; that root, or None when it did not finish."""
        ref_root = os.path.join(self._workdir, "reference-root")
        child = self._start("reference", **{ROOT_ENV: ref_root})
        children.append(child)
        self._reference_child = child
        code = child.wait(self.finish_timeout)
        done = child.events(Event.DONE)
        began = child.entered()
        if done and began:
            self._loop_s = event_time(done[-1]) - event_time(began[0])
        ok = code == 0 and bool(done)
        detail = f"exit {code}, finished at step {done[-1]['step']}" if ok else f"exit {code}; output:\n{child.tail()}"
        return ref_root if report.check("reference run finished uninterrupted", ok, detail) else None

    def _drill(self, report: DrillReport, children: list[Child], reference_root: str | None) -> None:
        delay = self._delay()
        if self.at != MID_EPOCH and self._loop_s is not None and delay >= self._loop_s:
            report.check(
                f"the run is still training when the {self._what} comes",
                False,
                self._too_late(delay, f"the reference run's loop ended {self._loop_s:.1f} s after it began"),
            )
            return
        first = self._first_start(report, children, reference_root)
        if first is None:
            return
        if not self._await_moment(report, first, delay):
            return
        if self.kill:
            step, completed = self._crash(report, first)
        else:
            step, completed = self._stop(report, first), None
            if step is None:
                return
        second = self._restart(report, children, step)
        if completed is not None and report.resumed_step is not None:
            report.steps_lost = max(0, completed - report.resumed_step)
            report.checks[-1].detail += f"; {report.steps_lost} steps lost (redone): it had completed {completed}"
        if reference_root is not None:
            self._finish_and_compare(report, first, second, reference_root)
        elif not self.kill:
            self._second_notice(report, second)

    @property
    def _what(self) -> str:
        return "kill" if self.kill else "notice"

    def _await_moment(self, report: DrillReport, first: Child, delay: float) -> bool:
        """Waits for the moment of the notice (or kill): ``delay`` seconds into the loop, or, aiming at the middle of
        an epoch, until the run holds there. False (a failed check) when the loop ended first."""
        if self.at != MID_EPOCH:
            report.moment = {"aim": "seconds", "at_s": round(delay, 3)}
            self.sleep(delay)
            return not self._loop_over(report, first, delay)
        first.wait_for(lambda: first.held() is not None or bool(first.events(Event.DONE)), self.finish_timeout)
        held = first.held()
        if held is not None and held.get("held") is True:
            report.moment = {
                "aim": MID_EPOCH,
                "step": held.step,
                **{k: held.get(k) for k in ("epoch", "batches_done", "epoch_batches")},
            }
            self.progress(f"drill: the run holds at the middle of an epoch: {report.describe_moment()}")
            return True
        if held is not None:  # a loop of another shape: no epoch to stop in the middle of
            why = "not a loop of run.epochs/run.batches, so no epoch to stop in the middle of"
            report.moment = {"aim": "seconds", "at_s": round(delay, 3), "why": why}
            self.progress(f"drill: {why}: the {self._what} comes {delay:g} s into the loop")
            self.sleep(delay)
            return not self._loop_over(report, first, delay)
        done = first.events(Event.DONE)
        ended = f"its loop ended at step {done[-1]['step']}" if done else f"it exited {first.poll()}"
        report.check(
            "the run reached the middle of an epoch",
            False,
            f"expected the run to hold in the middle of an epoch (run.epochs/run.batches, 2 batches an epoch or "
            f"more); {ended} without reaching one. Give --at SECONDS to deliver the {self._what} at a time instead",
        )
        return False

    def _first_start(self, report: DrillReport, children: list[Child], reference_root: str | None) -> Child | None:
        """Starts the command to be drilled; it, once its Run has entered the loop (fresh, for a --reference
        drill), else None."""
        first = self._start("first", **({relay.AIM_ENV: MID_EPOCH} if self.at == MID_EPOCH else {}))
        children.append(first)
        entered = first.wait_for(lambda: bool(first.entered()), self.start_timeout)
        doc = first.report()
        report.root = self.root or doc.get("root")
        if not report.check(
            "the command's Run started",
            entered,
            f"root {report.root}" if entered else self._not_started(first),
        ):
            return None
        if reference_root is not None and first.events(Event.RESUME):
            report.check(
                "the drilled run starts fresh",
                False,
                f"it resumed from step {first.events(Event.RESUME)[0]['step']}: point the command at an empty root "
                "for a --reference drill, or delete the old checkpoints",
            )
            return None
        return first

    def _loop_over(self, report: DrillReport, first: Child, delay: float) -> bool:
        """Whether the run's loop ended before the notice was due (a failed check)."""
        done = first.events(Event.DONE)
        if first.poll() is None and not done:
            return False
        # A loop that has ended (a process still exiting, or one that evaluates or uploads after it) has
        # nothing to stop: a signal now would only kill what comes after the loop, or find its default handler.
        ended = f"its loop ended at step {done[-1]['step']}" if done else f"it exited {first.code}"
        report.check(f"the run is still training when the {self._what} comes", False, self._too_late(delay, ended))
        return True

    def _crash(self, report: DrillReport, first: Child) -> tuple[int | None, int | None]:
        """SIGKILLs the run (a crash rehearsal). The newest committed checkpoint then (None: the restart starts
        over), and the steps the run had completed when killed (from its journal; exact when it held)."""
        self._deliver(first)
        code = first.wait(SLACK_S)
        report.check(
            "the process died of SIGKILL (crash rehearsal)",
            code == -signal.SIGKILL,
            f"exit {code}" if code is not None else "still running after SIGKILL: a process in uninterruptible I/O",
        )
        committed = [e.step for e in first.events(Event.SAVE_COMMITTED) if e.step is not None]
        on_storage = newest_committed(report.root)
        step = on_storage if on_storage is not None else (max(committed) if committed else None)
        report.checkpoint_step = step
        held = first.held()
        if held is not None and held.get("held") is True and held.step is not None:
            completed: int | None = held.step
        else:
            steps = [r.step for r in first.journal_records() if r.step is not None]
            completed = max(steps) if steps else None
        return step, completed

    def _stop(self, report: DrillReport, first: Child) -> int | None:
        """Delivers the notice and grades the stop: the notice seen, a checkpoint committed, a clean exit within
        the window. The step of the checkpoint to resume from, or None."""
        t_notice = self._deliver(first)
        code = first.wait(self.window + SLACK_S)
        if code is None:
            report.check("the process exited after the notice", False, self._hung(first))
            return None
        assert first.exited_at is not None
        notices = first.events(Event.NOTICE)
        commits = [e for e in first.events(Event.SAVE_COMMITTED) if e.get("reason") in _STOP_SAVES]
        report.timings["notice_to_exit_s"] = round(first.exited_at - t_notice, 3)
        if notices:
            report.timings["notice_to_boundary_s"] = round(event_time(notices[0]) - t_notice, 3)
        if commits:
            report.timings["notice_to_commit_s"] = round(event_time(commits[-1]) - t_notice, 3)
        seen = notices[0] if notices else None
        report.check(
            "the notice reached the run",
            seen is not None,
            f"{seen['source']} {seen['kind']} at step {seen['step']}"
            if seen
            else "no notice in the journal: " + first.tail(5),
        )
        step = self._stop_checkpoint(report, first, commits)
        clean, detail = clean_exit(code, first)
        report.check("the process exited cleanly", clean, detail)
        within = report.timings["notice_to_exit_s"] is not None and report.timings["notice_to_exit_s"] <= self.window
        report.check(
            "exit within the window", within, f"{report.timings['notice_to_exit_s']:.2f} s of {self.window:g} s"
        )
        return step

    def _stop_checkpoint(self, report: DrillReport, first: Child, commits: list[Record]) -> int | None:
        """The checkpoint the stop left (committed, or skipped as nothing new), checked on storage."""
        skipped = [e for e in first.events(Event.SAVE_SKIPPED) if e.get("reason") == SaveReason.EMERGENCY]
        step = commits[-1]["step"] if commits else (skipped[-1]["step"] if skipped else None)
        report.checkpoint_step = step
        committed = bool(commits) and on_storage(report.root, step)
        report.check(
            "a checkpoint committed after the notice",
            committed or bool(skipped),
            f"step {step}" + (" (nothing new since the last one)" if skipped and not commits else "")
            if step is not None
            else "no emergency save committed",
        )
        return step

    def _restart(self, report: DrillReport, children: list[Child], step: int | None) -> Child:
        """Starts the command again and checks it resumed from ``step`` (None: no checkpoint, it starts over)."""
        second = self._start("restart")
        children.append(second)
        t0 = self.clock()
        resumed = second.wait_for(lambda: bool(second.entered()), self.start_timeout)
        resumes = second.events(Event.RESUME)
        report.resumed_step = resumes[0]["step"] if resumes else (0 if second.events(Event.FRESH) else None)
        if resumes:
            report.timings["restart_to_resumed_s"] = round(event_time(resumes[0]) - t0, 3)
        if self.kill:
            name = "the restart resumed from the last committed checkpoint"
            expected = f"step {step}" if step is not None else "none committed, so a fresh start at step 0"
            found = f"expected {expected}; resumed at step {report.resumed_step}"
        else:
            name, found = "the restart resumed from that checkpoint", f"resumed at step {report.resumed_step}"
        report.check(
            name,
            resumed and report.resumed_step == (step if step is not None else 0),
            found if resumed else self._not_started(second),
        )
        return second

    def _second_notice(self, report: DrillReport, child: Child) -> None:
        self.sleep(min(self._delay(), 1.0))
        if child.poll() is not None:
            report.check(
                "a second notice stops the resumed run", child.code == 0, f"it had already exited {child.code}"
            )
            return
        self._deliver(child)
        code = child.wait(self.window + SLACK_S)
        ok, detail = clean_exit(code, child)
        report.check("a second notice stops the resumed run", ok, detail if code is not None else self._hung(child))

    def _finish_and_compare(self, report: DrillReport, first: Child, child: Child, reference_root: str) -> None:
        code = child.wait(self.finish_timeout)
        done = child.events(Event.DONE)
        if not report.check("the resumed run finished", code == 0 and bool(done), f"exit code {code}"):
            return
        ours = self._final_state(report.root, done[-1]["step"], written_since=self._since)
        theirs = self._final_state(reference_root, done[-1]["step"], written_since=self._since)
        same = ours is not None and ours == theirs
        differing = sorted(k for k in (ours or {}) if (theirs or {}).get(k) != (ours or {}).get(k))
        detail = (
            f"{len(ours or {}) - 1} tensor files and the JSON state equal (RNG streams, logs, timings and the names "
            "of files the runs wrote aside)"
        )
        logged = self._compare_figures(report, first, child, reference_root)
        if not logged:
            detail += "; naming the first differing step needs figures logged at each step: run.log(loss=...)"
        if not same:
            detail = f"differ: {', '.join(differing) or 'missing'}"
            if ours is not None and theirs is not None:
                detail += "\n" + explain_difference(
                    report.root, reference_root, done[-1]["step"], written_since=self._since
                )
        report.check("final state bit-identical to the uninterrupted run", same, detail)

    def _compare_figures(self, report: DrillReport, first: Child, second: Child, reference_root: str) -> bool:
        """Compares the figures the drilled run logged at each step (the first start's before the resume, the
        restart's after it) with the uninterrupted run's, and names the first differing step. False when the runs
        logged none (nothing to compare: the final states still are)."""
        resumed = report.resumed_step or 0
        if self._reference_child is None:
            return False
        theirs = logged_figures(self._reference_child.journal_records())
        ours = spliced(logged_figures(first.journal_records()), logged_figures(second.journal_records()), resumed)
        if not theirs and not ours:
            return False
        divergence = first_divergence(ours, theirs, resumed_at=resumed)
        report.first_differing_step = divergence.to_json() if divergence is not None else None
        names = sorted({k for figures in theirs.values() for f in figures for k in f})
        report.check(
            "figures logged at each step equal the uninterrupted run's",
            divergence is None,
            divergence.describe()
            if divergence is not None
            else f"{len(theirs)} steps of {', '.join(names)} equal, {len([s for s in theirs if s >= resumed])} of "
            f"them after the resume at step {resumed}",
        )
        return True

    # helpers ------------------------------------------------------------------------------------------------
    @staticmethod
    def _final_state(root: str | None, step: int, *, written_since: float | None = None) -> dict[str, str] | None:
        """`final_state` (the comparison of a --reference drill)."""
        return final_state(root, step, written_since=written_since)

    def _hung(self, child: Child) -> str:
        """What a run that outlived its notice last did: its last journaled event and its last output."""
        events = child.records()
        last = events[-1] if events else None
        if last is not None and last.event == Event.EXIT and last.get("reason") == ExitReason.NOTICE:
            done = (
                f"its Run stopped at step {last.get('step')} (saved: {last.get('saved')}) and chose exit code "
                f"{last.get('code')}, yet the process lives on: code after the loop (an evaluation, an upload, a "
                "thread that is not a daemon) or, under a launcher, a rank or the launcher itself is holding it"
            )
        elif last is not None:
            done = f"it last journaled {last.get('event')} at step {last.get('step')}"
        else:
            done = "it journaled nothing"
        return f"still running {self.window + SLACK_S:g} s after it; {done}; its last output:\n{child.tail(10)}"

    def _not_started(self, child: Child) -> str:
        if child.poll() is not None:
            return f"the command exited {child.code} before its Run entered the loop; output:\n{child.tail()}"
        return (
            f"no Run reported within {self.start_timeout:g} s through ${relay.REPORT_FILE_ENV}; expected the command "
            "to train with preemptible.Run (for other commands, rehearse with preemptible run)"
        )
