"""XLNet / Transformer-XL with pre-LN layers (``norm_first=True``, issue 36, item 5): the layer by formula against
the module's own sublayers (both streams), the parameters it adds, the memory (each layer's raw input, never the
final norm's output), training through the PLM and txl objectives, a saved folder, and the Hugging Face export's
refusal."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmforge.config import DataConfig, ModelConfig
from lmforge.data.permutation import plm_example
from lmforge.data.pretraining import collate_plm
from lmforge.errors import LmforgeError
from lmforge.models.xlnet import XLNet
from lmforge.nn.relative import relative_positions_encoding
from lmforge.objectives.registry import get_objective
from lmforge.persistence import load_pretrained, save_pretrained

B, T, V, D, H = 2, 5, 41, 12, 3


def tiny(**overrides) -> XLNet:
    torch.manual_seed(0)
    values = dict(arch="xlnet", vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=20, dropout=0.0,
                  attention_dropout=0.0, norm_first=True)
    return XLNet(ModelConfig(**{**values, **overrides})).eval()


def ids(length: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, length), generator=torch.Generator().manual_seed(seed))


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ by formula
def sinusoids(distance: torch.Tensor, d: int) -> torch.Tensor:
    """(..., D) encodings of relative distances: all sines, then all cosines, as Transformer-XL."""
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = distance.to(torch.float64)[..., None] * inv_freq
    return torch.cat((torch.sin(angle), torch.cos(angle)), dim=-1)


def attention(attn, queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The relative attention's output projection, before dropout and residual, by hand (no memory, no segments):
    score(i, j) = [(q_i + u) . k_j + (q_i + v) . W_r R_{i-j}] / sqrt(Dh), masked softmax (a row that sees nothing
    gets zero weights), weighted values, W_o."""
    q = torch.einsum("bid,dhe->bhie", queries, attn.q)
    k = torch.einsum("bjd,dhe->bhje", keys, attn.k)
    v = torch.einsum("bjd,dhe->bhje", keys, attn.v)
    n = keys.shape[1]
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # (T, T) i - j
    k_r = torch.einsum("ijd,dhe->hije", sinusoids(distance, keys.shape[-1]), attn.r)  # (H, T, T, Dh)
    content = torch.einsum("bhie,bhje->bhij", q + attn.r_w_bias[None, :, None], k)
    position = torch.einsum("bhie,hije->bhij", q + attn.r_r_bias[None, :, None], k_r)
    scores = ((content + position) / math.sqrt(attn.d_head)).masked_fill(~allowed[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhie,dhe->bid", weights @ v, attn.o)


def feed_forward(ff, x: torch.Tensor) -> torch.Tensor:
    return ff.layer_2(ff.activation(ff.layer_1(x)))


@pytest.mark.parametrize("norm_first", [False, True])
def test_one_layer_by_formula_on_both_streams(norm_first):
    model = tiny(n_layers=1, norm_first=norm_first).double()
    with torch.no_grad():  # LayerNorms away from (1, 0), so that mixing them up shows
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_(0.0, 0.3)
    assert (model.final_norm is not None) == norm_first  # the final norm exists with pre-LN only
    x = ids()
    perm = torch.ones(T, T, dtype=torch.bool).triu()[None].expand(B, -1, -1)  # i may not see j >= i
    mapping = torch.eye(T, dtype=torch.float64)[None].expand(B, -1, -1)  # a query at every position
    with torch.no_grad():
        out = model(x, perm_mask=perm, target_mapping=mapping)
        layer = model.layers[0]
        attn, ff = layer.rel_attn, layer.ff
        ln_a, ln_f = attn.layer_norm, ff.layer_norm
        h = model.word_embedding(x)  # (B, T, D)
        g = model.mask_emb.expand(B, T, -1)  # (B, T, D)
        see_h, see_g = ~perm | torch.eye(T, dtype=torch.bool), ~perm  # the content stream sees itself
        if norm_first:  # x + sublayer(LN(x)); keys and values LN(h) for both streams; then the final norm
            h1 = h + attention(attn, ln_a(h), ln_a(h), see_h)
            g1 = g + attention(attn, ln_a(g), ln_a(h), see_g)
            h2, g2 = h1 + feed_forward(ff, ln_f(h1)), g1 + feed_forward(ff, ln_f(g1))
            h2, g2 = model.final_norm(h2), model.final_norm(g2)
        else:  # LN(x + sublayer(x)), XLNet's
            h1 = ln_a(h + attention(attn, h, h, see_h))
            g1 = ln_a(g + attention(attn, g, h, see_g))
            h2, g2 = ln_f(h1 + feed_forward(ff, h1)), ln_f(g1 + feed_forward(ff, g1))
    torch.testing.assert_close(out.last_hidden_state, h2)
    torch.testing.assert_close(out.query_state, g2)


def test_pre_ln_adds_exactly_the_final_norm_and_post_ln_names_are_unchanged():
    post = [name for name, _ in tiny(n_layers=1, norm_first=False).named_parameters()]
    pre = [name for name, _ in tiny(n_layers=1).named_parameters()]
    attn = [f"layers.0.rel_attn.{p}" for p in ("q", "k", "v", "o", "r", "r_w_bias", "r_r_bias", "r_s_bias",
                                                "seg_embed", "layer_norm.weight", "layer_norm.bias")]
    ff = [f"layers.0.ff.{m}.{p}" for m in ("layer_norm", "layer_1", "layer_2") for p in ("weight", "bias")]
    assert sorted(post) == sorted(["word_embedding.weight", "mask_emb", *attn, *ff, "lm_head.bias"])  # as before
    assert set(pre) - set(post) == {"final_norm.weight", "final_norm.bias"} and set(post) <= set(pre)
    assert len(pre) == len(post) + 2
    # post-LN builds the same weights from the same seed as before the option existed (no extra module, no draw)
    a, b = tiny(norm_first=False).state_dict(), tiny().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------ memory
def test_uni_memory_carries_across_segments():
    model = tiny(attn_type="uni")
    full = ids(2 * T)
    with torch.no_grad():
        whole = model(full).last_hidden_state
        first = model(full[:, :T], use_mems=True)
        second = model(full[:, T:], mems=first.mems)
    close(first.last_hidden_state, whole[:, :T])
    close(second.last_hidden_state, whole[:, T:])  # with the memory: as if read in one piece


def test_bi_memory_equals_the_concatenation_when_the_first_segment_cannot_see_the_second():
    model = tiny()
    full = ids(2 * T)
    perm = torch.zeros(B, 2 * T, 2 * T, dtype=torch.bool)
    perm[:, :T, T:] = True  # the first segment may not see the second (as a memory never does)
    mapping = torch.eye(2 * T)[None, T:].expand(B, -1, -1)  # queries at the second segment's positions
    query_perm = perm | torch.eye(2 * T, dtype=torch.bool)  # a query never sees its own token
    with torch.no_grad():
        whole = model(full, perm_mask=query_perm, target_mapping=mapping)
        first = model(full[:, :T], use_mems=True)
        second = model(full[:, T:], mems=first.mems, perm_mask=query_perm[:, T:, T:],
                       target_mapping=mapping[:, :, T:])
    close(second.last_hidden_state, whole.last_hidden_state[:, T:])
    close(second.query_state, whole.query_state)  # the query stream too, through the final norm


def test_the_memory_is_each_layers_raw_input_never_the_final_norm():
    model = tiny(n_layers=3)
    with torch.no_grad():
        out = model(ids(), use_mems=True, output_hidden_states=True)
        embedded = model.word_embedding(ids())
    assert len(out.mems) == 3 and len(out.hidden_states) == 4
    for mem, state in zip(out.mems, out.hidden_states[:-1], strict=True):
        close(mem, state)  # layer l's memory is its input
    close(out.mems[0], embedded)  # not normalised
    close(out.hidden_states[-1], out.last_hidden_state)  # the last entry is the output, after the final norm
    assert model.final_norm is not None
    with torch.no_grad():
        r = relative_positions_encoding(T, T, D, bidirectional=True)
        unnormed = model.layers[2](out.mems[2], None, r, mems=None, allowed_h=None, allowed_g=None, seg_mat=None,
                                   target_mapping=None, need_weights=False)[0]  # the last layer on its input
    close(model.final_norm(unnormed), out.last_hidden_state)
    assert not torch.allclose(unnormed, out.last_hidden_state)


@pytest.mark.parametrize("attn_type, stream", [("bi", "query"), ("uni", "query"), ("uni", "content")])
def test_forward_lm_in_segments_equals_one_pass(attn_type, stream):
    model = tiny(attn_type=attn_type)
    a = ids(7)
    with torch.no_grad():
        whole = model.forward_lm(a, stream=stream)
        first = model.forward_lm(a[:, :3], stream=stream)
        second = model.forward_lm(a[:, 3:], mems=first.mems, stream=stream)
    close(torch.cat((first.last_hidden_state, second.last_hidden_state), dim=1), whole.last_hidden_state)
    for m, w in zip(second.mems, whole.mems, strict=True):
        close(m, w)


# ------------------------------------------------------------------------------------------------ training
def train_objective(model: XLNet, objective, batches: list[dict], key: str, steps: int,
                    watched: torch.nn.Parameter) -> list[float]:
    """Adam steps of ``objective`` over ``batches``; the mean loss of each pass. ``watched`` must get a gradient in the
    first pass, and every loss must stay finite."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        total = 0.0
        for batch in batches:
            loss, n = objective(model, batch).losses[key]
            optimizer.zero_grad()
            (loss / n).backward()
            if step == 0:
                assert watched.grad is not None and watched.grad.abs().sum() > 0
            optimizer.step()
            total += float(loss.detach()) / n
        assert math.isfinite(total)
        losses.append(total / len(batches))
    return losses


def _train(model: XLNet, objective, batches: list[dict], key: str, steps: int) -> list[float]:
    return train_objective(model, objective, batches, key, steps, model.final_norm.weight)


def test_plm_trains_with_pre_ln():
    model = tiny(dropout=0.1, attention_dropout=0.1)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, V, size=10).astype(np.int64) for _ in range(2)]
    exs = [plm_example(s, rng=np.random.default_rng([0, i]), special_mask=np.zeros(len(s), dtype=bool), partial_k=2)
           for i, s in enumerate(seqs)]
    losses = _train(model, get_objective("plm").loss(None), [collate_plm(exs, 0)], "plm", steps=40)
    assert losses[-1] < 0.5 * losses[0], losses


def test_txl_trains_with_pre_ln():
    model = tiny(attn_type="uni", mem_len=T, activation="relu", lm_stream="content", dropout=0.1,
                 attention_dropout=0.1)
    x = torch.randint(1, V, (B, 2 * T + 1), generator=torch.Generator().manual_seed(0))
    windows = [{"input_ids": x[:, k * T:(k + 1) * T], "labels": x[:, k * T + 1:(k + 1) * T + 1],
                "attention_mask": torch.ones(B, T, dtype=torch.long), "reset": torch.full((B,), int(k == 0))}
               for k in range(2)]  # segment 0 resets the memory, segment 1 reads it
    objective = get_objective("txl").build_loss(DataConfig(objective="txl", seq_len=8), {})
    losses = _train(model, objective, windows, "lm", steps=40)
    assert losses[-1] < 0.5 * losses[0], losses


# ------------------------------------------------------------------------------------------------ folders, export
def test_config_accepts_norm_first_and_bias_false_and_still_refuses_gated():
    assert ModelConfig(arch="xlnet", norm_first=True).norm_first
    assert not ModelConfig(arch="xlnet", norm_first=True, bias=False).bias  # tests/models/test_xlnet_untied.py
    with pytest.raises(LmforgeError, match="ffn='gated': XLNet's layers have no gated variant yet; keep ffn='mlp'"):
        ModelConfig(arch="xlnet", norm_first=True, ffn="gated")


def test_a_saved_pre_ln_folder_round_trips(tmp_path):
    model = tiny(attn_type="uni", mem_len=4)
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    assert loaded.config.norm_first and loaded.model.final_norm is not None
    mapping = torch.eye(T)[None].expand(B, -1, -1)
    with torch.no_grad():
        a = model(ids(), target_mapping=mapping, use_mems=True)
        b = loaded.model.eval()(ids(), target_mapping=mapping, use_mems=True)
    torch.testing.assert_close(b.last_hidden_state, a.last_hidden_state, rtol=0, atol=0)
    torch.testing.assert_close(b.query_state, a.query_state, rtol=0, atol=0)
    for m, n in zip(a.mems, b.mems, strict=True):
        torch.testing.assert_close(n, m, rtol=0, atol=0)


def test_the_hugging_face_export_refuses_pre_ln_in_one_line(tmp_path):
    from lmforge.interop import hf_xlnet
    from lmforge.persistence.hf_export import export_to_hf

    with pytest.raises(LmforgeError, match=r"Hugging Face XLNet: norm_first=True \(HF XLNet is post-LN\)") as err:
        hf_xlnet.config_to_hf(ModelConfig(arch="xlnet", norm_first=True))
    assert "\n" not in str(err.value)
    save_pretrained(tiny(), tmp_path / "m")
    with pytest.raises(LmforgeError, match=r"norm_first=True \(HF XLNet is post-LN\)"):
        export_to_hf(load_pretrained(tmp_path / "m"))
    assert hf_xlnet.config_to_hf(ModelConfig(arch="xlnet"))["model_type"] == "xlnet"  # post-LN still exports
