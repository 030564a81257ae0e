"""The steady state of a training run: the same structure saved again and again, only the numbers changing.

Between two saves of a run, the captured ``state_dict()`` trees almost always have the same keys, the same tensors
(the same memory, shapes and dtypes) and mostly the same non-tensor leaves (a learning rate may change). Turning a
state of 10,000s of tensors into tensor names, files and ``state.json`` costs Python work per tensor (about 8 us
here), more than copying a small tensor's bytes. `SteadyPlans` does that work once per structure:

1. `scan` walks the captured tree in the order `tagged_json.encode` does, and returns its *shape* (container types
   and keys), its tensors and its other leaves, or None for anything but plain dicts, lists, tuples, tensors and
   JSON scalars (NumPy, DTensors, custom leaves: those saves take the general path, every time).
2. The first save of a shape flattens and plans a *marked* copy of the tree, its leaves replaced by unique marker
   strings, with the general code (`flatten`, `plan_share`). That gives a template: the file specs by tensor
   position, and ``state.json`` cut at the markers.
   An emergency save makes none (`Checkpointer` takes the general path): the run stops after it.
3. Every save of that shape (the first included) fills the template: the live tensors into the specs, the leaves'
   JSON between the cut pieces. A tensor whose memory, dtype, shape or strides changed, or a key or leaf type
   that changed, is a new shape: step 2 again. The tensors' attributes are compared by torch's own C++ checks
   where torch has them (the guards of ``torch.compile``, `_guards`), else read one by one in Python.

The bytes written are those of the general path (the tests compare them, save by save).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import operator
import re
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch

from preemptible.state import from_numpy
from preemptible.store import tagged_json
from preemptible.writer import FileSpec, SavePlan

log = logging.getLogger("preemptible")

_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_SCALARS = frozenset({type(None), bool, int, float, str})
_DICTS = frozenset({dict, OrderedDict})
_TENSOR = "tensor"  # the shape's marks for a tensor leaf, an array leaf
_ARRAY = "ndarray"
_NDARRAY = numpy.ndarray


@dataclass
class Scan:
    """What `scan` saw: two scans with equal ``shape`` and ``meta`` flatten to the same names and files."""

    shape: list[Any]
    tensors: list[Any]
    """Tensors and NumPy arrays, in encoding order."""
    leaves: list[Any]
    arrays: list[int]
    """Positions in ``tensors`` of NumPy arrays (stored as tensors, converted at every save)."""
    meta: Meta | None = None

    def tensor_meta(self) -> Meta:
        """Per tensor: its memory, dtype, shape, strides, device (they decide its name, aliases and bytes) and
        whether it requires grad (then it is written detached). Per array: its memory, dtype and shape."""
        if self.meta is None:
            tensors = self._seen()
            rest: list[tuple[Any, ...]] = []
            for at in range(0, len(tensors), _META_PIECE):
                if at:
                    time.sleep(0)  # lets the GIL go: see `_META_PIECE`
                piece = tensors[at : at + _META_PIECE]
                rest += [(t.dtype, t.shape, t.stride(), t.device, t.requires_grad) for t in piece]  # `_row`, inline
            self.meta = Meta(_ptrs(tensors, arrays=bool(self.arrays)), rest)
        return self.meta

    def ptrs(self) -> list[int]:
        """Per tensor or array: where its memory starts."""
        return _ptrs(self._seen(), arrays=bool(self.arrays))

    def _seen(self) -> list[Any]:
        """``tensors``, each array as an `_ArrayMeta`."""
        if not self.arrays:
            return self.tensors
        tensors = list(self.tensors)
        for i in self.arrays:
            tensors[i] = _ArrayMeta(tensors[i])
        return tensors


def _row(t: Any) -> tuple[Any, ...]:
    """A tensor's (or an `_ArrayMeta`'s) attributes but its memory, as `Meta.rest` holds them."""
    return (t.dtype, t.shape, t.stride(), t.device, t.requires_grad)


def _ptrs(seen: list[Any], *, arrays: bool) -> list[int]:
    # Tensors alone: the unbound method, faster than any wrapper.
    data_ptr: Callable[[Any], int] = _DATA_PTR if arrays else torch.Tensor.data_ptr
    return list(map(data_ptr, seen))


_DATA_PTR = operator.methodcaller("data_ptr")
_META_PIECE = 512
"""`Scan.tensor_meta` reads this many tensors (about 0.2 ms), then lets the GIL go. A deferred check reads 10,000s
while the files are written: a writer back from the disk would otherwise wait up to the interpreter's switch
interval (5 ms) for the GIL to hash its next piece, with the disk idle (writes of 120 MB, 10,000 tensors: 3-5 ms
shorter)."""
_GUARD_PIECE = 2048
"""`Template.fits` checks this many tensors per call of a guard (about 0.17 ms), then lets the GIL go (as
`_META_PIECE`)."""
_CPU = torch.device("cpu")


def _guards(tensors: list[Any]) -> list[Any] | None:
    """Checks of ``tensors``' attributes made by torch itself: the guards ``torch.compile`` puts on the tensors it
    was compiled for (``torch._C._dynamo.guards.TensorGuards``, one per `_GUARD_PIECE`). Each compares a tensor's
    Python type, dispatch keys (its device type and layout), dtype, device index, requires_grad, sizes and
    strides with those it was made from, in C++: 10,000 tensors in about 0.8 ms, against about 5 ms to read the
    same attributes in Python (`Scan.tensor_meta`) and compare them. None where torch has no such guards, or they
    do not pass the tensors they were made from: `Scan.tensor_meta` then does it all."""
    make = _tensor_guards()
    if make is None:
        return None
    out = []
    try:
        for at in range(0, len(tensors), _GUARD_PIECE):
            piece = tensors[at : at + _GUARD_PIECE]
            guard = make(*piece, dynamic_dims_sizes=None, dynamic_dims_strides=None)
            if guard.check(*piece) is not True:
                return None
            out.append(guard)
    except Exception:  # a tensor it cannot guard (a subclass, a sparse layout): read in Python
        return None
    return out


@functools.cache
def _tensor_guards() -> Any:
    """``TensorGuards``, if this torch has it (a private API) with the signature and the meaning relied on: a
    guard passes its own tensor, and fails one that differs in any attribute `Scan.tensor_meta` reads."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        make: Any = TensorGuards  # its stub leaves out the tensors
        base = torch.zeros(2, 3)
        guard = make(base, dynamic_dims_sizes=None, dynamic_dims_strides=None)
        others = [
            base.view(torch.int32),  # dtype
            base.view(3, 2),  # shape
            base.view(6),  # dimensions
            base.as_strided((2, 3), (1, 2)),  # strides only
            base.detach().requires_grad_(True),
            torch.zeros(2, 3, device="meta"),  # device
        ]
        if guard.check(base) is True and not any(guard.check(t) for t in others):
            return make
    except Exception:  # missing, or another signature
        pass
    log.debug("torch has no usable tensor guards: a save's tensors are checked in Python")
    return None


@dataclass
class Meta:
    """`Scan.tensor_meta`, by column: the memory, which may move from save to save (RNG states are new tensors at
    every ``state_dict()``, an optimizer's state is after a restore), apart from the rest, which rarely changes,
    so that each is compared in one go."""

    ptrs: list[int]
    rest: list[tuple[Any, ...]]
    """Per tensor: dtype, shape, strides, device, requires_grad."""

    def rows(self) -> list[tuple[Any, ...]]:
        """Per tensor: (memory, dtype, shape, strides, device, requires_grad)."""
        return [(p, *r) for p, r in zip(self.ptrs, self.rest, strict=True)]


class _ArrayMeta:
    """A NumPy array seen through the tensor attributes `Scan.tensor_meta` reads (an array is never aliased)."""

    __slots__ = ("_ptr", "dtype", "requires_grad", "shape")

    def __init__(self, arr: Any) -> None:
        self._ptr = arr.__array_interface__["data"][0]
        self.dtype = arr.dtype.str
        self.shape = arr.shape
        self.requires_grad = False

    def data_ptr(self) -> int:
        return int(self._ptr)

    def stride(self) -> None:
        return None

    @property
    def device(self) -> str:
        return "numpy"


def scan(captured: Mapping[str, Any]) -> Scan | None:
    """The shape, tensors and scalar leaves of a captured state, in encoding order; None if it holds anything else
    (then the general path is taken)."""
    out = Scan([], [], [], [])
    try:
        return out if _scan(captured, out.shape, out.tensors, out.leaves, out.arrays) else None
    except RuntimeError:  # a tensor without strides or memory (sparse, meta): the general path says what is wrong
        return None


def _scan(obj: Any, shape: list[Any], tensors: list[Any], leaves: list[Any], arrays: list[int]) -> bool:
    kind = type(obj)
    if kind in _DICTS:
        # A module's state_dict() carries per-module versions in _metadata: part of the shape (compared by value).
        # Keys compare equal across types (1 == 1.0 == True) but are written apart: their types are part of it too.
        keys = tuple(obj)
        shape.append((kind, keys, tuple(map(type, keys)), getattr(obj, "_metadata", None)))
        values: Any = obj.values()
    elif kind is list or kind is tuple:
        shape.append((kind, len(obj)))
        values = obj
    else:
        return False
    for v in values:
        t = type(v)
        if t in _TENSORS:
            shape.append(_TENSOR)
            tensors.append(v)
        elif t in _SCALARS:
            shape.append(t)
            leaves.append(v)
        elif t is _NDARRAY and not v.dtype.hasobject:  # e.g. NumPy's random state
            shape.append(_ARRAY)
            arrays.append(len(tensors))
            tensors.append(v)
        elif not _scan(v, shape, tensors, leaves, arrays):
            return False
    return True


def _marked(obj: Any, marks: list[str], counter: list[int]) -> Any:
    """A copy of the tree with every scalar leaf replaced by its marker string (in `scan` order)."""
    kind = type(obj)
    if kind in _DICTS:
        copy = kind((k, _marked_leaf(v, marks, counter)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            copy._metadata = meta  # type: ignore[attr-defined]
        return copy
    return kind(_marked_leaf(v, marks, counter) for v in obj)


def _marked_leaf(v: Any, marks: list[str], counter: list[int]) -> Any:
    t = type(v)
    if t in _TENSORS or t is _NDARRAY:
        return v
    if t in _SCALARS:
        counter[0] += 1
        return marks[counter[0] - 1]
    return _marked(v, marks, counter)


def _refuse(obj: Any, path: str, is_numpy: bool) -> str:  # pragma: no cover - scalars hold no tensors
    raise AssertionError("a scalar leaf holds no tensor")


def leaf_json(value: Any) -> str:
    """A scalar leaf as ``state.json`` writes it (`writer.state_json`'s separators, tags for inf and nan)."""
    return json.dumps(tagged_json.encode(value, _refuse), separators=(",", ":"), allow_nan=False)


@dataclass
class Template:
    """One shape's plan, by tensor position; ``state.json`` cut at its leaves."""

    shape: list[Any]
    meta: Meta
    specs: list[tuple[str, tuple[tuple[str, int], ...], dict[str, torch.dtype]]]
    """Per file: its name, (tensor name, tensor position) per item, and the tensors it casts."""
    pieces: dict[str, tuple[list[str], list[int]]]
    """Per document: the text between leaves, and which leaf goes after each piece but the last."""
    leaves: list[Any]
    leaf_text: list[str]
    floats: list[int]
    """Positions of float leaves: 0.0 equals -0.0, but they are written differently."""
    grad: list[int]
    """Positions of tensors that require grad: written detached."""
    arrays: list[int]
    """Positions of NumPy arrays: converted to tensors at every save."""
    single: list[bool]
    """Per position: no other position shares its memory (its memory may change between saves)."""
    distinct: int
    """How many tensors are stored (positions that share memory are stored once)."""
    nbytes: int
    total_bytes: int
    token: object
    prepared: list[list[Any]]
    """Per file: its safetensors layout and header, made at its first write (`tensor_format.encode`)."""
    order: list[int]
    """Tensor positions in file order (as staged)."""
    columns: list[tuple[tuple[str, ...], list[int]]] = field(default_factory=list)
    """Per file: its tensor names and their positions (``specs`` by column, zipped from C at every refill)."""
    on_cpu: bool = False
    """Whether every tensor is on the CPU: their devices are part of ``meta``, the same at every refill."""
    guards: list[Any] | None = None
    """`_guards` of the tensors the template was made from (whose attributes are ``meta.rest``): one per object,
    at the position where it first comes (``guarded``); not the arrays."""
    guarded: list[int] | None = None
    """Positions `guards` check, in order; None: all."""
    repeats: list[tuple[int, int]] = field(default_factory=list)
    """Positions holding the same object as an earlier position (which): a guard fails an object seen twice."""

    def __post_init__(self) -> None:
        self.columns = [(tuple(n for n, _ in items), [i for _, i in items]) for _, items, _ in self.specs]
        self.on_cpu = all(row[3] == _CPU or row[3] == "numpy" for row in self.meta.rest)  # arrays: made tensors

    def guard(self, tensors: list[Any]) -> None:
        """Makes `guards` of ``tensors``, those the template was made from."""
        skip = set(self.arrays)
        first: dict[int, int] = {}
        guarded = []
        self.repeats = []
        for i, t in enumerate(tensors):
            if i in skip:
                continue
            j = first.setdefault(id(t), i)
            if j == i:
                guarded.append(i)
            else:
                self.repeats.append((i, j))
        self.guarded = None if len(guarded) == len(tensors) else guarded
        self.guards = _guards(list(map(tensors.__getitem__, guarded)))

    def fits(self, now: Scan) -> bool:
        """`matches` of ``now``'s tensors, their attributes checked by `guards` where the template has them. A
        guard that fails may have seen what the names do not depend on (a tensor's Python type, a dispatch key
        such as the conjugate bit), and an object no longer where it was repeated may still be alike: then the
        attributes are read one by one, and `matches` decides (and the guards are made anew, for the next save)."""
        guards = self.guards
        if guards is None or now.meta is not None:
            return self.matches(now.tensor_meta())
        tensors = now.tensors
        rest = self.meta.rest
        if len(tensors) != len(rest):
            return False
        for i in self.arrays:  # not guarded: as `Scan.tensor_meta` reads them
            if _row(_ArrayMeta(tensors[i])) != rest[i]:
                return False
        if any(tensors[i] is not tensors[j] for i, j in self.repeats):
            return self._read(now)
        if self.guarded is not None:
            tensors = list(map(tensors.__getitem__, self.guarded))
        for n, guard in enumerate(guards):
            if n:
                time.sleep(0)  # lets the GIL go: see `_GUARD_PIECE`
            if not guard.check(*tensors[n * _GUARD_PIECE : (n + 1) * _GUARD_PIECE]):
                return self._read(now)
        return self.matches(Meta(now.ptrs(), rest))

    def _read(self, now: Scan) -> bool:
        """`matches`, the attributes read in Python; a match is guarded anew, as it is now."""
        if not self.matches(now.tensor_meta()):
            return False
        self.guard(now.tensors)
        return True

    def sources(self, now: Scan) -> list[torch.Tensor]:
        """The tensors a refill of ``now`` stages, in file order, before ``now`` is known to match
        (`writer.Staging.begin`)."""
        tensors = now.tensors
        if self.arrays:
            tensors = list(tensors)
            for i in self.arrays:
                tensors[i] = from_numpy(tensors[i], "")
        return list(map(tensors.__getitem__, self.order))

    def matches(self, meta: Meta) -> bool:
        """Whether tensors of this ``meta`` flatten to the template's names: each the same dtype, shape, strides
        and device, and the same ones sharing memory. Tensors made anew at every ``state_dict()`` (RNG states,
        NumPy arrays) have new memory each time: fine while they share it with no other. A match makes ``meta``
        the template's, so that tensors that moved once (an optimizer's state after a restore) are not looked at
        one by one again at every save."""
        old = self.meta
        if meta.rest != old.rest or len(meta.ptrs) != len(old.ptrs):
            return False
        moved = list(itertools.compress(itertools.count(), map(operator.ne, meta.ptrs, old.ptrs)))
        if not moved:
            return True
        if not all(map(self.single.__getitem__, moved)):
            return False
        if not _still_apart(meta, moved) and _distinct(meta.rows()) != self.distinct:
            return False
        # The same names: each moved tensor still shares its memory with no other. Only the memory is kept: the
        # rest is equal, and its 10,000s of new tuples kept alive would each be walked by the collector's next pass.
        self.meta = Meta(meta.ptrs, old.rest)
        return True

    def fill(self, now: Scan) -> SavePlan:
        tensors = now.tensors
        text = self.leaf_text
        if now.leaves != self.leaves:
            old = self.leaves
            for i, (a, b) in enumerate(zip(old, now.leaves, strict=True)):
                if a != b:
                    text[i] = leaf_json(b)
            self.leaves = list(now.leaves)
        for i in self.floats:
            v = now.leaves[i]
            if v == 0.0:  # equal to the remembered 0.0 or -0.0 either way: written by its sign
                text[i] = leaf_json(v)
        if self.grad or self.arrays:
            tensors = list(tensors)
            for i in self.grad:
                tensors[i] = tensors[i].detach()
            for i in self.arrays:
                tensors[i] = from_numpy(tensors[i], "")
        get = tensors.__getitem__
        specs = [
            FileSpec(name, tuple(zip(names, map(get, positions), strict=True)), stored, prepared=box)
            for (name, _, stored), (names, positions), box in zip(self.specs, self.columns, self.prepared, strict=True)
        ]
        docs = {}
        for doc, (cuts, order) in self.pieces.items():
            parts = [cuts[0]]
            for piece, i in zip(cuts[1:], order, strict=True):
                parts.append(text[i])
                parts.append(piece)
            docs[doc] = "".join(parts).encode()
        return SavePlan(specs, docs, self.nbytes, self.total_bytes, layout_token=self.token, on_cpu=self.on_cpu)


class SteadyPlans:
    """Plans of a one-process save, remembered per shape (see the module docs). ``hits``/``misses`` count saves
    that filled a remembered template and saves that had to make one."""

    def __init__(self) -> None:
        self._template: Template | None = None
        self._config: object = None
        self.hits = 0
        self.misses = 0
        self.last = "general"
        """How the last plan was had: ``made`` (a new template), ``refilled``, or ``general`` (journaled with each
        ``save_started``)."""

    @property
    def remembers(self) -> bool:
        """Whether a template is remembered (the next plan of its shape refills it)."""
        return self._template is not None

    def plan(
        self,
        state: Mapping[str, Any],
        captured: Mapping[str, Any],
        config: object,
        general: Callable[[Mapping[str, Any]], SavePlan],
        early: Callable[[object, list[torch.Tensor]], object] | None = None,
        *,
        defer: bool = False,
    ) -> SavePlan | None:
        """This save's plan, or None when the state has parts only the general path handles (``general`` then
        runs on the real tree, by the caller). ``general(tree)`` flattens and plans a captured tree; ``config``:
        everything else a plan depends on (threads, file size, casts, the types of the state's objects).
        ``early(token, tensors)``: called with the remembered template's tensors once the state has its shape,
        before its tensors are checked (`writer.Staging.begin`). ``defer``: a refill of a template of CPU tensors
        leaves the check of its tensors to its writer (`SavePlan.check`, made while the files are written: 10,000s
        of tensors' metadata is most of a refill's time); a failed check drops the template."""
        now = scan(captured)
        if now is None:
            self._template = None
            return None
        t = self._template
        fits = t is not None and config == self._config and now.shape == t.shape
        if fits and early is not None and t is not None:
            early(t.token, t.sources(now))
        if fits and defer and t is not None and t.on_cpu:
            self.hits += 1
            self.last = "refilled"
            plan = t.fill(now)
            plan.check = lambda: self._check(t, now)
            return plan
        try:
            refill = t is not None and fits and t.fits(now)
            if not refill:
                now.tensor_meta()  # a template is made of them
        except RuntimeError:  # a tensor without strides or memory (sparse): the general path says what is wrong
            self._template = None
            return None
        if t is None or not refill:
            t = self._make(now, captured, general)
            if t is None:
                self._template = None
                return None
            self._template, self._config = t, config
            self.misses += 1
            self.last = "made"
        else:
            self.hits += 1
            self.last = "refilled"
        return t.fill(now)

    def _check(self, t: Template, now: Scan) -> bool:
        """Whether the tensors of a deferred refill fit its template; if not, the template is dropped and the next
        plan is made anew."""
        try:
            fits = t.fits(now)
        except RuntimeError:  # a tensor without strides or memory: the general path says what is wrong
            fits = False
        if not fits:
            self._template = None
            self.hits -= 1
        return fits

    def _make(
        self, now: Scan, captured: Mapping[str, Any], general: Callable[[Mapping[str, Any]], SavePlan]
    ) -> Template | None:
        nonce = secrets.token_hex(8)
        marks = [f"\0{nonce}:{i}\0" for i in range(len(now.leaves))]
        marked = _marked(captured, marks, [0])
        plan = general(marked)
        position: dict[int, int] = {}  # tensor object (as flattened) -> its position in scan order
        by_memory: dict[tuple[Any, ...], int] = {}  # for tensors flatten detached (requires_grad)
        arrays: dict[int, int] = {}  # an array's memory -> its position (flatten wraps it in a tensor, no copy)
        rows = now.tensor_meta().rows()
        for i, (t, m) in enumerate(zip(now.tensors, rows, strict=True)):
            position.setdefault(id(t), i)
            by_memory.setdefault(m, i)
            if m[4] == "numpy":
                arrays[m[0]] = i
        specs = []
        for spec in plan.specs:
            items = []
            for name, t in spec.items:
                i = position.get(id(t), -1)
                if i < 0:  # flatten detached it, or wrapped an array: find it by its memory
                    i = by_memory.get((t.data_ptr(), t.dtype, t.shape, t.stride(), t.device, True), -1)
                    if i < 0:
                        i = arrays.get(t.data_ptr(), -1)
                if i < 0 or tuple(t.shape) != tuple(now.tensors[i].shape):
                    return None  # not found as flatten saw it (a copied array): the general path, every save
                items.append((name, i))
            specs.append((spec.name, tuple(items), dict(spec.stored)))
        cut = re.compile(re.escape(json.dumps(f"\0{nonce}:")[:-1]) + r"(\d+)" + re.escape(json.dumps("\0")[1:]))
        pieces: dict[str, tuple[list[str], list[int]]] = {}
        seen = 0
        for doc, data in plan.docs.items():
            split = cut.split(data.decode())
            pieces[doc] = (split[0::2], [int(i) for i in split[1::2]])
            seen += len(split) // 2
        if seen != len(marks):  # every leaf is in exactly one document, once: otherwise no template
            return None
        leaves = list(now.leaves)
        template = Template(
            shape=now.shape,
            meta=now.tensor_meta(),
            specs=specs,
            pieces=pieces,
            leaves=leaves,
            leaf_text=[leaf_json(v) for v in leaves],
            floats=[i for i, v in enumerate(leaves) if type(v) is float],
            grad=[i for i, m in enumerate(rows) if m[-1]],
            arrays=list(now.arrays),
            single=_single(rows),
            distinct=_distinct(rows),
            nbytes=plan.nbytes,
            total_bytes=plan.total_bytes,
            token=object(),
            prepared=[[] for _ in specs],
            order=[i for _, items, _ in specs for _, i in items],
        )
        template.guard(now.tensors)
        return template


def _alias_key(m: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """As `state.flatten` tells aliases apart: memory, dtype, shape, strides, device; none for empty tensors, and
    for arrays (never shared)."""
    if not m[0] or m[4] == "numpy" or 0 in m[2]:
        return None
    return m[:5]


def _still_apart(meta: Meta, moved: list[int]) -> bool:
    """A quick proof that `_distinct` is unchanged when only the ``moved`` positions (each sharing its memory with
    no other before) changed memory: each now starts where no other position does. False: no proof (not a
    refusal: `_distinct` decides)."""
    ptrs = meta.ptrs
    if len(moved) <= 8:  # an RNG state or two
        return all(ptrs.count(ptrs[i]) == 1 for i in moved)
    starts = Counter(ptrs)  # an optimizer's state after a restore: 1,000s
    return max(map(starts.__getitem__, map(ptrs.__getitem__, moved))) == 1


def _distinct(meta: list[tuple[Any, ...]]) -> int:
    keys = [_alias_key(m) for m in meta]
    return len({k for k in keys if k is not None}) + keys.count(None)


def _single(meta: list[tuple[Any, ...]]) -> list[bool]:
    keys = [_alias_key(m) for m in meta]
    count: dict[Any, int] = {}
    for k in keys:
        if k is not None:
            count[k] = count.get(k, 0) + 1
    return [k is None or count[k] == 1 for k in keys]
