"""diagnose: the verdict over a corpus of realistic log excerpts (look-alikes included), the CLI, and the journal
of real runs stopped by a real SIGTERM and a real SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Trainer, clean_env
from preemptible.cli import main
from preemptible.diagnose import CONFIDENCE, VERDICTS, diagnose, read_log, scan_lines
from preemptible.diagnose._remedy import TAGS

CORPUS = Path(__file__).parent.parent / "corpus" / "diagnose"
CASES: dict[str, dict[str, Any]] = {
    k: v for k, v in json.loads((CORPUS / "cases.json").read_text()).items() if not k.startswith("_")
}


def test_the_corpus_covers_every_verdict_and_every_file_is_a_case() -> None:
    from preemptible.diagnose import VERDICTS

    assert {c["verdict"] for c in CASES.values()} == set(VERDICTS)
    assert {p.name for p in CORPUS.iterdir() if p.is_file() and p.name != "cases.json"} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_verdict_and_evidence_line(name: str) -> None:
    case = CASES[name]
    result = diagnose([read_log(str(CORPUS / name))], exit_code=case.get("exit_code"))
    assert result.verdict == case["verdict"], result.render()
    named = {result.verdict} | ({"killed"} if result.competing == "killed" else set())  # (oom read from a SIGKILL)
    deciding = [e.line for e in result.evidence if e.verdict in named]
    if case["line"] is not None:
        assert case["line"] in deciding, result.render()
    assert result.confirm  # every verdict comes with how to confirm it


def test_look_alikes_are_not_called_preemption() -> None:
    # a traceback whose message says "preempted", an OOM kill with exit 137, and prose about OOMs
    mention = diagnose([read_log(str(CORPUS / "traceback_mentions_preemption.log"))])
    assert mention.verdict == "crashed" and all(e.verdict != "preempted" for e in mention.evidence)
    oom = diagnose([read_log(str(CORPUS / "dmesg_oom.log"))], exit_code=137)
    assert oom.verdict == "oom"
    prose = diagnose([read_log(str(CORPUS / "completed.log"))], exit_code=0)
    assert prose.verdict == "completed"


def test_exit_codes_alone() -> None:
    assert diagnose(exit_code=143).verdict == "terminated"
    assert diagnose(exit_code=-15).verdict == "terminated"
    # a SIGKILL names no sender: read as the OOM killer's (where the threads found the sender, most often it was),
    # with `killed` (a grace period that ran out, kill -9) the competing verdict
    assert (diagnose(exit_code=137).verdict, diagnose(exit_code=137).competing) == ("oom", "killed")
    assert (diagnose(exit_code=-9).verdict, diagnose(exit_code=-9).confidence) == ("oom", 0.6)
    assert diagnose(exit_code=139).verdict == "crashed"
    assert diagnose(exit_code=0).verdict == "completed"
    assert diagnose().verdict == "unknown"


@pytest.mark.parametrize(
    ("code", "verdict", "name"),
    [(-5, "crashed", "SIGTRAP"), (133, "crashed", "SIGTRAP"), (141, "crashed", "SIGPIPE"), (-13, "crashed", "SIGPIPE"),
     (-24, "time-limit", "SIGXCPU"), (152, "time-limit", "SIGXCPU"), (-14, "time-limit", "SIGALRM")],
)  # fmt: skip
def test_an_exit_code_names_every_signal_it_stands_for(code: int, verdict: str, name: str) -> None:
    """A negative code (Python's returncode: minus the signal) or 128 + N names its signal, not "a failure"."""
    d = diagnose(exit_code=code)
    assert d.verdict == verdict
    assert f"died of {name}" in d.summary and "reported a failure" not in d.summary


def test_torchrun_teardown_of_other_ranks_is_not_the_cause() -> None:
    lines = (CORPUS / "torchrun_crash.log").read_text().splitlines()
    evidence = scan_lines(lines, "x")
    # the -15 of rank 0 was torchrun's own doing: collateral, never a cause
    assert not [e for e in evidence if e.verdict == "terminated" and e.strength != "collateral"]


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(CORPUS / "slurm_preempted.out"), "--exit-code", "0"]) == 0
    text = capsys.readouterr().out
    assert "verdict: preempted" in text and "slurm_preempted.out:4" in text and "sacct -j" in text
    assert main(["diagnose", str(CORPUS / "gke_node_shutdown.txt"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    events = [e for e in doc["evidence"] if e["strength"] != "context"]  # (line 3's node pool says: spot)
    assert doc["verdict"] == "preempted" and events[0]["line"] == 6 and doc["confidence"] >= 0.9
    assert main(["diagnose", str(CORPUS / "empty.log")]) == 3  # unknown
    assert main(["diagnose", "/nonexistent/log"]) == 2
    assert "cannot read log" in capsys.readouterr().err


def test_a_real_sigterm_run_from_its_journal(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    t = Trainer(root, "--steps", "100000", "--save-every", "1000")
    t.wait_for_step(25)
    t.signal(signal.SIGTERM)
    code, _out, err = t.finish()
    assert code == 0, err
    result = diagnose([("stderr", err.splitlines())], exit_code=code, root=str(root))
    assert result.verdict == "terminated", result.render()
    ck = result.checkpoint
    assert ck["committed_after_notice"] == ck["notice_step"] == ck["last_committed"]
    assert result.steps_lost == 0 and result.steps_lost_exact
    assert any(e.where.startswith("journal") for e in result.evidence)
    # the same through the command line, as a person would run it
    proc = subprocess.run(
        [sys.executable, "-m", "preemptible", "diagnose", "--root", str(root), "--exit-code", "0", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "terminated"


def test_a_run_killed_without_notice_lost_its_steps_since_the_last_save(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    t = Trainer(root, "--steps", "100000", "--save-every", "20")
    t.wait_for_step(75)
    t.signal(signal.SIGKILL)
    code, _, _ = t.finish()
    assert code == -9
    result = diagnose(exit_code=code, root=str(root))
    assert (result.verdict, result.competing) == ("oom", "killed")  # (a SIGKILL alone: most likely the OOM killer)
    committed = result.checkpoint["last_committed"]
    assert committed % 20 == 0 and 0 < committed <= 80  # background saves: the newest may not have landed
    # "at least": the journal saw step 70 (a log event every 10 steps); the process went further unjournaled
    assert result.steps_lost is not None and result.steps_lost >= 70 - committed and not result.steps_lost_exact


def test_a_root_without_a_run_says_so(tmp_path: Path) -> None:
    result = diagnose(root=str(tmp_path / "not-a-run"))
    assert result.verdict == "unknown" and result.steps_lost is None
    assert f"nothing under {tmp_path / 'not-a-run'}" in result.render()


def test_a_collective_timeout_is_its_own_verdict_unless_a_crash_came_first() -> None:
    """Lines from public threads (sgl-project/sglang#1693; XPixelGroup/BasicSR#737): the watchdog's abort is a
    collective timeout, not a crash; a rank's traceback before its peers' timeouts is the cause (crashed)."""
    abort = [
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        "  what():  [PG 3 Rank 5] Process group watchdog thread terminated with exception: [Rank 5] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=9141, OpType=_ALLGATHER_BASE, NumelIn=19008, NumelOut=152064, "
        "Timeout(ms)=600000) ran for 600020 milliseconds before timing out.",
    ]
    result = diagnose([("abort.log", abort)], exit_code=-6)
    assert result.verdict == "collective-timeout" and result.confirm, result.render()
    timeout = (
        "[rank0]:[E626 06:24:44.159932949 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran "
        "for 600030 milliseconds before timing out."
    )
    crash_first = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 10, in <module>',
        "[rank1]: ValueError: bad batch",
        timeout,
    ]
    assert diagnose([("crash.log", crash_first)]).verdict == "crashed"
    assert diagnose([("timeout.log", [timeout])]).verdict == "collective-timeout"


def test_every_verdict_says_what_to_fix_and_how_to_verify() -> None:
    from preemptible.diagnose import FIX, remedy

    assert set(FIX) == set(VERDICTS)
    for verdict in VERDICTS:
        todo = remedy(verdict, set())
        assert todo["fix"], verdict
        assert verdict == "unknown" or todo["verify"], verdict


def test_the_fix_names_the_platform_the_evidence_names() -> None:
    slurm = diagnose(
        [("slurm.out", ["slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO PREEMPTION ***"])]
    )
    assert slurm.verdict == "preempted"
    assert any("--requeue" in f for f in slurm.fix) and not any(f.startswith("Kubernetes:") for f in slurm.fix)
    assert slurm.verify[0] == "preemptible drill --source slurm --reference -- python train.py"
    k8s = diagnose([("pod", ["  Warning  Evicted  2m  kubelet  The node was low on resource: memory."])], exit_code=143)
    assert k8s.verdict == "terminated"
    assert any("terminationGracePeriodSeconds" in f for f in k8s.fix)
    assert any(v.startswith("preemptible drill --source signal") for v in k8s.verify)
    doc = k8s.to_json()
    assert doc["fix"] == k8s.fix and doc["verify"] == k8s.verify
    assert doc["initiating"] is None and doc["collateral"] == []


def test_a_memory_pressure_eviction_names_oom_as_its_rival_and_fixes_the_pods_memory() -> None:
    """The kubelet ended the pod (terminated), but memory ran out: oom competes, and the fix is the pod's memory."""
    lines = ["Status:         Failed", "Reason:         Evicted",
             "Message:        The node was low on resource: memory. Container main was using 14592532Ki, which "
             "exceeds its request of 0."]  # fmt: skip
    d = diagnose([("pod", lines)])
    assert (d.verdict, d.competing) == ("terminated", "oom")
    assert "low on memory" in d.summary
    assert "resources.requests.memory" in d.fix[0] and "Evicted" in d.confirm[0]
    disk = diagnose([("pod", [*lines[:2], "Message:        The node was low on resource: ephemeral-storage."])])
    assert disk.verdict == "terminated" and disk.competing != "oom"
    assert not any("requests.memory" in f for f in disk.fix)


def test_advice_leaves_out_the_platforms_a_log_does_not_name() -> None:
    """A log that names the platform running the job (Nextflow, Ray) gets no SLURM or Kubernetes items; a log that
    names none gets them all, each tagged."""
    nextflow = diagnose(
        [("nf.log", ["ERROR ~ Error executing process > 'ALIGN (s1)'", "Caused by:",
                     "  Process `ALIGN (s1)` terminated with an error exit status (137)", "Command error:",
                     ".command.sh: line 2:    42 Killed                  bwa mem ref.fa r1.fq r2.fq"])]
    )  # fmt: skip
    assert nextflow.verdict == "oom"
    everything = nextflow.fix + nextflow.confirm
    assert any(f.startswith("Nextflow:") for f in nextflow.fix) and any(
        c.startswith("Nextflow:") for c in nextflow.confirm
    )
    assert not any(f.startswith(("SLURM:", "Kubernetes:")) for f in everything)
    ray = diagnose([("ray.log", ["The node with node id: 5f3e was terminated (reason: AUTOSCALER_DRAIN_PREEMPTED)"])])
    assert ray.verdict == "preempted"
    assert not any(f.startswith(("SLURM:", "Kubernetes:", "Nextflow:")) for f in ray.fix + ray.confirm)
    assert ray.deciding == "" or "SLURM:" not in ray.deciding
    bare = diagnose([("out", ["Killed"])])
    assert {"SLURM:", "Kubernetes:"} <= {f.split(" ", 1)[0] for f in bare.fix}
    mac = diagnose([("zsh", ["% hwaro version", "Killed: 9", 'kernel: load code signature error 2 for file "hwaro"'])])
    assert mac.verdict == "killed" and "codesign" in mac.summary  # a Mac has no scheduler's settings to change
    assert mac.fix and not any(f.startswith(("SLURM:", "Kubernetes:", "Nextflow:")) for f in mac.fix)


def test_the_advice_fits_what_the_evidence_names() -> None:
    """A stranger's check: AWS's own notice gets AWS's advice and rehearsal; a host OOM no GPU items and a GPU OOM no
    host items; a hangup the fix for a closed session, not a reclaim as its rival; Dask's memory budget Dask's fix."""
    aws = diagnose(
        [
            (
                "runner",
                [
                    '[i-01f7/cloud-init-output] {"level":"warn","message":"Spot interruption payload '
                    'received: {\\"action\\":\\"terminate\\",\\"time\\":\\"2025-03-31T16:34:24Z\\"}"}'
                ],
            )
        ]
    )
    assert aws.verdict == "preempted"
    assert not any(f.startswith(("GCP:", "Azure:", "SLURM:", "Kubernetes:")) for f in aws.fix + aws.confirm)
    assert any(f.startswith("AWS:") for f in aws.fix) and aws.verify[0].startswith("preemptible drill --source aws")
    host = diagnose([("slurm.out", ["slurmstepd-gpu20-15: error: Detected 1 oom-kill event(s) in StepId=9411285.0.",
                                    "srun: error: gpu20-15: task 0: Out Of Memory"])])  # fmt: skip
    assert host.verdict == "oom" and host.initiating is None  # (one node: slurmstepd-<host> names gpu20-15)
    assert not any(f.startswith("GPU:") for f in host.fix + host.confirm) and any("--mem" in f for f in host.fix)
    gpu = diagnose([("log", ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"])])
    assert gpu.verdict == "oom"
    assert not any(f.startswith(("host memory:", "dmesg")) for f in gpu.fix + gpu.confirm)
    hup = diagnose([("log", ["torch.distributed.elastic.multiprocessing.api.SignalException: Process 81061 got "
                             "signal: 1"])])  # fmt: skip
    assert hup.verdict == "terminated" and hup.competing != "preempted"
    assert "SIGHUP" in hup.fix[0] and "SIGHUP" in hup.fix[1]
    dask = diagnose([("w", ["distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarting"])])
    assert dask.verdict == "oom" and any(f.startswith("Dask:") for f in dask.fix + dask.confirm)
    assert not any(f.startswith(("SLURM:", "Kubernetes:", "Nextflow:")) for f in dask.fix + dask.confirm)


def test_a_sigterm_raised_as_keyboard_interrupt_is_a_termination_not_a_users_interrupt() -> None:
    """uvicorn and vLLM turn SIGTERM into KeyboardInterrupt('terminated'): a stop from outside (a probe's kill)."""
    frames = ["Traceback (most recent call last):", '  File "api_server.py", line 1130, in <module>',
              "    uvloop.run(run_server(args))"]  # fmt: skip
    assert diagnose([("log", [*frames, "KeyboardInterrupt: terminated"])]).verdict == "terminated"
    assert diagnose([("log", [*frames, "KeyboardInterrupt"])]).verdict == "interrupted"


@pytest.mark.parametrize(
    "end", ["[11.896s] Simulation App Shutting Down", "Error summary: End of program, Thread 0 only",
            " Normal termination of Gaussian 16 at Tue Jan  2 10:00:00 2024.", "Program finished successfully."],
)  # fmt: skip
def test_a_crash_after_the_program_said_it_ended_is_shutdown_noise(end: str) -> None:
    """The program's own end marker, then a crash in its teardown (a plugin's unload, MPI's finalize): completed."""
    crash = ["Assertion (m_initialized.load() != True) failed.", "Trace/breakpoint trap (core dumped)"]
    assert diagnose([("log", crash)]).verdict == "crashed"
    assert diagnose([("log", [end, *crash])]).verdict == "completed"
    assert diagnose([("log", [*crash, end])]).verdict == "crashed"


def test_the_advice_fits_yarn_airflow_gitlab_a_signal_and_a_hangup() -> None:
    """A second stranger's check: each platform the log names gets its own items and no other's; a memory kill by
    YARN is not to be confirmed in the kernel's log; a death by a signal gets a signal's advice, not a traceback's."""
    yarn = diagnose([("spark", ["Container killed by YARN for exceeding memory limits. 11.1 GB of 11 GB virtual "
                                "memory used. Consider boosting spark.yarn.executor.memoryOverhead."])])  # fmt: skip
    assert yarn.verdict == "oom" and any(f.startswith("YARN:") for f in yarn.fix + yarn.confirm)
    assert not any(f.startswith(("SLURM:", "Kubernetes:", "Nextflow:", "Dask:")) for f in yarn.fix + yarn.confirm)
    assert not any("dmesg" in c for c in yarn.confirm) and "dmesg" not in yarn.deciding
    airflow = diagnose([("task", ["State of this instance has been externally set to up_for_retry. Terminating "
                                  "instance."])])  # fmt: skip
    assert airflow.verdict == "terminated" and any(c.startswith("Airflow:") for c in airflow.confirm)
    assert "SLURM" not in airflow.deciding and not any(c.startswith("SLURM:") for c in airflow.confirm)
    gitlab = diagnose([("job", ["Terminated", "ERROR: Job failed: execution took longer than 30s seconds"])])
    assert gitlab.verdict == "time-limit" and any(f.startswith("GitLab CI:") for f in gitlab.fix)
    sigsys = diagnose([("unit", ["earlyoom.service: Main process exited, code=killed, status=31/SYS"])])
    assert sigsys.verdict == "crashed" and "SIGSYS" in sigsys.summary
    assert "died of a signal" in sigsys.confirm[0] and "faulthandler" in sigsys.fix[0]
    hup = diagnose([("log", ["torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down "
                             "workers"])])  # fmt: skip
    assert hup.verdict == "terminated" and "SIGHUP" in hup.summary and "disown" in hup.fix[0]
    child_ok = [("ray", ["dashboard agent exited with exit code 0", "received SIGTERM, shutting down"])]
    assert diagnose(child_ok).competing == "completed"
    assert diagnose(child_ok, exit_code=143).competing != "completed"  # (the run's own code: it did not finish)


def test_a_log_with_nothing_readable_names_no_likely_cause(tmp_path: Path) -> None:
    """An empty, binary or compressed log: unknown, and no "most likely" cause (nothing was read); the note says why."""
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    d = diagnose([read_log(str(empty))])
    assert d.verdict == "unknown" and d.competing is None
    assert d.summary.startswith("nothing in the logs could be read") and "empty" in d.summary
    assert "most likely" not in d.render()


def test_the_verify_command_is_a_real_drill_invocation() -> None:
    """The printed drill lines parse with the real CLI's parser (options that exist, values it accepts)."""
    import argparse

    from preemptible.cli import drill as drill_cli
    from preemptible.diagnose import verify

    parser = argparse.ArgumentParser()
    drill_cli.add_parser(parser.add_subparsers(dest="subcommand"))
    for verdict in VERDICTS:
        for platform in ("slurm", "aws", "gcp", "azure", "k8s"):
            for line in verify(verdict, {platform}, "/ckpt"):
                if line.startswith("preemptible drill"):
                    words = line.replace(" S ", " 30 ").split()[1:]
                    args = parser.parse_args(words)
                    assert args.subcommand == "drill" and "train.py" in args.cmd[-1], line


def test_a_run_that_saved_after_the_notice_needs_no_fix_in_the_save_path() -> None:
    from preemptible.diagnose import remedy

    fix = remedy("preempted", {"aws"}, "/ckpt", saved_at=288)["fix"]
    assert fix[0].startswith("nothing to fix in the save: the run committed step 288")
    assert not any(f.startswith("train with preemptible.Run") for f in fix)


def test_a_traceback_under_two_prefixes_is_one_crash() -> None:
    """torchrun --tee with rank prefixes: ``[default0]:[rank0]:`` before every line of the traceback."""
    lines = [
        "[default0]:[rank0]: Traceback (most recent call last):",
        '[default0]:[rank0]:   File "train.py", line 10, in <module>',
        "[default0]:[rank0]:     dist.all_reduce(t)",
        "[default0]:[rank0]: RuntimeError: boom",
    ]
    assert [(e.verdict, e.strength, e.line, e.actor) for e in scan_lines(lines, "x")] == [
        ("crashed", "strong", 4, "rank 0")
    ]


def test_attempt_without_a_root_is_refused_and_a_log_named_twice_is_read_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "job.out"
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert main(["diagnose", str(log), "--attempt", "1"]) == 2
    assert "expected --root ROOT with it" in capsys.readouterr().err
    assert main(["diagnose", str(log), str(log), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["evidence"]) == 1


def test_a_second_stranger_s_logs_get_the_sender_the_platform_and_the_memory_right() -> None:
    """A stranger's check on 15 public logs (issue 55, seventh round): where the log names the SIGKILL's sender it is
    not read as the OOM killer's; a tool's report of the shell's kill does not count against it; the platform a line
    names picks the advice; an accelerator's memory gets its own advice, not the host's."""
    unit = diagnose([("journal", ["flux.service: State 'stop-sigterm' timed out. Killing.",
                                  "flux.service: Main process exited, code=killed, status=9/KILL"])])  # fmt: skip
    assert unit.verdict == "killed" and any(f.startswith("systemd: TimeoutStopSec") for f in unit.fix)
    assert not any(f.startswith(("Kubernetes:", "Docker:", "SLURM:", "Nextflow:", "macOS:")) for f in unit.fix)
    assert any(c.startswith("systemd: journalctl") for c in unit.confirm)
    typed = diagnose([("shell", ["$ docker stop test", "test"])], exit_code=137)
    assert typed.verdict == "terminated" and "killed after the grace period" in typed.summary, typed.render()
    assert diagnose([("shell", ["$ kill -9 4410", "[1]+  Killed  python train.py"])]).verdict == "killed"
    circle = diagnose([("ci", ["/bin/bash: line 1:  2440 Killed  python build.py", "CircleCI received exit code 137"])])
    assert (circle.verdict, circle.confidence) == ("oom", CONFIDENCE["weak, killed"]), circle.render()
    gha = diagnose([("ci", ["##[error]The job running on runner GitHub Actions 3 has exceeded the maximum execution "
                            "time of 360 minutes."])])  # fmt: skip
    assert gha.verdict == "time-limit" and any(f.startswith("GitHub Actions:") for f in gha.fix)
    assert not any(f.startswith(("SLURM:", "Kubernetes:", "GitLab CI:", "Nextflow:")) for f in gha.fix + gha.confirm)
    docker = diagnose([("nomad", ['Exit Code: 137, Exit Message: "Docker container exited with non-zero exit code: '
                                  '137"'])])  # fmt: skip
    assert docker.verdict == "oom" and "docker inspect" in docker.deciding, docker.render()
    hbm = diagnose([("jax", ["jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent "
                             "error. Ran out of memory in memory space hbm. Used 20.4G of 15.48G hbm."])])  # fmt: skip
    assert (hbm.verdict, hbm.competing) == ("oom", "crashed") and "dmesg" not in hbm.deciding
    assert any("XLA" in f for f in hbm.fix) and not any(f.startswith(("SLURM:", "Docker:", "Windows:")) for f in
                                                        hbm.fix + hbm.confirm)  # fmt: skip
    disk = diagnose([("events", ["  Warning  Evicted  3m  kubelet  The node was low on resource: ephemeral-storage. "
                                 "Container trainer was using 12Gi, which exceeds its request of 0."])])  # fmt: skip
    assert disk.verdict == "terminated" and "ephemeral-storage" in disk.fix[0], disk.render()
    timed = diagnose([("time", ["Command terminated by signal 9"])])
    assert "signal 9:" in timed.evidence[0].why and "signal -9" not in timed.evidence[0].why


def test_a_third_stranger_s_logs_get_their_scheduler_s_and_their_notebook_s_advice() -> None:
    """A stranger's check (issue 55, eighth round): a PBS walltime kill got SLURM's, GitLab's and Kubernetes' advice
    and none of PBS's; a Colab notebook out of RAM got eleven platforms' fixes and dmesg, which a notebook cannot
    run; LSF's and SGE's reports name their own records and settings."""
    pbs = diagnose([("pbs", ["=>> PBS: job killed: walltime 259217 exceeded limit 259200"])])
    assert pbs.verdict == "time-limit"
    assert any(c.startswith("PBS: qstat -xf") for c in pbs.confirm) and any("walltime=" in f for f in pbs.fix)
    others = ("SLURM:", "Kubernetes:", "GitLab CI:", "GitHub Actions:", "CircleCI:", "Nextflow:", "LSF:", "SGE:")
    assert not any(f.startswith(others) for f in pbs.fix + pbs.confirm), pbs.render()
    ram = "Your session crashed after using all available RAM. If you are interested in access to high-RAM runtimes"
    colab = diagnose([("colab", [ram])])
    assert colab.verdict == "oom" and any(f.startswith("Colab: a high-RAM runtime") for f in colab.fix)
    assert not any(f.startswith(("SLURM:", "Kubernetes:", "YARN:", "Dask:", "Docker:", "Windows:")) for f in colab.fix)
    assert "dmesg" not in colab.deciding and not any("dmesg" in c for c in colab.confirm)
    report = ["Sender: LSF System <lsfadmin@n-62-20-1>", "Subject: Job 9603712: <train> in cluster <dcc> Exited",
              "TERM_RUNLIMIT: job killed after reaching LSF run time limit."]  # fmt: skip
    lsf = diagnose([("lsf", report)])
    assert lsf.verdict == "time-limit" and any("-wa USR1" in f for f in lsf.fix)
    assert any(c.startswith("LSF: bjobs -l") for c in lsf.confirm) and not any(f.startswith("PBS:") for f in lsf.fix)
    sge = diagnose([("sge", ["failed       37  : qmaster enforced h_rt, h_cpu, or h_vmem limit"])])
    assert sge.verdict == "time-limit" and any(f.startswith("SGE: a longer -l h_rt") for f in sge.fix)
    # a log that names no platform: the generic items and those of the platforms most jobs run on, not eleven
    # platforms' lists; a SIGKILL read as the OOM killer's also says what to check when it was not
    bare = diagnose([("time", ["Command terminated by signal 9"])])
    tags = {item.split(":", 1)[0] for item in bare.fix + bare.confirm if item.split(":", 1)[0] in TAGS.values()}
    assert tags == {"SLURM", "Kubernetes", "Docker"}, bare.render()
    assert bare.verdict == "oom" and any("something else sent the SIGKILL" in c for c in bare.confirm)
    assert not any("something else sent" in c for c in colab.confirm)  # (an OOM the platform names)


def test_a_stranger_s_logs_get_the_advice_of_the_platform_they_ran_on() -> None:
    """A stranger's check on public logs: a line only a platform writes (a CI runner's, a Mac's, a Windows path, a
    Compose service's exit, Jupyter's kernel restarter) names it without being evidence, and the advice is that
    platform's; a cancelled CI job is not a closed terminal; shared memory and native crashes get their own fix."""
    gha = diagnose(
        [("gha", ["2022-12-07T10:18:10.5771753Z ##[error]The runner has received a shutdown signal. This can happen "
                  "when the runner service is stopped, or a manually started runner is canceled.",
                  "2022-12-07T10:18:10.7098386Z ##[error]The operation was canceled.",
                  "2022-12-07T10:18:10.7710701Z Cleaning up orphan processes"])]
    )  # fmt: skip
    assert gha.verdict == "terminated" and "SIGHUP" not in gha.summary and gha.competing != "interrupted"
    assert not any("setsid" in f or "nohup" in f for f in gha.fix)  # (a hosted runner has no session to detach from)
    assert any(f.startswith("GitHub Actions:") for f in gha.fix)
    assert not any(f.startswith(("SLURM:", "Kubernetes:", "Airflow:", "systemd:")) for f in gha.fix + gha.confirm)
    assert [e for e in gha.evidence if e.strength == "context"] == []  # where it ran is not evidence of how it ended
    compose = diagnose([("up", ["webui-1  | LatentDiffusion: Running in eps-prediction mode",
                                "webui-docker-auto-cpu-1 exited with code 137"])])  # fmt: skip
    assert compose.verdict == "oom" and "docker inspect" in compose.deciding
    assert not any(f.startswith(("SLURM:", "Nextflow:", "macOS:")) for f in compose.fix + compose.confirm)
    mps_oom = (
        "RuntimeError: MPS backend out of memory (MPS allocated: 17.00 GB). Tried to allocate 256 MB on private pool. "
        "Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit"
    )
    mps = diagnose([("mac", [mps_oom])])
    assert mps.verdict == "oom" and any("PYTORCH_MPS_HIGH_WATERMARK_RATIO" in f for f in mps.fix)
    assert "dmesg" not in mps.deciding and not any("dmesg" in c for c in mps.confirm)
    bus = diagnose([("zsh", ["Epoch 1 of 10:   0%|   | 0/10", "zsh: bus error  python train.py"])])
    assert bus.verdict == "crashed" and "DiagnosticReports" in bus.confirm[0] and "faulthandler" in bus.fix[0]
    nt = diagnose([("pycharm", ["Epoch 2/5:   2%| 1/49", "Process finished with exit code -1073741819 (0xC0000005)"])])
    assert nt.verdict == "crashed" and "Event Viewer" in nt.confirm[0] and "dmesg" not in nt.deciding
    colab = diagnose([("colab", ["tcmalloc: large alloc 2847006720 bytes == 0x5586 @ 0x7f3b",
                                 "KernelRestarter: restarting kernel (1/5), keep random ports"])])  # fmt: skip
    assert colab.verdict == "oom"  # a kernel restarted after a huge allocation is not a finished run
    shm = diagnose([("dl", ["ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
                            "shared memory (shm)."])])  # fmt: skip
    assert shm.verdict == "crashed" and "--shm-size" in shm.fix[0]
    circle = diagnose([("ci", ["pytest", "Too long with no output (exceeded 10m0s): context deadline exceeded"])])
    assert circle.verdict == "time-limit" and circle.fix[0].startswith("CircleCI:")
    assert not any(f.startswith(("SLURM:", "GitLab CI:")) for f in circle.fix)
    gitlab = diagnose([("ci", ["ERROR: Job failed: execution took longer than 1h0m0s seconds"])])
    assert not any("--source slurm" in v for v in gitlab.verify)  # (a drill of Slurm's signal only for Slurm)
    caught = diagnose([("s", ["submitit WARNING - Caught signal SIGUSR2 on node7: this job is preempted."])])
    assert not any("died of" in e.why for e in caught.evidence)  # caught and logged: the process did not die of it
    slurm = diagnose([("out", ["slurmstepd: error: Failed to send MESSAGE_TASK_EXIT: Connection refused"])])
    assert slurm.evidence == []  # Slurm's daemons talking to each other: no peer of the training's went away
    done = diagnose([("fit", ["`Trainer.fit` stopped: `max_epochs=1` reached."])])
    assert done.verdict == "completed" and "traceback" not in done.deciding.split(":", 1)[0]
    assert "--exit-code" in done.deciding  # (not "read the first traceback" for a log that has none)
