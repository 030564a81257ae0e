"""Capture and restore training state: stateful objects, RNG streams and user extras, flattened to tensors
plus tagged JSON.

A *state* is a mapping of names to objects that have ``state_dict()``/``load_state_dict()`` (modules, optimizers,
LR schedulers, GradScaler, stateful data loaders, `RNGState`) or plain dicts (captured by value and updated in
place on restore).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib.util
import random
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol, runtime_checkable

import torch

from preemptible.errors import UnsupportedStateError
from preemptible.store import format as tensor_format
from preemptible.store import tagged_json


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()``, as in PyTorch.

    Examples:
        Any object of yours that has the two methods is saved and restored with the rest of the state:

        >>> from preemptible import Stateful
        >>> class Counter:
        ...     def __init__(self):
        ...         self.seen = 0
        ...     def state_dict(self):
        ...         return {"seen": self.seen}
        ...     def load_state_dict(self, state):
        ...         self.seen = state["seen"]
        >>> isinstance(Counter(), Stateful)
        True
    """

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


class RNGState:
    """The global random streams: Python ``random``, NumPy (when installed), torch CPU, every CUDA device.

    Dropout masks, data augmentation and shuffles draw from these; resuming bit-identically needs them back.

    Examples:
        >>> import torch
        >>> from preemptible import RNGState
        >>> rng = RNGState()
        >>> saved = rng.state_dict()
        >>> first = torch.rand(2)
        >>> rng.load_state_dict(saved)
        >>> torch.equal(torch.rand(2), first)  # the same draws again: what a bit-identical resume needs
        True
    """

    def __init__(self) -> None:
        self.unrestored: list[str] = []
        """After `load_state_dict`: the streams it could not put back as the checkpoint had them, and why (a resume
        that draws from them is not bit-identical)."""

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
        np = _numpy_if_installed()
        if np is not None:
            out["numpy"] = np.random.get_state()
        if torch.cuda.is_available():
            out["cuda"] = torch.cuda.get_rng_state_all()
        return out

    def derive(self, salt: int) -> None:
        """Reseed every stream from its own current state and ``salt``, deterministically: a rank that a
        checkpoint holds no streams of (a job that grew) gets streams of its own, distinct from the rank it was
        restored from and the same on every restart."""
        import xxhash

        def seed(stream: str, state: Any) -> int:
            return int(xxhash.xxh3_64_intdigest(f"{stream}:{salt}:{state!r}".encode())) & ((1 << 63) - 1)

        random.seed(seed("python", random.getstate()))
        torch.manual_seed(seed("torch", torch.get_rng_state().tolist()))  # also reseeds every CUDA device
        np = _numpy_if_installed()
        if np is not None:
            np.random.seed(seed("numpy", np.random.get_state()[1].tolist()) % (1 << 32))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        torch.set_rng_state(state["torch"])
        if "numpy" in state:
            np = _numpy_if_installed()
            if np is None:
                raise UnsupportedStateError(
                    "the checkpoint holds NumPy's random state but NumPy is not installed here; "
                    "pip install numpy to resume exactly",
                    key="rng/numpy",
                )
            np.random.set_state(state["numpy"])
        cuda = state.get("cuda")
        self.unrestored = []
        if cuda and not torch.cuda.is_available():
            self.unrestored.append(
                f"the checkpoint holds the RNG streams of {len(cuda)} CUDA device(s) and this process has no CUDA: "
                "draws on the GPU streams (dropout on a GPU) will differ"
            )
        elif not cuda and torch.cuda.is_available():
            self.unrestored.append(
                "the checkpoint holds no CUDA RNG streams (saved without CUDA) and this process has CUDA: draws on "
                "the GPU streams start from their seed, not from the interrupted run's"
            )
        if cuda and torch.cuda.is_available():
            if len(cuda) != torch.cuda.device_count():
                raise UnsupportedStateError(
                    f"the checkpoint holds RNG states of {len(cuda)} CUDA devices but this process sees "
                    f"{torch.cuda.device_count()}; resume with the same CUDA_VISIBLE_DEVICES",
                    key="rng/cuda",
                )
            torch.cuda.set_rng_state_all(cuda)


def _numpy_if_installed() -> Any:
    if importlib.util.find_spec("numpy") is None:
        return None
    import numpy

    return numpy


def check_state(state: Mapping[str, Any]) -> None:
    """Fail early, naming the key, if an entry cannot be captured."""
    for name, obj in state.items():
        if not isinstance(name, str) or not name:
            raise UnsupportedStateError(f"expected state names to be non-empty strings, found {name!r}", key=str(name))
        if not isinstance(obj, (Stateful, MutableMapping)):
            raise UnsupportedStateError(
                f"state entry {name!r} is a {type(obj).__name__}; expected an object with state_dict() and "
                "load_state_dict() (a module, optimizer, scheduler, GradScaler, data loader) or a dict",
                key=name,
            )


def capture(state: Mapping[str, Any]) -> dict[str, Any]:
    """Each entry's ``state_dict()`` (or the dict itself): references, no copies."""
    return {name: (obj if isinstance(obj, MutableMapping) else obj.state_dict()) for name, obj in state.items()}


@dataclass
class FlatState:
    """A captured state, split into tagged JSON and the tensors it refers to by name."""

    tree: Any
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    numpy: set[str] = field(default_factory=set)
    stored: dict[str, torch.dtype] = field(default_factory=dict)
    """Tensors written in another dtype than they live in (bf16 optimizer moments), by name."""
    dtensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Sharded tensors (DTensor, FSDP2): the local shard is stored; this says how it fits the whole."""
    dtensor_objs: dict[str, Any] = field(default_factory=dict)
    """The live DTensors by name (never written)."""

    def stored_dtype(self, name: str) -> torch.dtype:
        return self.stored.get(name, self.tensors[name].dtype)

    def stored_bytes(self, name: str, t: torch.Tensor) -> int:
        """Bytes of tensor ``name`` (``t``) as written."""
        dtype = self.stored.get(name)
        return t.nbytes if dtype is None else t.numel() * dtype.itemsize

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor data as written (after any cast)."""
        total = sum(t.nbytes for t in self.tensors.values())  # one C call per tensor: states have 10,000s
        for name, dtype in self.stored.items():
            t = self.tensors[name]
            total += t.numel() * (dtype.itemsize - t.element_size())
        return total


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


MOMENT_DTYPES = (torch.float32, torch.float64)


def cast_moments(state: Mapping[str, Any], flat: FlatState, dtype: torch.dtype) -> int:
    """Mark every optimizer moment (a float tensor with one or more dimensions under ``<optimizer>/state/``) to be
    written as ``dtype``. Returns the bytes saved. Restore casts them back into the optimizer's own dtype.

    Lossy by design: bf16 keeps 8 bits of mantissa, so a restored ``exp_avg_sq`` differs from the saved one in
    its low bits and the resumed run is no longer bit-identical (it stays statistically equivalent).
    """
    prefixes = tuple(f"{n}/state/" for n, obj in state.items() if isinstance(obj, torch.optim.Optimizer))
    saved = 0
    for name, t in flat.tensors.items():
        if name.startswith(prefixes) and t.dtype in MOMENT_DTYPES and t.dim() > 0 and name not in flat.numpy:
            flat.stored[name] = dtype
            saved += t.numel() * (t.element_size() - _itemsize(dtype))
    return saved


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/]")


def flatten(captured: Mapping[str, Any]) -> FlatState:
    """Split a captured state into tagged JSON and named tensors.

    Tensor names are key paths (``optimizer/state/3/exp_avg``). A tensor that appears twice (tied weights) is
    stored once and both places refer to it.

    Raises:
        UnsupportedStateError: a leaf that cannot be stored, naming its key path.
    """
    flat = FlatState(tree=None)
    seen: dict[tuple[Any, ...], str] = {}

    tensors = flat.tensors
    strided = torch.strided
    dtypes = tensor_format.DTYPES

    def sink(obj: Any, path: str, is_numpy: bool) -> str:
        # The common case first, inline: a plain dense CPU/GPU tensor (states hold 10,000s of them).
        if (
            type(obj) in _PLAIN_TENSORS
            and obj.layout is strided
            and not obj.is_meta
            and obj.dtype in dtypes
            and not is_numpy
        ):
            ptr = obj.data_ptr()
            key = (obj.device, ptr, obj.shape, obj.stride(), obj.dtype) if ptr and obj.numel() else None
            if key is not None:
                known = seen.get(key)
                if known is not None:
                    return known
            name = _unique(path, tensors)
            tensors[name] = obj.detach() if obj.requires_grad else obj
            if key is not None:
                seen[key] = name
            return name
        sharded = None
        if is_numpy:
            tensor = from_numpy(obj, path)
        elif is_dtensor(obj):
            sharded = obj
            tensor = obj.to_local()  # this rank's shard, sharing the DTensor's memory
            _check_tensor(tensor, path)
        else:
            tensor = obj
            _check_tensor(tensor, path)
        key = _alias_key(tensor)
        if key is not None and key in seen and not is_numpy:
            return seen[key]
        name = _unique(path, flat.tensors)
        flat.tensors[name] = tensor.detach() if tensor.requires_grad else tensor
        if sharded is not None:
            flat.dtensors[name] = dtensor_meta(sharded)
            flat.dtensor_objs[name] = sharded
        if is_numpy:
            flat.numpy.add(name)
        elif key is not None:
            seen[key] = name
        return name

    flat.tree = tagged_json.encode(dict(captured), sink)
    return flat


def select(flat: FlatState, entries: set[str]) -> FlatState:
    """The part of a flattened state that belongs to the given top-level entries."""

    def mine(name: str) -> bool:
        return group_of(name) in entries

    return FlatState(
        tree={k: v for k, v in flat.tree.items() if k in entries},
        tensors={n: t for n, t in flat.tensors.items() if mine(n)},
        numpy={n for n in flat.numpy if mine(n)},
        stored={n: d for n, d in flat.stored.items() if mine(n)},
        dtensors={n: m for n, m in flat.dtensors.items() if mine(n)},
        dtensor_objs={n: o for n, o in flat.dtensor_objs.items() if mine(n)},
    )


def is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local") and hasattr(t, "placements")


def dtensor_meta(t: Any) -> dict[str, Any]:
    """How a DTensor's local shard fits the whole: global shape and stride, placements, mesh shape, and the global
    offset of this rank's shard (None where the layout is not one `shard_rows` describes)."""
    return {
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "placements": [repr(p) for p in t.placements],
        "mesh": list(t.device_mesh.shape),
        "offset": local_offset(t),
    }


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The rows ``[begin, end)`` that rank ``rank`` of ``world`` holds of a dimension of ``rows`` split by
    ``Shard``: ``torch.chunk``'s rule (ceil(rows / world) each, the last ones shorter or empty), as DTensor and
    FSDP2 split it."""
    size = -(-rows // world)
    begin = min(rank * size, rows)
    return begin, min(begin + size, rows)


def local_offset(t: Any) -> list[int] | None:
    """The global index of the first element of this rank's shard of a DTensor on a 1-D mesh with one ``Shard``
    or ``Replicate`` placement, checked against its local shape; None for any other layout."""
    mesh = t.device_mesh
    coord = mesh.get_coordinate()
    if mesh.ndim != 1 or coord is None or len(t.placements) != 1:
        return None
    offset = [0] * t.dim()
    local = t.to_local()
    placement = repr(t.placements[0])
    if placement.startswith("Replicate"):
        return offset if tuple(local.shape) == tuple(t.shape) else None
    m = re.fullmatch(r"Shard\(dim=(\d+)\)", placement)
    if m is None:
        return None
    dim = int(m.group(1))
    begin, end = shard_rows(t.shape[dim], mesh.size(), coord[0])
    want = list(t.shape)
    want[dim] = end - begin
    if list(local.shape) != want:
        return None
    offset[dim] = begin
    return offset


def parse_placement(text: str) -> Any:
    """``Shard(dim=0)`` / ``Replicate()`` / ``Partial(sum)`` -> the placement object."""
    import re

    from torch.distributed.tensor import Replicate, Shard

    m = re.fullmatch(r"Shard\(dim=(\d+)\)", text)
    if m:
        return Shard(int(m.group(1)))
    if text.startswith("Replicate"):
        return Replicate()
    raise ValueError(f"unsupported DTensor placement {text!r} (expected Shard(dim=N) or Replicate())")


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _check_tensor(t: torch.Tensor, path: str) -> None:
    if type(t) in _PLAIN_TENSORS and t.layout is torch.strided and not t.is_meta and t.dtype in tensor_format.DTYPES:
        return  # the common case, in a few attribute reads: states hold 10,000s of tensors
    if not (type(t) is torch.Tensor or type(t) is torch.nn.Parameter):
        raise UnsupportedStateError(
            f"tensor {path!r} is a {type(t).__name__}; preemptible stores plain (dense) tensors. Convert it "
            "(e.g. DTensor.full_tensor() or to_local()) in your state_dict()",
            key=path,
        )
    if t.layout != torch.strided:
        raise UnsupportedStateError(
            f"tensor {path!r} has layout {t.layout}; expected a dense (strided) tensor. Call .to_dense() in your "
            "state_dict()",
            key=path,
        )
    if t.is_meta:
        raise UnsupportedStateError(
            f"tensor {path!r} is on the meta device and has no data; materialise the model before saving", key=path
        )
    tensor_format.check_dtype(t, path)


def from_numpy(arr: Any, path: str) -> torch.Tensor:
    import numpy as np

    try:
        t = torch.from_numpy(np.ascontiguousarray(arr))
    except TypeError as e:
        raise UnsupportedStateError(
            f"NumPy array {path!r} has dtype {arr.dtype}, which cannot be stored as a tensor ({e})", key=path
        ) from e
    tensor_format.check_dtype(t, path)
    return t


def _alias_key(t: torch.Tensor) -> tuple[Any, ...] | None:
    """Two tensors are the same stored tensor when they are the same view of the same memory."""
    ptr = t.data_ptr()
    if not ptr or t.numel() == 0:  # no memory of its own to share
        return None
    return (t.device, ptr, t.shape, t.stride(), t.dtype)


_SAFE: dict[str, str] = {}  # key path -> file-safe name: the same paths come back at every save


def _safe_name(path: str) -> str:
    name = _SAFE.get(path)
    if name is None:
        if len(_SAFE) > 1 << 20:
            _SAFE.clear()
        name = _SAFE[path] = _UNSAFE.sub("_", path) or "tensor"
    return name


def _unique(path: str, taken: Mapping[str, Any]) -> str:
    base = _safe_name(path)
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}~{i}"
    return name


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: a state of many tensors allocates many small objects, and a full
    collection over a training process's heap in the middle of a save costs more than the save's own Python
    work. Refcounting still frees everything; the collector resumes (if it was on) afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def group_of(name: str) -> str:
    """Tensors are grouped into files by their top-level state entry."""
    return name.split("/", 1)[0]


def unflatten(tree: Any, tensors: Mapping[str, torch.Tensor], numpy: set[str] | frozenset[str] = frozenset()) -> Any:
    """Rebuild the captured state from tagged JSON and loaded tensors (shared names come back shared)."""

    def source(name: str, is_numpy: bool) -> Any:
        if name not in tensors:
            from preemptible.errors import CheckpointCorruptError

            raise CheckpointCorruptError(
                f"state.json refers to tensor {name!r}, which no tensor file of the checkpoint holds", path=name
            )
        t = tensors[name]
        return t.numpy() if is_numpy else t

    return tagged_json.decode(tree, source)


def differences(live: Any, stored: Any, path: str = "") -> list[str]:
    """Every mismatch of tensor keys, shapes and dtypes between a live capture and a stored one.

    Non-tensor leaves are not compared (their values are what gets restored). A live dict that is empty is
    filled lazily (an optimizer before its first step), so whatever the checkpoint holds under it is accepted.
    """
    out: list[str] = []
    _diff(live, stored, path, out)
    return out


_ABSENT = object()
_SCALARS = frozenset({type(None), bool, int, float, str})


@dataclass(slots=True)
class PlainFit:
    """What `plain_fit` decided: the live tensors to read each stored tensor into, and the state entries as the
    checkpoint holds them, built in the same walk with those live tensors in their places. `complete` fills in what
    only the read can give."""

    targets: dict[str, torch.Tensor]
    """Stored name -> the contiguous CPU live tensor its bytes are read into (or, cast, copied into)."""
    loaded: dict[str, Any]
    slots: list[tuple[Any, Any, str]] = field(default_factory=list)
    """(container, key, stored name): a tensor the read makes (its live one is not a contiguous CPU tensor)."""
    subtrees: list[tuple[Any, Any, Any]] = field(default_factory=list)
    """(container, key, tagged JSON) decoded after the read: under a live dict still empty, a stored value that is
    not a plain scalar, an entry the live state lacks; a key of ``_META``: a state dict's ``_metadata``."""
    tuples: list[tuple[Any, Any, list[Any]]] = field(default_factory=list)
    """(container, key, items) that become tuples once filled, in the order the walk met them."""

    def complete(self, tensors: Mapping[str, torch.Tensor], numpy: set[str] | frozenset[str] = frozenset()) -> Any:
        """The state entries, given the tensors the read returned.

        Raises:
            CheckpointCorruptError: a subtree refers to a tensor no file holds.
        """
        for box, key, name in self.slots:
            box[key] = tensors[name]  # every name the walk met is in a header (it checked), so it was read
        for box, key, doc in self.subtrees:
            value = unflatten(doc, tensors, numpy)
            if key is _META:
                box._metadata = value
            else:
                box[key] = value
        for box, key, items in reversed(self.tuples):  # inner ones first: the walk meets a tuple before its items
            box[key] = tuple(items)
        return self.loaded


_META = object()


def plain_fit(
    live: Mapping[str, Any],
    tree: Mapping[str, Any],
    entries: Mapping[str, tensor_format.Entry],
    casts: Mapping[str, torch.dtype],
) -> PlainFit | None:
    """Whether a live capture and a stored tree (tagged JSON) plainly fit, in one walk of both: the same containers
    and keys, and at every tensor a stored one (``entries``, from the headers) of the live shape and dtype
    (``casts``: the dtype a tensor stored in another goes back to). Nothing is decoded twice: the walk also builds
    the state entries a restore hands to ``load_state_dict``, as `unflatten` would, with the live tensor read into
    in place of each stored one. Only contiguous CPU tensors are read into, so each is exactly its stored
    tensor's bytes in memory, or (cast) its shape in the dtype it goes back to.

    None when it cannot tell: anything beyond plain tensors, dicts, lists, tuples and JSON scalars (DTensors,
    arrays, odd keys), or any difference at all. The caller then compares the slow way, which names every
    difference (`differences`); a None never means "does not fit". Like `differences`, a live dict that is empty is
    filled lazily and accepts whatever the checkpoint holds under it.
    """
    out: dict[str, torch.Tensor] = {}
    loaded: dict[str, Any] = dict.fromkeys(tree)
    fit = PlainFit(out, loaded)
    slots, subtrees = fit.slots, fit.subtrees
    todo = _fit_roots(live, tree, loaded, subtrees)
    if todo is None:
        return None
    strided = torch.strided
    get_entry = entries.get
    plain, scalars = _PLAIN_TENSORS, _SCALARS
    # IMPORTANT: a restore walks every tensor of the state here (10,000s): one loop over a stack, not a call per
    # tensor (the tensor case first, inline); a call per container, where lists of scalars (an optimizer's
    # parameter ids) are judged and copied in C.
    while todo:
        obj, doc, box, key = todo.pop()
        kind = type(obj)
        if kind in plain:
            if type(doc) is not dict or len(doc) != 1:
                return None
            ref = doc.get("$tensor")
            e = get_entry(ref) if type(ref) is str else None
            if (
                e is None
                or obj.layout is not strided
                or obj.shape != e.shape
                or obj.dtype is not (casts.get(e.name, e.dtype) if casts else e.dtype)
            ):
                return None
            if obj.is_cpu and obj.is_contiguous():
                box[key] = out.setdefault(e.name, obj)  # tied weights: both places hold the one read into
            else:  # it fits, and is loaded by its load_state_dict() from a tensor the read makes
                slots.append((box, key, e.name))
        elif kind in scalars:  # its value is what gets restored; only a tensor in its place is a difference
            if type(doc) is dict or type(doc) is list:
                if type(doc) is dict and ("$tensor" in doc or "$ndarray" in doc):
                    return None
                subtrees.append((box, key, doc))
            else:
                box[key] = doc
        elif not _fit_container(obj, doc, box, key, fit=fit, todo=todo):
            return None
    return fit


_Todo = list[tuple[Any, Any, Any, Any]]
"""`plain_fit`'s stack: (live object, its tagged JSON, the container its entry goes into, its key there)."""


def _fit_roots(
    live: Mapping[str, Any], tree: Mapping[str, Any], loaded: dict[str, Any], subtrees: list[tuple[Any, Any, Any]]
) -> _Todo | None:
    """`plain_fit`'s first stack: each live entry beside its stored tree (None: a live entry the checkpoint lacks,
    or a stored one that is not a mapping). A stored entry the live state lacks is decoded after the read."""
    todo: _Todo = []
    for name, doc in tree.items():
        obj = live.get(name, _ABSENT)
        if obj is _ABSENT:
            subtrees.append((loaded, name, doc))  # not restored, but decoded as a restore always did
        elif not _mapping_doc(doc):  # not the mapping every state_dict() is (even an empty one)
            return None
        else:
            todo.append((obj, doc, loaded, name))
    if any(name not in tree for name in live):
        return None
    return todo


def _fit_container(obj: Any, doc: Any, box: Any, key: Any, *, fit: PlainFit, todo: _Todo) -> bool:
    """`plain_fit` at a live container: its entries made in ``box[key]`` and pushed on ``todo``; False when it
    cannot tell."""
    kind = type(obj)
    if kind is dict or isinstance(obj, Mapping):
        return _fit_mapping(obj, doc, box, key, fit=fit, todo=todo)
    if kind is list:
        items = doc
    elif kind is tuple or kind is torch.Size:
        items = doc.get("$tuple") if type(doc) is dict and len(doc) == 1 else None
    else:
        return False
    if type(items) is not list or len(items) != len(obj):
        return False
    only_scalars = _SCALARS.issuperset
    if only_scalars(map(type, items)) and only_scalars(map(type, obj)):
        box[key] = items.copy() if kind is list else tuple(items)  # plain JSON scalars are their values
        return True
    new_items: list[Any] = [None] * len(items)
    box[key] = new_items
    if kind is not list:
        fit.tuples.append((box, key, new_items))
    todo.extend(zip(obj, items, repeat(new_items), range(len(items))))
    return True


def _fit_mapping(obj: Mapping[Any, Any], doc: Any, box: Any, key: Any, *, fit: PlainFit, todo: _Todo) -> bool:
    """`plain_fit` at a live mapping (a live one still empty is filled lazily: decoded after the read)."""
    if not obj:
        fit.subtrees.append((box, key, doc))
        return True
    stored = _stored_mapping(doc)
    if stored is None or len(stored) != len(obj):
        return False
    if stored is doc or len(doc) == 1:  # a plain object, or {"$dict": pairs}
        new: dict[Any, Any] = dict.fromkeys(stored)
    elif len(doc) == 2 and "$meta" in doc:  # a module's state dict, as `tagged_json.decode` builds it
        new = OrderedDict.fromkeys(stored)
        fit.subtrees.append((new, _META, doc["$meta"]))
    else:
        return False
    box[key] = new
    for k, v in obj.items():
        sub = stored.get(k, _ABSENT)
        if sub is _ABSENT:
            return False
        todo.append((v, sub, new, k))
    return True


def _mapping_doc(doc: Any) -> bool:
    """Whether tagged JSON encodes a mapping: a plain object, or one tagged ``$dict`` (as `tagged_json.decode`
    reads it: by its first key)."""
    if type(doc) is not dict:
        return False
    first = next(iter(doc), "")
    return not first.startswith("$") or first == "$dict"


def _stored_mapping(doc: Any) -> dict[Any, Any] | None:
    """A stored mapping's entries by key, or None when it is not a mapping or has keys that are not str or int."""
    if not _mapping_doc(doc):
        return None
    if not doc or not next(iter(doc)).startswith("$"):
        return doc  # type: ignore[no-any-return]
    pairs = doc["$dict"]
    if type(pairs) is not list:
        return None
    stored = {}
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) not in (str, int):
            return None
        stored[pair[0]] = pair[1]
    return stored


def _describe(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def _has_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, Mapping):
        return any(_has_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(v) for v in x)
    return False


def _diff(live: Any, stored: Any, path: str, out: list[str]) -> None:
    if is_dtensor(live):
        live = live.to_local()  # sharded: the file holds this rank's shard
    if isinstance(live, torch.Tensor) or isinstance(stored, torch.Tensor):
        _diff_tensor(live, stored, path or "<root>", out)
    elif isinstance(live, Mapping) and isinstance(stored, Mapping):
        _diff_mapping(live, stored, path, out)
    elif isinstance(live, (list, tuple)) and isinstance(stored, (list, tuple)):
        if len(live) != len(stored) and (_has_tensor(live) or _has_tensor(stored)):
            out.append(f"{path or '<root>'}: {len(stored)} entries in checkpoint, {len(live)} live")
            return
        for i, (a, b) in enumerate(zip(live, stored, strict=False)):
            _diff(a, b, f"{path}/{i}", out)


def _diff_tensor(live: Any, stored: Any, where: str, out: list[str]) -> None:
    """`_diff` where either side is a tensor."""
    if isinstance(live, torch.Tensor) and isinstance(stored, torch.Tensor):
        if live.shape != stored.shape or live.dtype != stored.dtype:
            what = "shape" if live.shape != stored.shape else "dtype"
            out.append(f"{where}: {what} differs: {_describe(stored)} in checkpoint, {_describe(live)} live")
    elif isinstance(live, torch.Tensor):
        out.append(f"{where}: a tensor {_describe(live)} live, a {type(stored).__name__} in checkpoint")
    else:
        out.append(f"{where}: a tensor {_describe(stored)} in checkpoint, a {type(live).__name__} live")


def _diff_mapping(live: Mapping[Any, Any], stored: Mapping[Any, Any], path: str, out: list[str]) -> None:
    """`_diff` of two mappings (a live one still empty is filled lazily: no difference)."""
    if not live:
        return
    for k, v in live.items():
        sub = f"{path}/{tagged_json.key_str(k)}" if path else tagged_json.key_str(k)
        if k in stored:
            _diff(v, stored[k], sub, out)
        elif _has_tensor(v):
            out.append(f"{sub}: missing from checkpoint")
    for k, v in stored.items():
        if k not in live and _has_tensor(v):
            sub = f"{path}/{tagged_json.key_str(k)}" if path else tagged_json.key_str(k)
            out.append(f"{sub}: in checkpoint but not in the live state")


def apply(state: Mapping[str, Any], loaded: Mapping[str, Any], *, live: Mapping[str, Any] | None = None) -> None:
    """Load ``loaded`` into the live objects in place.

    ``live``: the objects' state dicts as captured before a restore read into them (`capture`). A module the read
    filled in place, whose ``load_state_dict`` would only copy each of its tensors onto itself, is not loaded again
    (`_loaded_in_place`: 2,500 parameters, 8.5 of a restore's 115 ms)."""
    for name, obj in state.items():
        if name not in loaded and name.startswith("_"):
            continue  # preemptible's own entry, absent from a checkpoint a bare Checkpointer wrote
        value = loaded[name]
        if isinstance(obj, MutableMapping):
            obj.clear()
            obj.update(value)
        else:
            if isinstance(obj, torch.optim.Optimizer):
                _index_param_ids(value)
            elif live is not None and isinstance(obj, _MODULE) and _loaded_in_place(obj, live.get(name), value):
                continue
            obj.load_state_dict(value)


_MODULE = torch.nn.Module


def _loaded_in_place(module: torch.nn.Module, live: Any, loaded: Mapping[str, Any]) -> bool:
    """Whether ``module.load_state_dict(loaded)`` would only copy each of its tensors onto itself: ``loaded`` holds,
    under exactly the keys of ``live`` (the module's state dict before the read), its very tensors (or views of
    exactly their memory, as tied weights are), and the module and every child load as `torch.nn.Module` does:
    no override, no load hooks, no extra state, parameters copied into rather than swapped. Anything else, and the
    module's own ``load_state_dict`` runs."""
    if (
        type(module).load_state_dict is not _MODULE.load_state_dict
        or not isinstance(live, Mapping)
        or len(live) != len(loaded)
        or torch.__future__.get_swap_module_params_on_conversion()
    ):
        return False
    for m in module.modules():
        cls = type(m)
        if (
            cls._load_from_state_dict is not _MODULE._load_from_state_dict
            or cls.set_extra_state is not _MODULE.set_extra_state
            or m._load_state_dict_pre_hooks
            or m._load_state_dict_post_hooks
        ):
            return False
    plain, get = _PLAIN_TENSORS, loaded.get
    for key, t in live.items():
        found: Any = get(key)
        if found is t and type(t) in plain:
            continue
        if type(t) not in plain or type(found) not in plain or (alias := _alias_key(t)) is None:
            return False
        if alias != _alias_key(found):  # not a tied weight captured twice: the same view of the same memory
            return False
    return True


class ParamIds(list):  # type: ignore[type-arg]
    """A loaded param group's ``params`` (parameter ids): a list whose ``in`` is a set lookup.

    torch's ``Optimizer.load_state_dict`` asks ``param_id in group["params"]`` of the groups it is given once per
    state tensor (`_process_value_according_to_param_policy`): with a plain list that is quadratic in the number
    of parameters (10 us per tensor at 2,500 parameters, half a second per 10,000 values at 10,000). It deep-copies
    the groups and puts the live parameters in place of the ids before keeping them, so the optimizer never holds
    one of these; to everything else it is the list it was.
    """

    __slots__ = ("_index",)
    _index: frozenset[object]

    def __contains__(self, item: object) -> bool:
        try:
            index = self._index
        except AttributeError:
            try:
                index = self._index = frozenset(self)
            except TypeError:  # an id that is not hashable: the list's own search
                return list.__contains__(self, item)
        try:
            return item in index
        except TypeError:
            return list.__contains__(self, item)

    def __deepcopy__(self, memo: dict[int, Any]) -> ParamIds:
        # Optimizer.load_state_dict deep-copies the groups: ids that are ints (immutable) need no copy each
        if _SCALARS.issuperset(map(type, self)):
            return ParamIds(self)
        return ParamIds(copy.deepcopy(list(self), memo))


def _index_param_ids(value: Any) -> None:
    groups = value.get("param_groups") if isinstance(value, Mapping) else None
    if not isinstance(groups, list):
        return
    for group in groups:
        if isinstance(group, dict) and type(group.get("params")) is list:
            group["params"] = ParamIds(group["params"])
