"""What a line of a log (or the journal, or an exit code) says about how a run ended: `Evidence`."""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace

from preemptible.diagnose._rules import PEER_NODE

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
    actor: str | None = None  # who wrote the line: "rank 3", "node gpu-q-13" (see `_incident.actor`)
    time: str | None = None  # the line's timestamp, else the last one before it in the same log (`_incident.when`)
    reported: bool = False  # an exit code or signal as a launcher, shell or scheduler reports it, not the process


_EXIT_SIGNALS = {int(s): s.name for s in signal.Signals}
EXIT_PEER_NODE = 76
"""`preemptible.emergency.EXIT_PEER_NODE` (not imported: the read side imports nothing of the write side)."""
_CODES = {124: ("time-limit", "timeout(1) ran out"), EXIT_PEER_NODE: ("crashed", PEER_NODE)}
"""Exit codes that say more than a failure: (verdict, what it means)."""


def exit_evidence(code: int, what: str, where: str, line: int | None, text: str, *, strong: bool = False) -> Evidence:
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
    if code in _CODES:
        verdict, meaning = _CODES[code]
        return Evidence(verdict, "weak", f"{what} {code}: {meaning}", where, line, text)
    return Evidence("crashed", strength, f"{what} {code}: the program reported a failure", where, line, text)
