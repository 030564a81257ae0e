"""How a checkpoint's tensor files are named after the state entries they hold: shared by the side that writes
them (`preemptible.writer`) and the side that reads them (`preemptible.checkpoint.reader`, resharding, export)."""

from __future__ import annotations

import re

from preemptible.store import layout

_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_PART = re.compile(r"-[0-9]{5}-of-[0-9]{5}$")


def file_stem(group: str) -> str:
    """The stem of the tensor files of a top-level state entry (``model`` -> ``model``, ``a/b`` -> ``a_b``)."""
    return _FILE_SAFE.sub("_", group).lstrip(".") or "tensors"


def stem_of_file(name: str) -> str:
    """The inverse, from a file name: ``model-00002-of-00003-r00001.safetensors`` -> ``model``."""
    stem = name.removesuffix(".zst").removesuffix(layout.TENSOR_SUFFIX)
    rank = layout.file_rank(name)
    if rank is not None:
        stem = stem.removesuffix(layout.rank_suffix(rank))
    return _PART.sub("", stem)
