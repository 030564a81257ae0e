"""Comparing a drilled run's final checkpoint with an uninterrupted run's, and explaining a difference."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from preemptible.events import Event
from preemptible.journal import COMMON, Record


def final_state(root: str | None, step: int, *, written_since: float | None = None) -> dict[str, str] | None:
    """The training state of a final checkpoint: each tensor file's checksum, and the JSON leaves. The RNG
    streams are left out: a generator the script never seeds (Python's, NumPy's) differs between any two
    runs, interrupted or not; the streams training draws from show in the weights. ``written_since``: the
    names of files the runs wrote since then are set aside (`files_written_aside`)."""
    if root is None:
        return None
    from preemptible.checkpoint import Checkpointer

    try:
        ck = Checkpointer(root)
        info = ck.verify(step)
        tree = json.loads(ck.storage.read_bytes(ck.storage.join(info.path, "state.json"), 1 << 30))["tree"]
    except Exception:
        return None
    if info.manifest is None:
        return None
    files = _plain_checksums(ck, info)
    state = {k: v for k, v in files.items() if not k.startswith("_rng")}
    tree = _without_records({k: v for k, v in tree.items() if not k.startswith("_")})
    if written_since is not None:
        tree = files_written_aside(tree, written_since)
    state["state.json"] = json.dumps(tree)
    return state


LIKELY_CAUSES = (
    "Likely causes, most common first: the batches after the resume are not the ones the uninterrupted run "
    "trained on (a batch fetched before the checkpoint and trained on after it, i.e. prefetched; a DataLoader "
    "iterator made before the restore, so its shuffle seed was drawn from the streams before they were put back; a "
    "loader whose position is not in the state: give a stateful loader to Run, or loop with run.batches); or "
    "random draws from a generator that is not saved (a torch.Generator of the script's own, a framework's private "
    "stream); or code keyed on the batch index (enumerate(run.batches(loader)) counts from 0 again after a resume "
    "mid-epoch: enumerate(run.batches(loader), run.batches_done) continues the epoch's count), which then runs "
    "its every-N-batches work (a sample, an evaluation that updates BatchNorm statistics) at other batches. "
    "Differences within a few units in the last place, all over, instead point at kernels that are not "
    "deterministic (threads, atomics): set torch.use_deterministic_algorithms(True)."
)


def explain_difference(
    ours_root: str | None, theirs_root: str, step: int, *, shown: int = 8, written_since: float | None = None
) -> str:
    """Which entries of two final checkpoints differ and by how much, with the likely causes: what a drill with
    ``--reference`` says when the resumed run did not end where the uninterrupted one did. ``written_since``: as
    for `Drill._final_state`."""
    from preemptible.checkpoint import Checkpointer
    from preemptible.state import flatten

    try:
        ours = Checkpointer(str(ours_root)).load(step)
        theirs = Checkpointer(theirs_root).load(step)
    except Exception as e:  # the comparison by checksum above stands; this only adds detail
        return f"(could not read both final checkpoints to compare entries: {e})"
    a = flatten({k: v for k, v in ours.items() if not k.startswith("_")})
    b = flatten({k: v for k, v in theirs.items() if not k.startswith("_")})
    lines: list[str] = []
    names = sorted(set(a.tensors) | set(b.tensors))
    tensor_diffs = []
    for name in names:
        x, y = a.tensors.get(name), b.tensors.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            tensor_diffs.append(f"{name}: only in one, or another shape/dtype")
            continue
        if torch_equal(x, y):
            continue
        diff = (x.double() - y.double()).abs()
        tensor_diffs.append(
            f"{name}: {int((diff > 0).sum())} of {x.numel()} values, max |difference| {float(diff.max()):.3g}"
        )
    if tensor_diffs:
        lines.append(f"{len(tensor_diffs)} of {len(names)} tensors differ:")
        lines += [f"  {d}" for d in tensor_diffs[:shown]]
        if len(tensor_diffs) > shown:
            lines.append(f"  ... and {len(tensor_diffs) - shown} more")
    trees = [_without_records(a.tree), _without_records(b.tree)]
    if written_since is not None:
        trees = [files_written_aside(t, written_since) for t in trees]
    leaves = _json_leaves(trees[0], ""), _json_leaves(trees[1], "")
    json_diffs = sorted(k for k in set(leaves[0]) | set(leaves[1]) if leaves[0].get(k) != leaves[1].get(k))
    if json_diffs:
        shown_leaves = ", ".join(f"{k} ({leaves[0].get(k)!r} vs {leaves[1].get(k)!r})" for k in json_diffs[:shown])
        lines.append(f"{len(json_diffs)} non-tensor values differ (resumed vs uninterrupted): {shown_leaves}")
    lines.append(LIKELY_CAUSES)
    return "\n".join(lines)


Figures = Mapping[int, list[dict[str, Any]]]
"""The figures a run logged (``run.log``), by step: one dict per ``log`` event, in the order logged."""


def logged_figures(events: Iterable[Record]) -> dict[int, list[dict[str, Any]]]:
    """The figures in ``events`` (one process start's journal): its ``log`` events by step, exactly as journaled."""
    out: dict[int, list[dict[str, Any]]] = {}
    for r in events:
        if r.event == Event.LOG and r.step is not None:
            out.setdefault(r.step, []).append({k: v for k, v in r.fields.items() if k not in COMMON})
    return out


def spliced(before: Figures, after: Figures, at: int) -> dict[int, list[dict[str, Any]]]:
    """One run's figures out of two process starts: the first one's before step ``at`` (where the second resumed),
    the second one's from there on (steps the first ran past its last checkpoint were redone by the second)."""
    return {**{s: v for s, v in before.items() if s < at}, **{s: v for s, v in after.items() if s >= at}}


_ABSENT = object()


@dataclass(frozen=True)
class Divergence:
    """The first step whose logged figures differ between the drilled run and the uninterrupted one."""

    step: int
    figure: str
    ours: Any
    reference: Any
    resumed_at: int

    @property
    def before_the_stop(self) -> bool:
        return self.step < self.resumed_at

    def describe(self) -> str:
        def shown(value: Any) -> str:
            return "not logged" if value is _ABSENT else repr(value)

        where = (
            f"step {self.step}, before the stop: the run already differs from the uninterrupted one before any "
            "preemption, so the script is not deterministic from one run to the next (an unseeded generator, "
            "kernels that are not deterministic: seed every generator, set torch.use_deterministic_algorithms(True)) "
            "and the comparison cannot judge the resume"
            if self.before_the_stop
            else f"step {self.step}, the {_ordinal(self.step - self.resumed_at + 1)} after the resume at step "
            f"{self.resumed_at}"
        )
        if self.step == self.resumed_at:
            where += (
                " (the very first step differs: it used something the checkpoint does not hold, such as a counter "
                "or a generator of the script's own not given to Run, or batches in another order)"
            )
        return (
            f"first differing step: {where}: {self.figure} {shown(self.ours)} in the drilled run, "
            f"{shown(self.reference)} in the uninterrupted one"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "figure": self.figure,
            "ours": None if self.ours is _ABSENT else self.ours,
            "reference": None if self.reference is _ABSENT else self.reference,
            "resumed_at": self.resumed_at,
            "before_the_stop": self.before_the_stop,
        }


def _ordinal(n: int) -> str:
    if n in (1, 2, 3):
        return ("first", "second", "third")[n - 1]
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def first_divergence(ours: Figures, reference: Figures, *, resumed_at: int) -> Divergence | None:
    """The first step whose figures differ (exact equality of the values as journaled: 1 and 1.0 differ), and the
    first figure that differs there, in the order the reference run logged them; None when every step's are equal.

    One step is not compared when the drilled run has no figures of it at all: the last step before the stop
    (``resumed_at - 1``). A framework logs a step's figures after its step-end hook (the HF Trainer's ``on_log``
    comes after ``on_step_end``), and the process stopped in that hook, so that step was trained and saved but
    never logged; the resumed run starts after it."""
    for step in sorted(set(ours) | set(reference)):
        a, b = ours.get(step, []), reference.get(step, [])
        if not a and step == resumed_at - 1:
            continue
        for i in range(max(len(a), len(b))):
            x, y = (a[i] if i < len(a) else {}), (b[i] if i < len(b) else {})
            for name in [*y, *(k for k in x if k not in y)]:
                mine, theirs = x.get(name, _ABSENT), y.get(name, _ABSENT)
                if mine != theirs or type(mine) is not type(theirs):
                    return Divergence(step, name, mine, theirs, resumed_at)
    return None


def torch_equal(x: Any, y: Any) -> bool:
    import torch

    return bool(torch.equal(x, y))


RECORDS = ("log_history",)
"""Keys whose values record what happened rather than hold training state (a framework's log), left out of the
comparison with the reference run; so are leaves that measure wall-clock time (``*runtime``, ``*per_second``)."""


MTIME_SLACK_S = 2.0
"""How long before the drill's start a directory's modification time may be and still count as written during it
(file systems that stamp coarsely, or a clock that moved)."""

WRITTEN = "<a file the run wrote>"


def files_written_aside(tree: Any, since: float) -> Any:
    """``tree`` with each absolute path to a file in a directory written since ``since`` (seconds of the file
    system's clock) replaced by `WRITTEN`, as a value or as a key (keys numbered in their order).

    Why: the reference run and the drilled one write the framework's own files (Lightning's ``ModelCheckpoint``,
    the HF Trainer's ``output_dir``) to the same place, unless the script derives that place from the root the drill
    overrides, so the second run's names get a version suffix (``epoch=2-step=56-v1.ckpt``) and the states
    differ in a way that says nothing about the resume. Paths to data the runs only read are left as they are: their
    directories were not written during the drill."""
    if isinstance(tree, dict):
        out: dict[Any, Any] = {}
        for i, (k, v) in enumerate(tree.items()):
            key = f"{WRITTEN} #{i}" if isinstance(k, str) and _written(k, since) else k
            out[key] = files_written_aside(v, since)
        return out
    if isinstance(tree, list):
        return [files_written_aside(v, since) for v in tree]
    if isinstance(tree, str) and _written(tree, since):
        return WRITTEN
    return tree


def _written(value: str, since: float) -> bool:
    if not os.path.isabs(value) or len(value) > 4096 or "\n" in value:
        return False
    try:
        return os.stat(os.path.dirname(value)).st_mtime >= since
    except (OSError, ValueError):  # not a path on this machine
        return False


def _without_records(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {
            k: _without_records(v)
            for k, v in sorted(tree.items())
            if k not in RECORDS and not str(k).endswith(("runtime", "per_second"))
        }
    if isinstance(tree, list):
        return [_without_records(v) for v in tree]
    return tree


def _json_leaves(tree: Any, path: str) -> dict[str, Any]:
    """Flattened non-tensor leaves of a tagged tree, by key path (tensor references compare as names)."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_json_leaves(v, f"{path}/{k}" if path else str(k)))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out.update(_json_leaves(v, f"{path}/{i}"))
    else:
        out[path] = tree
    return out


def _plain_checksums(ck: Any, info: Any) -> dict[str, str]:
    """Each tensor file's checksum as a plain safetensors file, by its plain name: a compressed file's decoded bytes
    are exactly that file, so two runs compare alike whether or not either compressed."""
    from preemptible.checkpoint.reader import open_tensor
    from preemptible.store import checksum, layout

    out: dict[str, str] = {}
    directory = info.manifest.file_dir(ck.storage.join, info.path)
    for name, rec in info.manifest.files.items():
        if not layout.is_tensor_file(name):
            continue
        if not name.endswith(".zst"):
            out[name] = rec.checksum
            continue
        hasher = checksum.new()
        buf = memoryview(bytearray(8 << 20))
        with open_tensor(ck.storage, ck.storage.join(directory, name), rec, None) as (source, _, _):
            while n := source.readinto(buf):
                hasher.update(buf[:n])
        out[name.removesuffix(".zst")] = hasher.hexdigest()
    return out
