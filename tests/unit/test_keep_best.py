"""`Run(keep_best=..., save_on_best=...)`: the best checkpoint by a logged figure stays beside the newest ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_model
from preemptible import Run
from preemptible.store import retention
from preemptible.store.layout import CheckpointInfo, Manifest

VAL = {3: 0.9, 8: 0.4, 13: 0.7, 18: 0.8}  # val_loss logged during these steps: the best during step 8


def committed(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "COMMIT.json").exists())


def figures(root: Path, step: int) -> dict[str, float]:
    doc = json.loads((root / f"step-{step:012d}" / "COMMIT.json").read_text())
    return dict(doc.get("figures", {}))


def train(root: Path, **kw: object) -> Run:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Run(root, model=model, optimizer=opt, keep=2, async_save=False, verify_after_save=True, **kw)  # type: ignore[arg-type]
    for step in run.steps(20):
        run.log(loss=1.0 / (step + 1))
        if step in VAL:
            run.log(val_loss=VAL[step])
    return run


def test_the_best_checkpoint_stays_beside_the_newest(tmp_path: Path) -> None:
    train(tmp_path, save_every=5, keep_best=("val_loss", "min"))
    # figures logged during step k belong to the next checkpoint: val_loss 0.4 (step 8) to the one of step 10
    assert [figures(tmp_path, s)["val_loss"] for s in (10, 15, 20)] == [0.4, 0.7, 0.8]
    assert committed(tmp_path) == [10, 15, 20]  # 10 is the best; 15 and 20 the newest two (5 went)


def test_save_on_best_saves_the_boundary_after_a_new_best(tmp_path: Path) -> None:
    train(tmp_path, save_every=100, keep_best=("val_loss", "min"), save_on_best=True)
    # new bests: 0.9 (step 3) and 0.4 (step 8), saved at the boundaries after them, 4 and 9; 0.7 and 0.8 are not
    lines = [json.loads(x) for f in sorted((tmp_path / "journal").glob("*.jsonl")) for x in f.read_text().splitlines()]
    saves = [(e["step"], e["reason"]) for e in lines if e["event"] == "save_committed"]
    assert saves == [(4, "best"), (9, "best"), (20, "final")]
    assert figures(tmp_path, 9)["val_loss"] == 0.4 and figures(tmp_path, 20)["val_loss"] == 0.8
    assert committed(tmp_path) == [9, 20]  # 4 went: neither among the newest two nor the best


def test_bad_options_are_refused(tmp_path: Path) -> None:
    model = make_model()
    with pytest.raises(ValueError, match=r"expected \(figure, 'min' or 'max'\)"):
        Run(tmp_path, model=model, keep_best=("val_loss", "lowest"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="save_on_best=True needs keep_best"):
        Run(tmp_path, model=model, save_on_best=True)


def info(step: int, value: float | None, status: str = "committed") -> CheckpointInfo:
    extra = {"figures": {"m": value}} if value is not None else {}
    manifest = Manifest(step=step, created="", world_size=1, checksum_algorithm="xxh3-64", files={}, extra=extra)
    return CheckpointInfo(
        step=step,
        path=f"step-{step}",
        committed=True,
        validated=status == "validated",
        manifest=manifest,
        invalid="bad" if status == "invalid" else None,
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.floats(-10, 10)), st.sampled_from(["committed", "validated", "invalid"])),
        min_size=1,
        max_size=12,
    ),
    st.integers(2, 4),
    st.sampled_from(["min", "max"]),
)
def test_retention_keeps_the_best_and_still_never_loses_the_newest_good(
    rows: list[tuple[float | None, str]], keep: int, mode: str
) -> None:
    infos = [info(i + 1, v, s) for i, (v, s) in enumerate(rows)]
    plain = retention.decide(infos, keep)
    best = retention.decide(infos, keep, ("m", mode))
    assert plain.keep <= best.keep and set(best.delete) <= set(plain.delete)  # only ever more kept
    good = [(v, c.step) for (v, s), c in zip(rows, infos, strict=True) if s != "invalid" and v is not None]
    if good:
        want = min(good, key=lambda vs: ((1 if mode == "min" else -1) * vs[0], -vs[1]))[1]
        assert want in best.keep and want not in best.delete
