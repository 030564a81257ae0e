"""Time budget: size math against real states, verdicts with injected bandwidths, the probe, plan's JSON."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from conftest import make_model, train_some
from preemptible import Checkpointer, Run, budget, plan
from preemptible.cli import main


def test_size_math() -> None:
    assert budget.StateSize(params=7e9).bytes == 84_000_000_000  # fp32 weights + two fp32 Adam moments
    assert budget.StateSize(params=7e9, bf16_moments=True).bytes == 56_000_000_000
    assert budget.StateSize(params=1e6, optimizer="sgd").bytes == 8_000_000
    assert budget.StateSize(params=1e6, optimizer="none", dtype="bf16").bytes == 2_000_000
    assert budget.StateSize(params=1e6, dtype="bf16").bytes == 6_000_000  # moments in the params' dtype
    assert budget.StateSize(params=1e6, world_size=3).bytes_per_rank == 4_000_000
    with pytest.raises(ValueError, match="optimizer"):
        budget.StateSize(params=1, optimizer="lion")


@pytest.mark.parametrize(("opt_name", "bytes_per_param"), [("adamw", 12), ("sgd", 8)])
def test_description_matches_a_real_state(tmp_path: Path, opt_name: str, bytes_per_param: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 100))
    opt = (
        torch.optim.AdamW(model.parameters())
        if opt_name == "adamw"
        else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    )
    model(torch.randn(2, 300)).sum().backward()
    opt.step()
    params = sum(p.numel() for p in model.parameters())
    live = budget.live_bytes({"model": model, "optimizer": opt})
    described = budget.StateSize(params=params, optimizer=opt_name).bytes
    assert described == params * bytes_per_param
    step_bytes = 4 if opt_name == "adamw" else 0  # AdamW keeps a 0-d fp32 step per parameter tensor
    assert live == described + step_bytes * len(list(model.parameters()))
    result = Checkpointer(str(tmp_path)).save({"model": model, "optimizer": opt}, 1).wait()
    assert result.bytes >= live  # the files hold every tensor byte (plus headers and state.json)


def test_verdicts_with_injected_bandwidth() -> None:
    fits = budget.evaluate(state_bytes=1_000_000_000, bandwidth=1e9, window=30)
    assert fits.fits
    assert fits.breakdown["write_s"] == 1.0
    assert fits.margin_s == pytest.approx(30 - fits.predicted_save_s)
    tight = budget.evaluate(state_bytes=1_000_000_000, bandwidth=1e9 / 25, window=30)  # 25 s of 30: no headroom
    assert not tight.fits
    assert tight.margin_s > 0
    long_step = budget.evaluate(state_bytes=1_000_000, bandwidth=1e9, window=15, step_time=20)
    assert not long_step.fits
    assert any(r.name == "pre-staged buffer" and r.fits for r in long_step.recommendations)


def test_seven_billion_adamw_in_thirty_seconds_does_not_fit_and_lists_fixes() -> None:
    p = budget.evaluate(size=budget.StateSize(params=7e9), bandwidth=2e9, window=30, step_time=1.0, mtbf_hours=6)
    assert not p.fits
    assert p.state_bytes == 84_000_000_000
    names = [r.name for r in p.recommendations]
    assert names[:2] == ["bf16 moments", "stripe across ranks"]
    stripe = next(r for r in p.recommendations if r.name == "stripe across ranks")
    assert stripe.fits
    ranks = int(stripe.description.split("save from ")[1].split()[0])
    assert 84e9 / ranks / 2e9 + 1.0 + 0.1 + budget.EXIT_S <= 0.8 * 30
    assert 84e9 / (ranks - 1) / 2e9 + 1.0 + 0.1 + budget.EXIT_S > 0.8 * 30  # the fewest ranks that fit
    bf16 = next(r for r in p.recommendations if r.name == "bf16 moments")
    assert bf16.predicted_save_s == pytest.approx(56e9 / 2e9 + 1.0 + 0.1 + budget.EXIT_S, rel=1e-3)
    assert "faster storage" in names
    assert p.periodic_interval_s == pytest.approx(math.sqrt(2 * (84e9 / 2e9 + 0.1) * 6 * 3600), rel=1e-3)
    assert p.lost_work_s["with_notice_s"] == p.lost_work_s["without_notice_s"]


def test_windows_by_platform() -> None:
    assert budget.window_for("aws", None)[0] == 120
    assert budget.window_for("gke", None)[0] == 15
    assert budget.window_for("azure", 45)[0] == 45  # given wins
    with pytest.raises(ValueError, match="platform"):
        budget.window_for("oracle", None)


def test_probe_measures_on_the_root_and_cleans_up(tmp_path: Path) -> None:
    bw = budget.probe(tmp_path, nbytes=8 << 20)
    assert bw.bytes_per_s > 0
    assert bw.fixed_s > 0
    assert list(tmp_path.iterdir()) == []


def test_a_plan_does_not_create_its_root_and_measures_the_file_system_it_will_be_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "not" / "yet"
    assert main(["plan", str(root), "--params", "1e5", "--window", "30", "--probe-mb", "8"]) == 0
    assert not (tmp_path / "not").exists()
    assert list(tmp_path.iterdir()) == []  # the probe ran in the nearest existing parent and was removed
    (tmp_path / "file").write_text("x")
    assert main(["plan", str(tmp_path / "file" / "below"), "--params", "1e5", "--window", "30"]) == 2
    assert "expected a directory" in capsys.readouterr().err


def test_a_wide_margin_recommends_nothing_and_a_plan_prints_readably() -> None:
    wide = budget.evaluate(state_bytes=10**9, bandwidth=1e9, window=120)
    assert wide.fits and wide.recommendations == []
    tight = budget.evaluate(state_bytes=10**9, bandwidth=1e8, window=15)  # 10 s of 15: fits, not by much
    assert tight.fits and "stripe across ranks" in [r.name for r in tight.recommendations]
    assert repr(wide).startswith("<Plan: fits: 1.00 GB predicted 1.6 s in a 120 s window (+118.4 s)")
    assert "verdict           FITS" in str(wide) and "what would change it" in str(tight)


def test_plan_help_shows_percent_signs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "20% of the window" in out and "%%" not in out


def test_plan_json_has_stable_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["plan", str(tmp_path), "--params", "7e9", "--window", "30", "--bandwidth", "5e8", "--json", "--mtbf", "4"]
    )
    assert code == 1  # does not fit: non-zero, so a CI job can gate on it
    doc = json.loads(capsys.readouterr().out)
    for key in (
        "state_bytes",
        "bandwidth_bytes_per_s",
        "predicted_save_s",
        "window_s",
        "margin_s",
        "fits",
        "recommendations",
        "periodic_interval_s",
    ):
        assert key in doc, key
    assert doc["fits"] is False
    assert doc["state_bytes"] == 84_000_000_000
    assert all({"name", "description", "predicted_save_s", "fits"} <= set(r) for r in doc["recommendations"])


def test_plan_human_output_and_probe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", str(tmp_path), "--params", "1e5", "--platform", "gcp", "--probe-mb", "8"])
    assert code == 0
    out = capsys.readouterr().out
    assert "FITS" in out
    assert "\033[" not in out  # no colour when not a terminal
    assert "(GCP Spot: ~30 s from SIGTERM)" in out


def test_plan_from_a_live_state(tmp_path: Path) -> None:
    model = make_model()
    p = plan(tmp_path, state={"model": model}, bandwidth=1e6, window=30)
    assert p.state_bytes == sum(t.numel() * 4 for t in model.state_dict().values())


def test_run_logs_the_verdict_at_its_first_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PREEMPTIBLE_GRACE", "0.001")  # a window nothing fits in
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.INFO, logger="preemptible"):
        for step in Run(tmp_path, save_every=2, model=model, optimizer=opt).steps(6):
            train_some(model, opt, 1, start=step)
    warnings = [r for r in caplog.records if "plan:" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "does NOT fit" in warnings[0].getMessage() and "to make it fit" in warnings[0].getMessage()
    events = [json.loads(x) for f in (tmp_path / "journal").glob("*.jsonl") for x in f.read_text().splitlines()]
    plan_event = next(e for e in events if e["event"] == "plan")
    assert plan_event["fits"] is False
    committed = [e for e in events if e["event"] == "save_committed"]
    assert all("predicted_s" in e and "seconds" in e for e in committed)
    assert committed[-1]["predicted_s"] is not None  # every save after the first has a prediction


def test_plan_takes_compress_as_run_does_and_the_old_name_warns() -> None:
    described = {"params": 10e6, "bandwidth": 200e6, "window": 30.0}
    new = plan(**described, compress=False)
    with pytest.warns(DeprecationWarning, match=r"compress_setting=.*deprecated.*compress="):
        old = plan(**described, compress_setting=False)
    assert old.to_json() == new.to_json()
    assert new.to_json() != plan(**described, compress=True).to_json()
    with pytest.raises(ValueError, match="expected compress=True, False or 'auto', found 'fast'"):
        plan(**described, compress="fast")
