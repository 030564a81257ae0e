"""The checkpoint lifecycle: its transition table, retention as a pure policy, the regression of issue 13's bug 1,
and property-based sequences of saves, corruption, verification, restores, rotation and kill -9 on real files.

The property test's oracle is the lifecycle's rules (preemptible/store/markers.py, store/retention.py):
- a checkpoint is deleted only when a newer one has passed verification since it was committed;
- a checkpoint that failed a content check is never reported (or kept) as validated;
- restore returns the newest committed checkpoint whose files are intact, else raises; never a silent fresh start.
Examples: ``PREEMPTIBLE_PROPERTY_EXAMPLES`` (default 100 in CI; the documented long run uses 1000).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from faults import FaultyStorage
from preemptible import CheckpointCorruptError, Checkpointer
from preemptible.cli import main
from preemptible.errors import LifecycleError
from preemptible.store import checksum, retention
from preemptible.store.io import LocalStorage
from preemptible.store.layout import CheckpointInfo
from preemptible.store.markers import TRANSITIONS, State, Transition, advance

EXAMPLES = int(os.environ.get("PREEMPTIBLE_PROPERTY_EXAMPLES", "100"))


# transitions --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("transition", list(Transition))
def test_every_transition_is_in_the_table_or_refused(state: State, transition: Transition) -> None:
    if (state, transition) in TRANSITIONS:
        assert advance(state, transition) == TRANSITIONS[(state, transition)]
    else:
        with pytest.raises(LifecycleError, match=f"cannot take the transition '{transition.value}'"):
            advance(state, transition)


def test_a_failed_checkpoint_never_becomes_validated() -> None:
    with pytest.raises(LifecycleError):
        advance(State.INVALID, Transition.VERIFY_PASS)
    assert advance(State.VALIDATED, Transition.CONTENT_FAIL) is State.INVALID
    assert advance(State.VALIDATED, Transition.COULD_NOT_VERIFY) is State.VALIDATED
    assert advance(State.INVALID, Transition.REPLACE) is State.UNCOMMITTED


# retention (pure) ---------------------------------------------------------------------------------------------
def info(step: int, status: str) -> CheckpointInfo:
    return CheckpointInfo(
        step=step,
        path=f"step-{step}",
        committed=status != "uncommitted",
        validated=status == "validated",
        invalid="bad" if status == "invalid" else None,
    )


@pytest.mark.parametrize(
    ("statuses", "keep", "deleted", "blocked"),
    [
        ({1: "committed", 2: "committed", 3: "committed"}, 2, (), (1,)),  # nothing validated: nothing goes
        ({1: "validated", 2: "committed", 3: "committed"}, 2, (), ()),  # 1 is the newest validated
        ({1: "validated", 2: "committed", 3: "committed", 4: "committed"}, 2, (), (2,)),
        ({1: "committed", 2: "validated", 3: "committed", 4: "committed"}, 2, (1,), ()),
        ({120: "validated", 121: "invalid", 126: "committed"}, 2, (), (121,)),  # bug 1: 120 stays
        ({120: "validated", 121: "invalid", 126: "validated"}, 2, (121,), ()),
        ({1: "committed", 2: "invalid", 3: "invalid"}, 2, (), (2, 3)),  # invalid: not kept, not yet deletable
    ],
)
def test_retention_decides_by_the_rules(
    statuses: dict[int, str], keep: int, deleted: tuple[int, ...], blocked: tuple[int, ...]
) -> None:
    decision = retention.decide([info(s, v) for s, v in statuses.items()], keep)
    assert decision.delete == deleted
    assert decision.blocked == blocked


# bug 1 ---------------------------------------------------------------------------------------------------------
def flip_bit(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_bug_verified_then_corrupted_checkpoint_stays_validated_and_retention_deletes_the_good_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 13, bug 1): 120 and 121 committed and verified; a bit of 121 flipped. The restore rejects
    121 and resumes from 120; 121 must then be invalid (not validated), and retention must keep 120."""
    state = {"w": {"t": torch.zeros(64)}}
    ck = Checkpointer(str(tmp_path), keep=2)
    for step in (44, 120, 121):
        state["w"]["t"].fill_(step)
        ck.save(state, step)
    assert main(["verify", str(tmp_path)]) == 0
    assert {c.step: c.status for c in ck.checkpoints()} == {120: "validated", 121: "validated"}
    flip_bit(tmp_path / "step-000000000121" / "w.safetensors")

    live = {"w": {"t": torch.zeros(64)}}
    with pytest.warns(UserWarning, match="step 121"):
        assert Checkpointer(str(tmp_path), keep=2).restore(live) == 120
    assert torch.equal(live["w"]["t"], torch.full((64,), 120.0))
    statuses = {c.step: c.status for c in ck.checkpoints()}
    assert statuses[121] == "invalid" and statuses[120] == "validated"
    state["w"]["t"].fill_(126)
    ck.save(state, 126)
    statuses = {c.step: c.status for c in ck.checkpoints()}
    assert 120 in statuses or statuses.get(126) == "validated"
    assert statuses.get(121) != "validated"

    # verify prints FAIL and records it: inspect must not say validated afterwards
    root2 = tmp_path / "second"
    ck2 = Checkpointer(str(root2))
    ck2.save(state, 1)
    assert main(["verify", str(root2)]) == 0
    flip_bit(root2 / "step-000000000001" / "w.safetensors")
    assert main(["verify", "--no-mark", str(root2)]) == 1
    assert [c.status for c in ck2.checkpoints()] == ["validated"]  # --no-mark leaves the files untouched
    assert main(["verify", str(root2)]) == 1
    assert [c.status for c in ck2.checkpoints()] == ["invalid"]
    capsys.readouterr()
    assert main(["inspect", str(root2)]) == 0
    assert "validated" not in capsys.readouterr().out


class UnreadableStorage(LocalStorage):
    """Reads of tensor files time out (root reads any file, so a permission error cannot be had for real)."""

    def open_read(self, path: str) -> Any:
        if path.endswith(".safetensors"):
            raise TimeoutError(110, "injected: the storage did not answer")
        return super().open_read(path)


def test_io_error_while_verifying_or_restoring_leaves_the_state_as_it_was(tmp_path: Path) -> None:
    state = {"w": {"t": torch.ones(8)}}
    Checkpointer(str(tmp_path)).save(state, 1)
    Checkpointer(str(tmp_path)).verify(1)
    flaky = Checkpointer(str(tmp_path), storage=UnreadableStorage(str(tmp_path)))
    with pytest.raises(TimeoutError):
        flaky.verify(1)
    with (
        pytest.warns(UserWarning, match="could not verify"),
        pytest.raises(OSError, match="nothing was marked invalid"),
    ):
        flaky.restore({"w": {"t": torch.zeros(8)}})
    assert [c.status for c in Checkpointer(str(tmp_path)).checkpoints()] == ["validated"]
    assert main(["verify", str(tmp_path)]) == 0


# property-based sequences -----------------------------------------------------------------------------------------
class KillingStorage(FaultyStorage):
    """Local storage whose process is SIGKILLed after ``kill_after`` bytes, or at the commit (``kill_at``)."""

    def __init__(self, root: str, *, kill_after: int | None, kill_at: str | None) -> None:
        super().__init__(root, fail_after=kill_after)
        self.kill_at = kill_at

    def fault(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def publish(self, path: str, data: bytes) -> None:
        commit = path.endswith("COMMIT.json")
        if commit and self.kill_at == "before-commit":
            os.kill(os.getpid(), signal.SIGKILL)
        super().publish(path, data)
        if commit and self.kill_at == "after-commit":
            os.kill(os.getpid(), signal.SIGKILL)


def values(step: int) -> dict[str, Any]:
    return {"w": {"a": torch.full((300,), float(step)), "b": torch.arange(50) + step}, "meta": {"step": step}}


def empty() -> dict[str, Any]:
    return {"w": {}, "meta": {}}


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.root = Path(tempfile.mkdtemp(prefix="lifecycle-"))
        self.next_step = 1
        self.committed: set[int] = set()
        self.intact: set[int] = set()  # committed and not damaged since
        self.passed: set[int] = set()  # passed a content check since commit
        self.failed: set[int] = set()  # failed a content check
        self.forged: set[int] = set()  # carry a VALID.json written by hand that names their commit, unchecked since

    def teardown(self) -> None:
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)

    def ck(self) -> Checkpointer:
        return Checkpointer(str(self.root), keep=2)

    def on_disk(self) -> dict[int, str]:
        return {c.step: c.status for c in self.ck().checkpoints()}

    def _sync_deletions(self, before: set[int]) -> None:
        """What rotation removed: each must have had a newer checkpoint that passed verification."""
        now = self.on_disk()
        for s, status in now.items():
            if status == "validated" and s in self.intact and s not in self.forged:
                self.passed.add(s)
        deleted = before - set(now)
        for d in deleted:
            assert any(v > d for v in self.passed), f"step {d} deleted while no newer checkpoint had validated"
        for d in deleted:
            self.committed.discard(d)
            self.intact.discard(d)
            self.passed.discard(d)
            self.failed.discard(d)
            self.forged.discard(d)

    @rule(reason=st.sampled_from(["periodic", "emergency", "final"]))
    def save(self, reason: str) -> None:
        before = set(self.on_disk())
        step = self.next_step
        self.next_step += 1
        self.ck().save(values(step), step, reason=reason)
        self.committed.add(step)
        self.intact.add(step)
        self._sync_deletions(before)

    @rule(kill_after=st.integers(0, 4000), kill_at=st.sampled_from([None, None, "before-commit", "after-commit"]))
    def kill_9_during_a_save(self, kill_after: int, kill_at: str | None) -> None:
        before = set(self.on_disk())
        step = self.next_step
        self.next_step += 1
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child dies by SIGKILL or exits
            try:
                torch.set_num_threads(1)
                storage = KillingStorage(str(self.root), kill_after=None if kill_at else kill_after, kill_at=kill_at)
                Checkpointer(str(self.root), keep=2, storage=storage, threads=1).save(values(step), step)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        disk = self.on_disk()
        if step in disk:
            self.committed.add(step)
            self.intact.add(step)
        self._sync_deletions(before)

    @rule(
        pick=st.integers(0, 1 << 20),
        which=st.integers(0, 1 << 20),
        at=st.integers(0, 1 << 20),
        how=st.sampled_from(["flip", "truncate", "delete"]),
    )
    def damage(self, pick: int, which: int, at: int, how: str) -> None:
        # Draws never depend on what is on disk (hypothesis replays them): indices are reduced modulo here.
        if not self.committed:
            return
        step = sorted(self.committed)[pick % len(self.committed)]
        directory = self.root / f"step-{step:012d}"
        files = sorted(
            p for p in directory.iterdir() if p.name.endswith((".safetensors", "state.json")) and p.stat().st_size
        )
        if not files:
            return
        path = files[which % len(files)]
        size = path.stat().st_size
        if how == "flip":  # +1 to a byte: never undone by a later flip of the same byte (unlike an XOR)
            raw = bytearray(path.read_bytes())
            raw[at % size] = (raw[at % size] + 1) % 256
            path.write_bytes(bytes(raw))
        elif how == "truncate":
            os.truncate(path, at % size)
        else:
            path.unlink()
        # Bit rot after a checkpoint validated does not undo that it passed: the rule is "a newer one has passed
        # verification since it was committed"; it is not re-read before each deletion.
        self.intact.discard(step)

    @rule(pick=st.integers(0, 1 << 20))
    def verify(self, pick: int) -> None:
        if not self.committed:
            return
        step = sorted(self.committed)[pick % len(self.committed)]
        try:
            self.ck().verify(step)
        except CheckpointCorruptError:
            assert step not in self.intact, f"intact step {step} failed verify"
            self.failed.add(step)
            return
        assert step in self.intact, f"damaged step {step} passed verify"
        if step not in self.failed:
            self.passed.add(step)
            self.forged.discard(step)

    @rule()
    def restore(self) -> None:
        before = set(self.on_disk())
        live = empty()
        good = sorted(self.intact - self.failed)
        try:
            got = self.ck().restore(live)
        except CheckpointCorruptError:
            assert not good, f"restore raised although {good} are intact"
            self.failed |= self.committed
            return
        if not self.committed:
            assert got is None
            return
        assert got == (good[-1] if good else None), (got, good)
        assert got is not None
        assert live["meta"]["step"] == got and torch.equal(live["w"]["a"], values(got)["w"]["a"])
        self.failed |= {s for s in self.committed if s > got}
        self.passed.add(got)
        self.forged.discard(got)
        assert set(self.on_disk()) == before  # restore marks, never deletes

    @rule(
        pick=st.integers(0, 1 << 20),
        how=st.sampled_from(["valid-no-commit", "valid-right-commit", "valid-other-commit", "invalid-no-commit"]),
    )
    def forge_a_marker(self, pick: int, how: str) -> None:
        """Markers written by hand, left stale or copied: only a validation this process made lets rotation delete,
        and a marker naming no commit, or another, counts as absent."""
        if not self.committed:
            return
        step = sorted(self.committed)[pick % len(self.committed)]
        directory = self.root / f"step-{step:012d}"
        commit = checksum.of_bytes((directory / "COMMIT.json").read_bytes())
        if how == "invalid-no-commit":
            if not (directory / "INVALID.json").exists():
                (directory / "INVALID.json").write_text(json.dumps({"reason": "forged"}))
            return
        if (directory / "INVALID.json").exists() or step in self.failed:
            return  # INVALID wins over VALID: nothing a VALID.json can do there
        named = {"valid-no-commit": None, "valid-right-commit": commit, "valid-other-commit": "0123456789abcdef"}[how]
        (directory / "VALID.json").write_text(json.dumps({"checksums": True, "commit": named}))
        if how == "valid-right-commit":
            self.forged.add(step)

    @rule()
    def rotate(self) -> None:
        before = set(self.on_disk())
        self.ck().rotate()
        self._sync_deletions(before)

    @invariant()
    def failed_is_never_validated(self) -> None:
        disk = self.on_disk()
        for s in self.failed:
            assert disk.get(s) != "validated", f"step {s} failed a content check but is reported validated"

    @invariant()
    def the_newest_good_checkpoint_is_never_lost(self) -> None:
        good = self.passed & self.intact
        if good:
            newest = max(good)
            assert any(s >= newest for s in set(self.on_disk()) & self.intact), "the newest good checkpoint is gone"


Lifecycle.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)
test_lifecycle_properties = pytest.mark.slow(Lifecycle.TestCase)


def test_a_checkpoint_written_by_the_previous_release_restores(tmp_path: Path) -> None:
    """tests/corpus/checkpoint-v1 was written by main before the lifecycle change (commit 725663c)."""
    import shutil

    root = tmp_path / "v1"
    shutil.copytree(Path(__file__).parent.parent / "corpus" / "checkpoint-v1", root)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    extra: dict[str, Any] = {}
    assert Checkpointer(str(root)).restore({"model": model, "optimizer": opt, "extra": extra}) == 3
    assert extra == {"epoch": 2, "name": "v1", "pair": (1, 2)}
    assert opt.state_dict()["state"][0]["step"].item() == 3
    want = torch.tensor([-0.495588, -0.394312, -0.214093])
    assert torch.allclose(model[0].weight[0, :3].detach(), want, atol=1e-6)
    assert [c.status for c in Checkpointer(str(root)).checkpoints()] == ["validated"]
    torch.manual_seed(3)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    assert not torch.equal(fresh[0].weight, model[0].weight)  # the restore changed the weights
