"""``export``: a committed checkpoint as plain safetensors files, verified on the way.

Every tensor file of the checkpoint (compressed or not, striped across ranks or not) becomes a plain safetensors
file of the same name (``model.safetensors.zst`` -> ``model.safetensors``) holding the same tensors under the
checkpoint's key names (``model/0.weight``, ``optimizer/state/3/exp_avg``). A compressed file is decoded frame by
frame (each frame checked against its checksum, the stored file against COMMIT.json's) straight into the output,
so an export needs a few frames of memory, not the checkpoint's size. ``export.json`` beside the files records the
step, the source and each file's size and XXH3-64, and, under ``aliases``, the keys whose tensor is held under
another key's name (tied weights are stored once, under the first key).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from preemptible.checkpoint.reader import decoding_pool, open_tensor
from preemptible.errors import CheckpointCorruptError, CheckpointNotFoundError
from preemptible.store import checksum, layout, tagged_json
from preemptible.store import format as tensor_format

COPY_BYTES = 8 << 20
EXPORT_JSON = "export.json"


@dataclass
class Exported:
    step: int
    out: str
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    aliases: dict[str, str] = field(default_factory=dict)
    """Keys held under another key's name (tied weights, stored once): key -> the name it is held under."""

    def to_json(self) -> dict[str, Any]:
        out = {
            "step": self.step,
            "out": self.out,
            "files": self.files,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
        }
        if self.aliases:
            out["aliases"] = self.aliases
        return out


def _check_empty(out: str) -> None:
    if os.path.isdir(out) and os.listdir(out):
        raise FileExistsError(
            f"{out} already holds files; expected an empty or new directory to export into (choose another --out, "
            "or empty it)"
        )


def _newest(ck: Any, *, valid: bool = False) -> int:
    """The newest committed step (``valid``: not marked invalid)."""
    infos = [i for i in ck.checkpoints() if not (valid and i.invalid)]
    if not infos:
        raise CheckpointNotFoundError(f"no committed checkpoint under {ck.root}: nothing to export", path=ck.root)
    step: int = infos[-1].step
    return step


def plain_name(name: str) -> str:
    return name.removesuffix(".zst")


def export(
    root: str,
    out: str,
    *,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> Exported:
    """Write checkpoint ``step`` (default: the newest committed) under ``root`` as plain safetensors files in
    ``out`` (a local directory, created; it must be empty or absent).

    Raises:
        CheckpointNotFoundError: no such checkpoint (or none at all).
        CheckpointCorruptError: a file fails its checksum (the export's files are removed).
        FileExistsError: ``out`` holds files already.
    """
    from preemptible.checkpoint import Checkpointer

    ck = Checkpointer(root, storage_options=storage_options)
    step = _newest(ck) if step is None else step
    opened = ck.reader.open_base(step)
    names = sorted((n for n in opened.manifest.files if layout.is_tensor_file(n)), key=plain_name)
    _check_empty(out)
    aliases = _aliases(ck, opened)
    os.makedirs(out, exist_ok=True)
    result = Exported(step=step, out=out, aliases=aliases)
    if on_total is not None:
        on_total(sum(opened.manifest.files[n].bytes for n in names))
    pool = decoding_pool(names, ck.threads)
    written: list[str] = []
    try:
        for name in names:
            rec = opened.manifest.files[name]
            path = ck.storage.join(opened.files_dir, name)
            target = os.path.join(out, plain_name(name))
            tmp = target + ".part"
            written.append(tmp)
            hasher = checksum.new()
            size = 0
            with open_tensor(ck.storage, path, rec, opened, pool=pool, on_stored=on_bytes) as (source, n, expected):
                buf = memoryview(bytearray(COPY_BYTES))
                with open(tmp, "wb") as f:
                    while size < n:
                        k = source.readinto(buf[: min(len(buf), n - size)])
                        if not k:
                            raise opened.bad(f"{name} ends after {size} of {n} bytes (truncated?)")
                        hasher.update(buf[:k])
                        f.write(buf[:k])
                        size += k
                        if expected is not None and on_bytes is not None:
                            on_bytes(k)
                    f.flush()
                    os.fsync(f.fileno())
            digest = hasher.hexdigest()
            if expected is not None and digest != expected:
                raise opened.bad(
                    f"checksum mismatch in {name}: COMMIT.json records {expected}, the file hashes to {digest}"
                )
            with open(tmp, "rb") as f:  # what was written is a safetensors file a reader accepts
                tensor_format.read_header(f, size, where=target)
            os.replace(tmp, target)
            written[-1] = target
            result.files[plain_name(name)] = {"bytes": size, "checksum": digest, "from": name}
            result.bytes_read += rec.bytes
            result.bytes_written += size
    except BaseException:
        for p in written:
            if os.path.exists(p):
                os.remove(p)
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    _write_json(ck, result, checksum_algorithm=checksum.ALGORITHM, **({"aliases": aliases} if aliases else {}))
    return result


def _aliases(ck: Any, opened: Any) -> dict[str, str]:
    """Keys of the state whose tensor is stored under another key's name (tied weights: one tensor, stored once,
    under the first key), from the checkpoint's state documents: key -> the name the export holds it under."""
    out: dict[str, str] = {}
    for name in sorted(n for n in opened.manifest.files if n.endswith(".json")):
        doc = ck.reader.read_doc(opened, name)
        try:
            refs = tagged_json.tensor_refs(doc["tree"])
        except CheckpointCorruptError as e:
            raise opened.bad(f"{name}: {e}") from e
        out.update((path, stored) for path, stored in refs if path != stored)
    return out


def load(
    root: str,
    step: int | None = None,
    *,
    entry: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The state saved in a checkpoint, as CPU tensors and plain Python values, for inference or inspection:

        model.load_state_dict(preemptible.load("ckpt/run1", entry="model"))

    Args:
        step: which checkpoint; default: the newest committed one that verifies (an older one, with a
            `CheckpointFallbackWarning`, when the newest fails its checksums).
        entry: one state entry (``"model"``): its ``state_dict()`` with its own key names. Default: every entry,
            ``{name: state_dict}``.

    Only the files that hold the wanted tensors are read, and every byte read is checked against its checksum.
    Tensors stored once for several keys (tied weights) come back as one tensor under each key. Sharded tensors
    (DTensor, FSDP2's ``fully_shard``) come back whole, assembled from every rank's shards.

    Raises:
        CheckpointNotFoundError: no committed checkpoint (of that step), or no such entry in it.
        CheckpointCorruptError: the checkpoint asked for fails verification (with ``step``), or every one does.
        ValueError: a checkpoint of sharded tensors in a layout other than FSDP2's (one ``Shard`` or ``Replicate``
            placement on a 1-D mesh).
    """
    import warnings

    from preemptible.checkpoint import Checkpointer
    from preemptible.errors import CheckpointFallbackWarning

    ck = Checkpointer(root, storage_options=storage_options)
    if step is not None:
        return _load_step(ck, step, entry)
    infos = [i for i in ck.checkpoints() if not i.invalid]
    if not infos:
        raise CheckpointNotFoundError(f"no committed checkpoint under {ck.root}: nothing to load", path=ck.root)
    for i, info in enumerate(reversed(infos)):
        try:
            return _load_step(ck, info.step, entry)
        except CheckpointCorruptError as e:
            if i == len(infos) - 1:
                raise
            warnings.warn(f"{e}; loading the previous checkpoint", CheckpointFallbackWarning, stacklevel=2)
    raise AssertionError("unreachable")  # pragma: no cover


def _load_step(ck: Any, step: int, entry: str | None, opened_out: list[Any] | None = None) -> dict[str, Any]:
    opened = ck.reader.open(step, entry=entry)
    if opened_out is not None:
        opened_out.append(opened)
    loaded: dict[str, Any] = _assembled(ck, step, entry) if opened.dtensors else ck.reader.read(opened, None)
    if entry is None:
        return loaded
    state: dict[str, Any] = loaded[entry]
    return state


def _assembled(ck: Any, step: int, entry: str | None) -> dict[str, Any]:
    """The state of a checkpoint of sharded tensors (DTensor, FSDP2) with every one whole: each rank's files are read
    (every byte checked) and its shards copied into place by the layout each rank recorded (a 1-D mesh, ``Shard`` or
    ``Replicate``, as `preemptible.state.local_offset` describes it).

    Raises:
        ValueError: a layout that is not one of those, or shards that do not cover a tensor.
    """
    import torch

    world = ck.reader.manifest(step).world_size
    whole: dict[str, torch.Tensor] = {}
    rows: dict[str, int] = {}
    first = None
    for rank in range(world):
        opened = ck.reader.open(step, rank=rank, entry=entry)
        if first is None:
            first = opened
        else:  # the files every rank shares were read with rank 0's
            opened.selected = [n for n in opened.selected if layout.file_rank(n) == rank]
        tensors = ck.reader.read_tensors(opened, None)
        for name, local in tensors.items():
            meta = opened.dtensors.get(name)
            if meta is None:
                whole.setdefault(name, local)
                continue
            placements, offset, shape = meta.get("placements") or [], meta.get("offset"), meta.get("shape")
            match = re.fullmatch(r"Shard\(dim=(\d+)\)", placements[0]) if len(placements) == 1 else None
            if offset is None or not isinstance(shape, list) or (match is None and placements != ["Replicate()"]):
                raise ValueError(
                    f"the checkpoint of step {step}: tensor {name!r} is sharded as {placements} on a mesh of shape "
                    f"{meta.get('mesh')}; expected one Shard or Replicate placement on a 1-D mesh (FSDP2's "
                    "fully_shard), which is what load() and export assemble"
                )
            if match is None:  # replicated: every rank holds all of it
                whole.setdefault(name, local)
                rows[name] = -1
                continue
            dim = int(match.group(1))
            full = whole.get(name)
            if full is None:
                full = whole[name] = torch.empty(shape, dtype=local.dtype)
            full.narrow(dim, offset[dim], local.shape[dim]).copy_(local)
            rows[name] = rows.get(name, 0) + local.shape[dim]
            if rows[name] == shape[dim]:
                rows[name] = -1
    short = sorted(n for n, r in rows.items() if r != -1)
    if short:
        raise ValueError(
            f"the checkpoint of step {step}: the shards of {len(short)} tensor(s) do not cover them (e.g. "
            f"{short[0]!r}): expected the shards of all {world} ranks that wrote it"
        )
    assert first is not None
    loaded: dict[str, Any] = ck.reader.rebuild(first, whole)
    return loaded


def _flat_tensors(obj: Any, path: str, out: dict[str, Any]) -> None:
    """Tensor leaves by key path (``a/b/0``); a module's ``state_dict()`` is flat, so its keys stay as they are."""
    import torch

    if isinstance(obj, torch.Tensor):
        out[path] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flat_tensors(v, f"{path}/{k}" if path else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flat_tensors(v, f"{path}/{i}" if path else str(i), out)


def _source(root: str, out: str, step: int | None, storage_options: dict[str, Any] | None) -> tuple[Any, int]:
    """The checkpointer of ``root`` and the step to export (default: the newest not marked invalid), once ``out``
    is known to be empty."""
    from preemptible.checkpoint import Checkpointer

    _check_empty(out)
    ck = Checkpointer(root, storage_options=storage_options)
    return ck, _newest(ck, valid=True) if step is None else step


def export_entry(
    root: str,
    out: str,
    entry: str = "model",
    *,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Exported:
    """One state entry's tensors (default ``model``: the weights) as ``out/<entry>.safetensors`` with the entry's own
    key names (``0.weight``, not ``model/0.weight``), for inference: ``model.load_state_dict(load_file(path))``.
    Tied weights, stored once in the checkpoint, are written under each of their keys (``export.json`` lists them
    under ``tied``), so a strict ``load_state_dict`` finds every key. Verified on the way (see `load`).

    Raises:
        CheckpointNotFoundError, CheckpointCorruptError, ValueError: as `load`.
        FileExistsError: ``out`` holds files already.
    """
    ck, step = _source(root, out, step, storage_options)
    opened: list[Any] = []
    state = _load_step(ck, step, entry, opened)
    tensors: dict[str, Any] = {}
    _flat_tensors(state, "", tensors)
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for key, t in tensors.items():
        owner = first.setdefault(id(t), key)
        if owner != key:
            tied[key] = owner
    name = f"{_safe_stem(entry)}{layout.TENSOR_SUFFIX}"
    os.makedirs(out, exist_ok=True)
    target = os.path.join(out, name)
    tmp = target + ".part"
    try:
        with open(tmp, "wb") as f:
            items = [(k, t.contiguous()) for k, t in tensors.items()]
            size, digest, _ = tensor_format.write(_FileSink(f), items, {"format": "pt", "writer": "preemptible export"})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    result = Exported(step=step, out=out, bytes_written=size, bytes_read=opened[0].meta_bytes + opened[0].data_bytes)
    result.files[name] = {"bytes": size, "checksum": digest, "from": f"entry {entry!r}"}
    _write_json(ck, result, entry=entry, checksum_algorithm=checksum.ALGORITHM, tied=tied)
    return result


def export_hf(
    root: str,
    out: str,
    entry: str = "model",
    *,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Exported:
    """One entry that was a Hugging Face ``PreTrainedModel`` when saved, as the directory its ``save_pretrained``
    writes (``config.json``, ``model.safetensors``, ...): ``AutoModel*.from_pretrained(out)`` loads it. The model
    class and config come from what the save recorded in COMMIT.json (``transformers``), the weights from the
    checkpoint (verified; sharded ones assembled), written by transformers' own ``save_pretrained``.

    Raises:
        CheckpointNotFoundError, CheckpointCorruptError: as `load`.
        ValueError: the checkpoint records no Hugging Face model for ``entry``.
        ImportError: transformers is not installed.
        FileExistsError: ``out`` holds files already.
    """
    import torch

    ck, step = _source(root, out, step, storage_options)
    recorded = ck.reader.manifest(step).extra.get("transformers") or {}
    record = recorded.get(entry) if isinstance(recorded, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise ValueError(
            f"the checkpoint of step {step} records no Hugging Face model for entry {entry!r} (it records "
            f"{sorted(recorded) if isinstance(recorded, dict) else 'none'}); --format hf needs an entry that was a "
            "transformers PreTrainedModel when it was saved. Use --entry without --format for plain safetensors"
        )
    try:
        import transformers
    except ImportError as e:
        raise ImportError("--format hf needs transformers: pip install 'preemptible[transformers]'") from e
    cls = getattr(transformers, str(record.get("class")), None)
    if cls is None:
        import importlib

        cls = getattr(importlib.import_module(str(record.get("module"))), str(record.get("class")))
    opened: list[Any] = []
    state = _load_step(ck, step, entry, opened)
    config = cls.config_class.from_dict(record["config"])
    with torch.device("meta"):  # no random init of weights about to be replaced
        model = cls(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.save_pretrained(out)
    result = Exported(step=step, out=out, bytes_read=opened[0].meta_bytes + opened[0].data_bytes)
    for name in sorted(os.listdir(out)):
        p = os.path.join(out, name)
        result.files[name] = {"bytes": os.path.getsize(p), "from": f"save_pretrained of entry {entry!r}"}
        result.bytes_written += os.path.getsize(p)
    _write_json(ck, result, entry=entry, layout="huggingface save_pretrained", **{"class": record.get("class")})
    return result


def _write_json(ck: Any, result: Exported, **fields: Any) -> None:
    """``export.json``: the step and where it came from, what the export wrote, and ``fields``."""
    doc = {
        "format": "preemptible.export",
        "version": 1,
        "step": result.step,
        "source": ck.storage.join(ck.root, layout.step_dir(result.step)),
        "files": result.files,
        **fields,
    }
    with open(os.path.join(result.out, EXPORT_JSON), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


class _FileSink:
    def __init__(self, f: Any) -> None:
        self._f = f

    def write(self, data: memoryview) -> None:
        self._f.write(data)


def _safe_stem(entry: str) -> str:
    from preemptible.writer import file_stem

    return file_stem(entry)
