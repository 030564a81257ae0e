"""What the framework integrations share: their options (those of `preemptible.Run` that apply to a framework's
trainer), the settings every ``PreemptibleCallback`` keeps, the framework's checkpoint cadence they take for their
periodic saves, and the fallback to the framework's own newest checkpoint after a crash. Imports no framework."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from preemptible import dist
from preemptible.events import Event
from preemptible.run import ROOT_ENV, Run
from preemptible.store.roots import is_url

log = logging.getLogger("preemptible")

OPTIONS = frozenset(
    {
        *("keep", "sources", "grace", "exit_code", "on_advisory", "requeue", "async_save", "bf16_moments"),
        *("probe", "probe_rtol", "verify_after_save", "compress", "allow_fresh_start", "storage_options", "guard"),
        *("clock", "monotonic", "trackers", "save_interval_s", "peer_timeout_s", "memory_tier"),
    }
)
"""`preemptible.Run`'s options that a framework callback passes on."""

NOT_PASSED = {
    "save_every": "the callback's own argument (counted in the framework's optimizer steps)",
    "exit_on_notice": "the callback's own argument",
    "prestage_every": "the framework owns the loop",
    "save_every_epochs": "the framework owns the epochs: use its own per-epoch checkpoints",
    "keep_best": "the framework keeps its own best model (its checkpoint callback); its metrics reach the journal "
    "for preemptible report only",
    "save_on_best": "the framework keeps its own best model (its checkpoint callback)",
    "per_rank": "the callback names the framework's per-rank state itself",
}
"""`preemptible.Run`'s other options, and why a callback does not take them (a test holds the two to Run's
signature: an option added to Run must be placed in one or the other). ``framework_fallback`` is the callbacks' own
and not Run's."""


_NOT_A_FIGURE = re.compile(r"runtime|per_second|flos|^train_loss$")
"""What a framework logs that is not a figure of the training itself: timings (``train_runtime``,
``train_samples_per_second``) and ``train_loss``, the HF Trainer's average over one process's steps, which differs
after a resume: a drill's exact comparison of figures would fail on them."""


def forward_figures(run: Run | None, metrics: Mapping[str, Any]) -> None:
    """What the framework logged (the HF Trainer's ``logs``, Lightning's ``callback_metrics``) into the run's journal
    as `Run.log` figures, so that ``preemptible report`` draws them: numbers and one-element tensors only (a string,
    a bool or a vector is left out; so are timings, `_NOT_A_FIGURE`). They are journaled as logged during the step
    before the boundary (the framework's ``global_step`` counts completed steps; `Run.log`'s step is 0-based).
    Nothing here can stop training: a run not started yet records nothing."""
    if run is None or run.journal is None:
        return
    figures: dict[str, Any] = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or _NOT_A_FIGURE.search(str(name)):
            continue
        if isinstance(value, int | float) or (isinstance(value, torch.Tensor) and value.numel() == 1):
            figures[str(name)] = value
    if figures:
        run._log_figures(max(run.step - 1, 0), figures)


@dataclass(frozen=True, kw_only=True)
class FrameworkCheckpoint:
    """One of the framework's own checkpoints (HF ``checkpoint-N``, a Lightning ``.ckpt``), seen from outside."""

    path: str
    step: int | None
    """Its global step, from its name (or, for a Lightning file without one, `lightning.pickled_step`); None when
    unknown."""
    mtime: float


def newest(found: Iterable[FrameworkCheckpoint], root: str) -> tuple[FrameworkCheckpoint | None, list[str]]:
    """The framework checkpoint a resume would use, and the paths refused because they lie inside preemptible's
    root (a framework checkpoint is never read from there).

    The rule: the highest step; among equal steps the newest file (mtime), then the greater path. A checkpoint
    whose step is unknown is chosen only when no other has a known step (the newest of them by mtime).
    """
    allowed: list[FrameworkCheckpoint] = []
    refused: list[str] = []
    for c in found:
        if inside(c.path, root):
            refused.append(c.path)
        else:
            allowed.append(c)
    known = [c for c in allowed if c.step is not None]
    pool = known or allowed
    if not pool:
        return None, refused
    return max(pool, key=lambda c: (c.step if c.step is not None else -1, c.mtime, c.path)), refused


def inside(path: str, root: str) -> bool:
    """Whether a local ``path`` is ``root`` or lies under it (links resolved). A URL root holds no local path."""
    if is_url(root):
        return False
    p, r = Path(path).resolve(), Path(root).resolve()
    return p == r or r in p.parents


def should_fall_back(framework: FrameworkCheckpoint | None, mine: int | None) -> bool:
    """Whether the framework's newest checkpoint is newer than preemptible's newest committed step ``mine``: a
    step known to be greater, or any framework checkpoint when preemptible has none."""
    if framework is None:
        return False
    if mine is None:
        return True
    return framework.step is not None and framework.step > mine


class Settings:
    """A callback's settings and the state every integration keeps (see the frameworks' ``PreemptibleCallback``)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        save_every: int | None,
        exit_on_notice: bool,
        options: dict[str, Any],
        framework_fallback: bool = True,
    ) -> None:
        unsupported = sorted(set(options) - OPTIONS)
        if unsupported:
            why = "".join(f"; {k}: {NOT_PASSED[k]}" for k in unsupported if k in NOT_PASSED)
            raise TypeError(
                f"PreemptibleCallback got options {unsupported}; expected those of preemptible.Run that apply to a "
                f"Trainer: {sorted(OPTIONS)}{why}"
            )
        whole = isinstance(save_every, int) and not isinstance(save_every, bool)
        if save_every is not None and (not whole or save_every < 0):
            raise ValueError(
                f"expected save_every to be a whole number of optimizer steps >= 1, 0 (no periodic saves) or None (the "
                f"framework's own checkpoint cadence); found {save_every!r}"
            )
        self.root = os.fspath(root)
        self.save_every = save_every
        self.exit_on_notice = exit_on_notice
        self.framework_fallback = framework_fallback
        self.options = options
        self.preempted = False
        """True once a notice stopped training (only seen with ``exit_on_notice=False``: otherwise the process ends)."""
        self.run: Run | None = None
        """The `preemptible.Run` underneath (journal, guard, checkpointer), once training or the resume began."""
        self.fallback: FrameworkCheckpoint | None = None
        """The framework's own checkpoint the framework resumes from (see ``framework_fallback``), or None."""
        self._trainer: Any = None

    @property
    def _run_save_every(self) -> int | None:
        """``save_every`` as `Run` takes it: 0 (off) is None; None is decided at train begin (`take_cadence`)."""
        return self.save_every or None

    def take_cadence(self, run: Run, found: tuple[int, str] | None) -> None:
        """Save at the framework's own checkpoint cadence, ``found`` as (every, where it came from), unless the user
        gave ``save_every`` (0 included): then a crash never loses more than the framework alone would."""
        if self.save_every is not None or found is None:
            return
        every, source = found
        run.save_every = every
        run.schedule.save_every = every
        if run.journal is not None:
            run.journal.event(Event.CADENCE, None, save_every=every, source=source)
        log.info(
            "[rank=%d] periodic saves every %d steps, the framework's own cadence (%s); save_every= sets another, "
            "save_every=0 none",
            run.rank,
            every,
            source,
        )

    def choose_fallback(self, found: Iterable[FrameworkCheckpoint], mine: int | None, framework: str) -> None:
        """Decide whether the framework resumes from its own newest checkpoint (`fallback`): only when preemptible's
        root holds no committed checkpoint as new (``mine``: its newest step), and ``framework_fallback`` is on."""
        self.fallback = None
        root = os.environ.get(ROOT_ENV, "").strip() or self.root
        candidate, refused = newest(found, root)
        for path in refused:
            log.warning(
                "[rank=%d] expected the %s checkpoints outside preemptible's root %s; found %s inside it, which is "
                "never read as a framework checkpoint. Give the framework its own output directory",
                _rank(),
                framework,
                root,
                path,
            )
        if not should_fall_back(candidate, mine):
            return
        assert candidate is not None
        if not self.framework_fallback:
            log.warning(
                "[rank=%d] %s's own checkpoint %s (step %s) is newer than preemptible's newest (%s) under %s, and "
                "framework_fallback=False: it is ignored, training %s",
                _rank(),
                framework,
                candidate.path,
                candidate.step if candidate.step is not None else "unknown",
                mine if mine is not None else "none",
                root,
                "starts at step 0" if mine is None else f"resumes at step {mine}",
            )
            return
        self.fallback = candidate

    def fell_back(self, run: Run, framework: str) -> int:
        """The run's resume when the framework resumes from its own checkpoint: journaled, warned; its step."""
        fallback = self.fallback
        assert fallback is not None
        assert run.journal is not None
        mine = run.checkpointer.latest()
        run.journal.event(
            Event.FRAMEWORK_FALLBACK,
            fallback.step,
            framework=framework,
            path=fallback.path,
            framework_step=fallback.step,
            preemptible_step=mine,
        )
        log.warning(
            "[rank=%d] %s resumes from its own checkpoint %s (step %s): preemptible's root %s holds no checkpoint as "
            "new (newest: %s; a crash or kill before a save landed). preemptible neither wrote nor verified that file: "
            "%s loads it itself, and unpickles it. PreemptibleCallback(framework_fallback=False) turns this off",
            run.rank,
            framework,
            fallback.path,
            fallback.step if fallback.step is not None else "unknown",
            run.root,
            mine if mine is not None else "none",
            framework,
        )
        return fallback.step if fallback.step is not None else 0


def _rank() -> int:
    return dist.rank()
