"""Encoder (BERT) properties: shapes, padding invariance, weight capture, math == sdpa, input errors."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models.encoder import Encoder, EncoderOutput
from lmforge.nn.attention import attention_weights

B, T, V, D, H, F, L = 3, 7, 99, 12, 3, 37, 3

# Two kernels (math vs SDPA, mask given vs derived) compute the same float32 function in different orders
# (blocking, vectorised reductions, fused softmax), which depend on the CPU's instruction set (ATEN_CPU_CAPABILITY,
# x86-64 or ARM). Each of the L layers adds a few float32 roundings relative to values of order 1 (LayerNorm):
# allow about 100 ulps of float32 per layer, relative and absolute (2.5e-5 at L=3, 20x the largest difference seen
# on any CPU so far, 1.3e-6 with AVX-512), still far below the effect of any real bug (a wrong mask or scale
# changes outputs by 1e-2 or more).
_EPS32 = torch.finfo(torch.float32).eps
KERNEL_TOL = dict(rtol=100 * _EPS32 * L, atol=100 * _EPS32 * L)
ONE_LAYER_TOL = dict(rtol=100 * _EPS32, atol=100 * _EPS32)  # one attention softmax, no residual stack


def tiny_config(**overrides) -> ModelConfig:
    values = dict(vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=F, max_seq_len=16, type_vocab_size=3)
    return ModelConfig(**{**values, **overrides})


def build(seed: int = 0, **overrides) -> Encoder:
    torch.manual_seed(seed)
    enc = Encoder(tiny_config(**overrides))
    with torch.no_grad():  # BERT's init leaves LayerNorms at 1/0 and biases at 0: make every parameter matter
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return enc.eval()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    types = torch.randint(0, 3, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    return ids, types, mask


def with_kernel(enc: Encoder, kernel: str) -> Encoder:
    other = Encoder(tiny_config(**{**vars(enc.config), "kernel": kernel}))
    other.load_state_dict(enc.state_dict())
    return other.eval()


VARIANTS = [
    dict(),
    dict(norm_first=True),
    dict(positional="sinusoidal"),
    dict(positional="rotary", d_model=24, n_heads=3),
    dict(activation="relu", norm_first=True, positional="rotary", d_model=24, n_heads=3),
]


def test_output_shapes_and_optional_fields() -> None:
    enc = build()
    ids, types, mask = batch()
    out = enc(ids, mask, types)
    assert isinstance(out, EncoderOutput)
    assert out.last_hidden_state.shape == (B, T, D)
    assert out.pooled_output.shape == (B, D)
    assert out.hidden_states is None and out.attentions is None
    full = enc(ids, mask, types, output_hidden_states=True, output_attentions=True)
    assert len(full.hidden_states) == L + 1 and len(full.attentions) == L
    assert all(h.shape == (B, T, D) for h in full.hidden_states)
    assert all(a.shape == (B, H, T, T) for a in full.attentions)
    torch.testing.assert_close(full.hidden_states[-1], full.last_hidden_state, rtol=0, atol=0)
    # the attention-returning path takes the math kernel on every position, the other SDPA on the real tokens only
    # (unpadding): equal up to float32 rounding where the tokens are real
    real = mask.bool()
    torch.testing.assert_close(full.last_hidden_state[real], out.last_hidden_state[real], **KERNEL_TOL)
    torch.testing.assert_close(out.pooled_output, torch.tanh(enc.pooler.dense(out.last_hidden_state[:, 0])))


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "bert")
@pytest.mark.parametrize("kernel", ["math", "sdpa"])
def test_padding_invariance(overrides: dict, kernel: str) -> None:
    enc = build(kernel=kernel, **overrides)
    ids, types, mask = batch()
    out = enc(ids, mask, types).last_hidden_state
    junk = ids.masked_fill(mask == 0, 5)  # different ids at padded positions
    out_junk = enc(junk, mask, types).last_hidden_state
    for b in range(B):
        n = int(mask[b].sum())
        alone = enc(ids[b:b + 1, :n], None, types[b:b + 1, :n])
        # other shapes: other blocking in the same kernel, hence rounding differences
        torch.testing.assert_close(out[b, :n], alone.last_hidden_state[0], **KERNEL_TOL)
        # same shapes, same kernel, masked keys weigh exactly 0: identical on any CPU up to a last-bit difference
        torch.testing.assert_close(out_junk[b, :n], out[b, :n], rtol=0, atol=1e-6)


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "bert")
def test_math_equals_sdpa(overrides: dict) -> None:
    enc = build(kernel="sdpa", **overrides)
    ref = with_kernel(enc, "math")
    ids, types, mask = batch()
    mask[0] = 0  # a fully padded row stays finite on both kernels
    a, b = enc(ids, mask, types), ref(ids, mask, types)
    assert torch.isfinite(a.last_hidden_state).all() and torch.isfinite(b.last_hidden_state).all()
    torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, **KERNEL_TOL)
    torch.testing.assert_close(a.pooled_output, b.pooled_output, **KERNEL_TOL)


def test_output_attentions_for_requested_layers_only() -> None:
    enc = build()
    ids, types, mask = batch()
    calls: list[bool] = []
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda mod, args, kwargs: calls.append(kwargs["need_weights"]), with_kwargs=True) for layer in enc.layers]
    out = enc(ids, mask, types, output_hidden_states=True, output_attentions=[0, -1])
    for h in hooks:
        h.remove()
    assert calls == [True, False, True]
    assert out.attentions[1] is None
    plain = enc(ids, mask, types).last_hidden_state  # unpadded: padded positions are zeros there
    real = mask.bool()
    torch.testing.assert_close(out.last_hidden_state[real], plain[real], **KERNEL_TOL)
    for i in (0, L - 1):
        w = out.attentions[i]  # (B, H, T, T)
        torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
        assert (w.masked_select((mask == 0)[:, None, None, :].expand_as(w)) == 0).all()  # padded keys get 0
        # The math reference on the layer's input (post-LN: the layer input itself is attended).
        attn = enc.layers[i].self_attn
        x = out.hidden_states[i]
        q = attn.q_proj(x).view(B, T, H, D // H).transpose(1, 2)
        k = attn.k_proj(x).view(B, T, H, D // H).transpose(1, 2)
        ref = attention_weights(q, k, (mask != 0)[:, None, None, :])
        torch.testing.assert_close(w, ref, **ONE_LAYER_TOL)


def test_bad_output_attentions_index() -> None:
    enc = build()
    ids, _, _ = batch()
    with pytest.raises(LmforgeError, match=r"layer index 5 .*3-layer"):
        enc(ids, output_attentions=[5])


def test_defaults_equal_explicit_inputs() -> None:
    enc = build()
    ids, _, _ = batch()
    out = enc(ids).last_hidden_state
    explicit = enc(ids, torch.ones(B, T), torch.zeros(B, T, dtype=torch.long), torch.arange(T)).last_hidden_state
    torch.testing.assert_close(out, explicit, **KERNEL_TOL)  # no mask vs an all-ones mask: other kernel paths
    bool_mask = enc(ids, torch.ones(B, T, dtype=torch.bool)).last_hidden_state
    torch.testing.assert_close(out, bool_mask, **KERNEL_TOL)


def test_state_dict_keys_do_not_depend_on_kernel_or_flags() -> None:
    keys = list(Encoder(tiny_config()).state_dict())
    assert keys == list(Encoder(tiny_config(kernel="math")).state_dict())
    assert keys[:5] == ["embeddings.tokens.weight", "embeddings.positions.weight", "embeddings.segments.weight",
                        "embeddings.norm.weight", "embeddings.norm.bias"]
    assert keys[-2:] == ["pooler.dense.weight", "pooler.dense.bias"]
    assert "layers.2.self_attn.q_proj.weight" in keys and "layers.0.ffn_norm.bias" in keys
    assert not any(k.startswith("final_norm") for k in keys)
    pre = list(Encoder(tiny_config(norm_first=True)).state_dict())
    assert set(pre) - set(keys) == {"final_norm.weight", "final_norm.bias"}
    rotary = list(Encoder(tiny_config(positional="rotary", d_model=24)).state_dict())
    assert "embeddings.positions.weight" not in rotary  # no table: rotation happens inside attention


def test_initialisation_and_dropout_rates() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=500, d_model=64, n_heads=4, n_layers=2, init_std=0.05, dropout=0.2,
                      attention_dropout=0.3)
    enc = Encoder(cfg)
    assert abs(enc.embeddings.tokens.weight.std().item() - 0.05) < 0.005
    assert abs(enc.embeddings.positions.weight.std().item() - 0.05) < 0.005
    assert abs(enc.layers[0].ffn.fc1.weight.std().item() - 0.05) < 0.005
    assert (enc.layers[1].self_attn.q_proj.bias == 0).all() and (enc.pooler.dense.bias == 0).all()
    assert (enc.layers[0].self_attn_norm.weight == 1).all() and (enc.embeddings.norm.bias == 0).all()
    assert enc.layers[0].self_attn.dropout == 0.3 and enc.layers[0].dropout.p == 0.2
    assert enc.embeddings.dropout.p == 0.2
    assert enc.get_input_embeddings() is enc.embeddings.tokens


def test_training_mode_applies_dropout_and_backpropagates() -> None:
    enc = build()
    ids, types, mask = batch()
    enc.train()
    torch.manual_seed(3)
    a = enc(ids, mask, types).last_hidden_state
    torch.manual_seed(4)
    b = enc(ids, mask, types).last_hidden_state
    assert not torch.allclose(a, b)
    a.sum().backward()
    assert enc.embeddings.tokens.weight.grad is not None and enc.layers[0].self_attn.q_proj.weight.grad is not None


def test_bf16_autocast_runs() -> None:
    enc = build()
    ids, types, mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = enc(ids, mask, types)
    assert torch.isfinite(out.last_hidden_state.float()).all()


# ---------------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("make, pattern", [
    (lambda ids: ids.clone().index_put_((torch.tensor(1), torch.tensor(3)), torch.tensor(150)),
     r"token id 150 at \(batch 1, position 3\) is outside the vocabulary of size 99"),
    (lambda ids: ids.clone().index_put_((torch.tensor(0), torch.tensor(0)), torch.tensor(-4)),
     r"token id -4 at \(batch 0, position 0\).*size 99"),
    (lambda ids: ids.clone().index_put_((torch.tensor(2), torch.tensor(6)), torch.tensor(99)),
     r"token id 99 .*size 99 \(valid ids are 0 \.\. 98\)"),
    (lambda ids: torch.randint(0, V, (B, 17)), r"sequence length 17 exceeds max_seq_len=16"),
    (lambda ids: ids[0], r"\(batch, length\) tensor of token ids; got shape \(7,\).*unsqueeze"),
    (lambda ids: ids[None], r"\(batch, length\) tensor of token ids; got shape \(1, 3, 7\)"),
    (lambda ids: ids.float(), r"integers .*torch.float32"),
    (lambda ids: ids.bool(), r"integers .*torch.bool"),
    (lambda ids: ids.tolist(), r"torch tensor .*list"),
    (lambda ids: ids[:, :0], r"length 0"),
])
def test_bad_input_ids(make, pattern: str) -> None:
    enc = build()
    ids, _, _ = batch()
    with pytest.raises(LmforgeError, match=pattern):
        enc(make(ids))


def test_bad_side_inputs() -> None:
    enc = build()
    ids, types, mask = batch()
    bad_types = types.clone()
    bad_types[2, 1] = 3
    with pytest.raises(LmforgeError, match=r"token type id 3 at \(batch 2, position 1\) is outside "
                                           r"type_vocab_size=3 \(valid ids are 0 \.\. 2\)"):
        enc(ids, mask, bad_types)
    with pytest.raises(LmforgeError, match=r"token_type_ids must have the shape of input_ids \(3, 7\); got \(3, 6\)"):
        enc(ids, mask, types[:, :6])
    with pytest.raises(LmforgeError, match=r"attention_mask must be \(batch=3, length=7\).*got shape \(3, 6\)"):
        enc(ids, mask[:, :6])
    with pytest.raises(LmforgeError, match=r"attention_mask must be \(batch=3, length=7\).*got shape \(7,\)"):
        enc(ids, mask[0])
    with pytest.raises(LmforgeError, match="values other than 0 and 1"):
        enc(ids, (1.0 - mask.float()) * -10000.0)
    with pytest.raises(LmforgeError, match=r"position id 16 at position 6 is outside max_seq_len=16"):
        enc(ids, position_ids=torch.arange(10, 17))
    with pytest.raises(LmforgeError, match=r"position_ids must be .*got \(6,\)"):
        enc(ids, position_ids=torch.arange(6))
    rotary = build(positional="rotary", d_model=24)
    with pytest.raises(LmforgeError, match="position_ids cannot be given with rotary"):
        rotary(ids, position_ids=torch.arange(T))
