"""Rank and world helpers that degrade to "rank 0 of 1", and the stop-step agreement seam.

Every code path runs in one process too: without an initialised process group, and without torchrun's
``RANK``/``WORLD_SIZE`` variables, this is rank 0 of a world of 1.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Protocol, overload

from preemptible.errors import CoordinationError, RankFailures
from preemptible.store.io import Storage

log = logging.getLogger("preemptible")


def _dist_ready() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed support
        return False
    return bool(dist.is_available() and dist.is_initialized())


def rank() -> int:
    """This process's global rank (0 without a process group or launcher)."""
    if _dist_ready():
        import torch.distributed as dist

        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """The number of processes in the job (1 without a process group or launcher)."""
    if _dist_ready():
        import torch.distributed as dist

        return int(dist.get_world_size())
    return int(os.environ.get("WORLD_SIZE", "1"))


class Agreement(Protocol):
    """Decides, at a step boundary, whether this rank stops now.

    ``should_stop(completed, noticed)`` is called by the main thread with the number of completed steps and
    whether this rank knows of a notice. Every rank that returns True returns it at the same ``completed``.
    """

    def should_stop(self, completed: int, noticed: bool) -> bool: ...

    @property
    def stop_step(self) -> int | None: ...

    def close(self) -> None: ...


class LocalAgreement:
    """One process: stop at the first boundary after the notice."""

    def __init__(self) -> None:
        self._stop_step: int | None = None

    def should_stop(self, completed: int, noticed: bool) -> bool:
        if self._stop_step is None and noticed:
            self._stop_step = completed
        return self._stop_step is not None and completed >= self._stop_step

    @property
    def stop_step(self) -> int | None:
        return self._stop_step

    def close(self) -> None:
        pass


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def node() -> int | None:
    """This process's node in a multi-node torchrun job (its agent's ``GROUP_RANK`` in the current rendezvous
    round), or None outside one (one process, or one node: ``GROUP_WORLD_SIZE`` of 1 or unset)."""
    try:
        if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
            return int(os.environ["GROUP_RANK"])
    except (KeyError, ValueError):
        pass
    return None


AGENT_NAMES = ("torch.distributed.run", "torchrun", "torch.distributed.launch", "torch/distributed/run.py")
"""What the command line of torchrun's agent contains (``python -m torch.distributed.run``, the ``torchrun``
script, the deprecated ``launch``)."""


def agent_pid() -> int | None:
    """The pid of this worker's torchrun agent (its parent, when the parent's command line is torchrun's), or
    None: not under torchrun, or started some other way."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return None
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    return parent if any(name in arg for arg in argv[:4] for name in AGENT_NAMES) else None


def leave_rendezvous() -> bool:
    """End this node's torchrun agent with SIGTERM, as the reclaimed VM would: an agent that ends on a signal
    leaves the rendezvous open for the other nodes' elastic restart, while one whose workers all exited 0 closes
    it for everyone (torch's ``launch_agent`` shuts the rendezvous down after a success). True when signalled.

    Only for a node whose own notice stopped the job (`Emergency.respond`), after its save has committed and its
    journal is synced; the agent then stops this worker (which ignores late signals by then) and exits."""
    import signal

    pid = agent_pid()
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError as e:
        log.warning("could not signal torchrun's agent (pid %d) to leave the rendezvous: %s", pid, e)
        return False
    return True


def store_address() -> tuple[str, int] | None:
    """The c10d store torchrun (or an env:// launch) provides: ``MASTER_ADDR``/``MASTER_PORT``."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    return host, int(port)


class StoreClient(Protocol):
    """What the protocols use of a client of the job's c10d store (``torch.distributed.TCPStore`` behind a
    ``PrefixStore``; the coordination simulator's counting wrapper in tests and benchmarks). Values are sent as
    ``str`` and come back as ``bytes``."""

    def set(self, key: str, value: str) -> None: ...

    def add(self, key: str, amount: int) -> int: ...

    def wait(self, keys: list[str], timeout: timedelta) -> None: ...

    def check(self, keys: list[str]) -> bool: ...

    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...

    def multi_get(self, keys: list[str]) -> list[bytes]: ...

    def multi_set(self, keys: list[str], values: list[str]) -> None: ...


def _attempt() -> str | None:
    """A name for this launch of the job's ranks that every rank shares and no earlier launch had: rank 0's
    random token, broadcast over the job's process group. ``TORCHELASTIC_RESTART_COUNT`` is not one: a node that
    joins an elastic restart (a replacement) counts from 0 while the nodes that stayed count their restarts, and
    keys of the store (which outlives the rounds, on the store host's agent) would then not meet. None (the
    restart count is used) without an initialised process group or off the main thread (the broadcast is a
    collective: every rank makes it in lockstep, when its `Run` starts)."""
    if not _dist_ready() or threading.current_thread() is not threading.main_thread():
        return None
    import secrets

    import torch.distributed as tdist

    box: list[Any] = [secrets.token_hex(6) if rank() == 0 else None]
    tdist.broadcast_object_list(box, src=0)
    return f"a-{box[0]}"


class Coordinator:
    """Namespaced access to the job's c10d store, one client connection per user (thread).

    Every key lives under ``preemptible/<run id>/<attempt>/`` (`_attempt`: a token rank 0 broadcasts, else the
    restart count), so a torchrun restart never reads the previous attempt's keys. Clients are separate TCP
    connections: a blocking ``wait`` in one thread never holds up another thread's request. One per process:
    `coordinator()`.

    IMPORTANT (lockstep): the save commit, the replicated-state check, the restore agreement and the shared-root
    check are rounds of `exchange` named by `round`, whose counter is per process. Every rank must open the same
    rounds in the same order (they do: each follows the same saves and restores of the same loop); a rank that
    skipped one would wait on keys no one writes, until the timeout turns it into a `CoordinationError`.
    """

    def __init__(
        self, *, rank_: int, world: int, address: tuple[str, int], timeout_s: float = 60.0, attempt: str | None = None
    ) -> None:
        self.rank = rank_
        self.world = world
        self.address = address
        self.timeout_s = timeout_s
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        restart = attempt if attempt is not None else os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"preemptible/{run_id}/{restart}"
        self._rounds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._idle: list[StoreClient] = []
        self._abandoned: set[int] = set()
        self.gone: str | None = None
        """Why the store is known not to answer any more (`abandon`), or None."""
        self.wrap: Callable[[StoreClient], StoreClient] | None = None
        """Optional: called with each new store client, returns what to use instead (the coordination simulator
        counts and delays requests this way: benchmarks/coord_sim.py)."""

    def round(self, kind: str) -> str:
        """The key prefix of this process's next round of ``kind`` (``save/3``): see the lockstep note."""
        with self._lock:
            n = self._rounds.get(kind, 0) + 1
            self._rounds[kind] = n
        return f"{kind}/{n}"

    @classmethod
    def from_env(cls, timeout_s: float | None = None) -> Coordinator | None:
        """The coordinator of this launch, or None in a single-process run."""
        world = world_size()
        address = store_address()
        if world <= 1 or address is None:
            return None
        if timeout_s is None:
            timeout_s = float(os.environ.get("PREEMPTIBLE_COORD_TIMEOUT", "60"))
        return cls(rank_=rank(), world=world, address=address, timeout_s=timeout_s, attempt=_attempt())

    def client(self) -> StoreClient:
        """A new store client of the caller's own (the protocols borrow pooled ones: `borrow`)."""
        return self._connect()

    @contextlib.contextmanager
    def borrow(self) -> Iterator[StoreClient]:
        """A store client for the length of a ``with`` block, from this process's pool: made on first need, never
        used by two threads at once, kept for the next round. A connection per round would cost a TCP handshake
        per rank per save, and at thousands of ranks a connection storm on the one store server (it answers a
        burst of connects slowly: 5 s here for the 17th to 32nd at once). `release` closes the idle ones."""
        with self._lock:
            client = self._idle.pop() if self._idle else None
        if client is None:
            client = self._connect()
        try:
            yield client
        finally:
            with self._lock:
                if id(client) in self._abandoned:
                    self._abandoned.discard(id(client))
                else:
                    self._idle.append(client)

    def abandon(self, client: StoreClient, why: str) -> None:
        """``client`` is left to a thread blocked on a store that no longer answers (its host gone without a
        word: a TCPStore call on such a connection can outlast its own timeout): it is not returned to the pool,
        and `gone` says why, so the closing wake-ups skip the store instead of waiting on it."""
        with self._lock:
            self._abandoned.add(id(client))
            self.gone = why

    def release(self) -> None:
        """Close the idle pooled clients now (before interpreter exit); busy ones go when their user is done."""
        with self._lock:
            self._idle.clear()

    def _connect(self) -> StoreClient:
        import importlib

        c10d: Any = importlib.import_module("torch.distributed")  # its store classes are not re-exported for mypy
        host, port = self.address
        store = c10d.TCPStore(
            host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=self.timeout_s)
        )
        client: StoreClient = c10d.PrefixStore(self.prefix, store)
        return self.wrap(client) if self.wrap is not None else client

    def exchange(self, store: StoreClient, key: str, value: str, *, timeout_s: float | None = None) -> list[str]:
        """The barrier: publish ``value`` under ``key/<rank>`` and return every rank's, in rank order.

        Raises:
            CoordinationError: not every rank published within the timeout.
        """
        store.set(f"{key}/{self.rank}", value)
        return self.collect(store, key, timeout_s=timeout_s)

    gather = exchange

    def reduce(
        self,
        store: StoreClient,
        key: str,
        value: str,
        combine: Callable[[list[str]], str],
        *,
        timeout_s: float | None = None,
    ) -> str:
        """Every rank contributes ``value``; every rank gets ``combine(values in rank order)``.

        IMPORTANT (scale): O(1) requests and keys read per rank. Each rank sets its own key and counts itself in
        with one ``add``; the last to arrive reads every value in one ``multi_get``, combines them and sets one
        result, which the others wait for. No rank reads the others' keys one by one (an O(N^2) storm of reads at
        N ranks).

        Raises:
            CoordinationError: not every rank arrived within the timeout (naming the missing ones).
        """
        store.set(f"{key}/{self.rank}", value)
        if store.add(f"{key}/arrived", 1) == self.world:
            keys = [f"{key}/{r}" for r in range(self.world)]
            store.set(f"{key}/result", combine([bytes(v).decode() for v in store.multi_get(keys)]))
        return self._wait_for(store, key, "result", timeout_s)

    def _wait_for(self, store: StoreClient, key: str, leaf: str, timeout_s: float | None) -> str:
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            store.wait([f"{key}/{leaf}"], timedelta(seconds=wait_s))
        except Exception as e:
            missing = [r for r in range(self.world) if not _has(store, f"{key}/{r}")]  # O(N), on failure only
            raise _silent(missing, missing, key, wait_s, e) from e
        return read(store, f"{key}/{leaf}")

    def failures(self, store: StoreClient, key: str, report: str) -> list[tuple[int, dict[str, Any]]]:
        """The round that carries each rank's failure to every rank: every rank contributes its ``report`` (a JSON
        object with ``ok``, and why not); every rank gets the reports of the ranks that were not ok, with their
        ranks, in rank order (empty: every rank was). One `reduce`: O(1) requests and keys read per rank.

        Raises:
            RankFailures: not every rank reported within the timeout (naming the missing ones).
        """

        def failing(values: list[str]) -> str:
            return json.dumps([[r, d] for r, d in enumerate(json.loads(v) for v in values) if not d.get("ok")])

        return [(int(r), d) for r, d in json.loads(self.reduce(store, key, report, failing))]

    def collect_one(self, store: StoreClient, key: str, *, owner: int = 0, timeout_s: float | None = None) -> str:
        """Wait for one key, set by rank ``owner``, and return its value.

        Raises:
            RankFailures: the key was not set within the timeout (naming ``owner``).
        """
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            store.wait([key], timedelta(seconds=wait_s))
        except Exception as e:
            raise RankFailures(
                f"waited {wait_s:.0f} s for '{key}' through the store: the rank that sets it died, hangs or cannot "
                f"reach it ({type(e).__name__}); nothing was committed",
                failures=[(owner, f"did not set '{key}' within {wait_s:.0f} s")],
            ) from e
        return read(store, key)

    def collect(self, store: StoreClient, key: str, *, timeout_s: float | None = None) -> list[str]:
        """Every rank's value of ``key``, in rank order (O(N) reads: for small worlds and tests; the protocols
        use `reduce`)."""
        keys = [f"{key}/{r}" for r in range(self.world)]
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            store.wait(keys, timedelta(seconds=wait_s))
        except Exception as e:  # DistStoreError, RuntimeError: a timeout or a lost connection
            missing = [r for r, k in enumerate(keys) if not _has(store, k)]
            raise _silent(missing, [str(r) for r in missing], key, wait_s, e) from e
        return [read(store, k) for k in keys]


_ABSENT = "\x00preemptible: no such key"


def read(store: StoreClient, key: str) -> str:
    """The value of ``key``, which a ``wait`` has just seen, in one round trip.

    IMPORTANT (scale): TCPStore's ``get`` is two round trips (a wait, then the get); after our own ``wait`` the
    first is wasted, and at N ranks that is N requests more on the one server per gathering. ``compare_set``
    with an expected value no key ever holds changes nothing and answers the current value in one.
    """
    value = bytes(store.compare_set(key, _ABSENT, _ABSENT)).decode()
    if value == _ABSENT:
        raise CoordinationError(f"expected key '{key}' in the job's store after waiting for it, found none")
    return value


@overload
def session(coord: Coordinator) -> contextlib.AbstractContextManager[StoreClient]: ...


@overload
def session(coord: Coordinator | None) -> contextlib.AbstractContextManager[StoreClient | None]: ...


def session(coord: Coordinator | None) -> contextlib.AbstractContextManager[StoreClient | None]:
    """A pooled store client for a ``with`` block (`Coordinator.borrow`), or None in a single-process run."""
    return coord.borrow() if coord is not None else contextlib.nullcontext(None)


def commit_barrier(
    coord: Coordinator, store: StoreClient, key: str, report: str, *, wait: bool = True
) -> list[str] | None:
    """The commit barrier's gathering half: every rank reports (its files, or its error); rank 0 gets every
    report, in rank order, once all are in; the others get None (they then wait for rank 0's outcome). O(1)
    requests per rank but rank 0's one ``multi_get``. ``wait=False``: report and return (a rank that failed).

    Raises:
        CoordinationError: rank 0 did not hear from every rank within the timeout.
    """
    store.set(f"{key}/{coord.rank}", report)
    if store.add(f"{key}/arrived", 1) == coord.world:
        store.set(f"{key}/all", "1")
    if coord.rank != 0 or not wait:
        return None
    coord._wait_for(store, key, "all", None)
    return [bytes(v).decode() for v in store.multi_get([f"{key}/{r}" for r in range(coord.world)])]


def failures_doc(failures: list[tuple[int, str]]) -> str:
    """The failing ranks of a round, as one rank publishes them to the others (`failures_from` reads them)."""
    return json.dumps({"failed": [[r, why] for r, why in failures]})


def failures_from(outcome: str) -> list[tuple[int, str]]:
    """The failing ranks a round's outcome names (`failures_doc`); an outcome in any other form is rank 0's."""
    try:
        doc = json.loads(outcome)
        return [(int(r), str(why)) for r, why in doc["failed"]]
    except (ValueError, TypeError, KeyError):
        return [(0, outcome)]


def agree(coord: Coordinator, store: StoreClient, key: str, doc: str) -> list[tuple[int, dict[str, Any]]]:
    """The restore agreement: each rank's outcome (JSON with ``ok``); returns the ranks whose outcome was not ok,
    with their reports (empty: every rank verified). One `Coordinator.failures` round."""
    return coord.failures(store, key, doc)


def _silent(missing: list[int], shown: list[Any], key: str, wait_s: float, e: BaseException) -> RankFailures:
    """The error of a round some ranks never reported in (``shown``: how the message names them)."""
    why = f"no report of '{key}' within {wait_s:.0f} s"
    return RankFailures(
        f"waited {wait_s:.0f} s for ranks {shown} to report '{key}' through the store: they died, hang "
        f"or cannot reach it ({type(e).__name__}); nothing was committed",
        failures=[(r, why) for r in missing],
    )


def _has(store: StoreClient, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False


_COORDINATORS: dict[tuple[object, ...], Coordinator | None] = {}
_COORDINATOR_LOCK = threading.Lock()


def coordinator() -> Coordinator | None:
    """This process's one coordinator (several ranks under torchrun), built from the environment on first use;
    None in a single-process run. The guard and the checkpointer share it, and so its round counters."""
    env = os.environ
    launch = (
        rank(),
        world_size(),
        store_address(),
        env.get("TORCHELASTIC_RUN_ID"),
        env.get("TORCHELASTIC_RESTART_COUNT"),
    )
    with _COORDINATOR_LOCK:
        if launch not in _COORDINATORS:
            _COORDINATORS[launch] = Coordinator.from_env()
        return _COORDINATORS[launch]


def check_shared_root(storage: Storage, coord: Coordinator) -> None:
    """Every rank must see the same root (striped saves): rank 0 writes a token the others must read back.

    Raises:
        PreemptibleError: some rank cannot see it (a node-local path in a multi-node job), naming them.
    """

    with coord.borrow() as store:
        _check_shared_root(storage, coord, store)


def _check_shared_root(storage: Storage, coord: Coordinator, store: StoreClient) -> None:
    import secrets

    storage.makedirs(storage.root)
    name = storage.join(storage.root, ".preemptible-shared-check")
    if coord.rank == 0:
        token = secrets.token_hex(8)
        storage.publish(name, token.encode())
        store.set("shared/token", token)
    token = coord.collect_one(store, "shared/token")  # one fixed round: this check runs once, at start
    try:
        seen = storage.read_bytes(name, 64).decode() == token
    except OSError:
        seen = False
    why = f"cannot see what rank 0 wrote to {storage.root}"
    failed = coord.failures(store, "shared/seen", json.dumps({"ok": seen, "why": "" if seen else why}))
    if failed:
        blind = [r for r, _ in failed]
        raise RankFailures(
            f"checkpoint root {storage.root} is not shared by all {coord.world} ranks: rank(s) {blind} cannot see "
            "what rank 0 wrote there (a node-local path in a multi-node job?). Every rank writes part of each "
            "checkpoint, so the root must be one shared file system or bucket that all nodes mount",
            failures=[(r, str(report.get("why", ""))) for r, report in failed],
        )


class Waitable(Protocol):
    """What the announcing thread waits on: the guard's signal-safe `preemptible.notice.Flag`."""

    def wait(self, timeout: float | None = None, *, unless: Callable[[], bool] | None = None) -> bool: ...

    def wake(self) -> None: ...


WATCH_S = 3600.0
"""The agreement thread's blocking wait for a notice is renewed this often: one request per rank per hour."""


class StoreAgreement:
    """Stop-step agreement over the store, run beside the training loop (see DESIGN.md).

    Without a notice there is no store traffic: each rank's ``preemptible-agree`` thread sits in one blocking
    wait on its own key ``notice/<rank>``, and its ``preemptible-announce`` thread waits (locally) for this rank's
    own notice. A rank that sees a notice announces it: ``compare_set`` on ``notice`` (the first announcement
    wins), then one ``multi_set`` of the winning announcement to every rank's key, which wakes every waiting
    thread at once. Each then contributes the number of steps its main thread has completed to one
    `Coordinator.reduce`; the stop step is the largest plus one, so every rank can still reach it. O(1) requests
    and keys read per rank; the announcer writes N keys in one request. The main thread checks a local flag at
    each boundary; once it knows of a notice it starts no further step until the stop step is known, so no rank
    runs past it, and since all this happens in background threads, a rank blocked in a collective still answers.

    Args:
        coordinator: store access.
        record: how a notice announced by another rank is recorded on this rank (the guard's board).
        local_notice: this rank's first notice, or None (read at boundaries and by the announcing thread).
        local_event: set when this rank records a notice (the guard's board event); the announcing thread waits
            on it.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        record: Any,
        local_notice: Any,
        local_event: Waitable | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.coord = coordinator
        self._record = record
        self._local_notice = local_notice
        self._local_event: Waitable = local_event if local_event is not None else _flag()
        self.timeout_s = timeout_s
        self._completed = 0
        self._stop_step: int | None = None
        self.announcement: dict[str, Any] | None = None  # the winning announcement once known (rank, node, notice)
        self._noticed = threading.Event()
        self._known = threading.Event()
        self._closed = threading.Event()
        self._announced = False
        self._announce_lock = threading.Lock()
        self._error: BaseException | None = None
        self._mine = f"notice/{coordinator.rank}"
        self._thread = threading.Thread(target=self._watch, name="preemptible-agree", daemon=True)
        self._announcer = threading.Thread(target=self._announce_when_noticed, name="preemptible-announce", daemon=True)
        self._thread.start()
        self._announcer.start()
        _LIVE.add(self)

    @property
    def stop_step(self) -> int | None:
        return self._stop_step

    def _announce(self, store: StoreClient) -> None:
        notice = self._local_notice()
        if notice is None:
            return
        with self._announce_lock:
            if self._announced:
                return
            self._announced = True
        doc = json.dumps({**notice.to_json(), "rank": self.coord.rank, "node": node()})
        winner = bytes(store.compare_set("notice", "", doc)).decode()  # the first announcement wins
        world = self.coord.world
        store.multi_set([f"notice/{r}" for r in range(world)], [winner] * world)  # wakes every rank at once

    def _announce_when_noticed(self) -> None:
        try:
            while not self._closed.is_set():  # one blocking wait, no polling: close() wakes it
                if self._local_event.wait(WATCH_S, unless=self._closed.is_set) and self._local_notice() is not None:
                    with self.coord.borrow() as store:
                        self._announce(store)
                    return
        except BaseException as e:  # the main thread announces at its next boundary anyway
            log.warning("[rank=%d] could not announce the notice from the background: %s", self.coord.rank, e)

    def _watch(self) -> None:
        try:
            with self.coord.borrow() as store:
                self._watch_with(store)
        except BaseException as e:  # reaches the main thread through should_stop
            self._error = e
        finally:
            self._known.set()

    def _watch_with(self, store: StoreClient) -> None:
        doc = _wait_own_key(store, self._mine, self._closed)
        if doc is None:
            return  # close() woke us
        self.announcement = doc
        if doc.get("rank") != self.coord.rank and self._local_notice() is None:
            self._record(_notice_from(doc))
        self._noticed.set()
        stop = self.coord.reduce(
            store, "step", str(self._completed), lambda steps: str(max(int(x) for x in steps) + 1),
            timeout_s=self.timeout_s,
        )  # fmt: skip
        self._stop_step = int(stop)

    def should_stop(self, completed: int, noticed: bool) -> bool:
        # IMPORTANT: write the step first, read the flags after (the thread sets the flag first, reads the
        # step after): a step the thread did not see is one the main thread will not run past the stop step.
        self._completed = completed
        if self._stop_step is not None:
            return completed >= self._stop_step
        if not noticed and not self._noticed.is_set():
            return False
        if noticed and not self._announced:
            with self.coord.borrow() as store:
                self._announce(store)
        if not self._known.wait(self.timeout_s + 5):
            raise CoordinationError(f"no stop step agreed within {self.timeout_s + 5:.0f} s")
        if self._error is not None:
            raise self._error
        assert self._stop_step is not None
        return completed >= self._stop_step

    def close(self) -> None:
        """Wake and join both threads, and release this process's store clients (before interpreter exit)."""
        self._closed.set()
        join_s = 0.5 if self.coord.gone else self.timeout_s + 5  # a store that is gone: leave the daemon threads
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            if self.coord.gone is None:
                try:  # wake our own blocking wait; nobody else reads this key
                    with self.coord.borrow() as store:
                        store.set(self._mine, json.dumps({"closed": True}))
                except Exception as e:  # the store is gone (the launcher exited): the wait ends with the connection
                    log.debug("could not wake the agreement thread: %s", e)
            self._thread.join(join_s)
        self._local_event.wake()
        if self._announcer is not threading.current_thread():
            self._announcer.join(join_s)  # announcing, at worst: a bounded store request
        self.coord.release()
        _LIVE.discard(self)


OWN_KEY_FAILURES = 30
"""Consecutive failed waits (a second apart) after which a background wait on its own key gives up: the store is
gone."""


def _wait_own_key(store: StoreClient, key: str, closed: threading.Event) -> dict[str, Any] | None:
    """A background thread's wait on its own key: one blocking wait (no requests while it waits), renewed every
    `WATCH_S`; the key's JSON once set, or None when ``close()`` ended the wait (the key set to ``{"closed": true}``,
    or the connection gone after ``closed`` was set)."""
    import time

    failures = 0
    while True:
        began = time.monotonic()
        try:
            store.wait([key], timedelta(seconds=WATCH_S))
            break
        except Exception:
            if closed.is_set():
                return None
            if time.monotonic() - began > 1.0:
                failures = 0  # the wait's own timeout, renewed: not a failure
                continue
            failures += 1  # a store that is gone fails each wait at once: no busy loop, and an end
            if failures >= OWN_KEY_FAILURES:
                raise
            closed.wait(1.0)
    doc: dict[str, Any] = json.loads(read(store, key))
    return None if doc.get("closed") else doc


class IntervalAgreement:
    """Time-based saves under several ranks (``Run(save_interval_s=...)``): rank 0's clock says when a save is
    due, and every rank saves at one step they agree on, the way they agree on a stop step (`StoreAgreement`).

    No store traffic while no save is due: each rank's ``preemptible-interval`` thread sits in one blocking wait
    on its own key of the round, ``interval/<n>/<rank>``. When rank 0's interval has passed, its main thread
    writes every rank's key in one ``multi_set``, which wakes every waiting thread at once; each contributes the
    steps its main thread has completed to one `Coordinator.reduce`, and the save step is the largest plus one, so
    every rank can still reach it. A rank's main thread that knows of a round (rank 0 from its announcement, the others
    from their woken thread) starts no further step until the save step is known, so no rank runs past it; under a
    collective at every step (DDP) that makes the save step the one after rank 0's announcement. Rounds follow each
    other: the next begins once this process has reached the agreed step.
    """

    def __init__(self, coordinator: Coordinator, *, timeout_s: float = 30.0) -> None:
        self.coord = coordinator
        self.timeout_s = timeout_s
        self.round = 1
        self._completed = 0
        self._step: int | None = None
        self._announced = False  # rank 0: this round's keys are written
        self._woken = threading.Event()
        self._known = threading.Event()
        self._consumed = threading.Event()
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name="preemptible-interval", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def _key(self, n: int, r: int) -> str:
        return f"interval/{n}/{r}"

    def _watch(self) -> None:
        try:
            with self.coord.borrow() as store:
                while not self._closed.is_set():
                    if not self._one_round(store):
                        return
                    self._consumed.wait()  # the main thread reached the step (or close() woke us)
                    self._consumed.clear()
        except BaseException as e:  # reaches the main thread through due()
            self._error = e
            self._known.set()

    def _one_round(self, store: StoreClient) -> bool:
        if _wait_own_key(store, self._key(self.round, self.coord.rank), self._closed) is None:
            return False  # close() woke us
        self._woken.set()  # IMPORTANT: the flag first, the step after (see due())
        step = self.coord.reduce(
            store, f"interval-step/{self.round}", str(self._completed),
            lambda steps: str(max(int(x) for x in steps) + 1), timeout_s=self.timeout_s,
        )  # fmt: skip
        self._step = int(step)
        self._known.set()
        return True

    def due(self, completed: int, elapsed: bool) -> bool:
        """At a boundary of every rank, after ``completed`` steps: is the timed save due here? ``elapsed``: this
        rank's clock says the interval has passed (only rank 0's counts). True at the same step on every rank.

        Raises:
            CoordinationError: no save step was agreed within the timeout (a rank died or hangs).
        """
        # IMPORTANT: write the step first, read the flags after (the thread sets the flag first, reads the step
        # after): a step the thread did not see is one this rank will not run past the save step.
        self._completed = completed
        if elapsed and self.coord.rank == 0 and not self._announced:
            self._announced = True
            world = self.coord.world
            doc = json.dumps({"round": self.round, "step": completed})
            with self.coord.borrow() as store:
                store.multi_set([self._key(self.round, r) for r in range(world)], [doc] * world)
        if self._step is None and not self._woken.is_set() and not self._announced:
            return False  # rank 0, once it has announced, waits for the step like every rank its thread woke
        if not self._known.wait(self.timeout_s + 5):
            raise CoordinationError(
                f"expected the ranks to agree on the step of a timed save (save_interval_s) within "
                f"{self.timeout_s + 5:.0f} s; found no agreement (a rank died or hangs)"
            )
        if self._error is not None:
            raise self._error
        assert self._step is not None
        if completed < self._step:
            return False
        self.round += 1
        self._step = None
        self._announced = False
        self._woken.clear()
        self._known.clear()
        self._consumed.set()  # the thread waits for the next round
        return True

    def close(self) -> None:
        """Wake and join the thread (before interpreter exit)."""
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            if self.coord.gone is None:
                try:  # wake our own blocking wait on this round's key; nobody else reads it
                    with self.coord.borrow() as store:
                        store.set(self._key(self.round, self.coord.rank), json.dumps({"closed": True}))
                except Exception as e:  # the store is gone: the wait ends with the connection
                    log.debug("could not wake the interval thread: %s", e)
            self._consumed.set()
            self._thread.join(0.5 if self.coord.gone else self.timeout_s + 5)
        self.coord.release()
        _LIVE.discard(self)


_LIVE: weakref.WeakSet[StoreAgreement | IntervalAgreement] = weakref.WeakSet()


@atexit.register
def _close_agreements() -> None:
    """A safety net for a run that was never closed: threads and store clients go before interpreter teardown."""
    for agreement in list(_LIVE):
        agreement.close()
    for coord in list(_COORDINATORS.values()):
        if coord is not None:
            coord.release()


def _flag() -> Waitable:
    from preemptible.notice import Flag

    return Flag()


def _notice_from(doc: dict[str, Any]) -> Any:
    from preemptible.notice import Notice

    return Notice.from_json({**doc, "detail": f"{doc.get('detail', '')} (seen by rank {doc.get('rank')})"})


_RELAYED = re.compile(r" \(seen by rank -?\d+\)$")


def relayed(detail: str) -> bool:
    """Whether a notice's detail says it reached this rank through the store (`_notice_from`), not its own source."""
    return bool(_RELAYED.search(detail or ""))


PEER_TIMEOUT_ENV = "PREEMPTIBLE_PEER_TIMEOUT_S"
DEFAULT_PEER_TIMEOUT_S = 300.0
"""A node lost without notice is detected within this (`PeerWatch`), not the backends' own timeouts (30 minutes
for gloo, 10 for NCCL) that a collective with a vanished peer otherwise waits out."""


PEER_FAILURES = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection was likely closed",
    "no route to host",
    "connection refused",
)
"""What a collective or store error says when the process at its other end is gone (gloo, TCPStore)."""


def peer_failure(exc: BaseException) -> str | None:
    """What ``exc`` says of a peer gone (its process, node or link), or None when it is something else: torch's
    network and backend errors, or gloo's words for a closed connection, anywhere in its chain of causes."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        name = type(seen).__name__
        text = str(seen)
        lowered = text.lower()
        if name in ("DistNetworkError", "DistBackendError") or any(p in lowered for p in PEER_FAILURES):
            return f"{name}: {text.splitlines()[0] if text else ''}"[:300]
        seen = seen.__cause__ or seen.__context__
    return None


def peer_timeout(value: float | None) -> float:
    """The peer timeout in seconds: ``value`` (`Run(peer_timeout_s=...)`), else ``$PREEMPTIBLE_PEER_TIMEOUT_S``,
    else `DEFAULT_PEER_TIMEOUT_S`; 0 turns the watch off.

    Raises:
        ValueError: not a finite number of seconds >= 0 (says what was found, and where).
    """
    where = "peer_timeout_s"
    if value is None:
        raw = os.environ.get(PEER_TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_PEER_TIMEOUT_S
        where = f"${PEER_TIMEOUT_ENV}"
        try:
            value = float(raw)
        except ValueError:
            value = None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
    if not ok:
        raise ValueError(
            f"expected {where} to be a finite number of seconds >= 0 (0 turns the watch off; default "
            f"{DEFAULT_PEER_TIMEOUT_S:.0f}), found {value if where == 'peer_timeout_s' else raw!r}"
        )
    assert value is not None
    return float(value)


class PeerWatch:
    """Detects a peer that is gone without a word (its node lost without notice, or cut off), within
    ``timeout_s``: a collective with a vanished peer otherwise waits out the backend's own timeout.

    Without a stall there is no store traffic: the ``preemptible-peers`` thread reads a local clock once a second,
    and the ``preemptible-peers-answer`` thread sits in one blocking wait on its own key. When this rank has not
    reached a step boundary (`beat`) for half the timeout, it asks every rank whether it is alive: one ``add``
    names the round, one ``multi_set`` wakes every rank's answering thread, which answers from the background
    (so a rank blocked in a collective, or busy in a long evaluation, still answers). All answer within the other
    half: the job is slow, not broken, and the watch waits again. Some do not, or the store itself does not
    answer (its host is the lost node): ``on_lost`` gets what was found (the missing ranks, the timeout, how long
    this rank had stalled), then the process ends with ``exit_code``; its main thread, blocked in the collective,
    cannot be unwound. Torchrun's elastic restart, or the scheduler, acts on that code.

    Args:
        coordinator: store access.
        timeout_s: the detection bound (> 0).
        on_lost: journals and logs the loss (`Run`), before the exit.
        exit_code: the process's exit code after a loss (`preemptible.emergency.EXIT_PEER_NODE`).
        monotonic: the clock of stalls.
        exit: ends the process (``os._exit``; a test passes its own).
    """

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        timeout_s: float,
        on_lost: Callable[[dict[str, Any]], None],
        exit_code: int,
        monotonic: Callable[[], float] | None = None,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        import time

        assert timeout_s > 0, timeout_s
        self.coord = coordinator
        self.timeout_s = timeout_s
        self.on_lost = on_lost
        self.exit_code = exit_code
        self._monotonic = monotonic or time.monotonic
        self._exit = exit
        self._last = self._monotonic()
        self._closed = threading.Event()
        self._waiting_on: str | None = None  # the answering thread's current key (close() wakes it there)
        self.probes = 0  # rounds this rank opened (each one a stall that turned out to be a slow job, or the loss)
        self.lost: dict[str, Any] | None = None
        self._asking: threading.Thread | None = None
        self._thread = threading.Thread(target=self._watch, name="preemptible-peers", daemon=True)
        self._answerer = threading.Thread(target=self._answer, name="preemptible-peers-answer", daemon=True)
        self._answerer.start()
        self._thread.start()

    def beat(self) -> None:
        """This rank reached a step boundary (cheap: one clock read)."""
        self._last = self._monotonic()

    def stalled(self) -> float:
        """Seconds since the last step boundary."""
        return self._monotonic() - self._last

    def _answer(self) -> None:
        rank, world = self.coord.rank, self.coord.world
        n = 1
        try:
            with self.coord.borrow() as store:
                while not self._closed.is_set():
                    self._waiting_on = f"peers/ask/{n}/{rank}"
                    doc = _wait_own_key(store, self._waiting_on, self._closed)
                    if doc is None:
                        return
                    store.set(f"peers/alive/{n}/{rank}", "1")
                    if store.add(f"peers/alive/{n}/count", 1) == world:
                        store.set(f"peers/alive/{n}/all", "1")
                    n += 1
        except Exception as e:  # the store is gone: this rank's own watch finds that out when it asks
            log.debug("[rank=%d] the peer watch stopped answering: %s", rank, e)

    def _watch(self) -> None:
        half = self.timeout_s / 2
        while not self._closed.wait(min(1.0, half / 4)):
            stalled = self._monotonic() - self._last
            if stalled < half:
                continue
            found = self._ask(half)
            if self._closed.is_set():
                return
            if found is None:
                self._last = self._monotonic()  # every rank answered: slow, not broken
                continue
            self.lost = {**found, "timeout_s": self.timeout_s, "stalled_s": round(stalled, 3)}
            try:
                self.on_lost(self.lost)
            finally:
                self._exit(self.exit_code)
            return

    def _ask(self, within_s: float) -> dict[str, Any] | None:
        """One round: None when every rank answered within ``within_s``, else what was found."""
        self.probes += 1
        box: dict[str, Any] = {}

        def ask() -> None:
            try:
                with self.coord.borrow() as store:
                    n = store.add("peers/round", 1)
                    world = self.coord.world
                    store.multi_set(
                        [f"peers/ask/{n}/{r}" for r in range(world)], [json.dumps({"by": self.coord.rank})] * world
                    )
                    try:
                        store.wait([f"peers/alive/{n}/all"], timedelta(seconds=within_s))
                        box["ok"] = True
                    except Exception:  # who answered? (a store that fails this too is itself gone: below)
                        box["missing"] = [r for r in range(world) if not store.check([f"peers/alive/{n}/{r}"])]
            except Exception as e:
                box["store_error"] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=ask, name="preemptible-peers-ask", daemon=True)
        self._asking = t
        t.start()
        t.join(within_s + 5)  # a store that does not answer at all (its host cut off) ends the wait here
        if box.get("ok") or box.get("missing") == []:  # all answered (the last ones just after the wait)
            return None
        if box.get("missing"):
            return {"missing": box["missing"], "how": f"ranks {box['missing']} did not answer within {within_s:.0f} s"}
        host, port = self.coord.address
        why = box.get("store_error") or f"no answer within {within_s + 5:.0f} s"
        return {"missing": [], "how": f"the job's store at {host}:{port} is unreachable ({why})"}

    def close(self) -> None:
        """Stop both threads (the answering one woken on its key); never waits long on a store that is gone."""
        self._closed.set()
        key = self._waiting_on
        if key is not None and self._answerer.is_alive() and self.coord.gone is None:
            try:
                with self.coord.borrow() as store:
                    store.set(key, json.dumps({"closed": True}))
            except Exception as e:
                log.debug("could not wake the peer watch: %s", e)
        gone = self.coord.gone is not None
        for t in (self._thread, self._answerer):
            if t is not threading.current_thread():
                t.join(0.5 if gone else 5)
        if self._asking is not None:  # a question to a store that is gone ends with its connect timeout
            self._asking.join(0.5 if gone else self.coord.timeout_s + 5)
