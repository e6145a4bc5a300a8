"""Hugging Face ELECTRA interop: random-weight parity both ways for ElectraModel, ElectraForPreTraining (the
discriminator) and ElectraForMaskedLM (the generator), an lmforge ELECTRA run as both, parameter counts, errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.heads import build_head
from lmforge.heads.base import TaskModel
from lmforge.heads.electra import generator_config
from lmforge.interop import hf_electra
from lmforge.models.encoder import Encoder
from lmforge.persistence import load_pretrained, save_pretrained
from tests.interop import parity

transformers = parity.transformers
V = 61


def hf_tiny_config(**overrides) -> transformers.ElectraConfig:
    values = dict(vocab_size=V, embedding_size=8, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                  intermediate_size=20, max_position_embeddings=16, type_vocab_size=2, hidden_act="gelu",
                  attn_implementation="eager")
    return transformers.ElectraConfig(**{**values, **overrides})


def batch(seed: int = 1) -> dict[str, torch.Tensor]:
    return parity.padded_batch(V, seed, segments=2)


def check_backbone(ours: torch.nn.Module, hf: torch.nn.Module, inputs: dict) -> None:
    parity.check_encoder(ours, hf, inputs, pooled="cls")  # pooler=False: h_[CLS]


def check_head(ours: TaskModel, hf: torch.nn.Module, inputs: dict) -> None:
    """The discriminator's logits (B, T) or the generator's (B, T, V), on the real tokens."""
    out, ref = parity.run_both(ours, hf, inputs)
    got = out.rtd_logits if hasattr(out, "rtd_logits") else out.mlm_logits
    mask = parity.real(inputs)
    parity.close(got[mask], ref.logits[mask])


# ---------------------------------------------------------------------------------------------- import
@pytest.mark.parametrize(("cls", "head"), [("ElectraForPreTraining", "rtd"), ("ElectraForMaskedLM", "mlm")])
def test_electra_with_a_head_loads_and_converts(tmp_path: Path, cls: str, head: str) -> None:
    hf = parity.hf_model(cls, hf_tiny_config(), seed=1)
    hf.save_pretrained(tmp_path / "hf")
    inputs = batch()

    loaded = load_pretrained(tmp_path / "hf")
    assert loaded.head == {"type": head}
    assert (loaded.config.embedding_size, loaded.config.d_model, loaded.config.pooler) == (8, 12, False)
    check_head(loaded.model, hf, inputs)
    check_backbone(loaded.model.backbone, hf.electra, inputs)
    assert (sum(p.numel() for p in loaded.model.parameters()) == sum(p.numel() for p in hf.parameters()))

    parity.import_cli(tmp_path / "hf", tmp_path / "ours")
    converted = load_pretrained(tmp_path / "ours")
    assert converted.config == loaded.config and converted.head == loaded.head
    check_head(converted.model, hf, inputs)
    # and back out: Hugging Face reads the export, with the same outputs
    assert parity.export_cli(tmp_path / "ours", tmp_path / "back")["architectures"] == [cls]
    again = getattr(transformers, cls).from_pretrained(str(tmp_path / "back"), attn_implementation="eager").eval()
    check_head(converted.model, again, inputs)


def test_electra_model_without_projection_loads_as_a_backbone(tmp_path: Path) -> None:
    """E = hidden size: no embeddings_project in Hugging Face's model, no projection in ours."""
    hf = parity.hf_model("ElectraModel", hf_tiny_config(embedding_size=12), seed=2)
    hf.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path)
    assert loaded.head is None and loaded.config.embedding_size is None
    assert loaded.model.embeddings.projection is None
    check_backbone(loaded.model, hf, batch(seed=3))


def test_old_layout_with_tied_copy_and_buffers(tmp_path: Path) -> None:
    """A state dict with the tied generator_lm_head.weight and the position_ids buffer loads; an untied one does not."""
    hf = parity.hf_model("ElectraForMaskedLM", hf_tiny_config(), seed=4)
    sd = parity.save_old_layout(hf, tmp_path, {"electra.embeddings.position_ids": torch.arange(16)[None]})
    assert hf_electra.TIED_DECODER_WEIGHT in sd
    check_head(load_pretrained(tmp_path).model, hf, batch(seed=5))
    parity.check_untied_refused(hf_electra.state_dict_from_hf, sd, hf_electra.TIED_DECODER_WEIGHT)


# ---------------------------------------------------------------------------------------------- export
def ours_electra(head: str | None, embedding_size: int | None = 8, seed: int = 8, **overrides):
    cfg = ModelConfig(vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=20, max_seq_len=16,
                      embedding_size=embedding_size, pooler=False, generator_size=2 / 3, **overrides)
    return cfg, parity.ours_encoder(cfg, head, seed)


@pytest.mark.parametrize(("head", "cls"), [(None, "ElectraModel"), ("rtd", "ElectraForPreTraining"),
                                           ("mlm", "ElectraForMaskedLM")])
def test_export_and_back(tmp_path: Path, head: str | None, cls: str) -> None:
    cfg, ours = ours_electra(head, embedding_size=None if head == "mlm" else 8)  # E = D: no projection either side
    save_pretrained(ours, tmp_path / "ours", config=cfg, head=None if head is None else {"type": head})
    hf_cfg = parity.export_cli(tmp_path / "ours", tmp_path / "hf")
    assert hf_cfg["model_type"] == "electra" and hf_cfg["architectures"] == [cls]
    hf = getattr(transformers, cls).from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    inputs = batch(seed=9)
    if head is None:
        check_backbone(ours, hf, inputs)
    else:
        check_head(ours, hf, inputs)
        check_backbone(ours.backbone, hf.electra, inputs)
    back = load_pretrained(tmp_path / "hf")
    assert back.config == dataclasses.replace(cfg, generator_size=None)  # a pretraining-only setting
    parity.same_state(ours.state_dict(), back.model.state_dict())
    # the in-memory conversion is exact too, with the tied copy HF's own state dict has
    if head == "mlm":
        hf.load_state_dict(hf_electra.state_dict_to_hf(*parity.split_task_state(ours.state_dict())), strict=True)


def test_an_electra_run_is_both_hugging_face_models(tmp_path: Path) -> None:
    """The pretraining model (discriminator backbone + generator head) exports its discriminator as
    ElectraForPreTraining (lmforge convert) and its generator as ElectraForMaskedLM (hf_electra.generator_state_dicts):
    each gives our logits on the same input."""
    cfg, ours = ours_electra("electra")
    save_pretrained(ours, tmp_path / "run", config=cfg)
    parity.export_cli(tmp_path / "run", tmp_path / "disc")
    disc = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / "disc"), attn_implementation="eager")
    inputs = batch(seed=10)
    mask = parity.real(inputs)
    with torch.no_grad():
        states = ours.backbone(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
        parity.close(ours.head.rtd(states.last_hidden_state)[mask], disc.eval()(**inputs).logits[mask])

    gen_cfg = generator_config(cfg)
    assert (gen_cfg.d_model, gen_cfg.n_heads, gen_cfg.d_ff, gen_cfg.d_embedding) == (8, 2, 13, 8)
    enc, heads = hf_electra.generator_state_dicts(ours.state_dict())
    hf_cfg = hf_electra.config_to_hf(gen_cfg, "ElectraForMaskedLM")
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**hf_cfg, attn_implementation="eager")).eval()
    gen.load_state_dict(hf_electra.state_dict_to_hf(enc, heads), strict=True)
    with torch.no_grad():
        hidden = ours.head.generator(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
        parity.close(ours.head.mlm(hidden.last_hidden_state)[mask], gen(**inputs).logits[mask])


def hf_electra_of(config: ModelConfig, cls: str) -> torch.nn.Module:
    """An empty Hugging Face ``cls`` of the config lmforge's export writes for ``config``."""
    return getattr(transformers, cls)(transformers.ElectraConfig(**hf_electra.config_to_hf(config, cls),
                                                                 attn_implementation="eager"))


def test_an_electra_training_step_equals_the_paper_over_hugging_face_models() -> None:
    """One ELECTRA step (generator MLM + lambda * discriminator BCE) on lmforge's model equals the same step written
    from the paper over Hugging Face's ElectraForMaskedLM and ElectraForPreTraining sharing one embedding block:
    same samples (same seed), loss and gradient of every parameter. The discriminator's failure to learn at the
    demo's budget (BENCHMARKS) is therefore not the implementation's."""
    import torch.nn.functional as F

    from lmforge.heads.electra import sample_replacements
    from lmforge.objectives.electra import ElectraObjective
    from lmforge.objectives.options import ElectraLoss

    cfg, ours = ours_electra("electra", dropout=0.0, attention_dropout=0.0)  # both sides draw only the samples
    ours.train()
    state = ours.state_dict()
    disc = hf_electra_of(cfg, "ElectraForPreTraining")
    disc.load_state_dict(hf_electra.state_dict_to_hf(*parity.split_task_state(state, "rtd.")), strict=True)
    gen_enc, gen_heads = hf_electra.generator_state_dicts(state)
    gen = hf_electra_of(generator_config(cfg), "ElectraForMaskedLM")
    gen.load_state_dict(hf_electra.state_dict_to_hf(gen_enc, gen_heads), strict=True)
    gen.electra.embeddings = disc.electra.embeddings  # the paper's sharing
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight

    inputs = batch(seed=11)
    mask = parity.real(inputs)
    g = torch.Generator().manual_seed(12)
    labels = torch.full(mask.shape, -100)
    chosen = (torch.rand(mask.shape, generator=g) < 0.4) & mask
    chosen[0, 1] = True
    labels[chosen] = inputs["input_ids"][chosen]
    masked = inputs["input_ids"].masked_fill(chosen, 3)
    data = {**inputs, "input_ids": masked, "mlm_labels": labels}

    torch.manual_seed(5)
    out = ElectraObjective(ElectraLoss(rtd_weight=50.0))(ours, data)
    loss = sum(total / items for total, items in out.losses.values())
    loss.backward()

    torch.manual_seed(5)
    gen_logits = gen(input_ids=masked, attention_mask=inputs["attention_mask"],
                     token_type_ids=inputs["token_type_ids"]).logits[chosen]
    sampled = sample_replacements(gen_logits)
    corrupted = inputs["input_ids"].masked_scatter(chosen, sampled)
    rtd_logits = disc(input_ids=corrupted, attention_mask=inputs["attention_mask"],
                      token_type_ids=inputs["token_type_ids"]).logits
    ref = F.cross_entropy(gen_logits, labels[chosen]) + 50.0 * F.binary_cross_entropy_with_logits(
        rtd_logits[mask], (corrupted != inputs["input_ids"])[mask].float())
    ref.backward()

    parity.close(loss.detach(), ref.detach())
    ours_grads = {k: p.grad for k, p in ours.named_parameters() if p.grad is not None}
    disc_grads = hf_electra.state_dict_to_hf(*parity.split_task_state(ours_grads, "rtd."))
    for name, grad in disc_grads.items():  # the shared embedding's gradient holds both models' terms on both sides
        parity.close(grad, dict(disc.named_parameters())[name].grad)
    gen_only = {k[len("head.generator."):]: v for k, v in ours_grads.items() if k.startswith("head.generator.layers")}
    hf_gen = dict(gen.named_parameters())
    mapped = hf_electra.state_dict_to_hf({**gen_only, **{k: v for k, v in gen_enc.items() if "layers" not in k}},
                                         parity.split_task_state(ours_grads, "mlm.")[1], include_tied=False)
    checked = 0
    for name, grad in mapped.items():
        if ".encoder.layer." in name or name.startswith("generator_"):
            parity.close(grad, hf_gen[name].grad)
            checked += 1
    assert checked > 10


# ---------------------------------------------------------------------------------------------- sizes
# Clark et al. 2020, Table 6 / section 3.4: ELECTRA-Small 14M and ELECTRA-Base 110M parameters (discriminators).
PAPER_PARAMETERS = {"electra-small": 14e6, "electra-base": 110e6}


@pytest.mark.parametrize("preset", sorted(PAPER_PARAMETERS))
def test_preset_parameter_counts_match_hugging_face_and_the_paper(preset: str) -> None:
    cfg = model_config_from_preset(preset)
    counts = []
    for config, cls in ((cfg, "ElectraModel"), (generator_config(cfg), "ElectraForMaskedLM")):
        hf_cfg = parity.hf_config_of("ElectraConfig", hf_electra.config_to_hf(config, cls))

        def build_ours(config=config, cls=cls) -> torch.nn.Module:
            enc = Encoder(config)
            return enc if cls == "ElectraModel" else TaskModel(enc, build_head({"type": "mlm"}, config, enc))

        def build_hf(cls=cls, hf_cfg=hf_cfg) -> torch.nn.Module:
            return getattr(transformers, cls)(hf_cfg)

        n_ours, n_hf = parity.parameter_counts(build_ours, build_hf)
        assert n_ours == n_hf, cls
        counts.append(n_ours)
    assert abs(counts[0] / PAPER_PARAMETERS[preset] - 1) < 0.05, counts[0]


# ---------------------------------------------------------------------------------------------- errors
def test_config_mapping_and_errors() -> None:
    hf = hf_tiny_config(layer_norm_eps=1e-7, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3, pad_token_id=1,
                        initializer_range=0.01).to_dict()
    cfg = hf_electra.config_from_hf(hf)
    assert (cfg.vocab_size, cfg.embedding_size, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.max_seq_len,
            cfg.type_vocab_size, cfg.pooler) == (V, 8, 12, 3, 2, 20, 16, 2, False)
    assert (cfg.activation, cfg.layer_norm_eps, cfg.dropout, cfg.attention_dropout, cfg.pad_token_id,
            cfg.init_std) == ("gelu", 1e-7, 0.2, 0.3, 1, 0.01)
    assert hf_electra.config_from_hf(hf_electra.config_to_hf(cfg)) == cfg
    no_size = {k: v for k, v in hf.items() if k != "embedding_size"}
    assert hf_electra.config_from_hf(no_size).embedding_size == 128  # transformers' default
    for key, value, words in (("tie_word_embeddings", False, "tie_word_embeddings=false"),
                              ("hidden_act", "silu", "hidden_act='silu'"), ("model_type", "bert", "model_type='bert'"),
                              ("is_decoder", True, "decoder"),
                              ("position_embedding_type", "relative_key", "position_embedding_type='relative_key'")):
        with pytest.raises(LmforgeError, match=words):
            hf_electra.config_from_hf({**hf, key: value})
    with pytest.raises(LmforgeError, match=r"pooler=True.*share_layers='all'|share_layers='all'.*pooler=True"):
        hf_electra.config_to_hf(ModelConfig(share_layers="all"))
    with pytest.raises(LmforgeError, match=r"activation='gelu_tanh' with an MLM head"):
        hf_electra.config_to_hf(ModelConfig(pooler=False, activation="gelu_tanh"), "ElectraForMaskedLM")


def test_state_dict_errors() -> None:
    torch.manual_seed(0)
    disc = transformers.ElectraForPreTraining(hf_tiny_config()).state_dict()
    gen = transformers.ElectraForMaskedLM(hf_tiny_config(hidden_act="gelu_new")).state_dict()
    with pytest.raises(LmforgeError, match="both a discriminator head"):
        hf_electra.state_dict_from_hf({**disc, "generator_lm_head.bias": gen["generator_lm_head.bias"]})
    with pytest.raises(LmforgeError, match=r"unexpected key\(s\).*'electra\.pooler\.dense\.weight'"):
        hf_electra.state_dict_from_hf({**disc, "electra.pooler.dense.weight": torch.zeros(12, 12)})
    gelu_new = hf_electra.config_from_hf(hf_tiny_config(hidden_act="gelu_new").to_dict())
    with pytest.raises(LmforgeError, match="only hidden_act 'gelu'"):
        hf_electra.state_dict_from_hf(gen, gelu_new)
    with pytest.raises(LmforgeError, match=r"no Hugging Face ELECTRA name.*'pooler\.dense\.weight'"):
        hf_electra.state_dict_to_hf(Encoder(ModelConfig(vocab_size=V, d_model=12, n_heads=3, n_layers=1)).state_dict())
