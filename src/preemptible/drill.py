"""``preemptible drill``: rehearse a preemption of your own training command, end to end, and grade it.

1. (``--reference``) run the command uninterrupted to the end, on a root of its own, for comparison.
2. Start the command (for a cloud source, beside that cloud's metadata emulator, with the endpoint set).
3. Once its `Run` has restored and entered the loop, wait ``--at`` seconds and deliver the notice: a signal to
   the command's process, or the cloud's notice through the emulator.
4. Measure notice -> step boundary -> commit -> exit against the window; check a checkpoint committed.
5. Restart the command and confirm from its journal that it resumed from that step.
6. Stop it with a second notice (or, with ``--reference``, let it finish and compare the final checkpoints'
   tensor checksums with the reference run's: a bit-exact resume).

The drill follows the command's `Run` through ``$PREEMPTIBLE_REPORT_FILE`` (which `Run` honours); ``--root`` only
adds a check of the checkpoint on storage. ``$PREEMPTIBLE_ROOT`` gives the reference run its own root.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from preemptible import relay
from preemptible.errors import PreemptibleError
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
SLACK_S = 30.0  # beyond the window, how long the drill waits for an exit before it calls the run hung


def default_window(source: str) -> float:
    return {"aws": detect.WINDOWS["aws"], "gcp": detect.WINDOWS["gcp"], "azure": detect.WINDOWS["azure"]}.get(
        source, detect.WINDOWS["slurm"] if source == "slurm" else detect.WINDOWS["local"]
    )


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class DrillReport:
    source: str
    window_s: float
    command: list[str]
    checks: list[Check] = field(default_factory=list)
    timings: dict[str, float | None] = field(default_factory=dict)
    checkpoint_step: int | None = None
    resumed_step: int | None = None
    root: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def notice_to_exit_s(self) -> float | None:
        return self.timings.get("notice_to_exit_s")

    def check(self, name: str, passed: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, passed, detail))
        return passed

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "source": self.source,
            "window_s": self.window_s,
            "notice_to_exit_s": self.notice_to_exit_s,
            "checkpoint_step": self.checkpoint_step,
            "resumed_step": self.resumed_step,
            "root": self.root,
            "timings": self.timings,
            "checks": [asdict(c) for c in self.checks],
            "command": self.command,
        }

    def render(self) -> str:
        width = max((len(c.name) for c in self.checks), default=10)
        lines = [f"preemptible drill: {self.source} notice, {self.window_s:g} s window", ""]
        for c in self.checks:
            lines.append(f"  {'PASS' if c.passed else 'FAIL'}  {c.name.ljust(width)}  {c.detail}")
        lines.append("")
        names = {
            "notice_to_boundary_s": "notice -> step boundary",
            "notice_to_commit_s": "notice -> checkpoint committed",
            "notice_to_exit_s": "notice -> process exited",
            "restart_to_resumed_s": "restart -> training again",
        }
        for key, label in names.items():
            value = self.timings.get(key)
            if value is not None:
                share = f"  ({100 * value / self.window_s:.0f}% of the window)" if key != "restart_to_resumed_s" else ""
                lines.append(f"  {label:32s} {value:8.2f} s{share}")
        lines += [
            "",
            f"{'PASSED' if self.passed else 'FAILED'}: {sum(c.passed for c in self.checks)}/{len(self.checks)} checks",
        ]
        return "\n".join(lines)


def _t(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["t"]).replace("Z", "+00:00")).timestamp()


def _clean_exit(code: int | None, child: _Child) -> tuple[bool, str]:
    """Did the process end with the code its `Run` chose after the notice? torchrun's agent is the exception it
    cannot help: it exits 1 after a SIGTERM (its SignalException) even when every worker exited as chosen."""
    if code is None:
        return False, "still running"
    exits = child.events("exit")
    expected = exits[-1].get("code") if exits else None
    if expected is None:
        return False, f"exit code {code}, and the run journaled no exit: it did not stop on purpose"
    if code == expected:
        return True, f"exit code {code}"
    starts = child.events("start")
    ranks = starts[-1].get("world_size", 1) if starts else 1
    if code == 1 and isinstance(ranks, int) and ranks > 1:
        return True, (
            f"exit code 1 from torchrun's agent after the signal; rank 0 chose {expected} (torchrun exits 1 after "
            "a SIGTERM: see the README's torchrun section for how to make the orchestrator restart the job)"
        )
    return False, f"exit code {code}; the run chose {expected}"


class _Child:
    """One start of the command, followed through its report file."""

    def __init__(
        self, command: Sequence[str], env: dict[str, str], report_path: str, log_path: str, drill: Drill
    ) -> None:
        self.report_path = report_path
        self._clock, self._monotonic, self._sleep = drill.clock, drill.monotonic, drill.sleep
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.started = self._clock()
        self.proc = subprocess.Popen(
            list(command), env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.exited_at: float | None = None
        self.code: int | None = None

    def report(self) -> dict[str, Any]:
        try:
            with open(self.report_path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return {"events": []}
        return doc if isinstance(doc, dict) else {"events": []}

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.report().get("events", []) if e.get("event") == name]

    def entered(self) -> list[dict[str, Any]]:
        """Its Run's event of entering the loop (``fresh`` or ``resume``), once it has."""
        return [e for e in self.report().get("events", []) if e.get("event") in ("fresh", "resume")]

    def poll(self) -> int | None:
        if self.code is None:
            code = self.proc.poll()
            if code is not None:
                self.code, self.exited_at = code, self._clock()
        return self.code

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        end = self._monotonic() + timeout
        while self._monotonic() < end:
            if predicate():
                return True
            if self.poll() is not None:
                return predicate()
            self._sleep(0.02)
        return predicate()

    def wait(self, timeout: float) -> int | None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()

    def tail(self, n: int = 15) -> str:
        self.log.flush()
        try:
            with open(self.log.name, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""


class Drill:
    """Rehearses one preemption of ``command``; `run` returns the `DrillReport`.

    Args:
        command: the training command (it must use `preemptible.Run`).
        source: how the notice comes: ``signal`` (SIGTERM), ``sigint``, ``slurm`` (SIGUSR1), ``aws``, ``gcp``,
            ``azure`` (through that cloud's emulator).
        at: seconds after the loop starts to deliver the notice, or ``"random"`` (uniformly 1-10 s).
        window: the notice window to grade against (default: the platform's: AWS 120 s, GCP/Azure 30 s, ...).
        root: the checkpoint root, to check the commit on storage as well (default: what the run reports).
        reference: also run the command uninterrupted and compare the final states (needs a command that ends).
        start_timeout: how long to wait for the command's `Run` to enter its loop.
        progress: called with a line of text as the drill goes.
        clock, monotonic, sleep: epoch seconds, a monotonic clock and a sleep (injected by tests).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        source: str = "signal",
        at: float | str = DEFAULT_AT_S,
        window: float | None = None,
        root: str | None = None,
        reference: bool = False,
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
        if at != "random" and (not isinstance(at, (int, float)) or at < 0):
            raise PreemptibleError(f"expected --at to be seconds >= 0 or 'random'; found {at!r}")
        self.command = list(command)
        self.source = source
        self.at = at
        self.window = window if window is not None else default_window(source)
        self.root = root
        self.reference = reference
        self.start_timeout = start_timeout
        self.finish_timeout = finish_timeout
        self.progress = progress
        self._workdir = ""
        self._emulator: Any = None
        self._loop_s: float | None = None
        """How long the reference run's loop lasted (from entering it to ``done``), when it ran."""
        self._since: float | None = None
        """The drill's start on the file system's clock, less `MTIME_SLACK_S` (`files_written_aside`)."""

    # set-up -------------------------------------------------------------------------------------------------
    def _env(self, label: str, **extra: str) -> tuple[dict[str, str], str]:
        report_path = os.path.join(self._workdir, f"{label}.report.json")
        env = {k: v for k, v in os.environ.items() if k not in (relay.NOTICE_FILE_ENV, ROOT_ENV)}
        env.update({relay.REPORT_FILE_ENV: report_path, "PYTHONUNBUFFERED": "1", **extra})
        if self.source in SIGNALS or label == "reference":
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

    def _start(self, label: str, **extra: str) -> _Child:
        env, report_path = self._env(label, **extra)
        self.progress(f"drill: starting the command ({label})")
        return _Child(self.command, env, report_path, os.path.join(self._workdir, f"{label}.log"), self)

    def _deliver(self, child: _Child) -> float:
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
        if self.at != "random":
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
        report = DrillReport(self.source, self.window, self.command, root=self.root)
        self._workdir = tempfile.mkdtemp(prefix="preemptible-drill-")
        self._since = time.time() - MTIME_SLACK_S  # the file system's clock: for the files the runs write
        children: list[_Child] = []
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

    def _reference(self, report: DrillReport, children: list[_Child]) -> str | None:
        """Runs the command to its end on a root of its own; that root, or None when it did not finish."""
        ref_root = os.path.join(self._workdir, "reference-root")
        child = self._start("reference", **{ROOT_ENV: ref_root})
        children.append(child)
        code = child.wait(self.finish_timeout)
        done = child.events("done")
        began = child.entered()
        if done and began:
            self._loop_s = _t(done[-1]) - _t(began[0])
        ok = code == 0 and bool(done)
        detail = f"exit {code}, finished at step {done[-1]['step']}" if ok else f"exit {code}; output:\n{child.tail()}"
        return ref_root if report.check("reference run finished uninterrupted", ok, detail) else None

    def _drill(self, report: DrillReport, children: list[_Child], reference_root: str | None) -> None:
        delay = self._delay()
        if self._loop_s is not None and delay >= self._loop_s:
            report.check(
                "the run is still training when the notice comes",
                False,
                self._too_late(delay, f"the reference run's loop ended {self._loop_s:.1f} s after it began"),
            )
            return
        first = self._start("first")
        children.append(first)
        entered = first.wait_for(lambda: bool(first.entered()), self.start_timeout)
        doc = first.report()
        report.root = self.root or doc.get("root")
        if not report.check(
            "the command's Run started",
            entered,
            f"root {report.root}" if entered else self._not_started(first),
        ):
            return
        if reference_root is not None and first.events("resume"):
            report.check(
                "the drilled run starts fresh",
                False,
                f"it resumed from step {first.events('resume')[0]['step']}: point the command at an empty root for "
                "a --reference drill, or delete the old checkpoints",
            )
            return
        self.sleep(delay)
        done = first.events("done")
        if first.poll() is not None or done:
            # A loop that has ended (a process still exiting, or one that evaluates or uploads after it) has
            # nothing to stop: a signal now would only kill what comes after the loop, or find its default handler.
            ended = f"its loop ended at step {done[-1]['step']}" if done else f"it exited {first.code}"
            report.check("the run is still training when the notice comes", False, self._too_late(delay, ended))
            return
        t_notice = self._deliver(first)
        code = first.wait(self.window + SLACK_S)
        if code is None:
            report.check("the process exited after the notice", False, self._hung(first))
            return
        assert first.exited_at is not None
        notices = first.events("notice")
        commits = [e for e in first.events("save_committed") if e.get("reason") in ("emergency", "prestaged")]
        report.timings["notice_to_exit_s"] = round(first.exited_at - t_notice, 3)
        if notices:
            report.timings["notice_to_boundary_s"] = round(_t(notices[0]) - t_notice, 3)
        if commits:
            report.timings["notice_to_commit_s"] = round(_t(commits[-1]) - t_notice, 3)
        seen = notices[0] if notices else None
        report.check(
            "the notice reached the run",
            seen is not None,
            f"{seen['source']} {seen['kind']} at step {seen['step']}"
            if seen
            else "no notice in the journal: " + first.tail(5),
        )
        skipped = [e for e in first.events("save_skipped") if e.get("reason") == "emergency"]
        step = commits[-1]["step"] if commits else (skipped[-1]["step"] if skipped else None)
        report.checkpoint_step = step
        committed = bool(commits) and self._on_storage(report.root, step)
        report.check(
            "a checkpoint committed after the notice",
            committed or bool(skipped),
            f"step {step}" + (" (nothing new since the last one)" if skipped and not commits else "")
            if step is not None
            else "no emergency save committed",
        )
        clean, detail = _clean_exit(code, first)
        report.check("the process exited cleanly", clean, detail)
        within = report.timings["notice_to_exit_s"] is not None and report.timings["notice_to_exit_s"] <= self.window
        report.check(
            "exit within the window", within, f"{report.timings['notice_to_exit_s']:.2f} s of {self.window:g} s"
        )
        if step is None:
            return
        second = self._start("restart")
        children.append(second)
        t0 = self.clock()
        resumed = second.wait_for(lambda: bool(second.entered()), self.start_timeout)
        resumes = second.events("resume")
        report.resumed_step = resumes[0]["step"] if resumes else (0 if second.events("fresh") else None)
        if resumes:
            report.timings["restart_to_resumed_s"] = round(_t(resumes[0]) - t0, 3)
        report.check(
            "the restart resumed from that checkpoint",
            resumed and report.resumed_step == step,
            f"resumed at step {report.resumed_step}" if resumed else self._not_started(second),
        )
        if reference_root is not None:
            self._finish_and_compare(report, second, reference_root)
        else:
            self._second_notice(report, second)

    def _second_notice(self, report: DrillReport, child: _Child) -> None:
        self.sleep(min(self._delay(), 1.0))
        if child.poll() is not None:
            report.check(
                "a second notice stops the resumed run", child.code == 0, f"it had already exited {child.code}"
            )
            return
        self._deliver(child)
        code = child.wait(self.window + SLACK_S)
        ok, detail = _clean_exit(code, child)
        report.check("a second notice stops the resumed run", ok, detail if code is not None else self._hung(child))

    def _finish_and_compare(self, report: DrillReport, child: _Child, reference_root: str) -> None:
        code = child.wait(self.finish_timeout)
        done = child.events("done")
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
        if not same:
            detail = f"differ: {', '.join(differing) or 'missing'}"
            if ours is not None and theirs is not None:
                detail += "\n" + explain_difference(
                    report.root, reference_root, done[-1]["step"], written_since=self._since
                )
        report.check("final state bit-identical to the uninterrupted run", same, detail)

    # helpers ------------------------------------------------------------------------------------------------
    @staticmethod
    def _final_state(root: str | None, step: int, *, written_since: float | None = None) -> dict[str, str] | None:
        """The training state of a final checkpoint: each tensor file's checksum, and the JSON leaves. The RNG
        streams are left out: a generator the script never seeds (Python's, NumPy's) differs between any two
        runs, interrupted or not; the streams training draws from show in the weights. ``written_since``: the
        names of files the runs wrote since then are set aside (`files_written_aside`)."""
        if root is None:
            return None
        from preemptible.checkpoint import Checkpointer

        try:
            ck = Checkpointer(root)
            info = ck.verify(step)
            tree = json.loads(ck.storage.read_bytes(ck.storage.join(info.path, "state.json"), 1 << 30))["tree"]
        except Exception:
            return None
        if info.manifest is None:
            return None
        files = _plain_checksums(ck, info)
        state = {k: v for k, v in files.items() if not k.startswith("_rng")}
        tree = _without_records({k: v for k, v in tree.items() if not k.startswith("_")})
        if written_since is not None:
            tree = files_written_aside(tree, written_since)
        state["state.json"] = json.dumps(tree)
        return state

    @staticmethod
    def _on_storage(root: str | None, step: int | None) -> bool:
        if root is None or step is None:
            return False
        from preemptible.checkpoint import Checkpointer

        try:
            return Checkpointer(root).is_committed(int(step))
        except Exception:
            return False

    def _hung(self, child: _Child) -> str:
        """What a run that outlived its notice last did: its last journaled event and its last output."""
        events = [e for e in child.report().get("events", []) if isinstance(e, dict)]
        last = events[-1] if events else {}
        if last.get("event") == "exit" and last.get("reason") == "notice":
            done = (
                f"its Run stopped at step {last.get('step')} (saved: {last.get('saved')}) and chose exit code "
                f"{last.get('code')}, yet the process lives on: code after the loop (an evaluation, an upload, a "
                "thread that is not a daemon) or, under a launcher, a rank or the launcher itself is holding it"
            )
        elif last:
            done = f"it last journaled {last.get('event')} at step {last.get('step')}"
        else:
            done = "it journaled nothing"
        return f"still running {self.window + SLACK_S:g} s after it; {done}; its last output:\n{child.tail(10)}"

    def _not_started(self, child: _Child) -> str:
        if child.poll() is not None:
            return f"the command exited {child.code} before its Run entered the loop; output:\n{child.tail()}"
        return (
            f"no Run reported within {self.start_timeout:g} s through ${relay.REPORT_FILE_ENV}; expected the command "
            "to train with preemptible.Run (for other commands, rehearse with preemptible run)"
        )


LIKELY_CAUSES = (
    "Likely causes, most common first: the batches after the resume are not the ones the uninterrupted run "
    "trained on (a batch fetched before the checkpoint and trained on after it, i.e. prefetched; a DataLoader "
    "iterator made before the restore, so its shuffle seed was drawn from the streams before they were put back; a "
    "loader whose position is not in the state: give a stateful loader to Run, or loop with run.batches); or "
    "random draws from a generator that is not saved (a torch.Generator of the script's own, a framework's private "
    "stream). Differences within a few units in the last place, all over, instead point at kernels that are not "
    "deterministic (threads, atomics): set torch.use_deterministic_algorithms(True)."
)


def explain_difference(
    ours_root: str | None, theirs_root: str, step: int, *, shown: int = 8, written_since: float | None = None
) -> str:
    """Which entries of two final checkpoints differ and by how much, with the likely causes: what a drill with
    ``--reference`` says when the resumed run did not end where the uninterrupted one did. ``written_since``: as
    for `Drill._final_state`."""
    from preemptible.checkpoint import Checkpointer
    from preemptible.state import flatten

    try:
        ours = Checkpointer(str(ours_root)).load(step)
        theirs = Checkpointer(theirs_root).load(step)
    except Exception as e:  # the comparison by checksum above stands; this only adds detail
        return f"(could not read both final checkpoints to compare entries: {e})"
    a = flatten({k: v for k, v in ours.items() if not k.startswith("_")})
    b = flatten({k: v for k, v in theirs.items() if not k.startswith("_")})
    lines: list[str] = []
    names = sorted(set(a.tensors) | set(b.tensors))
    tensor_diffs = []
    for name in names:
        x, y = a.tensors.get(name), b.tensors.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            tensor_diffs.append(f"{name}: only in one, or another shape/dtype")
            continue
        if torch_equal(x, y):
            continue
        diff = (x.double() - y.double()).abs()
        tensor_diffs.append(
            f"{name}: {int((diff > 0).sum())} of {x.numel()} values, max |difference| {float(diff.max()):.3g}"
        )
    if tensor_diffs:
        lines.append(f"{len(tensor_diffs)} of {len(names)} tensors differ:")
        lines += [f"  {d}" for d in tensor_diffs[:shown]]
        if len(tensor_diffs) > shown:
            lines.append(f"  ... and {len(tensor_diffs) - shown} more")
    trees = [_without_records(a.tree), _without_records(b.tree)]
    if written_since is not None:
        trees = [files_written_aside(t, written_since) for t in trees]
    leaves = _json_leaves(trees[0], ""), _json_leaves(trees[1], "")
    json_diffs = sorted(k for k in set(leaves[0]) | set(leaves[1]) if leaves[0].get(k) != leaves[1].get(k))
    if json_diffs:
        shown_leaves = ", ".join(f"{k} ({leaves[0].get(k)!r} vs {leaves[1].get(k)!r})" for k in json_diffs[:shown])
        lines.append(f"{len(json_diffs)} non-tensor values differ (resumed vs uninterrupted): {shown_leaves}")
    lines.append(LIKELY_CAUSES)
    return "\n".join(lines)


def torch_equal(x: Any, y: Any) -> bool:
    import torch

    return bool(torch.equal(x, y))


RECORDS = ("log_history",)
"""Keys whose values record what happened rather than hold training state (a framework's log), left out of the
comparison with the reference run; so are leaves that measure wall-clock time (``*runtime``, ``*per_second``)."""


MTIME_SLACK_S = 2.0
"""How long before the drill's start a directory's modification time may be and still count as written during it
(file systems that stamp coarsely, or a clock that moved)."""

WRITTEN = "<a file the run wrote>"


def files_written_aside(tree: Any, since: float) -> Any:
    """``tree`` with each absolute path to a file in a directory written since ``since`` (seconds of the file
    system's clock) replaced by `WRITTEN`, as a value or as a key (keys numbered in their order).

    Why: the reference run and the drilled one write the framework's own files (Lightning's ``ModelCheckpoint``,
    the HF Trainer's ``output_dir``) to the same place, unless the script derives that place from the root the drill
    overrides, so the second run's names get a version suffix (``epoch=2-step=56-v1.ckpt``) and the states
    differ in a way that says nothing about the resume. Paths to data the runs only read are left as they are: their
    directories were not written during the drill."""
    if isinstance(tree, dict):
        out: dict[Any, Any] = {}
        for i, (k, v) in enumerate(tree.items()):
            key = f"{WRITTEN} #{i}" if isinstance(k, str) and _written(k, since) else k
            out[key] = files_written_aside(v, since)
        return out
    if isinstance(tree, list):
        return [files_written_aside(v, since) for v in tree]
    if isinstance(tree, str) and _written(tree, since):
        return WRITTEN
    return tree


def _written(value: str, since: float) -> bool:
    if not os.path.isabs(value) or len(value) > 4096 or "\n" in value:
        return False
    try:
        return os.stat(os.path.dirname(value)).st_mtime >= since
    except (OSError, ValueError):  # not a path on this machine
        return False


def _without_records(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {
            k: _without_records(v)
            for k, v in sorted(tree.items())
            if k not in RECORDS and not str(k).endswith(("runtime", "per_second"))
        }
    if isinstance(tree, list):
        return [_without_records(v) for v in tree]
    return tree


def _json_leaves(tree: Any, path: str) -> dict[str, Any]:
    """Flattened non-tensor leaves of a tagged tree, by key path (tensor references compare as names)."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_json_leaves(v, f"{path}/{k}" if path else str(k)))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out.update(_json_leaves(v, f"{path}/{i}"))
    else:
        out[path] = tree
    return out


def _plain_checksums(ck: Any, info: Any) -> dict[str, str]:
    """Each tensor file's checksum as a plain safetensors file, by its plain name: a compressed file's decoded bytes
    are exactly that file, so two runs compare alike whether or not either compressed."""
    from preemptible.checkpoint.reader import open_tensor
    from preemptible.store import checksum, layout

    out: dict[str, str] = {}
    directory = info.manifest.file_dir(ck.storage.join, info.path)
    for name, rec in info.manifest.files.items():
        if not layout.is_tensor_file(name):
            continue
        if not name.endswith(".zst"):
            out[name] = rec.checksum
            continue
        hasher = checksum.new()
        buf = memoryview(bytearray(8 << 20))
        with open_tensor(ck.storage, ck.storage.join(directory, name), rec, None) as (source, _, _):
            while n := source.readinto(buf):
                hasher.update(buf[:n])
        out[name.removesuffix(".zst")] = hasher.hexdigest()
    return out
