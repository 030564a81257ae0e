"""`preemptible.load` and `preemptible export --entry`: a checkpoint's weights for inference, verified, with the
module's own key names and tied weights under each key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import preemptible
from preemptible import Checkpointer
from preemptible.cli import main
from preemptible.errors import CheckpointCorruptError, CheckpointFallbackWarning, CheckpointNotFoundError


class Tied(torch.nn.Module):
    """A tiny language model whose output layer shares the embedding's weight (as GPT-2's lm_head does)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(50, 16)
        self.mid = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.emb(x))))


def trained(root: Path, **kw: object) -> Tied:
    model = Tied(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ck = Checkpointer(root, keep=5, **kw)  # type: ignore[arg-type]
    for step in (1, 2):
        opt.zero_grad()
        model(torch.arange(10)).sum().backward()
        opt.step()
        ck.save({"model": model, "optimizer": opt}, step)
    return model


X = torch.arange(20) % 50


@pytest.mark.parametrize("kw", [{}, {"compress": True}, {"max_file_bytes": 4096}], ids=["plain", "compressed", "parts"])
def test_load_gives_a_state_dict_a_fresh_model_takes(tmp_path: Path, kw: dict[str, object]) -> None:
    model = trained(tmp_path, **kw)
    fresh = Tied(seed=1)
    assert not torch.equal(fresh(X), model(X))
    fresh.load_state_dict(preemptible.load(str(tmp_path), entry="model"))
    assert torch.equal(fresh(X), model(X))
    everything = preemptible.load(str(tmp_path))
    assert sorted(everything) == ["model", "optimizer"]
    assert preemptible.load(str(tmp_path), step=1, entry="model")["mid.weight"].shape == (16, 16)


def test_load_of_one_entry_reads_only_its_files_and_falls_back_past_a_damaged_checkpoint(tmp_path: Path) -> None:
    model = trained(tmp_path)
    step2 = tmp_path / "step-000000000002"
    opt_file = step2 / "optimizer.safetensors"
    opt_file.write_bytes(b"\0" * opt_file.stat().st_size)  # the optimizer's file is never read for the model
    fresh = Tied(seed=1)
    fresh.load_state_dict(preemptible.load(str(tmp_path), entry="model"))
    assert torch.equal(fresh(X), model(X))
    model_file = step2 / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[-1] ^= 0xFF
    model_file.write_bytes(bytes(data))
    with pytest.warns(CheckpointFallbackWarning, match="checksum mismatch"):
        older = preemptible.load(str(tmp_path), entry="model")
    assert not torch.equal(older["mid.weight"], model.mid.weight)  # step 1's, a step before
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
        preemptible.load(str(tmp_path), step=2, entry="model")
    with pytest.raises(CheckpointNotFoundError, match=r"no entry 'ema'; it holds \['model', 'optimizer'\]"):
        preemptible.load(str(tmp_path), step=1, entry="ema")


def test_export_entry_writes_the_modules_own_keys_and_tied_weights_under_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = trained(tmp_path / "ck")
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "ck"), "--out", str(out), "--entry", "model"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "model.safetensors"]
    weights = load_file(str(out / "model.safetensors"))
    assert sorted(weights) == sorted(model.state_dict())  # emb.weight and head.weight, no "model/" prefix
    fresh = Tied(seed=1)
    fresh.load_state_dict(weights)  # strict: every key is there
    assert torch.equal(fresh(X), model(X))
    doc = json.loads((out / "export.json").read_text())
    assert doc["entry"] == "model" and doc["step"] == 2 and doc["tied"] == {"head.weight": "emb.weight"}
    capsys.readouterr()
    assert main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "o2"), "--entry", "ema"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no entry 'ema'" in err


def test_the_full_export_names_the_keys_tied_weights_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tensor held under several keys is stored once, under the first: the full export holds it once, and says
    under which name every other key finds it (a strict load_state_dict of the model needs both keys)."""
    model = trained(tmp_path / "ck")
    shared = torch.arange(6.0)
    extra = {"pair": (shared, {3: shared}), "own": torch.ones(2)}  # a tuple, and a dict with an int key
    Checkpointer(tmp_path / "ck", keep=5).save({"model": model, "extra": extra}, 3)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["export", str(tmp_path / "ck"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    aliases = {"model/head.weight": "model/emb.weight", "extra/pair/1/3": "extra/pair/0"}
    assert json.loads((out / "export.json").read_text())["aliases"] == aliases
    assert "2 key(s) share a tensor held under another key's name" in printed and "model/head.weight" in printed
    held: dict[str, torch.Tensor] = {}
    for f in out.glob("*.safetensors"):
        held.update(load_file(str(f)))
    assert not set(aliases) & set(held)
    weights = {k.removeprefix("model/"): v for k, v in held.items() if k.startswith("model/")}
    weights |= {k.removeprefix("model/"): held[v] for k, v in aliases.items() if k.startswith("model/")}
    fresh = Tied(seed=1)
    fresh.load_state_dict(weights)  # strict: every key is found, through export.json's aliases
    assert torch.equal(fresh(X), model(X))
    assert torch.equal(held[aliases["extra/pair/1/3"]], shared)
    # a checkpoint without shared tensors has no aliases to name
    Checkpointer(tmp_path / "plain").save({"extra": {"own": torch.ones(2)}}, 1)
    assert main(["export", str(tmp_path / "plain"), "--out", str(tmp_path / "o2")]) == 0
    assert "aliases" not in json.loads((tmp_path / "o2" / "export.json").read_text())
    assert "share a tensor" not in capsys.readouterr().out


def test_export_format_hf_writes_what_from_pretrained_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A transformers model trained under a Run: its config is recorded at each save, and ``export --format hf``
    writes a save_pretrained directory from which a fresh model gives the same logits, tied weights tied."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    root = tmp_path / "root"
    run = preemptible.Run(root, model=model, optimizer=opt, save_every=2, async_save=False)
    for _ in run.steps(4):
        ids = torch.randint(0, 100, (4, 16))
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    commit = json.loads((root / "step-000000000004" / "COMMIT.json").read_text())
    assert commit["transformers"]["model"]["class"] == "GPT2LMHeadModel"
    assert commit["transformers"]["model"]["config"]["n_embd"] == 32

    out = tmp_path / "hf"
    assert main(["export", str(root), "--format", "hf", "--out", str(out)]) == 0
    assert {"config.json", "model.safetensors", "export.json"} <= {p.name for p in out.iterdir()}
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert type(loaded) is GPT2LMHeadModel
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    model.eval()
    loaded.eval()
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    capsys.readouterr()

    assert main(["export", str(root), "--format", "hf", "--entry", "optimizer", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "records no Hugging Face model for entry 'optimizer'" in err and err.count("\n") == 1


def test_export_refuses_a_url_for_out_and_takes_a_file_url_as_local(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from preemptible.cli.args import local_directory

    with pytest.raises(SystemExit) as exit_:
        main(["export", str(tmp_path), "--out", "s3://bucket/out"])
    assert exit_.value.code == 2
    assert "expected a local directory, found the URL 's3://bucket/out'" in capsys.readouterr().err
    assert local_directory(f"file://{tmp_path}/new") == f"{tmp_path}/new"


def test_a_step_not_committed_is_refused_naming_the_steps_that_are(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    trained(tmp_path)
    assert main(["export", str(tmp_path), "--step", "5", "--out", str(tmp_path / "out")]) == 2
    assert "no committed checkpoint of step 5" in (err := capsys.readouterr().err) and "committed steps: [1, 2]" in err
    assert main(["verify", str(tmp_path), "--step", "7"]) == 1
    assert "committed steps: [1, 2]" in capsys.readouterr().out
    with pytest.raises(CheckpointNotFoundError, match=r"committed steps: none"):
        Checkpointer(tmp_path / "empty").reader.manifest(3)
