"""Several simulated nodes on one machine, each in a network namespace of its own, for multi-node tests and drills.

Why namespaces: a multi-node job must be cut off, lose a node and get a replacement, with every packet kept off
the machine's real network. A `Cluster` makes one *outer* network namespace (the test's own: a bridge and nothing
else, no default route), and one namespace per node whose veth hangs off that bridge, with the address
``10.77.0.<i>/24`` and its own ``lo``. Shared services (an S3 server standing for the durable root) listen on the
bridge's own address, `SERVICES` (``10.77.0.254``), in the outer namespace (`Cluster.serve`). Those addresses
exist only inside namespaces the cluster created: the machine's initial namespace never sees them, has no route
to them and no interface, route, firewall rule or sysctl of it is touched, so a packet to ``10.77.0.x`` cannot
leave the test's namespaces, and a packet to any other address finds no route (there is none but the subnet's).
``127.0.0.1`` inside a node is that node's own loopback (where its metadata emulator listens), not the machine's.

Each namespace is held by a tiny holder process (``unshare --net`` running a shell that waits on its stdin): the
namespace vanishes when its holder and every process inside have ended, and a holder ends by itself when the
cluster's process dies (its stdin closes). Processes enter a node with ``nsenter --net=/proc/<holder>/ns/net``.
`Cluster.cut` sets the node's veth down in the outer namespace (all of its traffic stops, both ways, while its
processes keep running); `Cluster.heal` sets it up. `Cluster.down` is the node going: every process in its
namespace SIGKILLed, its scratch directory (its local disk) deleted; `Cluster.replace` brings a fresh node with
the same address. Needs root, ``unshare``, ``nsenter`` and ``ip`` (iproute2); without them `NamespacesUnavailable`
says what is missing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

SUBNET = ipaddress.ip_network("10.77.0.0/24")
"""The nodes' subnet: addresses only inside the cluster's namespaces (see the module's docstring)."""

SERVICES = str(SUBNET.network_address + 254)
"""The address of the cluster's shared services (an object store standing for S3): on the bridge, in the test's
outer namespace, so every node reaches it through its own link, and a cut node does not (`Cluster.cut`)."""

TOOLS = ("unshare", "nsenter", "ip", "mount")


class NamespacesUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, not Linux, or a tool missing); the reason says which."""


def unavailable() -> str | None:
    """Why a `Cluster` cannot be made on this machine, or None when it can (checked without making one)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, found {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (run the multi-node tests as root, as CI does)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (Debian: util-linux, mount and iproute2)"
    return None


def netns_of(pid: int) -> str:
    """The network namespace of ``pid`` (``net:[inode]``)."""
    return os.readlink(f"/proc/{pid}/ns/net")


@dataclass(frozen=True)
class Socket:
    """One TCP socket of a namespace's table (``/proc/<pid>/net/tcp`` or ``tcp6``)."""

    local: ipaddress.IPv4Address | ipaddress.IPv6Address
    local_port: int
    remote: ipaddress.IPv4Address | ipaddress.IPv6Address
    remote_port: int
    listening: bool

    def allowed(self) -> bool:
        """Both ends on loopback or in `SUBNET`; a socket without a peer (listening, or bound only) may have the
        wildcard address."""
        if self.remote.is_unspecified:
            return self.local.is_unspecified or _inside(self.local)
        return _inside(self.local) and _inside(self.remote)


def _inside(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback or addr in SUBNET


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as the kernel prints it: 32-bit words in the host's byte order."""
    raw = bytes.fromhex(hex_addr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def parse_tcp(text: str) -> list[Socket]:
    """The sockets of a ``/proc/net/tcp`` or ``tcp6`` table."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        (local, lport), (remote, rport) = (f.split(":") for f in fields[1:3])
        out.append(
            Socket(
                local=_address(local),
                local_port=int(lport, 16),
                remote=_address(remote),
                remote_port=int(rport, 16),
                listening=fields[3] == "0A",
            )
        )
    return out


def sockets_of(pid: int) -> list[Socket]:
    """Every TCP socket of the network namespace of ``pid`` (IPv4 and IPv6); empty if the process is gone."""
    out = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            out += parse_tcp(Path(f"/proc/{pid}/net/{table}").read_text())
    return out


def pids_in(netns: str) -> list[int]:
    """Every process whose network namespace is ``netns``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") == netns:
                    out.append(int(entry))
    return out


class _Holder:
    """A process holding a new network namespace open until it ends."""

    def __init__(self, memory: Path | None = None) -> None:
        # memory: a tmpfs mounted there in a mount namespace of the node's own (its memory tier: no other node,
        # nor the test's own namespace, sees what the node writes there; it goes with the node)
        script = "echo ready; read _"
        argv = ["unshare", "--net", "--"]
        if memory is not None:
            argv = ["unshare", "--net", "--mount", "--propagation", "private", "--"]
            script = f"mount -t tmpfs -o size=8g,mode=0700 preemptible-memory {shlex.quote(str(memory))} && {script}"
        self.mount = memory is not None
        self.proc = subprocess.Popen(
            [*argv, "sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # printed after unshare(2): the namespace exists
        if line.strip() != "ready":
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise NamespacesUnavailable(f"unshare --net failed: {err.strip() or 'no output'}")
        self.pid = self.proc.pid
        self.netns = netns_of(self.pid)

    def enter(self, argv: Sequence[str]) -> list[str]:
        mount = [f"--mount=/proc/{self.pid}/ns/mnt"] if self.mount else []
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", *mount, "--", *argv]

    def popen(self, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this namespace, in a session of its own (the pid is argv's own)."""
        return subprocess.Popen(
            self.enter(argv), env=dict(env) if env is not None else None, start_new_session=True, **kwargs
        )

    def run(self, argv: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this namespace to its end, its output captured as text."""
        return subprocess.run(self.enter(argv), capture_output=True, text=True, timeout=timeout, check=False, **kwargs)

    def free_port(self, addr: str) -> int:
        """A port free on ``addr`` in this namespace now, chosen by its kernel (bind to port 0)."""
        code = f"import socket; s = socket.socket(); s.bind(({addr!r}, 0)); print(s.getsockname()[1])"
        done = self.run([sys.executable, "-c", code], timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"no free port on {addr} in {self.netns}: {done.stderr.strip()}")
        return int(done.stdout)

    def ip(self, commands: Sequence[str]) -> None:
        """Run ``ip`` commands (one per line of a batch) inside this namespace."""
        done = subprocess.run(
            self.enter(["ip", "-batch", "-"]),
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise NamespacesUnavailable(f"ip -batch failed in {self.netns}: {done.stderr.strip()}")

    def end(self) -> None:
        for pid in pids_in(self.netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.stdin:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


class Node:
    """One simulated node: its namespace, address, interface and scratch directory (its local disk)."""

    def __init__(self, cluster: Cluster, index: int, generation: int) -> None:
        self.index = index
        self.addr = str(SUBNET.network_address + index)
        self.ifname = f"e{index}"  # the node's interface, inside its namespace (GLOO_SOCKET_IFNAME)
        self.veth = f"v{index}n{generation}"  # its peer on the bridge (a replacement gets a new name)
        self.scratch = cluster.base / f"node{index}.{generation}"
        self.scratch.mkdir(parents=True)
        self.memory = self.scratch / "memory"
        """The node's memory tier (``$PREEMPTIBLE_MEMORY_DIR`` in `node_env`): a tmpfs only the node sees."""
        self.memory.mkdir()
        self.holder = _Holder(self.memory)
        self.procs: list[subprocess.Popen[Any]] = []

    @property
    def netns(self) -> str:
        return self.holder.netns

    def popen(self, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this node's namespace (``Popen`` keywords pass through; the pid is argv's own)."""
        proc = self.holder.popen(argv, env, **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this node's namespace to its end, its output captured as text."""
        return self.holder.run(argv, timeout, **kwargs)

    def free_port(self) -> int:
        """A port free on this node's addresses now, chosen by the node's kernel (bind to port 0)."""
        return self.holder.free_port("0.0.0.0")

    def pids(self) -> list[int]:
        """Every process now in this node's namespace (its holder included)."""
        return pids_in(self.netns)


class Cluster:
    """``nodes`` simulated nodes in network namespaces of their own, on one bridge (see the module's docstring).

    Args:
        nodes: how many (1..250); node ``i`` (from 1) has the address ``10.77.0.<i>``.
        base: a directory for the nodes' scratch directories (a test's ``tmp_path``).

    Raises:
        NamespacesUnavailable: the machine cannot make namespaces (the reason says why).
    """

    def __init__(self, nodes: int, base: Path) -> None:
        if not 1 <= nodes <= 250:
            raise ValueError(f"expected 1..250 nodes, found {nodes}")
        why = unavailable()
        if why:
            raise NamespacesUnavailable(why)
        self.base = Path(base)
        self.count = nodes
        self._nodes: dict[int, Node] = {}
        self._generation = 0
        self._services: list[subprocess.Popen[Any]] = []
        self.outer = _Holder()
        try:
            self.outer.ip(
                [
                    "link set lo up",
                    "link add br0 type bridge",
                    f"addr add {SERVICES}/{SUBNET.prefixlen} dev br0",
                    "link set br0 up",
                ]
            )
            for i in range(1, nodes + 1):
                self._bring_up(i)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def node(self, i: int) -> Node:
        return self._nodes[i]

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes[i] for i in sorted(self._nodes))

    def _bring_up(self, i: int) -> None:
        self._generation += 1
        node = Node(self, i, self._generation)
        self._nodes[i] = node
        veth = node.veth
        self.outer.ip(
            [
                f"link add {veth} type veth peer name {node.ifname} netns {node.holder.pid}",
                f"link set {veth} master br0",
                f"link set {veth} up",
            ]
        )
        node.holder.ip(
            [
                "link set lo up",
                f"addr add {node.addr}/{SUBNET.prefixlen} dev {node.ifname}",
                f"link set {node.ifname} up",
            ]
        )

    def cut(self, i: int) -> None:
        """Partition node ``i``: its link is down, so none of its traffic passes, either way; it keeps running."""
        self.outer.ip([f"link set {self._nodes[i].veth} down"])

    def heal(self, i: int) -> None:
        """Node ``i``'s link is up again. The neighbour entries that failed while it was cut are flushed on every side:
        left, they refuse the first connections for seconds with EHOSTUNREACH until the kernel probes again."""
        self.outer.ip([f"link set {self._nodes[i].veth} up", "neigh flush all"])
        for node in self._nodes.values():
            node.holder.ip(["neigh flush all"])

    def down(self, i: int) -> None:
        """Node ``i`` goes: every process in it SIGKILLed, its link removed, its scratch directory deleted."""
        node = self._nodes.pop(i)
        node.holder.end()
        for proc in node.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        with contextlib.suppress(NamespacesUnavailable):
            self.outer.ip([f"link del {node.veth}"])  # usually gone already, with its namespace
        shutil.rmtree(node.scratch, ignore_errors=True)

    def replace(self, i: int) -> Node:
        """Node ``i`` gone (if it was not) and a fresh one in its place: new namespace, same address, empty scratch."""
        if i in self._nodes:
            self.down(i)
        self._bring_up(i)
        return self._nodes[i]

    def serve(self, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a shared service (``argv``, listening on `SERVICES`) in the cluster's outer namespace; it ends
        with the cluster."""
        proc = self.outer.popen(argv, env, **kwargs)
        self._services.append(proc)
        return proc

    def run_outside(self, argv: Sequence[str], timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` to its end in the outer namespace (where `SERVICES` is reachable from the test's side)."""
        return self.outer.run(argv, timeout, **kwargs)

    def free_services_port(self) -> int:
        """A port free on `SERVICES` now, chosen by the kernel."""
        return self.outer.free_port(SERVICES)

    def pids(self) -> list[int]:
        """Every process in the cluster's namespaces (holders included)."""
        return [p for n in self for p in n.pids()] + pids_in(self.outer.netns)

    def close(self) -> None:
        """Kill everything in every node and end the namespaces."""
        for i in list(self._nodes):
            self.down(i)
        self.outer.end()  # its processes, the services among them, are SIGKILLed
        for proc in self._services:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


class NodeEmulator:
    """A cloud's metadata emulator (``python -m preemptible emulate CLOUD``) inside one node, listening on that
    node's own loopback: only the node's processes reach it, as only a VM reaches its own metadata service.

    Args:
        node: where it runs.
        cloud: ``aws``, ``gcp`` or ``azure``.
        env: its environment (default: this process's).

    Raises:
        RuntimeError: it did not say where it listens (its first line of output names the URL).
    """

    def __init__(self, node: Node, cloud: str = "aws", env: Mapping[str, str] | None = None) -> None:
        self.node = node
        self.cloud = cloud
        self.env = dict(env) if env is not None else None
        err_path = node.scratch / f"emulator-{cloud}.err"
        with err_path.open("w") as err:
            self.proc = node.popen(
                [sys.executable, "-m", "preemptible", "emulate", cloud],
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if "listening on http://127.0.0.1:" not in first:
            self.proc.kill()
            self.proc.wait()
            said = err_path.read_text().strip()[-500:] or "nothing on stderr"
            raise RuntimeError(
                f"expected the {cloud} emulator in node {node.index} to print 'listening on http://127.0.0.1:PORT'; "
                f"found {first.strip()!r} (exit {self.proc.returncode}: {said})"
            )
        self.url = first.split("listening on ", 1)[1].strip()
        """Its address as the node's processes reach it (the node's own ``127.0.0.1``)."""

    def notice(self) -> None:
        """Serve the cloud's termination notice from now on (a POST to its control path, made inside the node).

        Raises:
            RuntimeError: the emulator did not take it (its answer, or the error, says why).
        """
        done = self.node.run([sys.executable, "-c", _POST, f"{self.url}/_emulator/notice"], env=self.env)
        if done.returncode != 0:
            raise RuntimeError(
                f"expected the {self.cloud} emulator of node {self.node.index} to take the notice; found: "
                f"{done.stderr.strip()[-500:]}"
            )


_POST = "import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], method='POST'))"


def torchrun_argv(
    node: Node,
    *,
    endpoint: str,
    rdzv_id: str,
    nnodes: str,
    hosts_store: bool,
    script: Sequence[str],
    nproc: int = 1,
    max_restarts: int = 0,
    python: str = sys.executable,
    rdzv_conf: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
) -> list[str]:
    """The command of node's torchrun agent: c10d rendezvous at ``endpoint`` (``10.77.0.<i>:<port>``), every
    address explicit (``--local-addr``, ``is_host``), so torch derives none from the machine's host name.
    ``rdzv_conf`` adds rendezvous settings (``join_timeout``, ``last_call_timeout``, ``read_timeout``);
    ``options``: more of torchrun's own options, put before the script (``--no-python``, ``--module``)."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--rdzv-conf",
        ",".join(
            [f"is_host={'true' if hosts_store else 'false'}", *(f"{k}={v}" for k, v in (rdzv_conf or {}).items())]
        ),
        "--local-addr",
        node.addr,
        "--max-restarts",
        str(max_restarts),
        *options,
        *script,
    ]


def node_env(node: Node, base: Mapping[str, str], **extra: str) -> dict[str, str]:
    """``base`` with the node's own network settings: gloo on the node's interface, no proxy, and the workers'
    store of each rendezvous round its own (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``).

    Why the last: by default the workers share the store of the agent that hosts the rendezvous, and the agent
    that stays rank 0 across an elastic restart keeps the store address of the first round without publishing it
    in the new one, so a replacement node waits for it forever (seen: ``wait timeout ... keys:
    /torch.rendezvous.job.1/MASTER_ADDR``). With the variable set, rank 0 of every round publishes a fresh store
    for that round's workers: a replacement joins, and no key of an earlier round is ever read."""
    env = {k: v for k, v in base.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update(GLOO_SOCKET_IFNAME=node.ifname, TP_SOCKET_IFNAME=node.ifname, NO_PROXY="*")
    env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PREEMPTIBLE_MEMORY_DIR=str(node.memory))
    env.update(extra)
    return env
