"""BERT pretraining heads: tying, masked-position gathering, state-dict names, parameter count."""

from __future__ import annotations

import copy

import pytest
import torch

from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.heads.base import TaskModel
from lmforge.heads.pretraining import (
    BertPreTrainingHeads,
    MaskedLMHead,
    NextSentenceHead,
    PreTrainingOutput,
    build_pretraining_head,
)
from lmforge.models.encoder import Encoder

B, T, V, D = 3, 7, 99, 12


def tiny_config(**overrides) -> ModelConfig:
    values = dict(vocab_size=V, d_model=D, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16)
    return ModelConfig(**{**values, **overrides})


def bert_pretraining(seed: int = 0, **overrides) -> TaskModel:
    torch.manual_seed(seed)
    cfg = tiny_config(**overrides)
    enc = Encoder(cfg)
    model = TaskModel(enc, BertPreTrainingHeads(cfg, enc.get_input_embeddings().weight))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    types = (torch.arange(T) >= 4).long().expand(B, T)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, 5:] = 0
    return ids, types, mask


def test_output_shapes() -> None:
    model = bert_pretraining()
    ids, types, mask = batch()
    out = model(ids, mask, types)
    assert isinstance(out, PreTrainingOutput)
    assert out.mlm_logits.shape == (B, T, V) and out.nsp_logits.shape == (B, 2)


def test_mlm_head_formula_and_any_leading_shape() -> None:
    model = bert_pretraining()
    mlm = model.head.mlm
    h = torch.randn(2, 3, 4, D)
    expected = torch.nn.functional.layer_norm(
        torch.nn.functional.gelu(h @ mlm.dense.weight.T + mlm.dense.bias), (D,), mlm.norm.weight, mlm.norm.bias,
        1e-12) @ model.backbone.embeddings.tokens.weight.T + mlm.bias
    torch.testing.assert_close(mlm(h), expected)
    assert mlm(h[0, 0, 0]).shape == (V,)
    nsp = model.head.nsp
    pooled = torch.randn(B, D)
    torch.testing.assert_close(nsp(pooled), pooled @ nsp.classifier.weight.T + nsp.classifier.bias)


def test_gathered_positions_equal_full_logits() -> None:
    model = bert_pretraining()
    ids, types, mask = batch()
    full = model(ids, mask, types)
    pairs = torch.tensor([[0, 1], [2, 4], [1, 0], [0, 6], [2, 4]])
    picked = model(ids, mask, types, masked_positions=pairs)
    assert picked.mlm_logits.shape == (len(pairs), V)
    torch.testing.assert_close(picked.mlm_logits, full.mlm_logits[pairs[:, 0], pairs[:, 1]], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(picked.nsp_logits, full.nsp_logits, rtol=0, atol=0)
    where = torch.rand(B, T, generator=torch.Generator().manual_seed(2)) < 0.3
    by_mask = model(ids, mask, types, masked_positions=where)
    torch.testing.assert_close(by_mask.mlm_logits, full.mlm_logits[where], rtol=1e-5, atol=1e-5)
    empty = model(ids, mask, types, masked_positions=torch.zeros(0, 2, dtype=torch.long))
    assert empty.mlm_logits.shape == (0, V)


def test_bad_masked_positions() -> None:
    model = bert_pretraining()
    ids, types, mask = batch()
    for positions, pattern in [
        (torch.tensor([[0, 7]]), r"up to \(0, 7\).*\[0, 3\) x \[0, 7\)"),
        (torch.tensor([[3, 0]]), r"up to \(3, 0\)"),
        (torch.tensor([[-1, 2]]), r"down to \(-1, 2\)"),
        (torch.tensor([1, 2, 3]), r"\(N, 2\) .*got shape \(3,\)"),
        (torch.tensor([[0.0, 1.0]]), r"dtype torch.float32"),
        (torch.zeros(B, T - 1, dtype=torch.bool), r"bool masked_positions mask must be \(batch=3, length=7\)"),
    ]:
        with pytest.raises(LmforgeError, match=pattern):
            model(ids, mask, types, masked_positions=positions)


def test_decoder_is_tied_and_not_saved() -> None:
    model = bert_pretraining()
    emb = model.backbone.get_input_embeddings().weight
    assert model.head.mlm.weight is emb
    keys = list(model.state_dict())
    assert [k for k in keys if k.startswith("head.")] == [
        "head.mlm.bias", "head.mlm.dense.weight", "head.mlm.dense.bias", "head.mlm.norm.weight",
        "head.mlm.norm.bias", "head.nsp.classifier.weight", "head.nsp.classifier.bias"]
    assert sum(p.numel() for p in model.parameters()) == sum(v.numel() for v in model.state_dict().values())
    # Loading strictly into a fresh model keeps the tie and copies the values.
    fresh = bert_pretraining(seed=5)
    fresh.load_state_dict(model.state_dict())
    assert fresh.head.mlm.weight is fresh.backbone.embeddings.tokens.weight
    torch.testing.assert_close(fresh.head.mlm.weight, emb, rtol=0, atol=0)
    heads_only = BertPreTrainingHeads(tiny_config(), fresh.backbone.embeddings.tokens.weight)
    heads_only.load_state_dict(model.head.state_dict())  # strict: the tied weight is not asked for
    # Casting and copying keep the tie.
    moved = copy.deepcopy(model).double()
    assert moved.head.mlm.weight is moved.backbone.embeddings.tokens.weight
    assert moved.head.mlm.weight.dtype == torch.float64


def test_mlm_gradient_reaches_the_embedding_once() -> None:
    model = bert_pretraining()
    ids, types, mask = batch()
    model.head.mlm(torch.randn(4, D)).sum().backward()  # only through the un-embedding
    grad = model.backbone.embeddings.tokens.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})


def test_head_argument_checks() -> None:
    cfg = tiny_config()
    enc = Encoder(cfg)
    with pytest.raises(LmforgeError,
                       match=r"shape \(99, 12\) but the config says \(vocab_size=100, embedding width=12\)"):
        BertPreTrainingHeads(tiny_config(vocab_size=100), enc.get_input_embeddings().weight)
    from lmforge.heads.pretraining import SpanBertHeads

    with pytest.raises(LmforgeError, match="tie_embeddings=False is not supported there"):
        SpanBertHeads(tiny_config(tie_embeddings=False), enc.get_input_embeddings().weight)
    with pytest.raises(LmforgeError, match="nn.Parameter"):
        MaskedLMHead(torch.zeros(V, D))
    with pytest.raises(LmforgeError, match="unknown activation 'swish'"):
        MaskedLMHead(enc.get_input_embeddings().weight, activation="swish")
    assert NextSentenceHead(D).classifier.out_features == 2
    built = build_pretraining_head(cfg, enc)
    assert built.mlm.weight is enc.get_input_embeddings().weight
    with pytest.raises(LmforgeError, match="Linear has no get_input_embeddings"):
        build_pretraining_head(cfg, torch.nn.Linear(2, 2))


def test_bert_base_parameter_count_matches_hugging_face() -> None:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        cfg = model_config_from_preset("bert-base", vocab_size=30522)
        enc = Encoder(cfg)
        ours = TaskModel(enc, BertPreTrainingHeads(cfg, enc.get_input_embeddings().weight))
        ref = transformers.BertForPreTraining(transformers.BertConfig(vocab_size=30522))
    n_ours = sum(p.numel() for p in ours.parameters())
    n_ref = sum(p.numel() for p in ref.parameters())
    assert n_ours == n_ref == 110_106_428


def test_an_untied_mlm_head_has_its_own_saved_un_embedding_and_leaves_rare_embeddings_alone():
    torch.manual_seed(0)
    cfg = tiny_config(tie_embeddings=False)
    enc = Encoder(cfg)
    tokens = enc.get_input_embeddings().weight
    heads = BertPreTrainingHeads(cfg, tokens)
    assert heads.mlm.weight is not tokens and heads.mlm.weight.shape == tokens.shape and not heads.mlm.tied
    assert "mlm.weight" in heads.state_dict() and "mlm.weight" not in BertPreTrainingHeads(
        tiny_config(), tokens).state_dict()
    model = TaskModel(enc, heads)
    ids = torch.randint(0, V // 2, (B, T))  # tokens V/2.. never appear in the input
    out = model(ids, masked_positions=torch.tensor([[0, 1], [1, 2]]))
    torch.testing.assert_close(
        out.mlm_logits, heads.mlm.norm(heads.mlm.activation(heads.mlm.dense(out.token_states[[0, 1], [1, 2]])))
        @ heads.mlm.weight.T + heads.mlm.bias)
    out.mlm_logits.logsumexp(-1).sum().backward()
    assert tokens.grad[V // 2:].abs().sum() == 0  # untied: an absent token's embedding gets no gradient
    assert heads.mlm.weight.grad[V // 2:].abs().sum() > 0  # its un-embedding row does
    tied_enc = Encoder(tiny_config())
    tied = TaskModel(tied_enc, BertPreTrainingHeads(tiny_config(), tied_enc.get_input_embeddings().weight))
    tied(ids, masked_positions=torch.tensor([[0, 1]])).mlm_logits.logsumexp(-1).sum().backward()
    assert tied_enc.get_input_embeddings().weight.grad[V // 2:].abs().sum() > 0  # tied: every row moves
