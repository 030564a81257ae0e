"""``preemptible diagnose``: was this run preempted, and what did it lose? A verdict from logs, an exit code and the
run's journal.

The parts, each a private module: `_rules` (what lines in logs mean), `_match` (the rules as the scanner applies
them), `_input` (reading a log as a bounded stream), `_scan` (evidence from one log, line by line), `_facts` (what
the journal says about one attempt), `_incident` (with several logs: which rank failed first), `_remedy` (what to
change, and how to verify it) and `_verdict` (the verdict and its rendering).
"""

from preemptible.diagnose._evidence import VERDICTS, Evidence
from preemptible.diagnose._facts import JournalFacts, journal_facts
from preemptible.diagnose._incident import Incident, actor, initiating, when
from preemptible.diagnose._input import (
    EDGE_LINES,
    MAX_LINE_CHARS,
    MAX_LOG_BYTES,
    SCAN_CHUNK,
    LogInput,
    read_log,
    scan_keywords,
)
from preemptible.diagnose._remedy import FIX, TAGS, for_platforms, remedy, verify
from preemptible.diagnose._rules import (
    COLLATERAL_RULES,
    EXIT_RULES,
    LOST_PEER,
    PEER_LOST,
    PEER_NODE,
    RULES,
    ExitRule,
    Rule,
    needles,
)
from preemptible.diagnose._scan import MAX_EVIDENCE_PER_KIND, TimeWindow, scan_lines
from preemptible.diagnose._verdict import CONFIDENCE, CONFIRM, Diagnosis, diagnose

__all__ = [
    "COLLATERAL_RULES",
    "CONFIDENCE",
    "CONFIRM",
    "EDGE_LINES",
    "EXIT_RULES",
    "FIX",
    "MAX_EVIDENCE_PER_KIND",
    "MAX_LINE_CHARS",
    "MAX_LOG_BYTES",
    "LOST_PEER",
    "PEER_LOST",
    "PEER_NODE",
    "RULES",
    "SCAN_CHUNK",
    "TAGS",
    "VERDICTS",
    "Diagnosis",
    "Incident",
    "Evidence",
    "ExitRule",
    "JournalFacts",
    "LogInput",
    "Rule",
    "TimeWindow",
    "actor",
    "diagnose",
    "for_platforms",
    "initiating",
    "journal_facts",
    "needles",
    "read_log",
    "remedy",
    "scan_keywords",
    "scan_lines",
    "verify",
    "when",
]
