"""Hugging Face BERT interop: real-checkpoint parity (MiniLM on BBC News), random-weight parity both ways."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads.base import TaskModel
from lmforge.heads.pretraining import BertPreTrainingHeads
from lmforge.interop.hf_bert import (
    config_from_hf,
    config_to_hf,
    is_hf_bert_dir,
    state_dict_from_hf,
    state_dict_to_hf,
)
from lmforge.models.encoder import Encoder
from tests.interop.parity import TOL, check_encoder, check_heads, close, hf_model, padded_batch, perturb, transformers

V = 99
PRETRAINING = {"mlm_logits": "prediction_logits", "nsp_logits": "seq_relationship_logits"}


def hf_tiny_config(**overrides) -> transformers.BertConfig:
    values = dict(vocab_size=V, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
                  max_position_embeddings=16, type_vocab_size=3, attn_implementation="eager")
    return transformers.BertConfig(**{**values, **overrides})


def batch(seed: int = 1) -> dict[str, torch.Tensor]:
    return padded_batch(V, seed, segments=3)


def ours_pretraining(seed: int, **overrides) -> tuple[ModelConfig, TaskModel]:
    cfg = ModelConfig(vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16, type_vocab_size=3,
                      **overrides)
    torch.manual_seed(0)
    enc = Encoder(cfg)
    return cfg, perturb(TaskModel(enc, BertPreTrainingHeads(cfg, enc.get_input_embeddings().weight)), seed)


def ours_from_hf_pretraining(hf_model, kernel: str = "sdpa", *, partial: bool = False) -> TaskModel:
    """Our pretraining model with ``hf_model``'s weights; ``partial``: a BertForMaskedLM's, which has no pooler and no
    NSP classifier (those stay as initialised)."""
    cfg = config_from_hf(hf_model.config.to_dict())
    cfg.kernel = kernel
    enc_sd, heads_sd = state_dict_from_hf(hf_model.state_dict())
    enc = Encoder(cfg)
    heads = BertPreTrainingHeads(cfg, enc.get_input_embeddings().weight)
    missing_enc = enc.load_state_dict(enc_sd, strict=not partial).missing_keys
    missing_heads = heads.load_state_dict(heads_sd, strict=not partial).missing_keys
    if partial:
        assert set(missing_enc) == {"pooler.dense.weight", "pooler.dense.bias"}
        assert set(missing_heads) == {"nsp.classifier.weight", "nsp.classifier.bias"}
    return TaskModel(enc, heads).eval()


# ---------------------------------------------------------------------------------------------- random weights
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("kernel", ["math", "sdpa"])
def test_hf_pretraining_to_ours(act: str, kernel: str) -> None:
    hf = hf_model("BertForPreTraining", hf_tiny_config(hidden_act=act), seed=1)
    check_heads(ours_from_hf_pretraining(hf, kernel), hf, batch(), PRETRAINING)


def test_ours_to_hf_pretraining() -> None:
    cfg, ours = ours_pretraining(seed=2, activation="gelu_tanh")
    hf_dict = config_to_hf(cfg)
    assert hf_dict["model_type"] == "bert" and hf_dict["architectures"] == ["BertForPreTraining"]
    assert hf_dict["hidden_act"] == "gelu_new"
    hf = transformers.BertForPreTraining(transformers.BertConfig(**hf_dict, attn_implementation="eager"))
    hf.load_state_dict(state_dict_to_hf(ours.backbone.state_dict(), ours.head.state_dict()), strict=True)
    check_heads(ours, hf.eval(), batch(seed=3), PRETRAINING)
    # And back again: the same tensors under the same names.
    enc_sd, heads_sd = state_dict_from_hf(hf.state_dict())
    assert enc_sd.keys() == ours.backbone.state_dict().keys() and heads_sd.keys() == ours.head.state_dict().keys()
    for key, value in ours.backbone.state_dict().items():
        assert torch.equal(enc_sd[key], value), key


def test_save_pretrained_layout_loads_with_from_pretrained(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    cfg, ours = ours_pretraining(seed=4)
    hf_sd = state_dict_to_hf(ours.backbone.state_dict(), ours.head.state_dict(), include_tied=False)
    save_file({k: v.contiguous() for k, v in hf_sd.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(cfg)))
    assert is_hf_bert_dir(tmp_path)
    hf = transformers.BertForPreTraining.from_pretrained(str(tmp_path), attn_implementation="sdpa").eval()
    check_heads(ours, hf, batch(seed=5), PRETRAINING)


def test_bert_model_layout_round_trip() -> None:
    hf = hf_model("BertModel", hf_tiny_config(), seed=6)
    hf_sd = hf.state_dict()
    enc_sd, heads_sd = state_dict_from_hf(hf_sd)
    assert heads_sd is None
    enc = Encoder(config_from_hf(hf.config.to_dict()))
    enc.load_state_dict(enc_sd)
    enc.eval()
    back = state_dict_to_hf(enc.state_dict())
    assert back.keys() == hf_sd.keys()
    assert all(torch.equal(back[k], hf_sd[k]) for k in hf_sd)
    check_encoder(enc, hf, batch(seed=7), attentions=True)


def test_masked_lm_layout_has_no_pooler_and_no_nsp() -> None:
    hf = hf_model("BertForMaskedLM", hf_tiny_config(), seed=8)
    check_heads(ours_from_hf_pretraining(hf, partial=True), hf, batch(seed=9), {"mlm_logits": "logits"})


def test_tf_style_layer_norm_names_and_buffers_are_accepted() -> None:
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(hf_tiny_config())
    renamed = {re.sub(r"LayerNorm\.weight$", "LayerNorm.gamma", re.sub(r"LayerNorm\.bias$", "LayerNorm.beta", k)): v
               for k, v in hf.state_dict().items()}
    renamed["bert.embeddings.position_ids"] = torch.arange(16)[None]
    enc_sd, heads_sd = state_dict_from_hf(renamed)
    plain_enc, plain_heads = state_dict_from_hf(hf.state_dict())
    assert enc_sd.keys() == plain_enc.keys() and heads_sd.keys() == plain_heads.keys()


# ---------------------------------------------------------------------------------------------- errors
def test_state_dict_errors_name_the_key() -> None:
    torch.manual_seed(0)
    sd = dict(transformers.BertModel(hf_tiny_config()).state_dict())
    with pytest.raises(LmforgeError, match=r"unexpected key\(s\) .*'classifier.weight'"):
        state_dict_from_hf({**sd, "classifier.weight": torch.zeros(2, 12)})
    with pytest.raises(LmforgeError, match=r"'encoder.layer.0.attention.self.rotary.weight'"):
        state_dict_from_hf({**sd, "encoder.layer.0.attention.self.rotary.weight": torch.zeros(1)})
    pre = dict(transformers.BertForPreTraining(hf_tiny_config()).state_dict())
    pre["cls.predictions.decoder.weight"] = pre["cls.predictions.decoder.weight"] + 1.0
    with pytest.raises(LmforgeError, match="untied"):
        state_dict_from_hf(pre)
    pre_ln = Encoder(ModelConfig(vocab_size=V, d_model=12, n_heads=3, n_layers=1, norm_first=True))
    with pytest.raises(LmforgeError, match=r"'final_norm.weight'"):
        state_dict_to_hf(pre_ln.state_dict())


def test_config_mapping_and_errors() -> None:
    hf = hf_tiny_config(hidden_act="gelu_new", layer_norm_eps=1e-7, hidden_dropout_prob=0.2,
                        attention_probs_dropout_prob=0.3, pad_token_id=1, initializer_range=0.01).to_dict()
    cfg = config_from_hf(hf)
    assert (cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.max_seq_len,
            cfg.type_vocab_size) == (V, 12, 3, 2, 37, 16, 3)
    assert (cfg.activation, cfg.layer_norm_eps, cfg.dropout, cfg.attention_dropout, cfg.pad_token_id,
            cfg.init_std) == ("gelu_tanh", 1e-7, 0.2, 0.3, 1, 0.01)
    assert config_from_hf(config_to_hf(cfg)) == cfg
    with pytest.raises(LmforgeError, match=r"position_embedding_type='relative_key'.*'absolute'"):
        config_from_hf({**hf, "position_embedding_type": "relative_key"})
    with pytest.raises(LmforgeError, match=r"hidden_act='silu'"):
        config_from_hf({**hf, "hidden_act": "silu"})
    with pytest.raises(LmforgeError, match=r"model_type='gpt2'"):
        config_from_hf({**hf, "model_type": "gpt2"})
    with pytest.raises(LmforgeError, match="norm_first=True.*positional='rotary'"):
        config_to_hf(ModelConfig(norm_first=True, positional="rotary"))


def test_is_hf_bert_dir(tmp_path: Path, minilm_dir: Path) -> None:
    assert is_hf_bert_dir(minilm_dir)
    assert not is_hf_bert_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert not is_hf_bert_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    assert not is_hf_bert_dir(tmp_path)


# ---------------------------------------------------------------------------------------------- MiniLM on BBC News
def bbc_sentences(texts: list[str], n: int = 200) -> list[str]:
    """Sentences from the articles' paragraph lines (the first line of a file is its title)."""
    out: list[str] = []
    for text in texts:
        for line in text.splitlines()[1:]:
            for sentence in re.split(r"(?<=[.!?])\s+", line.strip()):
                if len(sentence.split()) >= 3:
                    out.append(sentence)
                    if len(out) == n:
                        return out
    return out


@pytest.fixture(scope="module")
def minilm_inputs(minilm_dir: Path, bbc_texts: list[str]) -> list[dict[str, torch.Tensor]]:
    from lmforge.tokenizers import WordPieceTokenizer

    tok = WordPieceTokenizer.from_pretrained(minilm_dir)
    sentences = bbc_sentences(bbc_texts)
    assert len(sentences) == 200
    sentences.sort(key=len)  # less padding to compute (about 20% faster); every batch still has some
    return [dict(tok(sentences[i:i + 32], padding=True, return_tensors="pt")) for i in range(0, 200, 32)]


@pytest.fixture(scope="module")
def minilm_reference(minilm_dir: Path, minilm_inputs) -> dict[str, list[torch.Tensor]]:
    refs = {}
    for impl in ("sdpa", "eager"):
        hf = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation=impl).eval()
        with torch.no_grad():
            refs[impl] = [hf(**inputs).last_hidden_state for inputs in minilm_inputs]
    return refs


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)  # (B, D)


@pytest.mark.parametrize("kernel", ["math", "sdpa"])
def test_minilm_parity_on_bbc_sentences(kernel: str, minilm_dir: Path, minilm_inputs, minilm_reference) -> None:
    from safetensors.torch import load_file

    cfg = config_from_hf(json.loads((minilm_dir / "config.json").read_text()))
    cfg.kernel = kernel
    enc_sd, heads_sd = state_dict_from_hf(load_file(str(minilm_dir / "model.safetensors")))
    assert heads_sd is None
    enc = Encoder(cfg)
    enc.load_state_dict(enc_sd)
    enc.eval()
    padded_tokens = 0
    with torch.no_grad():
        for i, inputs in enumerate(minilm_inputs):
            real = inputs["attention_mask"].bool()
            padded_tokens += int((~real).sum())
            ours = enc(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]).last_hidden_state
            for impl, ref in minilm_reference.items():
                diff = (ours - ref[i])[real].abs().max().item()
                assert diff <= TOL, f"batch {i} vs HF {impl}: max abs diff {diff:.2e}"
                emb_diff = (mean_pool(ours, real) - mean_pool(ref[i], real)).abs().max().item()
                assert emb_diff <= TOL, f"batch {i} vs HF {impl}: sentence embeddings differ by {emb_diff:.2e}"
        # Padding does not change the real tokens: each sentence of the first batch alone, unpadded.
        inputs = minilm_inputs[0]
        batched = enc(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]).last_hidden_state
        for b in range(len(inputs["input_ids"])):
            n = int(inputs["attention_mask"][b].sum())
            alone = enc(inputs["input_ids"][b:b + 1, :n]).last_hidden_state[0]
            close(batched[b, :n], alone)
    assert padded_tokens > 0  # the comparisons above really involved padding
