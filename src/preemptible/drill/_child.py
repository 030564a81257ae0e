"""One start of the drilled command, followed through the report file its `Run` writes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from preemptible.events import Event
from preemptible.journal import Record, records
from preemptible.store.io import storage_for

SLACK_S = 30.0  # beyond the window, how long the drill waits for an exit before it calls the run hung


def newest_committed(root: str | None) -> int | None:
    """The newest committed checkpoint's step under ``root`` (None: none, or a root that cannot be read)."""
    if root is None:
        return None
    from preemptible.checkpoint import Checkpointer

    try:
        return Checkpointer(root).latest()
    except Exception:
        return None


def on_storage(root: str | None, step: int | None) -> bool:
    """Whether ``step`` is committed under ``root``."""
    if root is None or step is None:
        return False
    from preemptible.checkpoint import Checkpointer

    try:
        return Checkpointer(root).is_committed(int(step))
    except Exception:
        return False


class Clocks(Protocol):
    """The drill's clocks (injected by tests)."""

    clock: Callable[[], float]
    monotonic: Callable[[], float]
    sleep: Callable[[float], None]


def event_time(record: Record) -> float:
    """When an event of the report file happened (epoch seconds)."""
    if record.time is None:
        raise ValueError(f"expected an event time (UTC ISO 8601) in the report file; found {record.get('t')!r}")
    return record.time


def clean_exit(code: int | None, child: Child) -> tuple[bool, str]:
    """Did the process end with the code its `Run` chose after the notice? torchrun's agent is the exception it
    cannot help: it exits 1 after a SIGTERM (its SignalException) even when every worker exited as chosen."""
    if code is None:
        return False, "still running"
    exits = child.events(Event.EXIT)
    expected = exits[-1].get("code") if exits else None
    if expected is None:
        return False, f"exit code {code}, and the run journaled no exit: it did not stop on purpose"
    if code == expected:
        return True, f"exit code {code}"
    starts = child.events(Event.START)
    ranks = starts[-1].get("world_size", 1) if starts else 1
    if code == 1 and isinstance(ranks, int) and ranks > 1:
        return True, (
            f"exit code 1 from torchrun's agent after the signal; rank 0 chose {expected} (torchrun exits 1 after "
            "a SIGTERM: see docs/distributed.md (torchrun) for how to make the orchestrator restart the job)"
        )
    return False, f"exit code {code}; the run chose {expected}"


class Exits:
    """A process whose exit is recorded the first time it is seen, with the time seen (``proc``, ``_clock``)."""

    proc: subprocess.Popen[bytes]
    _clock: Callable[[], float]
    code: int | None = None
    exited_at: float | None = None

    def poll(self) -> int | None:
        if self.code is None:
            code = self.proc.poll()
            if code is not None:
                self.code, self.exited_at = code, self._clock()
        return self.code


class Child(Exits):
    """One start of the command, followed through its report file."""

    def __init__(
        self, command: Sequence[str], env: dict[str, str], report_path: str, log_path: str, drill: Clocks
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

    def records(self) -> list[Record]:
        """The events its Run has reported so far (the milestones of its journal)."""
        events = self.report().get("events", [])
        return [Record.of(e) for e in events if isinstance(e, Mapping)] if isinstance(events, list) else []

    def events(self, event: Event) -> list[Record]:
        return [r for r in self.records() if r.event == event]

    def held(self) -> Record | None:
        """What its Run said of the drill's mid-epoch aim (`preemptible.relay.AIM_ENV`): the ``progress`` event with
        ``held`` (True: it holds there now; False: its loop has no epochs to aim at), once it has."""
        said = [r for r in self.events(Event.PROGRESS) if isinstance(r.get("held"), bool)]
        return said[0] if said else None

    def journal_records(self) -> list[Record]:
        """Every event of this start's own journal file (rank 0's), read from its root after the fact."""
        doc = self.report()
        root, path = doc.get("root"), doc.get("journal")
        if not isinstance(root, str) or not isinstance(path, str):
            return []
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        try:
            return [r for r in records(storage_for(root)) if r.file == name and r.rank == 0]
        except OSError:
            return []

    def entered(self) -> list[Record]:
        """Its Run's event of entering the loop (``fresh`` or ``resume``), once it has."""
        return [r for r in self.records() if r.event in (Event.FRESH, Event.RESUME)]

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
