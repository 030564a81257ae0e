"""The integrations' and trackers' small parts, in process: option checks, the settings that make a Trainer's resume
inexact, Lightning's resume_from, what a notice does to trackers, the W&B run id a restart continues."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from preemptible import trackers
from preemptible.checkpoint import Checkpointer


def test_the_callbacks_refuse_options_run_does_not_apply_to_a_trainer(tmp_path: Path) -> None:
    from preemptible.integrations.lightning import PreemptibleCallback as LightningCallback
    from preemptible.integrations.transformers import PreemptibleCallback as HFCallback

    for cls in (HFCallback, LightningCallback):
        with pytest.raises(TypeError, match=r"got options \['prestage_every'\]; expected those of preemptible.Run"):
            cls(tmp_path, prestage_every=3)
        with pytest.raises(TypeError, match=r"keep_best: the framework keeps its own best model"):
            cls(tmp_path, keep_best=("loss", "min"))
        assert cls(tmp_path, keep=3, probe_rtol=1e-4).options == {"keep": 3, "probe_rtol": 1e-4}
        assert cls(tmp_path, compress=True).options == {"compress": True}


def test_every_option_of_run_is_passed_on_by_the_callbacks_or_refused_with_a_reason() -> None:
    """An option added to Run must be placed: passed on by the framework callbacks, or refused with a reason (as
    ``compress`` once was refused, unplaced, though it applies to any trainer)."""
    import inspect

    from preemptible.integrations import _common
    from preemptible.run import Run

    params = inspect.signature(Run).parameters.values()
    keywords = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert not _common.OPTIONS & _common.NOT_PASSED.keys()
    assert _common.OPTIONS | _common.NOT_PASSED.keys() == keywords


def test_settings_that_make_the_trainer_s_resume_inexact_are_named(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    from preemptible.integrations.transformers import _inexact

    assert _inexact(TrainingArguments(output_dir=str(tmp_path), use_cpu=True)) == []
    found = _inexact(
        TrainingArguments(output_dir=str(tmp_path), use_cpu=True, ignore_data_skip=True, dataloader_num_workers=2)
    )
    assert len(found) == 2 and "ignore_data_skip=True" in found[0] and "dataloader_num_workers=2" in found[1]


def test_lightning_resume_from_names_the_root_once_it_holds_a_checkpoint(tmp_path: Path) -> None:
    from preemptible.integrations.lightning import PreemptibleCallback

    cb = PreemptibleCallback(tmp_path / "ckpt")
    assert cb.resume_from is None
    Checkpointer(tmp_path / "ckpt").save({"m": torch.nn.Linear(2, 2)}, 3).wait()
    assert cb.resume_from == f"preemptible:{tmp_path / 'ckpt'}"


def test_lightning_resume_from_is_read_with_a_module_made_before_the_trainer(tmp_path: Path) -> None:
    """The README's order: the module exists (not attached to any Trainer: its ``trainer`` property raises) when
    ``cb.resume_from`` is read in the call to ``fit``; the callback finds its Trainer all the same."""
    import lightning as L

    from preemptible.integrations.lightning import PreemptibleCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

    model = Module()
    with pytest.raises(RuntimeError):
        _ = model.trainer  # what Lightning does before fit
    cb = PreemptibleCallback(tmp_path / "ckpt")
    trainer = L.Trainer(max_epochs=1, callbacks=[cb], logger=False, enable_progress_bar=False)
    assert trainer is not None and model is not None and cb.resume_from is None


class Writer:
    def __init__(self, fail: bool = False) -> None:
        self.flushes = 0
        self.fail = fail

    def flush(self) -> None:
        if self.fail:
            raise OSError("disk full")
        self.flushes += 1


def test_a_notice_flushes_every_writer_once_and_a_failing_one_does_not_stop_the_others() -> None:
    ok, bad = Writer(), Writer(fail=True)
    t = trackers.Trackers([ok, bad])
    t.add(ok)  # the same writer twice is flushed once
    assert t.on_notice() == {"flushed": 1} and ok.flushes == 1
    with pytest.raises(TypeError, match="expected a tracker with flush"):
        t.add(object())


def test_the_active_w_and_b_run_is_marked_preempting(monkeypatch: pytest.MonkeyPatch) -> None:
    marked: list[bool] = []

    class FakeRun:  # the W&B service cannot run here: a stand-in for wandb.run, the one fault that cannot be real
        id = "abc"

        def mark_preempting(self) -> None:
            marked.append(True)

    class FakeWandb:
        run: Any = FakeRun()

    monkeypatch.setitem(__import__("sys").modules, "wandb", FakeWandb)
    assert trackers.Trackers().on_notice() == {"flushed": 0, "wandb": {"id": "abc", "marked_preempting": True}}
    assert marked == [True]


def test_a_restart_continues_the_same_w_and_b_run_unless_the_script_chose_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("WANDB_RUN_ID", "WANDB_RESUME"):  # whatever continue_wandb sets is undone after the test
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    first = trackers.continue_wandb("s3://bucket/run1")
    assert first == trackers.wandb_run_id("s3://bucket/run1") == os.environ["WANDB_RUN_ID"]
    assert os.environ["WANDB_RESUME"] == "allow"
    assert trackers.wandb_run_id("s3://bucket/run2") != first
    monkeypatch.setenv("WANDB_RUN_ID", "mine")
    assert trackers.continue_wandb("s3://bucket/run1") == "mine"


# issue 52: the framework's cadence, and its own newest checkpoint after a crash ----------------------------------
def _ck(path: str, step: int | None, mtime: float = 0.0) -> Any:
    from preemptible.integrations._common import FrameworkCheckpoint

    return FrameworkCheckpoint(path=path, step=step, mtime=mtime)


@pytest.mark.parametrize(
    ("found", "chosen"),
    [
        ([], None),
        ([("o/checkpoint-8", 8), ("o/checkpoint-40", 40), ("o/checkpoint-16", 16)], "o/checkpoint-40"),
        ([("d/epoch=1-step=24.ckpt", 24), ("d/last.ckpt", None)], "d/epoch=1-step=24.ckpt"),  # a known step wins
        ([("d/last.ckpt", None)], "d/last.ckpt"),  # unknown: only when no other has a step
        ([("root/checkpoint-99", 99), ("o/checkpoint-8", 8)], "o/checkpoint-8"),  # never from inside the root
        ([("root/sub/last.ckpt", 50)], None),
    ],
)
def test_the_framework_s_newest_checkpoint_is_picked_by_step_never_from_inside_preemptible_s_root(
    tmp_path: Path, found: list[tuple[str, int | None]], chosen: str | None
) -> None:
    from preemptible.integrations._common import newest

    candidates = [_ck(str(tmp_path / p), s) for p, s in found]
    picked, refused = newest(candidates, str(tmp_path / "root"))
    assert (picked.path if picked else None) == (str(tmp_path / chosen) if chosen else None)
    assert refused == [c.path for c in candidates if "/root/" in c.path]


def test_the_picker_s_rule_holds_for_any_set_of_candidates(tmp_path: Path) -> None:
    """Property: the pick lies outside the root, has the highest known step (the newest file among equal ones), and
    has an unknown step only when no candidate outside the root has a known one."""
    import random

    from preemptible.integrations._common import newest

    rng = random.Random(52)
    for _ in range(300):
        where = [rng.choice(["o", "root", "root/x"]) for _ in range(rng.randint(0, 6))]
        steps = [None, *range(5)]
        found = [_ck(str(tmp_path / w / f"f{i}"), rng.choice(steps), rng.random()) for i, w in enumerate(where)]
        picked, refused = newest(found, str(tmp_path / "root"))
        allowed = [c for c in found if c.path not in refused]
        assert len(refused) == sum(f"{tmp_path}/root" in c.path for c in found)
        if not allowed:
            assert picked is None
            continue
        assert picked in allowed
        known = [c for c in allowed if c.step is not None]
        if known:
            top = max(c.step for c in known if c.step is not None)
            assert picked.step == top and picked.mtime == max(c.mtime for c in known if c.step == top)
        else:
            assert picked.mtime == max(c.mtime for c in allowed)


def test_an_s3_root_refuses_no_local_file(tmp_path: Path) -> None:
    from preemptible.integrations._common import inside, should_fall_back

    assert not inside(str(tmp_path / "x"), "s3://bucket/run")
    assert inside(str(tmp_path / "r" / "a" / ".." / "b"), str(tmp_path / "r"))
    assert should_fall_back(_ck("x", 8), None) and should_fall_back(_ck("x", 8), 7)
    assert not should_fall_back(_ck("x", 8), 8) and not should_fall_back(None, None)
    assert should_fall_back(_ck("x", None), None) and not should_fall_back(_ck("x", None), 3)


def test_the_trainer_s_cadence_is_its_save_steps_or_that_fraction_of_max_steps(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    from preemptible.integrations.transformers import cadence

    def args(**kw: Any) -> Any:
        return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kw)

    assert cadence(args(save_strategy="steps", save_steps=40), 300) == (40, "hf save_steps=40")
    assert cadence(args(save_strategy="steps", save_steps=0.25), 30) == (8, "hf save_steps=0.25 of max_steps=30")
    assert cadence(args(save_strategy="epoch"), 300) is None
    assert cadence(args(save_strategy="no"), 300) is None


def test_the_trainer_s_own_checkpoints_are_its_complete_checkpoint_n_directories(tmp_path: Path) -> None:
    from preemptible.integrations.transformers import checkpoints

    for name, complete in (("checkpoint-8", True), ("checkpoint-16", False), ("checkpoint-x", True), ("runs", True)):
        (tmp_path / name).mkdir()
        if complete:
            (tmp_path / name / "trainer_state.json").write_text("{}")
    assert [(Path(c.path).name, c.step) for c in checkpoints(str(tmp_path))] == [("checkpoint-8", 8)]
    assert checkpoints(str(tmp_path / "absent")) == []


def test_lightning_s_cadence_and_files_with_their_steps_read_without_unpickling(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from preemptible.integrations.lightning import cadence, checkpoints, pickled_step

    a, b = ModelCheckpoint(dirpath=tmp_path / "a", every_n_train_steps=7), ModelCheckpoint(every_n_train_steps=3)
    trainer = SimpleNamespace(checkpoint_callbacks=[a, b], loggers=[], default_root_dir=str(tmp_path / "b"))
    assert cadence(trainer) == (3, "lightning every_n_train_steps=3")
    assert cadence(SimpleNamespace(checkpoint_callbacks=[ModelCheckpoint()])) is None
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "checkpoints").mkdir(parents=True)
    torch.save({"epoch": 2, "global_step": 37, "state_dict": {"w": torch.ones(2)}}, tmp_path / "a" / "last.ckpt")
    torch.save({"global_step": "37"}, tmp_path / "a" / "odd.ckpt")
    (tmp_path / "a" / "epoch=1-step=21.ckpt").write_bytes(b"not read: the name says the step")
    (tmp_path / "b" / "checkpoints" / "notes.txt").write_text("not a .ckpt")
    (tmp_path / "b" / "checkpoints" / "junk.ckpt").write_bytes(b"\x80\x04 not a zip")
    found = {Path(c.path).name: c.step for c in checkpoints(trainer)}
    assert found == {"last.ckpt": 37, "odd.ckpt": None, "epoch=1-step=21.ckpt": 21, "junk.ckpt": None}
    assert pickled_step(str(tmp_path / "a" / "last.ckpt")) == 37


def test_save_every_0_turns_periodic_saves_off_and_framework_fallback_off_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from preemptible.integrations.transformers import PreemptibleCallback

    assert PreemptibleCallback(tmp_path, save_every=0)._run_save_every is None
    assert PreemptibleCallback(tmp_path, save_every=5)._run_save_every == 5
    with pytest.raises(ValueError, match=r"expected save_every to be a whole number .*; found -1"):
        PreemptibleCallback(tmp_path, save_every=-1)
    cb = PreemptibleCallback(tmp_path / "root", framework_fallback=False)
    with caplog.at_level("WARNING", logger="preemptible"):
        cb.choose_fallback([_ck(str(tmp_path / "out" / "checkpoint-8"), 8)], None, "transformers")
    assert cb.fallback is None
    assert "checkpoint-8 (step 8) is newer than preemptible's newest (none)" in caplog.text
    assert "framework_fallback=False: it is ignored, training starts at step 0" in caplog.text
    on = PreemptibleCallback(tmp_path / "root")
    on.choose_fallback([_ck(str(tmp_path / "out" / "checkpoint-8"), 8)], 8, "transformers")
    assert on.fallback is None  # preemptible's own is as new
    on.choose_fallback([_ck(str(tmp_path / "out" / "checkpoint-8"), 8)], 4, "transformers")
    assert on.fallback is not None and on.fallback.step == 8


def test_the_step_read_off_a_hostile_ckpt_runs_nothing_and_is_bounded(tmp_path: Path) -> None:
    """`pickled_step` reads opcodes, never unpickles: a ``.ckpt`` whose pickle would run code when loaded (a
    ``__reduce__`` calling a builtin that writes a file) yields its step or None, and the code never runs; a cut
    pickle, a pickle beyond the size bound and random bytes give None, never a traceback."""
    import pickle
    import zipfile

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from preemptible.integrations.lightning import pickled_step

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))

    def ckpt(name: str, data: bytes) -> str:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", data)
        return str(path)

    hostile = pickle.dumps({"global_step": 12, "hook": Payload()}, protocol=2)
    assert pickled_step(ckpt("hostile.ckpt", hostile)) == 12
    assert pickled_step(ckpt("first.ckpt", pickle.dumps({"hook": Payload(), "global_step": 5}))) == 5
    assert not marker.exists()
    assert pickled_step(ckpt("cut.ckpt", hostile[: len(hostile) // 2])) in (None, 12)
    assert pickled_step(ckpt("negative.ckpt", pickle.dumps({"global_step": -3}))) is None
    assert not marker.exists()

    import preemptible.integrations.lightning as pl_integration

    bound = pl_integration._MAX_PICKLE
    pl_integration._MAX_PICKLE = len(hostile) - 1
    try:
        assert pickled_step(ckpt("large.ckpt", hostile)) is None  # beyond the bound: not read at all
    finally:
        pl_integration._MAX_PICKLE = bound

    @settings(max_examples=200, deadline=None)
    @given(st.binary(max_size=512))
    def garbage(data: bytes) -> None:
        for path in (ckpt("garbage.ckpt", data), str(tmp_path / "raw.ckpt")):
            (tmp_path / "raw.ckpt").write_bytes(data)
            step = pickled_step(path)
            assert step is None or (isinstance(step, int) and step >= 0)

    garbage()
    assert not marker.exists()
