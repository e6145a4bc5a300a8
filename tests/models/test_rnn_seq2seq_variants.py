"""The RNN encoder-decoder's attention taxonomy beyond Luong's global/local-m soft attention: no attention (Cho et
al.'s fixed context at every step, Sutskever et al.'s context in h_0 only), local-p, Bahdanau's decoder order, and
hard attention trained by REINFORCE. Teacher forcing == step-by-step decoding, source padding invariance, greedy and
beam generation, the local-p Gaussian window, the query of Bahdanau's order, the REINFORCE gradient and baseline, the
config checks, and toy copy/reverse tasks learned without attention and with local-p."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig, from_dict, model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.generation import generate
from lmforge.models.rnn_seq2seq import RNNSeq2Seq
from lmforge.nn.attention import RewardBaseline, SampledAlignments, reinforce_loss
from lmforge.objectives import Seq2SeqObjective
from lmforge.recipes.resolve import resolve
from lmforge.recipes.seq2seq import SEQ2SEQ_DEFAULTS, Seq2SeqRun
from tests.models.test_rnn_seq2seq import TOY_S, TOY_V, toy_accuracy, toy_batch, train_toy

B, S, T, V, D = 3, 7, 5, 29, 12

VARIANTS = {
    "none-fixed-context": dict(attention="none"),
    "none-sutskever": dict(attention="none", input_feeding=False),
    "none-bahdanau-lstm": dict(attention="none", decoder_order="bahdanau", rnn_cell="lstm"),
    "local-p-feed": dict(attention="general", attention_window=2, attention_alignment="predictive"),
    "local-p-nofeed-lstm": dict(attention="dot", attention_window=1, attention_alignment="predictive",
                                input_feeding=False, rnn_cell="lstm"),
    "bahdanau-additive": dict(attention="additive", decoder_order="bahdanau"),
    "bahdanau-local-m-lstm": dict(attention="general", decoder_order="bahdanau", attention_window=1,
                                  rnn_cell="lstm", input_feeding=False),
    "bahdanau-local-p": dict(attention="dot", decoder_order="bahdanau", attention_window=2,
                             attention_alignment="predictive"),
    "hard-straight-through": dict(attention="general", hard_attention=True),
    "hard-reinforce-local-p": dict(attention="general", hard_attention=True, hard_attention_estimator="reinforce",
                                   attention_window=2, attention_alignment="predictive"),
}


def _config(**overrides) -> ModelConfig:
    values = dict(arch="rnn_seq2seq", vocab_size=V, d_model=D, n_heads=1, n_layers=2, max_seq_len=16, dropout=0.0)
    values.update(overrides)
    return ModelConfig(**values)


def _model(seed: int = 0, **overrides) -> RNNSeq2Seq:
    torch.manual_seed(seed)
    return RNNSeq2Seq(_config(**overrides)).double().eval()


def _ids(seed: int, *shape: int) -> torch.Tensor:
    return torch.randint(3, V, shape, generator=torch.Generator().manual_seed(seed))


def _source() -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded row, a left-padded row and a full row (random padding ids: they must not matter)."""
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
    return torch.stack(logits, dim=1)  # (B, T, V)


# ------------------------------------------------------------------------------------------------ every variant
@pytest.mark.parametrize("name", list(VARIANTS))
def test_shapes_and_teacher_forcing_equals_decode_steps(name):
    model = _model(**VARIANTS[name])
    src, src_mask = _source()
    tgt = _ids(7, B, T)
    with torch.no_grad():
        out = model(src, tgt, src_mask)
        stepped = _step_all(model, src, src_mask, tgt)
    assert out.logits.shape == (B, T, V) and out.last_hidden_state.shape == (B, T, D) and out.memory.shape == (B, S, D)
    assert out.alignment_samples is None  # eval mode: no sampling, even with REINFORCE
    torch.testing.assert_close(stepped, out.logits, rtol=1e-10, atol=1e-10)
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_source_padding_is_invisible(name):
    """Each row alone (unpadded) gives the logits it gets inside a padded batch, wherever the padding sits."""
    model = _model(**VARIANTS[name])
    src, src_mask = _source()
    tgt = _ids(8, B, T)
    with torch.no_grad():
        batch = model(src, tgt, src_mask).logits
        noisy = src.masked_fill(src_mask == 0, 5)  # other padding ids
        torch.testing.assert_close(model(noisy, tgt, src_mask).logits, batch, rtol=0, atol=0)
        for b in range(B):
            real = src[b][src_mask[b] == 1].unsqueeze(0)  # (1, n)
            torch.testing.assert_close(model(real, tgt[b:b + 1]).logits[0], batch[b], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_and_beam_generation(name):
    model = _model(**VARIANTS[name])
    with torch.no_grad():  # larger weights: peaked distributions, no near-ties between beams
        gen = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    src, src_mask = _source()
    options = dict(max_new_tokens=6, eos_id=2, bos_id=1)
    greedy = generate(model, src, src_mask, **options)
    beam1 = generate(model, src, src_mask, strategy="beam", num_beams=1, **options)
    assert greedy.sequences == beam1.sequences
    beam = generate(model, src, src_mask, strategy="beam", num_beams=3, num_return_sequences=2, **options)
    assert [len(rows) for rows in beam.sequences] == [2] * B
    for row in range(B):  # a padded batch decodes each source as it would alone
        real = src[row][src_mask[row] == 1].unsqueeze(0)
        alone = generate(model, real, strategy="beam", num_beams=3, num_return_sequences=2, **options)
        assert alone.sequences[0] == beam.sequences[row]


# ------------------------------------------------------------------------------------------------ no attention
def test_no_attention_context_is_the_bridged_final_state():
    cho, sutskever = _model(attention="none"), _model(attention="none", input_feeding=False)
    src, src_mask = _source()
    with torch.no_grad():
        state = cho.encode(src, src_mask)
        torch.testing.assert_close(state.feed, state.hidden[-1], rtol=0, atol=0)  # c = h_0 of the top layer
        _, after = cho.decode_step(torch.ones(B, dtype=torch.long), state)
        torch.testing.assert_close(after.feed, state.feed, rtol=0, atol=0)  # the same c at every step
        assert float(sutskever.encode(src, src_mask).feed.abs().max()) == 0.0
        # the source reaches Sutskever's decoder through h_0 only: a different source changes the logits
        tgt = _ids(3, B, T)
        other = _ids(4, B, S)
        assert not torch.allclose(sutskever(src, tgt, src_mask).logits, sutskever(other, tgt, src_mask).logits)
    assert cho.attention is None and sutskever.combine is None and cho.combine.weight.shape == (D, 2 * D)
    assert not any(k.startswith("attention.") for k in cho.state_dict())
    with pytest.raises(LmforgeError, match="attention='none'"):
        cho(src, _ids(3, B, T), src_mask, output_attentions=True)


# ------------------------------------------------------------------------------------------------ local-p
def test_local_p_weights_are_a_gaussian_window_around_the_predicted_position():
    """Luong's local-p inside the model: p_t = S_b sigmoid(v_p^T tanh(W_p h_t)) with S_b each row's REAL length
    (the left-padded and right-padded rows catch a p_t computed from the padded length), weights zero outside
    [round(p_t) - D_w, round(p_t) + D_w], and softmax-inside-the-window times exp(-(s - p_t)^2 / (2 (D_w/2)^2))."""
    Dw = 2
    model = _model(attention="general", attention_window=Dw, attention_alignment="predictive")
    with torch.no_grad():  # a spread of predicted centres across the source, not all near S/2
        gen = torch.Generator().manual_seed(2)
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    src, src_mask = _source()
    tgt = _ids(9, B, T)
    with torch.no_grad():
        w = model(src, tgt, src_mask, output_attentions=True).attentions  # (B, T, S) in the layout of src
        state, centres = model.encode(src, src_mask), []
        for t in range(T):
            _, state = model.decode_step(tgt[:, t], state)
            centres.append(torch.sigmoid(model.attention.predictor(state.hidden[-1])).squeeze(-1))  # (B,)
    seen = set()
    for b in range(B):
        real = w[b][:, src_mask[b] == 1]  # (T, n): positions counting real tokens
        n = real.shape[-1]
        assert float(w[b][:, src_mask[b] == 0].abs().sum()) == 0.0
        for t in range(T):
            p = n * float(centres[t][b])
            mid = min(max(round(p), 0), n - 1)
            seen.add(mid)
            inside = [s for s in range(n) if abs(s - mid) <= Dw]
            outside = [s for s in range(n) if s not in inside]
            assert float(real[t, outside].abs().sum()) == 0.0
            gauss = torch.tensor([math.exp(-((s - p) ** 2) / (2 * (Dw / 2) ** 2)) for s in inside],
                                 dtype=torch.float64)
            # dividing out the Gaussian leaves a softmax over the window: positive, summing to 1
            soft = real[t, inside] / gauss
            assert float(soft.min()) > 0
            torch.testing.assert_close(soft.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert len(seen) >= 3  # the test looked at several different centres


# ------------------------------------------------------------------------------------------------ Bahdanau order
def test_bahdanau_order_queries_with_the_previous_decoder_state():
    """Step i attends with s_{i-1} (s_0 = the bridged h_0), before the RNN reads y_{i-1}: the weights of step i
    do not depend on y_{i-1}, and equal attention(s_{i-1}). Luong's order fails both (its query is h_i)."""
    for order, expect in (("bahdanau", True), ("luong", False)):
        model = _model(attention="general", decoder_order=order)
        src, src_mask = _source()
        src_mask[1] = 1  # right padding only: the reported weights then match the state's layout
        tgt = _ids(10, B, 3)
        with torch.no_grad():
            w = model(src, tgt, src_mask, output_attentions=True).attentions  # (B, 3, S)
            other = model(src, tgt.flip(-1), src_mask, output_attentions=True).attentions
            state, matches = model.encode(src, src_mask), []
            for i in range(3):
                query = state.hidden[-1].unsqueeze(1)  # (B, 1, D) s_{i-1}
                direct = model.attention(query, state.memory, attention_mask=state.src_mask, positions=i,
                                         need_weights=True).weights.squeeze(1)  # (B, S)
                matches.append(torch.allclose(direct, w[:, i], rtol=1e-10, atol=1e-12))
                _, state = model.decode_step(tgt[:, i], state)
        assert all(matches) is expect and any(matches) is expect
        # step 0 reads y_0 = tgt[:, 0] only after attending in Bahdanau's order
        assert torch.allclose(w[:, 0], other[:, 0], rtol=0, atol=0) is expect
    bahdanau = _model(attention="general", decoder_order="bahdanau")
    assert bahdanau.combine.weight.shape == (D, 3 * D)  # the readout reads [c_i; s_i; E y_{i-1}]
    assert bahdanau.decoder.weight_ih_l0.shape[-1] == 2 * D  # the RNN reads [E y_{i-1}; c_i]


# ------------------------------------------------------------------------------------------------ REINFORCE
def _reinforce_batch(seed: int = 11) -> dict[str, torch.Tensor]:
    src, src_mask = _source()
    tgt = _ids(seed, B, T)
    tgt[:, 0] = 1
    labels = torch.cat((tgt[:, 1:], torch.full((B, 1), 2)), dim=1)
    tgt_mask = torch.ones(B, T, dtype=torch.long)
    tgt_mask[0, 3:] = 0
    labels[0, 3:] = -100
    return dict(src_ids=src, src_mask=src_mask, tgt_ids=tgt, tgt_mask=tgt_mask, labels=labels)


def test_reinforce_gradient_reaches_the_scorer_and_the_baseline_moves():
    model = _model(attention="general", hard_attention=True, hard_attention_estimator="reinforce",
                   reinforce_baseline_decay=0.5, reinforce_entropy=0.01).train()
    objective = Seq2SeqObjective(label_smoothing=0.1)
    batch = _reinforce_batch()
    baseline = model.reward_baseline
    assert int(baseline.count) == 0 and {"reward_baseline.value", "reward_baseline.count"} <= set(model.state_dict())
    torch.manual_seed(5)
    losses, metrics = objective(model, batch)
    loss = losses["seq2seq"][0]
    loss.backward()
    grad = model.attention.score.weight.grad
    # the sample itself carries no gradient: the scorer learns through the surrogate only
    assert grad is not None and torch.isfinite(grad).all() and float(grad.abs().sum()) > 0
    reward = float(metrics["reinforce_reward"][0]) / B
    assert reward < 0 and int(baseline.count) == 1
    assert float(baseline.value) == pytest.approx(reward)  # the first batch sets b to its mean reward
    torch.manual_seed(5)  # the same samples: the reported loss is the cross-entropy, without the surrogate
    logits = model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"], batch["tgt_mask"]).logits
    ce = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100,
                         reduction="sum", label_smoothing=0.1)
    assert float(loss.detach()) == pytest.approx(float(ce.detach()), rel=1e-6)
    objective(model, _reinforce_batch(12))
    assert int(baseline.count) == 2  # the extra forward above did not update it: only the objective does
    # evaluation: argmax attention, no samples, nothing in the metrics
    model.eval()
    with torch.no_grad():
        _, eval_metrics = objective(model, batch)
    assert "reinforce_reward" not in eval_metrics and int(baseline.count) == 2


def test_reinforce_loss_is_the_score_function_surrogate():
    baseline = RewardBaseline(decay=0.75)
    baseline.update(torch.tensor([-4.0, -2.0]))  # b = -3
    log_probs = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.2, -0.3]], requires_grad=True)
    entropy = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]], requires_grad=True)
    samples = SampledAlignments(log_probs, entropy, baseline, entropy_weight=0.1)
    rewards = torch.tensor([-1.0, -5.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    surrogate = reinforce_loss(samples, rewards, mask)
    # advantages: -1 - (-3) = 2, -5 - (-3) = -2
    expected = -(2 * (-1.5)) - 0.1 * 2.0 + -(-2 * (-0.6)) - 0.1 * 1.5
    assert float(surrogate.detach()) == pytest.approx(expected)
    surrogate.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-2.0, -2.0, 0.0], [2.0, 2.0, 2.0]]))
    assert float(baseline.value) == pytest.approx(0.75 * -3 + 0.25 * -3)  # mean reward -3 again
    assert int(baseline.count) == 2


def test_straight_through_training_keeps_its_gradient_and_returns_no_samples():
    model = _model(attention="general", hard_attention=True).train()
    batch = _reinforce_batch()
    out = model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"], batch["tgt_mask"], output_attentions=True)
    assert out.alignment_samples is None and model.reward_baseline is None
    w = out.attentions.detach()
    assert torch.equal(w, (w == 1).double())  # one-hot samples
    out.logits.sum().backward()
    assert float(model.attention.score.weight.grad.abs().sum()) > 0


# ------------------------------------------------------------------------------------------------ config
def test_config_choices_defaults_and_command_line_overrides():
    old = from_dict(ModelConfig, dict(arch="rnn_seq2seq", vocab_size=V, d_model=D))  # no new keys
    assert (old.attention_alignment, old.decoder_order, old.hard_attention, old.hard_attention_estimator) == \
        ("monotonic", "luong", False, "straight_through")
    keys = set(RNNSeq2Seq(old).state_dict())
    assert not any(k.startswith(("reward_baseline", "attention.predictor")) for k in keys)
    # as `lmforge train-seq2seq --model.attention=none ...` reads them (lmforge.commands.seq2seq.resolve_run)
    def from_command_line(*overrides: str) -> ModelConfig:
        run = resolve(Seq2SeqRun, defaults=SEQ2SEQ_DEFAULTS, overrides=list(overrides), where="train-seq2seq")
        return model_config_from_preset(run.preset, **{**run.model, "vocab_size": V, "d_model": D})

    config = from_command_line("--model.attention=none", "--model.decoder_order=bahdanau")
    assert config.attention == "none" and config.decoder_order == "bahdanau"
    config = from_command_line("--model.attention_window=2", "--model.attention_alignment=predictive",
                               "--model.hard_attention=true", "--model.hard_attention_estimator=reinforce",
                               "--model.reinforce_entropy=0.01")
    assert config.hard_attention and config.hard_attention_estimator == "reinforce" and config.reinforce_entropy == 0.01


@pytest.mark.parametrize("overrides, message", [
    (dict(attention="nothing"), r"attention='nothing' is not one of additive, .*, location, none"),
    (dict(attention_alignment="forward"), "attention_alignment='forward' is not one of monotonic, predictive"),
    (dict(decoder_order="cho"), "decoder_order='cho' is not one of luong, bahdanau"),
    (dict(hard_attention_estimator="gumbel"), "hard_attention_estimator='gumbel' is not one of straight_through, "
                                               "reinforce"),
    (dict(attention_alignment="predictive"), "needs attention_window >= 1"),
    (dict(attention="none", attention_window=2), "no attention to make local"),
    (dict(attention="none", hard_attention=True), "no attention to make hard"),
    (dict(reinforce_baseline_decay=1.0), r"reinforce_baseline_decay=1.0 must be in \[0, 1\)"),
    (dict(reinforce_entropy=-0.1), "reinforce_entropy=-0.1"),
    (dict(arch="rnn", attention="none"), "attention pooling"),
    (dict(arch="rnn", decoder_order="bahdanau"), "'decoder_order' is an option of arch rnn_seq2seq"),
])
def test_bad_options_are_one_line_errors(overrides, message):
    with pytest.raises(LmforgeError, match=message) as err:
        _config(**overrides)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------ toy tasks
# Budgets (batch 128, one GRU layer, d_model 48), measured when they were set. Without attention (lr 2e-2, 300
# steps) seeds 0 to 3 reached 97-99.6% greedy token accuracy on fresh draws (one fixed vector must carry the whole
# source, so the last few percent take much longer); reversal is not easier than copying here because the encoder is
# bidirectional. Local-p (window 2, lr 1e-2, 300 steps) reached 100% on seeds 0 to 2 for both tasks; at lr 2e-2 one
# seed in four stalled near 50% (its predicted p_t stuck where the sigmoid saturates), hence the lower rate. The
# assertions leave room (>= 0.95) so another seed or torch version does not fail them.
LEARNING_CASES = [
    # id, overrides, task, steps, lr
    ("none-copy", dict(attention="none"), "copy", 300, 2e-2),
    ("none-reverse", dict(attention="none"), "reverse", 300, 2e-2),
    ("local-p-copy", dict(attention="general", attention_window=2, attention_alignment="predictive"), "copy", 300,
     1e-2),
    ("local-p-reverse", dict(attention="general", attention_window=2, attention_alignment="predictive"), "reverse",
     300, 1e-2),
]


@pytest.mark.slow
@pytest.mark.parametrize("overrides, task, steps, lr", [c[1:] for c in LEARNING_CASES],
                         ids=[c[0] for c in LEARNING_CASES])
def test_variant_learns_a_toy_task(overrides, task, steps, lr):
    config = ModelConfig(arch="rnn_seq2seq", vocab_size=TOY_V, d_model=48, n_heads=1, n_layers=1, max_seq_len=TOY_S,
                         dropout=0.0, **overrides)
    model = train_toy(config, task, steps, lr=lr)
    held_out = toy_batch(torch.Generator().manual_seed(1234), 256, task)  # fresh draws, not the training stream
    forced, greedy = toy_accuracy(model, held_out)
    assert forced >= 0.95 and greedy >= 0.95, (forced, greedy)
