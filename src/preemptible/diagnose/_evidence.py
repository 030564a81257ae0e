"""What a line of a log (or the journal, or an exit code) says about how a run ended: `Evidence`."""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace

from preemptible.diagnose._rules import PEER_NODE, SIGKILL_ANY_SENDER

VERDICTS = (
    "preempted", "time-limit", "oom", "interrupted", "collective-timeout", "crashed", "terminated", "killed",
    "completed", "unknown",
)  # fmt: skip
"""In order of precedence: the first with evidence wins. ``interrupted`` is a user's own stop (Ctrl-C, a notebook's
interrupt): it explains the crash of clean-up code and the launcher's teardown that follow it."""


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


_NT_ERROR = 0xC0000000
_NT_INTERRUPT = (0xC000013A, 0xC000013A - (1 << 32))
"""Windows reports a process's NTSTATUS as its exit code: 0xC0000005 (an access violation) is 3221225477, or
-1073741819 as a signed number; every error code is at least 0xC0000000 (signed: below -255, beyond any signal)."""


def exit_evidence(code: int, what: str, where: str, line: int | None, text: str, *, strong: bool = False) -> Evidence:
    """Evidence from how a process ended (``code``: an exit code, or minus a signal number), as reported."""
    return replace(_ended(code, what, where, line, text, strong=strong), reported=True)


_BY_SIGNAL = {
    "SIGINT": ("interrupted", "died of SIGINT (Ctrl-C at a terminal, or a notebook's interrupt)"),
    **{
        name: ("terminated", f"died of {name}; the code does not say who sent it")
        for name in ("SIGTERM", "SIGHUP", "SIGQUIT")
    },
    "SIGUSR1": (
        "time-limit",
        "died of SIGUSR1: what a Slurm job asks for before its time limit (--signal=USR1@N); the code does not say "
        "who sent it",
    ),
    "SIGUSR2": (
        "time-limit",
        "died of SIGUSR2: what Grid Engine sends at a job's soft wall-clock limit (schedulers' wrappers such as "
        "Nextflow's report it as 140); the code does not say who sent it",
    ),
    "SIGKILL": ("killed", SIGKILL_ANY_SENDER),
    "SIGXCPU": ("time-limit", "died of SIGXCPU: a CPU-time limit ran out (ulimit -t, a scheduler's CPU-time limit)"),
    "SIGALRM": (
        "time-limit",
        "died of SIGALRM: an alarm timer ran out (a timeout the program or its wrapper set, signal.alarm)",
    ),
}
"""Signals that end a process from outside it: the verdict and what the ending says."""
_FAULTS = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL")
_OTHER = {
    "SIGPIPE": "its output's reader went away (a closed pipe or socket: `| head`, a dead tee or logger)",
    "SIGTRAP": "a trap: a breakpoint or a runtime's own check (V8's, a debugger's)",
    "SIGXFSZ": "a file grew past its size limit (ulimit -f)",
    "SIGSYS": "a forbidden system call (a seccomp profile)",
}
"""Other signals that end a process: a failure, named (any signal not listed reads as "died of SIGNAME")."""


def _ntstatus(code: int) -> bool:
    """An exit code only Windows reports: an NTSTATUS (Ctrl-C's, or an error's)."""
    return code in _NT_INTERRUPT or code < -255 or code >= _NT_ERROR


def _meaning(code: int) -> tuple[str, str, bool]:
    """What an exit code (or minus a signal number) says: (verdict, meaning, always strong)."""
    signum = -code if code < 0 else code - 128 if code > 128 else None
    name = _EXIT_SIGNALS.get(signum) if signum is not None else None
    if code in _NT_INTERRUPT:
        name = "SIGINT"  # Windows' STATUS_CONTROL_C_EXIT: Ctrl-C
    elif _ntstatus(code):
        return (
            "crashed",
            f"a Windows NTSTATUS error 0x{code & 0xFFFFFFFF:08X} (an access violation, a stack fault)",
            True,
        )
    if name in _BY_SIGNAL:
        return (*_BY_SIGNAL[name], False)
    if name in _FAULTS:
        return "crashed", f"died of {name}", True
    if name is not None:
        return "crashed", f"died of {name}" + (f": {_OTHER[name]}" if name in _OTHER else ""), False
    verdict, meaning = {0: ("completed", "a clean exit"), **_CODES}.get(
        code, ("crashed", "the program reported a failure")
    )
    return verdict, meaning, False


def _ended(code: int, what: str, where: str, line: int | None, text: str, *, strong: bool = False) -> Evidence:
    verdict, meaning, always = _meaning(code)
    strength = "strong" if strong or always else "weak"
    if code == 0 or code in _CODES:
        strength = "weak"  # a clean exit, or a code that only suggests its cause
    if what.endswith("received signal") and meaning.startswith("died of "):
        meaning = meaning[len("died of ") :]  # (a handler caught it and logged it: the process did not die of it)
    platform = "windows" if _ntstatus(code) else None
    shown = -code if code < 0 and what.endswith("signal") else code  # ("ended by signal 9", not "-9")
    return Evidence(verdict, strength, f"{what} {shown}: {meaning}", where, line, text, platform)
