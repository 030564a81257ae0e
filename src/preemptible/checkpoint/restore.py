"""Restore with fallback: the newest committed checkpoint that verifies on every rank, recorded in its lifecycle.

For each candidate, newest first: read and check everything but the data, check that it fits the live objects
(before a single live byte changes), read the data into them verifying every checksum, recompute the probe. A
*content* failure (size, checksum, format, probe mismatch) marks the candidate invalid and falls back to the next;
an I/O error (timeout, permission, a vanished object) falls back too but leaves the candidate's state as it was
("could not verify"). Under several ranks a candidate counts only if it verified on all of them.
"""

from __future__ import annotations

import functools
import json
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from preemptible import dist
from preemptible.checkpoint import reshard
from preemptible.checkpoint.fallback import fall_back
from preemptible.checkpoint.reader import Opened, Reader
from preemptible.errors import CheckpointCorruptError, CheckpointFallbackWarning, StateMismatchError
from preemptible.events import Event, EventSink
from preemptible.state import FlatState, PlainFit, RNGState, apply, capture, differences, flatten, plain_fit
from preemptible.store.markers import Markers, State, Transition
from preemptible.validate import ProbeCheck, run_probe

log = logging.getLogger("preemptible")


@dataclass(frozen=True)
class Candidate:
    step: int
    state: State
    invalid_reason: str | None = None


@dataclass(frozen=True)
class _Outcome:
    ok: bool
    kind: str = "ok"  # when not ok: "content" (marked invalid), "load" (did not load, unmarked), "io" (unmarked)
    # or "marked" (invalid already: not tried)
    why: str = ""
    probe: ProbeCheck | None = None
    mismatch: StateMismatchError | None = None


@dataclass(frozen=True)
class _Tried:
    """One candidate's attempt: its outcome (agreed by every rank), and what a success needs next."""

    outcome: _Outcome
    check: ProbeCheck | None = None
    opened: Opened | None = None
    started: float = 0.0


@dataclass
class _Tally:
    """The candidates that failed, and why: what the error says once none restored."""

    failures: list[tuple[int, str]] = field(default_factory=list)
    io_errors: list[str] = field(default_factory=list)
    mismatches: list[StateMismatchError] = field(default_factory=list)

    def error(self, root: str) -> Exception:
        """The error when no candidate restored: the storage failed, they do not fit the live objects, or none
        verifies."""
        lines = "\n".join(f"  step {s}: {why}" for s, why in self.failures)
        if self.io_errors:
            return OSError(
                f"no committed checkpoint under {root} could be restored, and {len(self.io_errors)} could not "
                f"even be verified because the storage failed:\n{lines}\nNothing was loaded and nothing was marked "
                "invalid; check the storage (mount, credentials, network) and start again"
            )
        if len(self.failures) == 1 and self.mismatches:
            return self.mismatches[0]
        if self.mismatches:
            newest = self.mismatches[0]
            return StateMismatchError(
                f"no committed checkpoint under {root} could be restored; {len(self.mismatches)} do not fit the "
                f"live objects:\n{lines}\nNothing was marked invalid. Build the model, optimizer and scheduler exactly "
                "as when the checkpoints were saved, or start a new root.",
                path=newest.path,
                step=newest.step,
                differences=newest.differences,
            )
        return CheckpointCorruptError(
            f"none of the {len(self.failures)} committed checkpoints under {root} verifies:\n{lines}\n"
            "Nothing was loaded. Restore from a backup, or move the root aside to start fresh deliberately.",
            path=root,
            failures=self.failures,
        )


class Restorer:
    """Loads checkpoints into live state (see the module docs)."""

    def __init__(
        self,
        reader: Reader,
        markers: Markers,
        *,
        coordinator: dist.Coordinator | None,
        events: EventSink,
        probe: Callable[[], Any] | None,
        probe_rtol: float,
        monotonic: Callable[[], float],
        now: Callable[[], str],
    ) -> None:
        self.reader = reader
        self.markers = markers
        self.coord = coordinator
        self.events = events
        self.probe = probe
        self.probe_rtol = probe_rtol
        self._monotonic = monotonic
        self._now = now

    def _probe_check(self, state: Mapping[str, Any], stored: float | None) -> ProbeCheck | None:
        if self.probe is None or stored is None:
            return None
        return ProbeCheck(stored, run_probe(self.probe, state), self.probe_rtol)

    def _try(
        self, state: Mapping[str, Any], captured: Mapping[str, Any], live_flat: Callable[[], FlatState], step: int
    ) -> tuple[_Outcome, ProbeCheck | None, Opened | None]:
        coord = self.coord
        rank, world = (coord.rank, coord.world) if coord is not None else (0, 1)
        try:
            opened = self.reader.open(step, rank=rank)
            fit = _plain_fit(state, captured, opened, world)  # before a single byte changes
            if fit is not None:  # the common case, checked (and the entries to load built) in one walk
                loaded = self.reader.read_fitted(opened, fit)
            else:
                flat = live_flat()
                live = reshard.Live(state, flat.dtensor_objs)
                if reshard.needed(opened, live, world):  # another world size or wrapper: each rank reads its slices
                    opened = reshard.open_resharded(self.reader, step, rank=rank, world=world, live=live)
                else:
                    _same_layout(opened, flat.dtensor_objs)
                self.check_fits(state, self.reader.skeleton(opened), step, captured)  # before a single byte changes
                if opened.reshard is not None:
                    loaded = reshard.read_resharded(self.reader, opened)
                else:
                    loaded = self.reader.read(opened, flat.tensors, sharded=flat.dtensor_objs)
            self._apply(state, loaded, opened, captured)
            check = self._probe_check(state, opened.manifest.probe)
        except CheckpointCorruptError as e:
            return _Outcome(False, "content", str(e)), None, None
        except StateMismatchError as e:
            # Intact files that do not fit the live objects: a changed training script, or tampering that kept the
            # checksums. Not provably the checkpoint's fault, so it is not marked; an older one may fit.
            return _Outcome(False, "load", str(e), mismatch=e), None, None
        except OSError as e:  # not the checkpoint's fault: it may be fine when the storage answers again
            return _Outcome(False, "io", f"could not verify ({type(e).__name__}: {e})"), None, None
        if check is not None and not check.ok:
            return _Outcome(False, "content", opened.bad(check.describe()).args[0], check), check, opened
        return _Outcome(True), check, opened

    def _apply(
        self, state: Mapping[str, Any], loaded: Mapping[str, Any], opened: Opened, live: Mapping[str, Any]
    ) -> None:
        try:
            apply(state, loaded, live=live)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
            # check_fits compares tensors; load_state_dict() also checks what it cannot see (parameter groups)
            why = f"a live object's load_state_dict() refused it ({type(e).__name__}: {str(e)[:300]})"
            raise StateMismatchError(
                f"the checkpoint of step {opened.step} at {opened.directory} does not load: {why}",
                path=opened.directory,
                step=opened.step,
                differences=[why],
            ) from e

    def _agree(self, store: dist.StoreClient | None, outcome: _Outcome) -> _Outcome:
        """Every rank must restore the same step: a checkpoint counts only if it verified on all of them."""
        coord = self.coord
        if coord is None or store is None:
            return outcome
        doc = json.dumps({"ok": outcome.ok, "kind": outcome.kind, "why": outcome.why})
        bad = dist.agree(coord, store, coord.round("restore"), doc)
        if outcome.ok and not bad:
            return outcome
        kinds = {x["kind"] for _, x in bad}
        kind = next(k for k in ("content", "load", "io") if k in kinds)
        return _Outcome(False, kind, _by_reason((r, x["why"]) for r, x in bad), outcome.probe)

    def restore(self, state: Mapping[str, Any], candidates: Sequence[Candidate], *, explicit: bool) -> int:
        with dist.session(self.coord) as store:
            return self._restore(state, candidates, explicit, store)

    def _restore(
        self, state: Mapping[str, Any], candidates: Sequence[Candidate], explicit: bool, store: dist.StoreClient | None
    ) -> int:
        # IMPORTANT: what the live objects were before any attempt. A candidate that fails half-way through
        # load_state_dict() leaves them altered; the next one is checked against this, then loaded over it whole.
        captured = capture(state)
        live_flat = functools.cache(lambda: flatten(captured))  # only when the plain fit does not decide
        coord = self.coord
        leader = coord is None or coord.rank == 0
        tally = _Tally()

        def attempt(cand: Candidate) -> _Tried:
            if cand.state is State.INVALID and not explicit:
                return _Tried(_Outcome(False, "marked", f"marked invalid earlier: {cand.invalid_reason}"))
            t0 = self._monotonic()
            outcome, check, opened = self._try(state, captured, live_flat, cand.step)
            return _Tried(self._agree(store, outcome), check, opened, t0)

        failed = functools.partial(self._failed, tally=tally, explicit=explicit, leader=leader)
        found = fall_back(candidates, attempt, ok=lambda t: t.outcome.ok, failed=failed)
        if found is None:
            raise tally.error(self.reader.root)
        cand, tried = found
        opened = tried.opened
        assert opened is not None
        self._restored(opened, tried.check, cand, leader)
        self._world_changed(state, opened)
        self.events.event(
            Event.RESTORED,
            cand.step,
            seconds=round(self._monotonic() - tried.started, 6),
            skipped=[s for s, _ in tally.failures],
            bytes_read=opened.meta_bytes + opened.data_bytes,
            data_bytes_read=opened.data_bytes,
        )
        return cand.step

    def _failed(
        self,
        cand: Candidate,
        tried: _Tried,
        following: Candidate | None,
        *,
        tally: _Tally,
        explicit: bool,
        leader: bool,
    ) -> None:
        """A candidate that did not restore: counted, recorded in the journal (a content failure marked invalid,
        by rank 0), then raised when it was asked for by step, else warned of (the loop falls back)."""
        # stacklevel 6: this, the fallback loop, `_restore`, `restore`, `Checkpointer.restore`, its caller
        outcome = tried.outcome
        tally.failures.append((cand.step, outcome.why))
        if outcome.kind == "marked":
            warnings.warn(
                f"skipping the checkpoint of step {cand.step}: {outcome.why}", CheckpointFallbackWarning, stacklevel=6
            )
            return
        directory = self.reader.path_of(cand.step)
        if outcome.kind == "content":
            probe = outcome.probe
            figures = {"stored_probe": probe.stored, "recomputed_probe": probe.recomputed} if probe else {}
            self.events.event(Event.CHECKPOINT_INVALID, cand.step, error=outcome.why, **figures)
            if leader and cand.state is not State.INVALID:
                self.markers.record(directory, Transition.CONTENT_FAIL, now=self._now(), reason=outcome.why)
        else:
            if outcome.kind == "io":
                tally.io_errors.append(outcome.why)
            else:
                tally.mismatches.append(outcome.mismatch or _mismatch(directory, cand.step, outcome.why))
            self.events.event(Event.CHECKPOINT_UNVERIFIED, cand.step, error=outcome.why)
        if explicit:
            if outcome.kind == "content":
                raise CheckpointCorruptError(outcome.why, path=directory, step=cand.step)
            if tally.mismatches:
                raise tally.mismatches[0]
            raise OSError(f"the checkpoint of step {cand.step} {outcome.why}; nothing was marked, try again")
        warnings.warn(
            f"skipping the checkpoint of step {cand.step}: {outcome.why}; falling back to the next newest",
            CheckpointFallbackWarning,
            stacklevel=6,
        )

    def _world_changed(self, state: Mapping[str, Any], opened: Opened) -> None:
        """At another world size: a rank the checkpoint holds no per-rank state of reseeds its random streams from
        its source rank's (`RNGState.derive`), and the journal says what changed."""
        coord = self.coord
        rank, world = (coord.rank, coord.world) if coord is not None else (0, 1)
        saved = opened.manifest.world_size
        plan = opened.reshard
        if saved == world and plan is None:
            return
        derived = rank >= saved
        if derived:
            for obj in state.values():
                if isinstance(obj, RNGState):
                    obj.derive(rank)
        self.events.event(
            Event.WORLD_CHANGED,
            opened.step,
            saved_world=saved,
            world=world,
            source_rank=opened.source_rank,
            rng="derived" if derived else "restored",
            resharded=len(plan.resharded) if plan is not None else 0,
            dropped_ranks=list(range(world, saved)) if rank == 0 and saved > world else [],
        )
        log.warning(
            "rank %d restored step %d saved by %d rank(s) on %d: %s%s",
            rank,
            opened.step,
            saved,
            world,
            f"{len(plan.resharded)} tensors resharded, " if plan is not None else "",
            f"per-rank state of rank {opened.source_rank}, random streams reseeded from it"
            if derived
            else "its own per-rank state",
        )

    def _restored(self, opened: Opened, check: ProbeCheck | None, cand: Candidate, leader: bool) -> None:
        for note in opened.notes:
            log.warning("restoring step %d: %s", cand.step, note)
        if opened.extra_files:
            warnings.warn(
                f"the checkpoint of step {cand.step} holds files its COMMIT.json does not list, ignored: "
                f"{', '.join(opened.extra_files)}",
                CheckpointFallbackWarning,
                stacklevel=5,
            )
        if not leader:
            return
        if cand.state is State.INVALID:  # restored on request (step=...); a failed checkpoint stays failed
            log.warning(
                "restored step %d on request although it is marked invalid (%s)", cand.step, cand.invalid_reason
            )
            return
        probe = {"stored": check.stored, "recomputed": check.recomputed, "rtol": check.rtol} if check else None
        self.markers.record(opened.directory, Transition.VERIFY_PASS, now=self._now(), by="restore", probe=probe)

    def check_fits(
        self,
        state: Mapping[str, Any],
        loaded: Mapping[str, Any],
        step: int,
        captured: Mapping[str, Any] | None = None,
    ) -> None:
        """Raises `StateMismatchError` naming every difference between the checkpoint and the live objects."""
        # Entries named "_..." are preemptible's own (RNG streams, run metadata): a checkpoint written by a bare
        # Checkpointer lacks them, and restores fine (with a warning in the journal).
        for name, obj in state.items():
            if name in loaded and not isinstance(obj, MutableMapping) and not isinstance(loaded[name], Mapping):
                # state_dict() always returns a mapping; what no save can have written, the files were made to hold
                raise CheckpointCorruptError(
                    f"the checkpoint of step {step}: entry {name!r} holds a {type(loaded[name]).__name__} where "
                    f"{type(obj).__name__}.state_dict() always gives a mapping (the files were altered)",
                    path=self.reader.path_of(step),
                    step=step,
                )
        missing = [name for name in state if name not in loaded and not name.startswith("_")]
        diffs = [f"{name}: missing from checkpoint (it holds {sorted(loaded)})" for name in missing]
        for name, obj in state.items():
            if name in loaded and not isinstance(obj, (dict, RNGState)):
                live = {name: captured[name]} if captured is not None else capture({name: obj})
                diffs += differences(live, {name: loaded[name]})
        if diffs:
            path = self.reader.path_of(step)
            shown = "\n".join(f"  {d}" for d in diffs[:50])
            more = f"\n  ... and {len(diffs) - 50} more" if len(diffs) > 50 else ""
            raise StateMismatchError(
                f"the checkpoint of step {step} at {path} does not fit the live objects "
                f"({len(diffs)} difference{'s' if len(diffs) != 1 else ''}):\n{shown}{more}\n"
                "Build the model and optimizer exactly as when the checkpoint was saved, or start a new root.",
                path=path,
                step=step,
                differences=diffs,
            )


def _plain_fit(state: Mapping[str, Any], captured: Mapping[str, Any], opened: Opened, world: int) -> PlainFit | None:
    """What to read the checkpoint into, and the entries to load, when it plainly fits the live objects
    (`plain_fit`), else None: the slow comparison decides and names every difference. Never for sharded state
    (either side) or another world size: those may need resharding."""
    if opened.dtensors or opened.manifest.world_size != world or reshard.Live(state, {}).params:
        return None
    tree = opened.tree
    if any(name not in tree for name in state if not name.startswith("_")):
        return None  # preemptible's own entries ("_...") may be absent: a bare Checkpointer wrote it
    return plain_fit({n: captured[n] for n in state if n in tree}, tree, opened.entries, opened.casts)


def _same_layout(opened: Opened, live: Mapping[str, Any]) -> None:
    """A sharded checkpoint restored at its own layout: each of this rank's sharding records must say what this
    rank's live shard is (global shape, placements, offset). The records of all ranks then cover every tensor exactly
    once, as the live layout does, without this rank reading the others' (`verify`, `load` and `export` check that
    cover from every rank's records).

    Raises:
        CheckpointCorruptError: a record that says otherwise (the files were altered).
    """
    from preemptible.state import dtensor_meta

    for name, records in opened.shards.items():
        t = live.get(name)
        if t is None:
            continue
        meta = dtensor_meta(t)
        for r in records:
            said = (list(r.shape), list(r.placements), list(r.offset) if r.offset is not None else None)
            have = (meta["shape"], meta["placements"], meta["offset"])
            if said != have:
                raise opened.bad(
                    f"the sharding record of {name!r} says shape {said[0]}, placements {said[1]}, offset {said[2]}; "
                    f"this rank's shard at the same layout is {have[0]}, {have[1]} from {have[2]}"
                )


def _by_reason(reports: Iterable[tuple[int, str]]) -> str:
    """Ranks' reasons, each stated once with the ranks that gave it (64 ranks refusing one model for one reason is
    one paragraph, not 64)."""
    ranks: dict[str, list[int]] = {}
    for rank, why in reports:
        ranks.setdefault(why, []).append(rank)
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {why}" for why, rs in ranks.items())


def _mismatch(directory: str, step: int, why: str) -> StateMismatchError:
    """Another rank's report of a checkpoint that does not fit its live objects."""
    return StateMismatchError(
        f"the checkpoint of step {step} at {directory}: {why}", path=directory, step=step, differences=[why]
    )
