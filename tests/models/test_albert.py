"""ALBERT's and DistilBERT's options of the encoder: factorised embeddings, cross-layer sharing, no pooler, no
segment embedding."""

import copy

import pytest
import torch

from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.models.encoder import Encoder

V, D, E, L, FF = 50, 32, 8, 3, 64


def config(**overrides) -> ModelConfig:
    values = dict(arch="encoder", vocab_size=V, d_model=D, n_heads=4, n_layers=L, d_ff=FF, max_seq_len=16,
                  dropout=0.0, attention_dropout=0.0)
    return ModelConfig(**{**values, **overrides})


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # a shared parameter counts once


def layer_params() -> int:
    attn = 4 * (D * D + D)
    ffn = D * FF + FF + FF * D + D
    return attn + ffn + 2 * 2 * D  # + two LayerNorms


def test_factorised_embedding_counts_and_shapes():
    bert, albert = Encoder(config()), Encoder(config(embedding_size=E))
    # V x D becomes V x E + E x D (+ the projection's bias); positions, segments and the norm shrink to E too
    assert n_params(bert) - n_params(albert) == (V + 16 + 2 + 2) * (D - E) - (E * D + D)
    assert albert.get_input_embeddings().weight.shape == (V, E)
    out = albert(torch.randint(0, V, (2, 5)))
    assert out.last_hidden_state.shape == (2, 5, D)


@pytest.mark.parametrize(("share", "saved"), [("none", 0), ("all", (L - 1) * layer_params()),
                                              ("attention", (L - 1) * 4 * (D * D + D)),
                                              ("ffn", (L - 1) * (2 * D * FF + FF + D))])
def test_sharing_modes_count_each_shared_tensor_once(share, saved):
    assert n_params(Encoder(config())) - n_params(Encoder(config(share_layers=share))) == saved


def test_shared_layers_are_one_module_and_sum_their_gradients():
    torch.manual_seed(0)
    shared = Encoder(config(share_layers="all", embedding_size=E))
    assert all(layer is shared.layers[0] for layer in shared.layers)
    # the same network unrolled: L independent copies of the one layer
    unrolled = Encoder(config(share_layers="none", embedding_size=E))
    unrolled.embeddings.load_state_dict(shared.embeddings.state_dict())
    unrolled.pooler.load_state_dict(shared.pooler.state_dict())
    for i in range(L):
        unrolled.layers[i] = copy.deepcopy(shared.layers[0])
    ids, mask = torch.randint(0, V, (3, 7)), torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    a, b = shared(ids, attention_mask=mask), unrolled(ids, attention_mask=mask)
    torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, rtol=0, atol=1e-6)
    (a.last_hidden_state.square().mean() + a.pooled_output.sum()).backward()
    (b.last_hidden_state.square().mean() + b.pooled_output.sum()).backward()
    for name, param in shared.layers[0].named_parameters():
        summed = sum(dict(unrolled.layers[i].named_parameters())[name].grad for i in range(L))
        torch.testing.assert_close(param.grad, summed, rtol=1e-5, atol=1e-7)
        if name != "self_attn.k_proj.bias":  # softmax ignores a key bias: its gradient is zero up to rounding
            one_use = dict(unrolled.layers[L - 1].named_parameters())[name].grad
            assert not torch.allclose(param.grad, one_use)  # every use contributes, not only the last one


def test_partial_sharing_keeps_own_norms():
    enc = Encoder(config(share_layers="attention"))
    assert enc.layers[0].self_attn is enc.layers[2].self_attn
    assert enc.layers[0].ffn is not enc.layers[2].ffn
    assert enc.layers[0].self_attn_norm is not enc.layers[2].self_attn_norm
    enc = Encoder(config(share_layers="ffn"))
    assert enc.layers[0].ffn is enc.layers[1].ffn and enc.layers[0].self_attn is not enc.layers[1].self_attn


def test_mlm_head_maps_hidden_to_embedding_width_and_ties():
    enc = Encoder(config(embedding_size=E))
    model = TaskModel(enc, build_head({"type": "pretraining"}, enc.config, enc))
    assert model.head.mlm.dense.weight.shape == (E, D)
    assert model.head.mlm.weight is enc.get_input_embeddings().weight
    out = model(torch.randint(0, V, (2, 6)))
    assert out.mlm_logits.shape == (2, 6, V) and out.nsp_logits.shape == (2, 2)
    span = TaskModel(enc, build_head({"type": "span"}, enc.config, enc))
    assert span.head.sbo.fc2.weight.shape == (E, D)


def test_distilbert_options():
    enc = Encoder(config(type_vocab_size=0, pooler=False))
    assert enc.embeddings.segments is None and enc.pooler is None
    ids = torch.randint(0, V, (2, 6))
    out = enc(ids)
    torch.testing.assert_close(out.pooled_output, out.last_hidden_state[:, 0])
    # segment ids are ignored (there is no table to read them from), whatever their values
    torch.testing.assert_close(enc(ids, token_type_ids=torch.full_like(ids, 7)).last_hidden_state,
                               out.last_hidden_state)
    assert "segments" not in str(enc.state_dict().keys()) and "pooler" not in str(enc.state_dict().keys())


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(share_layers="some"), "share_layers='some' is not one of none, all, attention, ffn"),
    (dict(embedding_size=0), "embedding_size=0 must be an integer"),
    (dict(arch="decoder", share_layers="all"),
     "unknown key(s) 'share_layers'; valid keys for arch decoder are .* ('share_layers' is an option of arch encoder)"),
    (dict(arch="decoder", pooler=False), "unknown key(s) 'pooler'; valid keys for arch decoder"),
    (dict(type_vocab_size=-1), "type_vocab_size=-1 must be an integer >= 0"),
])
def test_bad_options_are_named(overrides, message):
    with pytest.raises(LmforgeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(**overrides)


def test_presets_build_small_and_save_shared_weights_once(tmp_path):
    from safetensors import safe_open

    from lmforge.persistence import load_pretrained, save_pretrained

    cfg = model_config_from_preset("albert-mini", vocab_size=V, max_seq_len=16)
    enc = Encoder(cfg)
    model = TaskModel(enc, build_head({"type": "pretraining"}, cfg, enc)).eval()
    save_pretrained(model, tmp_path / "m", config=cfg, head={"type": "pretraining"})
    with safe_open(tmp_path / "m" / "model.safetensors", "pt") as f:
        layer_keys = [k for k in f.keys() if ".layers." in k]
    assert layer_keys and all(".layers.0." in k for k in layer_keys)  # one layer's tensors, saved once
    loaded = load_pretrained(tmp_path / "m").model
    assert all(layer is loaded.backbone.layers[0] for layer in loaded.backbone.layers)
    ids = torch.randint(0, V, (2, 9))
    torch.testing.assert_close(loaded(ids).mlm_logits, model(ids).mlm_logits)


def test_freezing_and_layer_rates_follow_the_deepest_use_of_a_shared_layer():
    from lmforge.training.freeze import freeze, lr_scales
    from lmforge.training.unfreeze import layer_groups

    enc = Encoder(config(share_layers="all", embedding_size=E))
    model = TaskModel(enc, build_head({"type": "pretraining"}, enc.config, enc))
    frozen = freeze(model, "all-but-last:1")  # the shared layer is also the last layer: it trains
    assert frozen and all(".embeddings." in name for name in frozen)
    assert all(p.requires_grad for p in enc.layers[0].parameters())
    enc = Encoder(config(share_layers="all", embedding_size=E))
    scales = lr_scales(TaskModel(enc, build_head({"type": "pretraining"}, enc.config, enc)), lr=1e-3, layer_decay=0.5)
    assert scales["backbone.layers.0.ffn.fc1.weight"] == 0.5  # depth L (its last use), not depth 1
    assert scales["backbone.embeddings.projection.weight"] == 0.5 ** (L + 1)
    groups = layer_groups(TaskModel(Encoder(config(share_layers="all")), torch.nn.Linear(2, 2)))
    assert any("backbone.layers.0.ffn.fc1.weight" in g for g in groups[-2:])
    # unshared layers keep their own depths, and a tied un-embedding stays with the embeddings
    plain = Encoder(config())
    tied = TaskModel(plain, build_head({"type": "pretraining"}, plain.config, plain))
    scales = lr_scales(tied, lr=1e-3, layer_decay=0.5)
    assert scales["backbone.layers.0.ffn.fc1.weight"] == 0.5 ** L
    assert scales["backbone.embeddings.tokens.weight"] == 0.5 ** (L + 1)
