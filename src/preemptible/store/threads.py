"""Worker threads for the parallel parts of a save or a restore (compressing and decoding frames, filling the staging
arena ahead of the writes) that keep taking work while the interpreter shuts down.

Why not `concurrent.futures.ThreadPoolExecutor`: it refuses new work once interpreter shutdown has begun (its exit
hook runs before any ``atexit`` handler: "cannot schedule new futures after interpreter shutdown"), and a save from
an ``atexit`` handler is many training scripts' last resort. A `Pool`'s threads are plain daemon threads (an idle
pool never holds the interpreter's exit), one started per submission until there are ``threads``, and joined by
`Pool.shutdown`.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Generic, TypeVar

R = TypeVar("R")

DEFAULT_THREADS = 2
"""Writer and reader threads of a checkpoint on a local file system."""
OBJECT_STORE_THREADS = 8
"""... on an object store, which gains from many requests at once."""


def threads_for(kind: str) -> int:
    """The default threads of a checkpoint's reads and writes on storage of this ``kind`` (`Storage.kind`)."""
    return OBJECT_STORE_THREADS if kind == "object" else DEFAULT_THREADS


_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class Pool:
    """Up to ``threads`` worker threads named ``{name}-{i}`` pulling from one queue; ``submit`` returns a
    `concurrent.futures.Future`."""

    def __init__(self, threads: int, name: str) -> None:
        self._max = max(1, threads)
        self._name = name
        self._work: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: a thread's signal to end
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        future: Future[R] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the {self._name} threads are shut down: no new work")
            self._work.put((future, fn, args, kwargs))
            if len(self._threads) < self._max:
                t = threading.Thread(target=self._worker, name=f"{self._name}-{len(self._threads)}", daemon=True)
                t.start()
                self._threads.append(t)
        return future

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # the submitter's to raise
                    future.set_exception(e)
            del future, fn, args, kwargs, item  # nothing of the job kept alive while idle

    def shutdown(self, wait: bool = True) -> None:
        """No new work; the threads end once the queued work is done (joined when ``wait``)."""
        with self._lock:
            if self._closed:
                threads: list[threading.Thread] = []
            else:
                self._closed = True
                threads = list(self._threads)
                for _ in threads:
                    self._work.put(None)
        if wait:
            for t in threads:
                t.join()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.shutdown(wait=True)


# the storage's own time: a call's wall time less this thread's wait for a CPU ------------------------------
_SCHEDSTAT = "/proc/thread-self/schedstat"
_wall = time.perf_counter
_local = threading.local()


class _SchedStat:
    """The calling thread's ``/proc/thread-self/schedstat``, held open for the thread's life (closed with its
    thread-local data when it ends)."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = os.open(_SCHEDSTAT, os.O_RDONLY)

    def __del__(self) -> None:
        os.close(self.fd)


def run_queue_s() -> float:
    """Seconds the calling thread has waited, runnable, for a CPU since it started (Linux schedstat's
    ``run_delay``); 0.0 where the kernel does not say (another OS, no ``/proc``)."""
    stat: _SchedStat | None = getattr(_local, "stat", None)
    if stat is None:
        if getattr(_local, "missing", False):
            return 0.0
        try:
            stat = _local.stat = _SchedStat()
        except OSError:
            _local.missing = True
            return 0.0
    try:
        return int(os.pread(stat.fd, 128, 0).split()[1]) * 1e-9
    except (OSError, ValueError, IndexError):
        return 0.0


def stamp() -> tuple[float, float]:
    """Now, for `storage_seconds`: the wall clock and this thread's wait for a CPU so far."""
    return _wall(), run_queue_s()


def storage_seconds(since: tuple[float, float]) -> float:
    """Wall seconds since ``since`` (a `stamp` taken on this thread), less those this thread spent waiting for a
    CPU meanwhile: the time a storage call took the storage, not the scheduler.

    Why: a background save's writer runs at low priority beside training on every core. A write it made waited
    for the disk, and then, runnable again, for a core: 0.44 s of wall time for 120 MB that the disk took in
    0.1 s. Timed by the wall clock alone, the destination looked 4x slower than it is, and ``compress="auto"``
    then compressed the emergency save to a fast disk."""
    wall, waited = _wall(), run_queue_s()
    return max(0.0, (wall - since[0]) - (waited - since[1]))


# a map over items on threads of its own -------------------------------------------------------------------
T = TypeVar("T")


class PlanChanged(Exception):
    """A save's plan, written while it was checked (`parallel_map`'s ``meanwhile``), did not fit the state: what was
    written must be thrown away and the state planned again. Never leaves the checkpointer."""


def parallel_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    threads: int,
    name: str,
    meanwhile: Callable[[], bool] | None = None,
    idle: Callable[[], bool] | None = None,
) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``threads`` named threads pulling from one work queue, in order.

    The first failure stops the others before their next item and is re-raised with its own type. ``meanwhile``:
    run by the calling thread while the others work (first, when there are no others); False stops them before
    their next item and raises `PlanChanged` once they are done. ``idle``: what a thread does once no item is left
    to start (help one still running), called until it returns False; with it, ``threads`` threads work on even
    one item.
    """
    if threads <= 1 or (len(items) <= 1 and idle is None) or not items:
        if meanwhile is not None and not meanwhile():
            raise PlanChanged
        return [fn(x) for x in items]
    run = _Map(fn, items, idle)
    count = threads if idle is not None else min(threads, len(items))
    if not run.run([threading.Thread(target=run.worker, name=f"{name}-{k}") for k in range(count)], meanwhile):
        raise PlanChanged
    return run.results(name)


class _Map(Generic[T, R]):
    """One `parallel_map`: its work queue, its results as they come, and the signals its threads share."""

    def __init__(self, fn: Callable[[T], R], items: Sequence[T], idle: Callable[[], bool] | None) -> None:
        self.fn = fn
        self.items = items
        self.idle = idle
        self.work: queue.Queue[int] = queue.Queue()
        for i in range(len(items)):
            self.work.put(i)
        self.futures: list[Future[R]] = [Future() for _ in items]
        self.stop = threading.Event()
        self.go = threading.Event()
        self.idle_errors: list[BaseException] = []

    def worker(self) -> None:
        self.go.wait()
        while not self.stop.is_set():
            try:
                i = self.work.get_nowait()
            except queue.Empty:
                break
            try:
                self.futures[i].set_result(self.fn(self.items[i]))
            except BaseException as e:
                self.stop.set()
                self.futures[i].set_exception(e)
        try:
            while self.idle is not None and not self.stop.is_set() and self.idle():
                pass
        except BaseException as e:  # a helper's read errors go to the item it helps; this is anything else
            self.stop.set()
            self.idle_errors.append(e)

    def run(self, pool: list[threading.Thread], meanwhile: Callable[[], bool] | None) -> bool:
        """Start every thread, run ``meanwhile``, join them; returns what ``meanwhile`` said (True without one)."""
        # IMPORTANT: every thread is started before any works, so a thread that cannot start (a process out of
        # threads) fails the map before a single item is done (no live tensor half read into, no file half
        # written), and the threads that did start are joined, not left working after the error.
        fits = True
        try:
            for t in pool:
                t.start()
            self.go.set()
            if meanwhile is not None and not meanwhile():
                fits = False
                self.stop.set()
        except BaseException:  # out of threads: those started stop before their first item, and the error is raised
            self.stop.set()
            raise
        finally:
            self.go.set()
            for t in pool:
                if t.ident is not None:  # started
                    t.join()
        return fits

    def results(self, name: str) -> list[R]:
        """The results in order, or the first failure raised."""
        for f in self.futures:
            error = f.exception() if f.done() else None
            if error is not None:
                raise error
        if self.idle_errors:
            raise self.idle_errors[0]
        if not all(f.done() for f in self.futures):  # pragma: no cover - only after a failure, which raised above
            raise RuntimeError(f"{name} threads stopped early")
        return [f.result() for f in self.futures]
