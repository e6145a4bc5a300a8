"""Hugging Face DistilBERT interop: random-weight parity both ways (library and CLI), parameter counts, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.config import PRESETS, ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads import build_head
from lmforge.heads.base import TaskModel
from lmforge.interop import hf_distilbert
from lmforge.models.encoder import Encoder
from lmforge.models.pretrained import load_pretrained, save_pretrained

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (dev extra)")

B, T, V = 3, 7, 61
TOL = 1e-5
RTOL = 1e-4


def hf_tiny_config(**overrides) -> transformers.DistilBertConfig:
    values = dict(vocab_size=V, dim=12, n_layers=2, n_heads=3, hidden_dim=20, max_position_embeddings=16,
                  attn_implementation="eager")
    return transformers.DistilBertConfig(**{**values, **overrides})


def perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
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
    return dict(input_ids=torch.randint(0, V, (B, T), generator=g), attention_mask=mask)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=RTOL, atol=TOL)


def check_backbone(ours: torch.nn.Module, hf: torch.nn.Module, inputs: dict) -> None:
    with torch.no_grad():
        ref = hf(**inputs, output_hidden_states=True)
        out = ours(inputs["input_ids"], inputs["attention_mask"], output_hidden_states=True)
    real = inputs["attention_mask"].bool()
    close(out.last_hidden_state[real], ref.last_hidden_state[real])
    assert len(out.hidden_states) == len(ref.hidden_states)
    for ours_h, ref_h in zip(out.hidden_states, ref.hidden_states, strict=True):
        close(ours_h[real], ref_h[real])
    close(out.pooled_output, ref.last_hidden_state[:, 0])  # no pooler: h_[CLS]


def check_mlm(ours: TaskModel, hf: torch.nn.Module, inputs: dict) -> None:
    with torch.no_grad():
        ref = hf(**inputs)
        out = ours(inputs["input_ids"], inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    close(out.mlm_logits[real], ref.logits[real])


# ---------------------------------------------------------------------------------------------- import
@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_distilbert_for_masked_lm_loads_and_converts(tmp_path: Path, act: str) -> None:
    torch.manual_seed(0)
    hf = perturb(transformers.DistilBertForMaskedLM(hf_tiny_config(activation=act)), seed=1)
    hf.save_pretrained(tmp_path / "hf")
    inputs = batch()

    loaded = load_pretrained(tmp_path / "hf")
    assert loaded.head == {"type": "mlm"}
    cfg = loaded.config
    assert (cfg.type_vocab_size, cfg.pooler, cfg.layer_norm_eps, cfg.activation) == (0, False, 1e-12, act)
    check_mlm(loaded.model, hf, inputs)
    check_backbone(loaded.model.backbone, hf.distilbert, inputs)

    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    converted = load_pretrained(tmp_path / "ours")
    assert converted.config == loaded.config and converted.head == {"type": "mlm"}
    check_mlm(converted.model, hf, inputs)
    check_backbone(converted.model.backbone, hf.distilbert, inputs)


def test_distilbert_model_loads_as_a_backbone(tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = perturb(transformers.DistilBertModel(hf_tiny_config()), seed=2)
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
    from safetensors.torch import save_file

    torch.manual_seed(0)
    hf = perturb(transformers.DistilBertForMaskedLM(hf_tiny_config()), seed=5)
    sd = {k: v.clone().contiguous() for k, v in hf.state_dict().items()}
    assert hf_distilbert.TIED_DECODER_WEIGHT in sd
    sd["distilbert.embeddings.position_ids"] = torch.arange(16)[None]
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**hf.config.to_dict(), "tie_weights_": True}))
    check_mlm(load_pretrained(tmp_path).model, hf, batch(seed=6))
    sd[hf_distilbert.TIED_DECODER_WEIGHT] = sd[hf_distilbert.TIED_DECODER_WEIGHT] + 1.0
    with pytest.raises(LmforgeError, match="untied"):
        hf_distilbert.state_dict_from_hf(sd)


# ---------------------------------------------------------------------------------------------- export
def ours_distilbert(head: str | None, seed: int):
    cfg = ModelConfig(vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=20, max_seq_len=16, type_vocab_size=0,
                      pooler=False)
    torch.manual_seed(seed)
    enc = Encoder(cfg)
    model = enc if head is None else TaskModel(enc, build_head({"type": head}, cfg, enc))
    return cfg, perturb(model, seed)


def test_export_mlm_as_distilbert_for_masked_lm(tmp_path: Path) -> None:
    cfg, ours = ours_distilbert("mlm", seed=7)
    save_pretrained(ours, tmp_path / "ours", config=cfg, head={"type": "mlm"})
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")]) == 0
    hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_cfg["model_type"] == "distilbert" and hf_cfg["architectures"] == ["DistilBertForMaskedLM"]
    hf = transformers.DistilBertForMaskedLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    inputs = batch(seed=8)
    check_mlm(ours, hf, inputs)
    check_backbone(ours.backbone, hf.distilbert, inputs)
    back = load_pretrained(tmp_path / "hf")
    assert back.config == cfg and back.head == {"type": "mlm"}
    ours_sd, back_sd = ours.state_dict(), back.model.state_dict()
    assert ours_sd.keys() == back_sd.keys() and all(torch.equal(ours_sd[k], back_sd[k]) for k in ours_sd)


def test_export_backbone_as_distilbert_model(tmp_path: Path) -> None:
    cfg, ours = ours_distilbert(None, seed=9)
    save_pretrained(ours, tmp_path / "ours", config=cfg)
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["DistilBertModel"]
    hf = transformers.DistilBertModel.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    check_backbone(ours, hf, batch(seed=10))


# ---------------------------------------------------------------------------------------------- sizes
def test_preset_parameter_count_matches_hugging_face() -> None:
    cfg = ModelConfig(**PRESETS["distilbert-base"])
    hf_cfg = transformers.DistilBertConfig(**{k: v for k, v in hf_distilbert.config_to_hf(cfg).items()
                                              if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        ours = Encoder(cfg)
        hf = transformers.DistilBertModel(hf_cfg)
    n_ours = sum(p.numel() for p in ours.parameters())
    assert n_ours == sum(p.numel() for p in hf.parameters())
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
    cfg, _ = ours_distilbert(None, seed=11)
    torch.manual_seed(0)
    enc = Encoder(cfg)
    save_pretrained(TaskModel(enc, build_head({"type": "pretraining"}, cfg, enc)), tmp_path / "pre", config=cfg,
                    head={"type": "pretraining"})
    assert main(["convert", "--to-hf", str(tmp_path / "pre"), "--out", str(tmp_path / "hf")]) != 0
    assert "'pretraining' head of a DistilBERT-layout encoder" in capsys.readouterr().err
    # no segment embedding but a pooler: no layout at all
    odd = ModelConfig(**base, type_vocab_size=0)
    save_pretrained(Encoder(odd), tmp_path / "odd", config=odd)
    assert main(["convert", "--to-hf", str(tmp_path / "odd"), "--out", str(tmp_path / "hf2")]) != 0
    assert "no Hugging Face layout expresses this encoder" in capsys.readouterr().err
