"""The Hugging Face ``Trainer``, preemption-safe:

    from preemptible.integrations.transformers import PreemptibleCallback
    cb = PreemptibleCallback("s3://bucket/run1")
    trainer = Trainer(..., callbacks=[cb])
    trainer.train(resume_from_checkpoint=cb.resume_from)

What it does:
- **Notices.** Every source `preemptible.Run` has (signals, AWS, GCP, Azure, SLURM, the ``preemptible run`` relay),
  with their real deadlines. While training, its SIGTERM/SIGUSR1 handlers replace the Trainer's own
  (``enable_jit_checkpoint``), which come back when training ends.
- **Stop.** At the first optimizer-step boundary after a notice (``on_step_end``: after the optimizer and scheduler
  stepped and ``global_step`` counted it), on every rank at the agreed step, it writes the checkpoint through
  preemptible's writer and commit protocol, then ends the process with the exit policy's code (``SystemExit``),
  so the script's code after ``train()`` does not run as if training had finished. With ``exit_on_notice=False``,
  ``train()`` returns instead and ``cb.preempted`` is True.
- **Resume.** ``cb.resume_from``, read the first time, restores the newest checkpoint that verifies (checksums; the
  probe when given; falling back to the previous one otherwise) and returns a small local directory holding the
  ``trainer_state.json`` the Trainer reads (global step, epoch, log history). The Trainer's own resume then runs as
  usual (it skips the batches done in the epoch and puts the random streams back after the first batch), but
  the weights, optimizer, scheduler, scaler and random streams come from preemptible's checkpoint (safetensors
  and JSON): nothing is unpickled. None on a fresh start.
- **Checkpoints.** The Trainer's own ``save_steps`` checkpoints go on beside it, and by default preemptible saves at
  the same cadence (``save_strategy="steps"``; ``save_steps`` below 1 is a fraction of ``max_steps``), journaled
  once as ``cadence``, so that a crash never loses more than the Trainer alone would. ``save_every=N`` sets another
  cadence (in optimizer steps), ``save_every=0`` none. Written in the background unless ``async_save=False``.
- **Framework fallback.** After a crash (``kill -9``, an OOM kill) that left the Trainer's own newest
  ``checkpoint-N`` in ``output_dir`` newer than any committed checkpoint of preemptible's, ``cb.resume_from`` names
  that directory and the Trainer resumes from it through its own loaders, which unpickle its files: the one
  exception to "nothing is unpickled", with a warning that preemptible neither wrote nor verified it and a
  ``framework_fallback`` journal event. Never a directory inside preemptible's root. ``framework_fallback=False``
  turns it off (the newer checkpoint is then named in a warning and ignored).

What it needs: the Trainer's standard data loading (``accelerate``'s seedable sampler, the default), which makes
the data order a function of the seed and the epoch. ``model_init`` (a model re-made inside ``train()``), DeepSpeed
and FSDP are not supported yet: it says so when it meets them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from transformers import Trainer, TrainerCallback

from preemptible.errors import PreemptibleError
from preemptible.integrations._common import FrameworkCheckpoint, Settings, forward_figures
from preemptible.run import Run
from preemptible.state import RNGState
from preemptible.trackers import purge_from

log = logging.getLogger("preemptible")

STATE_FILE = "trainer_state.json"
"""What the Trainer reads from ``resume_from_checkpoint`` itself (JSON; the rest comes from preemptible)."""


class _TrainerParts:
    """What the Trainer makes inside ``train()``, as two state entries. ``shared``: optimizer, scheduler and scaler,
    the same on every rank under DDP (saved once). ``rank``: the ``TrainerState`` (as ``save_to_json`` writes it)
    and the loss-logging accumulators, which differ between ranks (saved per rank). Restored into plain dicts
    first, and loaded into the live objects when the Trainer asks for them."""

    def __init__(self, trainer: Any, part: str) -> None:
        self._trainer = trainer
        self._part = part

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        if self._part == "rank":
            trainer.store_flos()  # as the Trainer's own saves do: the FLOPs so far into the state
            return {
                "state": json.loads(json.dumps(dataclasses.asdict(trainer.state))),
                "logging": {  # the loss summed since the last log: the first log after a resume averages all of it
                    name: value.detach().clone() if hasattr(value, "detach") else value
                    for name in _LOGGING
                    if (value := getattr(trainer, name, None)) is not None
                },
            }
        parts: dict[str, Any] = {"optimizer": trainer.optimizer.state_dict()}
        if trainer.lr_scheduler is not None:
            parts["scheduler"] = trainer.lr_scheduler.state_dict()
        scaler = getattr(trainer.accelerator, "scaler", None)
        if scaler is not None:
            parts["scaler"] = scaler.state_dict()
        return parts

    def load_state_dict(self, state: dict[str, Any]) -> None:  # never: restored into a dict (see PreemptibleCallback)
        raise NotImplementedError


class PreemptibleCallback(TrainerCallback, Settings):
    """Preemption safety for a Hugging Face ``Trainer`` (see the module docs).

    Args:
        root: where checkpoints and the journal live: a local path or an s3://, gs://, az:// URL.
        save_every: also save every this many optimizer steps (``global_step``). None (default): at the Trainer's
            own cadence when it saves by steps (``save_strategy="steps"``, ``save_steps``, a fraction of
            ``max_steps`` when below 1), else only on a notice and at the end. 0: no periodic saves.
        exit_on_notice: True (default) ends the process after the emergency save; False makes ``train()`` return,
            with `preempted` True.
        framework_fallback: True (default): when the Trainer's own newest ``checkpoint-N`` in ``output_dir`` is newer
            than preemptible's newest committed checkpoint (after a crash or kill), ``resume_from`` names it and the
            Trainer resumes from it itself, with a warning and a ``framework_fallback`` journal event. False: ignored,
            with a warning.
        **options: `preemptible.Run`'s options where they apply: ``keep``, ``sources``, ``grace``, ``exit_code``,
            ``on_advisory``, ``requeue``, ``async_save``, ``bf16_moments``, ``probe``, ``probe_rtol``,
            ``verify_after_save``, ``compress``, ``allow_fresh_start``, ``storage_options``, ``save_interval_s``
            (timed saves: by rank 0's clock under torchrun).

    Raises:
        TypeError: an option `Run` does not apply to a Trainer (``prestage_every``, ``keep_best``, ...: the
            message says why).
        PreemptibleError: training over existing checkpoints without ``resume_from_checkpoint``.

    Examples:
        The three lines a training script adds (``Trainer(..., callbacks=[cb])`` and
        ``trainer.train(resume_from_checkpoint=cb.resume_from)`` are the other two):

        >>> import tempfile
        >>> from preemptible.integrations.transformers import PreemptibleCallback
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
        self._resume_dir: str | None = None
        self._resolved = False
        self._held: dict[str, dict[str, Any]] = {}

    # the Trainer -----------------------------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remembers the Trainer this callback belongs to (``resume_from`` restores into its model).

        Args:
            args: the Trainer's ``TrainingArguments``.
            state: the Trainer's ``TrainerState`` (``global_step``, ``max_steps``).
            control: the Trainer's ``TrainerControl``.

        Returns:
            None.

        Raises:
            Nothing: no error of its own.

        Examples:
            The framework calls it; ``tests/e2e/test_hf_trainer.py`` runs it under real training.
        """
        trainer = _calling_trainer()
        if trainer is None:
            raise PreemptibleError(
                "expected PreemptibleCallback to be registered with a transformers.Trainer "
                "(Trainer(..., callbacks=[cb]) or trainer.add_callback(cb) before train()); found no Trainer calling it"
            )
        self._attach(trainer)

    def _attach(self, trainer: Any) -> None:
        if self._trainer is trainer:
            return
        if getattr(trainer, "model_init", None) is not None:
            raise PreemptibleError(
                "PreemptibleCallback does not support Trainer(model_init=...) yet: train() re-makes the model after "
                "the checkpoint was restored into it. Build the model yourself and pass model=..."
            )
        self._trainer = trainer
        for name in ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_scaler", "_load_rng_state"):
            original = getattr(trainer, name, None)
            if original is None:
                import transformers

                raise PreemptibleError(
                    f"expected transformers.Trainer to load checkpoints through {name}() (transformers 5.x); found "
                    f"transformers {transformers.__version__} without it. pip install 'preemptible[transformers]'"
                )
            setattr(trainer, name, self._loader(name, original))

    def _loader(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def load(checkpoint: str | None, *args: Any, **kwargs: Any) -> Any:
            if checkpoint is None or checkpoint != self._resume_dir:
                return original(checkpoint, *args, **kwargs)  # the Trainer's own checkpoint: its own loader
            getattr(self, name)()
            return None

        return load

    # the loaders the Trainer calls with our directory ----------------------------------------------------------
    def _load_from_checkpoint(self) -> None:
        pass  # the weights were restored (and verified) into the model when resume_from was read

    def _load_optimizer_and_scheduler(self) -> None:
        trainer = self._trainer
        trainer.optimizer.load_state_dict(self._held["optimizer"])
        if trainer.lr_scheduler is not None and "scheduler" in self._held:
            trainer.lr_scheduler.load_state_dict(self._held["scheduler"])

    def _load_scaler(self) -> None:
        scaler = getattr(self._trainer.accelerator, "scaler", None)
        if scaler is not None and "scaler" in self._held:
            scaler.load_state_dict(self._held["scaler"])

    def _load_rng_state(self) -> None:
        RNGState().load_state_dict(self._held["rng"])

    # resume --------------------------------------------------------------------------------------------------
    @property
    def resume_from(self) -> str | None:
        """What ``trainer.train(resume_from_checkpoint=...)`` needs to continue from preemptible's newest valid
        checkpoint, or None on a fresh start. The first read restores and verifies it (see the module docs). After a
        crash that left the Trainer's own ``checkpoint-N`` newer than any of preemptible's: that directory (see
        ``framework_fallback``).

        Returns:
            A directory for ``resume_from_checkpoint``, or None on a fresh start.

        Raises:
            PreemptibleError: read before ``Trainer(..., callbacks=[cb])`` was built (it restores into the Trainer's
                model).
            CheckpointCorruptError: every checkpoint under the root fails verification (and no framework checkpoint is
                newer).

        Examples:
            ``trainer.train(resume_from_checkpoint=cb.resume_from)``: ``tests/e2e/test_hf_trainer.py`` runs it through a
            real preemption and resume.
        """
        if not self._resolved:
            self._resolve()
        return self.fallback.path if self.fallback is not None else self._resume_dir

    def _resolve(self) -> None:
        if self._trainer is None:
            raise PreemptibleError(
                "expected cb.resume_from to be read after Trainer(..., callbacks=[cb]) was built (it restores into "
                "the Trainer's model); found the callback not registered with a Trainer yet"
            )
        trainer = self._trainer
        held: dict[str, Any] = {}
        mine: dict[str, Any] = {}
        run = Run(
            self.root,
            save_every=self._run_save_every,
            exit_on_notice=self.exit_on_notice,
            per_rank=["trainer_rank"],
            model=trainer.model,
            trainer=held,
            trainer_rank=mine,
            **self.options,
        )
        self.choose_fallback(checkpoints(trainer.args.output_dir), run.checkpointer.latest(), "transformers")
        before = RNGState().state_dict()
        if self.fallback is not None:  # opens the run; the Trainer loads its own checkpoint
            start = run._begin(None, resume=lambda: self.fell_back(run, "transformers"))
        else:
            start = run.start_step  # opens the run (notice sources) and restores, verified, with fallback
        held.update(mine)
        held["rng"] = RNGState().state_dict()
        RNGState().load_state_dict(before)  # the Trainer puts the streams back itself, after the first batch
        self.run = run
        self._held = held
        self._resolved = True
        if run.resumed_from is None:
            return
        if "state" not in held or "optimizer" not in held:
            raise PreemptibleError(
                f"expected the checkpoint of step {start} under {run.root} to hold the Trainer's state and optimizer; "
                "found none (it was not written by PreemptibleCallback). Resume it with the loop that wrote it"
            )
        directory = tempfile.mkdtemp(prefix=f"preemptible-step-{start}-")
        with open(os.path.join(directory, STATE_FILE), "w") as f:
            json.dump(held["state"], f)
        self._resume_dir = directory
        log.info("[rank=%d] the Trainer resumes at global step %d from %s", run.rank, start, run.root)

    # training ------------------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Opens the run: the notice sources start, the Trainer's own SIGTERM handling is replaced, and what
        ``resume_from`` restored (optimizer, scheduler, scaler, random streams, the sampler's position) is put back
        into the Trainer.

        Args:
            args: the Trainer's ``TrainingArguments``.
            state: the Trainer's ``TrainerState`` (``global_step``, ``max_steps``).
            control: the Trainer's ``TrainerControl``.

        Returns:
            None.

        Raises:
            PreemptibleError: training over existing checkpoints while ``resume_from_checkpoint`` was not given
                ``cb.resume_from``.

        Examples:
            The framework calls it; ``tests/e2e/test_hf_trainer.py`` runs it under real training.
        """
        read = self._resolved  # resume_from was read before train()
        if not read:
            self._resolve()
        run = self.run
        assert run is not None
        fallback = self.fallback
        resumed = run.resumed_from if fallback is None else fallback.step
        if fallback is not None and not (read and state.global_step == fallback.step):
            run.close()
            raise PreemptibleError(
                f"expected trainer.train(resume_from_checkpoint=cb.resume_from): the Trainer's own {fallback.path} "
                f"is newer than any checkpoint under {run.root}, and the Trainer started at step {state.global_step} "
                "instead. Pass cb.resume_from, or give a new output_dir and root to start over"
            )
        passed = read and state.global_step == run.resumed_from
        if self._resume_dir is not None:
            # The Trainer has read trainer_state.json from it by now, and calls the loaders above with its name only:
            # removed here, not left behind in the temp dir at every resume (a notice ends the process, not train()).
            shutil.rmtree(self._resume_dir, ignore_errors=True)
        if self._resume_dir is not None and not passed:
            run.close()
            raise PreemptibleError(
                f"expected trainer.train(resume_from_checkpoint=cb.resume_from): {run.root} holds a checkpoint of "
                f"step {run.resumed_from}, and the Trainer started at step {state.global_step} instead. Pass "
                "cb.resume_from, or give a new root to start over"
            )
        for callback in self._trainer.callback_handler.callbacks:  # the Trainer's TensorBoard writer, once made
            writer = getattr(callback, "tb_writer", None)
            if writer is not None and callable(getattr(writer, "flush", None)):
                run.trackers.add(writer)
                if resumed is not None and hasattr(writer, "_get_file_writer"):
                    purge_from(writer, resumed)
        run.state["trainer"] = _TrainerParts(self._trainer, "shared")
        run.state["trainer_rank"] = _TrainerParts(self._trainer, "rank")
        if self._resume_dir is not None:
            for name, saved in self._held.get("logging", {}).items():
                current: Any = getattr(self._trainer, name, None)
                moved = saved.to(current.device) if hasattr(current, "device") and hasattr(saved, "to") else saved
                setattr(self._trainer, name, moved)
        run.schedule.total = state.max_steps if state.max_steps and state.max_steps > 0 else None
        self.take_cadence(run, cadence(args, state.max_steps))
        for why in _inexact(args):
            log.warning("[rank=%d] a resume will not be bit-identical: %s", run.rank, why)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """The step boundary: a due periodic save, and on a notice the emergency save and the exit (or, with
        ``exit_on_notice=False``, ``control.should_training_stop``).

        Args:
            args: the Trainer's ``TrainingArguments``.
            state: the Trainer's ``TrainerState`` (``global_step``, ``max_steps``).
            control: the Trainer's ``TrainerControl``.

        Returns:
            ``control``, with ``should_training_stop`` set after a notice when ``exit_on_notice=False``.

        Raises:
            Nothing: a failed periodic save is journaled and training goes on; the emergency path exits with the
                exit policy's code.

        Examples:
            The framework calls it; ``tests/e2e/test_hf_trainer.py`` runs it under real training.
        """
        assert self.run is not None
        if self.run.boundary(state.global_step):  # only with exit_on_notice=False: otherwise the process ended
            self.preempted = True
            control.should_training_stop = True
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """What the Trainer logs (loss, learning rate, grad norm, its end-of-training metrics) goes into the journal
        too, for ``preemptible report``.

        Args:
            args: the Trainer's ``TrainingArguments``.
            state: the Trainer's ``TrainerState`` (``global_step``, ``max_steps``).
            control: the Trainer's ``TrainerControl``.
            logs: what the Trainer logged (numbers are forwarded; strings and vectors are left out).

        Returns:
            None.

        Raises:
            Nothing: a figure can never stop training.

        Examples:
            The framework calls it; ``tests/e2e/test_hf_trainer.py`` runs it under real training.
        """
        forward_figures(self.run, logs or {})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Commits the final checkpoint (unless the run was preempted) and closes the run (sources stopped, handlers
        restored, the journal's exit).

        Args:
            args: the Trainer's ``TrainingArguments``.
            state: the Trainer's ``TrainerState`` (``global_step``, ``max_steps``).
            control: the Trainer's ``TrainerControl``.

        Returns:
            None.

        Raises:
            Nothing: no error of its own.

        Examples:
            The framework calls it; ``tests/e2e/test_hf_trainer.py`` runs it under real training.
        """
        run = self.run
        if run is None:
            return
        try:
            if not self.preempted:
                run._finish(state.global_step)
        finally:
            run.close()


def cadence(args: Any, max_steps: int | None) -> tuple[int, str] | None:
    """The Trainer's own checkpoint cadence in optimizer steps, and where it came from; None unless it saves by
    steps. ``save_steps`` below 1 is a fraction of ``max_steps``, rounded up, as the Trainer reads it."""
    strategy = getattr(args.save_strategy, "value", args.save_strategy)
    steps = getattr(args, "save_steps", None)
    if strategy != "steps" or not isinstance(steps, (int, float)) or steps <= 0:
        return None
    if steps < 1:
        if not max_steps or max_steps <= 0:
            return None
        return math.ceil(max_steps * steps), f"hf save_steps={steps} of max_steps={max_steps}"
    return int(steps), f"hf save_steps={int(steps)}"


_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def checkpoints(output_dir: str | None) -> list[FrameworkCheckpoint]:
    """The Trainer's own checkpoints in its ``output_dir``: ``checkpoint-N`` directories that hold the
    ``trainer_state.json`` the Trainer writes last (one without it was cut short)."""
    found: list[FrameworkCheckpoint] = []
    if not output_dir:
        return found
    try:
        entries = list(os.scandir(output_dir))
    except OSError:
        return found
    for entry in entries:
        m = _CHECKPOINT.fullmatch(entry.name)
        try:
            if m and entry.is_dir() and os.path.isfile(os.path.join(entry.path, STATE_FILE)):
                found.append(FrameworkCheckpoint(path=entry.path, step=int(m[1]), mtime=entry.stat().st_mtime))
        except OSError:
            continue
    return found


def _inexact(args: Any) -> list[str]:
    """The Trainer's settings under which its own resume (which this one goes through) cannot be exact."""
    out = []
    if getattr(args, "ignore_data_skip", False):
        out.append("ignore_data_skip=True restarts the interrupted epoch's data; leave it False")
    config = getattr(args, "accelerator_config", None)
    if config is not None and getattr(config, "use_seedable_sampler", True) is False:
        out.append(
            "accelerator_config.use_seedable_sampler=False draws the data order from a generator no checkpoint "
            "holds; leave it True"
        )
    if getattr(args, "dataloader_num_workers", 0) > 0:
        out.append(
            f"dataloader_num_workers={args.dataloader_num_workers}: the workers' seeds are drawn when the resumed "
            "run makes its iterator, so random transforms inside workers differ; use 0 workers, or seed transforms "
            "from the sample index"
        )
    return out


_LOGGING = ("_tr_loss", "_globalstep_last_logged")
"""The Trainer's loss-logging accumulators (reset at the start of training, before ``on_train_begin``)."""


def _calling_trainer() -> Any:
    """The Trainer whose __init__ is calling its callbacks' ``on_init_end`` (callbacks are not given it)."""
    frame: Any = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None
