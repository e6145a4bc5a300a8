"""The chunked vocabulary projection + cross-entropy (lmforge.nn.kernels.linear_ce) against autograd through the plain
F.linear + F.cross_entropy, and the causal LM objective's fused path against its logits path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.models import Decoder
from lmforge.nn.kernels.linear_ce import linear_cross_entropy
from lmforge.objectives.causal_lm import CausalLMObjective


def reference(hidden, weight, labels):
    logits = F.linear(hidden, weight)
    scores = logits.float() if logits.dtype == torch.bfloat16 else logits  # fp64 stays fp64
    loss = F.cross_entropy(scores, labels, ignore_index=-100, reduction="sum")
    correct = ((logits.argmax(-1) == labels) & (labels != -100)).sum()
    return loss, correct


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_loss_count_and_gradients_equal_autograd_through_the_plain_path(chunk_rows):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(53, 12, dtype=torch.float64, generator=g)
    weight = torch.randn(29, 12, dtype=torch.float64, generator=g)
    labels = torch.randint(0, 29, (53,), generator=g)
    labels[::5] = -100
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, correct = linear_cross_entropy(h1, w1, labels, chunk_rows=chunk_rows)
    (0.37 * loss).backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref_loss, ref_correct = reference(h2, w2, labels)
    (0.37 * ref_loss).backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-10)
    assert int(correct) == int(ref_correct) and not correct.requires_grad
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-10, atol=1e-12)
    assert float(h1.grad[::5].abs().max()) == 0.0  # ignored rows get no gradient


def test_only_what_requires_grad_gets_one_and_no_grad_mode_computes_none():
    hidden, weight = torch.randn(10, 4), torch.randn(6, 4, requires_grad=True)
    labels = torch.randint(0, 6, (10,))
    loss, _ = linear_cross_entropy(hidden, weight, labels, chunk_rows=3)
    loss.backward()
    ref_w = weight.detach().clone().requires_grad_()
    reference(hidden, ref_w, labels)[0].backward()
    torch.testing.assert_close(weight.grad, ref_w.grad)
    with torch.no_grad():
        loss, correct = linear_cross_entropy(hidden, weight, labels)
    torch.testing.assert_close(loss, reference(hidden, weight.detach(), labels)[0])
    assert not loss.requires_grad


def test_bf16_autocast_stays_close_to_the_plain_autocast_path():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(40, 16, generator=g)
    weight = torch.randn(50, 16, generator=g) * 0.2
    labels = torch.randint(0, 50, (40,), generator=g)
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_cross_entropy(h1, w1, labels, chunk_rows=16)
        ref, _ = reference(h2, w2, labels)
    loss.backward()
    ref.backward()
    assert loss.dtype == torch.float32 and w1.grad.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=1e-1)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=5e-2, atol=5e-2)


def test_bf16_probabilities_keep_confident_rows_and_the_plain_paths_accuracy():
    """bf16 autocast writes the softmax in bf16: the loss of every row stays within bf16's rounding of its exact value
    on the same bf16 logits, a confident row (p_target ~ 1 - 1e-4, whose bf16 p_target - 1 would be 0) keeps its
    gradient, and the number of correct predictions is the plain path's exactly."""
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(300, 32, generator=g) * 0.3
    labels = torch.randint(0, 300, (96,), generator=g)
    hidden = torch.randn(96, 32, generator=g)
    hidden[:32] = weight[labels[:32]] * 12.0  # confident and right
    hidden[32:40] = weight[(labels[32:40] + 1) % 300] * 12.0  # confident and wrong
    labels[::7] = -100
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, correct = linear_cross_entropy(h, w, labels, chunk_rows=40)
        logits = F.linear(hidden, weight)  # what the plain path would see: bf16 logits
    loss.backward()
    exact = F.cross_entropy(logits.double(), labels, ignore_index=-100, reduction="none")  # (N,) on the bf16 logits
    assert abs(float(loss.detach()) - float(exact.sum())) <= 2 ** -9 * float(exact.sum()) + 1e-3
    assert int(correct) == int(((logits.float().argmax(-1) == labels) & (labels != -100)).sum())
    probs = logits.double().softmax(-1)
    rows = torch.arange(96)
    confident = (probs[rows, labels.clamp(min=0)] > 1 - 1e-2) & (labels != -100)
    assert int(confident.sum()) >= 10
    want = probs.clone()
    want[rows, labels.clamp(min=0)] -= 1.0
    want[labels == -100] = 0.0
    want_h = want @ weight.bfloat16().double()  # dL/dh through the bf16 weight
    got = h.grad.double()
    # row by row, relative to the row's own size: a confident row's gradient is small, and without the target's
    # -(1 - p_t) (rounded away by a bf16 p_t - 1) it would point elsewhere
    errors = (got - want_h).norm(dim=-1) / want_h.norm(dim=-1).clamp(min=1e-12)
    assert float(errors[labels != -100].max()) < 0.05
    assert float(got[labels == -100].abs().max()) == 0.0


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"hidden \(N, D\), weight \(V, D\) and labels \(N,\)"):
        linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_rows must be positive"):
        linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), torch.zeros(4, dtype=torch.long), chunk_rows=0)


@pytest.mark.parametrize("tie", [True, False])
def test_the_causal_lm_objective_gives_the_same_loss_and_gradients_fused_or_not(tie):
    config = ModelConfig(arch="decoder", vocab_size=37, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16,
                         dropout=0.0, attention_dropout=0.0, norm_first=True, tie_embeddings=tie)
    torch.manual_seed(0)
    fused_model = Decoder(config)
    plain_model = Decoder(config)
    plain_model.load_state_dict(fused_model.state_dict())
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(4, 37, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[2, 6:] = 0
    labels = torch.roll(ids, -1, 1).masked_fill(mask == 0, -100)
    labels[:, -1] = -100
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    fused = CausalLMObjective()(fused_model, batch)
    plain = CausalLMObjective(fused=False)(plain_model, batch)
    torch.testing.assert_close(fused.losses["lm"][0], plain.losses["lm"][0], rtol=1e-5, atol=1e-5)
    assert fused.losses["lm"][1] == plain.losses["lm"][1] == int((labels != -100).sum())
    assert int(fused.metrics["lm_accuracy"][0]) == int(plain.metrics["lm_accuracy"][0])
    fused.losses["lm"][0].backward()
    plain.losses["lm"][0].backward()
    grads = dict(plain_model.named_parameters())
    for name, p in fused_model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_target_whose_probability_underflows_keeps_an_exact_finite_loss():
    """Training computes the loss from log(softmax) at the target; where that probability is below fp32's range
    (a confident wrong prediction: the target's logit about 200 below the best), the row falls back to logit -
    logsumexp, so the loss and the gradients stay autograd's through F.cross_entropy (finite, about 200)."""
    torch.manual_seed(3)
    hidden = torch.randn(6, 4, requires_grad=True)
    weight = torch.randn(9, 4)
    with torch.no_grad():
        h0 = hidden[0].detach()
        weight[2] = h0 * (200.0 / h0.dot(h0))  # row 0 scores token 2 at 200, far above the rest
    weight.requires_grad_(True)
    labels = torch.tensor([5, 1, 2, -100, 7, 0])
    with torch.no_grad():
        logits = F.linear(hidden, weight)
        assert torch.softmax(logits[0], -1)[5] == 0.0  # the fp32 probability underflows
    loss, correct = linear_cross_entropy(hidden, weight, labels, chunk_rows=4)
    loss.backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ref = F.cross_entropy(F.linear(ref_h, ref_w), labels, reduction="sum", ignore_index=-100)
    ref.backward()
    assert torch.isfinite(loss) and loss.item() > 100
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(hidden.grad, ref_h.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight.grad, ref_w.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("train", [True, False])
def test_the_correct_count_follows_argmax_on_ties(train):
    """The count comes from the others' maximum (amax), not argmax; rows where the target only ties the best must
    still count as argmax does: a hit only when no tied entry comes before the target."""
    hidden = torch.randn(8, 4)
    weight = torch.randn(6, 4)
    weight[3] = weight[1]  # tokens 1 and 3 always score the same
    weight[5] = weight[0]
    hidden[0] = weight[1] * 10  # rows 0-1 make 1 and 3 the (tied) best
    hidden[1] = weight[1] * 10
    labels = torch.tensor([1, 3, 0, 5, 2, 4, -100, 3])
    zero = torch.zeros(6, 4)  # every score equal: argmax is token 0 everywhere
    for w in (weight, zero):
        h = hidden.clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            _, correct = linear_cross_entropy(h, w, labels, chunk_rows=3)
        _, ref_correct = reference(hidden, w, labels)
        assert int(correct) == int(ref_correct)
    assert int(linear_cross_entropy(hidden, zero, labels)[1]) == 1  # only the row whose target is token 0


def test_the_default_chunk_on_a_cpu_is_deep_and_its_scores_stay_within_bounds():
    from lmforge.nn.kernels import linear_ce

    assert linear_ce.auto_chunk_rows(8000, "cpu") == linear_ce.CPU_CHUNK_ROWS  # the cap
    assert linear_ce.auto_chunk_rows(50257, "cpu") == linear_ce.CPU_CHUNK_ROWS  # GPT-2's vocabulary: 206 MB scores
    rows = linear_ce.auto_chunk_rows(250_000, "cpu")  # a multilingual vocabulary: the scores' byte budget
    assert rows * 250_000 * 4 <= linear_ce.CPU_SCORE_BYTES and rows >= linear_ce.MIN_CHUNK_ROWS and rows % 16 == 0
    assert linear_ce.auto_chunk_rows(50257, "cuda") == linear_ce.CHUNK_ROWS
