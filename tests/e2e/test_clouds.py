"""The example training script, told of its end by each cloud's metadata service (the loopback emulator)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from conftest import Trainer, journal
from preemptible.emulate import EMULATORS

ENV = {"aws": "PREEMPTIBLE_AWS_ENDPOINT", "gcp": "PREEMPTIBLE_GCP_ENDPOINT", "azure": "PREEMPTIBLE_AZURE_ENDPOINT"}
WINDOW = {"aws": 120, "gcp": 30, "azure": 30}


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_cloud_notice_stops_at_a_boundary_commits_and_exits(tmp_path: Path, cloud: str) -> None:
    root = tmp_path / "ckpt"
    with EMULATORS[cloud]() as emu:
        env = {"PREEMPTIBLE_SOURCES": cloud, ENV[cloud]: emu.url}
        t = Trainer(root, "--steps", "100000", "--save-every", "1000000", "--step-time", "0.01", env=env)
        t.wait_for_step(20)
        emu.notice()
        code, out, err = t.finish()  # its timeout is the hang guard; notice-to-exit times are a benchmark's
        assert code == 0, err
        events = journal(root)
        notice = next(e for e in events if e["event"] == "notice")
        assert notice["source"] == cloud
        last_run = max(int(line.split()[1]) for line in out.splitlines() if line.startswith("step "))
        assert notice["step"] == last_run + 1
        assert (root / f"step-{notice['step']:012d}" / "COMMIT.json").exists()
        committed = next(e for e in events if e["event"] == "save_committed")
        assert committed["reason"] == "emergency"
        assert 0 < committed["remaining_s"] <= WINDOW[cloud]  # durable before the cloud's own deadline
        if cloud == "azure":
            ((event_id, approved_at),) = emu.approvals  # type: ignore[attr-defined]
            assert approved_at >= ts(committed["t"]), "approved before the checkpoint committed"
            assert event_id in notice["detail"]
