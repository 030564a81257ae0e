from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import preemptible
from preemptible.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"preemptible {preemptible.__version__}"


def test_help_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "usage: preemptible" in capsys.readouterr().out


def test_console_script_is_installed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "preemptible", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert preemptible.__version__ in out


def test_import_starts_nothing() -> None:
    code = (
        "import signal, threading; before = signal.getsignal(signal.SIGTERM); import preemptible; "
        "assert signal.getsignal(signal.SIGTERM) == before; assert threading.active_count() == 1; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "ok", out.stderr


def test_emulate_serves_until_stopped_and_takes_control_requests() -> None:
    import json
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "preemptible", "emulate", "azure", "--vm-name", "vm-x", "--for", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        url = first.split()[-1]
        assert url.startswith("http://127.0.0.1:")
        hint = proc.stdout.readline()
        assert f"PREEMPTIBLE_AZURE_ENDPOINT={url}" in hint
        with urllib.request.urlopen(urllib.request.Request(url + "/_emulator/notice", method="POST"), timeout=5) as r:
            assert json.loads(r.read())["ok"] is True
        req = urllib.request.Request(
            url + "/metadata/scheduledevents?api-version=2020-07-01", headers={"Metadata": "true"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            doc = json.loads(r.read())
        assert doc["Events"][0]["Resources"] == ["vm-x"]
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        proc.kill()


def test_the_package_loads_lazily_and_run_help_does_not_import_torch() -> None:
    """`import preemptible` and `preemptible run --help` must start fast: no torch until a name needs it."""
    code = (
        "import sys, contextlib, io\n"
        "import preemptible\n"
        "assert 'torch' not in sys.modules, 'import preemptible pulled torch in'\n"
        "from preemptible.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['run', '--help'])\n"
        "assert 'torch' not in sys.modules, 'preemptible run --help pulled torch in'\n"
        "assert not hasattr(preemptible, 'state'), 'a submodule is an attribute before it is imported'\n"
        "try:\n"
        "    preemptible.journal\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('__getattr__ made a submodule an attribute')\n"
        "assert preemptible.Run.__name__ == 'Run' and 'torch' in sys.modules\n"
        "import preemptible.state\n"
        "assert preemptible.state.flatten\n"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_inspect_shows_why_each_checkpoint_was_saved_and_the_figures_logged_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    import torch

    from conftest import make_model

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = preemptible.Run(tmp_path, model=model, optimizer=opt, save_every=3, exit_on_notice=False)
    for step in run.steps(10):
        run.log(loss=1.0 / (step + 1), seen=step * 4)
        if step == 4:
            run.guard.trigger(source="signal")
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    rows = {r["step"]: r for r in json.loads(capsys.readouterr().out)["checkpoints"]}
    assert {s: r["reason"] for s, r in rows.items()} == {3: "periodic", 5: "emergency"}
    assert rows[3]["figures"] == {"loss": 1.0 / 3, "seen": 8}  # logged during step 2, the last before step 3
    assert rows[5]["figures"] == {"loss": 1.0 / 5, "seen": 16}
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "emergency" in out and "loss=0.2 seen=16" in out


def test_inspect_and_verify_speak_the_user_s_path_the_ranks_and_the_leftovers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root as typed (a relative path stays relative), where a checkpoint restores, and an uncommitted leftover
    named as such with when a run removes it."""
    import json
    import os
    import time

    import torch

    root = tmp_path / "ckpt"
    preemptible.Checkpointer(root).save({"model": torch.nn.Linear(2, 2)}, step=4).wait()
    leftover = root / "step-000000000009"
    leftover.mkdir()
    (leftover / "rank-00000.bin").write_bytes(b"half a save")
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "ckpt"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "ckpt" and "saved on 1 rank, restorable on any number" in out
    assert "uncommitted leftover of a save that never committed: never restored" in out
    assert "a run started after 15 more min removes it" in out
    old = time.time() - 3600
    for p in (leftover, leftover / "rank-00000.bin"):
        os.utime(p, (old, old))
    assert main(["inspect", "ckpt", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["root"] == "ckpt" and doc["resolved"].endswith("ckpt") and os.path.isabs(doc["resolved"])
    rows = {r["step"]: r for r in doc["checkpoints"]}
    assert rows[4]["ranks"] == 1 and "the next run's start removes it" in rows[9]["why"]
    assert main(["verify", "ckpt", "--no-mark"]) == 0
    assert "note: saved on 1 rank, restorable on any number" in capsys.readouterr().out


def test_a_layout_elastic_restore_cannot_reshard_keeps_the_checkpoint_on_its_world_size() -> None:
    from preemptible.checkpoint.shards import Record, restorable

    def rec(rank: int, placements: tuple[str, ...], mesh: tuple[int, ...]) -> Record:
        return Record(rank=rank, shape=(4, 4), local=(2, 4), placements=placements, mesh=mesh, offset=None)

    fsdp = {
        "w": [rec(r, ("Shard(dim=0)",), (2,)) for r in range(2)],
        "b": [rec(r, ("Replicate()",), (2,)) for r in range(2)],
    }
    assert restorable(fsdp, 2) == "saved on 2 ranks, restorable on any number"
    tp = {**fsdp, "q": [rec(r, ("Shard(dim=1)",), (2,)) for r in range(2)]}
    assert restorable(tp, 2) == (
        "saved on 2 ranks, restorable only on 2: q (Shard(dim=1) on a mesh of [2]) cannot be resharded"
    )
    hsdp = {"w": [rec(r, ("Replicate()", "Shard(dim=0)"), (2, 2)) for r in range(4)]}
    assert "restorable only on 4: w (Replicate(), Shard(dim=0) on a mesh of [2, 2])" in restorable(hsdp, 4)
