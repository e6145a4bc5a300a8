"""GPT decoder: names, initialisation, causality, KV cache == recompute, left padding, attention capture, kernels,
beam reordering, bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.models.decoder import Decoder, DecoderCache, DecoderOutput

B, T, V, D, H, F = 3, 7, 99, 12, 3, 37
POSITIONALS = ["learned", "sinusoidal", "rotary"]


def _config(**overrides) -> ModelConfig:
    values = dict(arch="decoder", vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=F, max_seq_len=32,
                  norm_first=True, layer_norm_eps=1e-5, activation="gelu_tanh")
    values.update(overrides)
    return ModelConfig(**values)


def _model(seed: int = 0, **overrides) -> Decoder:
    """An eval-mode float64 model with weights large enough that every path matters."""
    torch.manual_seed(seed)
    model = Decoder(_config(**overrides)).double().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm_weight = "norm" in name and name.endswith("weight")
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.copy_(1.0 + 0.1 * noise if is_norm_weight else 0.3 * noise)
    return model


def _ids(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def _left_padded(seed: int, lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of the given lengths, left-padded (with random ids: padding must not matter) to width."""
    ids = _ids(seed, len(lengths), width)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, width - n:] = 1
    return ids, mask


# ----------------------------------------------------------------------------------------------- structure, init
def test_state_dict_keys_tied_and_untied():
    tied = set(Decoder(_config()).state_dict())
    assert {"token_embedding.weight", "position_embedding.weight", "final_norm.weight", "final_norm.bias",
            "layers.1.self_attn.q_proj.weight", "layers.1.ffn.fc2.bias", "layers.0.ffn_norm.weight"} <= tied
    assert not any(k.startswith(("lm_head", "layers.0.cross_attn")) for k in tied)
    untied = set(Decoder(_config(tie_embeddings=False)).state_dict())
    assert untied == tied | {"lm_head.weight"}
    assert "final_norm.weight" not in Decoder(_config(norm_first=False)).state_dict()
    for positional in ("sinusoidal", "rotary"):
        assert set(Decoder(_config(positional=positional)).state_dict()) == tied - {"position_embedding.weight"}


def test_tied_head_is_the_token_embedding():
    model = _model()
    assert model.lm_head is None and model.output_weight is model.token_embedding.weight
    out = model(_ids(0, B, T))
    torch.testing.assert_close(out.logits, out.last_hidden_state @ model.token_embedding.weight.T)
    untied = Decoder(_config(tie_embeddings=False))
    assert untied.output_weight is untied.lm_head.weight
    n_tied = sum(p.numel() for p in Decoder(_config()).parameters())
    assert sum(p.numel() for p in untied.parameters()) == n_tied + V * D


def test_dropouts_follow_the_config():
    model = Decoder(_config(dropout=0.2, attention_dropout=0.05))
    assert model.dropout.p == 0.2
    for layer in model.layers:
        assert layer.dropout.p == 0.2 and layer.self_attn.dropout == 0.05


def test_gpt2_initialisation():
    torch.manual_seed(0)
    L = 8
    model = Decoder(_config(d_model=64, n_heads=4, d_ff=256, n_layers=L, init_std=0.02))

    def std(tensors: list[torch.Tensor]) -> float:
        return torch.cat([t.detach().flatten() for t in tensors]).std().item()

    assert std([model.token_embedding.weight]) == pytest.approx(0.02, rel=0.05)
    assert std([model.position_embedding.weight]) == pytest.approx(0.02, rel=0.05)
    assert std([layer.ffn.fc1.weight for layer in model.layers]) == pytest.approx(0.02, rel=0.05)
    resid = [w for layer in model.layers for w in (layer.self_attn.out_proj.weight, layer.ffn.fc2.weight)]
    assert std(resid) == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.05)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
        if "norm" in name and name.endswith("weight"):
            assert torch.all(p == 1), name


def test_gpt_presets_build():
    with torch.device("meta"):
        model = Decoder(model_config_from_preset("gpt2-small"))
    # GPT-2 small: 124,439,808 parameters (tied head), the number Hugging Face reports for "gpt2".
    assert sum(p.numel() for p in model.parameters()) == 124_439_808


# ---------------------------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("norm_first", [True, False])
def test_future_tokens_never_change_earlier_logits(positional, norm_first):
    model = _model(positional=positional, norm_first=norm_first)
    ids = _ids(1, B, T)
    ref = model(ids).logits
    for t in range(T):
        changed = ids.clone()
        changed[:, t:] = (changed[:, t:] + 1 + _ids(2 + t, B, T - t) % (V - 1)) % V  # every token at >= t differs
        out = model(changed).logits
        torch.testing.assert_close(out[:, :t], ref[:, :t], atol=1e-12, rtol=0)
        assert not torch.allclose(out[:, t], ref[:, t])


@pytest.mark.parametrize("positional", POSITIONALS)
def test_left_padded_batch_equals_each_prompt_alone(positional):
    model = _model(positional=positional)
    lengths = [7, 4, 1]
    ids, mask = _left_padded(3, lengths, T)
    out = model(ids, attention_mask=mask)
    assert not torch.isnan(out.logits).any() and not torch.isnan(out.last_hidden_state).any()
    # Rotary positions are offset by the padding (the layers take no per-row positions); the scores depend on
    # position differences only, so that is exact up to the float32 cos/sin tables.
    tol = 1e-6 if positional == "rotary" else 1e-10
    for row, n in enumerate(lengths):
        alone = model(ids[row:row + 1, T - n:]).logits[0]  # (n, V)
        torch.testing.assert_close(out.logits[row, T - n:], alone, atol=tol, rtol=tol)


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("chunks", [[1] * 10, [4, 1, 3, 2], [7, 3]])
def test_cache_equals_full_recompute_with_left_padding(positional, chunks):
    model = _model(positional=positional)
    total = sum(chunks)
    ids, mask = _left_padded(4, [10, 6, 3], total)
    mask[1, 8] = 0  # a hole in the middle must be respected too
    full = model(ids, attention_mask=mask).logits  # (B, total, V)
    cache = model.new_cache()
    start, pieces = 0, []
    for n in chunks:
        out = model(ids[:, start:start + n], attention_mask=mask[:, :start + n], cache=cache)
        assert out.cache is cache and cache.length == start + n
        pieces.append(out.logits)
        start += n
    real = mask.bool()
    torch.testing.assert_close(torch.cat(pieces, dim=1)[real], full[real], atol=1e-10, rtol=1e-10)


def test_cache_without_mask_and_lazy_cache():
    model = _model()
    ids = _ids(5, B, T)
    full = model(ids).logits
    cache = DecoderCache()  # no layers yet: the model adds them
    first = model(ids[:, :5], cache=cache).logits
    second = model(ids[:, 5:], cache=cache).logits
    assert len(cache.layers) == 2 and cache.length == T and cache.batch_size == B
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, atol=1e-10, rtol=1e-10)


def test_explicit_position_ids_equal_derived_ones():
    model = _model()
    ids, mask = _left_padded(6, [7, 5, 2], T)
    derived = model(ids, attention_mask=mask).logits
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    explicit = model(ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(explicit, derived, atol=0, rtol=0)


def test_reorder_selects_beams():
    model = _model()
    ids, mask = _left_padded(7, [6, 4, 5], 6)
    nxt = _ids(8, 4, 2)
    index = torch.tensor([2, 0, 0, 1])
    cache = model.new_cache()
    model(ids, attention_mask=mask, cache=cache)
    cache.reorder(index)
    assert cache.batch_size == 4
    mask2 = torch.cat([mask.index_select(0, index), torch.ones(4, 2, dtype=torch.long)], dim=1)
    stepped = model(nxt, attention_mask=mask2, cache=cache).logits  # (4, 2, V)
    full_ids = torch.cat([ids.index_select(0, index), nxt], dim=1)
    full = model(full_ids, attention_mask=mask2).logits[:, -2:]
    torch.testing.assert_close(stepped, full, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("positional", POSITIONALS)
def test_math_and_sdpa_kernels_agree(positional):
    math_model = _model(positional=positional, kernel="math")
    sdpa_model = _model(positional=positional, kernel="sdpa")
    ids, mask = _left_padded(9, [7, 3, 5], T)
    for kwargs in ({}, {"attention_mask": mask}):
        torch.testing.assert_close(sdpa_model(ids, **kwargs).logits, math_model(ids, **kwargs).logits,
                                   atol=1e-10, rtol=1e-10)
    caches = sdpa_model.new_cache(), math_model.new_cache()
    for start, stop in ((0, 4), (4, 5), (5, 7)):
        a = sdpa_model(ids[:, start:stop], attention_mask=mask[:, :stop], cache=caches[0]).logits
        b = math_model(ids[:, start:stop], attention_mask=mask[:, :stop], cache=caches[1]).logits
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def _reference_weights(model: Decoder, layer_input: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) under causal + padding masks, written out from the layer's own projections."""
    layer = model.layers[0]
    h = layer.self_attn_norm(layer_input)  # pre-LN
    Bn, Tn, _ = h.shape
    q = layer.self_attn.q_proj(h).view(Bn, Tn, H, D // H).transpose(1, 2)
    k = layer.self_attn.k_proj(h).view(Bn, Tn, H, D // H).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)  # (B, H, T, T)
    allowed = torch.ones(Tn, Tn, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return weights.nan_to_num(0.0)  # fully masked rows (leading padding) -> 0


def test_captured_attention_weights():
    model = _model()
    ids, mask = _left_padded(10, [7, 4, 2], T)
    out = model(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and all(w.shape == (B, H, T, T) for w in out.attentions)
    real_query = mask.bool()[:, None, :, None].expand(B, H, T, 1).squeeze(-1)
    for w in out.attentions:
        sums = w.sum(-1)  # (B, H, T)
        torch.testing.assert_close(sums[real_query], torch.ones_like(sums[real_query]))
        assert torch.all(sums[~real_query] == 0)  # left-padding queries see nothing
        assert torch.all(w.masked_select(~mask.bool()[:, None, None, :]) == 0)  # padding keys get nothing
        assert torch.all(w.triu(diagonal=1) == 0)  # causal
    expected = _reference_weights(model, out.hidden_states[0], mask)
    torch.testing.assert_close(out.attentions[0], expected, atol=1e-12, rtol=1e-10)
    # Capturing runs the math path; it must not change the outputs.
    torch.testing.assert_close(out.logits, model(ids, attention_mask=mask).logits, atol=1e-10, rtol=1e-10)


def test_capture_selected_layers_and_hidden_states():
    model = _model()
    ids = _ids(11, B, T)
    out = model(ids, output_attentions=[-1], output_hidden_states=True)
    assert out.attentions[0] is None and out.attentions[1].shape == (B, H, T, T)
    assert len(out.hidden_states) == 3
    assert out.hidden_states[-1] is out.last_hidden_state
    emb = model.token_embedding(ids) + model.position_embedding.weight[:T]
    torch.testing.assert_close(out.hidden_states[0], emb)
    plain = model(ids)
    assert plain.hidden_states is None and plain.attentions is None and plain.cache is None
    assert isinstance(plain, DecoderOutput)


def test_return_logits_false_and_lm_logits():
    model = _model()
    ids = _ids(12, B, T)
    out = model(ids, return_logits=False)
    assert out.logits is None
    torch.testing.assert_close(model.lm_logits(out.last_hidden_state[:, -1]), model(ids).logits[:, -1])


def test_train_mode_uses_dropout_and_eval_is_deterministic():
    model = _model(dropout=0.3, attention_dropout=0.3)
    ids = _ids(13, B, T)
    assert torch.equal(model(ids).logits, model(ids).logits)
    model.train()
    assert not torch.equal(model(ids).logits, model(ids).logits)


def test_gradients_reach_every_parameter():
    model = _model(tie_embeddings=False)
    model(_ids(14, B, T)).logits.sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# ---------------------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("bad_id", [V, 1000, -1])
def test_token_id_outside_vocabulary(bad_id):
    model = _model()
    ids = _ids(15, B, T)
    ids[1, 3] = bad_id
    with pytest.raises(LmforgeError, match=rf"token id {bad_id} .*size {V}"):
        model(ids)


def test_total_length_beyond_max_seq_len():
    model = _model(max_seq_len=10)
    with pytest.raises(LmforgeError, match=r"total length 11 .*max_seq_len=10"):
        model(_ids(16, 1, 11))
    cache = model.new_cache()
    model(_ids(16, 1, 8), cache=cache)
    with pytest.raises(LmforgeError, match=r"total length 12 \(cached 8 \+ new 4\) exceeds max_seq_len=10"):
        model(_ids(17, 1, 4), cache=cache)
    rotary = _model(max_seq_len=10, positional="rotary")
    with pytest.raises(LmforgeError, match="max_seq_len=10"):
        rotary(_ids(16, 1, 11))


@pytest.mark.parametrize("shape", [(T,), (B, T, 2), (B, 0)])
def test_wrong_rank_or_empty_input_ids(shape):
    with pytest.raises(LmforgeError, match="input_ids"):
        _model()(torch.zeros(shape, dtype=torch.long))


def test_float_input_ids():
    with pytest.raises(LmforgeError, match="integer token ids"):
        _model()(torch.zeros(B, T))


def test_bad_attention_mask_and_cache_batch():
    model = _model()
    ids = _ids(18, B, T)
    with pytest.raises(LmforgeError, match=r"attention_mask must be \(batch=3, cached \+ new = 0 \+ 7 = 7\)"):
        model(ids, attention_mask=torch.ones(B, T - 1))
    with pytest.raises(LmforgeError, match="attention_mask"):
        model(ids, attention_mask=torch.ones(B * T))
    cache = model.new_cache()
    model(ids, cache=cache)
    with pytest.raises(LmforgeError, match=r"cached \+ new = 7 \+ 1 = 8"):
        model(ids[:, :1], attention_mask=torch.ones(B, 1), cache=cache)
    with pytest.raises(LmforgeError, match="cache holds batch size 3 but input_ids has 2 rows"):
        model(ids[:2, :1], cache=cache)
    with pytest.raises(LmforgeError, match="DecoderCache"):
        model(ids, cache=[])


def test_bad_options():
    with pytest.raises(LmforgeError, match="arch='decoder'"):
        Decoder(_config(arch="seq2seq"))
    with pytest.raises(LmforgeError, match="layer index 5 does not exist"):
        _model()(_ids(19, B, T), output_attentions=[5])
    with pytest.raises(LmforgeError, match="position_ids cannot be given with positional='rotary'"):
        _model(positional="rotary")(_ids(19, B, T), position_ids=torch.arange(T))
    with pytest.raises(LmforgeError, match="position ids span"):
        _model()(_ids(19, B, T), position_ids=torch.arange(T) + 30)


def test_additive_mask_is_rejected():
    additive = torch.zeros(B, T)
    additive[0, :2] = -10000.0  # the Hugging Face-internal polarity, passed by mistake
    with pytest.raises(LmforgeError, match="values other than 0 and 1"):
        _model()(_ids(20, B, T), attention_mask=additive)


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("norm_first", [True, False])
def test_last_only_equals_the_full_pass_at_the_last_position(positional, norm_first):
    torch.manual_seed(0)
    model = Decoder(_config(positional=positional, norm_first=norm_first)).eval()
    ids = torch.randint(0, V, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    mask[2, :T - 1] = 0  # one real token
    full = model(ids, attention_mask=mask)
    last = model(ids, attention_mask=mask, last_only=True)
    assert last.last_hidden_state.shape == (B, 1, D) and last.logits.shape == (B, 1, V)
    torch.testing.assert_close(last.last_hidden_state, full.last_hidden_state[:, -1:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(last.logits, full.logits[:, -1:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last.pooled_output, full.last_hidden_state[:, -1], rtol=1e-5, atol=1e-6)
    # with hidden states the pass is the full one, sliced at the end; the states keep every position
    both = model(ids, attention_mask=mask, last_only=True, output_hidden_states=True)
    assert both.hidden_states[-1].shape == (B, T, D)
    torch.testing.assert_close(both.last_hidden_state, full.last_hidden_state[:, -1:], rtol=1e-5, atol=1e-6)


def test_last_only_computes_the_last_layer_at_one_position():
    torch.manual_seed(0)
    model = Decoder(_config()).eval()
    seen = []
    model.layers[-1].ffn.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape))
    model.layers[0].ffn.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape))
    model(torch.randint(0, V, (B, T)), last_only=True)
    assert seen == [(B, T, D), (B, 1, D)]
    with pytest.raises(LmforgeError, match="last_only"):
        model.layers[-1](torch.randn(B, T, D), causal=False, last_only=True)


def test_generation_without_cache_reads_the_last_layer_at_one_position():
    from lmforge.generation import generate

    torch.manual_seed(0)
    model = Decoder(_config()).eval()
    rows = []
    model.layers[-1].ffn.register_forward_hook(lambda module, inputs, output: rows.append(inputs[0].shape[1]))
    ids = torch.randint(0, V, (2, 5))
    a = generate(model, ids, torch.ones_like(ids), max_new_tokens=4, use_cache=False)
    assert set(rows) == {1}
    b = generate(model, ids, torch.ones_like(ids), max_new_tokens=4, use_cache=True)
    assert a.sequences == b.sequences
