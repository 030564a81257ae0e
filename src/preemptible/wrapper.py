"""``preemptible run -- CMD``: a wrapper that gives any training command the notices the library would.

- CMD runs in its own process group; SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 sent to the wrapper go to the
  whole group. That fixes the two classic traps: a shell wrapper (``sh -c``, a shell-form ENTRYPOINT) that does
  not pass signals on, and PID 1 in a container, which has no default action for SIGTERM.
- The cloud metadata sources the library would use (``PREEMPTIBLE_SOURCES``, the endpoint variables, or the
  machine's own evidence) are polled here; on a notice the wrapper writes it to ``$PREEMPTIBLE_NOTICE_FILE``
  (JSON: source, kind, deadline) and then sends the chosen signal (SIGTERM by default) to the group at once.
  A command that only handles SIGTERM (Lightning, the Hugging Face Trainer, torchrun) thereby gains AWS's and
  Azure's early notice; a command that uses preemptible reads the file and budgets with the real deadline.
- The wrapper is a child subreaper (and PID 1 in a container): orphaned descendants are reaped, never left as
  zombies.
- It exits with CMD's exit code (128 + N when CMD died of signal N).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from preemptible import dist, relay
from preemptible.errors import PreemptibleError
from preemptible.events import Event, tag
from preemptible.guard import Guard
from preemptible.notice import Clock, Notice
from preemptible.sources import detect

log = logging.getLogger("preemptible")

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Ask Linux to reparent orphaned descendants to this process (so it can reap them). False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def exit_status(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + N after signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


class Wrapper:
    """Runs ``command`` under notice relaying and signal forwarding; `run` returns its exit code.

    Args:
        command: the program and its arguments.
        sources: notice sources as the library takes them (None: ``$PREEMPTIBLE_SOURCES`` or detection).
            Signal sources are not polled here (the wrapper forwards signals instead).
        relay_signal: what to send the command's group on a cloud notice.
        clock: epoch seconds, for the notice's timestamps.
        poll_s: how often the main loop checks for the command's end (a notice wakes it at once).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        sources: str | None = None,
        relay_signal: signal.Signals = signal.SIGTERM,
        clock: Clock = time.time,
        poll_s: float = 0.05,
    ) -> None:
        if not command:
            raise PreemptibleError("expected a command to run after '--' (e.g. preemptible run -- python train.py)")
        self.command = list(command)
        self.relay_signal = relay_signal
        self.poll_s = poll_s
        pollers = [s for s in detect.resolve(sources, clock=clock) if s.name != "signal"]
        self.guard = Guard(pollers, clock=clock, agreement=dist.LocalAgreement())
        self.relayed: Notice | None = None
        self.forwarded: list[signal.Signals] = []
        self._early: list[signal.Signals] = []
        self.reaped_orphans = 0
        self._child: subprocess.Popen[bytes] | None = None
        self._wake = threading.Event()

    # signals ----------------------------------------------------------------------------------------------
    def _forward(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler: one syscall, no I/O. The loop logs it.
        sig = signal.Signals(signum)
        self.forwarded.append(sig)
        child = self._child
        if child is None:
            self._early.append(sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sig)
        self._wake.set()

    def _relay(self, notice: Notice, notice_file: str) -> None:
        assert self._child is not None
        relay.write_notice_file(notice_file, notice, relayed_as=self.relay_signal.name)
        try:
            os.killpg(self._child.pid, self.relay_signal)
        except ProcessLookupError:
            return
        self.relayed = notice
        left = notice.remaining(time.time())
        log.warning(
            "preemptible run: %s: %s %s notice (%s); sent %s to the command's process group, %s left",
            tag(Event.RELAY, source=notice.source),
            notice.source,
            notice.kind.value,
            notice.detail or "no detail",
            self.relay_signal.name,
            f"{left:.0f} s" if left is not None else "unknown time",
        )

    # the loop ---------------------------------------------------------------------------------------------
    def run(self) -> int:
        workdir = tempfile.mkdtemp(prefix="preemptible-run-")
        notice_file = os.path.join(workdir, "notice.json")
        env = {**os.environ, relay.NOTICE_FILE_ENV: notice_file}
        subreaper = become_subreaper() or os.getpid() == 1
        previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}
        try:
            try:
                # Its own process group, same session: a terminal's Ctrl-C reaches the wrapper, which forwards it.
                # (No thread runs yet, so setpgrp in the child before exec is safe where process_group is missing.)
                group: dict[str, Any] = (
                    {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
                )
                self._child = subprocess.Popen(self.command, env=env, **group)
            except OSError as e:  # as env(1) and container runtimes: 127 not found, 126 found but not runnable
                print(
                    f"preemptible run: cannot start {self.command[0]!r}: {e.strerror or e}; expected an executable "
                    "on PATH or a path to one",
                    file=sys.stderr,
                )
                return 127 if isinstance(e, FileNotFoundError) else 126
            for sig in self._early:  # signals that came while the command was starting: it gets them now
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._child.pid, sig)
            self.guard.start()
            code = self._loop(notice_file, subreaper)
            explained = self.explain(code)
            if explained:
                print(explained, file=sys.stderr, flush=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.guard.close()
            shutil.rmtree(workdir, ignore_errors=True)
        return code

    def _loop(self, notice_file: str, subreaper: bool) -> int:
        child = self._child
        assert child is not None
        logged = 0
        code: int | None = None
        while True:
            self._wake.wait(self.poll_s)
            self._wake.clear()
            while logged < len(self.forwarded):
                log.info("preemptible run: forwarded %s to the command's process group", self.forwarded[logged].name)
                logged += 1
            notice = self.guard.notice
            if notice is not None and self.relayed is None and not notice.kind.advisory:
                self._relay(notice, notice_file)
            if subreaper:
                reaped = self._reap(child.pid)
                if reaped is not None:
                    child.returncode = code = reaped  # reaped here, not by Popen
            elif code is None:
                status = child.poll()
                if status is not None:
                    code = 128 - status if status < 0 else status
            # The command may end before the rest of its group: a shell that died of the signal while the
            # training process under it still writes its checkpoint. Wait for the whole group.
            if code is not None and not self._group_alive(child.pid):
                return code

    def explain(self, code: int) -> str | None:
        """One line after the command's end when a stop the wrapper passed on made torchrun print a traceback: its
        agent raises ``SignalException`` on the SIGTERM (or SIGINT, SIGHUP) it was sent and prints it, though its
        workers stopped at a step boundary as asked. None otherwise."""
        sent = [s.name for s in self.forwarded] + ([self.relay_signal.name] if self.relayed is not None else [])
        if not sent or not _is_torchrun(self.command):
            return None
        return (
            f"preemptible run: torchrun's SignalException traceback above is torchrun reporting the {sent[0]} this "
            f"wrapper passed on, not a crash: its workers were asked to stop at a step boundary (their journal says "
            f"whether they committed: preemptible report ROOT); exit code {code}"
        )

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _reap(self, child_pid: int) -> int | None:
        """Reap every exited descendant; the command's exit code once it has exited."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            if pid == child_pid:
                return exit_status(status)
            self.reaped_orphans += 1


def _is_torchrun(command: Sequence[str]) -> bool:
    """``torchrun ...``, ``python -m torch.distributed.run ...`` (or ``.launch``): as `dist.agent_pid` knows it."""
    return any(name in arg for arg in command[:4] for name in dist.AGENT_NAMES)
