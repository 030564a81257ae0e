"""Rank and world helpers that degrade to "rank 0 of 1", and the stop-step agreement seam.

Every code path runs in one process too: without an initialised process group, and without torchrun's
``RANK``/``WORLD_SIZE`` variables, this is rank 0 of a world of 1.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Protocol

from preemptible.errors import CoordinationError


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


def store_address() -> tuple[str, int] | None:
    """The c10d store torchrun (or an env:// launch) provides: ``MASTER_ADDR``/``MASTER_PORT``."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    return host, int(port)


class Coordinator:
    """Namespaced access to the job's c10d store, one client connection per user (thread).

    Every key lives under ``preemptible/<run id>/<restart>/``, so a torchrun restart never reads the previous
    attempt's keys. Clients are separate TCP connections: a blocking ``wait`` in one thread never holds up
    another thread's request. One per process: `coordinator()`.

    IMPORTANT (lockstep): the save commit, the replicated-state check, the restore agreement and the shared-root
    check are rounds of `exchange` named by `round`, whose counter is per process. Every rank must open the same
    rounds in the same order (they do: each follows the same saves and restores of the same loop); a rank that
    skipped one would wait on keys no one writes, until the timeout turns it into a `CoordinationError`.
    """

    def __init__(self, *, rank_: int, world: int, address: tuple[str, int], timeout_s: float = 60.0) -> None:
        self.rank = rank_
        self.world = world
        self.address = address
        self.timeout_s = timeout_s
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"preemptible/{run_id}/{restart}"
        self._rounds: dict[str, int] = {}
        self._lock = threading.Lock()

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
        return cls(rank_=rank(), world=world, address=address, timeout_s=timeout_s)

    def client(self) -> Any:
        import importlib

        c10d: Any = importlib.import_module("torch.distributed")  # its store classes are not re-exported for mypy
        host, port = self.address
        store = c10d.TCPStore(
            host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=self.timeout_s)
        )
        return c10d.PrefixStore(self.prefix, store)

    def exchange(self, store: Any, key: str, value: str, *, timeout_s: float | None = None) -> list[str]:
        """The barrier: publish ``value`` under ``key/<rank>`` and return every rank's, in rank order.

        Raises:
            CoordinationError: not every rank published within the timeout.
        """
        store.set(f"{key}/{self.rank}", value)
        return self.collect(store, key, timeout_s=timeout_s)

    gather = exchange

    def gather_until(self, store: Any, key: str, value: str, *, timeout_s: float, stop: threading.Event) -> list[str]:
        """`exchange`, polled, giving up as soon as ``stop`` is set."""
        store.set(f"{key}/{self.rank}", value)
        return self.collect(store, key, timeout_s=timeout_s, stop=stop)

    def collect_one(self, store: Any, key: str, *, timeout_s: float | None = None) -> str:
        """Wait for one key (set by one rank) and return its value."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            store.wait([key], timedelta(seconds=wait_s))
        except Exception as e:
            raise CoordinationError(
                f"waited {wait_s:.0f} s for '{key}' through the store: the rank that sets it died, hangs or cannot "
                f"reach it ({type(e).__name__}); nothing was committed"
            ) from e
        return bytes(store.get(key)).decode()

    def collect(
        self, store: Any, key: str, *, timeout_s: float | None = None, stop: threading.Event | None = None
    ) -> list[str]:
        """Every rank's value of ``key``, in rank order. With ``stop``: polled, and given up (CoordinationError) as
        soon as it is set, so a background thread never sits in a blocking store call at interpreter exit."""
        keys = [f"{key}/{r}" for r in range(self.world)]
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            if stop is None:
                store.wait(keys, timedelta(seconds=wait_s))
            else:
                _poll(store, keys, wait_s, stop)
        except Exception as e:  # DistStoreError, RuntimeError: a timeout or a lost connection
            missing = [k.rsplit("/", 1)[1] for k in keys if not _has(store, k)]
            raise CoordinationError(
                f"waited {wait_s:.0f} s for ranks {missing} to report '{key}' through the store: they died, hang "
                f"or cannot reach it ({type(e).__name__}); nothing was committed"
            ) from e
        return [bytes(store.get(k)).decode() for k in keys]


def _poll(store: Any, keys: list[str], wait_s: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + wait_s
    while not store.check(keys):
        if stop.wait(POLL_S):
            raise CoordinationError("closed while waiting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{wait_s:.0f} s")


def _has(store: Any, key: str) -> bool:
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


def check_shared_root(storage: Any, coord: Coordinator) -> None:
    """Every rank must see the same root (striped saves): rank 0 writes a token the others must read back.

    Raises:
        PreemptibleError: some rank cannot see it (a node-local path in a multi-node job), naming them.
    """
    import secrets

    store = coord.client()
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
    answers = coord.exchange(store, "shared/seen", "yes" if seen else "no")
    blind = [r for r, a in enumerate(answers) if a != "yes"]
    if blind:
        raise CoordinationError(
            f"checkpoint root {storage.root} is not shared by all {coord.world} ranks: rank(s) {blind} cannot see "
            "what rank 0 wrote there (a node-local path in a multi-node job?). Every rank writes part of each "
            "checkpoint, so the root must be one shared file system or bucket that all nodes mount"
        )


POLL_S = 0.1
"""How often the agreement thread looks for an announcement in the store (one small request)."""


class StoreAgreement:
    """Stop-step agreement over the store, run beside the training loop (see DESIGN.md).

    A rank that sees a notice announces it in the store. Every rank's background thread (``preemptible-agree``)
    waits for an announcement, then publishes the number of steps its main thread has completed and waits for
    every rank's; the stop step is the largest plus one, so every rank can still reach it. The main thread
    checks a local flag at each boundary (no collective, no store request without a notice); once it knows of
    a notice it starts no further step until the stop step is known, so no rank runs past it, and since the
    publishing happens in a background thread, a rank blocked in a collective still answers.

    Args:
        coordinator: store access.
        record: how a notice announced by another rank is recorded on this rank (the guard's board).
        local_notice: this rank's first notice, or None (read at boundaries and by the thread).
    """

    def __init__(self, coordinator: Coordinator, *, record: Any, local_notice: Any, timeout_s: float = 30.0) -> None:
        self.coord = coordinator
        self._record = record
        self._local_notice = local_notice
        self.timeout_s = timeout_s
        self._completed = 0
        self._stop_step: int | None = None
        self._noticed = threading.Event()
        self._known = threading.Event()
        self._closed = threading.Event()
        self._announced = False
        self._announce_lock = threading.Lock()
        self._error: BaseException | None = None
        self._main_client: Any = None
        self._thread = threading.Thread(target=self._run, name="preemptible-agree", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    @property
    def stop_step(self) -> int | None:
        return self._stop_step

    def _announce(self, store: Any) -> None:
        notice = self._local_notice()
        if notice is None:
            return
        with self._announce_lock:
            if self._announced:
                return
            self._announced = True
        doc = json.dumps({**notice.to_json(), "rank": self.coord.rank})
        store.compare_set("notice", "", doc)  # the first announcement wins; later ones change nothing

    def _run(self) -> None:
        store = None
        try:
            store = self.coord.client()
            while not self._closed.is_set():
                if self._local_notice() is not None:
                    self._announce(store)
                if store.check(["notice"]):  # a quick look: a timed-out wait would log a C++ warning each time
                    break
                self._closed.wait(POLL_S)
            if self._closed.is_set():
                return
            doc = json.loads(bytes(store.get("notice")).decode())
            if doc.get("rank") != self.coord.rank and self._local_notice() is None:
                self._record(_notice_from(doc))
            self._noticed.set()
            steps = self.coord.gather_until(
                store, "step", str(self._completed), timeout_s=self.timeout_s, stop=self._closed
            )
            self._stop_step = max(int(s) for s in steps) + 1
        except BaseException as e:  # reaches the main thread through should_stop
            self._error = e
        finally:
            # IMPORTANT: the store client goes here, in this thread, now; never at interpreter exit, where
            # destroying a TCPStore (or a thread blocked in one) can abort the process after a clean stop.
            store = None
            self._known.set()

    def should_stop(self, completed: int, noticed: bool) -> bool:
        # IMPORTANT: write the step first, read the flags after (the thread sets the flag first, reads the
        # step after): a step the thread did not see is one the main thread will not run past the stop step.
        self._completed = completed
        if self._stop_step is not None:
            return completed >= self._stop_step
        if not noticed and not self._noticed.is_set():
            return False
        if noticed and not self._announced:
            if self._main_client is None:
                self._main_client = self.coord.client()
            self._announce(self._main_client)
        if not self._known.wait(self.timeout_s + 5):
            raise CoordinationError(f"no stop step agreed within {self.timeout_s + 5:.0f} s")
        if self._error is not None:
            raise self._error
        assert self._stop_step is not None
        return completed >= self._stop_step

    def close(self) -> None:
        """Stop the thread and release the store clients (a poll interval and one request, at most)."""
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self.timeout_s + 5)
        self._main_client = None
        _LIVE.discard(self)


_LIVE: weakref.WeakSet[StoreAgreement] = weakref.WeakSet()


@atexit.register
def _close_agreements() -> None:
    """A safety net for a run that was never closed: threads and store clients go before interpreter teardown."""
    for agreement in list(_LIVE):
        agreement.close()


def _notice_from(doc: dict[str, Any]) -> Any:
    from preemptible.notice import Notice

    return Notice.from_json({**doc, "detail": f"{doc.get('detail', '')} (seen by rank {doc.get('rank')})"})
