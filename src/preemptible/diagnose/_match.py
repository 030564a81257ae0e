"""The rules (`_rules`) as the scanner applies them: each with the needles that must be in a line before its
pattern is tried, and the rules that read how a process ended."""

from __future__ import annotations

import re
import signal

from preemptible.diagnose._evidence import Evidence, exit_evidence
from preemptible.diagnose._rules import COLLATERAL_RULES, EXIT_RULES, PEER_LOST, RULES, SPOT_CONTEXT, Rule, needles

RULE_TABLE = [(rule, rule.needles) for rule in RULES]
EXIT_TABLE = [(rule, needles(rule.pattern)) for rule in EXIT_RULES]
COLLATERAL_TABLE = [(rule, rule.needles) for rule in COLLATERAL_RULES]


CONTEXT_TABLE = [(SPOT_CONTEXT, SPOT_CONTEXT.needles)]


_NEEDLES = sorted(
    {n for _, found_in in RULE_TABLE + EXIT_TABLE + COLLATERAL_TABLE + CONTEXT_TABLE if found_in for n in found_in}
)


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


def is_oom(line: str, present: frozenset[str]) -> bool:
    return any(r.verdict == "oom" and hit(r.pattern, n, line, present) for r, n in RULE_TABLE)


def is_time_limit(line: str, present: frozenset[str]) -> bool:
    """A line a strong time-limit rule names (an exception that says the job timed out, as submitit's does)."""
    return any(
        r.verdict == "time-limit" and r.strength == "strong" and hit(r.pattern, n, line, present) for r, n in RULE_TABLE
    )


def is_collective_timeout(line: str, present: frozenset[str]) -> bool:
    return any(r.verdict == "collective-timeout" and hit(r.pattern, n, line, present) for r, n in RULE_TABLE)


def is_peer_lost(line: str, present: frozenset[str]) -> bool:
    """A line that says only that a peer went away (`_rules.PEER_LOST`)."""
    return any(r.why == PEER_LOST and hit(r.pattern, n, line, present) for r, n in COLLATERAL_TABLE)


def rule_for(line: str, present: frozenset[str]) -> Rule | None:
    """The first rule (`_rules.RULES`) that matches ``line``."""
    return next((r for r, n in RULE_TABLE if hit(r.pattern, n, line, present)), None)


def spot_context(line: str, present: frozenset[str]) -> bool:
    """A line that says the work runs on spot/preemptible capacity (`_rules.SPOT_CONTEXT`)."""
    return any(hit(r.pattern, n, line, present) for r, n in CONTEXT_TABLE)


def collateral_for(line: str, present: frozenset[str]) -> Rule | None:
    """The first collateral rule (`_rules.COLLATERAL_RULES`) that matches ``line``."""
    return next((r for r, n in COLLATERAL_TABLE if hit(r.pattern, n, line, present)), None)


_SIGNAL_NAMES = {"Killed": "SIGKILL", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Aborted": "SIGABRT"}
_OOM_KILLED_REASON = re.compile(r"\bReason:\s*OOMKilled\b")


def exit_rule(line: str, where: str, number: int, text: str, present: frozenset[str]) -> Evidence | None:
    """Evidence from a line that reports how a process ended (`_rules.EXIT_RULES`); ``present``: its needles."""
    for rule, found_in in EXIT_TABLE:
        m = hit(rule.pattern, found_in, line, present)
        if m is None:
            continue
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        if "torque" in groups:
            status = int(groups["torque"])
            code = 256 - status if status > 256 else status  # 256 + N: killed by signal N
        elif "code" in groups:
            code = int(groups["code"])
        elif "signum" in groups:
            code = -int(groups["signum"])
        else:
            name = groups.get("signame") or groups.get("signame2") or ""
            name = _SIGNAL_NAMES.get(name.strip(), name.strip())
            try:
                code = -int(signal.Signals[name])
            except KeyError:
                continue
        return exit_evidence(code, rule.what, where, number, text, strong=rule.strong)
    return None
