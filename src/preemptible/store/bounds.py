"""Bounds on the numbers read from storage that a checkpoint cannot bound by itself, each with its reason.

A checkpoint may come from a stranger, so every number a reader takes from it is bounded before it is used. Where
the checkpoint bounds a number itself (an offset plus a length within the tensor; a tensor's bytes equal to its
shape's product times its item size; a world size equal to the ranks whose files are present), the reader derives the
bound from it. What is left is bounded here, in one place, so that every reader refuses the same things.
"""

from __future__ import annotations

MAX_MANIFEST_BYTES = 64 << 20
"""``COMMIT.json``: a manifest lists a few entries per file, and a large state has a few thousand files; 64 MiB
is hundreds of times that."""

MAX_MARKER_BYTES = 1 << 20
"""``VALID.json`` / ``INVALID.json``: a timestamp, a reason, a probe's figures and the commit they vouch for."""

MAX_WORLD_SIZE = 100_000
"""Ranks of a job that wrote a checkpoint: per-rank file names carry five digits (``-r00000`` to ``-r99999``). A
checkpoint with per-rank files bounds it further: each rank of its world has files of its own."""

MAX_HEADER_BYTES = 100 << 20
"""A safetensors header: the limit safetensors itself enforces."""

MAX_DIMS = 64
"""A tensor's dimensions: torch's own limit."""

MAX_EXTENT = 1 << 62
"""The product of a shape's extents (zeros counted as 1), times the item size: strides and offsets fit int64."""

MAX_INDEX_BYTES = 64 << 20
"""A compressed file's frame index."""

MAX_FRAME_BYTES = 64 << 20
"""The largest decoded frame a reader accepts (the writer's are at most 4 MiB; frame 0, the header, at most
safetensors' own header limit): a hostile index cannot make a reader allocate more."""

MAX_MESH_DIMS = 8
"""Dimensions of the device mesh a sharded tensor records (3-D parallelism uses 3; 8 leaves room)."""

MAX_CONFIG_INT = 1 << 40
"""An integer in a Hugging Face config recorded with a checkpoint, before it is compared with the stored tensors
(a model's widths, counts and vocabulary sizes are far below this; anything above cannot describe real weights)."""
