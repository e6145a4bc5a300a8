"""``Encoder(pooled_only=True)``: a sequence-classification step computes the last layer at [CLS] alone, with the
same pooled output, logits and gradients as the full pass."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.heads import TaskModel, build_head
from lmforge.models.encoder import Encoder


def _config(**overrides) -> ModelConfig:
    values = dict(vocab_size=97, d_model=32, n_heads=4, n_layers=3, d_ff=64, max_seq_len=16, dropout=0.0,
                  attention_dropout=0.0, init_std=0.1)
    return ModelConfig(**{**values, **overrides})


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 97, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 3:] = 0  # a heavily padded row: the batch is unpadded (packing) before the last layer
    return ids, mask, torch.tensor([0, 1, 2, 1])


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"share_layers": "all"}, {"pooler": False}])
def test_the_pooled_output_logits_and_gradients_equal_the_full_pass(overrides):
    torch.manual_seed(0)
    config = _config(**overrides)
    encoder = Encoder(config)
    model = TaskModel(encoder, build_head({"type": "sequence_classification", "labels": ["a", "b", "c"]}, config,
                                          encoder)).train()
    assert model._pooled_only
    ids, mask, labels = _batch()
    full = encoder(ids, mask)
    short = encoder(ids, mask, pooled_only=True)
    assert short.last_hidden_state.shape == (4, 1, config.d_model)
    torch.testing.assert_close(short.pooled_output, full.pooled_output, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(short.last_hidden_state[:, 0], full.last_hidden_state[:, 0], rtol=1e-5, atol=1e-6)
    grads = []
    for pooled_only in (True, False):
        model._pooled_only = pooled_only
        model.zero_grad()
        out = model(ids, mask, labels=labels)
        (out.loss_sum / out.loss_count).backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_hidden_states_attentions_and_rotary_keep_the_full_pass():
    torch.manual_seed(0)
    ids, mask, _ = _batch()
    encoder = Encoder(_config())
    assert encoder(ids, mask, pooled_only=True, output_hidden_states=True).last_hidden_state.shape == (4, 12, 32)
    assert encoder(ids, mask, pooled_only=True, output_attentions=True).last_hidden_state.shape == (4, 12, 32)
    rotary = Encoder(_config(positional="rotary"))
    assert rotary(ids, mask, pooled_only=True).last_hidden_state.shape == (4, 12, 32)
