"""benchmarks/_record.py: every benchmark leaves its result, with the machine, the date and the command, where the
documentation site's performance page renders it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _record_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as when a benchmark runs: its folder is on the path
    spec = importlib.util.spec_from_file_location("_record", REPO / "benchmarks" / "_record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_benchmark_s_printed_result_is_written_with_its_machine_date_and_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record = _record_module(monkeypatch)
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", [str(REPO / "benchmarks" / "fake.py"), "--rounds", "2"])

    def main() -> int:
        print("save 1.20 s, torch.save 2.40 s: 2.00x")
        return 3

    assert record.recorded(main, "fake") == 3
    assert "2.00x" in capsys.readouterr().out  # still shown as it runs
    (written,) = tmp_path.glob("fake-*.json")
    doc = json.loads(written.read_text())
    assert doc["output"] == ["save 1.20 s, torch.save 2.40 s: 2.00x"]
    assert doc["command"][1:] == ["--rounds", "2"] and doc["command"][0].endswith("fake.py")
    assert doc["machine"]["cpus"] and doc["machine"]["python"] and doc["date"].endswith("UTC")
    monkeypatch.setenv("PREEMPTIBLE_BENCH_RECORD", "0")
    written.unlink()
    assert record.recorded(main, "fake") == 3 and not list(tmp_path.iterdir())


def test_every_benchmark_records_its_result() -> None:
    """Each benchmark's entry point goes through `recorded`, or writes a structured result of its own."""
    own = {"memory_tier.py", "nodes_bench.py", "gpu_suite.py"}  # write their own JSON, with machine, date, command
    helpers = {"_record.py", "memory_tier_worker.py", "nodes_dcp_train.py"}  # run by another benchmark, not alone
    missing = [
        p.name
        for p in sorted((REPO / "benchmarks").glob("*.py"))
        if p.name not in own | helpers and "recorded(" not in p.read_text().split('if __name__ == "__main__":')[-1]
    ]
    assert not missing, missing
