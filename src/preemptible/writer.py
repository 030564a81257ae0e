"""Writing a flattened state to a checkpoint directory: which tensors go in which file, and the writer threads.

Tensors are grouped into files by their top-level state entry (``model.safetensors``,
``optimizer.safetensors``); a group larger than ``max_file_bytes`` is split into parts so several threads (or,
later, ranks) can write at once. Each file is streamed from the tensors' own memory and hashed on the way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from preemptible.state import FlatState, group_of
from preemptible.store import checksum, layout
from preemptible.store import format as tensor_format
from preemptible.store.io import Storage
from preemptible.store.layout import FileRecord

DEFAULT_MAX_FILE_BYTES = 1 << 30
DEFAULT_THREADS = 2
_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")


@dataclass(frozen=True)
class FileSpec:
    name: str
    items: tuple[tuple[str, torch.Tensor], ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.items)


def plan_files(flat: FlatState, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[FileSpec]:
    """Assign every tensor to a file; deterministic for a given state."""
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, t in flat.tensors.items():
        groups.setdefault(group_of(name), []).append((name, t))
    specs: list[FileSpec] = []
    for group, items in groups.items():
        stem = _FILE_SAFE.sub("_", group).lstrip(".") or "tensors"
        parts: list[list[tuple[str, torch.Tensor]]] = [[]]
        size = 0
        for item in items:
            n = item[1].numel() * item[1].element_size()
            if parts[-1] and size + n > max_file_bytes:
                parts.append([])
                size = 0
            parts[-1].append(item)
            size += n
        if len(parts) == 1:
            specs.append(FileSpec(f"{stem}{layout.TENSOR_SUFFIX}", tuple(parts[0])))
        else:
            for i, part in enumerate(parts):
                specs.append(FileSpec(f"{stem}-{i + 1:05d}-of-{len(parts):05d}{layout.TENSOR_SUFFIX}", tuple(part)))
    return specs


def write_tensor_file(storage: Storage, directory: str, spec: FileSpec) -> FileRecord:
    stream = storage.open_write(storage.join(directory, spec.name))
    try:
        nbytes, digest = tensor_format.write(stream, spec.items, {"format": "pt", "writer": "preemptible"})
    except BaseException:
        stream.abort()
        raise
    stream.close()
    return FileRecord(nbytes, digest)


def write_bytes(storage: Storage, directory: str, name: str, data: bytes) -> FileRecord:
    stream = storage.open_write(storage.join(directory, name))
    try:
        stream.write(memoryview(data))
    except BaseException:
        stream.abort()
        raise
    stream.close()
    return FileRecord(len(data), checksum.of_bytes(data))


def state_json(flat: FlatState) -> bytes:
    doc = {"format": "preemptible.state", "version": 1, "numpy": sorted(flat.numpy), "tree": flat.tree}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def write_files(
    storage: Storage, directory: str, specs: Sequence[FileSpec], *, threads: int = DEFAULT_THREADS
) -> dict[str, FileRecord]:
    """Write the tensor files, largest first, ``threads`` at a time. Re-raises the first failure as is."""
    ordered = sorted(specs, key=lambda s: -s.nbytes)
    if threads <= 1 or len(ordered) <= 1:
        return {s.name: write_tensor_file(storage, directory, s) for s in ordered}
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="preemptible-write") as pool:
        futures = [(s.name, pool.submit(write_tensor_file, storage, directory, s)) for s in ordered]
        records: dict[str, FileRecord] = {}
        first_error: BaseException | None = None
        for name, fut in futures:
            try:
                records[name] = fut.result()
            except BaseException as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return records
