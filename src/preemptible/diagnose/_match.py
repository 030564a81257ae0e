"""The rules (`_rules`) as the scanner applies them: each with the needles that must be in a line before its
pattern is tried, and the rules that read how a process ended."""

from __future__ import annotations

import functools
import re
import signal
from dataclasses import replace
from typing import Any

from preemptible.diagnose._evidence import Evidence, exit_evidence
from preemptible.diagnose._rules import (
    COLLATERAL_RULES,
    EXIT_RULES,
    MACHINE_GONE,
    PEER_LOST,
    PLATFORM_MARKS,
    RULES,
    SPOT_CONTEXT,
    Rule,
    needles,
)

RULE_TABLE: list[tuple[Any, tuple[str, ...] | None]] = [(rule, rule.needles) for rule in RULES]
EXIT_TABLE: list[tuple[Any, tuple[str, ...] | None]] = [(rule, needles(rule.pattern)) for rule in EXIT_RULES]
COLLATERAL_TABLE: list[tuple[Any, tuple[str, ...] | None]] = [(rule, rule.needles) for rule in COLLATERAL_RULES]
CONTEXT_TABLE: list[tuple[Any, tuple[str, ...] | None]] = [(SPOT_CONTEXT, SPOT_CONTEXT.needles)]
MARK_TABLE: list[tuple[Any, tuple[str, ...] | None]] = [(rule, rule.needles) for rule in PLATFORM_MARKS]


_NEEDLES = sorted(
    {
        n
        for _, found_in in RULE_TABLE + EXIT_TABLE + COLLATERAL_TABLE + CONTEXT_TABLE + MARK_TABLE
        if found_in
        for n in found_in
    }
)


@functools.lru_cache(maxsize=4096)  # (a line the scanner tests twice; a log that repeats a line)
def present(line: str) -> frozenset[str]:
    """The rules' needles (`_rules.needles`) that are in ``line``, lowercased: one pass for all the rules."""
    low = line.lower()
    return frozenset(n for n in _NEEDLES if n in low)


def hit(
    pattern: re.Pattern[str], found_in: tuple[str, ...] | None, line: str, present: frozenset[str]
) -> re.Match[str] | None:
    """``pattern.search(line)``, skipped when none of its needles is ``present`` in the line."""
    if found_in is not None and present.isdisjoint(found_in):
        return None
    return pattern.search(line)


Table = list[tuple[Any, tuple[str, ...] | None]]
_INDEX: dict[int, tuple[dict[str, list[int]], tuple[int, ...]]] = {}


def candidates(table: Table, present: frozenset[str]) -> Table:
    """The entries of ``table`` (in its order) one of whose needles is ``present``, and those with none: the only
    ones that can match the line. An index from needle to entries, so a line costs the rules it could match, not
    all of them."""
    index = _INDEX.get(id(table))
    if index is None:
        by: dict[str, list[int]] = {}
        always: list[int] = []
        for i, (_, found_in) in enumerate(table):
            if found_in is None:
                always.append(i)
            for n in found_in or ():
                by.setdefault(n, []).append(i)
        index = _INDEX[id(table)] = (by, tuple(always))
    chosen = set(index[1])
    by = index[0]
    for n in present:
        chosen.update(by.get(n, ()))
    return [table[i] for i in sorted(chosen)]


def _first(table: Table, line: str, present: frozenset[str], want: Any = None) -> Any:
    """The first entry of ``table`` that matches ``line`` (and satisfies ``want``), or None."""
    return next(
        (r for r, _ in candidates(table, present) if (want is None or want(r)) and r.pattern.search(line)), None
    )


def is_oom(line: str, present: frozenset[str]) -> bool:
    return _first(RULE_TABLE, line, present, lambda r: r.verdict == "oom") is not None


def is_time_limit(line: str, present: frozenset[str]) -> bool:
    """A line a strong time-limit rule names (an exception that says the job timed out, as submitit's does)."""
    return _first(RULE_TABLE, line, present, lambda r: r.verdict == "time-limit" and r.strength == "strong") is not None


def is_collective_timeout(line: str, present: frozenset[str]) -> bool:
    return _first(RULE_TABLE, line, present, lambda r: r.verdict == "collective-timeout") is not None


def machine_gone(line: str, present: frozenset[str]) -> bool:
    """A line that says the machine under the work went away (`_rules.MACHINE_GONE`): an exception that says so
    reports an end from outside, not a crash of its own."""
    return _first(RULE_TABLE, line, present, lambda r: r.why == MACHINE_GONE) is not None


def is_peer_lost(line: str, present: frozenset[str]) -> bool:
    """A line that says only that a peer went away (`_rules.PEER_LOST`)."""
    return _first(COLLATERAL_TABLE, line, present, lambda r: r.why == PEER_LOST) is not None


def rule_for(line: str, present: frozenset[str]) -> Rule | None:
    """The first rule (`_rules.RULES`) that matches ``line``."""
    rule: Rule | None = _first(RULE_TABLE, line, present)
    return rule


def spot_context(line: str, present: frozenset[str]) -> bool:
    """A line that says the work runs on spot/preemptible capacity (`_rules.SPOT_CONTEXT`)."""
    return _first(CONTEXT_TABLE, line, present) is not None


def platform_marks(line: str, present: frozenset[str]) -> list[Rule]:
    """The platforms' marks (`_rules.PLATFORM_MARKS`) that match ``line``."""
    return [r for r, _ in candidates(MARK_TABLE, present) if r.pattern.search(line)]


def collateral_for(line: str, present: frozenset[str]) -> Rule | None:
    """The first collateral rule (`_rules.COLLATERAL_RULES`) that matches ``line``."""
    rule: Rule | None = _first(COLLATERAL_TABLE, line, present)
    return rule


_SIGNAL_NAMES = {"Killed": "SIGKILL", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Aborted": "SIGABRT"}
_GO_SIGNAL_NAMES = {
    "killed": "SIGKILL", "segmentation fault": "SIGSEGV", "bus error": "SIGBUS", "aborted": "SIGABRT",
    "terminated": "SIGTERM", "interrupt": "SIGINT", "hangup": "SIGHUP", "illegal instruction": "SIGILL",
    "floating point exception": "SIGFPE", "trace/breakpoint trap": "SIGTRAP",
}  # fmt: skip
"""strsignal's words for a signal, as the shell prints them and as Go's os/exec does (lowercased: "signal: killed");
a DataLoader's "killed by signal: Terminated" is not among them (its atexit teardown names no cause)."""
_OOM_KILLED_REASON = re.compile(r"\bReason:\s*OOMKilled\b")


def exit_rule(line: str, where: str, number: int, text: str, present: frozenset[str]) -> Evidence | None:
    """Evidence from a line that reports how a process ended (`_rules.EXIT_RULES`); ``present``: its needles."""
    for rule, _ in candidates(EXIT_TABLE, present):
        m = rule.pattern.search(line)
        if m is None:
            continue
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        if "torque" in groups:
            status = int(groups["torque"])
            code = 256 - status if status > 256 else status  # 256 + N: killed by signal N
        elif "code" in groups:
            code = int(groups["code"])
        elif "signum" in groups or "signum2" in groups:
            code = -int(groups.get("signum") or groups["signum2"])
        else:
            name = groups.get("signame") or groups.get("signame2") or ""
            name = _SIGNAL_NAMES.get(name.strip()) or _GO_SIGNAL_NAMES.get(name.strip(), name.strip())
            name = name.upper() if name[:3].lower() == "sig" else name  # ("received sighup": the same signal)
            try:
                code = -int(signal.Signals[name])
            except KeyError:
                continue
        ended = exit_evidence(code, rule.what, where, number, text, strong=rule.strong)
        return ended if rule.platform is None else replace(ended, platform=rule.platform)
    return None
