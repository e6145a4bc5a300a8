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

transformers = pytest.importorskip("transformers")

B, T, V = 3, 7, 99
TOL = 1e-5
RTOL = 1e-4  # float32 through 6 layers with another library's kernels: relative error grows with the magnitude


def hf_tiny_config(**overrides) -> transformers.BertConfig:
    values = dict(vocab_size=V, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
                  max_position_embeddings=16, type_vocab_size=3, attn_implementation="eager")
    return transformers.BertConfig(**{**values, **overrides})


def perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random init leaves LayerNorms at 1/0 and biases at 0; shake every parameter so each one matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def batch(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return dict(input_ids=torch.randint(0, V, (B, T), generator=g),
                token_type_ids=torch.randint(0, 3, (B, T), generator=g), attention_mask=mask)


def ours_from_hf_pretraining(hf_model, kernel: str = "sdpa") -> TaskModel:
    cfg = config_from_hf(hf_model.config.to_dict())
    cfg.kernel = kernel
    enc_sd, heads_sd = state_dict_from_hf(hf_model.state_dict())
    enc = Encoder(cfg)
    heads = BertPreTrainingHeads(cfg, enc.get_input_embeddings().weight)
    enc.load_state_dict(enc_sd)
    heads.load_state_dict(heads_sd)
    return TaskModel(enc, heads).eval()


def ours_from_hf_pretraining_partial(hf_model) -> TaskModel:
    cfg = config_from_hf(hf_model.config.to_dict())
    enc_sd, heads_sd = state_dict_from_hf(hf_model.state_dict())
    enc = Encoder(cfg)
    heads = BertPreTrainingHeads(cfg, enc.get_input_embeddings().weight)
    assert set(enc.load_state_dict(enc_sd, strict=False).missing_keys) == {"pooler.dense.weight", "pooler.dense.bias"}
    missing = heads.load_state_dict(heads_sd, strict=False).missing_keys
    assert set(missing) == {"nsp.classifier.weight", "nsp.classifier.bias"}
    return TaskModel(enc, heads).eval()


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=RTOL, atol=TOL)


# ---------------------------------------------------------------------------------------------- random weights
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("kernel", ["math", "sdpa"])
def test_hf_pretraining_to_ours(act: str, kernel: str) -> None:
    torch.manual_seed(0)
    hf = perturb(transformers.BertForPreTraining(hf_tiny_config(hidden_act=act)), seed=1)
    ours = ours_from_hf_pretraining(hf, kernel)
    inputs = batch()
    with torch.no_grad():
        ref = hf(**inputs)
        out = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    real = inputs["attention_mask"].bool()
    close(out.mlm_logits[real], ref.prediction_logits[real])
    close(out.nsp_logits, ref.seq_relationship_logits)


def test_ours_to_hf_pretraining() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16, type_vocab_size=3,
                      activation="gelu_tanh")
    enc = Encoder(cfg)
    ours = perturb(TaskModel(enc, BertPreTrainingHeads(cfg, enc.get_input_embeddings().weight)), seed=2)
    hf_dict = config_to_hf(cfg)
    assert hf_dict["model_type"] == "bert" and hf_dict["architectures"] == ["BertForPreTraining"]
    assert hf_dict["hidden_act"] == "gelu_new"
    hf = transformers.BertForPreTraining(transformers.BertConfig(**hf_dict, attn_implementation="eager"))
    hf.load_state_dict(state_dict_to_hf(ours.backbone.state_dict(), ours.head.state_dict()), strict=True)
    hf.eval()
    inputs = batch(seed=3)
    with torch.no_grad():
        ref = hf(**inputs)
        out = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    real = inputs["attention_mask"].bool()
    close(out.mlm_logits[real], ref.prediction_logits[real])
    close(out.nsp_logits, ref.seq_relationship_logits)
    # And back again: the same tensors under the same names.
    enc_sd, heads_sd = state_dict_from_hf(hf.state_dict())
    assert enc_sd.keys() == ours.backbone.state_dict().keys() and heads_sd.keys() == ours.head.state_dict().keys()
    for key, value in ours.backbone.state_dict().items():
        assert torch.equal(enc_sd[key], value), key


def test_save_pretrained_layout_loads_with_from_pretrained(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16, type_vocab_size=3)
    enc = Encoder(cfg)
    ours = perturb(TaskModel(enc, BertPreTrainingHeads(cfg, enc.get_input_embeddings().weight)), seed=4)
    hf_sd = state_dict_to_hf(ours.backbone.state_dict(), ours.head.state_dict(), include_tied=False)
    save_file({k: v.contiguous() for k, v in hf_sd.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(cfg)))
    assert is_hf_bert_dir(tmp_path)
    hf = transformers.BertForPreTraining.from_pretrained(str(tmp_path), attn_implementation="sdpa").eval()
    inputs = batch(seed=5)
    with torch.no_grad():
        ref = hf(**inputs)
        out = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    real = inputs["attention_mask"].bool()
    close(out.mlm_logits[real], ref.prediction_logits[real])
    close(out.nsp_logits, ref.seq_relationship_logits)


def test_bert_model_layout_round_trip() -> None:
    torch.manual_seed(0)
    hf = perturb(transformers.BertModel(hf_tiny_config()), seed=6)
    hf_sd = hf.state_dict()
    enc_sd, heads_sd = state_dict_from_hf(hf_sd)
    assert heads_sd is None
    enc = Encoder(config_from_hf(hf.config.to_dict()))
    enc.load_state_dict(enc_sd)
    enc.eval()
    back = state_dict_to_hf(enc.state_dict())
    assert back.keys() == hf_sd.keys()
    assert all(torch.equal(back[k], hf_sd[k]) for k in hf_sd)
    inputs = batch(seed=7)
    with torch.no_grad():
        ref = hf(**inputs, output_hidden_states=True, output_attentions=True)
        out = enc(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], output_hidden_states=True,
                  output_attentions=True)
    real = inputs["attention_mask"].bool()
    for ours_h, ref_h in zip(out.hidden_states, ref.hidden_states, strict=True):
        close(ours_h[real], ref_h[real])
    for ours_a, ref_a in zip(out.attentions, ref.attentions, strict=True):  # (B, H, T, T), real queries only
        close(ours_a.transpose(1, 2)[real], ref_a.transpose(1, 2)[real])
    close(out.pooled_output, ref.pooler_output)


def test_masked_lm_layout_has_no_pooler_and_no_nsp() -> None:
    torch.manual_seed(0)
    hf = perturb(transformers.BertForMaskedLM(hf_tiny_config()), seed=8)
    ours = ours_from_hf_pretraining_partial(hf)
    inputs = batch(seed=9)
    with torch.no_grad():
        ref = hf(**inputs)
        out = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    real = inputs["attention_mask"].bool()
    close(out.mlm_logits[real], ref.logits[real])


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
