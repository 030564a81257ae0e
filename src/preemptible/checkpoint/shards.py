"""Sharded tensors' records (DTensor, FSDP2 ``fully_shard``), checked as untrusted input before any reader uses them.

Each rank's state document records, for every sharded tensor, its global shape and stride, its placements, the
mesh's shape and the global offset of that rank's shard (`preemptible.state.dtensor_meta`). A reader trusts none of
it: `check` bounds one record by the checkpoint itself (the shard's stored shape, the shape's own extents), and
`cover` checks that the records of all ranks put every element of every tensor in place exactly once. A record
that fails either is a content failure of its checkpoint (`CheckpointCorruptError`): restore falls back, ``verify``
fails the step, ``load`` and ``export`` refuse it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from preemptible.errors import CheckpointCorruptError
from preemptible.store import bounds

_PLACEMENT = re.compile(r"Shard\(dim=([0-9]{1,2})\)|Replicate\(\)|Partial\([A-Za-z_]{0,16}\)", re.ASCII)

Bad = Callable[[str], CheckpointCorruptError]


@dataclass(frozen=True)
class Record:
    """One rank's shard of a sharded tensor, as checked."""

    rank: int | None
    shape: tuple[int, ...]
    local: tuple[int, ...]
    placements: tuple[str, ...]
    mesh: tuple[int, ...]
    offset: tuple[int, ...] | None

    @property
    def shard_dim(self) -> int | None:
        """The dimension a 1-D mesh's one ``Shard`` placement splits, None for any other layout."""
        if len(self.mesh) != 1 or len(self.placements) != 1:
            return None
        m = _PLACEMENT.fullmatch(self.placements[0])
        return int(m.group(1)) if m is not None and m.group(1) is not None else None

    @property
    def replicated(self) -> bool:
        return len(self.mesh) == 1 and self.placements == ("Replicate()",)


def _ints(value: Any, what: str, bad: Bad, *, length: int | None = None, low: int = 0) -> tuple[int, ...]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        want = f"a list of {length} integers" if length is not None else "a list of integers"
        raise bad(f"{what}: expected {want}, found {str(value)[:80]!r}")
    if len(value) > bounds.MAX_DIMS or not all(
        isinstance(v, int) and not isinstance(v, bool) and low <= v <= bounds.MAX_EXTENT for v in value
    ):
        raise bad(f"{what}: expected integers from {low} to {bounds.MAX_EXTENT}, found {str(value)[:80]!r}")
    return tuple(value)


def check(name: str, meta: Any, local: Sequence[int], rank: int | None, bad: Bad) -> Record:
    """One rank's record of sharded tensor ``name`` whose stored shard has shape ``local``, bounded by it.

    Raises:
        CheckpointCorruptError: the record is malformed, or does not fit the stored shard (an offset or a length
            outside the tensor, placements that do not parse or do not fit the mesh).
    """
    where = f"the sharding record of {name!r}" + (f" (rank {rank})" if rank is not None else "")
    if not isinstance(meta, dict):
        raise bad(f"{where}: expected an object, found {type(meta).__name__}")
    local = tuple(local)
    shape = _ints(meta.get("shape"), f"{where}: shape", bad, length=len(local))
    if math.prod(max(d, 1) for d in shape) > bounds.MAX_EXTENT:
        raise bad(f"{where}: shape {list(shape)} holds more elements than any tensor can")
    stride = meta.get("stride")
    if stride is not None:
        _ints(stride, f"{where}: stride", bad, length=len(local))
    mesh = _ints(meta.get("mesh"), f"{where}: mesh", bad, low=1)
    if not 1 <= len(mesh) <= bounds.MAX_MESH_DIMS or math.prod(mesh) > bounds.MAX_WORLD_SIZE:
        raise bad(f"{where}: a mesh of shape {list(mesh)} (expected 1 to {bounds.MAX_MESH_DIMS} dimensions)")
    placements = meta.get("placements")
    if not isinstance(placements, list) or len(placements) != len(mesh):
        raise bad(f"{where}: expected one placement per mesh dimension ({len(mesh)}), found {str(placements)[:80]!r}")
    for p in placements:
        m = _PLACEMENT.fullmatch(p) if isinstance(p, str) else None
        if m is None or (m.group(1) is not None and int(m.group(1)) >= max(len(shape), 1)):
            raise bad(f"{where}: placement {str(p)[:40]!r} is not Shard(dim=d) of a dimension, Replicate() or Partial")
    offset_doc = meta.get("offset")
    offset = None if offset_doc is None else _ints(offset_doc, f"{where}: offset", bad, length=len(local))
    for d, (o, n, full) in enumerate(zip(offset or (0,) * len(local), local, shape, strict=True)):
        if o + n > full:
            at = f"offset {o} + length {n}" if offset is not None else f"length {n}"
            raise bad(f"{where}: dimension {d} is {full} long, its shard ({at}) runs past it")
    record = Record(rank, shape, local, tuple(placements), mesh, offset)
    dim = record.shard_dim
    if dim is not None or record.replicated:
        for d, (o, n, full) in enumerate(zip(offset or (0,) * len(local), local, shape, strict=True)):
            if d != dim and (n != full or o != 0):
                raise bad(
                    f"{where}: stored as {placements[0]} on a 1-D mesh, so dimension {d} must be whole ({full} from "
                    f"0), found {n} from {o}"
                )
    return record


def cover(records: Mapping[str, Sequence[Record]], world: int, bad: Bad) -> list[str]:
    """Check that the records of every rank put each element of each sharded tensor in place exactly once.

    Returns:
        The tensors whose layout this cannot check (a mesh of several dimensions, an offset not recorded), one
        line each: they are not failures ("cannot check here" never marks a checkpoint).

    Raises:
        CheckpointCorruptError: records of one tensor that disagree (shape, placements, mesh), or shards that
            overlap, leave a gap or come from ranks the checkpoint does not have.
    """
    unchecked: list[str] = []
    for name, recs in sorted(records.items()):
        first = recs[0]
        for r in recs[1:]:
            if (r.shape, r.placements, r.mesh) != (first.shape, first.placements, first.mesh):
                raise bad(
                    f"the ranks' records of sharded tensor {name!r} disagree: {list(first.shape)} "
                    f"{list(first.placements)} on mesh {list(first.mesh)} (rank {first.rank}) vs {list(r.shape)} "
                    f"{list(r.placements)} on mesh {list(r.mesh)} (rank {r.rank})"
                )
        if math.prod(first.mesh) != world:
            raise bad(f"sharded tensor {name!r} records a mesh of {list(first.mesh)} in a checkpoint of {world} ranks")
        ranks = [r.rank for r in recs]
        if len(set(ranks)) != len(ranks) or any(r is not None and not 0 <= r < world for r in ranks):
            raise bad(f"sharded tensor {name!r} has records of ranks {sorted(map(str, ranks))} in a world of {world}")
        if first.replicated:
            continue
        dim = first.shard_dim
        if dim is None or any(r.offset is None for r in recs):
            unchecked.append(f"{name}: {list(first.placements)} on a mesh of {list(first.mesh)}")
            continue
        spans = sorted((r.offset[dim], r.offset[dim] + r.local[dim]) for r in recs if r.offset is not None)
        at = 0
        for begin, end in spans:
            if begin == end:
                continue  # a rank that holds no rows of it (torch.chunk's rule leaves the last ones empty)
            if begin != at:
                what = "overlap" if begin < at else "leave a gap"
                raise bad(
                    f"the shards of {name!r} along dimension {dim} {what} at index {min(begin, at)}: rows "
                    f"[{begin}, {end}) after rows up to {at}; every row must be stored exactly once"
                )
            at = end
        if at != first.shape[dim]:
            raise bad(f"the shards of {name!r} cover {at} of its {first.shape[dim]} rows along dimension {dim}")
    return unchecked


def restorable(records: Mapping[str, Sequence[Record]], world: int) -> str:
    """Where a checkpoint saved on ``world`` ranks can be restored, in one line: on any number of ranks when every
    sharded tensor is ``Shard(0)`` or ``Replicate`` on a 1-D mesh (elastic restore reads each rank's rows; plain
    and replicated tensors are read whole), else only on ``world`` ranks, naming the tensors that keep it there."""
    fixed = sorted(
        f"{name} ({', '.join(recs[0].placements)} on a mesh of {list(recs[0].mesh)})"
        for name, recs in records.items()
        if recs and not (recs[0].replicated or recs[0].shard_dim == 0)
    )
    ranks = f"saved on {world} rank{'s' if world != 1 else ''}"
    if not fixed:
        return f"{ranks}, restorable on any number"
    more = f" and {len(fixed) - 3} more" if len(fixed) > 3 else ""
    return f"{ranks}, restorable only on {world}: {'; '.join(fixed[:3])}{more} cannot be resharded"
