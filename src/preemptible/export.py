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
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from preemptible.checkpoint.fallback import fall_back
from preemptible.checkpoint.reader import decoding_pool, open_tensor
from preemptible.checkpoint.readonly import ReadOnlyRoot
from preemptible.errors import CheckpointCorruptError, CheckpointNotFoundError
from preemptible.store import checksum, layout, tagged_json
from preemptible.store import format as tensor_format

T = TypeVar("T")
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


def _verified(ck: ReadOnlyRoot, step: int | None, attempt: Callable[[int], T]) -> T:
    """``attempt(step)``; without a step, on the newest committed checkpoint not marked invalid, falling back to the
    next newest (with a `CheckpointFallbackWarning` naming why) while one fails verification. Load and every export
    fall back through it; restore, which also marks what fails, through the same loop (`fall_back`)."""
    import warnings

    from preemptible.errors import CheckpointFallbackWarning

    if step is not None:
        return attempt(step)
    infos = [i for i in ck.checkpoints() if not i.invalid]
    if not infos:
        raise CheckpointNotFoundError(f"no committed checkpoint under {ck.root}: nothing to read", path=ck.root)

    def tried(s: int) -> tuple[T | None, CheckpointCorruptError | None]:
        try:
            return attempt(s), None
        except CheckpointCorruptError as e:
            return None, e

    def failed(s: int, result: tuple[T | None, CheckpointCorruptError | None], following: int | None) -> None:
        error = result[1]
        assert error is not None
        if following is None:
            raise error
        warnings.warn(
            f"{error}; using the previous checkpoint (step {following})", CheckpointFallbackWarning, stacklevel=5
        )

    found = fall_back([info.step for info in reversed(infos)], tried, ok=lambda r: r[1] is None, failed=failed)
    assert found is not None  # the last failure raised
    return found[1][0]  # type: ignore[return-value]


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
    _check_empty(out)
    ck = ReadOnlyRoot(root, storage_options=storage_options)
    return _verified(ck, step, lambda s: _export_files(ck, s, out, on_bytes, on_total))


def _export_files(
    ck: ReadOnlyRoot,
    step: int,
    out: str,
    on_bytes: Callable[[int], None] | None,
    on_total: Callable[[int], None] | None,
) -> Exported:
    opened = ck.reader.open(step)  # the one verified read path: manifest, documents, headers, sharding records
    names = sorted((n for n in opened.manifest.files if layout.is_tensor_file(n)), key=plain_name)
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


def _aliases(ck: ReadOnlyRoot, opened: Any) -> dict[str, str]:
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
        root: the checkpoint root: a local path or an object-store URL (``s3://``, ``gs://``, ``az://``).
        step: which checkpoint; default: the newest committed one that verifies (an older one, with a
            `CheckpointFallbackWarning`, when the newest fails its checksums).
        entry: one state entry (``"model"``): its ``state_dict()`` with its own key names. Default: every entry,
            ``{name: state_dict}``.
        storage_options: for a URL root, arguments to its fsspec file system (credentials, endpoint).

    Only the files that hold the wanted tensors are read, and every byte read is checked against its checksum.
    Tensors stored once for several keys (tied weights) come back as one tensor under each key. Sharded tensors
    (DTensor, FSDP2's ``fully_shard``) come back whole, assembled from every rank's shards.

    Raises:
        CheckpointNotFoundError: no committed checkpoint (of that step), or no such entry in it.
        CheckpointCorruptError: the checkpoint asked for fails verification (with ``step``), or every one does.
        ValueError: a checkpoint of sharded tensors in a layout other than FSDP2's (one ``Shard`` or ``Replicate``
            placement on a 1-D mesh).

    Returns:
        ``{entry: state_dict}`` for every entry, or one entry's ``state_dict()`` when ``entry`` is given.

    Examples:
        >>> import tempfile, torch
        >>> from preemptible import Checkpointer, load
        >>> root = tempfile.mkdtemp()
        >>> model = torch.nn.Linear(2, 2)
        >>> _ = Checkpointer(root).save({"model": model}, step=5).wait()
        >>> sorted(load(root, entry="model"))
        ['bias', 'weight']
    """
    ck = ReadOnlyRoot(root, storage_options=storage_options)
    return _verified(ck, step, lambda s: _load_step(ck, s, entry))


def _load_step(ck: ReadOnlyRoot, step: int, entry: str | None, opened_out: list[Any] | None = None) -> dict[str, Any]:
    opened = ck.reader.open(step, entry=entry)
    if opened_out is not None:
        opened_out.append(opened)
    loaded: dict[str, Any] = _assembled(ck, step, entry) if opened.dtensors else ck.reader.read(opened, None)
    if entry is None:
        return loaded
    state: dict[str, Any] = loaded[entry]
    return state


def _assembled(ck: ReadOnlyRoot, step: int, entry: str | None) -> dict[str, Any]:
    """The state of a checkpoint of sharded tensors (DTensor, FSDP2) with every one whole: each rank's files are read
    (every byte checked) and its shards copied into place by the records each rank wrote, once those records are
    checked against the stored shards and shown to cover every element of every tensor exactly once
    (`preemptible.checkpoint.shards`).

    Raises:
        CheckpointCorruptError: records that do not fit the stored shards, or do not cover a tensor exactly.
        ValueError: a layout other than one ``Shard`` or ``Replicate`` placement on a 1-D mesh (FSDP2's).
    """
    import torch

    from preemptible.checkpoint import shards

    world = ck.reader.manifest(step).world_size
    first = None
    parts: list[tuple[Any, dict[str, torch.Tensor]]] = []
    records: dict[str, list[shards.Record]] = {}
    for rank in range(world):
        opened = ck.reader.open(step, rank=rank, entry=entry)
        if first is None:
            first = opened
        else:  # the files every rank shares were read with rank 0's
            opened.selected = [n for n in opened.selected if layout.file_rank(n) == rank]
            for name, recs in opened.shards.items():
                opened.shards[name] = [r for r in recs if r.rank == rank]
        for name, recs in opened.shards.items():
            records.setdefault(name, []).extend(recs)
        parts.append((opened, ck.reader.read_tensors(opened, None)))
    assert first is not None
    unchecked = shards.cover(records, world, first.bad)  # before a single row is placed
    if unchecked:
        raise ValueError(
            f"the checkpoint of step {step}: {len(unchecked)} sharded tensor(s) are laid out in a way load() and "
            f"export cannot assemble (e.g. {unchecked[0]}); expected one Shard or Replicate placement on a 1-D mesh "
            "(FSDP2's fully_shard). Restore it under the same launch instead"
        )
    whole: dict[str, torch.Tensor] = {}
    filled: dict[str, int] = {}  # rows placed of each sharded tensor: every row, once (`cover` said where)
    for opened, tensors in parts:
        for name, local in tensors.items():
            rec = next((r for r in records.get(name, ()) if r.rank == opened.entry_owner.get(name)), None)
            if rec is None or rec.replicated:  # not sharded, or every rank holds all of it
                whole.setdefault(name, local)
                continue
            dim, offset = rec.shard_dim, rec.offset
            assert dim is not None, name  # `cover` checked both
            assert offset is not None, name
            full = whole.get(name)
            if full is None:
                full = whole[name] = torch.empty(rec.shape, dtype=local.dtype)
            full.narrow(dim, offset[dim], local.shape[dim]).copy_(local)
            filled[name] = filled.get(name, 0) + local.shape[dim]
    short = sorted(
        n
        for n, rs in records.items()
        if rs[0].shard_dim is not None and filled.get(n, 0) != rs[0].shape[rs[0].shard_dim]
    )
    if short:
        raise first.bad(
            f"the shards read of {len(short)} sharded tensor(s) do not fill them (e.g. {short[0]!r}): a record "
            "names rows that no rank's file holds"
        )
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


def _source(root: str, out: str, storage_options: dict[str, Any] | None) -> ReadOnlyRoot:
    """``root`` opened for reading, once ``out`` is known to be empty."""
    _check_empty(out)
    return ReadOnlyRoot(root, storage_options=storage_options)


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
    ck = _source(root, out, storage_options)
    return _verified(ck, step, lambda s: _export_entry_step(ck, s, out, entry))


def _export_entry_step(ck: ReadOnlyRoot, step: int, out: str, entry: str) -> Exported:
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
    ck = _source(root, out, storage_options)
    return _verified(ck, step, lambda s: _export_hf_step(ck, s, out, entry))


def _export_hf_step(ck: ReadOnlyRoot, step: int, out: str, entry: str) -> Exported:
    import torch

    recorded = ck.reader.manifest(step).extra.get("transformers") or {}
    record = recorded.get(entry) if isinstance(recorded, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise ValueError(
            f"the checkpoint of step {step} records no Hugging Face model for entry {entry!r} (it records "
            f"{sorted(map(str, recorded))[:20] if isinstance(recorded, dict) else 'none'}); --format hf needs an "
            "entry that was a transformers PreTrainedModel when it was saved. Use --entry without --format for plain "
            "safetensors"
        )
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise ImportError("--format hf needs transformers: pip install 'preemptible[transformers]'") from e
    cls, config_class = _hf_classes(record)
    opened: list[Any] = []
    state = _load_step(ck, step, entry, opened)
    stored = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    _check_config(record["config"], stored)  # bounded by the checkpoint before anything is built
    try:
        config = config_class.from_dict(dict(record["config"]))
        with torch.device("meta"):  # no random init of weights about to be replaced
            model = cls(config)
    except Exception as e:  # a hostile config can raise anything inside transformers: one line, not a traceback
        raise ValueError(
            f"the checkpoint of step {step}: the config recorded for entry {entry!r} does not build a "
            f"{record['class']} ({type(e).__name__}: {str(e)[:200]}); export its weights with --entry instead"
        ) from e
    built = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if built != stored:
        differ = sorted(set(built) ^ set(stored)) or sorted(k for k in built if built[k] != stored[k])
        raise ValueError(
            f"the checkpoint of step {step}: a {record['class']} built from the recorded config has "
            f"{sum(math.prod(s) for s in built.values())} parameters in {len(built)} tensors, the checkpoint stores "
            f"{sum(math.prod(s) for s in stored.values())} in {len(stored)} (first differences: {differ[:3]}); the "
            "config does not describe these weights. Export them with --entry instead"
        )
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    replaced = [k for k, v in model.state_dict().items() if not torch.equal(v, state[k])]
    if replaced:  # a config that ties weights the checkpoint stores apart would write other weights than it holds
        raise ValueError(
            f"the checkpoint of step {step}: the recorded config of {record['class']} ties weights that the checkpoint "
            f"stores apart ({', '.join(replaced[:3])} would not be the stored tensors); export with --entry instead"
        )
    model.save_pretrained(out)
    result = Exported(step=step, out=out, bytes_read=opened[0].meta_bytes + opened[0].data_bytes)
    for name in sorted(os.listdir(out)):
        p = os.path.join(out, name)
        result.files[name] = {"bytes": os.path.getsize(p), "from": f"save_pretrained of entry {entry!r}"}
        result.bytes_written += os.path.getsize(p)
    _write_json(ck, result, entry=entry, layout="huggingface save_pretrained", **{"class": record.get("class")})
    return result


_LAYER_FIELDS = (
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "num_layers",
    "num_decoder_layers",
    "encoder_layers",
    "decoder_layers",
)
_WIDTH_FIELDS = (
    "hidden_size",
    "n_embd",
    "d_model",
    "intermediate_size",
    "n_inner",
    "vocab_size",
    "n_head",
    "num_attention_heads",
    "num_key_value_heads",
    "ffn_dim",
    "d_ff",
    "n_positions",
    "max_position_embeddings",
)
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:h|layers?|blocks?|block)\.([0-9]{1,9})\.")


def _hf_classes(record: dict[str, Any]) -> tuple[Any, Any]:
    """The model and config classes of a recorded Hugging Face entry, through transformers' own registry alone:
    the config's ``model_type`` names the config class (``CONFIG_MAPPING``), and the recorded class name must be one
    the Auto classes register for that model type. Nothing a checkpoint names is imported."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    model_type, name = record["config"].get("model_type"), record.get("class")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"the recorded config's model_type {str(model_type)[:60]!r} is not one this transformers "
            f"{transformers.__version__} knows; expected a model type of its registry (e.g. 'gpt2', 'llama')"
        )
    registered: set[str] = set()
    for key, mapping in vars(modeling_auto).items():  # MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and its kind: type -> name
        if not (key.startswith("MODEL_") and key.endswith("_MAPPING_NAMES") and isinstance(mapping, dict)):
            continue
        if isinstance(value := mapping.get(model_type), (str, tuple)):
            registered.update((value,) if isinstance(value, str) else value)
    if not isinstance(name, str) or name not in registered:
        raise ValueError(
            f"the recorded class {str(name)[:60]!r} is not a model class transformers registers for model type "
            f"{model_type!r} (it registers {sorted(registered)[:8]}); export its weights with --entry instead"
        )
    return getattr(transformers, name), CONFIG_MAPPING[model_type]


def _check_config(config: dict[str, Any], stored: dict[str, tuple[int, ...]]) -> None:
    """Bound a recorded config by the stored tensors before a model is built from it (a layer count of a million
    would build a million modules): its integers below `bounds.MAX_CONFIG_INT`, its layer counts equal to the layers
    the tensor names hold, its widths no larger than the elements stored."""
    from preemptible.store import bounds

    def ints(value: Any, depth: int = 0) -> Any:
        if depth > 8:
            raise ValueError("the recorded config nests deeper than a config does")
        if isinstance(value, dict):
            for v in value.values():
                ints(v, depth + 1)
        elif isinstance(value, list):
            for v in value:
                ints(v, depth + 1)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > bounds.MAX_CONFIG_INT:
            raise ValueError(f"the recorded config holds the integer {str(value)[:30]}, beyond any model's size")

    ints(config)
    elements = sum(math.prod(s) for s in stored.values())
    layers = {int(m.group(1)) for k in stored for m in [_LAYER_INDEX.search(k)] if m is not None}
    # names with a layer index (``h.11.``, ``layers.3.``) say how many layers there are; else each has a tensor
    have, what = (max(layers) + 1, "layer(s)") if layers else (len(stored), "tensors in all")
    limits = {key: (have, f"the stored tensors hold {have} {what}") for key in _LAYER_FIELDS}
    limits |= {key: (elements, f"larger than the {elements} elements stored") for key in _WIDTH_FIELDS}

    def bounded(doc: dict[str, Any], where: str) -> None:  # a sub-config (text_config, vision_config) too
        for key, value in doc.items():
            if isinstance(value, dict):
                bounded(value, f"{where}{key}.")
            elif key in limits and isinstance(value, int) and not isinstance(value, bool):
                most, why = limits[key]
                if not 0 <= value <= most:
                    raise ValueError(
                        f"the recorded config says {where}{key}={value}, {why}; the config does not describe these "
                        "weights. Export them with --entry instead"
                    )

    bounded(config, "")


def _write_json(ck: ReadOnlyRoot, result: Exported, **fields: Any) -> None:
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
    from preemptible.store.naming import file_stem

    return file_stem(entry)
