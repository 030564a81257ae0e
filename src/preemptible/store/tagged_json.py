"""Tagged JSON: every non-tensor leaf of a state, encoded so that it round-trips exactly.

Plain JSON loses what optimizer and scheduler state dicts are made of: int dict keys become strings, tuples
become lists, ``inf``/``nan`` are not JSON at all. Here a JSON object whose first key starts with ``$`` is a tag:

=====================================  ========================================================
``{"$float": "inf" | "-inf" | "nan"}``  a non-finite float
``{"$tuple": [...]}``                   a tuple (also ``torch.Size``)
``{"$dict": [[key, value], ...]}``      a dict whose keys are not all plain strings (or start with ``$``)
``{"$tensor": "name"}``                 a tensor stored under ``name`` in a tensor file
``{"$ndarray": "name"}``                a NumPy array stored under ``name``
``{"$npscalar": "<f8", "value": v}``    a NumPy scalar
``{"$bytes": "<base64>"}``              bytes
``{"$dtype": "float32"}``               a torch dtype
``{"$meta": {...}, "$dict"...}``        a state dict's ``_metadata`` (module versions), kept beside its dict
=====================================  ========================================================

Anything else (an arbitrary object, a lambda, a namedtuple) is an error naming its key path, raised at the
first save rather than discovered at the first restore. Decoding never executes code.
"""

from __future__ import annotations

import base64
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from preemptible.errors import CheckpointCorruptError, UnsupportedStateError

JSON = Any
TensorSink = Callable[[Any, str, bool], str]
"""Called with (tensor or ndarray, key path, is_numpy); stores it and returns the name it is stored under."""
TensorSource = Callable[[str, bool], Any]
"""Called with (name, is_numpy); returns the stored tensor or ndarray."""

_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
MAX_DEPTH = 100
"""Containers nested deeper than this are refused when saving and corrupt when reading (no state dict nests so)."""
_NPSCALAR_KINDS = "biufUS"  # numbers, bools and strings: what ``item()`` turns into JSON; never ``V`` (raw bytes)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is optional
        return None
    return numpy


_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})


def key_str(key: Any) -> str:
    """How a dict key appears in a key path (``optimizer/state/3/exp_avg``)."""
    return key if isinstance(key, str) else repr(key) if isinstance(key, tuple) else str(key)


def encode(obj: Any, sink: TensorSink, path: str = "", depth: int = 0) -> JSON:
    """Encode ``obj`` to tagged JSON, handing tensors and arrays to ``sink``.

    Raises:
        UnsupportedStateError: a leaf that is neither tensor, array nor representable, or containers nested more
            than `MAX_DEPTH` deep, naming its key path.
    """
    if depth > MAX_DEPTH:
        raise UnsupportedStateError(
            f"state at {path!r} is nested more than {MAX_DEPTH} containers deep, more than a checkpoint may hold "
            "(a reader could not tell it from a hostile file); flatten it in your state_dict()",
            key=path,
        )
    depth += 1
    if type(obj) in _TENSORS:  # first: the most common leaf of a large state
        return {"$tensor": sink(obj, path, False)}
    if obj is None or isinstance(obj, (bool, str, int, float)):
        return _encode_scalar(obj)
    if isinstance(obj, torch.Tensor):
        return {"$tensor": sink(obj, path, False)}
    if type(obj) in (list, tuple, torch.Size):
        items = [encode(v, sink, f"{path}/{i}", depth) for i, v in enumerate(obj)]
        return items if type(obj) is list else {"$tuple": items}
    if isinstance(obj, dict):
        return _encode_dict(obj, sink, path, depth)
    return _encode_other(obj, sink, path, depth)


def _encode_scalar(obj: bool | str | int | float | None) -> JSON:
    """None, a bool, a str, an int (an IntEnum becomes a plain int) or a float (non-finite ones tagged)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if math.isfinite(obj):
        return float(obj)
    return {"$float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}


def _encode_other(obj: Any, sink: TensorSink, path: str, depth: int) -> JSON:
    """Bytes, a torch dtype, a NumPy array (to the tensor files) or scalar; anything else cannot be stored."""
    if isinstance(obj, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, torch.dtype):
        return {"$dtype": str(obj).removeprefix("torch.")}
    np = _numpy()
    if np is None:
        raise _unsupported(obj, path)
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise _unsupported(obj, path, "a NumPy array of Python objects")
        return {"$ndarray": sink(obj, path, True)}
    if isinstance(obj, np.generic) and not isinstance(obj, np.object_):
        if obj.dtype.kind not in _NPSCALAR_KINDS:
            raise _unsupported(obj, path, f"a NumPy scalar of kind {obj.dtype.kind!r}")
        return {"$npscalar": obj.dtype.str, "value": encode(obj.item(), sink, path, depth)}
    raise _unsupported(obj, path)


def _plain_keys(obj: dict[Any, Any]) -> bool:
    """Whether a dict is written as a plain JSON object (every key a string not starting with ``$``), its keys in
    key paths as they are; otherwise as ``$dict`` pairs, each key in paths as `key_str` gives it."""
    return all(isinstance(k, str) and not k.startswith("$") for k in obj)


def _encode_dict(obj: dict[Any, Any], sink: TensorSink, path: str, depth: int) -> JSON:
    plain = _plain_keys(obj)
    out: dict[str, JSON]
    if plain:
        out = {k: encode(v, sink, f"{path}/{k}" if path else k, depth) for k, v in obj.items()}
    else:
        pairs = []
        for k, v in obj.items():
            ks = key_str(k)
            key = encode(k, sink, f"{path}/<key {ks}>", depth)
            pairs.append([key, encode(v, sink, f"{path}/{ks}" if path else ks, depth)])
        out = {"$dict": pairs}
    meta = getattr(obj, "_metadata", None)
    if isinstance(meta, dict):  # nn.Module.state_dict() carries per-module versions here
        inner = out if not plain else {"$dict": [[k, v] for k, v in out.items()]}
        return {"$dict": inner["$dict"], "$meta": encode(meta, sink, f"{path}/_metadata", depth)}
    return out


def _unsupported(obj: Any, path: str, what: str | None = None) -> UnsupportedStateError:
    kind = what or f"a {type(obj).__module__}.{type(obj).__qualname__}"
    return UnsupportedStateError(
        f"state leaf {path or '<root>'!r} is {kind}, which preemptible cannot store; expected a tensor, a NumPy "
        "array, or JSON data (None, bool, int, float, str, list, tuple, dict, bytes). Convert it in your "
        "state_dict() (e.g. to a tensor, a number or a str) or leave it out of the checkpoint",
        key=path or "<root>",
    )


def tensor_names(doc: JSON) -> set[str]:
    """The names of the tensors and arrays an encoded tree refers to."""
    out: set[str] = set()
    todo = [doc]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if len(node) == 1:
                name = node.get("$tensor", node.get("$ndarray"))
                if isinstance(name, str):
                    out.add(name)
                    continue
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return out


class _Ref:
    """A stored tensor's name, standing in for the tensor in `tensor_refs`' decoded tree."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def tensor_refs(doc: JSON) -> list[tuple[str, str]]:
    """Per tensor or array an encoded tree holds: its key path, as `encode` gave it to the sink, and the name it is
    stored under. The two differ where one tensor is held under several keys (tied weights): it is stored once,
    under the first key's name.

    Raises:
        CheckpointCorruptError: as `decode`.
    """
    out: list[tuple[str, str]] = []
    todo: list[tuple[Any, str]] = [(decode(doc, lambda name, is_numpy: _Ref(name)), "")]
    while todo:
        obj, path = todo.pop()
        if type(obj) is _Ref:
            out.append((path, obj.name))
        elif isinstance(obj, (list, tuple)):
            todo.extend((v, f"{path}/{i}") for i, v in enumerate(obj))
        elif isinstance(obj, dict):
            plain = _plain_keys(obj)
            for k, v in obj.items():
                ks = k if plain else key_str(k)
                todo.append((v, f"{path}/{ks}" if path else ks))
    out.sort()
    return out


def decode(doc: JSON, source: TensorSource, path: str = "", depth: int = 0) -> Any:
    """Decode tagged JSON, fetching tensors from ``source``.

    Raises:
        CheckpointCorruptError: an unknown or malformed tag, or nesting deeper than `MAX_DEPTH`.
    """
    if not path and not depth:
        try:
            return _quick(doc, source, 0)
        except _Unsure:
            pass  # something out of place: decode again, keeping the key path to name it
    return _decode(doc, source, path, depth)


class _Unsure(Exception):
    pass


def _quick(doc: JSON, source: TensorSource, depth: int) -> Any:
    """`_decode` without key paths (a restore decodes 10,000s of nodes; a path is only needed to name an error):
    raises `_Unsure` at anything out of place."""
    if type(doc) is dict and len(doc) == 1:
        name = doc.get("$tensor")
        if type(name) is str:
            return source(name, False)
    if not isinstance(doc, (list, dict)):
        return doc
    if depth > MAX_DEPTH:
        raise _Unsure
    depth += 1
    if isinstance(doc, list):
        return [_quick(v, source, depth) for v in doc]
    if not doc or not next(iter(doc)).startswith("$"):
        return {k: _quick(v, source, depth) for k, v in doc.items()}
    tag = next(iter(doc))
    if tag == "$dict" and type(doc["$dict"]) is list and len(doc) <= 2:
        return _quick_dict(doc, source, depth)
    try:
        return _decode_tag(tag, doc, source, "", depth)
    except (CheckpointCorruptError, KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError):
        raise _Unsure from None


def _quick_dict(doc: dict[str, Any], source: TensorSource, depth: int) -> dict[Any, Any]:
    """A ``$dict`` node (pairs, and a module's ``$meta``) without key paths."""
    result: dict[Any, Any] = OrderedDict() if "$meta" in doc else {}
    for pair in doc["$dict"]:
        if type(pair) is not list or len(pair) != 2:
            raise _Unsure
        key = _quick(pair[0], source, depth)
        try:
            hash(key)  # a list or dict, or a tuple holding one
        except TypeError:
            raise _Unsure from None
        result[key] = _quick(pair[1], source, depth)
    if "$meta" in doc:
        result._metadata = _quick(doc["$meta"], source, depth)  # type: ignore[attr-defined]
    elif len(doc) != 1:
        raise _Unsure
    return result


def _decode(doc: JSON, source: TensorSource, path: str, depth: int) -> Any:
    if type(doc) is dict and len(doc) == 1:
        name = doc.get("$tensor")
        if type(name) is str:  # the most common node of a large state, first
            return source(name, False)
    if not isinstance(doc, (list, dict)):
        return doc
    if depth > MAX_DEPTH:
        raise _corrupt(path, f"nested more than {MAX_DEPTH} containers deep, more than any save writes")
    depth += 1
    if isinstance(doc, list):
        return [_decode(v, source, f"{path}/{i}", depth) for i, v in enumerate(doc)]
    if not doc or not next(iter(doc)).startswith("$"):
        return {k: _decode(v, source, f"{path}/{k}" if path else k, depth) for k, v in doc.items()}
    tag = next(iter(doc))
    try:
        return _decode_tag(tag, doc, source, path, depth)
    except CheckpointCorruptError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
        raise _corrupt(path, f"malformed {tag} entry {str(doc)[:80]} ({type(e).__name__}: {e})") from e


def _decode_tag(tag: str, doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    decoder = _TAGS.get(tag)
    if decoder is None:
        raise _corrupt(path, f"unknown tag {tag!r}; it may come from a newer preemptible (upgrade to read it)")
    return decoder(doc, source, path, depth)


def _decode_float(doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    return _NONFINITE[doc["$float"]]


def _decode_tuple(doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    return tuple(_decode(v, source, f"{path}/{i}", depth) for i, v in enumerate(doc["$tuple"]))


def _decode_dict(doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    result: dict[Any, Any] = OrderedDict() if "$meta" in doc else {}
    for k, v in doc["$dict"]:
        key = _decode(k, source, path, depth)
        result[_hashable(key)] = _decode(v, source, f"{path}/{key_str(key)}" if path else key_str(key), depth)
    if "$meta" in doc:
        meta = _decode(doc["$meta"], source, f"{path}/_metadata", depth)
        result._metadata = meta  # type: ignore[attr-defined]
    return result


def _decode_tensor(doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    return source(_str(doc["$tensor"]), False)


def _decode_ndarray(doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    return source(_str(doc["$ndarray"]), True)


def _decode_npscalar(doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    np = _numpy()
    if np is None:
        raise _corrupt(path, "a NumPy scalar, but NumPy is not installed (pip install numpy)")
    dtype = np.dtype(_str(doc["$npscalar"]))
    value = _decode(doc["value"], source, path, depth)
    if dtype.kind not in _NPSCALAR_KINDS or not isinstance(value, (bool, int, float, str, bytes)):
        raise _corrupt(path, f"a NumPy scalar must be a number, bool or string, found {str(doc)[:80]}")
    return dtype.type(value)


def _decode_bytes(doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    return base64.b64decode(_str(doc["$bytes"]), validate=True)


def _decode_dtype(doc: dict[str, Any], source: TensorSource, path: str, depth: int) -> Any:
    dtype = getattr(torch, _str(doc["$dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise _corrupt(path, f"unknown torch dtype {doc['$dtype']!r}")
    return dtype


_TAGS: dict[str, Callable[[dict[str, Any], TensorSource, str, int], Any]] = {
    "$float": _decode_float,
    "$tuple": _decode_tuple,
    "$dict": _decode_dict,
    "$tensor": _decode_tensor,
    "$ndarray": _decode_ndarray,
    "$npscalar": _decode_npscalar,
    "$bytes": _decode_bytes,
    "$dtype": _decode_dtype,
}
"""Each tag of the encoding and its decoder."""


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, found {type(value).__name__}")
    return value


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        raise TypeError("a dict key decoded to a list")
    return key


def _corrupt(path: str, why: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"state.json at key {path or '<root>'!r}: {why}", path=path)
