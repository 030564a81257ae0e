from __future__ import annotations

import json
import math
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_model, train_some
from preemptible.errors import CheckpointCorruptError, UnsupportedStateError
from preemptible.store import tagged_json


def roundtrip(obj: Any) -> Any:
    tensors: dict[str, Any] = {}

    def sink(value: Any, path: str, is_numpy: bool) -> str:
        tensors[path] = value
        return path

    doc = json.loads(json.dumps(tagged_json.encode(obj, sink), allow_nan=False))
    return tagged_json.decode(doc, lambda name, is_numpy: tensors[name])


def same(a: Any, b: Any) -> bool:
    """Exact structural equality, types included (1 != 1.0, (1,) != [1]), nan == nan."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return (
            list(a.keys()) == list(b.keys())
            and all(type(ka) is type(kb) for ka, kb in zip(a, b, strict=True))
            and all(same(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return a is b
    return bool(a == b)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -7,
        2**70,
        1.5,
        -0.0,
        1.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        "",
        "$not a tag",
        (1, 2.0, "x"),
        (),
        [(), [], {}],
        {1: "int key", "1": "str key", (2, 3): "tuple key", None: 0, False: 1, 2.5: 2},
        {"$dollar": 1, "plain": 2},
        {"betas": (0.9, 0.999), "eps": 1e-8, "maximize": False, "foreach": None},
        b"\x00\xffbytes",
        torch.float32,
        torch.bfloat16,
    ],
)
def test_leaf_roundtrips_exactly(value: Any) -> None:
    assert same(roundtrip(value), value)


def test_optimizer_state_dict_roundtrips_exactly() -> None:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.95))
    train_some(model, opt, 3)
    sd = opt.state_dict()
    back = roundtrip(sd)
    assert same(back["param_groups"], sd["param_groups"])
    assert list(back["state"].keys()) == list(sd["state"].keys())
    assert all(type(k) is int for k in back["state"])
    for k in sd["state"]:
        for name, v in sd["state"][k].items():
            assert back["state"][k][name] is v


def test_module_metadata_survives() -> None:
    sd = torch.nn.BatchNorm1d(3).state_dict()
    back = roundtrip(sd)
    assert isinstance(back, OrderedDict)
    assert back._metadata == sd._metadata  # type: ignore[attr-defined]
    assert list(back) == list(sd)


def test_numpy_values() -> None:
    arr = np.arange(6, dtype=np.uint32).reshape(2, 3)
    back = roundtrip({"a": arr, "s": np.float32(1.25), "i": np.int64(-3)})
    assert back["a"] is arr
    assert type(back["s"]) is np.float32
    assert back["s"] == np.float32(1.25)
    assert type(back["i"]) is np.int64
    assert back["i"] == -3


class Custom:
    pass


@pytest.mark.parametrize(
    ("state", "path"),
    [
        ({"optimizer": {"param_groups": [{"hook": Custom()}]}}, "optimizer/param_groups/0/hook"),
        ({"a": {3: {"f": lambda: 0}}}, "a/3/f"),
        ({"x": {1, 2}}, "x"),
        ({"t": [0, object()]}, "t/1"),
    ],
)
def test_unsupported_leaf_names_its_key_path(state: Any, path: str) -> None:
    with pytest.raises(UnsupportedStateError) as info:
        tagged_json.encode(state, lambda v, p, n: p)
    assert info.value.key == path
    assert repr(path) in str(info.value)
    assert "expected" in str(info.value)


@pytest.mark.parametrize(
    "doc",
    [
        {"$float": "big"},
        {"$tuple": 3},
        {"$dict": [[1]]},
        {"$unknown": 1},
        {"$bytes": "not base64!"},
        {"$dtype": "not_a_dtype"},
        {"$dtype": "nn"},
        {"$dict": [[[1, 2], 3]]},
    ],
)
def test_malformed_tags_are_corruption_not_crashes(doc: Any) -> None:
    with pytest.raises(CheckpointCorruptError):
        tagged_json.decode({"k": doc}, lambda n, i: None)


TAGS = ["$tensor", "$ndarray", "$float", "$tuple", "$dict", "$meta", "$bytes", "$dtype", "$npscalar", "value", "$x"]
JSON_DOCS = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 5),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from(["t", "inf", "nan", "float32", "<f8", "aGk="]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", *TAGS]), inner, max_size=3),
        st.lists(st.lists(inner, min_size=1, max_size=3), max_size=3).map(lambda p: {"$dict": p}),
        st.tuples(st.lists(st.lists(inner, min_size=2, max_size=2), max_size=2), inner, st.booleans()).map(
            lambda x: {"$dict": x[0], "$meta": x[1]} if x[2] else {"$meta": x[1], "$dict": x[0]}
        ),
        st.lists(inner, max_size=3).map(lambda items: {"$tuple": items}),
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(JSON_DOCS)
def test_the_quick_decode_gives_what_the_path_keeping_decode_gives(doc: Any) -> None:
    """A restore decodes without key paths first; any document, well formed or not, must come out exactly as the
    decode that keeps them (or fail the same way, with the path named)."""

    def source(name: str, is_numpy: bool) -> Any:
        if name == "t":
            return ("tensor", is_numpy)
        raise CheckpointCorruptError(f"no tensor {name!r}", path=name)

    def run(f: Any) -> Any:
        try:
            return ("ok", f())
        except CheckpointCorruptError as e:
            return ("corrupt", str(e))

    quick = run(lambda: tagged_json.decode(doc, source))
    slow = run(lambda: tagged_json._decode(doc, source, "", 0))
    assert quick[0] == slow[0]
    if quick[0] == "ok":
        assert same(quick[1], slow[1])
        assert metadata(quick[1]) == metadata(slow[1])
    else:
        assert quick[1] == slow[1]


def metadata(x: Any) -> list[str]:
    """Every ``_metadata`` in a decoded tree, in order."""
    out = [repr(getattr(x, "_metadata", None))]
    if isinstance(x, dict):
        for v in x.values():
            out += metadata(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            out += metadata(v)
    return out
