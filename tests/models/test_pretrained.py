"""Model folders: save -> load gives the same function; bad folders give clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.models import ARCHITECTURES
from lmforge.persistence import load_backbone, load_pretrained, save_pretrained
from lmforge.tokenizers import WordPieceTokenizer

TINY = dict(vocab_size=99, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16, dropout=0.0,
            attention_dropout=0.0)


def tiny(arch: str, **kw) -> ModelConfig:
    extra = {"norm_first": True} if arch == "decoder" else {}
    return ModelConfig(arch=arch, **{**TINY, **extra, **kw})


def outputs(model, ids):
    with torch.no_grad():
        if isinstance(model, TaskModel):
            out = model(ids)
            return torch.cat([out.mlm_logits.flatten(), out.nsp_logits.flatten()])
        if model.config.arch == "seq2seq":
            return model(ids, ids).logits
        out = model(ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("arch", ["encoder", "decoder", "seq2seq"])
def test_round_trip_gives_identical_outputs(tmp_path, arch):
    torch.manual_seed(0)
    model = ARCHITECTURES[arch](tiny(arch)).eval()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    ids = torch.randint(0, 99, (3, 7))
    assert torch.equal(outputs(model, ids), outputs(loaded.model, ids))
    assert loaded.config == model.config and loaded.head is None and loaded.tokenizer is None


def test_task_model_round_trip_and_backbone_extraction(tmp_path):
    torch.manual_seed(0)
    config = tiny("encoder")
    backbone = ARCHITECTURES["encoder"](config)
    model = TaskModel(backbone, build_head({"type": "pretraining"}, config, backbone)).eval()
    tok = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"])
    save_pretrained(model, tmp_path / "m", tokenizer=tok)
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert all(k.startswith(("backbone.", "head.")) for k in saved)
    loaded = load_pretrained(tmp_path / "m")
    ids = torch.randint(0, 99, (3, 7))
    assert isinstance(loaded.model, TaskModel) and loaded.head == {"type": "pretraining"}
    assert torch.equal(outputs(model, ids), outputs(loaded.model, ids))
    # the tied un-embedding follows the loaded token embedding
    assert torch.equal(loaded.model.head.mlm.weight, loaded.model.backbone.get_input_embeddings().weight)
    only = load_backbone(tmp_path / "m")
    assert not isinstance(only.model, TaskModel)
    assert torch.equal(outputs(backbone.eval(), ids), outputs(only.model, ids))
    assert only.tokenizer is not None and only.tokenizer.vocab_size == 7


def test_existing_model_is_not_overwritten(tmp_path):
    model = ARCHITECTURES["encoder"](tiny("encoder"))
    save_pretrained(model, tmp_path / "m")
    with pytest.raises(LmforgeError, match="already exists"):
        save_pretrained(model, tmp_path / "m")
    save_pretrained(model, tmp_path / "m", overwrite=True)


def test_keys_that_do_not_fit_are_named(tmp_path):
    model = ARCHITECTURES["encoder"](tiny("encoder"))
    save_pretrained(model, tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(path))
    name = next(k for k in tensors if k.endswith("q_proj.weight"))
    tensors["extra.weight"] = torch.zeros(2)
    tensors[name] = torch.zeros(5, 5)
    del tensors[next(k for k in tensors if k.endswith("fc1.bias"))]
    save_file(tensors, str(path))
    with pytest.raises(LmforgeError) as err:
        load_pretrained(tmp_path / "m")
    message = str(err.value)
    assert "model.safetensors" in message and name in message and "(5, 5)" in message
    assert "missing key(s): " in message and "fc1.bias" in message and "unexpected key(s): extra.weight" in message


def test_checkpoint_of_another_architecture(tmp_path):
    save_pretrained(ARCHITECTURES["encoder"](tiny("encoder")), tmp_path / "m")
    config_path = tmp_path / "m" / "config.json"
    raw = json.loads(config_path.read_text())
    raw["model"].update(arch="decoder", norm_first=True)
    for name in ("type_vocab_size", "embedding_size", "share_layers", "pooler", "generator_size", "hf_layout"):
        del raw["model"][name]  # the encoder family's options
    config_path.write_text(json.dumps(raw))
    with pytest.raises(LmforgeError, match="the weights do not fit the model"):
        load_pretrained(tmp_path / "m")
    config_path.write_text(json.dumps({"model_type": "t5", "d_model": 8}))
    with pytest.raises(LmforgeError, match="'t5' checkpoint; lmforge reads BERT, RoBERTa, ALBERT, "):
        load_pretrained(tmp_path / "m")


def test_corrupt_and_missing_files(tmp_path):
    save_pretrained(ARCHITECTURES["encoder"](tiny("encoder")), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(LmforgeError, match="not a readable safetensors file"):
        load_pretrained(tmp_path / "m")
    weights.unlink()
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(LmforgeError, match="pytorch_model.bin, which lmforge does not read"):
        load_pretrained(tmp_path / "m")
    with pytest.raises(LmforgeError, match="no such model folder"):
        load_pretrained(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LmforgeError, match="no config.json"):
        load_pretrained(tmp_path / "empty")


def test_hugging_face_masked_lm_folder_loads_as_an_mlm_head_with_a_fresh_pooler(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=99, hidden_size=12, num_attention_heads=3, num_hidden_layers=2,
                                     intermediate_size=37, max_position_embeddings=16)
    reference = transformers.BertForMaskedLM(config).eval()
    reference.save_pretrained(str(tmp_path / "hf"))
    with caplog.at_level("WARNING", logger="lmforge"):
        loaded = load_pretrained(tmp_path / "hf")
    # BertForMaskedLM has no NSP classifier: it loads as the MLM head alone (and exports back as BertForMaskedLM)
    assert loaded.head == {"type": "mlm"} and "head.nsp" not in caplog.text
    assert "backbone.pooler.dense" in caplog.text
    ids = torch.randint(0, 99, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).mlm_logits, reference(ids).logits, atol=1e-5, rtol=1e-5)
