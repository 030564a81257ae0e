"""The benchmark runs end to end on a tiny state (figures are not checked: this machine is noisy)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from preemptible import bench
from preemptible.bench._workloads import _dcp
from preemptible.checkpoint import Checkpointer
from preemptible.cli import main
from preemptible.cli.bench import bench_directory


def test_scenario_measures_every_contender_and_reports_ratios(tmp_path: Path) -> None:
    state = bench.small_state(count=200, total_bytes=2e6)
    out = bench.run_scenario("tiny", state, rounds=1, quick=True, work_dir=str(tmp_path), log=lambda s: None)
    for name, result in out["results"].items():
        assert len(result.samples) == 1, name
        assert result.median() > 0 or "O_DIRECT" in name, name
    text = bench.report(out)
    assert "emergency save speed vs torch.save" in text
    # O_DIRECT is refused on some file systems (tmpfs): that ceiling may be absent, every other ratio is there
    assert all(math.isfinite(v) and v > 0 for k, v in out["ratios"].items() if "O_DIRECT" not in k)
    assert out["results"]["preemptible async save"].median("stall") > 0
    assert list(tmp_path.iterdir()) == []  # cleaned up


def test_a_ratio_to_a_ceiling_is_the_median_of_its_rounds_run_back_to_back() -> None:
    state = bench.small_state(count=4, total_bytes=4e3)
    names = list(bench.contenders(state, 4000, same_bytes=bench.small_state(count=2, total_bytes=4e3)))
    after = {n: names[names.index(n) + 1] for n in names[:-1]}
    assert after["preemptible async save"] == "ceiling: memcpy into reused buffers"
    assert after["preemptible restore (warm)"] == "ceiling: read into the state's memory (warm)"
    assert after["ceiling: read into the state's memory (warm)"] == (
        "ceiling: read and hash into the state's memory (warm)"
    )
    assert after["preemptible restore (cold)"] == "ceiling: read (cold)"
    assert after["preemptible emergency save"] == "emergency save, the same bytes in a few tensors"
    assert after["emergency save, the same bytes in a few tensors"] == "ceiling: fsync'd write"
    assert after["preemptible emergency save (after a periodic save)"] == "... after a periodic save"
    assert after["preemptible emergency save (prepared, as a run's first)"] == "... prepared, as a run's first"

    def result(name: str, seconds: list[float], stall: list[float] | None = None) -> bench.Result:
        samples = [bench.Sample(s, {"stall": stall[i]} if stall else {}) for i, s in enumerate(seconds)]
        return bench.Result(name, 1000, samples)

    results = {n: result(n, [1.0, 1.0, 1.0], [0.5, 0.5, 0.5] if "async" in n else None) for n in names}
    # per round the ceiling gets 0.9, 0.1, 0.9 of the restore: median 0.9; the medians' ratio would say 0.45
    results["preemptible restore (warm)"] = result("r", [1.0, 2.0, 4.0])
    results["ceiling: read into the state's memory (warm)"] = result("c", [0.9, 0.2, 3.6])
    results["ceiling: read and hash into the state's memory (warm)"] = result("h", [0.95, 1.0, 3.8])
    results["preemptible async save"] = result("a", [1.0, 1.0, 1.0], [0.2, 3.0, 0.4])
    results["ceiling: memcpy into reused buffers"] = result("m", [0.1, 3.0, 0.1])
    scenario = {"name": "t", "bytes": 1000, "tensors": 10, "results": results, "checksum_share": 0.1}
    bench.report(scenario)
    ratios = scenario["ratios"]
    assert math.isclose(ratios["restore (warm) / read-into-memory ceiling (throughput)"], 0.9)
    assert math.isclose(ratios["restore (warm) / read-and-hash ceiling (throughput)"], 0.95)  # .95, .5, .95
    assert math.isclose(ratios["restore (warm) overhead per tensor beyond the read, us"], 0.4 / 10 * 1e6)
    assert math.isclose(ratios["async stall / memcpy of the same bytes"], 2.0)  # 2, 1, 4
    assert math.isclose(ratios["emergency save speed vs torch.save"], 1.0)  # not paired: the medians'
    # rounds that do not line up (a contender that failed a round) fall back to the medians' ratio
    results["ceiling: read into the state's memory (warm)"] = result("c", [0.9, 0.2])
    bench.report(scenario)
    assert math.isclose(scenario["ratios"]["restore (warm) / read-into-memory ceiling (throughput)"], 0.55 / 2.0)


def test_a_warm_emergency_sample_is_the_median_of_several_saves_after_one_periodic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves: list[tuple[int, bool]] = []
    real = Checkpointer.save

    def save(self: Checkpointer, state: Any, step: int, **kw: Any) -> Any:
        saves.append((step, kw.get("blocking", True)))
        return real(self, state, step, **kw)

    monkeypatch.setattr(Checkpointer, "save", save)
    state = bench.small_state(count=8, total_bytes=8e3)
    fns = bench.contenders(state, 8000, same_bytes=bench.small_state(count=4, total_bytes=8e3))
    sample = fns["preemptible emergency save (after a periodic save)"](str(tmp_path))
    assert saves == [(1, False)] + [(s, True) for s in range(2, 2 + bench.WARM_SAVES)]
    assert sample.seconds > 0 and not list(tmp_path.iterdir())  # its checkpoints are gone with it
    saves.clear()
    fns["emergency save, the same bytes in a few tensors"](str(tmp_path))
    assert saves == [(2, True)]  # a cold save is one save, of a new Checkpointer
    saves.clear()
    prepared: list[bool] = []
    monkeypatch.setattr(Checkpointer, "prepare", lambda self, state, arena: prepared.append(arena) or True)
    fns["preemptible emergency save (prepared, as a run's first)"](str(tmp_path))
    # each the first save of a Checkpointer that prepared the state and its arena, as a Run does
    assert saves == [(s, True) for s in range(2, 2 + bench.WARM_SAVES)] and prepared == [True] * bench.WARM_SAVES


def test_bench_command(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert bench_directory(f"file://{tmp_path / 'x'}") == str(tmp_path / "x")  # a file:// URL is local
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "bench",
            "--params",
            "2e5",
            "--small-tensors",
            "100",
            "--rounds",
            "1",
            "--quick",
            "--no-beside",
            "--dir",
            "not/made",  # made, as a first-time user names it: relative to where they stand
            "--json",
            str(tmp_path / "figures.json"),
        ]
    )
    assert code == 0 and not list((tmp_path / "not" / "made").iterdir())  # made, and left empty
    doc = json.loads((tmp_path / "figures.json").read_text())
    assert doc["large"]["median_s"]["preemptible emergency save"] > 0
    assert "small_vs_large" in doc
    assert "ratios:" in capsys.readouterr().out


def test_bench_refuses_a_url_for_its_directory_before_it_measures_anything(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--dir", "s3://bucket/bench"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "expected a local directory" in err and "s3://bucket/bench" in err and "beside_s3.py" in err


def test_training_beside_measures_each_save_against_the_steps_around_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PREEMPTIBLE_BENCH_DIR", str(tmp_path))
    state = bench.small_state(count=8, total_bytes=4e5)
    saved: list[int] = []
    real_save = Checkpointer.save

    def save(self, state, step, **kw):  # type: ignore[no-untyped-def]
        saved.append(step)
        return real_save(self, state, step, **kw)

    monkeypatch.setattr(Checkpointer, "save", save)
    out = bench.training_beside(state, seconds=0.05, rounds=2, dcp=False, rate=50e6)
    assert saved == [1, 2, 3]  # the warm-up save, then one background save per round
    assert len(out["extra_each_s"]) == 2
    assert out["steps_beside"] >= 1 and out["save_window_s"] > 0 and out["step_alone_ms"] > 0
    assert math.isnan(out["extra_dcp_async_s"]) and out["rate_mb_s"] == 50
    assert set(out["cpu_beside_ours_s"]) == {*bench.CPU_FIELDS, "process"}
    assert "the save ran" in bench.beside_report(out)
    assert list(tmp_path.iterdir()) == []  # cleaned up
    verified = bench.training_beside(state, seconds=0.05, rounds=1, dcp=False, verify=True)
    assert verified["verify"] and "each save read back and checked" in bench.beside_report(verified)


def test_training_beside_takes_its_median_over_more_rounds_than_it_measures_dcp_in(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PREEMPTIBLE_BENCH_DIR", str(tmp_path))
    dcp = _dcp()
    real_async = dcp.async_save
    calls: list[object] = []

    def async_save(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(kw.get("storage_writer"))
        return real_async(*a, **kw)

    monkeypatch.setattr(dcp, "async_save", async_save)
    state = bench.small_state(count=8, total_bytes=4e5)
    out = bench.training_beside(state, seconds=0.05, rounds=3, dcp_rounds=1)
    assert len(out["extra_each_s"]) == 3 and len(calls) == 1
    assert math.isclose(out["extra_ours_s"], sorted(out["extra_each_s"])[1], abs_tol=1e-3)  # each is rounded
    assert "median of 3:" in bench.beside_report(out)


def test_training_beside_a_save_to_object_storage_leaves_nothing_in_the_store(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`benchmarks/beside_s3.py`'s measurement, against moto on loopback: every round's checkpoint goes up and is
    removed, and the report names the destination."""
    from objkit import make_bucket, moto_server

    monkeypatch.setenv("PREEMPTIBLE_BENCH_DIR", str(tmp_path))
    with moto_server() as endpoint:
        fs = make_bucket(endpoint, "beside")
        opts = {"client_kwargs": {"endpoint_url": endpoint}, "key": "testing", "secret": "testing"}
        state = bench.small_state(count=8, total_bytes=4e5)
        out = bench.training_beside(
            state, seconds=0.05, rounds=2, dcp=False, url="s3://beside/ck", storage_options=opts
        )
        assert len(out["extra_each_s"]) == 2 and math.isnan(out["extra_dcp_async_s"])
        assert "object storage (s3://beside/ck)" in bench.beside_report(out)
        fs.invalidate_cache()
        assert fs.find("beside") == []
    assert list(tmp_path.iterdir()) == []


def test_median_of_takes_the_middle_sample_by_seconds() -> None:
    seconds = iter([0.3, 0.1, 0.2])
    calls: list[str] = []

    def fn(work: str) -> bench.Sample:
        calls.append(work)
        s = next(seconds)
        return bench.Sample(s, {"tag": s})

    sample = bench.median_of(fn, 3)("w")
    assert calls == ["w"] * 3 and sample.seconds == 0.2 and sample.extra == {"tag": 0.2}


def test_a_warm_restore_sample_is_the_median_of_several_restores_a_cold_one_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restores: list[int | None] = []
    real = Checkpointer.restore

    def restore(self: Checkpointer, state: Any, step: int | None = None) -> int | None:
        restores.append(real(self, state, step))
        return restores[-1]

    monkeypatch.setattr(Checkpointer, "restore", restore)
    state = bench.small_state(count=8, total_bytes=8e3)
    fns = bench.contenders(state, 8000)
    assert fns["preemptible restore (warm)"](str(tmp_path)).seconds > 0
    assert restores == [1] * bench.WARM_READS  # each restored the checkpoint it saved first
    restores.clear()
    fns["preemptible restore (cold)"](str(tmp_path))
    assert restores == [1]
