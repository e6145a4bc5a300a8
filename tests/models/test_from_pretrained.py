"""The Hugging Face-shaped API (issue 23): ``from_pretrained`` returns the callable model with ``.config`` and
``.tokenizer``; ``save_pretrained`` writes a folder whole and refuses to overwrite; the README's snippet runs.

Reproduction: ``load_pretrained`` returned a ``Loaded`` record, which the README called as a model (TypeError),
and no model class had ``from_pretrained`` / ``save_pretrained``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import lmforge.models as models
from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.models import Decoder, Encoder, EncoderDecoder, XLNet
from lmforge.persistence import from_pretrained, load_pretrained

README = Path(__file__).resolve().parents[2] / "README.md"
TINY = dict(vocab_size=99, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16, dropout=0.0,
            attention_dropout=0.0)


def _pretraining_folder(tiny_encoder_dir: Path, path: Path) -> Path:
    loaded = load_pretrained(tiny_encoder_dir)
    torch.manual_seed(0)
    model = TaskModel(loaded.model, build_head({"type": "pretraining"}, loaded.config, loaded.model))
    return model.save_pretrained(path, tokenizer=loaded.tokenizer)


def test_from_pretrained_returns_the_callable_model_with_config_and_tokenizer(tiny_encoder_dir):
    model = from_pretrained(tiny_encoder_dir)
    assert isinstance(model, Encoder) and not model.training
    assert isinstance(model.config, ModelConfig) and model.config.arch == "encoder"
    batch = model.tokenizer(["alice lives in paris", "bob"], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
        expected = load_pretrained(tiny_encoder_dir).model(**batch)
    torch.testing.assert_close(out.last_hidden_state, expected.last_hidden_state, rtol=0, atol=0)
    assert model.tokenizer.batch_decode(batch["input_ids"]) == ["alice lives in paris", "bob"]


def test_loaded_record_is_callable_as_its_model(tiny_encoder_dir):
    loaded = load_pretrained(tiny_encoder_dir)
    ids = torch.tensor([[2, 7, 9, 3]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).last_hidden_state, loaded.model(ids).last_hidden_state)


def test_a_class_loads_its_backbone_and_refuses_another_family(tiny_encoder_dir, tmp_path):
    folder = _pretraining_folder(tiny_encoder_dir, tmp_path / "pre")
    whole = from_pretrained(folder)
    assert isinstance(whole, TaskModel) and whole.head_config == {"type": "pretraining"}
    assert isinstance(TaskModel.from_pretrained(folder), TaskModel)
    backbone = Encoder.from_pretrained(folder)  # heads dropped, as BertModel.from_pretrained does
    assert type(backbone) is Encoder and backbone.tokenizer is not None
    torch.testing.assert_close(backbone.state_dict(), whole.backbone.state_dict())
    with pytest.raises(LmforgeError, match=r"model class Encoder .*Encoder\.from_pretrained"):
        Decoder.from_pretrained(folder)
    with pytest.raises(LmforgeError, match="no task head"):
        TaskModel.from_pretrained(tiny_encoder_dir)


@pytest.mark.parametrize("cls", [Encoder, Decoder, EncoderDecoder, XLNet])
def test_save_then_from_pretrained_round_trips_each_family(cls, tmp_path):
    arch = {Encoder: "encoder", Decoder: "decoder", EncoderDecoder: "seq2seq", XLNet: "xlnet"}[cls]
    torch.manual_seed(0)
    model = cls(ModelConfig(arch=arch, **TINY)).eval()
    assert model.save_pretrained(tmp_path / "m") == tmp_path / "m"
    back = cls.from_pretrained(tmp_path / "m")
    assert type(back) is cls and back.config == model.config and back.tokenizer is None
    torch.testing.assert_close(back.state_dict(), model.state_dict(), rtol=0, atol=0)
    assert isinstance(from_pretrained(tmp_path / "m"), cls)
    with pytest.warns(DeprecationWarning, match="lmforge.models.from_pretrained moved to lmforge.persistence"):
        assert isinstance(models.from_pretrained(tmp_path / "m"), cls)  # the old name, for one release


def test_save_pretrained_refuses_an_existing_model_and_leaves_no_partial_folder(tiny_encoder_dir, tmp_path):
    model = Encoder.from_pretrained(tiny_encoder_dir)
    target = tmp_path / "out"
    model.save_pretrained(target)  # the attached tokenizer goes along
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json",
                                                        "vocab.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # built under a temporary name, renamed when whole
    before = (target / "model.safetensors").read_bytes()
    with pytest.raises(LmforgeError, match="already exists.*overwrite"):
        model.save_pretrained(target)
    assert (target / "model.safetensors").read_bytes() == before
    with torch.no_grad():
        model.pooler.dense.bias.add_(1.0)
    model.save_pretrained(target, overwrite=True)
    assert (target / "model.safetensors").read_bytes() != before


def test_readme_from_pretrained_snippet_runs_as_written(tiny_encoder_dir, tmp_path, monkeypatch):
    """The README's from_pretrained example, run on a pretraining folder standing in for runs/bert-mini."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    (snippet,) = [b for b in blocks if "from lmforge import from_pretrained" in b]
    monkeypatch.chdir(tmp_path)
    _pretraining_folder(tiny_encoder_dir, tmp_path / "runs" / "bert-mini")
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)  # noqa: S102 - the documentation's own code
    assert scope["out"].mlm_logits.shape[:2] == scope["batch"]["input_ids"].shape
    assert scope["hidden"].shape[-1] == scope["model"].config.d_model
    assert Encoder.from_pretrained("runs/bert-mini-encoder").config == scope["model"].config
