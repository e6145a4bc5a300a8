"""Hugging Face DistilBERT interop: random-weight parity both ways (library and CLI), parameter counts, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.config import PRESETS, ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop import hf_distilbert
from lmforge.models.encoder import Encoder
from lmforge.persistence import load_pretrained, save_pretrained
from tests.interop import parity

transformers = parity.transformers
V = 61
MLM = {"mlm_logits": "logits"}


def hf_tiny_config(**overrides) -> transformers.DistilBertConfig:
    values = dict(vocab_size=V, dim=12, n_layers=2, n_heads=3, hidden_dim=20, max_position_embeddings=16,
                  attn_implementation="eager")
    return transformers.DistilBertConfig(**{**values, **overrides})


def batch(seed: int = 1) -> dict[str, torch.Tensor]:
    return parity.padded_batch(V, seed)  # no segment embedding


def check_backbone(ours: torch.nn.Module, hf: torch.nn.Module, inputs: dict) -> None:
    parity.check_encoder(ours, hf, inputs, pooled="cls")  # no pooler: h_[CLS]


# ---------------------------------------------------------------------------------------------- import
@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_distilbert_for_masked_lm_loads_and_converts(tmp_path: Path, act: str) -> None:
    hf = parity.hf_model("DistilBertForMaskedLM", hf_tiny_config(activation=act), seed=1)
    hf.save_pretrained(tmp_path / "hf")
    inputs = batch()

    loaded = load_pretrained(tmp_path / "hf")
    assert loaded.head == {"type": "mlm"}
    cfg = loaded.config
    assert (cfg.type_vocab_size, cfg.pooler, cfg.layer_norm_eps, cfg.activation) == (0, False, 1e-12, act)
    parity.check_heads(loaded.model, hf, inputs, MLM)
    check_backbone(loaded.model.backbone, hf.distilbert, inputs)

    parity.import_cli(tmp_path / "hf", tmp_path / "ours")
    converted = load_pretrained(tmp_path / "ours")
    assert converted.config == loaded.config and converted.head == {"type": "mlm"}
    parity.check_heads(converted.model, hf, inputs, MLM)
    check_backbone(converted.model.backbone, hf.distilbert, inputs)


def test_distilbert_model_loads_as_a_backbone(tmp_path: Path) -> None:
    hf = parity.hf_model("DistilBertModel", hf_tiny_config(), seed=2)
    hf.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path)
    assert loaded.head is None and loaded.model.pooler is None and loaded.model.embeddings.segments is None
    check_backbone(loaded.model, hf, batch(seed=3))
    assert (sum(p.numel() for p in loaded.model.parameters()) == sum(p.numel() for p in hf.parameters()))


def test_sinusoidal_positions_import_as_their_stored_table(tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = transformers.DistilBertModel(hf_tiny_config(sinusoidal_pos_embds=True)).eval()
    hf.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path)
    assert loaded.config.positional == "learned"
    assert torch.equal(loaded.model.embeddings.positions.weight, hf.embeddings.position_embeddings.weight)
    check_backbone(loaded.model, hf, batch(seed=4))


def test_old_layout_with_tied_projector_and_buffer(tmp_path: Path) -> None:
    hf = parity.hf_model("DistilBertForMaskedLM", hf_tiny_config(), seed=5)
    sd = parity.save_old_layout(hf, tmp_path, {"distilbert.embeddings.position_ids": torch.arange(16)[None]},
                         tie_weights_=True)
    assert hf_distilbert.TIED_DECODER_WEIGHT in sd
    parity.check_heads(load_pretrained(tmp_path).model, hf, batch(seed=6), MLM)
    parity.check_untied_refused(hf_distilbert.state_dict_from_hf, sd, hf_distilbert.TIED_DECODER_WEIGHT)


# ---------------------------------------------------------------------------------------------- export
def ours_distilbert(head: str | None, seed: int):
    cfg = ModelConfig(vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=20, max_seq_len=16, type_vocab_size=0,
                      pooler=False)
    return cfg, parity.ours_encoder(cfg, head, seed)


def test_export_mlm_as_distilbert_for_masked_lm(tmp_path: Path) -> None:
    cfg, ours = ours_distilbert("mlm", seed=7)
    save_pretrained(ours, tmp_path / "ours", config=cfg, head={"type": "mlm"})
    hf_cfg = parity.export_cli(tmp_path / "ours", tmp_path / "hf")
    assert hf_cfg["model_type"] == "distilbert" and hf_cfg["architectures"] == ["DistilBertForMaskedLM"]
    hf = transformers.DistilBertForMaskedLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    inputs = batch(seed=8)
    parity.check_heads(ours, hf, inputs, MLM)
    check_backbone(ours.backbone, hf.distilbert, inputs)
    back = load_pretrained(tmp_path / "hf")
    assert back.config == cfg and back.head == {"type": "mlm"}
    parity.same_state(ours.state_dict(), back.model.state_dict())


def test_export_backbone_as_distilbert_model(tmp_path: Path) -> None:
    cfg, ours = ours_distilbert(None, seed=9)
    save_pretrained(ours, tmp_path / "ours", config=cfg)
    assert parity.export_cli(tmp_path / "ours", tmp_path / "hf")["architectures"] == ["DistilBertModel"]
    hf = transformers.DistilBertModel.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    check_backbone(ours, hf, batch(seed=10))


# ---------------------------------------------------------------------------------------------- sizes
def test_preset_parameter_count_matches_hugging_face() -> None:
    cfg = ModelConfig(**PRESETS["distilbert-base"])
    hf_cfg = parity.hf_config_of("DistilBertConfig", hf_distilbert.config_to_hf(cfg))
    n_ours, n_hf = parity.parameter_counts(lambda: Encoder(cfg), lambda: transformers.DistilBertModel(hf_cfg))
    assert n_ours == n_hf
    assert abs(n_ours / 66e6 - 1) < 0.05  # Sanh et al. 2019, Table 3: 66M


# ---------------------------------------------------------------------------------------------- errors
def test_config_mapping_and_errors() -> None:
    hf = hf_tiny_config(activation="relu", dropout=0.2, attention_dropout=0.3, pad_token_id=1,
                        initializer_range=0.01).to_dict()
    cfg = hf_distilbert.config_from_hf(hf)
    assert (cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.max_seq_len) == (V, 12, 3, 2, 20, 16)
    assert (cfg.activation, cfg.dropout, cfg.attention_dropout, cfg.pad_token_id, cfg.init_std) == \
        ("relu", 0.2, 0.3, 1, 0.01)
    assert hf_distilbert.config_from_hf(hf_distilbert.config_to_hf(cfg)) == cfg
    for key in ("tie_word_embeddings", "tie_weights_"):
        with pytest.raises(LmforgeError, match=rf"{key}=false"):
            hf_distilbert.config_from_hf({**hf, key: False})
    with pytest.raises(LmforgeError, match=r"activation='silu'"):
        hf_distilbert.config_from_hf({**hf, "activation": "silu"})
    with pytest.raises(LmforgeError, match=r"model_type='bert'"):
        hf_distilbert.config_from_hf({**hf, "model_type": "bert"})
    with pytest.raises(LmforgeError, match=r"lacks dim"):
        hf_distilbert.config_from_hf({k: v for k, v in hf.items() if k != "dim"})


def test_export_errors_name_the_option(tmp_path: Path, capsys) -> None:
    base = dict(vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=20, max_seq_len=16)
    with pytest.raises(LmforgeError, match=r"pooler=True.*layer_norm_eps=1e-05"):
        hf_distilbert.config_to_hf(ModelConfig(**base, type_vocab_size=0, layer_norm_eps=1e-5))
    with pytest.raises(LmforgeError, match=r"embedding_size=8.*share_layers='all'"):
        hf_distilbert.config_to_hf(ModelConfig(**base, type_vocab_size=0, pooler=False, embedding_size=8,
                                               share_layers="all"))
    # a pretraining head (NSP on a pooler) has no DistilBERT layout
    cfg, pretraining = ours_distilbert("pretraining", seed=11)
    save_pretrained(pretraining, tmp_path / "pre", config=cfg, head={"type": "pretraining"})
    assert main(["convert", "--to-hf", str(tmp_path / "pre"), "--out", str(tmp_path / "hf")]) != 0
    assert "'pretraining' head of a DistilBERT-layout encoder" in capsys.readouterr().err
    # no segment embedding but a pooler: no layout at all
    odd = ModelConfig(**base, type_vocab_size=0)
    save_pretrained(Encoder(odd), tmp_path / "odd", config=odd)
    assert main(["convert", "--to-hf", str(tmp_path / "odd"), "--out", str(tmp_path / "hf2")]) != 0
    assert "no Hugging Face layout expresses this encoder" in capsys.readouterr().err
