"""Hold a Slurm ``--signal`` warning that arrives while Python is still starting.

SIGUSR1's default action ends the process. Slurm sends ``--signal=USR1@N`` up to 60 s earlier than asked, so with a
short time limit (or ``scancel --signal=USR1`` early on) it can arrive while the trainer is still importing torch,
before `preemptible` listens. The process then dies of it, and Slurm marks the job FAILED instead of letting it
checkpoint and requeue.

``preemptible_early.pth`` (installed with the package) calls `install` when Python starts inside a Slurm job
(``$SLURM_JOB_ID`` set) unless ``PREEMPTIBLE_EARLY=0``. It holds SIGUSR1: the handler only records when it arrived.
`preemptible.sources.signals.SignalSource` takes the held arrivals over when it starts and turns them into notices
dated when the signal came. A process that never starts a `SignalSource` (torchrun's agent, a data-loading helper)
keeps ignoring SIGUSR1, so it cannot die of it and take its workers' emergency save down with it.

Only the standard library, and nothing outside a Slurm job: this runs at every interpreter start.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from types import FrameType

HELD = (signal.SIGUSR1,)
arrivals: list[tuple[int, float]] = []
"""``(signal number, epoch seconds)`` of each held signal, in order of arrival."""


def hold(signum: int, frame: FrameType | None) -> None:
    # IMPORTANT: a signal handler: record and return.
    arrivals.append((signum, time.time()))


def take(signum: int) -> list[float]:
    """The arrival times of ``signum`` held so far, removed from the record."""
    times = [t for s, t in arrivals if s == signum]
    arrivals[:] = [(s, t) for s, t in arrivals if s != signum]
    return times


def install(environ: Mapping[str, str] = os.environ) -> bool:
    """Hold `HELD` signals whose action is still the default. True if anything is held."""
    if not environ.get("SLURM_JOB_ID") or environ.get("PREEMPTIBLE_EARLY", "1").strip() == "0":
        return False
    held = False
    for sig in HELD:
        if signal.getsignal(sig) == signal.SIG_DFL:  # ignored or handled already: not ours to change
            signal.signal(sig, hold)
            held = True
    return held
