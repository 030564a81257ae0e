"""The restore's plain fit (`preemptible.state.plain_fit`): one walk of the live capture and the stored tree that
decides the common case (same keys, shapes and dtypes), says which live tensor each stored one is read into, and
builds the entries to load as `unflatten` would.
Whatever it decides, a restore must end exactly as the slow comparison (`differences`, then names from `flatten`)
would have it: the same error, or the same restored values in the same live tensors."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_steady import SCALARS, Tree, rescalar

from preemptible import Checkpointer
from preemptible.checkpoint import restore as restore_mod
from preemptible.errors import StateMismatchError
from preemptible.state import ParamIds, capture, flatten, plain_fit
from preemptible.store import format as tensor_format


class Holder:
    """A stateful object whose state dict is any tree (a stand-in for a module or optimizer of unusual shape)."""

    def __init__(self, tree: dict[str, Any]) -> None:
        self.tree = tree

    def state_dict(self) -> dict[str, Any]:
        return self.tree

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.tree = sd


def mutate(obj: Any, draw: Any, depth: int = 0) -> Any:
    """The same tree, maybe with one structural change somewhere: a tensor of another shape or dtype, a tensor
    where a scalar was (or the reverse), a key more or less, a list longer or shorter."""
    here = draw(st.integers(0, 5)) == 0 or depth > 3
    if isinstance(obj, torch.Tensor):
        if not here:
            return obj
        kind = draw(st.sampled_from(["shape", "dtype", "scalar"]))
        if kind == "shape":
            return torch.zeros(obj.numel() + 1)
        if kind == "dtype":
            return torch.zeros(obj.shape, dtype=torch.float16 if obj.dtype != torch.float16 else torch.float32)
        return draw(SCALARS)
    if isinstance(obj, dict):
        out = {k: mutate(v, draw, depth + 1) for k, v in obj.items()}
        if here and draw(st.booleans()):
            if out and draw(st.booleans()):
                out.pop(draw(st.sampled_from(sorted(out, key=repr))))
            else:
                out[draw(st.sampled_from(["new", 7]))] = draw(st.sampled_from([1.5, torch.ones(2)]))
        return out
    if isinstance(obj, (list, tuple)):
        items = [mutate(v, draw, depth + 1) for v in obj]
        if here and draw(st.booleans()):
            items = items[:-1] if items and draw(st.booleans()) else [*items, torch.ones(1)]
        return items if isinstance(obj, list) else tuple(items)
    if here and draw(st.booleans()):
        return torch.ones(3)
    return obj


def same(a: Any, b: Any) -> bool:
    """Two captured trees hold the same structure, scalars (nan equal to nan, -0.0 apart from 0.0) and tensor
    bytes."""
    fa, fb = flatten({"x": a}), flatten({"x": b})
    if fa.tree != fb.tree and repr(fa.tree) != repr(fb.tree):  # repr: nan != nan in ==
        return False
    return fa.tensors.keys() == fb.tensors.keys() and all(
        fa.tensors[k].dtype == fb.tensors[k].dtype
        and torch.equal(fa.tensors[k].reshape(-1).view(torch.uint8), fb.tensors[k].reshape(-1).view(torch.uint8))
        for k in fa.tensors
        if fa.tensors[k].numel()
    )


def _restore(root: Path, live: Any, *, plain: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        if not plain:
            m.setattr(restore_mod, "_plain_fit", lambda *a: None)
        try:
            Checkpointer(root).restore({"h": live})
        except StateMismatchError as e:
            return ("mismatch", sorted(e.differences))
    return ("ok", live.tree)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_the_plain_fit_restores_exactly_what_the_slow_comparison_does(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, data: Any
) -> None:
    tree = Tree(data.draw)
    saved = {"a": tree.node(0), "b": {"c": tree.node(0)}}
    root = tmp_path_factory.mktemp("fit")
    Checkpointer(root).save({"h": Holder(saved)}, 1)
    live_tree = copy.deepcopy(mutate(rescalar(saved, data.draw), data.draw))  # its own tensors (aliases kept)
    for t in flatten({"x": live_tree}).tensors.values():  # other numbers, so a restore has something to do
        with torch.no_grad():
            t.zero_()
    fast_live, slow_live = Holder(copy.deepcopy(live_tree)), Holder(copy.deepcopy(live_tree))

    reader = Checkpointer(root).reader
    opened = reader.open(1, rank=0)
    fit = restore_mod._plain_fit({"h": fast_live}, capture({"h": fast_live}), opened, 1)
    if fit is not None:  # deciding "fits" is a promise: the slow comparison finds no difference either
        _checker(root).check_fits({"h": fast_live}, reader.skeleton(opened), 1)
        live = flatten(capture({"h": fast_live})).tensors  # (detached: the same memory, another object)
        assert fit.targets.keys() <= live.keys()
        assert all(live[n].data_ptr() == t.data_ptr() and live[n].shape == t.shape for n, t in fit.targets.items())
        read = reader.read_tensors(opened, None)  # and the entries it built are those the slow way decodes
        assert structure(fit.complete(read, opened.numpy)) == structure(reader.rebuild(opened, read))

    fast = _restore(root, fast_live, plain=True, monkeypatch=monkeypatch)
    slow = _restore(root, slow_live, plain=False, monkeypatch=monkeypatch)
    assert fast[0] == slow[0]
    if fast[0] == "mismatch":
        assert fast[1] == slow[1]
    else:
        assert same(fast[1], slow[1])
        assert same(fast[1], saved)


def structure(x: Any) -> Any:
    """A tree's containers with their types (and a state dict's ``_metadata``), keys, scalars, and each tensor's
    dtype and shape."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, tuple(x.shape))
    if isinstance(x, dict):
        return (type(x).__name__, getattr(x, "_metadata", None), [(k, structure(v)) for k, v in x.items()])
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [structure(v) for v in x])
    return (type(x).__name__, repr(x))


def _checker(root: Path) -> Any:
    """A Restorer to call check_fits on."""
    ck = Checkpointer(root)
    return restore_mod.Restorer(
        ck.reader,
        ck.markers,
        coordinator=None,
        events=ck.events,
        probe=None,
        probe_rtol=0.0,
        monotonic=ck._monotonic,
        now=ck._now,
    )


def model_state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return {"model": model, "optimizer": opt, "scheduler": sched, "extras": {"seen": 3, "t": torch.ones(2)}}


def test_a_model_and_optimizer_take_the_plain_fit_and_are_read_in_place(tmp_path: Path) -> None:
    state = model_state(0)
    Checkpointer(tmp_path).save(state, 2)
    other = model_state(1)
    live = flatten(capture(other)).tensors
    opened = Checkpointer(tmp_path).reader.open(2, rank=0)
    fit = restore_mod._plain_fit(other, capture(other), opened, 1)
    assert fit is not None
    read = Checkpointer(tmp_path).reader.read_tensors(opened, None)
    built = fit.complete(read)
    assert structure(built) == structure(Checkpointer(tmp_path).reader.rebuild(opened, read))
    assert type(built["model"]).__name__ == "OrderedDict" and built["model"]._metadata  # module versions kept
    weights = [n for n in fit.targets if n.startswith(("model/", "optimizer/state/"))]
    assert len(weights) == len([n for n in live if n.startswith(("model/", "optimizer/state/"))])
    ptrs = {n: live[n].data_ptr() for n in weights}
    assert Checkpointer(tmp_path).restore(other) == 2
    after = flatten(capture(other)).tensors
    assert {n: after[n].data_ptr() for n in weights} == ptrs, "read into new memory instead of the live tensors"
    assert same(capture(state), capture(other))
    assert other["optimizer"].param_groups[0]["lr"] == state["optimizer"].param_groups[0]["lr"]


def test_a_fresh_optimizer_without_state_fits_and_gets_the_stored_moments(tmp_path: Path) -> None:
    state = model_state(0)
    Checkpointer(tmp_path).save(state, 2)
    torch.manual_seed(1)
    fresh = model_state(1)
    fresh["optimizer"] = torch.optim.AdamW(fresh["model"].parameters(), lr=1e-3)  # no step yet: empty state
    fresh["scheduler"] = torch.optim.lr_scheduler.StepLR(fresh["optimizer"], step_size=1, gamma=0.5)
    opened = Checkpointer(tmp_path).reader.open(2, rank=0)
    assert restore_mod._plain_fit(fresh, capture(fresh), opened, 1) is not None
    assert Checkpointer(tmp_path).restore(fresh) == 2
    assert same(capture(state), capture(fresh))


@pytest.mark.parametrize(
    ("live", "why"),
    [
        ({"w": torch.zeros(3)}, "tensor of the stored shape"),
        ({"w": torch.zeros(2, dtype=torch.float64)}, "another dtype"),
        ({"w": torch.zeros(2), "extra": torch.zeros(1)}, "a key more"),
        ({}, "empty: filled lazily, accepted"),
        ({"w": 3}, "a scalar where a tensor is stored"),
    ],
)
def test_plain_fit_decides_only_plain_fits(live: dict[str, Any], why: str) -> None:
    stored = {"e": {"w": {"$tensor": "e/w"}}}
    entries = {"e/w": tensor_format.Entry("e/w", torch.float32, (2,), 0, 8)}
    got = plain_fit({"e": live}, stored, entries, {})
    if why.startswith("empty"):
        assert got is not None and got.targets == {}
        made = torch.ones(2)  # the read makes what nothing live waits for; the built entry holds it
        assert got.complete({"e/w": made}) == {"e": {"w": made}}
    else:
        assert got is None, why
    assert plain_fit({"e": {"w": torch.zeros(2)}}, stored, entries, {}) is not None
    assert plain_fit({"e": {"w": torch.zeros(2)}}, stored, entries, {"e/w": torch.float64}) is None


@pytest.mark.parametrize(
    ("live", "stored", "built"),
    [
        ([1, 2.5, "x", None], [7, 0.5, "y", True], [7, 0.5, "y", True]),  # scalars over scalars: the stored ones
        ([1, 2], [1, {"$tensor": "e/w"}], None),  # a tensor stored where a scalar is live: no plain fit
        ([1, 2], [1, {"$bytes": "AA=="}], [1, b"\x00"]),  # another kind of value: restored as stored, as any scalar
        ([1, 2], [1, [2, {"$float": "inf"}]], [1, [2, math.inf]]),  # a list, decoded
        ([1, 2], [1, 2, 3], None),
        ((1, 2), {"$tuple": [1, 2]}, (1, 2)),
        ((1, 2), [1, 2], None),
        ((1, (2, 3)), {"$tuple": [1, {"$tuple": [2, {"$float": "nan"}]}]}, (1, (2, math.nan))),
    ],
)
def test_plain_fit_on_lists_of_scalars(live: Any, stored: Any, built: Any) -> None:
    """An optimizer's parameter ids: lists of scalars are judged (and copied) in one C-level pass, which must still
    see a tensor stored in them, and hand back what is stored, as `unflatten` decodes it."""
    entries = {"e/w": tensor_format.Entry("e/w", torch.float32, (2,), 0, 8)}
    got = plain_fit({"e": {"ids": live}}, {"e": {"ids": stored}}, entries, {})
    if built is None:
        assert got is None
    else:
        assert got is not None
        assert structure(got.complete({})["e"]["ids"]) == structure(built)


def test_a_raw_copy_refuses_a_target_of_another_size(tmp_path: Path) -> None:
    p = tmp_path / "f.safetensors"
    tensors = {f"t{i}": torch.full((4,), float(i)) for i in range(20)}
    with open(p, "wb") as f:
        tensor_format.write(f, list(tensors.items()))
    wrong = torch.zeros(3)
    with open(p, "rb") as f, pytest.raises(ValueError, match="a target of 12 bytes for tensor 't5' of 16"):
        tensor_format.read(
            f, p.stat().st_size, where=str(p), into=lambda run: [wrong if e.name == "t5" else None for e in run]
        )
    assert math.isclose(float(wrong.sum()), 0.0)


def test_the_optimizer_is_given_param_ids_it_finds_in_constant_time(tmp_path: Path) -> None:
    """torch's Optimizer.load_state_dict looks each state tensor's id up in its group's ``params``: a restore hands
    it a `ParamIds`, whose lookups are set lookups, and the optimizer ends exactly as torch's own load leaves it."""
    state = model_state(0)
    Checkpointer(tmp_path).save(state, 2)
    seen: list[type] = []
    ours, theirs = model_state(1), model_state(1)
    ours["optimizer"].register_load_state_dict_pre_hook(
        lambda opt, sd: seen.extend(type(g["params"]) for g in sd["param_groups"])
    )
    Checkpointer(tmp_path).restore(ours)
    assert seen == [ParamIds]
    assert all(type(g["params"]) is list for g in ours["optimizer"].param_groups), "the optimizer kept a ParamIds"
    theirs["model"].load_state_dict(state["model"].state_dict())
    theirs["optimizer"].load_state_dict(copy.deepcopy(state["optimizer"].state_dict()))
    assert same(ours["optimizer"].state_dict(), theirs["optimizer"].state_dict())

    ids = ParamIds([3, 1, 2])
    assert 1 in ids and 4 not in ids and True in ids and [1] not in ids
    assert ids == [3, 1, 2] and copy.deepcopy(ids) == [3, 1, 2]
    odd = ParamIds([[1], 2])  # unhashable ids: the list's own search
    assert [1] in odd and 2 in odd and 3 not in odd
    for original in (ids, odd):  # the optimizer deep-copies them: a copy of the same kind, sharing nothing mutable
        twin = copy.deepcopy(original)
        assert type(twin) is ParamIds and twin == original and twin is not original
    assert copy.deepcopy(odd)[0] is not odd[0]


def test_a_read_refuses_entries_out_of_offset_order(tmp_path: Path) -> None:
    """Entries handed to a read must be as `read_header` returns them: the bytes are read in order, so entries in
    another order would put them in the wrong tensors; the read refuses instead."""
    p = tmp_path / "f.safetensors"
    with open(p, "wb") as f:
        tensor_format.write(f, [("a", torch.ones(4)), ("b", torch.zeros(4))])
    with open(p, "rb") as f:
        entries = tensor_format.read_header(f, p.stat().st_size, where=str(p))
    with open(p, "rb") as f, pytest.raises(ValueError, match="entries out of offset order"):
        tensor_format.read(f, p.stat().st_size, where=str(p), entries=entries[::-1])
    with open(p, "rb") as f:
        got = tensor_format.read(f, p.stat().st_size, where=str(p), entries=entries)
    assert torch.equal(got["a"], torch.ones(4)) and torch.equal(got["b"], torch.zeros(4))


def test_a_stored_entry_that_is_no_mapping_is_refused_even_where_the_live_one_is_empty(tmp_path: Path) -> None:
    """An empty live state dict accepts whatever the checkpoint holds under it, but an entry is always a mapping:
    state.json made to hold a list there (checksums resealed, as tampering would) is corrupt, not restored."""
    from preemptible.errors import CheckpointCorruptError
    from preemptible.store import checksum
    from preemptible.store.layout import SELF_CHECKSUM, seal

    Checkpointer(tmp_path).save({"h": Holder({"a": 1})}, 1)
    d = tmp_path / "step-000000000001"
    state = json.loads((d / "state.json").read_text())
    state["tree"]["h"] = [1, 2]
    raw = json.dumps(state).encode()
    (d / "state.json").write_bytes(raw)
    commit = json.loads((d / "COMMIT.json").read_text())
    commit["files"]["state.json"].update(bytes=len(raw), checksum=checksum.of_bytes(raw))
    commit.pop(SELF_CHECKSUM, None)
    (d / "COMMIT.json").write_text(json.dumps(seal(commit)))
    live = Holder({})
    with pytest.raises(CheckpointCorruptError, match="always gives a mapping"):
        Checkpointer(tmp_path).restore({"h": live}, step=1)
    assert live.tree == {}


def test_live_tensors_not_read_in_place_get_the_ones_the_read_makes(tmp_path: Path) -> None:
    """A live tensor that is not contiguous fits, but is loaded by its load_state_dict() from a tensor the read
    makes: the built entries hold that one, inside a tuple too."""
    saved = {"w": torch.arange(6.0).reshape(3, 2), "pair": (torch.ones(2), 2.5), "ids": [1, 2]}
    Checkpointer(tmp_path).save({"h": Holder(saved)}, 1)
    live = Holder({"w": torch.zeros(2, 3).t(), "pair": (torch.zeros(2).expand(2), 0.0), "ids": [0, 0]})
    opened = Checkpointer(tmp_path).reader.open(1, rank=0)
    fit = restore_mod._plain_fit({"h": live}, capture({"h": live}), opened, 1)
    assert fit is not None and "h/w" not in fit.targets
    assert Checkpointer(tmp_path).restore({"h": live}) == 1
    assert torch.equal(live.tree["w"], saved["w"]) and live.tree["ids"] == [1, 2]
    assert type(live.tree["pair"]) is tuple and live.tree["pair"][1] == 2.5
    assert torch.equal(live.tree["pair"][0], torch.ones(2))


class Tied(torch.nn.Module):
    """Two layers and an embedding whose weight is the head's (tied: two keys, one tensor)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(5, 4)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        self.head = torch.nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


class OwnLoad(torch.nn.Linear):
    """Loads its own way: what it is given counts."""

    seen = 0

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        OwnLoad.seen += 1
        super()._load_from_state_dict(state_dict, prefix, *args)


def _counting_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the modules whose load_state_dict runs from here on."""
    calls: list[str] = []
    original = torch.nn.Module.load_state_dict

    def load(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", load)
    return calls


def test_a_module_the_read_filled_in_place_is_not_loaded_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its load_state_dict would only copy each tensor onto itself (tied weights too); the optimizer is loaded."""
    saved = Tied(0)
    opt = torch.optim.AdamW(saved.parameters())
    saved(torch.tensor([1, 2])).sum().backward()
    opt.step()
    Checkpointer(tmp_path).save({"model": saved, "optimizer": opt}, 1)
    live = Tied(1)
    live_opt = torch.optim.AdamW(live.parameters(), lr=0.5)
    calls = _counting_loads(monkeypatch)
    assert Checkpointer(tmp_path).restore({"model": live, "optimizer": live_opt}) == 1
    assert calls == []
    assert same(capture({"m": saved, "o": opt}), capture({"m": live, "o": live_opt}))
    assert live.head.weight is live.embed.weight
    assert live_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] and len(live_opt.state) == 5


@pytest.mark.parametrize("how", ["pre hook", "post hook", "own loading", "not contiguous", "swapped params"])
def test_a_module_that_loads_otherwise_is_loaded_by_its_own_load_state_dict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Anything beyond a copy onto itself (hooks, an override, a tensor the read could not fill in place, torch's
    parameter swapping): load_state_dict runs, and the values are the checkpoint's."""

    def model(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        m = torch.nn.Sequential(OwnLoad(3, 2) if how == "own loading" else torch.nn.Linear(3, 2))
        if how == "not contiguous":
            m[0].weight = torch.nn.Parameter(torch.randn(3, 2).t())
        return m

    saved = model(0)
    Checkpointer(tmp_path).save({"model": saved}, 1)
    live = model(1)
    seen: list[str] = []
    if how == "pre hook":
        live[0].register_load_state_dict_pre_hook(lambda *a: seen.append("pre"))
    if how == "post hook":
        live[0].register_load_state_dict_post_hook(lambda *a: seen.append("post"))
    if how == "swapped params":
        monkeypatch.setattr(torch.__future__, "get_swap_module_params_on_conversion", lambda: True)
    OwnLoad.seen = 0
    calls = _counting_loads(monkeypatch)
    assert Checkpointer(tmp_path).restore({"model": live}) == 1
    assert calls == ["Sequential"]
    assert same(capture({"m": saved}), capture({"m": live}))
    assert seen == {"pre hook": ["pre"], "post hook": ["post"]}.get(how, [])
    assert OwnLoad.seen == (1 if how == "own loading" else 0)
