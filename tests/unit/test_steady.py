"""The steady-state plan (`preemptible.checkpoint.steady`): a save that refills the last save's template writes
exactly the bytes the general path writes, save after save, whatever changed in between."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemptible import Checkpointer
from preemptible.checkpoint import steady
from preemptible.errors import UnsupportedStateError
from preemptible.state import capture
from preemptible.store import layout


def written(ck: Checkpointer, step: int) -> dict[str, bytes]:
    """Every file of a checkpoint but COMMIT.json (which records times)."""
    d = Path(ck.path_of(step))
    return {p.name: p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and p.name != layout.COMMIT}


def general_only(ck: Checkpointer) -> Checkpointer:
    ck.steady.plan = lambda *a, **k: None  # type: ignore[method-assign]
    return ck


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0]),
    st.text(max_size=6),
)


class Tree:
    """A random state: nested dicts (str and int keys), lists and tuples of scalars and tensors, some tensors
    aliased (the same memory twice), some requiring grad."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.pool: list[torch.Tensor] = []

    def tensor(self) -> torch.Tensor:
        if self.pool and self.draw(st.booleans()):
            return self.draw(st.sampled_from(self.pool))  # an alias
        n = self.draw(st.integers(0, 5))
        t = torch.randn(n, dtype=self.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64])))
        if t.is_floating_point() and self.draw(st.booleans()):
            t.requires_grad_(True)
        self.pool.append(t)
        return t

    def node(self, depth: int) -> Any:
        kind = self.draw(st.sampled_from(["scalar", "tensor", "dict", "list", "tuple"] if depth < 3 else ["scalar"]))
        if kind == "scalar":
            return self.draw(SCALARS)
        if kind == "tensor":
            return self.tensor()
        n = self.draw(st.integers(0, 3))
        if kind == "dict":
            keys = self.draw(
                st.lists(st.one_of(st.text(min_size=1, max_size=4), st.integers(0, 9)), max_size=n, unique=True)
            )
            return {k: self.node(depth + 1) for k in keys}
        items = [self.node(depth + 1) for _ in range(n)]
        return items if kind == "list" else tuple(items)


def rescalar(obj: Any, draw: Any) -> Any:
    """The same tree with every scalar leaf maybe changed (a learning rate moving, a counter, a sign of zero)."""
    if isinstance(obj, dict):
        return type(obj)((k, rescalar(v, draw)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(rescalar(v, draw) for v in obj)
    if isinstance(obj, torch.Tensor):
        return obj
    return draw(SCALARS) if draw(st.booleans()) else obj


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_every_save_writes_the_bytes_of_the_general_path(tmp_path_factory: pytest.TempPathFactory, data: Any) -> None:
    tree = Tree(data.draw)
    state: dict[str, Any] = {"a": {"x": tree.node(0), "y": tree.node(0)}, "b": {"z": tree.node(0)}}
    tmp = tmp_path_factory.mktemp("steady")
    fast, slow = Checkpointer(tmp / "fast", keep=10), general_only(Checkpointer(tmp / "slow", keep=10))
    guarded = data.draw(st.booleans())  # the tensors' attributes checked by torch's guards, or read in Python
    make_guards = steady._guards
    steady._guards = make_guards if guarded else (lambda tensors: None)  # type: ignore[assignment]
    try:
        for step in range(1, 4):
            for blocking in (True, False):
                s = step * 2 + blocking
                fast.save(state, s, blocking=blocking).wait()
                slow.save(state, s, blocking=blocking).wait()
                assert written(fast, s) == written(slow, s)
            for t in tree.pool:  # the numbers change in place between saves: the template stays
                change(t, tree.pool, data.draw)
            state = {k: rescalar(v, data.draw) for k, v in state.items()}
    finally:
        steady._guards = make_guards  # type: ignore[assignment]
    assert fast.steady.hits + fast.steady.misses == 6
    assert (fast.steady._template is None or fast.steady._template.guards is None) != guarded


OTHER_DTYPE = {torch.float32: torch.bfloat16, torch.bfloat16: torch.float16, torch.float64: torch.float32}


def change(t: torch.Tensor, pool: list[torch.Tensor], draw: Any) -> None:
    """Changes ``t`` between two saves: its numbers in place, and maybe its memory or (at the same memory) its
    dtype, shape, strides or requires_grad, alone or with its aliases (the same object at several places)."""
    if not t.dim() or t.stride(-1):  # not where several elements are one memory location (below)
        with torch.no_grad():
            t.add_(1)
    move = draw(
        st.sampled_from(
            ["stay", "stay", "new memory", "another's memory", "dtype", "shape", "strides", "requires_grad"]
        )
    )
    if move == "new memory":
        t.data = t.data.clone()
    elif move == "another's memory":
        other = draw(st.sampled_from(pool))
        if other.shape == t.shape and other.dtype == t.dtype:
            t.data = other.data
    elif move == "dtype":  # the same bytes seen as another float type (the shape may follow)
        dtype = OTHER_DTYPE.get(t.dtype)
        if dtype is not None and t.dim() > 0 and t.stride(-1) == 1:
            t.data = t.data.view(dtype)
    elif move == "shape":
        t.data = t.data.unsqueeze(0)
    elif move == "strides":  # every element read from the first: the same memory, shape and dtype
        t.data = t.data.as_strided(t.shape, (0,) * t.dim())
    elif move == "requires_grad" and t.is_floating_point():
        t.requires_grad_(not t.requires_grad)


def model_state(hidden: int = 8) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return {
        "model": model,
        "optimizer": opt,
        "scheduler": sched,
        "extras": {"seen": 0, "a": torch.ones(3), "b": torch.ones(3)},
    }


def train(state: dict[str, Any], steps: int) -> None:
    model, opt = state["model"], state["optimizer"]
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(3, 4)).pow(2).sum().backward()
        opt.step()
        state["scheduler"].step()
        state["extras"]["seen"] += 3


def test_a_training_run_reuses_its_plan_and_restores_bit_exact(tmp_path: Path) -> None:
    state = model_state()
    train(state, 1)  # AdamW's state exists from the first step on
    fast, slow = Checkpointer(tmp_path / "fast", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    for step in range(2, 6):
        train(state, 1)  # the learning rate halves, the counter moves: leaves change, the shape does not
        fast.save(state, step, blocking=step % 2 == 0).wait()
        slow.save(state, step).wait()
        assert written(fast, step) == written(slow, step)
    assert (fast.steady.misses, fast.steady.hits) == (1, 3)
    other = model_state()
    assert fast.restore(other) == 5
    for a, b in zip(state["model"].parameters(), other["model"].parameters(), strict=True):
        assert torch.equal(a, b)
    assert other["optimizer"].param_groups[0]["lr"] == state["optimizer"].param_groups[0]["lr"]
    assert other["extras"]["seen"] == state["extras"]["seen"]


def test_new_memory_a_new_key_or_a_new_dtype_makes_a_new_template(tmp_path: Path) -> None:
    state = model_state()
    train(state, 1)
    ck = Checkpointer(tmp_path / "ck", keep=10)
    slow = general_only(Checkpointer(tmp_path / "slow", keep=10))
    changes = [
        lambda: None,  # the first save: a template is made
        lambda: None,  # nothing changed: it is refilled
        lambda: setattr(state["model"][0], "weight", torch.nn.Parameter(torch.zeros(8, 4))),  # new memory: alone
        lambda: state["extras"].update(b=state["extras"]["a"]),  # the same memory as another now
        lambda: state["extras"].update(more=1),  # a new key
        lambda: state["model"].to(torch.float64),  # new dtypes (and memory)
        lambda: state["extras"].update(more=2.5),  # a leaf's type changes
        lambda: state["extras"].update(b=torch.zeros(3)),  # alone again
    ]
    misses = []
    for step, change in enumerate(changes, start=1):
        change()
        ck.save(state, step).wait()
        slow.save(state, step).wait()
        assert written(ck, step) == written(slow, step)
        misses.append(ck.steady.misses)
    assert misses == [1, 1, 1, 2, 3, 4, 5, 6]


SAME_MEMORY = {
    "dtype": lambda t: t.view(torch.int32),
    "shape": lambda t: t.view(2, -1),
    "dimensions": lambda t: t.unsqueeze(0),
    "strides": lambda t: t.as_strided(t.shape, (0,)),
    "requires_grad": lambda t: t.detach().requires_grad_(True),
    "device": lambda t: torch.empty(t.shape, device="meta"),
}


@pytest.mark.parametrize("guarded", [True, False], ids=["guards", "python"])
@pytest.mark.parametrize("what", sorted(SAME_MEMORY))
def test_a_tensor_changed_at_the_same_memory_makes_a_new_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, guarded: bool
) -> None:
    """Each attribute a template depends on, changed alone (the memory kept where it can be), is seen: by torch's
    tensor guards, or read in Python where there are none."""
    if guarded:
        assert steady._tensor_guards() is not None  # the pinned torch has them: used, never skipped
    else:
        monkeypatch.setattr(steady, "_guards", lambda tensors: None)
    t = torch.arange(6, dtype=torch.float32)
    state: dict[str, Any] = {"extras": {"t": t, "u": torch.ones(2)}}
    ck, slow = Checkpointer(tmp_path / "ck", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    for step in (1, 2):
        ck.save(state, step).wait()
    assert (ck.steady._template is not None and ck.steady._template.guards is not None) == guarded
    assert (ck.steady.misses, ck.steady.hits) == (1, 1)
    state["extras"]["t"] = SAME_MEMORY[what](t)
    if what == "device":  # no bytes to write: refused, as the general path refuses it
        with pytest.raises(UnsupportedStateError) as fast_error:
            ck.save(state, 3).wait()
        with pytest.raises(UnsupportedStateError) as slow_error:
            slow.save(state, 3).wait()
        assert str(fast_error.value) == str(slow_error.value)
        assert ck.steady._template is None
    else:
        ck.save(state, 3).wait()
        slow.save(state, 3).wait()
        assert written(ck, 3) == written(slow, 3)
        assert (ck.steady.misses, ck.steady.hits) == (2, 1)


@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "background"])
def test_a_tensor_that_became_sparse_gets_the_general_paths_error(tmp_path: Path, blocking: bool, arena: bool) -> None:
    """A blocking refill is written while it is checked: a tensor without bytes of its own must fail the save with
    the message that says what to do, not torch's own error from sizing the file. ``arena``: the first save a
    background one, which lays out the staging arena that blocking saves of many small tensors go through."""
    state: dict[str, Any] = {"x": {f"t{i}": torch.ones(3) for i in range(300)}}
    ck = Checkpointer(tmp_path / "ck", keep=10)
    ck.save(state, 1, blocking=not arena).wait()
    ck.save(state, 2)
    state["x"]["t0"] = torch.ones(3).to_sparse()
    with pytest.raises(UnsupportedStateError, match=r"'x/t0' has layout torch\.sparse_coo.*to_dense"):
        ck.save(state, 3, blocking=blocking).wait()
    assert ck.steady._template is None
    assert ck.latest() == 2


def test_what_a_guard_sees_but_names_do_not_depend_on_is_read_again_and_refilled(tmp_path: Path) -> None:
    """The guards also check a tensor's Python type, and fail an object seen twice: a Parameter where a tensor was,
    or the same tensor at two places, still refills the template (its attributes read in Python). A place that held
    a repeated object is checked too when another object comes there."""
    a, b = torch.arange(4.0), torch.ones(3)
    state: dict[str, Any] = {"extras": {"a": a, "b": b, "again": b}}
    ck, slow = Checkpointer(tmp_path / "ck", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    changes = [
        lambda: None,
        lambda: None,
        lambda: state["extras"].update(a=torch.nn.Parameter(a, requires_grad=False)),  # the same memory
        lambda: state["extras"].update(again=b.view(3)),  # another object, alike
        lambda: state["extras"].update(again=b),
        lambda: state["extras"].update(again=b.view(1, 3)),  # another object, another shape: a new template
    ]
    for step, change in enumerate(changes, start=1):
        change()
        ck.save(state, step).wait()
        slow.save(state, step).wait()
        assert written(ck, step) == written(slow, step)
        template = ck.steady._template
        assert template is not None and template.guards is not None
        assert template.repeats == ([] if step in (4, 6) else [(2, 1)])  # guarded anew after each read
    assert (ck.steady.misses, ck.steady.hits) == (2, 4)


def test_tensors_that_moved_once_are_refilled_and_their_memory_becomes_the_templates(tmp_path: Path) -> None:
    state = model_state()
    train(state, 1)
    ck, slow = Checkpointer(tmp_path / "ck", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    opt = state["optimizer"]

    def ptrs() -> list[int]:
        scanned = steady.scan(capture(state))
        assert scanned is not None
        return scanned.tensor_meta().ptrs

    def save(step: int) -> None:
        ck.save(state, step, blocking=step % 2 == 0).wait()
        slow.save(state, step).wait()
        assert written(ck, step) == written(slow, step)

    save(1)
    loaded = opt.state_dict()  # as after a restore: torch's load_state_dict keeps the tensors it is given
    opt.load_state_dict(
        {**loaded, "state": {k: {n: v.clone() for n, v in s.items()} for k, s in loaded["state"].items()}}
    )
    moved = ptrs()
    save(2)
    assert (ck.steady.misses, ck.steady.hits) == (1, 1)
    assert ck.steady._template is not None and ck.steady._template.meta.ptrs == moved  # the next save: one compare
    exp_avg = [s["exp_avg"] for s in opt.state.values()]
    exp_avg[0].data = exp_avg[1].data  # moved again, now sharing another's memory: other names, a new template
    save(3)
    assert (ck.steady.misses, ck.steady.hits) == (2, 1)
    exp_avg[0].data = exp_avg[1].data.clone()  # alone again, at an address no other tensor starts at
    save(4)
    assert (ck.steady.misses, ck.steady.hits) == (3, 1)  # the last template had it shared
    exp_avg[0].data = exp_avg[0].data.clone()
    save(5)
    assert (ck.steady.misses, ck.steady.hits) == (3, 2)


def test_a_background_saves_early_copy_is_redone_when_the_state_no_longer_fits_and_a_failure_frees_it(
    tmp_path: Path,
) -> None:
    """A background save starts copying into the staging arena before its tensors are checked
    (`Staging.begin`). A tensor that grew since the last save makes that copy fail, and its bytes are staged
    anew; a tensor the save cannot store fails the save with the general path's message, and frees the arena."""
    import threading

    from preemptible.errors import UnsupportedStateError
    from preemptible.writer import SPLIT_COPY_MIN

    state = model_state()
    # the early copy is for states of many small tensors (for a few large ones the caller's thread copies faster)
    state["extras"]["many"] = [torch.full((2,), float(i)) for i in range(SPLIT_COPY_MIN)]
    train(state, 1)
    ck, slow = Checkpointer(tmp_path / "ck", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    began: list[bool] = []
    begin = ck.staging.begin
    ck.staging.begin = lambda token, srcs: began.append(begin(token, srcs)) or began[-1]  # type: ignore[method-assign]

    def save(step: int) -> None:
        ck.save(state, step, blocking=False).wait()
        slow.save(state, step).wait()
        assert written(ck, step) == written(slow, step)
        assert not ck.staging.early and not ck.staging.busy.locked()

    save(1)
    save(2)
    state["extras"]["a"].data = torch.arange(300.0)  # grown: the early copy into the old 3 floats fails
    save(3)
    assert began == [True, True] and (ck.steady.misses, ck.steady.hits) == (2, 1)
    state["extras"]["a"] = torch.ones(300).to_sparse()
    with pytest.raises(UnsupportedStateError, match="sparse"):
        ck.save(state, 4, blocking=False)
    assert began == [True, True, True]
    assert not ck.staging.early and not ck.staging.busy.locked() and ck.staging.current is None
    assert not [th for th in threading.enumerate() if th.name.startswith("preemptible-")]
    state["extras"]["a"] = torch.ones(300)
    save(5)


def test_a_state_of_few_tensors_is_copied_on_the_callers_thread_not_early(tmp_path: Path) -> None:
    """The early copy pays for 10,000s of small tensors only; a few tensors copy faster on the caller's thread
    (torch's own threads, warm there), so the stall of a large state stays at a memcpy of its bytes."""
    state = model_state()
    train(state, 1)
    ck = Checkpointer(tmp_path / "ck", keep=10)
    began: list[bool] = []
    begin = ck.staging.begin
    ck.staging.begin = lambda token, srcs: began.append(begin(token, srcs)) or began[-1]  # type: ignore[method-assign]
    for step in (1, 2, 3):
        ck.save(state, step, blocking=False).wait()
    assert began == [False, False] and ck.steady.hits == 2
    assert [c.step for c in ck.checkpoints()] == [1, 2, 3]


def test_numpy_arrays_are_refilled_and_what_the_scan_does_not_know_takes_the_general_path(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    ck, slow = Checkpointer(tmp_path / "ck", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    for step in (1, 2, 3):  # a new array at every save, as np.random.get_state() gives
        state = {"extras": {"arr": np.arange(3) * step, "t": torch.ones(2)}}
        ck.save(state, step).wait()
        slow.save(state, step).wait()
        assert written(ck, step) == written(slow, step)
    assert (ck.steady.misses, ck.steady.hits) == (1, 2)
    for step, arr in ((4, np.arange(4)), (5, np.arange(4.0))):  # another shape, then another dtype: new templates
        state = {"extras": {"arr": arr, "t": torch.ones(2)}}
        ck.save(state, step).wait()
        slow.save(state, step).wait()
        assert written(ck, step) == written(slow, step)
    assert (ck.steady.misses, ck.steady.hits) == (3, 2)
    other = Checkpointer(tmp_path / "other", keep=10)
    for step in (1, 2):  # a strided array is copied when stored: not found as flatten saw it
        other.save({"extras": {"arr": np.arange(6)[::2], "t": torch.ones(2)}}, step).wait()
    assert (other.steady.misses, other.steady.hits) == (0, 0)
    assert steady.scan({"x": {"y": [np.float64(1.0)]}}) is None
    assert steady.scan({"x": OrderedDict(a=torch.ones(1), b=(1, 2.0, "s", None))}) is not None


def test_zero_and_minus_zero_are_written_apart(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=10)
    state: dict[str, Any] = {"e": {"v": 0.0, "t": torch.ones(1)}}
    ck.save(state, 1).wait()
    state["e"]["v"] = -0.0
    ck.save(state, 2).wait()
    assert ck.steady.hits == 1
    out: dict[str, Any] = {"e": {"v": None, "t": torch.zeros(1)}}
    assert ck.restore(out) == 2
    assert out["e"]["v"] == 0.0 and math.copysign(1.0, out["e"]["v"]) == -1.0


def test_keys_that_compare_equal_but_are_written_apart_make_a_new_template(tmp_path: Path) -> None:
    ck, slow = Checkpointer(tmp_path / "ck", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    t = torch.ones(2)
    for step, key in enumerate([1, True, 1.0, 1], start=1):
        state = {"e": {key: t, "lr": 0.5}}
        ck.save(state, step).wait()
        slow.save(state, step).wait()
        assert written(ck, step) == written(slow, step)
    assert (ck.steady.misses, ck.steady.hits) == (4, 0)


@pytest.mark.parametrize("save_every", [1000, None], ids=["periodic", "emergency-only"])
def test_a_run_prepares_the_plan_after_its_first_step_so_the_emergency_save_only_refills_it(
    tmp_path: Path, save_every: int | None
) -> None:
    """After its first step a run makes the plan of its saves; with background saves to come, it lays out their
    staging arena too (this model's tensors are all small), so that the emergency save before the first of them
    fills it as it writes; with none to come (emergency saves only), it takes no memory for one."""
    from conftest import make_model  # noqa: I001

    from preemptible import Run

    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = Run(tmp_path, model=model, optimizer=opt, save_every=save_every, exit_on_notice=False)
    for step in run.steps(10):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        if step == 0:
            continue
        if step == 1:  # the boundary after step 0 made the plan: nothing saved yet
            steady_plans = run.checkpointer.steady
            assert (steady_plans.misses, steady_plans.hits) == (1, 0)
            assert not list(tmp_path.glob("step-*"))
            boxes = steady_plans._template.prepared if steady_plans._template else []
            assert boxes and all(len(box) == 3 for box in boxes)  # headers made too
            staging = run.checkpointer.arena.laid_out
            assert (staging.allocations if staging is not None else 0) == (save_every is not None)
            run.guard.trigger(source="signal")
    assert (run.checkpointer.steady.misses, run.checkpointer.steady.hits) == (1, 1)  # the emergency save refilled it
    staged = run.checkpointer.arena.laid_out.current if run.checkpointer.arena.laid_out is not None else None
    assert (staged.step if staged is not None else None) == (2 if save_every is not None else None)
    lines = [
        json.loads(line) for f in sorted((tmp_path / "journal").glob("*.jsonl")) for line in f.read_text().splitlines()
    ]
    assert [(e["reason"], e["plan"]) for e in lines if e["event"] == "save_started"] == [("emergency", "refilled")]
    other = make_model(seed=1)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-3)
    assert Checkpointer(tmp_path).restore({"model": other, "optimizer": other_opt}) == 2
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("keep", [-1, 1], ids=["copy-refuses", "copy-broadcasts"])
def test_a_blocking_refill_is_checked_while_written_and_thrown_away_when_its_tensors_changed(
    tmp_path: Path, keep: int
) -> None:
    """An emergency save refills the template, copies its tensors into the arena (here: mostly small tensors) and
    checks them while the arena's bytes are written, or at once when the copy fails. A parameter made a view of its
    own start (the same object and memory, another shape) fails the check: what was written is thrown away, the
    state is planned again, and what commits is what the general path writes; no attempt is left behind, and the
    arena is not taken for a staged state. Cut short by one element, the copy refuses it; cut to one element, the
    copy broadcasts it without a word, and only the check catches it."""
    state = model_state()
    train(state, 1)
    ck, slow = Checkpointer(tmp_path / "ck", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    checks: list[bool] = []
    check = steady.SteadyPlans._check

    def spy(self: steady.SteadyPlans, t: Any, now: Any) -> bool:
        checks.append(check(self, t, now))
        return checks[-1]

    ck.steady._check = spy.__get__(ck.steady)  # type: ignore[method-assign]
    ck.save(state, 1, blocking=False).wait()
    slow.save(state, 1).wait()
    train(state, 1)
    assert "stage" in ck.save(state, 2).wait().timings  # small CPU tensors: copied into the arena, checked as written
    slow.save(state, 2).wait()
    assert written(ck, 2) == written(slow, 2) and checks == [True]
    bias = state["model"][0].bias
    ptr = bias.data_ptr()
    bias.data = bias.data[:keep]  # the same object at the same memory, of another shape
    assert bias.data_ptr() == ptr
    ck.save(state, 3).wait()
    slow.save(state, 3).wait()
    assert checks == [True, False]
    assert ck.staging.current is None
    assert written(ck, 3) == written(slow, 3)
    assert (ck.steady.misses, ck.steady.hits) == (2, 1)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [layout.step_dir(s) for s in (1, 2, 3)]


@pytest.mark.parametrize("small", [True, False])
def test_a_blocking_save_of_mostly_small_cpu_tensors_goes_through_the_arena_a_background_save_laid_out(
    tmp_path: Path, small: bool
) -> None:
    """After a background save (its arena is laid out for the state, and free), a blocking save of CPU tensors most
    of whose bytes are in small ones copies them into the arena, piece by piece as its writers reach them, and
    writes its aligned regions (the writers would otherwise gather them one memmove at a time); once written, the
    arena holds its step. One of mostly large tensors writes each from its own memory, with no copy. Either way it
    writes the bytes the general path writes."""
    g = torch.Generator().manual_seed(5)
    many = {f"p{i}": torch.randn(50, generator=g) for i in range(300)}  # 200 bytes each
    big = {"w": torch.randn(300_000, generator=g)}  # 1.2 MB: above the small-tensor line
    state = {"m": {**many, **(big if not small else {})}}
    ck, slow = Checkpointer(tmp_path / "ck", keep=10), general_only(Checkpointer(tmp_path / "slow", keep=10))
    ck.save(state, 1, blocking=False).wait()
    for t in many.values():
        t.add_(1)
    result = ck.save(state, 2).wait()
    slow.save(state, 2).wait()
    assert ("stage" in result.timings) is small
    assert written(ck, 2) == written(slow, 2)
    current = ck.staging.current
    assert current is not None and current.step == (2 if small else 1)
    fresh = {"m": {k: torch.zeros_like(v) for k, v in state["m"].items()}}
    assert Checkpointer(tmp_path / "ck").restore(fresh) == 2
    assert all(torch.equal(fresh["m"][k], v) for k, v in state["m"].items())


def test_a_failed_write_of_a_lazily_staged_save_leaves_no_staged_state_and_the_last_checkpoint(tmp_path: Path) -> None:
    """A blocking save of small tensors fills the arena as it writes (`Staging.stage_lazily`): when the storage
    fails halfway (an I/O error after 4 KB), the save fails with that error, nothing of its step is left, the arena
    is not taken for a staged state (half of it is of the step before), step 1 stays the newest checkpoint, and the
    next save goes through the arena again."""
    from faults import FaultyStorage
    from preemptible.errors import SaveError

    g = torch.Generator().manual_seed(7)
    state = {"m": {f"p{i}": torch.randn(500, generator=g) for i in range(400)}}  # 2 KB each: 800 KB in all
    storage = FaultyStorage(str(tmp_path / "ck"))
    ck = Checkpointer(tmp_path / "ck", keep=10, storage=storage)
    ck.save(state, 1, blocking=False).wait()
    assert ck.staging.current is not None and ck.staging.current.step == 1
    for t in state["m"].values():
        t.add_(1)
    storage.fail_after = storage.written + 4096
    with pytest.raises(SaveError) as info:
        ck.save(state, 2).wait()
    assert "injected I/O error" in str(info.value)
    assert ck.staging.current is None
    assert not ck.staging.busy.locked()
    assert ck.latest() == 1 and [p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("step")] == [
        layout.step_dir(1)
    ]
    storage.fail_after = None
    assert "stage" in ck.save(state, 3).wait().timings
    current = ck.staging.current
    assert current is not None and current.step == 3
    fresh = {"m": {k: torch.zeros_like(v) for k, v in state["m"].items()}}
    assert Checkpointer(tmp_path / "ck").restore(fresh) == 3
    assert all(torch.equal(fresh["m"][k], v) for k, v in state["m"].items())


def test_an_emergency_save_makes_no_template_but_refills_one_made_before(tmp_path: Path) -> None:
    """The run stops after an emergency save: a first save that is one plans by the general path (no template to
    make, nothing remembered), and writes what a periodic save would. After a periodic save, it refills that
    save's template."""
    from preemptible.events import SaveReason

    model = torch.nn.Linear(4, 3)
    state = {"model": model, "extras": {"lr": 0.5, "seen": [1, 2]}}
    cold = Checkpointer(tmp_path / "cold", keep=10)
    cold.save(state, 1, reason=SaveReason.EMERGENCY).wait()
    assert (cold.steady.misses, cold.steady.hits, cold.steady.last) == (0, 0, "general")
    assert not cold.steady.remembers
    periodic = Checkpointer(tmp_path / "periodic", keep=10)
    periodic.save(state, 1, reason=SaveReason.PERIODIC).wait()
    assert written(cold, 1) == written(periodic, 1)
    assert (periodic.steady.misses, periodic.steady.last) == (1, "made") and periodic.steady.remembers
    with torch.no_grad():
        model.weight.add_(1.0)
    periodic.save(state, 2, reason=SaveReason.EMERGENCY).wait()
    cold.save(state, 2, reason=SaveReason.EMERGENCY).wait()
    assert (periodic.steady.misses, periodic.steady.hits, periodic.steady.last) == (1, 1, "refilled")
    assert (cold.steady.misses, cold.steady.hits) == (0, 0)
    assert written(cold, 2) == written(periodic, 2)
