"""The pure parts of ``preemptible drill --nodes``: how the command after ``--`` becomes each node's torchrun, which
options it refuses and why, and the report's node-by-node lines."""

from __future__ import annotations

import shutil
import sys
from typing import Any

import pytest

from preemptible.drill import Check, DrillReport
from preemptible.drill._nodes import nodes_problem, torchrun_parts
from preemptible.errors import PreemptibleError


def test_a_python_command_runs_its_script_under_that_interpreter() -> None:
    assert torchrun_parts(["/opt/py/bin/python3.11", "train.py", "--root", "r"]) == (
        "/opt/py/bin/python3.11",
        [],
        ["train.py", "--root", "r"],
    )
    python = shutil.which("python3")
    if python is not None:  # a bare name is looked up on PATH, as the shell would
        assert torchrun_parts(["python3", "-u", "train.py"]) == (python, [], ["train.py"])  # torchrun runs -u


def test_python_m_becomes_torchruns_module_and_another_executable_runs_as_given() -> None:
    assert torchrun_parts(["/usr/bin/python", "-m", "pkg.train", "--lr", "1"]) == (
        "/usr/bin/python",
        ["--module"],
        ["pkg.train", "--lr", "1"],
    )
    assert torchrun_parts(["./train.sh", "--root", "r"]) == (
        sys.executable,
        ["--no-python"],
        ["./train.sh", "--root", "r"],
    )


@pytest.mark.parametrize(
    ("command", "found", "todo"),
    [
        (["torchrun", "--nproc-per-node", "2", "train.py"], "found torchrun", "e.g. -- python train.py ARGS"),
        (["python", "-m", "torch.distributed.run", "train.py"], "found torchrun", "e.g. -- python train.py ARGS"),
        (["python", "-c", "print(1)"], "found the interpreter option -c", "a wrapper script that execs python"),
        (["python"], "found no script", "a wrapper script that execs python"),
    ],
)
def test_commands_torchrun_cannot_take_are_refused_with_what_to_give(command: list[str], found: str, todo: str) -> None:
    with pytest.raises(PreemptibleError, match=r"^expected ") as e:
        torchrun_parts(command)
    assert found in str(e.value) and todo in str(e.value)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"at": "mid-epoch"}, "found --at mid-epoch"),
        ({"reference": True}, "without --reference, found both"),
        ({"root": "s3://bucket/ckpt"}, "found the URL 's3://bucket/ckpt'"),
        ({"source": "signal"}, "found --source signal"),
    ],
)
def test_options_a_multi_node_drill_cannot_honour_are_named(options: dict[str, Any], says: str) -> None:
    given: dict[str, Any] = {"source": "aws", "reference": False, "kill": False, "at": None, "root": None}
    problem = nodes_problem(2, **{**given, **options})
    assert problem is not None and problem.startswith("expected ") and says in problem
    assert nodes_problem(2, **given) is None
    assert nodes_problem(4, **{**given, "at": 2.0}) is None


def test_the_text_report_of_a_multi_node_drill_names_each_nodes_exits() -> None:
    report = DrillReport("aws", 120.0, ["python", "train.py"], timings={"notice_to_commit_s": 1.0}, steps_lost=0)
    report.node_count = 2
    report.moment = {"aim": "first-save", "step": 40}
    report.checks.append(Check("every rank stopped at one step", True, "step 82"))
    report.nodes = [
        {"node": 1, "addr": "10.77.0.1", "hosts_store": True, "role": "survivor", "detail": "rank 0 exit 76"},
        {"node": 2, "addr": "10.77.0.2", "hosts_store": False, "role": "reclaimed", "detail": "rank 1 exit 0"},
    ]
    lines = report.render().splitlines()
    assert lines[0] == "preemptible drill: aws notice to node 2 of 2 simulated nodes, 120 s window"
    assert lines[1] == "  stop: once the first checkpoint committed (step 40)"
    assert "    node 1  10.77.0.1   store host  survivor   rank 0 exit 76" in lines
    assert "    node 2  10.77.0.2               reclaimed  rank 1 exit 0" in lines
    assert lines[-1] == "PASSED: 1/1 checks"
    assert report.to_json()["nodes"][1]["role"] == "reclaimed" and report.to_json()["node_count"] == 2
