"""Resuming a data loader mid-epoch: where `Run.epochs`/`Run.batches` are, and the loader's order restored.

A loader that is not stateful is resumed by replay: the random streams as they were at the interrupted epoch's
start (the global ones and every ``torch.Generator`` the loader's parts hold, with their epoch counters) make the
iterator draw the same order, the batches done before the checkpoint are loaded and dropped, then the streams go
back to what the checkpoint holds. A loader given to `Run` as state saves its own position and is not replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from preemptible.errors import PreemptibleError
from preemptible.state import RNGState

_END = object()

_LOADER_PARTS = ("sampler", "batch_sampler", "base_dataloader", "dataset")
_COUNTERS = ("iteration", "epoch")


class LoopPosition:
    """Where an epoch-structured loop is: the epoch, the batches done in it, the random streams at its start.

    ``entry`` is the dict the checkpoint holds (the run's ``_loop`` state entry): restored in place.
    """

    def __init__(self, inexact: Callable[[str, str], None] | None = None) -> None:
        self.entry: dict[str, Any] = {"epoch": 0, "done": 0, "rng": None, "length": None}
        self.inexact = inexact or (lambda what, why: None)
        """Told when a resumed epoch cannot continue as the interrupted one would have: ``(what, why)``."""
        self.length: int | None = None
        """Batches in an epoch of the loader last iterated, when it has a length."""
        self.restored_rng: dict[str, Any] | None = None
        """The global streams as the checkpoint restored them (`restored`), until the resumed epoch's batches
        continue from them."""

    def restored(self) -> None:
        """A checkpoint was just restored: the streams now are the ones the interrupted run had at its stop. Whatever
        the loop draws before the resumed epoch's first batch (a peek at a batch through an iterator of its own, as
        the DDP tutorial takes its batch size) happened before the checkpoint in the interrupted run, so the batches
        continue from these streams, not from the ones that draw left."""
        self.restored_rng = RNGState().state_dict()

    @property
    def epoch(self) -> int:
        return int(self.entry["epoch"])

    @property
    def done(self) -> int:
        """The batches of this epoch done (before the checkpoint, for a resumed epoch, included)."""
        return int(self.entry["done"])

    def next_epoch(self) -> None:
        self.entry.update(epoch=self.epoch + 1, done=0, rng=None, length=None)

    def batch_done(self) -> None:
        self.entry["done"] += 1

    def iterate(self, loader: Iterable[Any], *, stateful: bool) -> Iterator[Any]:
        """An iterator over this epoch's batches still to run: from the start, or after the batches done (replayed
        in their order, see the module docs). After a restore mid-epoch, the batches continue from the streams the
        checkpoint restored, whatever the loop drew since (`restored`)."""
        skip = int(self.entry["done"])
        resumed, self.restored_rng = self.restored_rng, None
        try:
            self.length = len(loader)  # type: ignore[arg-type]
        except TypeError:
            self.length = None
        if skip == 0:
            self.entry["rng"] = None if stateful else {"global": RNGState().state_dict(), **loader_streams(loader)}
            self.entry["length"] = self.length
            return iter(loader)
        saved = self.entry.get("length")
        if saved is not None and self.length is not None and saved != self.length:
            self.inexact(
                "data position",
                f"epoch {self.epoch} had {saved} batches when the checkpoint was written and has {self.length} now "
                f"(another dataset, batch size or world size): the {skip} batches skipped are not the ones the "
                "interrupted run trained on",
            )
        if stateful:  # the loader restored its own position
            self.entry["rng"] = None
            iterator = iter(loader)
        else:
            iterator = self._replayed(loader, skip)
        if resumed is not None:
            RNGState().load_state_dict(resumed)
        return iterator

    def _replayed(self, loader: Iterable[Any], skip: int) -> Iterator[Any]:
        """The epoch's iterator made as the interrupted run made it, its ``skip`` done batches drawn and dropped; the
        global streams are left as they were on the call."""
        if self.entry["rng"] is None:
            raise PreemptibleError(
                f"expected the random streams of epoch {self.epoch}'s start in the checkpoint, to skip its "
                f"{skip} done batches in their order; found none (the checkpoint was not written inside "
                "run.batches()). Resume with the loop that wrote it"
            )
        now = RNGState().state_dict()
        RNGState().load_state_dict(self.entry["rng"]["global"])
        put_back_loader_streams(loader, self.entry["rng"])
        iterator = iter(loader)
        for done in range(skip):
            if next(iterator, _END) is _END:
                self.inexact(
                    "data position",
                    f"the checkpoint says epoch {self.epoch} had done {skip} batches, and the loader now ends after "
                    f"{done}: the resumed epoch has no batches left, the data is not what the interrupted run saw",
                )
                break
        RNGState().load_state_dict(now)
        return iterator


class MidEpochAim:
    """Where ``preemptible drill`` wants its stop (``$PREEMPTIBLE_DRILL_AIM``, `preemptible.relay.AIM_ENV`): after half
    the batches of an epoch, where a resume must replay the epoch's order and its streams rather than start an epoch
    afresh, the case a stop at an epoch's end never tries. The second epoch when the loop has two or more (one
    epoch's end has run by then: a scheduler stepped per epoch, a sampler's epoch counter), else the first. An epoch's
    length is the loader's ``len()``, else the length of the epoch before it in this process; an epoch of one batch
    has no middle, and the aim moves on to the next."""

    def __init__(self) -> None:
        self.epochs: int | None = None
        """The loop's epochs (``run.epochs(total)``), once known."""
        self.lengths: dict[int, int] = {}
        """The batches of each epoch that ended in this process."""

    def ended(self, epoch: int, batches: int) -> None:
        self.lengths[epoch] = batches

    def length(self, epoch: int, batches: int | None) -> int | None:
        """Epoch ``epoch``'s batches: ``batches`` (the loader's length) or the previous epoch's."""
        return batches if batches is not None else self.lengths.get(epoch - 1)

    def due(self, epoch: int, done: int, batches: int | None) -> bool:
        """Whether the boundary after ``done`` batches of ``epoch`` is the one to hold at."""
        target = min(1, self.epochs - 1) if self.epochs else 0
        n = self.length(epoch, batches)
        return epoch >= target and n is not None and n >= 2 and done == n // 2


def length(loader: Any) -> int | None:
    """A loader's batches per epoch, None when it does not say (an iterable dataset, a generator)."""
    try:
        n = len(loader)
    except (TypeError, NotImplementedError):
        return None
    return n if isinstance(n, int) and n >= 0 else None


def loader_parts(loader: Any) -> Iterator[tuple[str, Any]]:
    """The loader and the objects it draws its order from (sampler, batch sampler, a wrapped loader: as Accelerate
    nests them), by attribute path."""
    seen: set[int] = set()
    todo: list[tuple[str, Any, int]] = [("", loader, 0)]
    while todo:
        path, obj, depth = todo.pop(0)
        if obj is None or id(obj) in seen or isinstance(obj, (int, float, str, torch.Tensor)):
            continue
        seen.add(id(obj))
        yield path, obj
        if depth < 4:
            todo += [(f"{path}.{n}" if path else n, getattr(obj, n, None), depth + 1) for n in _LOADER_PARTS]


def loader_streams(loader: Any) -> dict[str, Any]:
    """What decides a loader's order for the coming epoch besides the global streams: the state of every
    ``torch.Generator`` its parts hold (a sampler's own generator, as Accelerate gives one under several processes)
    and their epoch counters (a seedable sampler's ``epoch``, Accelerate's ``iteration``)."""
    generators: dict[str, torch.Tensor] = {}
    counters: dict[str, int] = {}
    for path, obj in loader_parts(loader):
        gen = getattr(obj, "generator", None)
        if isinstance(gen, torch.Generator):
            generators[path] = gen.get_state()
        for name in _COUNTERS:
            value = getattr(obj, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                counters[f"{path}:{name}"] = value
    return {"generators": generators, "counters": counters}


def put_back_loader_streams(loader: Any, saved: dict[str, Any]) -> None:
    """Set the generators and counters of `loader_streams` back on the loader's parts."""
    parts = dict(loader_parts(loader))
    for path, state in saved.get("generators", {}).items():
        gen = getattr(parts.get(path), "generator", None)
        if isinstance(gen, torch.Generator):
            gen.set_state(state)
    for key, value in saved.get("counters", {}).items():
        path, name = key.rsplit(":", 1)
        if path in parts:
            setattr(parts[path], name, value)
