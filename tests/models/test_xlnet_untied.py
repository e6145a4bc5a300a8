"""XLNet / Transformer-XL with an LM head of its own (``tie_embeddings=False``) and without feed-forward biases
(``bias=False``): the parameters each adds or removes, the logits and the feed-forward by formula, where the gradient
goes (an absent token's embedding row gets none untied), a saved folder, training through the PLM and txl
objectives, and the Hugging Face export's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmforge.config import DataConfig, ModelConfig
from lmforge.data.permutation import plm_example
from lmforge.data.pretraining import collate_plm
from lmforge.errors import LmforgeError
from lmforge.models.xlnet import XLNet
from lmforge.objectives.registry import get_objective
from lmforge.persistence import load_pretrained, save_pretrained
from tests.models.test_xlnet_pre_ln import train_objective

B, T, V, D, H = 2, 5, 41, 12, 3


def tiny(**overrides) -> XLNet:
    torch.manual_seed(0)
    values = dict(arch="xlnet", vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=20, dropout=0.0,
                  attention_dropout=0.0)
    return XLNet(ModelConfig(**{**values, **overrides})).eval()


def ids(length: int = T, seed: int = 1, high: int = V) -> torch.Tensor:
    return torch.randint(1, high, (B, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------ parameters
def test_untied_adds_exactly_lm_head_weight_and_tied_names_are_unchanged():
    tied, untied = tiny(), tiny(tie_embeddings=False)
    assert tied.lm_head.weight is None and "lm_head.weight" not in tied.state_dict()
    names_tied = [n for n, _ in tied.named_parameters()]
    names_untied = [n for n, _ in untied.named_parameters()]
    assert set(names_untied) - set(names_tied) == {"lm_head.weight"} and set(names_tied) <= set(names_untied)
    assert len(names_untied) == len(names_tied) + 1
    assert set(untied.state_dict()) - set(tied.state_dict()) == {"lm_head.weight"}
    weight = untied.lm_head.weight
    assert weight.shape == (V, D) and weight.data_ptr() != untied.word_embedding.weight.data_ptr()
    # drawn last: every other weight is what the tied model draws from the same seed
    a, b = tied.state_dict(), untied.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(weight, untied.word_embedding.weight)


def test_the_untied_head_is_drawn_from_n_0_init_std():
    torch.manual_seed(0)
    model = XLNet(ModelConfig(arch="xlnet", vocab_size=2000, d_model=64, n_heads=4, n_layers=1, d_ff=32,
                              init_std=0.3, tie_embeddings=False))
    w = model.lm_head.weight.detach()
    assert abs(float(w.mean())) < 0.01 and abs(float(w.std()) - 0.3) < 0.01
    assert not model.lm_head.bias.detach().any()  # the LM bias still starts at 0


# ------------------------------------------------------------------------------------------------ by formula
def test_logits_by_formula_both_streams():
    model = tiny(tie_embeddings=False)
    with torch.no_grad():
        model.lm_head.bias.normal_()
    x = ids()
    mapping = torch.eye(T)[None, 1:].expand(B, -1, -1)  # queries at positions 1..T-1
    perm = torch.ones(T, T, dtype=torch.bool).triu()[None].expand(B, -1, -1)
    rows = torch.tensor([[True, False, True, True], [False, True, True, False]])
    with torch.no_grad():
        content = model(x, return_logits="content")
        query = model(x, perm_mask=perm, target_mapping=mapping, return_logits="query", logits_rows=rows)
    W, b = model.lm_head.weight, model.lm_head.bias
    torch.testing.assert_close(content.logits, content.last_hidden_state @ W.T + b)
    torch.testing.assert_close(query.logits, query.query_state[rows] @ W.T + b)
    torch.testing.assert_close(model.lm_logits(content.last_hidden_state), content.logits)
    tied_scores = content.last_hidden_state @ model.word_embedding.weight.T + b
    assert not torch.allclose(content.logits, tied_scores)  # the word embedding is not the un-embedding


# ------------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("tie", [False, True])
def test_an_absent_tokens_embedding_row_gets_a_gradient_only_when_tied(tie):
    model = tiny(tie_embeddings=tie).train()
    absent = V - 1
    x, labels = ids(high=20), ids(seed=2, high=20)  # neither the input nor the labels hold the absent token
    logits = model(x, return_logits="content").logits
    F.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
    embedding_row = model.word_embedding.weight.grad[absent]
    if tie:
        assert model.lm_head.weight is None and embedding_row.abs().sum() > 0  # the softmax pushes it away
    else:
        assert torch.equal(embedding_row, torch.zeros(D))  # only the contexts a token appears in move its embedding
        assert model.lm_head.weight.grad[absent].abs().sum() > 0  # the softmax pushes its un-embedding instead
        present = int(x[0, 0])
        assert model.word_embedding.weight.grad[present].abs().sum() > 0


# ------------------------------------------------------------------------------------------------ folders
@pytest.mark.parametrize("options", [dict(tie_embeddings=False), dict(tie_embeddings=False, bias=False),
                                     dict(bias=False, attn_type="uni", mem_len=4)])
def test_a_saved_folder_round_trips(options, tmp_path):
    model = tiny(**options)
    with torch.no_grad():
        model.lm_head.bias.normal_()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    for key, value in options.items():
        assert getattr(loaded.config, key) == value
    a_sd, b_sd = model.state_dict(), loaded.model.state_dict()
    assert list(a_sd) == list(b_sd) and all(torch.equal(a_sd[k], b_sd[k]) for k in a_sd)
    mapping = torch.eye(T)[None].expand(B, -1, -1)
    with torch.no_grad():
        a = model(ids(), target_mapping=mapping, use_mems=True, return_logits="query")
        b = loaded.model.eval()(ids(), target_mapping=mapping, use_mems=True, return_logits="query")
    torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=0)
    torch.testing.assert_close(b.last_hidden_state, a.last_hidden_state, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ bias=False
def test_bias_false_removes_exactly_the_feed_forward_biases():
    with_bias = [n for n, _ in tiny().named_parameters()]
    without = [n for n, _ in tiny(bias=False).named_parameters()]
    assert set(with_bias) - set(without) == {f"layers.{i}.ff.layer_{j}.bias" for i in range(2) for j in (1, 2)}
    assert set(without) <= set(with_bias)
    attn = {n for n in with_bias if ".rel_attn." in n}
    assert attn <= set(without)  # the relative attention has no projection bias to remove (r_*_bias are u, v, s)
    assert not [n for n in attn if n.split(".")[-1] == "bias" and "layer_norm" not in n]


def test_the_bias_free_feed_forward_by_formula():
    model = tiny(bias=False)
    ff = model.layers[0].ff
    with torch.no_grad():
        ff.layer_norm.weight.normal_()
        ff.layer_norm.bias.normal_()
        x = torch.randn(B, T, D)
        y = ff(x)
    assert ff.layer_1.bias is None and ff.layer_2.bias is None
    expected = F.layer_norm(x + F.gelu(x @ ff.layer_1.weight.T) @ ff.layer_2.weight.T, (D,), ff.layer_norm.weight,
                            ff.layer_norm.bias, eps=model.config.layer_norm_eps)
    torch.testing.assert_close(y, expected)


# ------------------------------------------------------------------------------------------------ training
def _train(model: XLNet, objective, batches: list[dict], key: str, steps: int) -> list[float]:
    before = model.lm_head.weight.detach().clone()
    losses = train_objective(model, objective, batches, key, steps, model.lm_head.weight)
    assert not torch.equal(model.lm_head.weight, before)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    return losses


@pytest.mark.parametrize("bias", [True, False])
def test_plm_trains_untied(bias):
    model = tiny(tie_embeddings=False, bias=bias, dropout=0.1, attention_dropout=0.1)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, V, size=10).astype(np.int64) for _ in range(2)]
    exs = [plm_example(s, rng=np.random.default_rng([0, i]), special_mask=np.zeros(len(s), dtype=bool), partial_k=2)
           for i, s in enumerate(seqs)]
    losses = _train(model, get_objective("plm").loss(None), [collate_plm(exs, 0)], "plm", steps=25)
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("bias", [True, False])
def test_txl_trains_untied(bias):
    model = tiny(tie_embeddings=False, bias=bias, attn_type="uni", mem_len=T, activation="relu", lm_stream="content",
                 dropout=0.1, attention_dropout=0.1)
    x = torch.randint(1, V, (B, 2 * T + 1), generator=torch.Generator().manual_seed(0))
    windows = [{"input_ids": x[:, k * T:(k + 1) * T], "labels": x[:, k * T + 1:(k + 1) * T + 1],
                "attention_mask": torch.ones(B, T, dtype=torch.long), "reset": torch.full((B,), int(k == 0))}
               for k in range(2)]
    objective = get_objective("txl").build_loss(DataConfig(objective="txl", seq_len=8), {})
    losses = _train(model, objective, windows, "lm", steps=25)
    assert losses[-1] < losses[0], losses


def test_generation_reads_the_untied_head():
    model = tiny(tie_embeddings=False)
    with torch.no_grad():
        out = model.forward_lm(ids())
        logits = model.lm_logits(out.last_hidden_state[:, -1])
    torch.testing.assert_close(logits, out.last_hidden_state[:, -1] @ model.lm_head.weight.T + model.lm_head.bias)


# ------------------------------------------------------------------------------------------------ export
@pytest.mark.parametrize("option, words, folder_words", [
    ("tie_embeddings", r"Hugging Face XLNet: tie_embeddings=False \(HF XLNet ties its lm_loss to the word embedding\)",
     r"tie_embeddings=False \(HF XLNet ties its lm_loss to the word embedding\)"),
    # a folder's export refuses Cramming's options for every family first (lmforge.commands.models.export_to_hf)
    ("bias", r"Hugging Face XLNet: bias=False \(HF XLNet's feed-forward has biases\)", r"bias=False.*has no Hugging"),
])
def test_the_hugging_face_export_refuses_untied_and_bias_free_in_one_line(option, words, folder_words, tmp_path):
    from lmforge.interop import hf_xlnet
    from lmforge.persistence.hf_export import export_to_hf

    with pytest.raises(LmforgeError, match=words) as err:
        hf_xlnet.config_to_hf(ModelConfig(arch="xlnet", **{option: False}))
    assert "\n" not in str(err.value)
    save_pretrained(tiny(**{option: False}), tmp_path / "m")
    with pytest.raises(LmforgeError, match=folder_words) as err:
        export_to_hf(load_pretrained(tmp_path / "m"))
    assert "\n" not in str(err.value)
    assert hf_xlnet.config_to_hf(ModelConfig(arch="xlnet"))["tie_word_embeddings"] is True  # the default exports


def test_the_export_names_both_refusals_in_one_line():
    from lmforge.interop import hf_xlnet

    with pytest.raises(LmforgeError, match=r"tie_embeddings=False .*; bias=False ") as err:
        hf_xlnet.config_to_hf(ModelConfig(arch="xlnet", tie_embeddings=False, bias=False))
    assert "\n" not in str(err.value)
