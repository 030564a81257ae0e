"""Every subcommand against bad paths and bad numbers (issue 14 item 12): one line on stderr, exit 2, no
traceback; ``run`` exits as env(1) and container runtimes do when its command cannot start (127, 126); diagnose
reads /dev/zero and huge logs with bounded memory and says what it left out."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env
from preemptible.cli import main

FILE = "@file"  # a regular file where a directory belongs
DEEP = "@deep"  # a checkpoint root whose journal has one line nested 100,000 deep

BAD: list[tuple[str, list[str]]] = [
    ("verify on a file", ["verify", FILE]),
    ("verify on /dev/null", ["verify", "/dev/null"]),
    ("verify --step -5", ["verify", "@root", "--step", "-5"]),
    ("verify --step 10^13", ["verify", "@root", "--step", str(10**13)]),
    ("inspect on a file", ["inspect", FILE]),
    ("inspect on /dev/null", ["inspect", "/dev/null"]),
    ("inspect a missing root", ["inspect", "@root/nope"]),
    ("bench --dir a file", ["bench", "--dir", FILE, "--quick"]),
    ("bench --dir /dev/null", ["bench", "--dir", "/dev/null", "--quick"]),
    ("bench --params inf", ["bench", "--params", "inf"]),
    ("bench --rounds 0", ["bench", "--rounds", "0"]),
    ("diagnose --root a file", ["diagnose", "--root", FILE]),
    ("diagnose --root /dev/null", ["diagnose", "--root", "/dev/null"]),
    ("diagnose a directory as LOG", ["diagnose", "@root"]),
    ("diagnose a missing LOG", ["diagnose", "@root/missing.log"]),
    ("diagnose --exit-code x", ["diagnose", "--exit-code", "x"]),
    ("diagnose --exit-code=--", ["diagnose", "--exit-code=--"]),  # (argparse passed it on as an empty list)
    ("diagnose --exit-code -200", ["diagnose", "--exit-code=-200"]),  # (no signal is numbered above 64)
    ("plan --params=--", ["plan", "@root", "--params=--", "--window", "30"]),
    ("plan --params inf", ["plan", "--params", "inf", "--window", "30", "--bandwidth", "1e9"]),
    ("plan --params nan", ["plan", "--params", "nan", "--window", "30", "--bandwidth", "1e9"]),
    ("plan --params -1", ["plan", "--params", "-1", "--window", "30", "--bandwidth", "1e9"]),
    ("plan --window nan", ["plan", "--params", "1e9", "--window", "nan", "--bandwidth", "1e9"]),
    ("plan --window -30", ["plan", "--params", "1e9", "--window", "-30", "--bandwidth", "1e9"]),
    ("plan --window inf", ["plan", "--params", "1e9", "--window", "inf", "--bandwidth", "1e9"]),
    ("plan --step-time -5", ["plan", "--params", "1e9", "--window", "30", "--step-time", "-5", "--bandwidth", "1e9"]),
    ("plan --mtbf 0", ["plan", "--params", "1e9", "--window", "30", "--mtbf", "0", "--bandwidth", "1e9"]),
    ("plan --mtbf nan", ["plan", "--params", "1e9", "--window", "30", "--mtbf", "nan", "--bandwidth", "1e9"]),
    ("plan --bandwidth -1", ["plan", "--params", "1e9", "--window", "30", "--bandwidth", "-1"]),
    ("plan --bandwidth inf", ["plan", "--params", "1e9", "--window", "30", "--bandwidth", "inf"]),
    ("plan --world-size 0", ["plan", "--params", "1e9", "--window", "30", "--world-size", "0", "--bandwidth", "1"]),
    ("plan --world-size -2", ["plan", "--params", "1e9", "--window", "30", "--world-size", "-2", "--bandwidth", "1"]),
    ("drill a missing command", ["drill", "--", "/nonexistent/cmd"]),
    ("drill a directory", ["drill", "--", "/tmp"]),
    ("drill no command", ["drill"]),
    ("drill --at -1", ["drill", "--at", "-1", "--", "true"]),
    ("drill --at nan", ["drill", "--at", "nan", "--", "true"]),
    ("drill --window 0", ["drill", "--window", "0", "--", "true"]),
    ("drill --root a file", ["drill", "--root", FILE, "--", "true"]),
    ("drill --nodes x", ["drill", "--nodes", "x", "--source", "aws", "--", "true"]),
    ("drill --nodes 0", ["drill", "--nodes", "0", "--source", "aws", "--", "true"]),
    ("drill --nodes 10^30", ["drill", "--nodes", str(10**30), "--source", "aws", "--", "true"]),
    ("drill --nodes with a URL root", ["drill", "--nodes", "2", "--source", "aws", "--root", "s3://b/c", "--", "true"]),
    ("emulate --port 99999", ["emulate", "aws", "--port", "99999", "--for", "1"]),
    ("emulate --port -1", ["emulate", "aws", "--port", "-1", "--for", "1"]),
    ("emulate --host not local", ["emulate", "aws", "--host", "203.0.113.7", "--for", "1"]),
    ("emulate --for nan", ["emulate", "aws", "--for", "nan"]),
    ("emulate --notice-after -1", ["emulate", "gcp", "--notice-after", "-1", "--for", "1"]),
    ("an unknown subcommand", ["nosuch"]),
    ("an unknown option", ["verify", "@root", "--nosuch"]),
]


def cli(args: list[str], tmp_path: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "root").mkdir(exist_ok=True)
    deep = tmp_path / "deep" / "journal"
    deep.mkdir(parents=True, exist_ok=True)
    (deep / "x-r0.jsonl").write_text('{"event": "start", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    subst = {FILE: str(tmp_path / "file"), DEEP: str(tmp_path / "deep")}
    argv = [subst.get(a, a.replace("@root", str(tmp_path / "root"))) for a in args]
    return subprocess.run(
        [sys.executable, "-m", "preemptible", *argv],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("what", "args"), BAD, ids=[w for w, _ in BAD])
def test_item_12_a_bad_path_or_number_is_one_line_and_exit_2(tmp_path: Path, what: str, args: list[str]) -> None:
    out = cli(args, tmp_path)
    assert out.returncode == 2, (what, out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, (what, out.stderr)
    assert "Traceback" not in out.stderr and lines[0].startswith("preemptible")
    assert any(w in lines[0] for w in ("expected", "cannot", "invalid choice", "unrecognized")), lines[0]


@pytest.mark.parametrize(
    ("command", "code"),
    [(["/nonexistent/cmd"], 127), (["no-such-command-anywhere"], 127), (["/etc/hostname"], 126)],
    ids=["missing path", "missing on PATH", "exec format error"],
)
def test_item_12_run_exits_127_or_126_when_the_command_cannot_start(
    tmp_path: Path, command: list[str], code: int
) -> None:
    target = command[0]
    if target == "/etc/hostname" and not os.path.isfile(target):
        (tmp_path / "hostname").write_text("not a program\n")
        (tmp_path / "hostname").chmod(0o755)
        command = [str(tmp_path / "hostname")]
    out = cli(["run", "--", *command], tmp_path)
    assert out.returncode == code, out.stderr
    lines = [ln for ln in out.stderr.strip().splitlines() if "cannot start" in ln]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr


def test_item_12_diagnose_a_journal_line_nested_100000_deep_is_skipped(tmp_path: Path) -> None:
    out = cli(["diagnose", "--root", DEEP, "--json"], tmp_path)
    assert out.returncode in (0, 3), out.stderr
    assert "Traceback" not in out.stderr
    json.loads(out.stdout)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB of address space: python + torch-free CLI


@pytest.mark.timeout(150)
def test_item_12_diagnose_reads_dev_zero_within_a_memory_cap_and_says_what_it_left_out(tmp_path: Path) -> None:
    out = cli(["diagnose", "/dev/zero", "--json"], tmp_path, preexec_fn=_limit_memory)
    assert out.returncode == 3, out.stderr  # no verdict in zeros
    doc = json.loads(out.stdout)
    from preemptible.diagnose import MAX_LOG_BYTES

    assert doc["notes"] == [
        f"zero: binary (control bytes, not text); expected the text of a log; stopped after its first "
        f"{MAX_LOG_BYTES >> 20} MiB (the rest was not read)"
    ]


def test_item_12_diagnose_reads_the_end_of_a_log_longer_than_the_cap(tmp_path: Path) -> None:
    from preemptible.diagnose import diagnose, read_log

    log = tmp_path / "big.log"
    with log.open("w") as f:
        f.write("Traceback (most recent call last):\nRuntimeError: early crash, long before the end\n")
        f.write(("x" * 99 + "\n") * 30_000)  # 3 MB of noise
        f.write("slurmstepd: error: *** JOB 1234 ON node1 CANCELLED AT 2026-01-01T00:00:00 DUE TO PREEMPTION ***\n")
    result = diagnose([read_log(str(log), limit=1 << 20)])
    assert result.verdict == "preempted"
    assert result.notes == ["big.log: 3 MiB; only its last 1 MiB were read"]


def test_diagnose_piped_into_head_ends_without_a_traceback(tmp_path: Path) -> None:
    """`preemptible diagnose LOG | head -1`: the reader closes the pipe long before the report ends."""
    log = tmp_path / "job.out"
    with log.open("w") as f:
        for i in range(50):
            f.write(f"srun: error: node{i:03d}: task {i}: Killed {'.' * 300}\n")
            f.write(f"srun: error: node{i:03d}: task {i}: Segmentation fault {'.' * 300}\n")
            f.write(f"srun: error: node{i:03d}: task {i}: Terminated {'.' * 300}\n")
    reader = subprocess.Popen(
        [sys.executable, "-m", "preemptible", "diagnose", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    assert reader.stdout is not None and reader.stderr is not None
    first = reader.stdout.readline()
    reader.stdout.close()  # what head does after its line
    err = reader.stderr.read().decode()
    code = reader.wait(timeout=120)
    assert first.startswith(b"verdict: crashed")
    assert "Traceback" not in err and code in (0, 141), err


def test_a_storage_client_s_retry_tracebacks_stay_off_stderr(tmp_path: Path) -> None:
    """gcsfs logs a traceback for each failed retry (no network, no bucket) through logging's last-resort handler:
    the command's own one line says what failed; the clients' loggers are quiet, the project's are not."""
    import logging

    log = tmp_path / "job.log"
    log.write_text("step 1\n")
    assert main(["diagnose", str(log)]) == 3
    for name in ("gcsfs", "s3fs", "adlfs", "aiohttp", "botocore", "azure"):
        assert not logging.getLogger(name).isEnabledFor(logging.ERROR), name
    assert logging.getLogger("preemptible.anything").isEnabledFor(logging.WARNING)
