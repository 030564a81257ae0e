"""Run: the training loop wrapper that ties notice, save, exit and resume together.

``for step in run.steps(total)`` resumes after the newest valid checkpoint, saves periodically, and at the
first step boundary after a notice writes the emergency checkpoint and ends the process with the exit
policy's code. Everything it does is written to the journal.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from preemptible import dist
from preemptible._version import __version__
from preemptible.errors import PreemptibleError, UnsupportedStateError
from preemptible.guard import Guard
from preemptible.journal import Journal
from preemptible.notice import Clock, Notice, NoticeKind, NoticeSource
from preemptible.sources import slurm
from preemptible.state import RNGState, check_state
from preemptible.store import layout
from preemptible.store.checkpointer import Checkpointer, SaveResult

log = logging.getLogger("preemptible")

EXIT_PREEMPTED = 0
"""Default exit code after a successful emergency save: a clean, intentional stop."""
EXIT_SAVE_FAILED = 75
"""Exit code when the emergency save failed (EX_TEMPFAIL): nothing new committed, the previous checkpoint is
intact, restart the job."""
EXIT_CODE_ENV = "PREEMPTIBLE_EXIT_CODE"

_RNG = "_rng"
_RUN = "_run"


class Run:
    """A preemption-safe training run.

    Args:
        root: where checkpoints and the journal live (a local path).
        save_every: save every this many completed steps (``step % save_every == 0``). None: no step-based saves.
        save_interval_s: save when this many seconds have passed since the last save. None: no time-based saves.
        keep: committed checkpoints kept (>= 2); the newest validated one is kept in addition.
        sources: notice sources (see `Guard`); None auto-detects, ``$PREEMPTIBLE_SOURCES`` overrides.
        grace: seconds from a signal to the hard kill (the deadline of signal notices). None: the platform's
            default (see `Guard`).
        exit_code: the process's exit code after an emergency save. None: ``$PREEMPTIBLE_EXIT_CODE``, else the
            platform's default: 143 on Kubernetes (so a Job does not count the pod as Succeeded), 0 elsewhere.
        on_advisory: what an advisory notice (AWS rebalance recommendation) does: ``"save"`` (default) an
            early checkpoint at the next boundary while training goes on, ``"stop"`` treat it as a notice,
            ``"ignore"``.
        requeue: SLURM only: ``scontrol requeue`` the job after a successful emergency save. None:
            ``$PREEMPTIBLE_SLURM_REQUEUE``.
        exit_on_notice: True (default) ends the process after the emergency save; False ends ``steps()``
            instead and leaves ``run.notice`` set, for loops that must do more before exiting.
        guard: a ready `Guard` to use instead of building one from ``sources``/``grace``.
        clock: epoch seconds; monotonic: a monotonic clock (both injected by tests).
        **state: what to checkpoint: modules, optimizers, schedulers, GradScaler, stateful data loaders (anything
            with ``state_dict``/``load_state_dict``) and plain dicts (updated in place on restore). RNG streams
            are added automatically. Names must not start with ``_``.

    Raises:
        UnsupportedStateError: a state entry that cannot be checkpointed, naming it.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        save_every: int | None = None,
        save_interval_s: float | None = None,
        keep: int = 2,
        sources: str | Iterable[str | NoticeSource] | None = None,
        grace: float | None = None,
        exit_code: int | None = None,
        exit_on_notice: bool = True,
        on_advisory: str = "save",
        requeue: bool | None = None,
        guard: Guard | None = None,
        clock: Clock = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        **state: Any,
    ) -> None:
        for name in state:
            if name.startswith("_"):
                raise UnsupportedStateError(
                    f"state name {name!r} starts with '_', which preemptible reserves for its own entries; rename it",
                    key=name,
                )
        check_state(state)
        if save_every is not None and save_every < 1:
            raise ValueError(f"expected save_every >= 1 or None, found {save_every}")
        if save_interval_s is not None and save_interval_s <= 0:
            raise ValueError(f"expected save_interval_s > 0 or None, found {save_interval_s}")
        if on_advisory not in ("save", "stop", "ignore"):
            raise ValueError(f"expected on_advisory to be 'save', 'stop' or 'ignore', found {on_advisory!r}")
        self.on_advisory = on_advisory
        self.requeue = requeue
        self.root = os.fspath(root)
        self.save_every = save_every
        self.save_interval_s = save_interval_s
        self.exit_code = exit_code
        self.exit_on_notice = exit_on_notice
        self._clock = clock
        self._monotonic = monotonic
        self.rank = dist.rank()
        self.journal: Journal | None = None
        self.checkpointer = Checkpointer(self.root, keep=keep, clock=clock, monotonic=monotonic)
        self.guard = guard if guard is not None else Guard(sources, grace=grace, clock=clock)
        self._meta: dict[str, Any] = {}
        self.state: dict[str, Any] = {**state, _RNG: RNGState(), _RUN: self._meta}
        self.step: int = 0
        """Completed steps so far (the step a checkpoint taken now would carry)."""
        self.resumed_from: int | None = None
        """The step restored at start, or None for a fresh start."""
        self.preempted = False
        """True once an emergency save has ended the loop."""
        self.last_save: SaveResult | None = None
        self._last_save_time = 0.0
        self._entered = False
        self._advisory_done = False

    def __repr__(self) -> str:
        names = [n for n in self.state if not n.startswith("_")]
        return f"Run({self.root!r}, state={names}, step={self.step})"

    # lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> Run:
        self._open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _open(self) -> None:
        if self._entered:
            return
        _ensure_log_handler()
        self.journal = Journal(self.checkpointer.storage, rank=self.rank, clock=self._clock)
        self.checkpointer.journal = self.journal
        self.guard.start()
        self._entered = True

    def close(self) -> None:
        """Remove signal handlers, stop pollers, flush the journal. Idempotent."""
        self.guard.close()
        if self.journal is not None:
            self.journal.close()
        self._entered = False

    @property
    def notice(self) -> Notice | None:
        """The notice that stopped (or will stop) this run, or None."""
        return self.guard.notice

    # the loop ----------------------------------------------------------------------------------------------
    def steps(self, total: int) -> Iterator[int]:
        """Yield the step numbers still to run, ``0 .. total-1``, after restoring the newest valid checkpoint.

        At each boundary (when the loop body returns) it saves if a save is due, and after a notice it writes
        the emergency checkpoint and exits (see the class docs). After the last step it saves a final
        checkpoint and leaves ``DONE.json`` in the root, so a wrapper can tell "finished" from "preempted".
        """
        if total < 0:
            raise ValueError(f"expected total >= 0 steps, found {total}")
        opened_here = not self._entered
        self._open()
        assert self.journal is not None
        try:
            self.journal.event(
                "start",
                None,
                total=total,
                pid=os.getpid(),
                host=socket.gethostname(),
                version=__version__,
                world_size=dist.world_size(),
                sources=[s.name for s in self.guard.sources],
                argv=sys.argv,
            )
            start = self._resume()
            self.step = start
            if self.guard.should_stop(start):
                self._stop(start)  # a notice during restore: nothing new to save, exit promptly
                return
            if start >= total:
                self.journal.event("done", start, total=total, already=True)
                return
            self.checkpointer.storage.remove(self.checkpointer.storage.join(self.checkpointer.root, layout.DONE))
            self._last_save_time = self._monotonic()
            for step in range(start, total):
                yield step
                completed = step + 1
                self.step = completed
                if self.guard.should_stop(completed):
                    self._stop(completed)
                    return
                if self.guard.advisory is not None and not self._advisory_done and completed < total:
                    if self._advisory(completed):
                        return
                elif self._periodic_due(completed, total):
                    self._save(completed, "periodic")
                    if self.guard.should_stop(completed):  # a notice that came during the save
                        self._stop(completed)
                        return
            self._finish(total)
        finally:
            if opened_here:
                self.close()

    def log(self, **figures: Any) -> None:
        """Record figures (loss, throughput, ...) for the current step in the journal."""
        if self.journal is None:
            raise PreemptibleError("Run.log() needs a started run: call it inside `for step in run.steps(...)`")
        self.journal.event("log", self.step, **figures)

    def save(self, reason: str = "manual") -> SaveResult:
        """Save a checkpoint of the current step now (blocking)."""
        self._open()
        return self._save(self.step, reason, raise_errors=True)  # type: ignore[return-value]

    # internals ---------------------------------------------------------------------------------------------
    def _resume(self) -> int:
        assert self.journal is not None
        t0 = self._monotonic()
        self.checkpointer.cleanup()
        restored = self.checkpointer.restore(self.state)
        if restored is None:
            self.journal.event("fresh", 0)
            log.info("[rank=%d] no checkpoint under %s: starting at step 0", self.rank, self.root)
            return 0
        self.resumed_from = restored
        seconds = self._monotonic() - t0
        self.journal.event("resume", restored, seconds=round(seconds, 6))
        log.info("[rank=%d] resumed from the checkpoint of step %d (%.2f s)", self.rank, restored, seconds)
        return restored

    def _periodic_due(self, completed: int, total: int) -> bool:
        if completed >= total:
            return False  # the final save covers it
        if self.save_every is not None and completed % self.save_every == 0:
            return True
        return self.save_interval_s is not None and self._monotonic() - self._last_save_time >= self.save_interval_s

    def _save(
        self, step: int, reason: str, *, raise_errors: bool = False, deadline: float | None = None
    ) -> SaveResult | None:
        self._meta.clear()
        self._meta.update({"step": step, "saved_by": __version__})
        try:
            result = self.checkpointer.save(self.state, step, reason=reason, deadline=deadline).wait()
        except (OSError, PreemptibleError) as e:
            if raise_errors:
                raise
            log.warning("[rank=%d] %s save of step %d failed, training continues: %s", self.rank, reason, step, e)
            return None
        self._last_save_time = self._monotonic()
        self.last_save = result
        if not result.skipped:
            log.info(
                "[rank=%d] %s checkpoint of step %d committed: %.1f MB in %.2f s (%.0f MB/s)",
                self.rank,
                reason,
                step,
                result.bytes / 1e6,
                result.seconds,
                result.throughput / 1e6,
            )
        return result

    def _finish(self, total: int) -> None:
        assert self.journal is not None
        self._save(total, "final", raise_errors=True)
        storage = self.checkpointer.storage
        doc = f'{{"step": {total}, "finished": "{layout.now_iso(self._clock())}"}}\n'.encode()
        storage.publish(storage.join(self.checkpointer.root, layout.DONE), doc)
        self.journal.event("done", total, total=total)

    def _advisory(self, completed: int) -> bool:
        """An advisory notice: save early (and keep training), stop, or ignore. True when the loop must end."""
        assert self.journal is not None
        self._advisory_done = True
        notice = self.guard.advisory
        assert notice is not None
        self.journal.event("advisory", completed, **notice.to_json(), action=self.on_advisory)
        log.warning(
            "[rank=%d] advisory %s notice (%s): %s",
            self.rank,
            notice.source,
            notice.detail,
            {"save": "saving early, training continues", "stop": "stopping", "ignore": "ignored"}[self.on_advisory],
        )
        if self.on_advisory == "save":
            self._save(completed, "advisory")
        elif self.on_advisory == "stop":
            self.guard.trigger(
                Notice(
                    source=notice.source,
                    kind=NoticeKind.TERMINATE,
                    received_at=notice.received_at,
                    deadline=notice.deadline,
                    detail=f"{notice.detail} (on_advisory='stop')",
                )
            )
        if self.guard.should_stop(completed):
            self._stop(completed)
            return True
        return False

    def _exit_code(self) -> int:
        if self.exit_code is not None:
            return self.exit_code
        env = os.environ.get(EXIT_CODE_ENV, "").strip()
        if env:
            try:
                return int(env)
            except ValueError:
                log.warning("ignoring %s=%r: expected an integer exit code", EXIT_CODE_ENV, env)
        return self.guard.platform.exit_code

    def _stop(self, completed: int) -> None:
        """The emergency path: journal the notice, save (unless nothing new), exit."""
        assert self.journal is not None
        notice = self.guard.notice
        assert notice is not None
        remaining = self.guard.remaining()
        self.journal.event("notice", completed, **notice.to_json(), remaining_s=remaining)
        log.warning(
            "[rank=%d] %s notice (%s) received; stopping at step %d with %s left",
            self.rank,
            notice.source,
            notice.detail or notice.kind.value,
            completed,
            f"{remaining:.1f} s" if remaining is not None else "unknown time",
        )
        code = self._exit_code()
        saved = True
        if completed in (0, self.resumed_from):
            self.journal.event(
                "save_skipped", completed, reason="emergency", why="nothing new since the last checkpoint"
            )
        else:
            deadline = notice.deadline.timestamp() if notice.deadline is not None else None
            try:
                self._save(completed, "emergency", raise_errors=True, deadline=deadline)
                self.guard.acknowledge(notice)
            except BaseException as e:
                saved = False
                code = EXIT_SAVE_FAILED
                log.error("[rank=%d] emergency save of step %d failed: %s", self.rank, completed, e)
                if not isinstance(e, Exception):
                    raise
        if saved and self._requeue_wanted():
            self.journal.event("requeue", completed, ok=slurm.requeue())
        self.preempted = True
        repeats = len(self.guard.notices) - 1
        self.journal.event(
            "exit",
            completed,
            code=code,
            reason="notice",
            saved=saved,
            later_notices=repeats,
            remaining_s=self.guard.remaining(),
            exit_process=self.exit_on_notice,
        )
        self.journal.sync()
        if self.exit_on_notice:
            self.close()
            # Interpreter teardown with torch loaded spends 1-1.5 s in the final garbage collection; freezing
            # the heap skips that walk (atexit handlers and finally blocks still run) and cuts it to ~0.3 s.
            gc.freeze()
            raise SystemExit(code)

    def _requeue_wanted(self) -> bool:
        wanted = self.requeue if self.requeue is not None else slurm.requeue_wanted()
        return wanted and self.guard.platform.scheduler == "slurm"


def _ensure_log_handler() -> None:
    """Show preemptible's INFO lines on stderr unless the application configured logging itself."""
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("preemptible %(levelname)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
