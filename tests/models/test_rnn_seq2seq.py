"""Attentional RNN encoder-decoder: teacher forcing == step-by-step decoding, source padding invariance, state
reordering, the location score over variable lengths, embeddings sharing/tying, bad inputs, save/load, and every
scoring function (and local-m attention) learning a toy reverse/copy task to 100% within a small step budget."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.models import ARCHITECTURES
from lmforge.models.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqOutput, RNNState
from lmforge.persistence import load_pretrained, save_pretrained

B, S, T, V, D = 3, 7, 5, 29, 12


def _config(**overrides) -> ModelConfig:
    values = dict(arch="rnn_seq2seq", vocab_size=V, d_model=D, n_heads=1, n_layers=2, max_seq_len=16, dropout=0.0)
    values.update(overrides)
    return ModelConfig(**values)


def _model(seed: int = 0, **overrides) -> RNNSeq2Seq:
    torch.manual_seed(seed)
    return RNNSeq2Seq(_config(**overrides)).double().eval()


def _ids(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


def _source() -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded row, a left-padded row and a full row; the padding ids are random (they must not matter)."""
    ids = _ids(100, B, S)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, 4:] = 0
    mask[1, :2] = 0
    return ids, mask


def _step_all(model: RNNSeq2Seq, src, src_mask, tgt) -> torch.Tensor:
    state = model.encode(src, src_mask)
    logits = []
    for t in range(tgt.shape[1]):
        step_logits, state = model.decode_step(tgt[:, t], state)
        logits.append(step_logits)
    assert state.step == tgt.shape[1]
    return torch.stack(logits, dim=1)  # (B, T, V)


# ------------------------------------------------------------------------------------------------ equivalences
@pytest.mark.parametrize("overrides", [
    dict(),  # general, GRU, input feeding (the preset's choices)
    dict(rnn_cell="lstm", attention="additive"),
    dict(input_feeding=False, attention="dot"),  # the whole target in one RNN call
    dict(rnn_cell="lstm", input_feeding=False, attention="location", attention_window=1),
    dict(attention="cosine", attention_window=2, bidirectional=False),
    dict(attention="scaled_dot", n_layers=1, share_embeddings=False, tie_embeddings=False),
], ids=["general-gru-feed", "additive-lstm", "dot-nofeed", "location-local-lstm-nofeed", "cosine-local-uni",
        "scaled_dot-untied"])
def test_teacher_forcing_equals_decode_steps(overrides):
    model = _model(**overrides)
    src, src_mask = _source()
    tgt = _ids(7, B, T)
    with torch.no_grad():
        out = model(src, tgt, src_mask, output_attentions=True)
        stepped = _step_all(model, src, src_mask, tgt)
    assert isinstance(out, RNNSeq2SeqOutput) and out.logits.shape == (B, T, V)
    torch.testing.assert_close(stepped, out.logits, rtol=1e-10, atol=1e-10)
    assert out.attentions.shape == (B, T, S) and out.last_hidden_state.shape == (B, T, D)
    # the weights are reported over the positions of src_ids: zero on padding, rows summing to 1
    assert float(out.attentions.masked_select(src_mask[:, None, :] == 0).abs().max()) == 0.0
    torch.testing.assert_close(out.attentions.sum(-1), torch.ones(B, T, dtype=torch.float64))
    assert model(src, tgt, src_mask).attentions is None


def test_source_padding_is_invisible():
    """Each row alone (unpadded) gives the logits it gets inside a padded batch, wherever the padding sits."""
    for overrides in (dict(), dict(rnn_cell="lstm", attention="location", attention_window=1)):
        model = _model(**overrides)
        src, src_mask = _source()
        tgt = _ids(8, B, T)
        with torch.no_grad():
            batch = model(src, tgt, src_mask, output_attentions=True)
            noisy = src.masked_fill(src_mask == 0, 5)  # other padding ids
            torch.testing.assert_close(model(noisy, tgt, src_mask).logits, batch.logits, rtol=0, atol=0)
            for b in range(B):
                real = src[b][src_mask[b] == 1].unsqueeze(0)  # (1, n)
                alone = model(real, tgt[b:b + 1], output_attentions=True)
                torch.testing.assert_close(alone.logits[0], batch.logits[b], rtol=1e-10, atol=1e-10)
                torch.testing.assert_close(alone.attentions[0], batch.attentions[b][:, src_mask[b] == 1])
                torch.testing.assert_close(alone.memory[0], batch.memory[b][src_mask[b] == 1])
        assert float(batch.memory.masked_select(src_mask[..., None].expand_as(batch.memory) == 0).abs().max()) == 0


def test_right_padding_after_the_target_changes_nothing_before_it():
    model = _model()
    src, src_mask = _source()
    tgt = _ids(9, B, T)
    tgt_mask = torch.ones(B, T, dtype=torch.long)
    tgt_mask[0, 3:] = 0
    with torch.no_grad():
        a = model(src, tgt, src_mask, tgt_mask).logits
        b = model(src, tgt.masked_fill(tgt_mask == 0, 0), src_mask, tgt_mask).logits
    torch.testing.assert_close(a[0, :3], b[0, :3], rtol=0, atol=0)
    torch.testing.assert_close(a[1:], b[1:], rtol=0, atol=0)
    left = tgt_mask.flip(-1)
    with pytest.raises(LmforgeError, match="right-padded"):
        model(src, tgt, src_mask, left)


def test_reorder_state_selects_and_duplicates_rows():
    model = _model(rnn_cell="lstm", attention_window=1)
    src, src_mask = _source()
    tgt = _ids(10, B, 2)
    index = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        state = model.encode(src, src_mask)
        _, state = model.decode_step(tgt[:, 0], state)
        picked = model.reorder_state(state, index)
        logits, after = model.decode_step(tgt[index, 1], picked)
        # the same rows encoded and stepped from the start
        direct = _step_all(model, src[index], src_mask[index], tgt[index])
    torch.testing.assert_close(logits, direct[:, 1], rtol=1e-10, atol=1e-10)
    assert isinstance(after, RNNState) and after.step == 2 and after.hidden.shape == (2, 4, D)
    assert picked.cell is not None and picked.memory.shape == (4, S, D) and picked.src_mask.shape == (4, S)
    torch.testing.assert_close(picked.feed, state.feed[index])


def test_initial_state_and_feed():
    model = _model(rnn_cell="lstm")
    src, src_mask = _source()
    with torch.no_grad():
        state = model.encode(src, src_mask)
    assert state.hidden.shape == (2, B, D) and state.cell.shape == (2, B, D) and state.step == 0
    assert float(state.feed.abs().max()) == 0.0  # h~_0 = 0
    assert float(state.hidden.abs().max()) < 1.0  # tanh bridge
    gru = _model()
    assert gru.encode(src, src_mask).cell is None and gru.bridge_cell is None
    assert _model().encode(src).src_mask is None  # no padding: no mask to carry


def test_location_score_takes_sources_of_any_length_up_to_max_seq_len():
    model = _model(attention="location", max_seq_len=8)
    with torch.no_grad():
        for length in (1, 3, 8):
            out = model(_ids(length, 2, length), _ids(11, 2, 3), output_attentions=True)
            assert out.attentions.shape == (2, 3, length)
            torch.testing.assert_close(out.attentions.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(LmforgeError, match="max_seq_len=8"):
        model(_ids(1, 2, 9), _ids(11, 2, 3))
    # other scores have no such limit: an RNN reads any length
    _model(attention="dot", max_seq_len=8)(_ids(1, 2, 9), _ids(11, 2, 3))


def test_local_m_attends_only_inside_the_window():
    model = _model(attention="dot", attention_window=1)
    src, src_mask = _source()
    with torch.no_grad():
        w = model(src, _ids(12, B, T), src_mask, output_attentions=True).attentions  # (B, T, S)
    # row 2 is unpadded: step t may only see source positions t-1 .. t+1
    for t in range(T):
        outside = [s for s in range(S) if abs(s - t) > 1]
        assert float(w[2, t, outside].abs().max()) == 0.0
    # row 1 is left-padded by 2: positions count real tokens, so step 0 sees the first two real ones
    assert float(w[1, 0, 2:4].sum()) == pytest.approx(1.0)


def test_embeddings_sharing_and_tying():
    shared = _model()
    keys = set(shared.state_dict())
    assert "embedding.weight" in keys and "lm_head.weight" not in keys and "src_embedding.weight" not in keys
    assert shared.output_weight is shared.get_input_embeddings().weight
    assert float(shared.embedding.weight[0].detach().abs().max()) == 0.0  # the padding row
    split = _model(share_embeddings=False, tie_embeddings=False)
    keys = set(split.state_dict())
    assert {"src_embedding.weight", "tgt_embedding.weight", "lm_head.weight"} <= keys
    assert split.output_weight is split.lm_head.weight
    hidden = torch.randn(2, D, dtype=torch.float64)
    torch.testing.assert_close(shared.lm_logits(hidden), hidden @ shared.embedding.weight.T)
    lstm_keys = set(_model(rnn_cell="lstm").state_dict())
    assert "bridge_cell.weight" in lstm_keys and "encoder.1.weight_ih_l0_reverse" in lstm_keys


def test_preset_builds_through_the_registry_and_round_trips(tmp_path):
    config = model_config_from_preset("rnn-seq2seq", vocab_size=V, d_model=D, dropout=0.0)
    torch.manual_seed(0)
    model = ARCHITECTURES[config.arch](config).eval()
    assert isinstance(model, RNNSeq2Seq) and model.config is config
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    src, src_mask = _source()
    tgt = _ids(13, B, T)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(src, tgt, src_mask).logits, model(src, tgt, src_mask).logits,
                                   rtol=0, atol=0)


def test_bad_inputs_and_configs_are_clear_errors():
    model = _model()
    src, src_mask = _source()
    state = model.encode(src, src_mask)
    with pytest.raises(LmforgeError, match="prev_ids must be"):
        model.decode_step(torch.tensor([1, 2]), state)
    with pytest.raises(LmforgeError, match="outside the vocabulary"):
        model.decode_step(torch.tensor([1, 2, V]), state)
    with pytest.raises(LmforgeError, match="RNNState"):
        model.decode_step(torch.tensor([1, 2, 3]), (state.hidden,))
    with pytest.raises(LmforgeError, match="src_mask must be"):
        model.encode(src, src_mask[:, :4])
    with pytest.raises(LmforgeError, match="additive mask"):
        model.encode(src, src_mask.double() * -1e4)
    with pytest.raises(LmforgeError, match="src_ids must be"):
        model.encode(src[0])
    with pytest.raises(LmforgeError, match="tgt_ids has 2 rows"):
        model(src, _ids(1, 2, T), src_mask)
    with pytest.raises(LmforgeError, match="arch='rnn_seq2seq'"):
        RNNSeq2Seq(ModelConfig(arch="seq2seq", vocab_size=V, d_model=D, n_heads=1))
    with pytest.raises(LmforgeError, match="n_decoder_layers"):
        RNNSeq2Seq(_config(n_decoder_layers=3))


# ------------------------------------------------------------------------------------------------ toy tasks
PAD, BOS, EOS = 0, 1, 2
ALPHABET = 10  # symbols are ids 3 .. 12
TOY_V = 3 + ALPHABET
TOY_S = 6  # sources of 3 to 6 symbols


def toy_batch(gen: torch.Generator, n: int, task: str) -> tuple[torch.Tensor, ...]:
    """(src (n, 6), src_mask, decoder inputs (n, 7) = BOS + target, labels (n, 7) = target + EOS, PAD after).

    Sources are 3 to 6 distinct symbols; the target is the source reversed ("reverse") or as it is ("copy").
    Distinct, so that every target position has one source position to attend to: with runs of one symbol
    (5 6 6 6 6) content scores must count, which took a few hundred more steps for one held-out sequence in 256."""
    src = torch.full((n, TOY_S), PAD)
    tgt_in = torch.full((n, TOY_S + 1), PAD)
    labels = torch.full((n, TOY_S + 1), PAD)
    for i, length in enumerate(torch.randint(3, TOY_S + 1, (n,), generator=gen).tolist()):
        symbols = 3 + torch.randperm(ALPHABET, generator=gen)[:length]
        target = symbols.flip(0) if task == "reverse" else symbols
        src[i, :length] = symbols
        tgt_in[i, 0], tgt_in[i, 1:length + 1] = BOS, target
        labels[i, :length], labels[i, length] = target, EOS
    return src, (src != PAD).long(), tgt_in, labels


def train_toy(config: ModelConfig, task: str, steps: int, *, seed: int = 0, batch_size: int = 128,
              lr: float = 2e-2) -> RNNSeq2Seq:
    """Adam with a linear decay to 0 and gradient clipping at 5: the usual recipe for small RNNs. The decay to 0
    and the batch of 128 (not 64) let the last rare misalignments settle (fewer runs ending one token short)."""
    torch.manual_seed(seed)
    model = RNNSeq2Seq(config)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / steps)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        src, src_mask, tgt_in, labels = toy_batch(gen, batch_size, task)
        logits = model(src, tgt_in, src_mask).logits
        loss = F.cross_entropy(logits.reshape(-1, TOY_V), labels.reshape(-1), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        schedule.step()
    return model.eval()


def toy_accuracy(model: RNNSeq2Seq, batch: tuple[torch.Tensor, ...]) -> tuple[float, float]:
    """Token accuracy on the real label positions (EOS included): teacher-forced argmax, and greedy decoding
    with ``decode_step`` (which must also stop the right way: EOS at the right place)."""
    src, src_mask, tgt_in, labels = batch
    real = labels != PAD
    with torch.no_grad():
        forced = model(src, tgt_in, src_mask).logits.argmax(-1)  # (n, 7)
        state = model.encode(src, src_mask)
        prev, greedy = torch.full((src.shape[0],), BOS), []
        for _ in range(labels.shape[1]):
            logits, state = model.decode_step(prev, state)
            prev = logits.argmax(-1)
            greedy.append(prev)
    greedy_ids = torch.stack(greedy, dim=1)
    return float((forced == labels)[real].float().mean()), float((greedy_ids == labels)[real].float().mean())


# Step budgets (batch 128, lr 2e-2, one layer, d_model 48): with each budget, seeds 0 to 4 all reach 100% (as
# measured when the budgets were set). The scaled dot product is the slow one: RNN states are bounded
# (|h_i| <= 1), so its scores q.k / sqrt(D) cannot exceed sqrt(D) and its attention stays soft; it gets d_model 64
# (at 48 one seed in five was still one token short after 450 steps). 'general' and 'additive' learn a scale in
# their weights, and cosine gets beta = sqrt(D) (see lmforge.nn.rnn.make_state_score). Local-m runs the copy
# task: its window follows p_t = t, which reversal would leave.
TOY_CASES = [
    # id, score, cell, window, input feeding, task, d_model, steps
    ("general-gru-feed", "general", "gru", None, True, "reverse", 48, 200),
    ("dot-gru", "dot", "gru", None, False, "reverse", 48, 250),
    ("scaled_dot-gru", "scaled_dot", "gru", None, False, "reverse", 64, 350),
    ("additive-lstm-feed", "additive", "lstm", None, True, "reverse", 48, 150),
    ("cosine-gru", "cosine", "gru", None, False, "reverse", 48, 200),
    ("location-gru", "location", "gru", None, False, "reverse", 48, 150),
    ("local-m-general-gru-feed", "general", "gru", 1, True, "copy", 48, 250),
]


@pytest.mark.slow
@pytest.mark.parametrize("score, cell, window, feed, task, d_model, steps", [c[1:] for c in TOY_CASES],
                         ids=[c[0] for c in TOY_CASES])
def test_each_scoring_learns_a_toy_task(score, cell, window, feed, task, d_model, steps):
    config = ModelConfig(arch="rnn_seq2seq", vocab_size=TOY_V, d_model=d_model, n_heads=1, n_layers=1,
                         max_seq_len=TOY_S, rnn_cell=cell, attention=score, attention_window=window,
                         input_feeding=feed, dropout=0.0)
    model = train_toy(config, task, steps)
    held_out = toy_batch(torch.Generator().manual_seed(1234), 256, task)  # fresh draws, not the training stream
    forced, greedy = toy_accuracy(model, held_out)
    assert (forced, greedy) == (1.0, 1.0)
