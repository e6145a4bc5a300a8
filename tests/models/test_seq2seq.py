"""Transformer encoder-decoder: teacher forcing == cached step-by-step decoding, source padding invariance,
causality, embeddings sharing/tying, the transformer-base parameter count, kernels, beams, bad inputs."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.models.seq2seq import EncoderDecoder, Seq2SeqCache, Seq2SeqOutput

B, S, T, V, D, H, F = 3, 7, 6, 99, 12, 3, 37


def _config(**overrides) -> ModelConfig:
    # 2 encoder and 3 decoder layers, so mixing the two stacks up cannot pass.
    values = dict(arch="seq2seq", vocab_size=V, d_model=D, n_heads=H, n_layers=2, n_decoder_layers=3, d_ff=F,
                  max_seq_len=32, positional="sinusoidal", activation="relu", layer_norm_eps=1e-6,
                  scale_embeddings=True)
    values.update(overrides)
    return ModelConfig(**values)


def _model(seed: int = 0, **overrides) -> EncoderDecoder:
    """An eval-mode float64 model with random LayerNorms too."""
    torch.manual_seed(seed)
    model = EncoderDecoder(_config(**overrides)).double().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
    return model


def _ids(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def _source() -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded row, a left-padded row and a full row; the padding ids are random (they must not matter)."""
    ids = _ids(100, B, S)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, 4:] = 0
    mask[1, :2] = 0
    return ids, mask


VARIANTS = [
    {},
    {"norm_first": True},
    {"share_embeddings": False, "tie_embeddings": False},
    {"positional": "learned"},
    {"positional": "rotary"},
]


# ---------------------------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "paper")
def test_teacher_forcing_equals_cached_step_by_step(variant):
    model = _model(**variant)
    src, src_mask = _source()
    tgt = _ids(1, B, T)
    out = model(src, tgt, src_mask=src_mask)
    assert isinstance(out, Seq2SeqOutput) and out.logits.shape == (B, T, V) and out.memory.shape == (B, S, D)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, t:t + 1], out.memory, src_mask, cache=cache).logits for t in range(T)]
    assert cache.length == T
    torch.testing.assert_close(torch.cat(steps, dim=1), out.logits, atol=1e-10, rtol=1e-10)
    cache = Seq2SeqCache()  # lazily given its layers; chunks of several tokens
    chunks = [model.decode(tgt[:, a:b], out.memory, src_mask, cache=cache).logits for a, b in ((0, 2), (2, 5), (5, 6))]
    torch.testing.assert_close(torch.cat(chunks, dim=1), out.logits, atol=1e-10, rtol=1e-10)


def test_cross_attention_cache_is_filled_once():
    model = _model()
    src, src_mask = _source()
    tgt = _ids(2, B, T)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    first = model.decode(tgt[:, :3], memory, src_mask, cache=cache).logits
    keys = [layer.cross_attn.key for layer in cache.layers]
    assert all(k is not None and k.shape == (B, H, S, D // H) for k in keys)
    # Later steps read the cached projections: a different memory tensor is not projected again.
    second = model.decode(tgt[:, 3:], torch.zeros_like(memory), src_mask, cache=cache).logits
    # the same storage and values (the cache hands out views of its buffer): nothing was projected again
    assert all(layer.cross_attn.key.data_ptr() == k.data_ptr() and torch.equal(layer.cross_attn.key, k)
               for layer, k in zip(cache.layers, keys, strict=True))
    full = model.decode(tgt, memory, src_mask).logits
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary"])
def test_source_padding_never_changes_real_outputs(positional):
    model = _model(positional=positional)
    src, src_mask = _source()
    tgt = _ids(3, B, T)
    batched = model(src, tgt, src_mask=src_mask).logits
    tol = 1e-6 if positional == "rotary" else 1e-10  # rotary: shift-invariant up to its float32 tables
    for row in range(B):
        real = src[row][src_mask[row].bool()][None]  # (1, n)
        alone = model(real, tgt[row:row + 1]).logits[0]
        torch.testing.assert_close(batched[row], alone, atol=tol, rtol=tol)


def test_target_padding_left_and_right():
    model = _model()
    src, src_mask = _source()
    tgt = _ids(4, B, T)
    tgt_mask = torch.ones(B, T, dtype=torch.long)
    tgt_mask[0, :2] = 0  # left-padded target
    tgt_mask[1, 4:] = 0  # right-padded target
    out = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask).logits
    assert not torch.isnan(out).any()
    for row in range(B):
        keep = tgt_mask[row].bool()
        alone = model(src[row:row + 1], tgt[row:row + 1, keep], src_mask=src_mask[row:row + 1]).logits[0]
        torch.testing.assert_close(out[row, keep], alone, atol=1e-10, rtol=1e-10)
    # the cached path with the same masks
    memory, cache = model.encode(src, src_mask), model.new_cache()
    steps = [model.decode(tgt[:, t:t + 1], memory, src_mask, tgt_mask[:, :t + 1], cache=cache).logits
             for t in range(T)]
    real = tgt_mask.bool()
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], out[real], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_is_causal(norm_first):
    model = _model(norm_first=norm_first)
    src, src_mask = _source()
    tgt = _ids(5, B, T)
    ref = model(src, tgt, src_mask=src_mask).logits
    for t in range(T):
        changed = tgt.clone()
        changed[:, t:] = (changed[:, t:] + 1) % V
        out = model(src, changed, src_mask=src_mask).logits
        torch.testing.assert_close(out[:, :t], ref[:, :t], atol=1e-12, rtol=0)
        assert not torch.allclose(out[:, t], ref[:, t])


def test_every_source_token_matters():
    model = _model()
    src, tgt = _ids(6, 1, S), _ids(7, 1, T)
    ref = model(src, tgt).logits
    for s in range(S):
        changed = src.clone()
        changed[0, s] = (changed[0, s] + 1) % V
        assert not torch.allclose(model(changed, tgt).logits[:, 0], ref[:, 0])


def test_math_and_sdpa_kernels_agree():
    a, b = _model(kernel="math"), _model(kernel="sdpa")
    src, src_mask = _source()
    tgt = _ids(8, B, T)
    torch.testing.assert_close(a(src, tgt, src_mask=src_mask).logits, b(src, tgt, src_mask=src_mask).logits,
                               atol=1e-10, rtol=1e-10)


def test_attention_capture():
    model = _model()
    src, src_mask = _source()
    out = model(src, _ids(9, B, T), src_mask=src_mask, output_attentions=True)
    assert len(out.self_attentions) == len(out.cross_attentions) == 3
    for self_w, cross_w in zip(out.self_attentions, out.cross_attentions, strict=True):
        assert self_w.shape == (B, H, T, T) and cross_w.shape == (B, H, T, S)
        assert torch.all(self_w.triu(diagonal=1) == 0)
        torch.testing.assert_close(cross_w.sum(-1), torch.ones(B, H, T, dtype=cross_w.dtype))
        assert torch.all(cross_w.masked_select(~src_mask.bool()[:, None, None, :]) == 0)
    plain = model(src, _ids(9, B, T), src_mask=src_mask)
    assert plain.self_attentions is None
    torch.testing.assert_close(plain.logits, out.logits, atol=1e-10, rtol=1e-10)


def test_reorder_selects_beams():
    model = _model()
    src, src_mask = _source()
    tgt = _ids(10, B, 4)
    index = torch.tensor([1, 1, 0, 2])
    memory, cache = model.encode(src, src_mask), model.new_cache()
    model.decode(tgt[:, :3], memory, src_mask, cache=cache)
    cache.reorder(index)
    assert cache.batch_size == 4 and cache.length == 3
    memory2, mask2 = memory.index_select(0, index), src_mask.index_select(0, index)
    step = model.decode(tgt.index_select(0, index)[:, 3:], memory2, mask2, cache=cache).logits
    full = model(src.index_select(0, index), tgt.index_select(0, index), src_mask=mask2).logits[:, 3:]
    torch.testing.assert_close(step, full, atol=1e-10, rtol=1e-10)


def test_train_mode_uses_dropout():
    model = _model(dropout=0.3)
    src, tgt = _ids(11, B, S), _ids(12, B, T)
    assert torch.equal(model(src, tgt).logits, model(src, tgt).logits)
    model.train()
    assert not torch.equal(model(src, tgt).logits, model(src, tgt).logits)


# ------------------------------------------------------------------------------------------ parameters and names
def test_shared_and_separate_embeddings():
    shared = EncoderDecoder(_config())
    keys = set(shared.state_dict())
    assert "embedding.weight" in keys and not any(k.startswith(("src_embedding", "tgt_embedding", "lm_head"))
                                                  for k in keys)
    assert shared.src_embed is shared.tgt_embed and shared.output_weight is shared.embedding.weight
    assert not any(k.startswith(("encoder_norm", "decoder_norm")) for k in keys)  # post-LN: no final norms
    separate = EncoderDecoder(_config(share_embeddings=False))
    sep_keys = set(separate.state_dict())
    assert sep_keys == (keys - {"embedding.weight"}) | {"src_embedding.weight", "tgt_embedding.weight"}
    assert separate.output_weight is separate.tgt_embedding.weight  # tied to the TARGET embedding
    untied = EncoderDecoder(_config(share_embeddings=False, tie_embeddings=False))
    assert set(untied.state_dict()) == sep_keys | {"lm_head.weight"}

    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    assert count(separate) == count(shared) + V * D
    assert count(untied) == count(shared) + 2 * V * D
    learned = set(EncoderDecoder(_config(positional="learned")).state_dict())
    assert learned == keys | {"src_position.weight", "tgt_position.weight"}
    pre = set(EncoderDecoder(_config(norm_first=True)).state_dict())
    assert pre == keys | {f"{s}_norm.{p}" for s in ("encoder", "decoder") for p in ("weight", "bias")}
    assert len(shared.encoder_layers) == 2 and len(shared.decoder_layers) == 3


def test_initialisation():
    torch.manual_seed(0)
    model = EncoderDecoder(_config(d_model=64, n_heads=4, d_ff=256))
    assert model.embedding.weight.std().item() == pytest.approx(64**-0.5, rel=0.05)
    fc1 = model.encoder_layers[0].ffn.fc1.weight
    assert fc1.abs().max().item() <= (6 / (64 + 256)) ** 0.5  # Xavier-uniform bound
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name


def _transformer_parameters(V: int, D: int, F: int, n_enc: int, n_dec: int) -> int:
    attention = 4 * (D * D + D)  # q, k, v, out projections with biases
    ffn = (D * F + F) + (F * D + D)
    norm = 2 * D
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return V * D + n_enc * encoder_layer + n_dec * decoder_layer  # one shared, tied embedding; post-LN


def test_transformer_base_parameter_count():
    config = model_config_from_preset("transformer-base", vocab_size=37000)
    with torch.device("meta"):  # no memory, no init cost
        model = EncoderDecoder(config)
    n = sum(p.numel() for p in model.parameters())
    assert n == _transformer_parameters(37000, 512, 2048, 6, 6) == 63_082_496  # paper (Table 3): 65M
    assert config.share_embeddings and config.tie_embeddings and not config.norm_first


# ---------------------------------------------------------------------------------------------------- bad inputs
def test_bad_token_ids():
    model = _model()
    src, tgt = _ids(13, B, S), _ids(14, B, T)
    src[2, 1] = 150
    with pytest.raises(LmforgeError, match=r"src_ids: token id 150 .*size 99"):
        model(src, tgt)
    tgt[0, 0] = -3
    with pytest.raises(LmforgeError, match=r"tgt_ids: token id -3 .*size 99"):
        model(_ids(13, B, S), tgt)
    with pytest.raises(LmforgeError, match="src_ids must be a \\(batch, length\\)"):
        model(_ids(13, S), _ids(14, B, T))


def test_lengths_beyond_max_seq_len():
    model = _model(max_seq_len=8)
    with pytest.raises(LmforgeError, match="source length 9 exceeds max_seq_len=8"):
        model.encode(_ids(15, 1, 9))
    memory = model.encode(_ids(15, 1, 5))
    cache = model.new_cache()
    model.decode(_ids(16, 1, 6), memory, cache=cache)
    with pytest.raises(LmforgeError, match=r"target length 9 \(cached 6 \+ new 3\) exceeds max_seq_len=8"):
        model.decode(_ids(16, 1, 3), memory, cache=cache)


def test_bad_memory_masks_and_cache():
    model = _model()
    src, src_mask = _source()
    memory = model.encode(src, src_mask)
    tgt = _ids(17, B, T)
    with pytest.raises(LmforgeError, match="memory must be the encoder output"):
        model.decode(tgt[:2], memory)
    with pytest.raises(LmforgeError, match="memory must be the encoder output"):
        model.decode(tgt, memory[..., :5])
    with pytest.raises(LmforgeError, match=r"src_mask must be \(batch=3, source length=7\)"):
        model.decode(tgt, memory, src_mask[:, :5])
    with pytest.raises(LmforgeError, match=r"src_mask must be \(batch=3, length=7\)"):
        model.encode(src, src_mask[:, 1:])
    cache = model.new_cache()
    model.decode(tgt[:, :2], memory, src_mask, cache=cache)
    with pytest.raises(LmforgeError, match=r"tgt_mask must be \(batch=3, length=3 \(cached 2 \+ new 1\)\)"):
        model.decode(tgt[:, 2:3], memory, src_mask, torch.ones(B, 1), cache=cache)
    with pytest.raises(LmforgeError, match="cache holds batch size 3 but tgt_ids has 2 rows"):
        model.decode(tgt[:2, 2:3], memory[:2], src_mask[:2], cache=cache)
    with pytest.raises(LmforgeError, match="arch='seq2seq'"):  # a decoder's config has no encoder-decoder options
        EncoderDecoder(ModelConfig(arch="decoder", vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=F))


def test_additive_masks_are_rejected():
    model = _model()
    additive = torch.zeros(B, S)
    additive[0, 5:] = float("-inf")
    with pytest.raises(LmforgeError, match="values other than 0 and 1"):
        model(_ids(18, B, S), _ids(19, B, T), src_mask=additive)
    with pytest.raises(LmforgeError, match="values other than 0 and 1"):
        model(_ids(18, B, S), _ids(19, B, T), tgt_mask=additive[:, :T])
