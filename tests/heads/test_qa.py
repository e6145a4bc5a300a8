"""Extractive QA head: masking, loss, label checks, builder, and a tiny encoder that learns a toy QA task."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.data.qa_features import collate_qa, decode_qa, featurize_qa
from lmforge.errors import LmforgeError
from lmforge.heads.base import TaskModel
from lmforge.heads.qa import QAOutput, QuestionAnsweringHead, build_qa_head
from lmforge.models.encoder import Encoder
from lmforge.tokenizers import WordPieceTokenizer

B, T, D = 3, 7, 12


def encoder_output(seed: int = 0) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(last_hidden_state=torch.randn(B, T, D, generator=g))


def head(seed: int = 0, **kwargs) -> QuestionAnsweringHead:
    torch.manual_seed(seed)
    h = QuestionAnsweringHead(D, **kwargs)
    with torch.no_grad():
        h.qa_outputs.bias.normal_()  # a non-zero bias, so a forgotten bias shows
    return h


def context_mask() -> torch.Tensor:
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, 0] = True  # [CLS]
    mask[0, 3:6] = True
    mask[1, 2:7] = True
    mask[2, 4:5] = True
    return mask


def test_logits_are_a_linear_map_and_masked_positions_never_win() -> None:
    h, out = head(), encoder_output()
    raw = out.last_hidden_state @ h.qa_outputs.weight.T + h.qa_outputs.bias  # (B, T, 2)
    plain = h(out)
    assert isinstance(plain, QAOutput) and plain.loss_sum is None and plain.loss_count == 0
    torch.testing.assert_close(plain.start_logits, raw[..., 0])
    torch.testing.assert_close(plain.end_logits, raw[..., 1])
    mask = context_mask()
    masked = h(out, context_mask=mask.long())  # 0/1 integers work as well as bools
    torch.testing.assert_close(masked.start_logits[mask], raw[..., 0][mask])
    assert (masked.start_logits[~mask] == torch.finfo(torch.float32).min).all()
    assert (masked.end_logits[~mask] == torch.finfo(torch.float32).min).all()
    assert mask.gather(1, masked.start_logits.argmax(1, keepdim=True)).all()
    assert torch.isfinite(masked.start_logits.softmax(-1)).all()


def test_loss_is_the_mean_of_start_and_end_cross_entropy_over_allowed_positions() -> None:
    h, out, mask = head(), encoder_output(), context_mask()
    starts, ends = torch.tensor([4, 0, 4]), torch.tensor([5, 6, 4])
    result = h(out, start_positions=starts, end_positions=ends, context_mask=mask)
    raw = out.last_hidden_state @ h.qa_outputs.weight.T + h.qa_outputs.bias
    expected = 0.0
    for b in range(B):  # cross-entropy over this row's allowed positions only
        allowed = mask[b].nonzero().squeeze(1)
        for k, gold in ((0, starts[b]), (1, ends[b])):
            logp = F.log_softmax(raw[b, allowed, k], dim=0)
            expected = expected - logp[(allowed == gold).nonzero().item()] / 2
    torch.testing.assert_close(result.loss_sum, expected)
    assert result.loss_count == B
    result.loss_sum.backward()
    assert h.qa_outputs.weight.grad is not None and h.qa_outputs.weight.grad.abs().sum() > 0
    # Without a mask every position competes.
    unmasked = h(out, start_positions=starts, end_positions=ends)
    manual = (F.cross_entropy(raw[..., 0], starts, reduction="sum")
              + F.cross_entropy(raw[..., 1], ends, reduction="sum")) / 2
    torch.testing.assert_close(unmasked.loss_sum, manual)


def test_loss_under_bf16_autocast_is_finite() -> None:
    h, out, mask = head(), encoder_output(), context_mask()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result = h(out, torch.tensor([0, 2, 4]), torch.tensor([0, 6, 4]), context_mask=mask)
    assert result.start_logits.dtype == torch.bfloat16 and torch.isfinite(result.loss_sum)


def test_dropout_acts_in_training_only() -> None:
    h, out = head(dropout=0.5), encoder_output()
    h.train()
    assert not torch.equal(h(out).start_logits, h(out).start_logits)
    h.eval()
    assert torch.equal(h(out).start_logits, h(out).start_logits)


def test_bad_labels_and_masks_are_user_errors() -> None:
    h, out, mask = head(), encoder_output(), context_mask()
    with pytest.raises(LmforgeError, match="both start_positions and end_positions"):
        h(out, start_positions=torch.zeros(B, dtype=torch.long))
    with pytest.raises(LmforgeError, match=r"end_positions\[1\] = 1 is outside context_mask"):
        h(out, torch.zeros(B, dtype=torch.long), torch.tensor([0, 1, 0]), context_mask=mask)
    with pytest.raises(LmforgeError, match=r"lie in \[0, 7\)"):
        h(out, torch.tensor([0, 7, 0]), torch.zeros(B, dtype=torch.long))
    with pytest.raises(LmforgeError, match="must be \\(batch=3,\\)"):
        h(out, torch.zeros(B, 1, dtype=torch.long), torch.zeros(B, 1, dtype=torch.long))
    with pytest.raises(LmforgeError, match="integer"):
        h(out, torch.zeros(B), torch.zeros(B))
    with pytest.raises(LmforgeError, match="context_mask must be"):
        h(out, context_mask=mask[:, :5])
    with pytest.raises(LmforgeError, match="dropout"):
        QuestionAnsweringHead(D, dropout=1.0)


def test_builder_state_dict_and_task_model() -> None:
    cfg = ModelConfig(vocab_size=29, d_model=D, n_heads=3, n_layers=1, d_ff=37, max_seq_len=16, init_std=0.05)
    torch.manual_seed(0)
    encoder = Encoder(cfg)
    qa = build_qa_head(cfg, encoder, dropout=0.1)
    assert set(qa.state_dict()) == {"qa_outputs.weight", "qa_outputs.bias"}
    assert qa.qa_outputs.weight.shape == (2, D) and qa.dropout.p == 0.1
    assert qa.qa_outputs.weight.std().item() == pytest.approx(0.05, rel=0.5) and not qa.qa_outputs.bias.any()
    model = TaskModel(encoder, qa).eval()
    ids = torch.randint(5, 29, (B, T))
    result = model(ids, torch.ones(B, T, dtype=torch.long), None, start_positions=torch.tensor([0, 3, 4]),
                   end_positions=torch.tensor([0, 5, 4]), context_mask=context_mask())
    assert result.start_logits.shape == (B, T) and result.loss_sum.ndim == 0


# ------------------------------------------------------------------------------------------------ overfitting
WORDS = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po"]


@dataclass(frozen=True)
class Example:
    """A local stand-in with the fields of ``lmforge.data.readers.QAExample``."""

    id: str
    title: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False


def toy_examples(n: int, seed: int) -> list[Example]:
    """The answer is the word right after the marker "zz" (finding it needs attention to the previous token)."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        words = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(4, 9)))]
        at = int(rng.integers(0, len(words)))
        words.insert(at, "zz")
        context = " ".join(words) + "."
        answer = words[at + 1] if at + 1 < len(words) else None
        if answer is None:  # the marker ended the sentence: no answer
            examples.append(Example(f"q{i}", "toy", "which ?", context, (), True))
            continue
        start = len(" ".join(words[:at + 1])) + 1
        examples.append(Example(f"q{i}", "toy", "which ?", context, ((answer, start),)))
    return examples


def _learn_marked_word(model_seed: int, max_steps: int = 400) -> list[float]:
    """Train a tiny encoder + QA head on the toy task; the exact-match scores every 10 steps (stops at 1.0)."""
    tok = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "zz", "which", "?", "."])
    examples = toy_examples(24, seed=0)
    # 7 context tokens per window, starts 3 apart: most contexts span 2-3 windows, so the labels (0, 0) for
    # windows without the answer, max-context scoring and the null answer all take part.
    features = featurize_qa(examples, tok, max_length=12, doc_stride=3, training=True)
    assert len(features) > len(examples) + 10
    batch = collate_qa(features, tok.pad_id)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=D, n_heads=2, n_layers=2, d_ff=37, max_seq_len=16,
                      dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(model_seed)
    model = TaskModel(Encoder(cfg), QuestionAnsweringHead(D))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gold = {e.id: e.answers[0][0] if e.answers else "" for e in examples}

    def exact_match() -> float:
        model.eval()
        with torch.no_grad():
            out = model(**{k: v for k, v in batch.items() if not k.endswith("_positions")})
        model.train()
        predictions = decode_qa(examples, features, out.start_logits, out.end_logits, version_2=True)
        return float(np.mean([predictions[k]["text"] == v for k, v in gold.items()]))

    scores = [exact_match()]
    for step in range(1, max_steps + 1):
        optimizer.zero_grad()
        result = model(**batch)
        (result.loss_sum / result.loss_count).backward()
        optimizer.step()
        if step % 10 == 0:
            scores.append(exact_match())
            if scores[-1] == 1.0:
                break
    return scores


def test_tiny_encoder_learns_to_extract_the_marked_word() -> None:
    """Learning, not one numerical trajectory: the exact path of Adam on 2 layers depends on the CPU's kernels
    (ATEN_CPU_CAPABILITY), so one seed that converges quickly on one CPU may stall on another. Three model seeds,
    up to 400 steps each, stopping at the first perfect score (seeds 0-5 took 70-140 steps with avx2, 100-300 with
    the default kernels, where one of the six did not get there in 400): at least two must reach exact match 1.0
    from an untrained start below 0.5. A broken head, loss, mask or decoder fails all three."""
    runs = {}
    for seed in (0, 1, 2):
        runs[seed] = _learn_marked_word(seed)
        if sum(r[-1] == 1.0 for r in runs.values()) >= 2:
            break
    assert all(r[0] < 0.5 for r in runs.values()), runs
    assert sum(r[-1] == 1.0 for r in runs.values()) >= 2, runs
