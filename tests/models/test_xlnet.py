"""XLNet's own behaviour: memory across segments, stop-gradient, the two streams' masks, the LM head, the config's
options and bad inputs."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.models.xlnet import XLNet

B, T, V, D = 2, 5, 41, 12


def tiny(**overrides) -> XLNet:
    torch.manual_seed(0)
    values = dict(arch="xlnet", vocab_size=V, d_model=D, n_heads=3, n_layers=2, d_ff=20, dropout=0.0,
                  attention_dropout=0.0)
    return XLNet(ModelConfig(**{**values, **overrides})).eval()


def ids(length: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, length), generator=torch.Generator().manual_seed(seed))


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_uni_memory_carries_across_segments():
    model = tiny(attn_type="uni")
    full = ids(2 * T)
    with torch.no_grad():
        whole = model(full).last_hidden_state
        first = model(full[:, :T], use_mems=True)
        second = model(full[:, T:], mems=first.mems)
    close(first.last_hidden_state, whole[:, :T])  # causal: the first segment never saw the second
    close(second.last_hidden_state, whole[:, T:])  # with the memory: as if read in one piece


def test_bi_memory_equals_the_concatenation_when_the_first_segment_cannot_see_the_second():
    model = tiny()
    full = ids(2 * T)
    perm = torch.zeros(B, 2 * T, 2 * T, dtype=torch.bool)
    perm[:, :T, T:] = True  # the first segment may not see the second (as a memory never does)
    with torch.no_grad():
        whole = model(full, perm_mask=perm).last_hidden_state
        first = model(full[:, :T], use_mems=True)
        second = model(full[:, T:], mems=first.mems)
    close(second.last_hidden_state, whole[:, T:])


def test_memory_length_is_cut_and_detached():
    model = tiny(mem_len=3)
    first = model(ids(), use_mems=True, output_hidden_states=True)
    assert len(first.mems) == 2 and all(m.shape == (B, 3, D) and not m.requires_grad for m in first.mems)
    close(first.mems[0], first.hidden_states[0][:, -3:])  # a layer's memory is its input
    second = model(ids(seed=2), mems=first.mems, use_mems=True)
    assert all(m.shape == (B, 3, D) for m in second.mems)
    everything = tiny()(ids(), use_mems=True)  # mem_len None: every state
    assert everything.mems[0].shape == (B, T, D)
    assert model(ids()).mems is None


def test_no_gradient_reaches_the_memory():
    model = tiny().train()
    mems = [torch.randn(B, 3, D, requires_grad=True) for _ in range(2)]
    out = model(ids(), mems=mems)
    out.last_hidden_state.square().sum().backward()
    assert all(m.grad is None for m in mems)
    assert model.word_embedding.weight.grad is not None


def test_query_stream_never_sees_the_token_it_predicts():
    model = tiny()
    perm = torch.eye(T, dtype=torch.bool).expand(B, T, T).clone()  # position i may not see itself
    mapping = torch.zeros(B, 1, T)
    mapping[:, 0, 2] = 1.0  # predict position 2
    a, b = ids(), ids()
    b[:, 2] = (a[:, 2] + 1) % V
    with torch.no_grad():
        out_a = model(a, perm_mask=perm, target_mapping=mapping)
        out_b = model(b, perm_mask=perm, target_mapping=mapping)
    close(out_a.query_state, out_b.query_state)
    assert not torch.allclose(out_a.last_hidden_state[:, 2], out_b.last_hidden_state[:, 2])  # content sees it
    logits = model.lm_logits(out_a.query_state)
    assert logits.shape == (B, 1, V)
    close(logits, out_a.query_state @ model.word_embedding.weight.T + model.lm_head.bias)  # tied


def test_padding_is_hidden_and_segments_matter():
    model = tiny()
    a = ids()
    b = a.clone()
    b[:, -1] = (a[:, -1] + 3) % V
    mask = torch.ones(B, T, dtype=torch.long)
    mask[:, -1] = 0
    types = torch.tensor([[0, 0, 1, 1, 1]] * B)
    with torch.no_grad():
        out_a = model(a, attention_mask=mask, token_type_ids=types).last_hidden_state
        out_b = model(b, attention_mask=mask, token_type_ids=types).last_hidden_state
        other = model(a, attention_mask=mask, token_type_ids=1 - types).last_hidden_state
        shifted = model(a, attention_mask=mask, token_type_ids=types + 7).last_hidden_state
    close(out_a[:, :-1], out_b[:, :-1])  # the padded token is seen by nobody
    close(other, out_a)  # only equality of segment ids matters
    close(shifted, out_a)
    assert not torch.allclose(model(a, token_type_ids=types).last_hidden_state, model(a).last_hidden_state)


def test_outputs_have_their_documented_shapes():
    model = tiny(attn_type="uni", same_length=True, clamp_len=2)
    mapping = torch.nn.functional.one_hot(torch.tensor([[1, 3, 4]] * B), T).float()
    perm = torch.ones(T, T, dtype=torch.bool).triu().expand(B, T, T)
    out = model(ids(), perm_mask=perm, target_mapping=mapping, output_hidden_states=True, output_attentions=True,
                use_mems=True)
    assert out.last_hidden_state.shape == (B, T, D) and out.query_state.shape == (B, 3, D)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2 and out.attentions[0].shape == (B, 3, T, T)
    with_mems = model(ids(), mems=out.mems, output_attentions=True)
    assert with_mems.attentions[0].shape == (B, 3, T, 2 * T)
    assert bool(torch.isfinite(out.query_state).all())


def test_presets_and_config_errors():
    for name, sizes in (("xlnet-tiny", (4, 128, 4)), ("xlnet-base", (12, 768, 12)), ("xlnet-large", (24, 1024, 16))):
        c = model_config_from_preset(name)
        assert (c.arch, c.n_layers, c.d_model, c.n_heads) == ("xlnet", *sizes)
    assert model_config_from_preset("xlnet-large").d_ff == 4096
    for overrides, words in ((dict(attn_type="tri"), "attn_type='tri' is not one of bi, uni"),
                             (dict(mem_len=0), "mem_len=0 must be an integer in \\[1"),
                             (dict(clamp_len=-1), "clamp_len=-1 must be"),
                             (dict(same_length=True), "same_length=true shapes the causal mask"),
                             (dict(d_model=15, n_heads=3), "d_model=15 must be even")):
        with pytest.raises(LmforgeError, match=words):
            ModelConfig(arch="xlnet", **overrides)
    with pytest.raises(LmforgeError, match="'mem_len' is an option of arch xlnet"):
        ModelConfig(arch="encoder", mem_len=8)
    with pytest.raises(LmforgeError, match="XLNet needs a config with arch='xlnet'"):
        XLNet(ModelConfig())


def test_bad_inputs_are_named():
    model = tiny()
    first = model(ids(), use_mems=True)
    for kwargs, words in (
            (dict(mems=first.mems[:1]), "mems must be a list of 2 tensors"),
            (dict(mems=[m[:1] for m in first.mems]), r"mems\[0\] must be a float \(batch=2"),
            (dict(mems=[first.mems[0], first.mems[1][:, :2]]), r"mems\[1\] must be"),
            (dict(perm_mask=torch.zeros(B, T, T - 1, dtype=torch.bool)), r"perm_mask must be \(batch=2, length=5"),
            (dict(perm_mask=torch.full((B, T, T), 0.5)), "perm_mask must be bool, or 0/1"),
            (dict(target_mapping=torch.zeros(B, 2, T + 1)), "target_mapping must be a float"),
            (dict(target_mapping=torch.zeros(B, 2, T, dtype=torch.long)), "target_mapping must be a float"),
            (dict(token_type_ids=torch.zeros(B, T)), "token_type_ids must be an integer"),
            (dict(attention_mask=torch.ones(B, T + 1)), "attention_mask must be"),
            (dict(output_attentions=[0]), "output_attentions must be True or False")):
        with pytest.raises(LmforgeError, match=words):
            model(ids(), **kwargs)
