"""The checkpoint lifecycle: one state machine, and the only code that writes or reads its marker files.

A step directory is in exactly one state, read from its files:

=============  =================================================================================
uncommitted    no ``COMMIT.json``: a save in progress, or the leftover of one that died
committed      ``COMMIT.json`` and no verdict yet
validated      ``VALID.json``: checksums (and the probe, when it has one) passed since it was committed
invalid        ``INVALID.json``: a *content* check failed (size, checksum, format, probe mismatch)
quarantined    moved aside to ``<root>/quarantine/`` (``allow_fresh_start``)
deleted        gone (rotation, cleanup of stale leftovers)
=============  =================================================================================

IMPORTANT: only content failures make a checkpoint invalid. An I/O error while checking it (a timeout, a
permission, an object that vanished) is ``could not verify``: its state stays as it was. ``INVALID.json`` wins
over ``VALID.json`` when both exist (a crash between writing one and removing the other), so a checkpoint that
failed a content check is never reported as validated. Which transitions are legal is the table below; asking
for another is a `LifecycleError` (a bug, never a storage fault).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from preemptible.errors import LifecycleError
from preemptible.store import bounds, checksum, layout
from preemptible.store.io import Storage

log = logging.getLogger("preemptible")

MAX_MARKER_BYTES = bounds.MAX_MARKER_BYTES


class State(str, Enum):
    UNCOMMITTED = "uncommitted"
    COMMITTED = "committed"
    VALIDATED = "validated"
    INVALID = "invalid"
    QUARANTINED = "quarantined"
    DELETED = "deleted"


class Transition(str, Enum):
    COMMIT = "commit"
    VERIFY_PASS = "verify-pass"  # checksums (and the probe when there is one) passed: verify, restore, save read-back
    CONTENT_FAIL = "content-fail"  # size, checksum, format or probe mismatch
    COULD_NOT_VERIFY = "could-not-verify"  # an I/O error while checking: nothing is learnt, nothing changes
    REPLACE = "replace"  # a new save of a step marked invalid starts over
    ROTATE = "rotate"  # retention deletes it (committed) or cleanup does (a stale leftover)
    QUARANTINE = "quarantine"


_S, _T = State, Transition
_CHECKED = (_S.COMMITTED, _S.VALIDATED, _S.INVALID)
TRANSITIONS: Mapping[tuple[State, Transition], State] = {
    (_S.UNCOMMITTED, _T.COMMIT): _S.COMMITTED,
    (_S.COMMITTED, _T.VERIFY_PASS): _S.VALIDATED,
    (_S.VALIDATED, _T.VERIFY_PASS): _S.VALIDATED,
    **{(s, _T.CONTENT_FAIL): _S.INVALID for s in _CHECKED},
    **{(s, _T.COULD_NOT_VERIFY): s for s in _CHECKED},
    (_S.INVALID, _T.REPLACE): _S.UNCOMMITTED,
    **{(s, _T.ROTATE): _S.DELETED for s in (_S.UNCOMMITTED, *_CHECKED)},
    **{(s, _T.QUARANTINE): _S.QUARANTINED for s in (_S.UNCOMMITTED, *_CHECKED)},
}
"""Every legal transition. Notably absent: invalid -> validated (a failed checkpoint never becomes good again;
a new save of its step replaces it), and anything out of deleted or quarantined."""


_VERDICTS = (Transition.VERIFY_PASS, Transition.CONTENT_FAIL)


def advance(state: State, transition: Transition) -> State:
    """The state after ``transition``.

    Raises:
        LifecycleError: the transition is not legal from ``state``.
    """
    after = TRANSITIONS.get((state, transition))
    if after is None:
        legal = sorted(t.value for (s, t) in TRANSITIONS if s == state)
        raise LifecycleError(
            f"a checkpoint that is {state.value} cannot take the transition {transition.value!r} (legal from "
            f"{state.value}: {legal or 'none'}); this is a bug in preemptible, please report it",
            state=state.value,
            transition=transition.value,
        )
    return after


@dataclass(frozen=True)
class Verdict:
    """What the marker files of one step directory say."""

    state: State
    invalid_reason: str | None = None
    valid_doc: Mapping[str, Any] | None = None


class Markers:
    """Reads and writes the lifecycle's files (``VALID.json``, ``INVALID.json``) under one storage root."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._vouched: dict[str, str] = {}
        """Directories this process validated (checksums against the bytes, by restore, verify or a save's read
        back), with the checksum of the ``COMMIT.json`` it validated."""
        self._condemned: dict[str, str] = {}
        """Directories whose content this process found failing, likewise."""

    def vouched(self, directory: str) -> bool:
        """Whether this process validated the commit now in ``directory`` (rotation deletes only on that, never on a
        marker read from storage alone)."""
        return self._judged(self._vouched, directory)

    def condemned(self, directory: str) -> bool:
        """Whether this process found the commit now in ``directory`` failing a content check."""
        return self._judged(self._condemned, directory)

    def _judged(self, verdicts: dict[str, str], directory: str) -> bool:
        seen = verdicts.get(directory)
        if seen is None:
            return False
        try:
            return self._commit_checksum(directory) == seen
        except FileNotFoundError:
            return False

    def _path(self, directory: str, name: str) -> str:
        return self.storage.join(directory, name)

    def read(self, directory: str) -> Verdict:
        """The state of ``directory`` from its files.

        IMPORTANT: a marker vouches only for the commit it names (``commit``: the checksum of the ``COMMIT.json``
        it was written for). One that is a link or not a regular file, unparsable, or that names another commit
        (left stale, copied from another root, written by hand, or written before markers named their commit)
        counts as absent: the step is then committed, not yet validated, and the next validation rewrites it.
        """
        try:
            commit = self._commit_checksum(directory)
        except FileNotFoundError:
            return Verdict(State.UNCOMMITTED)
        invalid = self._marker(directory, layout.INVALID, commit)
        if invalid is not None:
            reason = invalid.get("reason", "marked invalid")
            return Verdict(State.INVALID, invalid_reason=reason if isinstance(reason, str) else "marked invalid")
        valid = self._marker(directory, layout.VALID, commit)
        if valid is not None:
            return Verdict(State.VALIDATED, valid_doc=valid)
        return Verdict(State.COMMITTED)

    def _commit_checksum(self, directory: str) -> str | None:
        """The checksum of the directory's ``COMMIT.json`` bytes; None when it cannot be read (a link out of the
        root, a directory, too large: no marker can vouch for it). Raises FileNotFoundError when there is none."""
        s = self.storage
        path = self._path(directory, layout.COMMIT)
        try:
            if not s.exists(path):
                raise FileNotFoundError(path)
            return checksum.of_bytes(s.read_bytes(path, bounds.MAX_MANIFEST_BYTES))
        except FileNotFoundError:
            raise
        except (OSError, ValueError):  # NotRegularFileError, OutsideRootError, FileTooLargeError are ValueErrors
            return None

    def _marker(self, directory: str, name: str, commit: str | None) -> dict[str, Any] | None:
        """The marker's document when it is a regular file inside the root that parses and names ``commit``."""
        if commit is None:
            return None
        try:
            doc = json.loads(self.storage.read_bytes(self._path(directory, name), MAX_MARKER_BYTES))
        except (OSError, ValueError, RecursionError):  # absent, a link, not a regular file, too large, not JSON
            return None
        if not isinstance(doc, dict) or doc.get("commit") != commit:
            return None
        return doc

    def record(self, directory: str, transition: Transition, *, now: str, **doc: Any) -> State:
        """Apply ``transition`` to the checkpoint in ``directory`` and write what it changes.

        ``doc``: what the marker records (``by``, ``probe``, ``reason``). Marker files are best effort: a failure
        to write one is logged and the state stays as it was on storage (never a half-written verdict).

        Raises:
            LifecycleError: the transition is illegal from the directory's current state.
        """
        before = self.read(directory).state
        after = advance(before, transition)
        s = self.storage
        try:
            commit = self._commit_checksum(directory) if transition in _VERDICTS else None
            if transition in _VERDICTS and commit is None:  # nothing a marker could name: it would count as absent
                raise OSError(f"{layout.COMMIT} could not be read back to name it")
            if transition is Transition.VERIFY_PASS:
                assert commit is not None
                self._vouched[directory] = commit  # validated here, whether or not its marker can be written
                body = {"validated_at": now, "checksums": True, **doc, "commit": commit}
                s.publish(self._path(directory, layout.VALID), json.dumps(body).encode())
            elif transition is Transition.CONTENT_FAIL:
                # IMPORTANT: INVALID.json first, VALID.json removed after: a crash in between leaves both, and
                # INVALID wins, so a checkpoint that failed is never reported as validated.
                self._vouched.pop(directory, None)
                assert commit is not None
                self._condemned[directory] = commit
                body = {"invalidated_at": now, **doc, "commit": commit}
                s.publish(self._path(directory, layout.INVALID), json.dumps(body).encode())
                s.remove(self._path(directory, layout.VALID))
        except (OSError, ValueError) as e:  # ValueError: a marker's path is a link out of the root, a directory
            log.warning("could not record that %s is %s (%s); its markers are as they were", directory, after.value, e)
            return before
        return after

    def retract(self, directory: str) -> None:
        """Remove the commit and its verdicts, marker files first (rotation, replacing an invalid checkpoint).

        IMPORTANT: ``COMMIT.json`` goes before any data file, so a crash mid-delete leaves an invisible leftover,
        never a committed checkpoint with files missing. ``INVALID.json`` goes last of the markers.
        """
        for name in (layout.VALID, layout.COMMIT, layout.INVALID):
            self.storage.remove(self._path(directory, name))
