"""Unpadding (lmforge.nn.kernels.packing, issue 22 item 1): the encoder computes the same function on the real
tokens, in eval and in training (gradients), zeros at padded positions, and packs only when it pays."""

from __future__ import annotations

import copy

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.models.encoder import Encoder
from lmforge.nn.kernels.packing import PACK_ABOVE, Packing

B, T, V = 4, 11, 50
TOL = dict(rtol=2e-5, atol=2e-5)


def encoder(**overrides) -> Encoder:
    torch.manual_seed(0)
    cfg = dict(vocab_size=V, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_seq_len=16, dropout=0.0,
               attention_dropout=0.0)
    return Encoder(ModelConfig(**{**cfg, **overrides})).eval()


def padded_batch(lengths=(11, 3, 7, 1)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    types = (torch.arange(T)[None] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids, mask, types


def test_pack_and_unpack_are_inverse_with_zeros_at_padding():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).bool()
    p = Packing.from_mask(mask)
    x = torch.arange(6.0).view(2, 3, 1)
    packed = p.pack(x)
    assert packed.flatten().tolist() == [0.0, 1.0, 3.0]
    assert p.unpack(packed).flatten().tolist() == [0.0, 1.0, 0.0, 3.0, 0.0, 0.0]


def test_decide_packs_only_padded_enough_batches():
    assert Packing.decide(None) is None
    full = torch.ones(4, 10, dtype=torch.bool)
    assert Packing.decide(full) is None
    mostly = full.clone()
    mostly[0, -1] = False  # 39 of 40 real: above PACK_ABOVE
    assert 39 / 40 > PACK_ABOVE and Packing.decide(mostly) is None
    half = full.clone()
    half[:, 5:] = False
    assert Packing.decide(half).tokens == 20
    assert Packing.decide(half, enabled=False) is None
    assert Packing.decide(torch.zeros(2, 3, dtype=torch.bool)) is None  # nothing real: the padded path


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"positional": "rotary"},
                                       {"share_layers": "all"}], ids=["bert", "pre-ln", "rotary", "albert"])
def test_unpadded_equals_padded_at_real_tokens(overrides):
    enc = encoder(**overrides)
    ids, mask, types = padded_batch()
    packed = enc(ids, mask, types, output_hidden_states=True)
    enc.unpad = False
    padded = enc(ids, mask, types, output_hidden_states=True)
    real = mask.bool()
    torch.testing.assert_close(packed.last_hidden_state[real], padded.last_hidden_state[real], **TOL)
    torch.testing.assert_close(packed.pooled_output, padded.pooled_output, **TOL)
    for a, b in zip(packed.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(a[real], b[real], **TOL)
    assert (packed.last_hidden_state[~real] == 0).all()  # padded positions: zeros, not a padded query's output


def test_gradients_match_the_padded_path():
    ids, mask, types = padded_batch()
    grads = []
    for unpad in (True, False):
        enc = encoder()
        enc.train()  # dropout 0: the same function in training
        enc.unpad = unpad
        out = enc(ids, mask, types).last_hidden_state
        (out[mask.bool()] ** 2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-5, msg=name)


def test_training_with_dropout_is_seeded_and_finite():
    enc = encoder(dropout=0.1, attention_dropout=0.1).train()
    ids, mask, types = padded_batch()
    torch.manual_seed(5)
    a = enc(ids, mask, types).last_hidden_state
    torch.manual_seed(5)
    b = copy.deepcopy(enc)(ids, mask, types).last_hidden_state
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same draws under the same seed: resumable


def test_encoder_decoder_unpads_its_source():
    from lmforge.models.seq2seq import EncoderDecoder, SourceEncoder

    torch.manual_seed(0)
    cfg = ModelConfig(arch="seq2seq", vocab_size=V, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_seq_len=16,
                      dropout=0.0, attention_dropout=0.0)
    model = EncoderDecoder(cfg).eval()
    ids, mask, _ = padded_batch()
    tgt = torch.randint(5, V, (B, 5))
    packed = model(ids, tgt, src_mask=mask).logits
    memory = model.encode(ids, mask)
    assert (memory[~mask.bool()] == 0).all()
    source = SourceEncoder.wrap(model)
    torch.testing.assert_close(source(ids, mask).last_hidden_state, memory, rtol=0, atol=0)  # the same path
    model.unpad = False
    torch.testing.assert_close(model.encode(ids, mask)[mask.bool()], memory[mask.bool()], **TOL)
    torch.testing.assert_close(model(ids, tgt, src_mask=mask).logits, packed, **TOL)  # padded memory is never read
