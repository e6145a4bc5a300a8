"""The tied token embedding's one dense gradient (lmforge.nn.kernels.tied_embedding): the projection hands its (V, D)
gradient to the look-up, which adds its rows; every gradient equals plain autograd's, in every way a backward can
run, and the hand-over happens only where it is safe."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from lmforge.config import ModelConfig
from lmforge.heads import TaskModel, build_head
from lmforge.models import Decoder, Encoder
from lmforge.nn.kernels.linear_ce import linear_cross_entropy
from lmforge.nn.kernels.tied_embedding import _TiedLookup, embed_tokens, find_tied_lookup, tied_linear
from lmforge.objectives import CausalLMObjective, MaskedLMObjective

V, D = 41, 8


def _pair(seed: int = 0) -> tuple[torch.nn.Embedding, torch.nn.Embedding]:
    """Two equal embeddings; the second has a (no-op) forward hook, which keeps its look-up torch's own."""
    torch.manual_seed(seed)
    a = torch.nn.Embedding(V, D).double()
    b = copy.deepcopy(a)
    b.register_forward_hook(lambda module, inputs, output: None)
    return a, b


def _ids(n: int = 30, seed: int = 1) -> torch.Tensor:
    ids = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))
    ids[:5] = 3  # repeated ids: their rows are summed
    return ids


def _lm_loss(emb: torch.nn.Embedding, ids: torch.Tensor, times: int = 1) -> torch.Tensor:
    h = torch.tanh(embed_tokens(emb, ids[:-1]))  # (N, D)
    total = 0.0
    for k in range(times):  # several projections of one look-up
        loss, _ = linear_cross_entropy(h * (1 + k), emb.weight, ids[1:])
        total = total + loss
    return total


def test_the_projection_finds_the_lookup_only_when_it_is_tied_and_upstream():
    a, b = _pair()
    ids = _ids()
    x = embed_tokens(a, ids)
    assert isinstance(x.grad_fn, _TiedLookup._backward_cls)
    assert find_tied_lookup(torch.tanh(x), a.weight) is x.grad_fn
    other = torch.nn.Embedding(V, D).double()
    assert find_tied_lookup(torch.tanh(x), other.weight) is None  # another parameter (untied)
    assert find_tied_lookup(torch.tanh(x).detach().requires_grad_(), a.weight) is None  # not upstream
    assert find_tied_lookup(torch.tanh(x), a.weight * 1.0) is None  # not a leaf
    y = embed_tokens(b, ids)  # hooked: torch's own look-up
    assert not isinstance(y.grad_fn, _TiedLookup._backward_cls)
    with torch.no_grad():
        assert embed_tokens(a, ids).grad_fn is None


@pytest.mark.parametrize("times", [1, 3])
def test_gradients_equal_plain_autograd(times):
    a, b = _pair()
    ids = _ids()
    (0.37 * _lm_loss(a, ids, times)).backward()
    (0.37 * _lm_loss(b, ids, times)).backward()
    torch.testing.assert_close(a.weight.grad, b.weight.grad, rtol=1e-12, atol=1e-14)
    assert a.weight.grad.layout == torch.strided


def test_accumulation_over_two_backwards_autograd_grad_and_retain_graph():
    a, b = _pair()
    ids, ids2 = _ids(), _ids(seed=2)
    for emb in (a, b):  # gradient accumulation: .grad += across passes
        _lm_loss(emb, ids).backward()
        _lm_loss(emb, ids2).backward()
    torch.testing.assert_close(a.weight.grad, b.weight.grad, rtol=1e-12, atol=1e-14)
    (ga,) = torch.autograd.grad(_lm_loss(a, ids), [a.weight])
    (gb,) = torch.autograd.grad(_lm_loss(b, ids), [b.weight])
    torch.testing.assert_close(ga, gb, rtol=1e-12, atol=1e-14)
    a.weight.grad = b.weight.grad = None
    la, lb = _lm_loss(a, ids), _lm_loss(b, ids)
    for _ in range(2):  # the second pass recomputes what the first handed over
        la.backward(retain_graph=True)
        lb.backward(retain_graph=True)
        torch.testing.assert_close(a.weight.grad, b.weight.grad, rtol=1e-12, atol=1e-14)


def test_hooks_see_one_dense_gradient_and_checkpointing_adds_up():
    a, b = _pair()
    ids = _ids()
    seen = []
    a.weight.register_hook(lambda g: seen.append(g.clone()))
    _lm_loss(a, ids).backward()
    assert len(seen) == 1 and seen[0].layout == torch.strided
    _lm_loss(b, ids).backward()
    torch.testing.assert_close(seen[0], b.weight.grad, rtol=1e-12, atol=1e-14)
    # activation checkpointing recomputes the look-up's region in backward; the hand-over still adds up
    a.weight.grad = b.weight.grad = None
    for emb in (a, b):
        h = checkpoint(lambda i, e=emb: torch.tanh(embed_tokens(e, i)), ids[:-1], use_reentrant=False)
        loss, _ = linear_cross_entropy(h, emb.weight, ids[1:])
        loss.backward()
    torch.testing.assert_close(a.weight.grad, b.weight.grad, rtol=1e-12, atol=1e-14)


def test_only_the_head_in_the_graph_gets_its_own_gradient_back():
    a, b = _pair()
    ids = _ids()
    h = torch.randn(len(ids) - 1, D, dtype=torch.float64)  # no look-up upstream
    for emb in (a, b):
        loss, _ = linear_cross_entropy(h, emb.weight, ids[1:])
        loss.backward()
    torch.testing.assert_close(a.weight.grad, b.weight.grad, rtol=1e-12, atol=1e-14)
    a.weight.grad = None
    x = embed_tokens(a, ids)  # a look-up alone: torch's dense embedding gradient
    (x * torch.arange(D, dtype=x.dtype)).sum().backward()
    expected = torch.zeros(V, D, dtype=torch.float64).index_add_(
        0, ids, torch.arange(D, dtype=torch.float64).expand(len(ids), D))
    torch.testing.assert_close(a.weight.grad, expected)


def test_tied_linear_equals_f_linear_with_and_without_bias():
    a, b = _pair()
    ids = _ids()
    bias = torch.randn(V, dtype=torch.float64, requires_grad=True)
    bias2 = bias.detach().clone().requires_grad_()
    x = torch.randn(len(ids), D, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ya = tied_linear(torch.tanh(embed_tokens(a, ids)) + x, a.weight, bias)
    yb = F.linear(torch.tanh(b(ids)) + x2, b.weight, bias2)
    torch.testing.assert_close(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    for got, want in ((a.weight.grad, b.weight.grad), (bias.grad, bias2.grad), (x.grad, x2.grad)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def _decoder_config(**overrides) -> ModelConfig:
    values = dict(arch="decoder", vocab_size=V, d_model=D, n_heads=2, n_layers=2, d_ff=16, max_seq_len=16,
                  norm_first=True, dropout=0.0, attention_dropout=0.0)
    values.update(overrides)
    return ModelConfig(**values)


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_training_gradients_equal_the_plain_lookup(tie, monkeypatch):
    import lmforge.nn.kernels.linear_ce as linear_ce

    handed = []
    real = linear_ce.hand_over
    monkeypatch.setattr(linear_ce, "hand_over", lambda lookup, grad: handed.append(lookup) or real(lookup, grad))
    torch.manual_seed(0)
    model = Decoder(_decoder_config(tie_embeddings=tie)).double()
    plain = copy.deepcopy(model)
    plain.token_embedding.register_forward_hook(lambda module, inputs, output: None)
    ids = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(3))
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    batch = dict(input_ids=ids, labels=labels, attention_mask=torch.ones_like(ids))
    for m in (model, plain):
        out = CausalLMObjective()(m, batch)
        sum(total / count for total, count in out.losses.values()).backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)
    # tied: the first model's projection handed its gradient to the look-up, the hooked one's did not
    assert [lookup is not None for lookup in handed] == ([True, False] if tie else [False, False])


def test_bert_mlm_head_gradients_equal_the_plain_lookup():
    cfg = ModelConfig(arch="encoder", vocab_size=V, d_model=D, n_heads=2, n_layers=2, d_ff=16, max_seq_len=16,
                      dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    encoder = Encoder(cfg)
    model = TaskModel(encoder, build_head({"type": "pretraining"}, cfg, encoder)).double()
    plain = copy.deepcopy(model)
    plain.backbone.embeddings.tokens.register_forward_hook(lambda module, inputs, output: None)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(5, V, (3, 12), generator=g)
    mlm = ids.masked_fill(torch.rand(3, 12, generator=g) > 0.3, -100)
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
                 mlm_labels=mlm, nsp_labels=torch.tensor([0, 1, 0]))
    for m in (model, plain):
        out = MaskedLMObjective(nsp=True)(m, batch)
        sum(total / count for total, count in out.losses.values()).backward()
    assert model.backbone.embeddings.tokens.weight.grad.abs().sum() > 0
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)
