"""GPT-2 interop: random-weight parity with transformers.GPT2LMHeadModel in both directions, config mapping, keys."""

from __future__ import annotations

import warnings

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop.hf_gpt2 import config_from_hf, config_to_hf, state_dict_from_hf, state_dict_to_hf
from lmforge.models.decoder import Decoder
from tests.interop.parity import B, T, close, hf_model, perturb, transformers

GPT2Config, GPT2LMHeadModel = transformers.GPT2Config, transformers.GPT2LMHeadModel

V, D, H, F, L, NPOS = 99, 12, 3, 37, 2, 16
RTOL = 1e-5  # logits of two layers: tighter than the encoders' (whose outputs go through more layers)


def _hf_config(**overrides) -> GPT2Config:
    values = dict(vocab_size=V, n_embd=D, n_head=H, n_layer=L, n_positions=NPOS, n_inner=F, bos_token_id=None,
                  eos_token_id=None)
    values.update(overrides)
    return GPT2Config(**values)


def _hf_model(seed: int = 0, **overrides) -> GPT2LMHeadModel:
    return hf_model("GPT2LMHeadModel", _hf_config(**overrides), seed)


def _ours_from_hf(hf: GPT2LMHeadModel) -> Decoder:
    config = config_from_hf(hf.config.to_dict())
    model = Decoder(config).eval()
    model.load_state_dict(state_dict_from_hf(hf.state_dict(), config))  # strict
    return model


def _ids(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def _left_padding_mask() -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :6] = 0
    return mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


# -------------------------------------------------------------------------------------------------------- HF -> ours
@pytest.mark.parametrize("tied", [True, False])
def test_hf_to_ours_logits(tied):
    hf = _hf_model(tie_word_embeddings=tied)
    ours = _ours_from_hf(hf)
    assert (ours.lm_head is None) == tied
    ids = _ids(1, B, T)
    with torch.no_grad():
        expected = hf(ids, output_hidden_states=True)
        got = ours(ids, output_hidden_states=True)
    assert expected.logits.abs().max() > 1.0  # the comparison is not between near-zero numbers
    close(got.logits, expected.logits, rtol=RTOL)
    assert len(got.hidden_states) == len(expected.hidden_states) == L + 1
    for ours_h, hf_h in zip(got.hidden_states, expected.hidden_states, strict=True):
        close(ours_h, hf_h, rtol=RTOL)


def _left_padded_reference(seed: int) -> tuple[Decoder, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ours converted from a random GPT-2 (``seed``), left-padded ids and their mask, and GPT-2's logits on them."""
    hf = _hf_model(seed=seed)
    ids, mask = _ids(seed + 1, B, T), _left_padding_mask()
    with torch.no_grad():
        # Hugging Face does not derive positions from the mask: pass them, computed the same way.
        expected = hf(ids, attention_mask=mask, position_ids=_positions(mask)).logits
    return _ours_from_hf(hf), ids, mask, expected


def test_hf_to_ours_left_padding():
    ours, ids, mask, expected = _left_padded_reference(seed=2)
    with torch.no_grad():
        got = ours(ids, attention_mask=mask).logits
    real = mask.bool()
    close(got[real], expected[real], rtol=RTOL)
    # and each padded prompt equals itself unpadded
    with torch.no_grad():
        alone = ours(ids[2:, 6:]).logits[0]
    close(got[2, 6:], alone, rtol=RTOL)


def test_hf_to_ours_cached_decoding_matches_hf():
    ours, ids, mask, expected = _left_padded_reference(seed=4)
    with torch.no_grad():
        cache = ours.new_cache()
        steps = [ours(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], cache=cache).logits for t in range(T)]
    real = mask.bool()
    close(torch.cat(steps, dim=1)[real], expected[real], rtol=RTOL)


def test_gpt2model_keys_and_old_buffers():
    hf = _hf_model(seed=6)
    config = config_from_hf(hf.config.to_dict())
    base_sd = dict(hf.transformer.state_dict())  # GPT2Model keys: no "transformer." prefix, no lm_head
    assert "wte.weight" in base_sd and "h.0.attn.c_attn.weight" in base_sd
    base_sd["h.0.attn.bias"] = torch.ones(1, 1, NPOS, NPOS, dtype=torch.bool).tril()  # older checkpoints
    base_sd["h.1.attn.masked_bias"] = torch.tensor(-1e4)
    ours = Decoder(config).eval()
    ours.load_state_dict(state_dict_from_hf(base_sd, config))
    ids = _ids(7, B, T)
    with torch.no_grad():
        close(ours(ids).logits, hf(ids).logits, rtol=RTOL)


def test_c_attn_is_split_into_q_k_v():
    hf = _hf_model(seed=8)
    sd = state_dict_from_hf(hf.state_dict())
    c_attn = hf.transformer.h[1].attn.c_attn
    x = torch.randn(5, D)
    fused = c_attn(x)  # (5, 3D): x @ W + b
    for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        ours = torch.nn.functional.linear(x, sd[f"layers.1.self_attn.{proj}.weight"],
                                          sd[f"layers.1.self_attn.{proj}.bias"])
        torch.testing.assert_close(ours, fused[:, i * D:(i + 1) * D])
    assert "lm_head.weight" not in sd  # tied: the head is the token embedding


def test_unexpected_keys_are_named():
    sd = dict(_hf_model().state_dict())
    sd["transformer.h.0.crossattention.c_attn.weight"] = torch.zeros(D, 3 * D)
    sd["transformer.score.weight"] = torch.zeros(2, D)
    with pytest.raises(LmforgeError, match=r"transformer\.h\.0\.crossattention\.c_attn\.weight.*score\.weight"):
        state_dict_from_hf(sd)


def test_untied_head_contradicting_a_tied_config():
    hf = _hf_model(tie_word_embeddings=False)
    tied_config = config_from_hf({**hf.config.to_dict(), "tie_word_embeddings": True})
    with pytest.raises(LmforgeError, match="lm_head.weight differs from wte.weight"):
        state_dict_from_hf(hf.state_dict(), tied_config)
    untied = state_dict_from_hf(hf.state_dict())  # no config: kept because it differs
    assert torch.equal(untied["lm_head.weight"], hf.lm_head.weight)


# -------------------------------------------------------------------------------------------------------- ours -> HF
@pytest.mark.parametrize("tied", [True, False])
def test_ours_to_hf_logits(tied):
    config = ModelConfig(arch="decoder", vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=F, max_seq_len=NPOS,
                         norm_first=True, layer_norm_eps=1e-5, activation="gelu_tanh",
                         tie_embeddings=tied)
    torch.manual_seed(9)
    ours = perturb(Decoder(config), 9)
    hf_dict = config_to_hf(config)
    assert hf_dict["model_type"] == "gpt2" and hf_dict["architectures"] == ["GPT2LMHeadModel"]
    hf = GPT2LMHeadModel(GPT2Config.from_dict(hf_dict)).eval()
    hf.load_state_dict(state_dict_to_hf(ours.state_dict(), config), strict=True)
    assert (hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()) == tied
    ids, mask = _ids(10, B, T), _left_padding_mask()
    with torch.no_grad():
        close(hf(ids).logits, ours(ids).logits, rtol=RTOL)
        expected = hf(ids, attention_mask=mask, position_ids=_positions(mask)).logits
        got = ours(ids, attention_mask=mask).logits
    close(got[mask.bool()], expected[mask.bool()], rtol=RTOL)


def test_state_dict_round_trip_is_exact():
    hf = _hf_model(seed=11)
    config = config_from_hf(hf.config.to_dict())
    back = state_dict_to_hf(state_dict_from_hf(hf.state_dict(), config), config)
    original = hf.state_dict()
    assert set(back) == set(original)
    for key, value in original.items():
        assert torch.equal(back[key], value), key


# ------------------------------------------------------------------------------------------------------------ config
def test_config_mapping():
    config = config_from_hf({"model_type": "gpt2", "n_embd": 12, "n_head": 3, "n_layer": 2, "n_positions": 16,
                             "vocab_size": 99, "n_inner": None, "activation_function": "gelu_new",
                             "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.2, "layer_norm_epsilon": 1e-5,
                             "tie_word_embeddings": True})
    assert (config.arch, config.d_model, config.n_heads, config.n_layers, config.max_seq_len) == ("decoder", 12, 3, 2,
                                                                                                   16)
    assert config.d_ff == 48 and config.activation == "gelu_tanh" and config.norm_first
    assert config.dropout == 0.1 and config.attention_dropout == 0.2 and config.layer_norm_eps == 1e-5
    assert config.positional == "learned" and config.tie_embeddings and not config.scale_embeddings
    # the GPT-2 small defaults, from an empty dict
    default = config_from_hf({})
    assert (default.vocab_size, default.d_model, default.n_layers, default.d_ff) == (50257, 768, 12, 3072)
    assert config_from_hf(config_to_hf(config)) == config
    assert config_from_hf({"n_ctx": 64, "n_embd": 12, "n_head": 3}).max_seq_len == 64  # very old configs


def test_config_to_hf_builds_the_same_shapes():
    config = config_from_hf(_hf_config(n_inner=None, activation_function="relu").to_dict())
    hf_dict = config_to_hf(config, bos_token_id=5, eos_token_id=5)
    assert hf_dict["activation_function"] == "relu" and hf_dict["n_inner"] == 4 * D and hf_dict["bos_token_id"] == 5
    hf_shapes = {k: tuple(v.shape) for k, v in GPT2LMHeadModel(GPT2Config(**hf_dict)).state_dict().items()}
    ours_shapes = {k: tuple(v.shape) for k, v in state_dict_to_hf(Decoder(config).state_dict(), config).items()}
    assert ours_shapes == hf_shapes


def test_unsupported_configs():
    with pytest.raises(LmforgeError, match="model_type 'gpt2'.*'bert'"):
        config_from_hf({"model_type": "bert"})
    with pytest.raises(LmforgeError, match="add_cross_attention=True.*scale_attn_by_inverse_layer_idx=True"):
        config_from_hf({"add_cross_attention": True, "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(LmforgeError, match="activation_function='swish'"):
        config_from_hf({"activation_function": "swish"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config_from_hf({"embd_pdrop": 0.0, "resid_pdrop": 0.1})
    assert any("embd_pdrop" in str(w.message) for w in caught)
    rotary = ModelConfig(arch="decoder", vocab_size=V, d_model=D, n_heads=H, n_layers=L, positional="rotary",
                         norm_first=False)
    with pytest.raises(LmforgeError, match="norm_first=False.*positional='rotary'"):
        config_to_hf(rotary)
    with pytest.raises(LmforgeError, match="positional='rotary'"):
        state_dict_to_hf(Decoder(rotary).state_dict(), rotary)


def test_state_dict_to_hf_names_foreign_keys():
    config = config_from_hf(_hf_config().to_dict())
    sd = dict(Decoder(config).state_dict())
    sd["layers.0.cross_attn.q_proj.weight"] = torch.zeros(D, D)
    with pytest.raises(LmforgeError, match=r"layers\.0\.cross_attn\.q_proj\.weight"):
        state_dict_to_hf(sd, config)


def test_an_untied_folder_keeps_its_head_even_when_it_equals_the_embedding(tmp_path):
    # the loader passes the folder's config to the converter (issue 38): tie_word_embeddings=false keeps lm_head,
    # even a head that happens to equal wte, instead of dropping it and starting a random one
    from lmforge.persistence import load_pretrained

    hf = _hf_model(tie_word_embeddings=False)
    with torch.no_grad():
        hf.lm_head.weight.copy_(hf.transformer.wte.weight)
    hf.save_pretrained(tmp_path / "hf")
    loaded = load_pretrained(tmp_path / "hf")
    assert loaded.model.lm_head is not None
    assert torch.equal(loaded.model.lm_head.weight, hf.lm_head.weight)
    ids = _ids(3, B, T)
    with torch.no_grad():
        close(loaded.model(ids).logits, hf(ids).logits, rtol=RTOL)
