"""Which rank writes what: one rank's share of a save, and the check that replicated state really is replicated.

Under several ranks each state entry is either *per rank* (named in ``per_rank``, or holding sharded DTensors):
every rank writes its own copy into ``-rNNNNN`` files; or *replicated* (DDP): its tensor files are striped across
ranks and its non-tensor leaves go to ``state.json``, which rank 0 alone writes. If an entry taken as replicated
in fact differs between ranks, writing rank 0's copy would silently replace the others' on resume, so every save
compares a digest of the replicated part across ranks first (`divergent_entries`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from preemptible import dist
from preemptible.errors import StateDivergenceError
from preemptible.events import Event, EventSink, SaveReason
from preemptible.state import FlatState, cast_moments, group_of, select
from preemptible.store import layout
from preemptible.writer import FileSpec, SavePlan, plan_files, state_json

log = logging.getLogger("preemptible")


def assign(specs: Sequence[FileSpec], world: int) -> list[int]:
    """Which rank writes each file: largest first, to the least loaded rank. The same on every rank."""
    load = [0] * world
    owner = [0] * len(specs)
    for i in sorted(range(len(specs)), key=lambda i: (-specs[i].nbytes, specs[i].name)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += specs[i].nbytes
    return owner


@dataclass(frozen=True)
class Layout:
    """How one save is split: the world, this rank, and the entries each rank writes for itself."""

    world: int
    rank: int
    own: frozenset[str]


def split(flat: FlatState, state: Collection[str], per_rank: Collection[str], *, world: int, rank: int) -> Layout:
    """Entries that are each rank's own: those named in ``per_rank`` and those holding sharded tensors."""
    sharded = {group_of(n) for n in flat.dtensors}
    return Layout(world=world, rank=rank, own=frozenset({n for n in state if n in per_rank} | sharded))


def entry_digests(flat: FlatState, entries: Collection[str]) -> dict[str, str]:
    """A digest per replicated entry of what rank 0 alone would write for it: its non-tensor leaves (as in
    ``state.json``) and its tensors' names, shapes and dtypes (their bytes are striped, not compared)."""
    out = {}
    for entry in sorted(entries):
        part = select(flat, {entry})
        h = hashlib.blake2b(digest_size=16)
        h.update(json.dumps(part.tree, sort_keys=True, separators=(",", ":"), default=str).encode())
        for name in sorted(part.tensors):
            t = part.tensors[name]
            h.update(f"\0{name}:{tuple(t.shape)}:{part.stored_dtype(name)}".encode())
        out[entry] = h.hexdigest()
    return out


def divergent_entries(digests: Sequence[Mapping[str, str]]) -> tuple[list[str], list[int]]:
    """Given every rank's `entry_digests` (in rank order): the entries that differ from rank 0's, and the ranks."""
    base = digests[0]
    keys: set[str] = set()
    ranks: list[int] = []
    for r, d in enumerate(digests[1:], start=1):
        differ = {k for k in set(base) | set(d) if base.get(k) != d.get(k)}
        if differ:
            keys |= differ
            ranks.append(r)
    return sorted(keys), ranks


def check_replicated(
    coord: dist.Coordinator,
    flat: FlatState,
    state: Collection[str],
    split_: Layout,
    *,
    key: str,
    reason: str,
    events: EventSink,
) -> Layout:
    """Compare every rank's digest of the replicated entries through the store (one round, ``<key>/digest``).

    Returns the layout to save with: unchanged when they agree. When they differ: a `StateDivergenceError` at a
    periodic (or manual) save; at an emergency or final save (the last of a process, which must not cost the
    checkpoint) the differing entries become per-rank for this save, and the journal says so.
    """
    mine = entry_digests(flat, set(state) - split_.own)

    def compare(values: list[str]) -> str:  # on the last rank to arrive: one read of every digest
        return json.dumps(divergent_entries([json.loads(v) for v in values]))

    with coord.borrow() as store:
        keys, ranks = json.loads(coord.reduce(store, f"{key}/digest", json.dumps(mine), compare))
    if not keys:
        return split_
    why = (
        f"state entries {keys} differ between ranks (rank(s) {ranks} hold other values than rank 0) but are saved "
        "as replicated, from rank 0 alone: on resume every rank would get rank 0's values. Name them in per_rank= "
        f"(Run(..., per_rank={keys}) or Checkpointer(per_rank=...)) so that each rank saves its own"
    )
    if reason not in (SaveReason.EMERGENCY, SaveReason.FINAL):
        raise StateDivergenceError(why, keys=keys, ranks=ranks)
    log.error("[rank=%d] %s; this %s save writes them per rank", split_.rank, why, reason)
    events.event(Event.STATE_DIVERGED, None, keys=keys, ranks=ranks, error=why)
    return Layout(world=split_.world, rank=split_.rank, own=split_.own | set(keys))


def plan_share(
    state: Mapping[str, Any],
    flat: FlatState,
    split_: Layout,
    *,
    threads: int,
    max_file_bytes: int,
    moments_dtype: torch.dtype | None = None,
) -> SavePlan:
    """Which tensors and documents this rank writes (see the module docs)."""
    if moments_dtype is not None:
        cast_moments(state, flat, moments_dtype)
    world, me = split_.world, split_.rank
    if world == 1:
        total = flat.tensor_bytes
        specs = plan_files(flat, threads=threads, max_file_bytes=max_file_bytes, total=total)
        return SavePlan(specs, {layout.STATE: state_json(flat)}, total, total)
    shared = select(flat, set(state) - split_.own)
    mine_flat = select(flat, set(split_.own))
    specs = plan_files(shared, threads=threads * world, max_file_bytes=max_file_bytes)
    mine = [s for s, owner in zip(specs, assign(specs, world), strict=True) if owner == me]
    own_specs = [
        FileSpec(layout.with_rank(s.name, me), s.items, s.stored)
        for s in plan_files(mine_flat, threads=threads, max_file_bytes=max_file_bytes)
    ]
    docs = {f"state{layout.rank_suffix(me)}.json": state_json(mine_flat)}
    if me == 0:
        docs[layout.STATE] = state_json(shared)
    nbytes = sum(s.nbytes for s in mine) + mine_flat.tensor_bytes
    return SavePlan(mine + own_specs, docs, nbytes, shared.tensor_bytes + mine_flat.tensor_bytes)
