"""XLNet generates with its memory (``XLNetAdapter``, ``XLNet.forward_lm``): each step reads one new token against
the memory and gives exactly what reading the whole sequence again gives, for either attn_type and stream."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.generation import XLNetAdapter, adapter_for, generate
from lmforge.models.xlnet import XLNet
from tests.generation.helpers import V, _randomise, padded_batch, random_ids

VARIANTS = [("bi", "query"), ("uni", "query"), ("bi", "content"), ("uni", "content")]


def xlnet(attn_type: str = "bi", seed: int = 0, **overrides) -> XLNet:
    config = ModelConfig(**{**dict(arch="xlnet", vocab_size=V, d_model=12, n_heads=3, n_layers=2, d_ff=20,
                                   dropout=0.0, attention_dropout=0.0, attn_type=attn_type), **overrides})
    return _randomise(XLNet(config).double().eval(), seed)


def greedy(model, ids, mask, *, use_cache: bool, stream: str = "query", n: int = 6, **options):
    adapter = XLNetAdapter(model, use_cache=use_cache, stream=stream)
    return generate(adapter, ids, mask, max_new_tokens=n, **options)


@pytest.mark.parametrize(("attn_type", "stream"), VARIANTS)
def test_greedy_with_memory_equals_recomputing_the_whole_context(attn_type, stream):
    model = xlnet(attn_type, mem_len=2)  # mem_len is a training setting: generation keeps the whole context
    ids, mask = padded_batch(3, [5, 2, 4], side="right")
    cached = greedy(model, ids, mask, use_cache=True, stream=stream)
    full = greedy(model, ids, mask, use_cache=False, stream=stream)
    assert cached.sequences == full.sequences
    assert all(len(s[0]) == 6 for s in cached.sequences)
    for a, b in zip(cached.scores, full.scores, strict=True):
        assert a == pytest.approx(b, abs=1e-9)


@pytest.mark.parametrize(("attn_type", "stream"), VARIANTS)
def test_step_logits_equal_the_whole_sequences(attn_type, stream):
    model = xlnet(attn_type)
    ids, mask = padded_batch(4, [4, 6], side="left")
    cached, full = XLNetAdapter(model, stream=stream), XLNetAdapter(model, use_cache=False, stream=stream)
    ids, mask, _ = cached.prepare(ids, mask, 5)
    with torch.no_grad():
        la, sa = cached.start(ids, mask, 5)
        lb, sb = full.start(ids, mask, 5)
        for _ in range(4):
            torch.testing.assert_close(la, lb)
            nxt = la.argmax(-1)
            la, sa = cached.step(sa, nxt)
            lb, sb = full.step(sb, nxt)
        torch.testing.assert_close(la, lb)
    assert sa.mems[0].shape[1] == ids.shape[1] + 4  # the memory grows by one token per step


@pytest.mark.parametrize(("attn_type", "stream"), VARIANTS)
def test_a_padded_row_generates_what_it_would_alone(attn_type, stream):
    model = xlnet(attn_type)
    ids, mask = padded_batch(5, [6, 2, 4], side="right")
    batch = greedy(model, ids, mask, use_cache=True, stream=stream)
    for row in range(3):
        n = int(mask[row].sum())
        alone = greedy(model, ids[row:row + 1, :n], None, use_cache=True, stream=stream)
        assert alone.sequences[0] == batch.sequences[row]


def test_forward_lm_in_segments_equals_one_pass_and_never_looks_ahead():
    for attn_type, stream in VARIANTS:
        model = xlnet(attn_type)
        a = random_ids(6, 2, 7)
        with torch.no_grad():
            whole = model.forward_lm(a, stream=stream)
            first = model.forward_lm(a[:, :3], stream=stream)
            second = model.forward_lm(a[:, 3:], mems=first.mems, stream=stream)
            torch.testing.assert_close(torch.cat((first.last_hidden_state, second.last_hidden_state), 1),
                                       whole.last_hidden_state)
            for m, w in zip(second.mems, whole.mems, strict=True):
                torch.testing.assert_close(m, w)
            b = a.clone()
            b[:, -1] = (a[:, -1] + 1) % V
            other = model.forward_lm(b, stream=stream).last_hidden_state
        torch.testing.assert_close(other[:, :-1], whole.last_hidden_state[:, :-1])
        assert not torch.allclose(other[:, -1], whole.last_hidden_state[:, -1])


def test_the_query_stream_prediction_is_xlnets_dummy_token_trick():
    """The last row of ``forward_lm`` is what XLNet's own inputs for generation give: a dummy token after the
    context, hidden from every position, predicted through target_mapping (here with the causal context)."""
    model = xlnet("bi")
    a = random_ids(7, 2, 5)
    T = a.shape[1] + 1
    ids = torch.cat((a, torch.zeros(2, 1, dtype=a.dtype)), 1)
    perm = torch.ones(T, T, dtype=torch.bool).triu()[None].expand(2, -1, -1)
    mapping = torch.zeros(2, 1, T, dtype=torch.float64)
    mapping[:, 0, -1] = 1.0
    with torch.no_grad():
        ref = model(ids, perm_mask=perm, target_mapping=mapping).query_state[:, 0]
        torch.testing.assert_close(model.forward_lm(a).last_hidden_state[:, -1], ref)


def test_beam_search_and_sampling_run_and_keep_the_requested_length():
    model = xlnet("bi")
    ids, mask = padded_batch(8, [3, 5], side="left")
    beam_cached = generate(model, ids, mask, strategy="beam", num_beams=3, num_return_sequences=2, max_new_tokens=5)
    beam_full = generate(model, ids, mask, strategy="beam", num_beams=3, num_return_sequences=2, max_new_tokens=5,
                         use_cache=False)
    assert beam_cached.sequences == beam_full.sequences
    assert all(len(h) == 5 for s in beam_cached.sequences for h in s)
    sampled = generate(model, ids, mask, strategy="sample", top_k=5, max_new_tokens=9, seed=3)
    assert all(len(s[0]) == 9 for s in sampled.sequences)  # no length limit from positions either
    assert isinstance(adapter_for(model), XLNetAdapter)


def test_errors_are_clear():
    model = xlnet("bi")
    ids = random_ids(9, 2, 4)
    with pytest.raises(LmforgeError, match="stream must be 'query'"):
        model.forward_lm(ids, stream="both")
    with pytest.raises(LmforgeError, match="stream must be 'query' or 'content'"):
        XLNetAdapter(model, stream="sideways")
    with pytest.raises(LmforgeError, match="mems_mask marks the padding of the memory: pass it with mems"):
        model(ids, mems_mask=torch.ones(2, 3))
    mems = model.forward_lm(ids).mems
    with pytest.raises(LmforgeError, match=r"mems_mask must be \(batch=2, memory length=4\)"):
        model(ids, mems=mems, mems_mask=torch.ones(2, 3))
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[1] = 0
    with pytest.raises(LmforgeError, match="prompt 1 of the batch is empty"):
        generate(model, ids, mask, max_new_tokens=2)


def test_lmforge_generate_continues_a_prompt_with_an_xlnet_folder(tmp_path, capsys):
    from lmforge.cli import main
    from tests.models.test_xlnet_finetune import make_xlnet_dir

    folder = make_xlnet_dir(tmp_path / "xlnet")
    code = main(["generate", "--model", str(folder), "--prompt", "alice went to paris", "--max-new-tokens", "5"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert len(captured.out.splitlines()) == 1 and captured.out.strip()
    code = main(["generate", "--model", str(folder), "--prompt", "alice went to paris", "--max-new-tokens", "5",
                 "--no-cache"])
    assert code == 0 and capsys.readouterr().out == captured.out  # the memory changes nothing
