"""SpanBERT at long sequences with long words: spans are drawn in words but the span-boundary objective indexes
its position table by word piece; the SBO predicts a span's first ``max_span_len`` pieces (SpanBERT's code)."""

import itertools

import numpy as np
import pytest
import torch

from lmforge.config import DataConfig, ModelConfig
from lmforge.data.shards import ShardedCorpus, prepare_corpus
from lmforge.heads import TaskModel, build_head
from lmforge.models.encoder import Encoder
from lmforge.objectives.registry import get_objective

from .conftest import SYLLABLES, write_lines_file
from .test_pretraining import data_for


def long_word_documents(n_docs: int, seed: int) -> list[list[str]]:
    """Sentences of words of 5-12 syllables: each word splits into several pieces of the small vocabulary."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        doc = []
        for _ in range(rng.integers(20, 40)):
            words = ["".join(rng.choice(SYLLABLES, size=rng.integers(5, 13))) for _ in range(rng.integers(4, 12))]
            sentence = " ".join(words)
            doc.append(sentence[0].upper() + sentence[1:] + ".")
        docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def long_word_corpus(tmp_path_factory, tokenizer_dir) -> ShardedCorpus:
    root = tmp_path_factory.mktemp("long-words")
    write_lines_file(root / "text" / "docs.txt", long_word_documents(12, seed=4))
    prepare_corpus(tokenizer_dir, [root / "text"], root / "prepared", workers=1, show_progress=False)
    return ShardedCorpus(root / "prepared", tokenizer_dir)


def span_model(cfg: DataConfig, vocab_size: int) -> tuple[TaskModel, object]:
    """A tiny encoder with the span head as the pretraining recipe builds it (head options from the registry)."""
    objective = get_objective("span")
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=cfg.seq_len,
                         dropout=0.0, attention_dropout=0.0)
    backbone = Encoder(config)
    return TaskModel(backbone, build_head(objective.head_spec(cfg), config, backbone)), objective.loss(cfg)


@pytest.mark.parametrize("seq_len", [128, 512])
def test_span_batches_with_long_words_train_the_span_head(long_word_corpus, tokenizer, seq_len):
    cfg = DataConfig(seq_len=seq_len, objective="span", eval_fraction=0.0)
    data = data_for(long_word_corpus, cfg, tokenizer, seed=2)
    batches = list(itertools.islice(data.batches(4), 6))
    longest = 0
    for batch in batches:
        labels, left = batch["mlm_labels"], batch["sbo_left"]
        predicted, sbo = labels != -100, (labels != -100) & (left >= 0)
        offset = batch["sbo_offset"]
        assert (offset[sbo] < cfg.max_span_len).all()  # every SBO target fits the head's position table
        assert (batch["sbo_right"][predicted & ~sbo] == -1).all() and (offset[predicted & ~sbo] == 0).all()
        # spans (runs of predicted tokens sharing a left boundary) of more than max_span_len pieces occur, and their
        # first max_span_len pieces are SBO targets
        for row in range(len(labels)):
            starts = left[row][sbo[row]]
            for s in starts.unique().tolist():
                span = torch.arange(s + 1, int(batch["sbo_right"][row][left[row] == s][0]))
                assert predicted[row, span].all()
                assert sbo[row, span].sum() == min(len(span), cfg.max_span_len)
                longest = max(longest, len(span))
    assert longest > cfg.max_span_len  # long words make spans of more pieces than the position table has rows
    model, objective = span_model(cfg, tokenizer.vocab_size)
    batch = batches[0]
    counts = objective.counts(batch)
    assert counts["sbo"] < counts["mlm"]  # the pieces past the table are MLM-only
    out = objective(model, batch)
    assert out.losses["mlm"][1] == counts["mlm"] and out.losses["sbo"][1] == counts["sbo"]
    loss = sum(total / n for total, n in out.losses.values())
    assert torch.isfinite(loss)
    loss.backward()
    position = model.head.sbo.position.weight
    assert position.shape == (cfg.max_span_len, 16)  # the saved head's shape is unchanged
    assert position.grad is not None and position.grad.abs().sum() > 0


def test_an_old_span_head_state_dict_still_loads(tokenizer):
    cfg = DataConfig(seq_len=128, objective="span")
    model, _ = span_model(cfg, tokenizer.vocab_size)
    state = {k: v.clone() for k, v in model.head.state_dict().items()}
    again, _ = span_model(cfg, tokenizer.vocab_size)
    again.head.load_state_dict(state)
    assert again.head.sbo.position.weight.shape == (10, 16)
