"""Hugging Face XLNet interop: random-weight parity (both streams, permutation masks, padding, segments, memory
over two segments) through load_pretrained and both directions of lmforge convert; parameter counts; errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lmforge.config import model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.interop import hf_xlnet
from lmforge.models.xlnet import XLNet
from lmforge.persistence import load_pretrained
from tests.interop.parity import close, export_cli, hf_config_of, hf_model, import_cli, parameter_counts, transformers

B, T, V, N = 3, 6, 53, 2  # XLNet's batches are its own (permutation masks, targets): see segment


def hf_tiny_config(**overrides) -> transformers.XLNetConfig:
    values = dict(vocab_size=V, d_model=16, n_layer=2, n_head=2, d_inner=24, ff_activation="gelu", mem_len=4,
                  attn_type="bi", clamp_len=-1, dropout=0.1, pad_token_id=0)
    return transformers.XLNetConfig(**{**values, **overrides})


def saved_hf_model(tmp_path: Path, cls: str = "XLNetLMHeadModel", **overrides) -> torch.nn.Module:
    """A perturbed Hugging Face ``cls``, saved in ``tmp_path / "hf"``."""
    model = hf_model(cls, hf_tiny_config(**overrides), seed=0)
    model.save_pretrained(tmp_path / "hf")
    return model


def segment(seed: int) -> dict[str, torch.Tensor]:
    """One segment in lmforge's conventions: padding, segments, a factorisation order's query perm_mask, targets."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    # order[b, i]: when position i comes in the factorisation order; position 0 (never padding) comes first, as
    # XLNet's context does, so that every predicted position sees at least one real token (a query row that sees
    # nothing gets zero attention here, HF's -1e30 fill gives it a uniform average of every key instead)
    order = torch.stack([torch.cat((torch.zeros(1, dtype=torch.long), torch.randperm(T - 1, generator=g) + 1))
                         for _ in range(B)])
    perm = order[:, None, :] >= order[:, :, None]  # (B, T, T) True = i may NOT see j (itself included)
    targets = torch.stack([torch.randperm(T - 1, generator=g)[:N] + 1 for _ in range(B)])  # (B, N), never 0
    mapping = torch.nn.functional.one_hot(targets, T).float()  # (B, N, T)
    return dict(input_ids=torch.randint(0, V, (B, T), generator=g), attention_mask=mask,
                token_type_ids=torch.randint(0, 2, (B, T), generator=g), perm_mask=perm, target_mapping=mapping)


def to_hf(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF's XLNet takes perm_mask as float, 1 = may not see (the query stream's, as ours), in the same layout."""
    return {k: v.float() if k in ("perm_mask", "attention_mask") else v for k, v in inputs.items()}


def run_hf(hf: torch.nn.Module, inputs: dict[str, torch.Tensor], mems, **kwargs):
    """HF's forward; with attn_type "uni" one row at a time: its causal mask is (T, K, 1, 1) and it adds the
    (T, K, B, 1) data mask to it in place, which only broadcasts for B = 1 (a transformers bug, left alone)."""
    if hf.config.attn_type != "uni":
        return hf(**to_hf(inputs), mems=mems, **kwargs)
    rows = [hf(**to_hf({k: v[b:b + 1] for k, v in inputs.items()}),
               mems=None if mems is None else [m[:, b:b + 1] for m in mems], **kwargs) for b in range(B)]
    hidden = rows[0].hidden_states
    return SimpleNamespace(
        logits=torch.cat([r.logits for r in rows]),
        mems=None if rows[0].mems is None else tuple(torch.cat(ms, 1) for ms in zip(*(r.mems for r in rows),
                                                                                    strict=True)),
        hidden_states=None if hidden is None else tuple(torch.cat(hs) for hs in zip(*(r.hidden_states for r in rows),
                                                                                   strict=True)))


def check_parity(ours: XLNet, hf: torch.nn.Module, seeds: tuple[int, ...] = (1, 2), query_from: int = 0) -> None:
    """Two segments, the second with the first's memory: query-stream logits, content-stream states and logits, and
    the new memory equal transformers'. The query stream is compared from segment ``query_from`` on (before that
    some of its rows may see no key at all, where the two libraries differ on purpose)."""
    mems_ours = mems_hf = None
    for n, seed in enumerate(seeds):
        inputs = segment(seed)
        with torch.no_grad():
            out = ours(**inputs, mems=mems_ours, use_mems=True, output_hidden_states=True)
            ref = run_hf(hf, inputs, mems_hf, use_mems=True, output_hidden_states=True)
            content = {k: v for k, v in inputs.items() if k not in ("perm_mask", "target_mapping")}
            out_h = ours(**content, mems=mems_ours)  # the content stream alone: HF then returns it
            ref_h = run_hf(hf, content, mems_hf, use_mems=False)
        if n >= query_from:
            close(ours.lm_logits(out.query_state), ref.logits)  # query stream, (B, N, V)
        close(out.last_hidden_state, ref.hidden_states[-2])  # (h_L, g_L) pairs: h_L is the one before last
        for a, b in zip(out.hidden_states, ref.hidden_states[0::2], strict=True):
            close(a, b)
        close(ours.lm_logits(out_h.last_hidden_state), ref_h.logits)  # content stream without perm / targets
        assert len(out.mems) == len(ref.mems) == 2
        for a, b in zip(out.mems, ref.mems, strict=True):
            close(a, b.transpose(0, 1))  # HF: (M, B, D)
        mems_ours, mems_hf = out.mems, ref.mems


@pytest.mark.parametrize("overrides", [dict(), dict(attn_type="uni", clamp_len=3), dict(attn_type="uni",
                                                                                       same_length=True, mem_len=0)],
                         ids=["bi", "uni-clamp", "uni-same-length-all-mems"])
def test_lm_head_model_loads_with_the_same_outputs(tmp_path: Path, overrides: dict) -> None:
    hf = saved_hf_model(tmp_path, **overrides)
    loaded = load_pretrained(tmp_path / "hf")
    assert isinstance(loaded.model, XLNet) and loaded.head is None
    c = loaded.config
    assert (c.arch, c.n_layers, c.d_model, c.n_heads, c.d_ff, c.attn_type) == \
        ("xlnet", 2, 16, 2, 24, overrides.get("attn_type", "bi"))
    assert c.mem_len == (overrides.get("mem_len", 4) or None)
    # same_length without memory: a query sees only its own position, which the query stream may not see
    check_parity(loaded.model, hf, query_from=1 if c.same_length else 0)


def test_xlnet_model_layout_loads_with_a_zero_lm_bias(tmp_path: Path) -> None:
    hf = saved_hf_model(tmp_path, "XLNetModel")
    ours = load_pretrained(tmp_path / "hf").model
    assert not bool(ours.lm_head.bias.any())
    inputs = segment(3)
    with torch.no_grad():
        out = ours(**inputs)
        ref = hf(**to_hf(inputs))
    close(out.query_state, ref.last_hidden_state)  # XLNetModel returns the query stream when it runs


def test_convert_both_ways_keeps_the_outputs(tmp_path: Path) -> None:
    hf = saved_hf_model(tmp_path, attn_type="uni", clamp_len=5)
    import_cli(tmp_path / "hf", tmp_path / "ours")
    converted = load_pretrained(tmp_path / "ours")
    assert converted.config.arch == "xlnet" and converted.config.clamp_len == 5
    check_parity(converted.model, hf)
    raw = export_cli(tmp_path / "ours", tmp_path / "back")
    assert raw["model_type"] == "xlnet" and raw["architectures"] == ["XLNetLMHeadModel"]
    back = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "back").eval()
    for name, p in hf.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], p, rtol=0, atol=0)
    check_parity(converted.model, back)


def test_preset_parameter_counts_equal_transformers() -> None:
    for name in ("xlnet-tiny", "xlnet-base"):
        config = model_config_from_preset(name)
        hf_config = hf_config_of("XLNetConfig", hf_xlnet.config_to_hf(config))
        ours, theirs = parameter_counts(lambda config=config: XLNet(config),
                                        lambda hf_config=hf_config: transformers.XLNetLMHeadModel(hf_config))
        assert ours == theirs, name


def test_unsupported_configs_and_untied_heads_are_named() -> None:
    base = hf_tiny_config().to_dict()
    for key, value, words in (("bi_data", True, "bi_data=true"), ("reuse_len", 3, "reuse_len"),
                              ("attn_type", "both", "attn_type='both'"), ("ff_activation", "swish", "ff_activation"),
                              ("d_head", 5, "d_head=5")):
        with pytest.raises(LmforgeError, match=words):
            hf_xlnet.config_from_hf({**base, key: value})
    with pytest.raises(LmforgeError, match="not an XLNet checkpoint"):
        hf_xlnet.config_from_hf({**base, "model_type": "bert"})
    torch.manual_seed(0)
    state = dict(transformers.XLNetLMHeadModel(hf_tiny_config()).state_dict())
    state["lm_loss.weight"] = state["lm_loss.weight"].clone() + 1
    with pytest.raises(LmforgeError, match="untied LM head"):
        hf_xlnet.state_dict_from_hf(state)
    with pytest.raises(LmforgeError, match="unexpected key.*'transformer.extra'"):
        hf_xlnet.state_dict_from_hf({**state, "transformer.extra": torch.zeros(1)})
    config = model_config_from_preset("xlnet-tiny", dropout=0.1, attention_dropout=0.0)
    with pytest.raises(LmforgeError, match="one rate for both"):
        hf_xlnet.config_to_hf(config)
