"""``preemptible drill --nodes N``: scenario 1 of a multi-node job (one node reclaimed with notice), rehearsed on
this one machine with the harness the multi-node tests use (`preemptible.testing.nodes`).

Why the same harness: the drill is the test's scenario pointed at the user's own command, so what it grades is
what the tests prove. N simulated nodes, each a network namespace of the drill's own on a bridge inside another
(node ``i`` at ``10.77.0.<i>``; no interface, route or rule of the machine is touched, and a packet goes nowhere
but loopback and those namespaces), each with its own AWS metadata emulator on its own loopback and one torchrun
agent (c10d rendezvous hosted by node 1, ``--nnodes N:N``, ``--max-restarts 3``, one rank per node) running the
command. The nodes share this machine's files, so the checkpoint root is shared as a real job's must be.

1. Start the emulators and the agents; wait for every rank's `Run` to enter the loop.
2. Wait for the first checkpoint to commit (or ``--at`` seconds into the loop).
3. Serve the notice to the last node only (never node 1, which hosts the store). Check: every rank saw it and
   stopped at one step, one emergency checkpoint committed, the last node's ranks exited with the platform's code
   and their agent ended (SIGTERMed by its rank: it leaves the rendezvous open), every other node's ranks exited
   76 (`preemptible.emergency.EXIT_PEER_NODE`) and their agents live on, restarting (torchrun's elastic restart).
4. Replace the last node (a new namespace at the same address, an empty scratch directory, a new emulator) and
   start its agent; check every rank resumed from the emergency step at full size (no step lost, as
   `preemptible.report` counts them) and the surviving agents were never relaunched.
5. Stop the resumed job with a second notice to the last node (the single-node drill's step 6), check every rank
   stopped at one step with a committed save, then end the surviving agents, which wait for a replacement.

Rank ``r`` is placed on its node by its process's network namespace (the ``pid`` of its ``start`` event): c10d
numbers the nodes in its own order, not by address.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from preemptible import relay
from preemptible.drill._child import SLACK_S, Exits, event_time, newest_committed, on_storage
from preemptible.drill._report import DrillReport
from preemptible.emergency import EXIT_PEER_NODE, ExitPolicy
from preemptible.errors import PreemptibleError
from preemptible.events import Event, ExitReason, SaveReason
from preemptible.journal import Record
from preemptible.sources import detect
from preemptible.store import layout
from preemptible.store.io import storage_for
from preemptible.store.roots import is_url, local_path

if TYPE_CHECKING:
    from preemptible.testing.nodes import Cluster, Node, NodeEmulator

MIN_NODES, MAX_NODES = 2, 4
"""How many nodes a drill simulates: one node is the drill without ``--nodes``; past 4, one machine's CPUs run
too many agents and ranks to rehearse anything real."""
NODE_SOURCES = ("aws",)
"""The sources a multi-node drill serves (a notice to one node, through that node's own emulator)."""
MAX_RESTARTS = 3
RDZV_ID = "preemptible-drill"
FIRST_SAVE = "first-save"
"""The moment of the notice by default: once the run's first checkpoint has committed."""
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?$")
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_POLL_S = 0.05


def nodes_problem(
    nodes: int, *, source: str, reference: bool, kill: bool, at: float | str | None, root: str | None
) -> str | None:
    """Why a drill of ``nodes`` simulated nodes cannot run with these options (expected, found, what to do), or
    None. The machine's part (root, namespaces) is `namespaces_problem`."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not MIN_NODES <= nodes <= MAX_NODES:
        return (
            f"expected --nodes from {MIN_NODES} to {MAX_NODES}, found {nodes!r}: drop --nodes for a drill of one "
            f"node; more than {MAX_NODES} simulated nodes (each a torchrun agent and its ranks) are more than one "
            "machine rehearses"
        )
    if source not in NODE_SOURCES:
        return (
            f"expected --source {' or '.join(NODE_SOURCES)} with --nodes (a multi-node drill serves an AWS spot "
            f"notice to one node, through that node's own emulator); found --source {source}. Use --source aws, "
            f"or drop --nodes to drill {source} on one node"
        )
    if reference or kill:
        flag = "--reference" if reference else "--kill"
        return f"expected --nodes without {flag}, found both: a multi-node drill does not {flag[2:]} yet; drop one"
    if at == relay.MID_EPOCH:
        return (
            f"expected --at SECONDS or random with --nodes, found --at {relay.MID_EPOCH} (a multi-node drill does "
            "not aim at an epoch's middle); give seconds, or leave --at out for the first checkpoint"
        )
    if root is not None and is_url(root):
        return (
            f"expected --root to be a directory of this machine with --nodes (the simulated nodes share its files "
            f"and reach no network outside the drill's namespaces), found the URL {root!r}: drill with a local root"
        )
    return None


def namespaces_problem() -> str | None:
    """Why the simulated nodes cannot be made here (the reason and what to do), or None."""
    from preemptible.testing.nodes import unavailable

    why = unavailable()
    if why is None:
        return None
    return (
        f"expected to simulate the nodes in network namespaces; found that they cannot be made here: {why}. Run the "
        "drill as root on Linux with unshare, nsenter and ip (util-linux, iproute2), e.g. in a container started "
        "with --cap-add NET_ADMIN --cap-add SYS_ADMIN, or drop --nodes for a single-node drill"
    )


def torchrun_parts(command: Sequence[str]) -> tuple[str, list[str], list[str]]:
    """How torchrun runs ``command`` on each node: (the interpreter that runs torchrun and so its ranks, torchrun's
    own options, the script and its arguments).

    ``python SCRIPT ARGS`` (any ``python``, ``python3.11`` or a path to one; ``-u`` is dropped, torchrun's ranks
    run unbuffered already) runs ``SCRIPT ARGS`` under that interpreter; ``python -m MODULE ARGS`` runs it with
    ``--module``; another executable runs as given with ``--no-python`` (a wrapper must ``exec`` python, so that
    its rank is the agent's child).

    Raises:
        PreemptibleError: a command torchrun cannot take this way (torchrun itself, ``python -c``, other
            interpreter options), saying what to give instead.
    """
    argv = list(command)
    if not argv:
        raise PreemptibleError("expected a command after '--' (e.g. preemptible drill --nodes 2 -- python train.py)")
    name = os.path.basename(argv[0])
    if name in _TORCHRUN or any(m in argv[1:3] for m in _TORCHRUN):
        raise PreemptibleError(
            f"expected the training command itself with --nodes, found torchrun ({shlex.join(argv)}): the drill "
            "starts one torchrun agent per simulated node; give what torchrun would run, e.g. -- python train.py ARGS"
        )
    if not _PYTHON.match(name):
        return sys.executable, ["--no-python"], argv
    python = argv[0] if os.sep in argv[0] else shutil.which(argv[0]) or argv[0]
    rest = argv[1:]
    while rest[:1] == ["-u"]:
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return python, ["--module"], rest[1:]
    if not rest or rest[0].startswith("-"):
        found = f"the interpreter option {rest[0]}" if rest else "no script"
        raise PreemptibleError(
            f"expected `python SCRIPT ARGS...` or `python -m MODULE ARGS...` after -- with --nodes, found {found} "
            f"({shlex.join(argv)}): torchrun passes no interpreter options to its ranks; put them in the "
            "environment (PYTHONWARNINGS=..., PYTHONOPTIMIZE=1) or in a wrapper script that execs python"
        )
    return python, [], rest


class _Agent(Exits):
    """One node's torchrun agent, its output in files of the drill's own (a node's scratch dies with it)."""

    def __init__(
        self, node: Node, argv: list[str], *, env: dict[str, str], logs: Path, label: str, clock: Callable[[], float]
    ) -> None:
        self.node = node
        self.label = label
        self._clock = clock
        self.out = logs / f"node{node.index}.{label}.log"
        with self.out.open("wb") as out:
            self.proc = node.popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.started = clock()
        self.code: int | None = None
        self.exited_at: float | None = None

    def tail(self, n: int = 12) -> str:
        try:
            lines = self.out.read_bytes().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def describe(self) -> str:
        code = self.poll()
        return "running" if code is None else f"exited {code}"


class _Stop:
    """What the ranks of one attempt journaled when a notice stopped them."""

    def __init__(self, ranks: dict[int, list[Record]]) -> None:
        self.ranks = ranks
        self.exits = {r: _last(ev, Event.EXIT) for r, ev in ranks.items()}
        self.notices = {r: _first(ev, Event.NOTICE) for r, ev in ranks.items()}
        self.commits = {
            r: [e for e in ev if e.event == Event.SAVE_COMMITTED and e.get("reason") == SaveReason.EMERGENCY]
            for r, ev in ranks.items()
        }

    def steps(self) -> set[int | None]:
        return {e.step if e is not None else None for e in self.exits.values()}

    def all_exited(self) -> bool:
        return bool(self.exits) and all(e is not None for e in self.exits.values())


def _stamp(t: float) -> str:
    """The start of the name of a journal file begun at ``t`` (`preemptible.journal.Journal` names them so)."""
    return layout.now_iso(t).replace("-", "").replace(":", "")


def _read_journal(path: Path) -> list[Record]:
    """One journal file's events (a line still being written is left for the next read)."""
    out = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            fields = json.loads(line)
        except ValueError:
            continue
        if isinstance(fields, dict):
            out.append(Record.of({**fields, "file": path.name}))
    return out


def _first(events: list[Record], event: Event) -> Record | None:
    return next((e for e in events if e.event == event), None)


def _last(events: list[Record], event: Event) -> Record | None:
    found = [e for e in events if e.event == event]
    return found[-1] if found else None


class DrillSettings(Protocol):
    """What the multi-node drill takes of a `preemptible.drill.Drill`: its clocks, its progress lines, the source
    and the window."""

    command: list[str]
    source: str
    window: float
    at: Any
    root: str | None
    nodes: int | None
    start_timeout: float
    finish_timeout: float
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    sleep: Callable[[float], None]
    progress: Callable[[str], None]


class NodesDrill:
    """Scenario 1 on ``drill.nodes`` simulated nodes (see the module's docstring); `run` returns the report."""

    def __init__(self, drill: DrillSettings) -> None:
        assert drill.nodes is not None
        self.d = drill
        self.n = drill.nodes
        self.python, self.options, self.script = torchrun_parts(drill.command)
        self.since = time.time() - 1.0  # journal times are the wall clock's: files of this drill start after it
        self.root: str | None = drill.root
        self.workdir = Path()
        self.agents: dict[int, _Agent] = {}
        self.emulators: dict[int, NodeEmulator] = {}
        self.where: dict[int, int] = {}
        """rank -> node, of the attempt that started the job."""
        self.endpoint = ""
        self.env: dict[str, str] = {}

    # set-up -------------------------------------------------------------------------------------------------
    def _base_env(self) -> dict[str, str]:
        drop = (relay.NOTICE_FILE_ENV, relay.REPORT_FILE_ENV, relay.AIM_ENV, "PREEMPTIBLE_ROOT")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(PYTHONUNBUFFERED="1", LOGLEVEL="INFO")  # the agents' INFO lines name their restarts
        return env

    def _emulator(self, node: Node) -> NodeEmulator:
        from preemptible.testing.nodes import NodeEmulator, node_env

        emulator = NodeEmulator(node, self.d.source, env=node_env(node, self.env))
        self.emulators[node.index] = emulator
        return emulator

    def _launch(self, cluster: Cluster, node: Node, label: str) -> _Agent:
        from preemptible.testing.nodes import node_env, torchrun_argv

        emulator = self.emulators[node.index]
        argv = torchrun_argv(
            node,
            endpoint=self.endpoint,
            rdzv_id=RDZV_ID,
            nnodes=f"{self.n}:{self.n}",
            hosts_store=node.index == 1,
            script=self.script,
            max_restarts=MAX_RESTARTS,
            python=self.python,
            options=self.options,
        )
        env = node_env(
            node,
            self.env,
            **{
                detect.SOURCES_ENV: f"signal,{self.d.source}",
                "PREEMPTIBLE_AWS_ENDPOINT": emulator.url,
                relay.REPORT_FILE_ENV: str(self.workdir / f"node{node.index}.{label}.report.json"),
            },
        )
        self.d.progress(f"drill: starting torchrun on node {node.index} ({node.addr}, {label}): {shlex.join(argv)}")
        agent = _Agent(node, argv, env=env, logs=self.workdir, label=label, clock=self.d.clock)
        self.agents[node.index] = agent
        return agent

    # reading what the ranks did -----------------------------------------------------------------------------
    def _reports(self) -> list[dict[str, Any]]:
        """The report files rank 0 writes (one per agent launch; only rank 0's node has one)."""
        docs = []
        for path in sorted(self.workdir.glob("*.report.json")):
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(path.read_text())
                if isinstance(doc, dict):
                    docs.append(doc)
        return docs

    def _journal(self, after: float, before: float | None = None) -> dict[int, list[Record]]:
        """Each rank's events, from its journal files started in [after, before) (wall-clock seconds): only those
        files are read (their names are their start times), however long the root's history."""
        if self.root is None:
            return {}
        directory = Path(local_path(self.root)) / layout.JOURNAL_DIR
        low = _stamp(after)
        high = _stamp(before) if before is not None else None
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl") and n >= low)
        except OSError:
            return {}
        ranks: dict[int, list[Record]] = {}
        for name in names:
            if high is not None and name >= high:
                break
            events = _read_journal(directory / name)
            start = _first(events, Event.START)
            if start is not None and start.rank is not None:
                ranks.setdefault(start.rank, []).extend(events)
        return ranks

    @staticmethod
    def _world(ranks: dict[int, list[Record]]) -> int | None:
        sizes = {s.get("world_size") for ev in ranks.values() if (s := _first(ev, Event.START)) is not None}
        return sizes.pop() if len(sizes) == 1 and isinstance(next(iter(sizes)), int) else None

    def _entered(self, ranks: dict[int, list[Record]]) -> bool:
        world = self._world(ranks)
        return (
            world is not None
            and sorted(ranks) == list(range(world))
            and all(any(e.event in (Event.FRESH, Event.RESUME) for e in ev) for ev in ranks.values())
        )

    def _place(self, cluster: Cluster, ranks: dict[int, list[Record]]) -> dict[int, int]:
        """rank -> node, by the network namespace of each rank's process (while it runs)."""
        from preemptible.testing.nodes import netns_of

        nodes = {n.netns: n.index for n in cluster}
        where = {}
        for rank, events in ranks.items():
            start = _first(events, Event.START)
            pid = start.get("pid") if start is not None else None
            if isinstance(pid, int):
                with contextlib.suppress(OSError):
                    if netns_of(pid) in nodes:
                        where[rank] = nodes[netns_of(pid)]
        return where

    def _wait(self, predicate: Callable[[], Any], timeout: float) -> Any:
        end = self.d.monotonic() + timeout
        while True:
            got = predicate()
            if got or self.d.monotonic() >= end:
                return got
            self.d.sleep(_POLL_S)

    def _exited(self) -> int | None:
        """The first node whose agent has exited, or None."""
        return next((i for i, a in sorted(self.agents.items()) if a.poll() is not None), None)

    def _tails(self) -> str:
        return "\n".join(f"node {i} agent ({a.describe()}):\n{a.tail()}" for i, a in sorted(self.agents.items()))

    # the drill ----------------------------------------------------------------------------------------------
    def run(self) -> DrillReport:
        from preemptible.testing.nodes import Cluster, NamespacesUnavailable

        d = self.d
        report = DrillReport(d.source, d.window, d.command, root=d.root)
        report.node_count = self.n
        self.workdir = Path(tempfile.mkdtemp(prefix="preemptible-drill-nodes-"))
        self.env = self._base_env()
        try:
            try:
                cluster = Cluster(self.n, self.workdir / "cluster")
            except (NamespacesUnavailable, OSError) as e:
                report.check("the simulated nodes came up", False, f"{e}; {namespaces_problem() or ''}".rstrip("; "))
                return report
            with cluster:
                d.progress(
                    f"drill: {self.n} simulated nodes in network namespaces, 10.77.0.1 to 10.77.0.{self.n}; "
                    "node 1 hosts the rendezvous store"
                )
                self._scenario(report, cluster)
                for agent in self.agents.values():  # those still waiting in the rendezvous leave it
                    if agent.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(agent.proc.pid, signal.SIGTERM)
                self._wait(lambda: all(a.poll() is not None for a in self.agents.values()), 30)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return report

    def _scenario(self, report: DrillReport, cluster: Cluster) -> None:
        d = self.d
        last = cluster.node(self.n)
        try:
            self.endpoint = f"{cluster.node(1).addr}:{cluster.node(1).free_port()}"
            for node in cluster:
                self._emulator(node)
        except RuntimeError as e:
            report.check("the simulated nodes came up", False, str(e))
            return
        for node in cluster:
            self._launch(cluster, node, "first")
        first = self._first_attempt(report, cluster)
        if first is None or not self._await_moment(report, first):
            return
        stop = self._reclaim(report, cluster, last.index)
        if stop is None:
            return
        self.d.progress(f"drill: node {last.index} goes; a replacement comes up at {last.addr}")
        replacement = cluster.replace(last.index)
        self._emulator(replacement)
        t_restart = d.clock()
        self._launch(cluster, replacement, "replacement")
        if not self._resumed(report, cluster, stop, t_restart):
            return
        self._second_notice(report, last.index, t_restart)

    def _first_attempt(self, report: DrillReport, cluster: Cluster) -> dict[int, list[Record]] | None:
        """Waits for every rank's Run to enter the loop; their events, or None (a failed check)."""
        d = self.d

        def entered() -> bool:
            if self.root is None:
                docs = [doc for doc in self._reports() if isinstance(doc.get("root"), str)]
                self.root = docs[0]["root"] if docs else None
            if self.root is not None and is_url(self.root):
                return True
            return self._entered(self._journal(self.since)) or self._exited() is not None

        self._wait(entered, d.start_timeout)
        report.root = self.root
        if self.root is not None and is_url(self.root):
            report.check(
                "the checkpoint root is shared by the nodes",
                False,
                f"expected a directory of this machine (the simulated nodes share its files and reach no network "
                f"outside the drill's namespaces), found {self.root!r}: drill with a local root (--root or the "
                "command's own)",
            )
            return None
        ranks = self._journal(self.since)
        if not self._entered(ranks):
            exited = self._exited()
            why = (
                f"node {exited}'s agent exited {self.agents[exited].code} before every rank's Run entered the loop"
                if exited is not None
                else f"not every rank's Run entered the loop within {d.start_timeout:g} s"
            )
            if self.root is None:
                why += (
                    f"; no Run reported through ${relay.REPORT_FILE_ENV} (expected the command to train with "
                    "preemptible.Run under torchrun)"
                )
            report.check(
                "the command's Run started on every node", False, f"{why}; the agents' output:\n{self._tails()}"
            )
            return None
        self.where = self._place(cluster, ranks)
        world = self._world(ranks)
        placed = ", ".join(f"rank {r} on node {self.where.get(r, '?')}" for r in sorted(ranks))
        report.check(
            "the command's Run started on every node",
            sorted(set(self.where.values())) == list(range(1, self.n + 1)),
            f"{world} ranks ({placed}), root {self.root}",
        )
        return ranks if report.checks[-1].passed else None

    def _await_moment(self, report: DrillReport, ranks: dict[int, list[Record]]) -> bool:
        """Waits for the first checkpoint to commit, or ``--at`` seconds into the loop. False (a failed check) when
        the job ended or an agent exited first."""
        d = self.d
        if d.at is None:
            d.progress("drill: waiting for the first checkpoint to commit (--at SECONDS to give a time instead)")

            def first_save() -> Record | None:
                saves = [e for e in self._journal(self.since).get(0, []) if e.event == Event.SAVE_COMMITTED]
                return saves[0] if saves else None

            self._wait(lambda: first_save() is not None or self._exited() is not None, d.finish_timeout)
            save = first_save()
            if save is not None and self._exited() is None:
                report.moment = {"aim": FIRST_SAVE, "step": save.step}
                return True
            what = f"its first checkpoint (step {save.step}) committed" if save is not None else "any checkpoint"
            report.check(
                "the run is still training when the notice comes",
                False,
                f"an agent exited before {what} (within {d.finish_timeout:g} s); expected the job to train on and "
                "save: save periodically (save_every=...), or give --at SECONDS; the agents' output:\n" + self._tails(),
            )
            return False
        delay = random.uniform(1.0, 10.0) if d.at == "random" else float(d.at)
        report.moment = {"aim": "seconds", "at_s": round(delay, 3)}
        d.sleep(delay)
        if self._exited() is None:
            return True
        report.check(
            "the run is still training when the notice comes",
            False,
            f"an agent exited before the notice {delay:g} s into the loop: deliver it earlier (a smaller --at) or "
            "make the run longer; the agents' output:\n" + self._tails(),
        )
        return False

    def _notice(self, report: DrillReport, node: int, check: str) -> bool:
        """Has node ``node``'s emulator announce the notice; False (a failed ``check``) when it would not."""
        try:
            self.emulators[node].notice()
        except (RuntimeError, subprocess.SubprocessError) as e:
            report.check(check, False, f"{e}; the agents' output:\n{self._tails()}")
            return False
        return True

    def _reclaim(self, report: DrillReport, cluster: Cluster, last: int) -> int | None:
        """Serves the notice to node ``last`` and grades the stop; the emergency checkpoint's step, or None."""
        d = self.d
        t_notice = d.clock()
        if not self._notice(report, last, "the notice reached every rank"):
            return None
        d.progress(f"drill: node {last}'s {d.source} emulator now announces the notice (node {last} only)")
        reclaimed = self.agents[last]
        self._wait(lambda: reclaimed.poll() is not None, d.window + SLACK_S)
        code = reclaimed.code
        ranks = self._journal(self.since, t_notice)
        self._wait(lambda: _Stop(self._journal(self.since, t_notice)).all_exited(), SLACK_S)
        stopped = _Stop(self._journal(self.since, t_notice))
        if code is None and not stopped.all_exited():
            report.check(
                "every rank stopped after the notice",
                False,
                f"still running {d.window + SLACK_S:g} s after it; last events: "
                + "; ".join(f"rank {r}: {ev[-1].name} at step {ev[-1].step}" for r, ev in sorted(ranks.items()) if ev)
                + "\nthe agents' output:\n"
                + self._tails(),
            )
            return None
        survivors = [i for i in self.agents if i != last]
        alive = {i: self.agents[i].poll() is None for i in survivors}
        self._timings(report, stopped, t_notice, reclaimed)

        noticed = {r: n for r, n in stopped.notices.items() if n is not None}
        sources = sorted({str(n.get("source")) for n in noticed.values()})
        report.check(
            "the notice reached every rank",
            len(noticed) == len(stopped.ranks) and sources == [d.source],
            f"{len(noticed)} of {len(stopped.ranks)} ranks journaled it ({', '.join(sources) or 'no source'}); "
            + (str(next(iter(noticed.values())).get("detail")) if noticed else ""),
        )
        steps = stopped.steps()
        step = next(iter(steps)) if len(steps) == 1 else None
        reasons = {str(e.get("reason")) for e in stopped.exits.values() if e is not None}
        report.check(
            "every rank stopped at one step",
            step is not None and reasons == {ExitReason.NOTICE.value},
            f"step {step}"
            if step is not None
            else "exits at steps "
            + ", ".join(f"rank {r}: {e.step if e else 'none'}" for r, e in stopped.exits.items()),
        )
        commit_steps = {e.step for evs in stopped.commits.values() for e in evs}
        committed = step is not None and on_storage(self.root, step)
        newest = newest_committed(self.root)
        report.checkpoint_step = step
        report.check(
            "one emergency checkpoint committed",
            commit_steps == {step} and committed and newest == step,
            f"step {step}, committed on storage by {len(stopped.commits)} ranks"
            if commit_steps == {step} and committed and newest == step
            else f"emergency commits at steps {sorted(s for s in commit_steps if s is not None) or 'none'}; "
            f"on storage: {committed}; newest committed: {newest} (expected one, at step {step})",
        )
        self._roles(report, cluster, stopped, last=last, reclaimed=reclaimed, alive=alive)
        return step if report.passed else None

    def _timings(self, report: DrillReport, stopped: _Stop, t_notice: float, reclaimed: _Agent) -> None:
        notices = [event_time(n) for n in stopped.notices.values() if n is not None and n.time is not None]
        commits = [event_time(e) for r, evs in stopped.commits.items() for e in evs if r == 0 and e.time is not None]
        if notices:
            report.timings["notice_to_boundary_s"] = round(min(notices) - t_notice, 3)
        if commits:
            report.timings["notice_to_commit_s"] = round(commits[-1] - t_notice, 3)
        if reclaimed.exited_at is not None:
            report.timings["notice_to_exit_s"] = round(reclaimed.exited_at - t_notice, 3)

    def _roles(
        self,
        report: DrillReport,
        cluster: Cluster,
        stopped: _Stop,
        *,
        last: int,
        reclaimed: _Agent,
        alive: dict[int, bool],
    ) -> None:
        """The exit codes node by node: the reclaimed node's ranks the platform's, the others' 76, and what each
        agent did."""
        platform = ExitPolicy().code_after_notice(detect.detect_platform(self.env).exit_code)
        codes: dict[int, dict[int, Any]] = {i: {} for i in range(1, self.n + 1)}
        roles: dict[int, set[str]] = {i: set() for i in range(1, self.n + 1)}
        for rank, e in stopped.exits.items():
            at = self.where.get(rank)
            if at is not None and e is not None:
                codes[at][rank] = e.get("code")
                roles[at].add(str(e.get("role")))
        ours = codes[last]
        as_expected = bool(ours) and set(ours.values()) == {platform} and roles[last] == {"reclaimed"}
        exits = f"node {last}: " + (", ".join(f"rank {r} exit {c}" for r, c in sorted(ours.items())) or "no exit")
        report.check(
            "the reclaimed node's ranks exited with the platform's code",
            as_expected,
            f"{exits} (role reclaimed)"
            if as_expected
            else f"{exits}, role {', '.join(sorted(roles[last])) or 'none'}; expected exit {platform} (the platform's "
            "code) with the role reclaimed",
        )
        left = reclaimed.code is not None and reclaimed.code != 0
        report.check(
            "the reclaimed node's agent left the rendezvous open",
            left,
            f"agent exited {reclaimed.code}: ended by its rank's SIGTERM, as a reclaimed VM's agent is, so it did not "
            "close the rendezvous"
            if left
            else (
                "agent exited 0: it finished as if the job were done and closed the rendezvous for every node; "
                "expected its rank to SIGTERM it (the rank must be the agent's own child: a wrapper must exec python)"
                if reclaimed.code == 0
                else "agent still running"
            ),
        )
        within = report.timings.get("notice_to_exit_s")
        report.check(
            "exit within the window",
            within is not None and within <= self.d.window,
            f"{within:.2f} s of {self.d.window:g} s" if within is not None else "the reclaimed node never exited",
        )
        others = {i: c for i, c in codes.items() if i != last}
        peer = all(c and set(c.values()) == {EXIT_PEER_NODE} and roles[i] == {"survivor"} for i, c in others.items())
        report.check(
            "the other nodes' ranks exited 76 and their agents restart",
            peer and all(alive.values()),
            "; ".join(
                f"node {i}: "
                + ", ".join(f"rank {r} exit {c}" for r, c in sorted(codes[i].items()))
                + f", agent {'alive, restarting' if alive[i] else self.agents[i].describe()}"
                for i in sorted(others)
            )
            + (
                ""
                if peer and all(alive.values())
                else f" (expected exit {EXIT_PEER_NODE}, EXIT_PEER_NODE, and an agent that restarts its ranks "
                f"itself: torchrun --max-restarts {MAX_RESTARTS})"
            ),
        )
        for node in cluster:
            i = node.index
            agent = self.agents[i]
            ranks = ", ".join(f"rank {r} exit {c}" for r, c in sorted(codes[i].items())) or "no exit journaled"
            if i == last:
                what = f"agent exited {agent.code} (left the rendezvous); replaced"
            else:
                what = "agent alive, restarting" if alive[i] else f"agent {agent.describe()}"
            report.nodes.append(
                {
                    "node": i,
                    "addr": node.addr,
                    "hosts_store": i == 1,
                    "role": "/".join(sorted(roles[i])) or None,
                    "ranks": [{"rank": r, "code": c} for r, c in sorted(codes[i].items())],
                    "agent_exit": agent.code if i == last else None,
                    "replaced": i == last,
                    "detail": f"{ranks}; {what}",
                }
            )

    def _resumed(self, report: DrillReport, cluster: Cluster, stop: int, t_restart: float) -> bool:
        """Waits for every rank to resume with the replacement; checks the step, the size and the agents."""
        d = self.d
        last = self.agents[self.n]

        self._wait(lambda: self._entered(self._journal(t_restart)) or self._exited() is not None, d.start_timeout)
        ranks = self._journal(t_restart)
        if not self._entered(ranks):
            ranks = {}
        resumes = {r: _first(ev, Event.RESUME) for r, ev in ranks.items()}
        steps = {e.step if e is not None else None for e in resumes.values()}
        report.resumed_step = next(iter(steps)) if len(steps) == 1 else None
        times = [event_time(e) for e in resumes.values() if e is not None and e.time is not None]
        if times:
            report.timings["restart_to_resumed_s"] = round(max(times) - t_restart, 3)
        lost = self._steps_lost(stop)
        report.steps_lost = lost
        where = self._place(cluster, ranks) if ranks else {}
        world = self._world(ranks)
        ok = bool(ranks) and steps == {stop} and world == self.n and lost == 0
        on_last = [r for r, i in where.items() if i == self.n]
        if ok:
            tiers = sorted({str(e.get("tier")) for e in resumes.values() if e is not None and e.get("tier")})
            source = f" from the {' and '.join(tiers)} tier" if tiers else ""
            detail = (
                f"every rank resumed at step {stop}{source} (world size {world}, rank {', '.join(map(str, on_last))} "
                f"on the replacement node {self.n}); {lost} steps lost"
            )
        elif not ranks:
            detail = (
                f"not every rank resumed within {d.start_timeout:g} s of the replacement's start; expected the "
                "surviving agents to take the replacement into their restart; the agents' output:\n" + self._tails()
            )
        else:
            detail = (
                f"expected every rank to resume at step {stop} with world size {self.n} and no step lost; found "
                f"steps {sorted(s for s in steps if s is not None) or 'none'} (fresh starts: "
                f"{sum(1 for e in resumes.values() if e is None)}), world size {world}, steps lost {lost}"
            )
        report.check("the job resumed from the emergency checkpoint with the replacement", ok, detail)
        relaunched = [i for i, a in self.agents.items() if i != self.n and a.poll() is not None]
        survivors = ("node " if self.n == 2 else "nodes ") + ", ".join(str(i) for i in range(1, self.n))
        if relaunched:
            detail = f"node {', '.join(map(str, relaunched))}'s agent exited; expected it to restart its ranks itself"
        elif not ranks:
            detail = f"no resumed ranks; the agents of {survivors} are still running"
        else:
            detail = f"the agents of {survivors}, never relaunched, ran the resumed ranks"
        report.check(
            "the surviving agents restarted the job themselves",
            not relaunched and last.poll() is None and bool(ranks),
            detail,
        )
        return report.passed

    def _steps_lost(self, stop: int) -> int | None:
        """Steps redone after the stop at ``stop``, as ``preemptible report`` counts them from the journal."""
        from preemptible import report as report_module

        try:
            doc = report_module.report(storage_for(local_path(self.root or "")))
        except Exception:
            return None
        found = [p for p in doc.get("preemptions", []) if p.get("step") == stop]
        lost = found[-1].get("steps_lost") if found else None
        return lost if isinstance(lost, int) else None

    def _second_notice(self, report: DrillReport, last: int, t_restart: float) -> None:
        """The single-node drill's step 6: another notice to the last node stops the resumed job."""
        d = self.d
        name = "a second notice stops the resumed job"
        d.sleep(1.0)
        if all(a.poll() is not None for a in self.agents.values()):
            ended = {i: a.code for i, a in self.agents.items()}
            report.check(name, set(ended.values()) == {0}, f"it had already ended: agents exited {ended}")
            return
        t_notice = d.clock()
        if not self._notice(report, last, name):
            return
        d.progress(f"drill: node {last}'s {d.source} emulator announces a second notice")
        self._wait(lambda: _Stop(self._journal(t_restart)).all_exited(), d.window + SLACK_S)
        stopped = _Stop(self._journal(t_restart))
        steps = stopped.steps()
        step = next(iter(steps)) if len(steps) == 1 else None
        saved = all(e is not None and e.get("saved") is True for e in stopped.exits.values())
        ok = stopped.all_exited() and step is not None and saved and on_storage(self.root, step)
        codes = ", ".join(
            f"rank {r} exit {e.get('code')} ({e.get('role')})"
            for r, e in sorted(stopped.exits.items())
            if e is not None
        )
        report.check(
            name,
            ok,
            f"every rank at step {step}, saved and committed; {codes}"
            if ok
            else f"expected every rank to stop at one step with a committed save; found {codes or 'no exits'} "
            f"{d.clock() - t_notice:.0f} s after it; the agents' output:\n" + self._tails(),
        )
