"""PyTorch Lightning, preemption-safe:

    from preemptible.integrations.lightning import PreemptibleCallback
    cb = PreemptibleCallback("s3://bucket/run1")
    trainer = L.Trainer(..., callbacks=[cb])
    trainer.fit(model, datamodule, ckpt_path=cb.resume_from)

What it does:
- **Notices.** Every source `preemptible.Run` has, with their real deadlines. While fitting, Lightning's own
  SIGTERM handling (which raises ``SIGTERMException`` at the next batch and exits with no checkpoint) and its SLURM
  handler (which saves and requeues inside the signal handler) are taken out; they come back after ``fit``.
- **Stop.** At the first optimizer-step boundary after a notice (``on_train_batch_end`` once ``global_step`` has
  moved), on every rank at the agreed step, it writes the checkpoint through preemptible's writer and commit
  protocol and ends the process with the exit policy's code (``SystemExit``). With ``exit_on_notice=False``, ``fit``
  returns instead (``trainer.should_stop``) and ``cb.preempted`` is True.
- **Resume.** ``cb.resume_from`` names preemptible's newest checkpoint (None on a fresh start). Lightning hands it
  to its ``CheckpointIO``, which the callback replaces (in ``setup``) by one that restores preemptible's newest
  checkpoint that verifies (checksums; the probe when given; else the previous one) and gives Lightning the
  dictionary its own resume reads: weights, optimizers, schedulers, precision plugin, callbacks (ModelCheckpoint's
  best/top-k), loop progress. Nothing is unpickled. Other paths (your own ``.ckpt`` files) go to Lightning's own
  ``CheckpointIO`` as before.
- **Framework fallback.** After a crash (``kill -9``, an OOM kill) that left a ``ModelCheckpoint`` file newer than
  any committed checkpoint of preemptible's, ``cb.resume_from`` names that file and Lightning loads it through its
  own ``CheckpointIO``, which unpickles it: the one exception to "nothing is unpickled", with a warning that
  preemptible neither wrote nor verified it and a ``framework_fallback`` journal event. The newest is picked by the
  step in the name (``step=N``, Lightning's default), else the ``global_step`` read off the file's pickle opcodes
  without unpickling it (``last.ckpt``); among equal steps the newer file; a file whose step cannot be read only
  when no other has one. Never a file inside preemptible's root. The interrupted epoch's data then restart from a
  new iterator, as Lightning's own resume does for a plain ``DataLoader`` (not bit-identical).
  ``framework_fallback=False`` turns it off (the newer file is then named in a warning and ignored).
- **Exact mid-epoch.** Each training ``DataLoader`` is wrapped so that Lightning sees it as resumable: a resume
  remakes the interrupted epoch's iterator as it was (the random streams and the sampler's own generator and
  epoch as at that epoch's start), skips the batches done, then puts the random streams back as they were at the
  save. Lightning does not save the global random streams; preemptible does (per rank).
- **Checkpoints.** ``ModelCheckpoint`` goes on beside it, and by default preemptible saves at the cadence of its
  ``every_n_train_steps`` (the smallest, with several), journaled once as ``cadence``, so that a crash never loses
  more than Lightning alone would. ``save_every=N`` sets another cadence (in optimizer steps), ``save_every=0`` none.
"""

from __future__ import annotations

import logging
import os
import pickletools
import re
import sys
import zipfile
from collections.abc import Iterator
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.plugins.io import CheckpointIO

from preemptible.errors import PreemptibleError
from preemptible.integrations._common import FrameworkCheckpoint, Settings, forward_figures
from preemptible.loaders import loader_streams, put_back_loader_streams
from preemptible.run import Run
from preemptible.state import RNGState
from preemptible.trackers import purge_from

log = logging.getLogger("preemptible")

SCHEME = "preemptible:"
"""``cb.resume_from`` is ``preemptible:<root>``: the callback's CheckpointIO reads it; Lightning never opens it."""

_LEFT_OUT = ("state_dict", "hyper_parameters", "hparams_name", "hparams_type", "datamodule_hyper_parameters")
"""Keys of Lightning's checkpoint dictionary not kept in the "lightning" entry: the weights (the "model" entry) and
hyper-parameters (arbitrary objects; the script that builds the module gives them again)."""


class _LightningParts:
    """Lightning's own checkpoint dictionary (``dump_checkpoint``), less the weights and hyper-parameters."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        full = self._trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        return {k: v for k, v in full.items() if k not in _LEFT_OUT}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # never: restored into a dict, handed to Lightning
        raise NotImplementedError


class _Resumable:
    """A training DataLoader as Lightning sees it: the same batches, plus ``state_dict``/``load_state_dict``, so a
    resume can skip the batches its epoch had done, in their order (see the module docs)."""

    def __init__(self, inner: Any, callback: PreemptibleCallback, index: int) -> None:
        self.inner = inner
        self._cb = callback
        self._index = index
        self.completed = 0
        """Batches of this epoch trained on (set at each batch end: the fetcher runs one batch ahead)."""
        self.streams: dict[str, Any] | None = None
        """The random streams and the loader's own, as at this epoch's start."""
        self._skip = 0
        self._next: dict[str, Any] | None = None
        """The loader's own streams as they were at the save, for the epoch after it (see load_state_dict)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def state_dict(self) -> dict[str, Any]:
        return {"completed": self.completed}  # the streams are per rank: the callback keeps them ("lightning_rank")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._cb.fallback is not None:
            return  # Lightning's own file: its interrupted epoch starts a new iterator, as for a plain DataLoader
        done = int(state.get("completed", 0))
        self.streams = self._cb._epoch_streams.get(str(self._index))
        self._skip = done
        if done >= _length(self.inner):  # saved at the epoch's last batch: Lightning starts the next epoch itself
            self._skip = 0
            self._next = self._cb._loader_now.get(str(self._index))

    def __iter__(self) -> Iterator[Any]:
        skip, self._skip = self._skip, 0
        if skip and self.streams is None:
            raise PreemptibleError(
                f"expected the random streams of the interrupted epoch's start in the checkpoint, to skip its {skip} "
                "done batches in their order; found none. Resume with the callback that wrote it"
            )
        if skip:
            assert self.streams is not None
            RNGState().load_state_dict(self.streams["global"])
            put_back_loader_streams(self.inner, self.streams)
            iterator = iter(self.inner)
            for _ in range(skip):
                next(iterator, None)
        else:
            if self._next is not None:  # the first epoch after a resume: its sampler continues where it was
                put_back_loader_streams(self.inner, self._next)
                self._next = None
            self._cb._restore_streams()  # ... and its shuffle draws from the streams as they were at the save
            self.streams = {"global": RNGState().state_dict(), **loader_streams(self.inner)}
            iterator = iter(self.inner)
        self.completed = skip
        if skip:
            self._cb._restore_streams()  # training resumes from the streams as they were at the save
        yield from iterator


def _length(loader: Any) -> float:
    try:
        return len(loader)
    except TypeError:  # an iterable without a length: never "at its end" by count
        return float("inf")


class _PreemptibleIO(CheckpointIO):
    """Lightning's CheckpointIO with one more path: ``preemptible:<root>`` loads from preemptible's checkpoint."""

    def __init__(self, inner: Any, callback: PreemptibleCallback) -> None:
        super().__init__()
        self.inner = inner
        self._cb = callback

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: Any = None) -> dict[str, Any]:
        if isinstance(path, str) and path.startswith(SCHEME):
            return self._cb._load()
        return dict(self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only))

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


class PreemptibleCallback(Callback, Settings):
    """Preemption safety for a Lightning ``Trainer`` (see the module docs).

    Args:
        root: where checkpoints and the journal live: a local path or an s3://, gs://, az:// URL.
        save_every: also save every this many optimizer steps. None (default): at the cadence of the Trainer's
            ``ModelCheckpoint(every_n_train_steps=N)`` callbacks (the smallest N), else only on a notice and at the
            end. 0: no periodic saves.
        exit_on_notice: True (default) ends the process after the emergency save; False makes ``fit`` return,
            with `preempted` True.
        framework_fallback: True (default): when a ``ModelCheckpoint`` file is newer than preemptible's newest
            committed checkpoint (after a crash or kill), ``resume_from`` names it and Lightning resumes from it
            itself, with a warning and a ``framework_fallback`` journal event. False: ignored, with a warning.
        **options: `preemptible.Run`'s options where they apply (as for the transformers integration).

    Raises:
        TypeError: an option `Run` does not apply to a Trainer (the message says why).
        PreemptibleError: fitting over existing checkpoints without ``ckpt_path=cb.resume_from``.

    Examples:
        The three lines a training script adds (``L.Trainer(..., callbacks=[cb])`` and
        ``trainer.fit(model, loader, ckpt_path=cb.resume_from)`` are the other two):

        >>> import tempfile
        >>> from preemptible.integrations.lightning import PreemptibleCallback
        >>> cb = PreemptibleCallback(tempfile.mkdtemp(), save_every=50)
        >>> cb.exit_on_notice, cb.preempted  # resume_from is read once the Trainer holds cb
        (True, False)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        save_every: int | None = None,
        exit_on_notice: bool = True,
        framework_fallback: bool = True,
        **options: Any,
    ) -> None:
        Settings.__init__(self, root, save_every, exit_on_notice, options, framework_fallback)
        self._held: dict[str, Any] = {}
        self._mine: dict[str, Any] = {}
        self._epoch_streams: dict[str, Any] = {}
        self._loader_now: dict[str, Any] = {}
        self._resumed_streams: dict[str, Any] | None = None
        self._loaders: list[_Resumable] = []
        self._last_step = -1
        self._loaded = False
        self._looked = False  # resume_from has looked at the Trainer's ModelCheckpoint files

    @property
    def resume_from(self) -> str | None:
        """``preemptible:<root>`` when the root holds a committed checkpoint (verified, with fallback, when Lightning
        loads it at the start of ``fit``), else None: pass it as ``trainer.fit(..., ckpt_path=cb.resume_from)``.
        After a crash that left a ``ModelCheckpoint`` file newer than any of preemptible's: that file's path (see
        ``framework_fallback``; the Trainer holding this callback is found in the calling code's variables).

        Returns:
            ``preemptible:<root>``, a ``ModelCheckpoint`` file (``framework_fallback``), or None on a fresh start.

        Raises:
            PreemptibleError: read before ``L.Trainer(..., callbacks=[cb])`` was built.

        Examples:
            ``trainer.fit(model, loader, ckpt_path=cb.resume_from)``: ``tests/e2e/test_lightning.py`` runs it through a
            real preemption and resume.
        """
        from preemptible.checkpoint import Checkpointer

        root = os.environ.get("PREEMPTIBLE_ROOT", "").strip() or self.root
        found = Checkpointer(root, storage_options=self.options.get("storage_options")).latest()
        trainer = self._trainer if self._trainer is not None else _calling_trainer(self)
        if trainer is not None:
            self._looked = True
            self.choose_fallback(checkpoints(trainer), found, "lightning")
            if self.fallback is not None:
                return self.fallback.path
        return None if found is None else f"{SCHEME}{root}"

    # Lightning's hooks ---------------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """At ``fit``: registers preemptible's checkpoint IO beside Lightning's and wraps the data loaders so their
        position is saved.

        Args:
            trainer: the Lightning ``Trainer``.
            pl_module: the ``LightningModule`` being fitted.
            stage: ``fit`` (other stages are left alone).

        Returns:
            None.

        Raises:
            Nothing: no error of its own.

        Examples:
            The framework calls it; ``tests/e2e/test_lightning.py`` runs it under real training.
        """
        if stage != "fit":
            return
        self._trainer = trainer
        if not isinstance(trainer.strategy.checkpoint_io, _PreemptibleIO):
            trainer.strategy.checkpoint_io = _PreemptibleIO(trainer.strategy.checkpoint_io, self)
        fit_loop = trainer.fit_loop
        original = fit_loop._load_combined_loader_states

        def wrap_then_load() -> None:
            combined = fit_loop._combined_loader
            if combined is not None:
                self._loaders = []
                flattened = []
                for i, loader in enumerate(combined.flattened):
                    wrapped = loader if isinstance(loader, _Resumable) else _Resumable(loader, self, i)
                    self._loaders.append(wrapped)
                    flattened.append(wrapped)
                combined.flattened = flattened
            original()

        fit_loop._load_combined_loader_states = wrap_then_load
        if self.run is None:
            self.run = Run(
                self.root,
                save_every=self._run_save_every,
                exit_on_notice=self.exit_on_notice,
                per_rank=["lightning_rank"],
                model=pl_module,
                lightning=self._held,
                lightning_rank=self._mine,
                **self.options,
            )

    def _load(self) -> dict[str, Any]:
        """The checkpoint dictionary Lightning's resume reads, from preemptible's newest valid checkpoint."""
        run = self.run
        if run is None:
            raise PreemptibleError(
                "expected the Lightning Trainer to call PreemptibleCallback.setup() before loading "
                f"{SCHEME}: register the callback with Trainer(callbacks=[cb])"
            )
        before = RNGState().state_dict()
        start = run.start_step  # restores into the module and the holders, verified, with fallback
        self._resumed_streams = RNGState().state_dict()
        RNGState().load_state_dict(before)  # put back after the data loader has made its iterator (_Resumable)
        self._loaded = True
        if run.resumed_from is None or "loops" not in self._held:
            raise PreemptibleError(
                f"expected a checkpoint written by the Lightning PreemptibleCallback under {run.root}; found "
                f"{'none' if run.resumed_from is None else f'step {start} without Lightning state'}"
            )
        self._epoch_streams = dict(self._mine.get("epoch_streams", {}))
        self._loader_now = dict(self._mine.get("now", {}))
        log.info("[rank=%d] Lightning resumes at global step %d from %s", run.rank, start, run.root)
        module = self._trainer.lightning_module
        return {**self._held, "state_dict": module.state_dict()}

    def _restore_streams(self) -> None:
        if self._resumed_streams is not None:
            RNGState().load_state_dict(self._resumed_streams)
            self._resumed_streams = None

    def _take_signals(self, trainer: Any) -> None:
        """Lightning's SIGTERM/SLURM handlers (registered after on_fit_start) out, the guard's back; a SIGTERM that
        reached Lightning's handler meanwhile reached the guard's too (Lightning chains the handler it found)."""
        connector = trainer._signal_connector
        connector.teardown()
        connector.received_sigterm = False

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        """Takes SIGTERM/SIGUSR1 from Lightning's own handlers before validation's sanity check, so a notice is never
        lost to them.

        Args:
            trainer: the Lightning ``Trainer``.
            pl_module: the ``LightningModule`` being fitted.

        Returns:
            None.

        Raises:
            Nothing: no error of its own.

        Examples:
            The framework calls it; ``tests/e2e/test_lightning.py`` runs it under real training.
        """
        self._take_signals(trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Takes the signals again (Lightning installs its handlers when training starts).

        Args:
            trainer: the Lightning ``Trainer``.
            pl_module: the ``LightningModule`` being fitted.

        Returns:
            None.

        Raises:
            Nothing: no error of its own.

        Examples:
            The framework calls it; ``tests/e2e/test_lightning.py`` runs it under real training.
        """
        self._take_signals(trainer)
        fallback = self.fallback
        if fallback is not None and fallback.step is not None and trainer.global_step != fallback.step:
            assert self.run is not None
            self.run.close()
            raise PreemptibleError(
                f"expected trainer.fit(..., ckpt_path=cb.resume_from) to resume at step {fallback.step} from "
                f"Lightning's own {fallback.path}; found Lightning at step {trainer.global_step}. Pass cb.resume_from"
            )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Opens the run and restores what ``resume_from`` named: the module, optimizers, schedulers, loops, random
        streams and the loaders' position.

        Args:
            trainer: the Lightning ``Trainer``.
            pl_module: the ``LightningModule`` being fitted.

        Returns:
            None.

        Raises:
            PreemptibleError: fitting over existing checkpoints while ``ckpt_path`` was not given
                ``cb.resume_from``.

        Examples:
            The framework calls it; ``tests/e2e/test_lightning.py`` runs it under real training.
        """
        run = self.run
        assert run is not None
        if self.fallback is not None:  # Lightning loads its own file (ckpt_path=cb.resume_from)
            path = self.fallback.path

            def resume() -> int:
                step = self.fell_back(run, "lightning")
                run._inexact(
                    "framework checkpoint",
                    f"Lightning's own resume of {path} starts the interrupted epoch's data from a new iterator: its "
                    "order and the random streams differ from the interrupted run's",
                )
                return step

            run._begin(None, resume=resume)
        elif not self._loaded:
            if not self._looked and trainer.ckpt_path is None:  # resume_from was not read, or found no Trainer
                self.choose_fallback(checkpoints(trainer), run.checkpointer.latest(), "lightning")
                fallback, self.fallback = self.fallback, None
                if fallback is not None:
                    run.close()
                    raise PreemptibleError(
                        f"expected trainer.fit(..., ckpt_path=cb.resume_from): Lightning's own {fallback.path} is "
                        f"newer than any checkpoint under {run.root}, and fitting from step 0 would lose it. Pass "
                        "cb.resume_from (read where the Trainer is a variable), or remove the file to start over"
                    )
            start = run.start_step
            if run.resumed_from is not None:
                run.close()
                raise PreemptibleError(
                    f"expected trainer.fit(..., ckpt_path=cb.resume_from): {run.root} holds a checkpoint of step "
                    f"{start}, and fitting from step 0 would lose it. Pass cb.resume_from, or give a new root"
                )
        for logger in trainer.loggers:  # TensorBoardLogger's writer: flushed on a notice, continued at the step
            writer = getattr(logger, "experiment", None) if type(logger).__name__ == "TensorBoardLogger" else None
            if writer is not None and callable(getattr(writer, "flush", None)):
                run.trackers.add(writer)
                resumed = run.resumed_from if self.fallback is None else self.fallback.step
                if resumed is not None and hasattr(writer, "_get_file_writer"):
                    purge_from(writer, resumed)
        run.state["lightning"] = _LightningParts(trainer)
        run.state["lightning_rank"] = _RankParts(self)
        self._last_step = trainer.global_step
        self.take_cadence(run, cadence(trainer))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """The step boundary after each optimizer step (not each accumulated batch): what the module logged goes to the
        journal at Lightning's logging cadence, a due periodic save runs, and on a notice the emergency save and the
        exit (or ``trainer.should_stop`` with ``exit_on_notice=False``).

        Args:
            trainer: the Lightning ``Trainer``.
            pl_module: the ``LightningModule`` being fitted.
            outputs: the training step's outputs (unused).
            batch: the batch (unused).
            batch_idx: its index in the epoch: the loaders' saved position.

        Returns:
            None.

        Raises:
            Nothing: the emergency path exits with the exit policy's code.

        Examples:
            The framework calls it; ``tests/e2e/test_lightning.py`` runs it under real training.
        """
        for loader in self._loaders:
            loader.completed = batch_idx + 1
        step = trainer.global_step
        if step == self._last_step:
            return  # accumulating gradients: no optimizer step yet, not a boundary
        self._last_step = step
        assert self.run is not None
        stop = self.run.boundary(step)  # True only with exit_on_notice=False: otherwise the process has ended
        if step % max(1, trainer.log_every_n_steps or 1) == 0:  # Lightning's own logging cadence
            forward_figures(self.run, trainer.callback_metrics)  # what the module logged, for preemptible report
        if stop:
            self.preempted = True
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Commits the final checkpoint unless the run was preempted.

        Args:
            trainer: the Lightning ``Trainer``.
            pl_module: the ``LightningModule`` being fitted.

        Returns:
            None.

        Raises:
            Nothing: no error of its own.

        Examples:
            The framework calls it; ``tests/e2e/test_lightning.py`` runs it under real training.
        """
        run = self.run
        if run is not None and not self.preempted:
            run._finish(trainer.global_step)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """After ``fit``: closes the run (sources stopped, handlers restored, the journal's exit).

        Args:
            trainer: the Lightning ``Trainer``.
            pl_module: the ``LightningModule`` being fitted.
            stage: ``fit`` (other stages are left alone).

        Returns:
            None.

        Raises:
            Nothing: no error of its own.

        Examples:
            The framework calls it; ``tests/e2e/test_lightning.py`` runs it under real training.
        """
        if stage == "fit" and self.run is not None:
            self.run.close()


class _RankParts:
    """This rank's part of the data position: each loader's streams at its epoch's start (per rank: ranks may draw
    differently)."""

    def __init__(self, callback: PreemptibleCallback) -> None:
        self._cb = callback

    def state_dict(self) -> dict[str, Any]:
        loaders = self._cb._loaders
        return {
            "epoch_streams": {str(i): x.streams for i, x in enumerate(loaders) if x.streams},
            "now": {str(i): loader_streams(x.inner) for i, x in enumerate(loaders)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:  # never: restored into a dict
        raise NotImplementedError


def cadence(trainer: Any) -> tuple[int, str] | None:
    """The most frequent step cadence of the Trainer's ``ModelCheckpoint(every_n_train_steps=N)`` callbacks, and
    where it came from; None when none saves by steps."""
    every = [
        n
        for c in getattr(trainer, "checkpoint_callbacks", [])
        if isinstance(n := getattr(c, "_every_n_train_steps", 0), int) and n > 0
    ]
    if not every:
        return None
    return min(every), f"lightning every_n_train_steps={min(every)}"


_STEP = re.compile(r"(?:^|[^A-Za-z0-9_])step=(\d+)")
_MAX_PICKLE = 64 * 2**20
"""The largest ``data.pkl`` of a ``.ckpt`` whose step `pickled_step` reads (tensors are stored beside it)."""


def checkpoints(trainer: Any) -> list[FrameworkCheckpoint]:
    """The ``.ckpt`` files of the Trainer's ``ModelCheckpoint`` callbacks: each one's ``dirpath``, else Lightning's
    default (``<default_root_dir>/checkpoints`` without a logger; the first logger's version directory with one,
    which a restart finds only when the version is fixed). The step comes from the name (``step=N``, Lightning's
    default), else from the file (`pickled_step`)."""
    found: dict[str, FrameworkCheckpoint] = {}
    for callback in getattr(trainer, "checkpoint_callbacks", []):
        directory = getattr(callback, "dirpath", None) or _default_dir(trainer)
        try:
            entries = list(os.scandir(directory))
        except (OSError, TypeError):
            continue
        for entry in entries:
            try:
                if not entry.name.endswith(".ckpt") or not entry.is_file() or entry.path in found:
                    continue
                m = _STEP.search(entry.name[: -len(".ckpt")])
                step = int(m[1]) if m else pickled_step(entry.path)
                found[entry.path] = FrameworkCheckpoint(path=entry.path, step=step, mtime=entry.stat().st_mtime)
            except OSError:
                continue
    return list(found.values())


def _default_dir(trainer: Any) -> str:
    """Where a ``ModelCheckpoint`` without a ``dirpath`` saves (as Lightning resolves it in its ``setup``)."""
    loggers = getattr(trainer, "loggers", [])
    if loggers:
        logger = loggers[0]
        version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
        return os.path.join(str(logger.save_dir or trainer.default_root_dir), str(logger.name), version, "checkpoints")
    return os.path.join(str(trainer.default_root_dir), "checkpoints")


def pickled_step(path: str) -> int | None:
    """The ``global_step`` a Lightning ``.ckpt`` (a ``torch.save`` zip) holds, read from the opcodes of its
    ``data.pkl`` (`pickletools.genops`): nothing is unpickled, nothing built or imported. None when the file is not
    one, or the step is not the int after the first ``"global_step"`` key."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if len(names) != 1 or z.getinfo(names[0]).file_size > _MAX_PICKLE:
                return None
            data = z.read(names[0])
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError):
        return None
    after_key = False
    try:
        for op, arg, _ in pickletools.genops(data):
            if after_key:
                if op.name in ("BINPUT", "LONG_BINPUT", "MEMOIZE", "PUT"):
                    continue
                if op.name in ("BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG") and isinstance(arg, int):
                    return arg if arg >= 0 else None
                return None
            after_key = op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8") and arg == "global_step"
    except (ValueError, EOFError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        return None
    return None


def _calling_trainer(callback: PreemptibleCallback) -> Any:
    """The Lightning Trainer holding ``callback``, among the variables of the code reading ``cb.resume_from`` (a
    callback is given no Trainer before ``fit``)."""
    frame: Any = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        for value in list(frame.f_locals.values()):
            for candidate in (value, _trainer_of(value)):
                if isinstance(candidate, Trainer) and any(c is callback for c in getattr(candidate, "callbacks", [])):
                    return candidate
        frame = frame.f_back
    return None


def _trainer_of(value: Any) -> Any:
    """``value.trainer`` (a LightningModule's), or None: a module not attached to a Trainer yet raises RuntimeError
    from that property (Lightning 2.x), and any other object may raise anything from an attribute it computes."""
    if isinstance(value, type):
        return None
    try:
        return getattr(value, "trainer", None)
    except Exception:  # a property that refuses (LightningModule before fit): not this callback's Trainer
        return None
