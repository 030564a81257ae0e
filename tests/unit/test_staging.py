"""Staging buffers: one reused arena per layout, laid out as the files, a snapshot of the moment it was taken."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptible.state import capture, flatten
from preemptible.writer import SavePlan, Staging, plan_files, state_json


def plan_of(state: dict[str, object]) -> SavePlan:
    flat = flatten(capture(state))
    specs = plan_files(flat, threads=2, max_file_bytes=1 << 20)
    return SavePlan(specs, {"state.json": state_json(flat)}, flat.tensor_bytes, flat.tensor_bytes)


def staged_tensors(staged: object) -> dict[str, torch.Tensor]:
    return {n: t for spec in staged.specs for n, t in spec.items}  # type: ignore[attr-defined]


def test_the_arena_is_reused_for_the_same_layout_and_is_a_snapshot() -> None:
    t = {"w": {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(10)}}
    ticks = iter([10.0, 10.5, 20.0, 20.25])
    staging = Staging(pin=False, clock=lambda: 1e9, monotonic=lambda: next(ticks))
    first = staging.stage(plan_of(t), step=1)
    assert (first.staged_at, first.seconds) == (1e9, 0.5)  # injected clocks
    t["w"]["a"].add_(1)  # training goes on: the staged copy must not move
    assert torch.equal(staged_tensors(first)["w/a"], torch.arange(1000, dtype=torch.float32))
    second = staging.stage(plan_of(t), step=2)
    assert staging.allocations == 1  # the same layout: no new allocation
    assert staging.current is second and second.step == 2
    assert torch.equal(staged_tensors(second)["w/a"], t["w"]["a"])
    assert staging.fits(second.specs)
    assert sum(len(b) for b in second.blobs.values()) >= second.nbytes


def test_a_new_layout_gets_a_new_arena() -> None:
    staging = Staging(pin=False)
    staging.stage(plan_of({"w": {"a": torch.zeros(10)}}), step=1)
    staging.stage(plan_of({"w": {"a": torch.zeros(100_000)}}), step=2)
    assert staging.allocations == 2
    assert staging.nbytes >= 400_000


def test_many_small_tensors_are_copied_in_runs_at_once_byte_for_byte() -> None:
    """10,000s of small tensors are copied one after the other on one of torch's threads: staging splits them into
    runs of about equal bytes copied at once, which together must cover every tensor exactly once."""
    from preemptible.writer import _copy_spans

    g = torch.Generator().manual_seed(0)
    t = {"w": {str(i): torch.randn(i % 7 + 1, generator=g) for i in range(600)}, "v": {"t": torch.randn(3, 5).t()}}
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        staging = Staging(pin=False)
        staged = staging.stage(plan_of(t), step=1)
        spans = list(staging._spans.values())
        # many small: two runs; one tensor holding most bytes, large ones (torch's own threads), few: one
        for sizes, runs in (([4] * 300, 2), ([4] * 299 + [4000], 1), ([1 << 21] * 300, 1), ([4] * 10, 1)):
            dsts = [torch.empty(n, dtype=torch.uint8) for n in sizes]
            cut = _copy_spans(dsts)
            assert [i for a, b in cut for i in range(a, b)] == list(range(len(sizes)))
            assert len(cut) == runs, sizes[-1]
    finally:
        torch.set_num_threads(old)
    assert any(len(s) == 2 for s in spans), "never split"
    got = staged_tensors(staged)
    for i in range(600):
        assert torch.equal(got[f"w/{i}"], t["w"][str(i)])
    assert torch.equal(got["v/t"], t["v"]["t"])


def test_an_early_copy_is_taken_by_the_stage_of_its_layout_and_redone_for_any_other() -> None:
    """`Staging.begin` copies a plan's tensors before the plan is checked. The stage of a plan of that layout takes
    the copy; the stage of any other waits for it and copies again, whatever the early copy did (wrong tensors,
    copies that failed); `drop_early` waits for it and frees the arena. Meanwhile nothing claims the arena holds a
    staged step."""
    import threading

    g = torch.Generator().manual_seed(1)
    t = {"w": {str(i): torch.randn(i % 5 + 1, generator=g) for i in range(400)}}
    token = object()

    def plan(tok: object = token) -> SavePlan:
        p = plan_of(t)
        p.layout_token = tok
        return p

    def sources() -> list[torch.Tensor]:
        return [x for spec in plan().specs for _, x in spec.items]

    staging = Staging(pin=False)
    assert not staging.begin(token, sources())  # no arena of this layout yet
    staging.stage(plan(), step=1)
    for step in (2, 3):
        for x in t["w"].values():
            x.add_(1)
        assert staging.begin(token, sources())
        assert staging.early and staging.current is None and staging.busy.locked()
        assert not staging.begin(token, sources())  # one at a time: busy is held
        staged = staging.stage(plan(), step=step)
        assert not staging.early and staging.current is staged
        staging.busy.release()
        got = staged_tensors(staged)
        assert all(torch.equal(got[f"w/{k}"], x) for k, x in t["w"].items())
    wrong = [torch.full((7, 3), 9.0) for _ in sources()]  # copies that fail: a plan not of this layout
    assert staging.begin(token, wrong)
    staged = staging.stage(plan(object()), step=4)  # another layout: the early copy is waited for, its errors dropped
    staging.busy.release()
    got = staged_tensors(staged)
    assert all(torch.equal(got[f"w/{k}"], x) for k, x in t["w"].items())
    assert staging.begin(staging._token, wrong)
    try:  # of its own layout, a failed copy is the stage's failure
        staging.stage(plan(staging._token), step=5)
        raise AssertionError("a failed early copy was taken as staged")
    except RuntimeError:
        pass
    staging.busy.release()
    assert staging.current is None
    assert staging.begin(staging._token, sources())
    staging.drop_early()
    assert not staging.early and not staging.busy.locked() and staging.current is None
    assert not [th for th in threading.enumerate() if th.name == "preemptible-stage"]
    staging.drop_early()  # nothing to drop: nothing happens
    assert not staging.busy.locked()


def test_an_early_copy_whose_thread_cannot_start_fails_the_save_with_that_error_and_frees_the_arena(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that cannot start (the process is out of threads: not something a test can cause for real, so
    `Thread.start` is made to fail) fails the background save with that error; the arena is free and the next save
    works."""
    import threading

    from preemptible import Checkpointer

    state = {"w": {str(i): torch.ones(3) * i for i in range(300)}}
    ck = Checkpointer(tmp_path, keep=10)
    ck.save(state, 1, blocking=False).wait()
    start = threading.Thread.start

    def failing(self: threading.Thread) -> None:
        if self.name == "preemptible-stage":
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", failing)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        ck.save(state, 2, blocking=False)
    monkeypatch.undo()
    assert not ck.staging.early and not ck.staging.busy.locked() and ck.staging.current is None
    ck.save(state, 3, blocking=False).wait()
    out = {"w": {str(i): torch.zeros(3) for i in range(300)}}
    assert ck.restore(out) == 3 and all(torch.equal(out["w"][str(i)], torch.ones(3) * i) for i in range(300))


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_large_arena_starts_on_a_huge_page_and_asks_the_kernel_for_huge_pages() -> None:
    from preemptible.writer import ARENA_ALIGN, HUGE_ARENA_BYTES, HUGE_PAGE

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()  # a Linux kernel built with THP
    staging = Staging(pin=False)
    staged = staging.stage(plan_of({"w": {"a": torch.arange(HUGE_ARENA_BYTES // 4, dtype=torch.float32)}}), step=1)
    arena = staging._arena
    assert arena is not None and arena.data_ptr() % HUGE_PAGE == 0
    assert ("hg" in _vm_flags(arena.data_ptr())) == thp  # MADV_HUGEPAGE on its mapping
    assert torch.equal(staged_tensors(staged)["w/a"], torch.arange(HUGE_ARENA_BYTES // 4, dtype=torch.float32))
    small = Staging(pin=False)
    small.stage(plan_of({"w": {"a": torch.zeros(1000)}}), step=1)
    assert small._arena is not None and small._arena.data_ptr() % ARENA_ALIGN == 0  # no advice: see below


_ADVICE_LEFT = """
import gc, json, torch
from preemptible.writer import HUGE_ARENA_BYTES, _aligned_empty

def flags(address):
    try:
        return _vm_flags(address)
    except AssertionError:  # no mapping holds it
        return None

small = _aligned_empty(3 * 4096, pin=False)
arena = _aligned_empty(HUGE_ARENA_BYTES, pin=False)
arena.fill_(1)
address = arena.data_ptr()
above = torch.ones(1 << 16)  # allocated after it: a heap could not shrink back past the arena
del arena
gc.collect()
print(json.dumps({"small": flags(small.data_ptr()), "freed": flags(address)}))
"""


def test_the_huge_page_advice_leaves_with_the_arena_and_never_reaches_a_small_one() -> None:
    """The advice sticks to addresses: given to memory from malloc's heap (where glibc puts even a large block
    once its mmap threshold has risen, as in a long test run), it would stay on the heap after the arena is freed.
    The arena is a mapping of its own, gone when freed. Here glibc is told to use its heap for everything. A small
    arena stays in the heap without advice. A fresh process: others advise heap memory too (numpy, for its
    arrays of 4 MiB and more), so only one that ran nothing else shows what preemptible does."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 30)}
    script = "from pathlib import Path\n" + inspect.getsource(_vm_flags) + _ADVICE_LEFT
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    flags = json.loads(out.stdout)
    assert flags["freed"] is None or "hg" not in flags["freed"], f"the freed arena's addresses keep the advice: {flags}"
    assert flags["small"] is not None and "hg" not in flags["small"], f"a small arena was advised: {flags}"


class _Bytes:
    """A sink that keeps what is written."""

    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: memoryview) -> None:
        self.out += data


def _ends(spec: Any) -> list[int]:
    from preemptible.store import format as tensor_format

    return [e.end for e in tensor_format.layout(spec.items)]


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=40),
    chunk_pages=st.integers(1, 4),
    stored_bf16=st.booleans(),
)
def test_a_lazily_staged_file_is_filled_piece_by_piece_and_written_as_a_whole_stage_writes_it(
    sizes: list[int], chunk_pages: int, stored_bf16: bool
) -> None:
    """`Staging.stage_lazily` copies nothing; each file's `ArenaFill`, called before each piece of its blob goes
    out, has copied every byte of that piece, and no tensor past the one the piece ends in. Written that way with
    any piece size, a file holds the bytes an eager `stage` writes; once every fill has run, the arena is the
    state. Tensors of any size, none included; some cast to bf16 on the way (stored moments)."""
    from preemptible.store import format as tensor_format
    from preemptible.writer import METADATA

    g = torch.Generator().manual_seed(len(sizes))
    live = {"w": {f"{i:03d}": torch.randn(n, generator=g) for i, n in enumerate(sizes)}}
    plan = plan_of(live)
    if stored_bf16:
        for spec in plan.specs:
            spec.stored.update({n: torch.bfloat16 for n, _ in spec.items[::2]})
    lazy = Staging(pin=False)
    old, fills = lazy.stage_lazily(plan, step=1)
    for name, blob in old.blobs.items():
        fills[name](len(blob))
    before = {name: bytes(blob) for name, blob in old.blobs.items()}  # the state at step 1
    for t in live["w"].values():
        t.add_(1)
    want = Staging(pin=False).stage(plan, step=2)
    got, fills = lazy.stage_lazily(plan, step=2)
    assert lazy.current is None and set(fills) == {s.name for s in plan.specs}
    assert {name: bytes(blob) for name, blob in got.blobs.items()} == before, "stage_lazily copied"
    chunk = chunk_pages * 4096
    for spec, staged_spec, wanted in zip(plan.specs, got.specs, want.specs, strict=True):
        name = spec.name
        blob, ends, seen = got.blobs[name], _ends(staged_spec), []

        def spy(
            upto: int, name: str = name, blob: memoryview = blob, ends: list[int] = ends, seen: list[int] = seen
        ) -> None:
            fills[name](upto)
            assert bytes(blob[:upto]) == bytes(want.blobs[name][:upto])
            after = next((end for end in ends if end >= upto), len(blob))
            assert bytes(blob[after:]) == before[name][after:], "a fill copied past the tensor its piece ends in"
            seen.append(upto)

        lazily, eagerly = _Bytes(), _Bytes()
        tensor_format.write(lazily, staged_spec.items, METADATA, blob=blob, chunk=chunk, fill=spy)
        tensor_format.write(eagerly, wanted.items, METADATA, blob=want.blobs[name])
        assert lazily.out == eagerly.out
        assert seen == ([*range(chunk, len(blob), chunk), len(blob)] if len(blob) else [])
    assert {name: bytes(blob) for name, blob in got.blobs.items()} == {
        name: bytes(blob) for name, blob in want.blobs.items()
    }


def _fill_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("preemptible-fill")]


def test_the_next_pieces_fill_runs_while_a_piece_is_written_and_a_stopped_write_leaves_no_fill_running() -> None:
    """A lazily filled file: the fill of piece k+1 is under way while piece k is written (a writer alone keeps its
    disk busy), every piece is filled before it goes out, a fill's error is the write's, and a write that stops
    early (the sink failed) returns only once the fill in flight is done: nothing copies into the arena after."""
    from preemptible.store import format as tensor_format
    from preemptible.writer import METADATA

    chunk = 4096
    t = torch.arange(4 * chunk // 4, dtype=torch.float32)  # four pieces of data
    blob = memoryview(bytearray(t.numel() * 4))
    data = t.view(torch.uint8).numpy().tobytes()
    asked: list[int] = []
    next_asked = [threading.Event() for _ in range(5)]

    def fill(upto: int) -> None:
        blob[:upto] = data[:upto]
        asked.append(upto)
        next_asked[len(asked)].set()

    class Sink:
        def __init__(self, fail_at: int | None = None, overlap: bool = True) -> None:
            self.out, self.writes, self.fail_at, self.overlap = bytearray(), 0, fail_at, overlap

        def write(self, piece: memoryview) -> None:
            j = self.writes - 1  # data pieces before this one (the first write is the header)
            self.writes += 1
            if self.overlap and 0 <= j < 3:  # piece j goes out: piece j+1's fill (the (j+2)th) is asked meanwhile
                assert next_asked[j + 2].wait(timeout=30), f"piece {j} went out before piece {j + 1} was asked"
            if self.fail_at is not None and self.writes == self.fail_at:
                raise OSError(28, "No space left on device")
            self.out += piece

    items = [("t", t)]
    sink = Sink()
    tensor_format.write(sink, items, METADATA, blob=blob, chunk=chunk, fill=fill)
    plain = Sink()
    tensor_format.write(plain, items, METADATA)
    assert sink.out == plain.out and asked == [chunk, 2 * chunk, 3 * chunk, 4 * chunk]
    assert not _fill_threads()

    asked.clear()
    blob[:] = bytes(len(blob))
    for e in next_asked:
        e.clear()
    with pytest.raises(OSError, match="No space"):
        tensor_format.write(Sink(fail_at=3), items, METADATA, blob=blob, chunk=chunk, fill=fill)
    assert not _fill_threads(), "a fill still running after its write stopped"
    assert asked == [chunk, 2 * chunk, 3 * chunk]  # two pieces sent, the third's fill was under way: no more

    asked.clear()

    def broken(upto: int) -> None:
        if upto > 2 * chunk:
            raise RuntimeError("The size of tensor a (3) must match the size of tensor b (4)")
        fill(upto)

    with pytest.raises(RuntimeError, match="must match"):  # piece 2's fill failed: the write fails with its error
        tensor_format.write(Sink(overlap=False), items, METADATA, blob=blob, chunk=chunk, fill=broken)
    assert not _fill_threads() and asked == [chunk, 2 * chunk]


def test_an_arena_laid_out_ahead_is_the_one_the_first_stage_uses_and_a_busy_one_is_left_alone() -> None:
    """`Staging.lay_out` (a run's first step, before any background save) allocates the arena a stage of the same
    layout then uses, copies nothing into it and stages nothing; while a save holds the arena it does nothing."""
    t = {"w": {str(i): torch.full((100,), float(i)) for i in range(50)}}
    staging = Staging(pin=False)
    plan = plan_of(t)
    staging.busy.acquire()
    assert not staging.lay_out(plan) and staging.allocations == 0
    staging.busy.release()
    assert staging.lay_out(plan) and staging.allocations == 1 and staging.current is None
    assert staging.nbytes >= 50 * 400
    staged = staging.stage(plan, step=1)
    assert staging.allocations == 1
    assert all(torch.equal(staged_tensors(staged)[f"w/{i}"], t["w"][str(i)]) for i in range(50))


@pytest.mark.parametrize("small", [True, False])
def test_prepare_lays_out_an_arena_only_where_a_blocking_save_would_use_it(tmp_path: Path, small: bool) -> None:
    """`Checkpointer.prepare(arena=True)` lays out the arena for CPU tensors mostly in small ones (a blocking save
    fills it as it writes), not for large ones (written from their own memory: the arena would be memory for
    nothing until a background save)."""
    from preemptible import Checkpointer

    state = {"m": {"a": torch.zeros(100), "b": torch.zeros(1 << 20 if not small else 100)}}
    ck = Checkpointer(tmp_path / "ck")
    assert ck.prepare(state, arena=True)
    staging = ck.arena.laid_out
    assert (staging is not None and staging.allocations == 1) is small
