"""What a save returns: `SaveResult` once it has committed, and `SaveHandle` while it may still be writing.

Like torchsnapshot's ``PendingSnapshot``: ``done()`` never blocks, ``wait()`` re-raises the save's own exception
(same type, same object).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from preemptible.writer import Progress


@dataclass(frozen=True, kw_only=True)
class SaveResult:
    """What a finished save did.

    Attributes:
        step: the step saved.
        path: its directory.
        bytes: bytes written (0 when the step was already committed).
        seconds: wall time from the call to the commit.
        timings: seconds by phase (capture, write, commit).
        skipped: True when the step was already committed and nothing was written.

    Examples:
        >>> import tempfile, torch
        >>> from preemptible import Checkpointer
        >>> ck = Checkpointer(tempfile.mkdtemp())
        >>> result = ck.save({"model": torch.nn.Linear(2, 2)}, step=1).wait()
        >>> result.step, result.skipped, result.bytes > 0
        (1, False, True)
        >>> ck.save({"model": torch.nn.Linear(2, 2)}, step=1).wait().skipped  # already committed: not rewritten
        True
    """

    step: int
    path: str
    bytes: int
    seconds: float
    timings: Mapping[str, float] = field(default_factory=dict)
    skipped: bool = False
    predicted_s: float | None = None

    @property
    def throughput(self) -> float:
        """Bytes per second (0 when skipped)."""
        return self.bytes / self.seconds if self.seconds > 0 and not self.skipped else 0.0


class SaveHandle:
    """A save in progress or done.

    ``done()`` never blocks; ``wait()`` blocks until the save has committed (or failed) and returns its
    `SaveResult`, re-raising the save's own exception (same type, same object) if it failed. ``cancel()`` abandons
    an asynchronous save that has not committed yet (it then raises `SaveCancelled` from ``wait()``).

    Raises:
        SaveError: from ``wait()``, when the save failed (nothing was committed; earlier checkpoints are intact).
        SaveCancelled: from ``wait()``, when the save was cancelled before it committed.

    Examples:
        >>> import tempfile, torch
        >>> from preemptible import Checkpointer
        >>> handle = Checkpointer(tempfile.mkdtemp()).save({"model": torch.nn.Linear(2, 2)}, step=3, blocking=False)
        >>> handle.wait().step, handle.done()
        (3, True)
    """

    def __init__(
        self,
        step: int,
        *,
        result: SaveResult | None = None,
        error: BaseException | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.step = step
        self._result = result
        self._error = error
        self._thread: threading.Thread | None = None
        self.progress = progress or Progress()
        self.asynchronous = False

    def __repr__(self) -> str:
        state = "done" if self.done() else f"writing {self.progress.done}/{self.progress.total} bytes"
        return f"SaveHandle(step={self.step}, {state})"

    def start(self, write: Callable[[], SaveResult], *, name: str, committed: Callable[[], None] | None = None) -> None:
        """Run ``write`` in a thread of its own named ``name``: its result, or its exception, become this handle's;
        then, once it has committed, ``committed`` runs in that thread."""

        def body() -> None:
            try:
                self._result = write()
            except BaseException as e:
                self._error = e
            if self._error is None and committed is not None:
                committed()

        self._thread = threading.Thread(target=body, name=name)
        self._thread.start()

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> SaveResult:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the save of step {self.step} is still writing after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> bool:
        """Abandon the save if it has not committed; True if it was still running."""
        self.progress.cancelled.set()
        return not self.done()

    @property
    def result(self) -> SaveResult | None:
        return self._result

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def bytes_left(self) -> int:
        return max(0, self.progress.total - self.progress.done) if not self.done() else 0
