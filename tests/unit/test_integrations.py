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
        with pytest.raises(TypeError, match=r"keep_best: the framework's metrics are not reported"):
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
