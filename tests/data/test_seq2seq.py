"""Seq2seq pairs: readers, the fixed BBC headline split, features and batches; the label-smoothed objective."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.data.seq2seq import (
    Seq2SeqExample,
    bbc_headlines,
    collate_pairs,
    featurize_pairs,
    headline_split,
    read_pairs,
)
from lmforge.errors import InputFileError
from lmforge.models import EncoderDecoder
from lmforge.objectives import Seq2SeqObjective
from lmforge.tokenizers import WordPieceTokenizer
from tests.toy_tasks import vocab

TOK = WordPieceTokenizer(vocab())


def test_read_pairs_formats_and_errors(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"source": "alice lives in paris", "target": "paris"}) + "\n\n")
    assert [(e.source, e.target, e.line) for e in read_pairs(jsonl)] == [("alice lives in paris", "paris", 1)]
    tsv = tmp_path / "p.tsv"
    tsv.write_text("src\ttgt\nalice\tbob\n")
    assert read_pairs(tsv, source_column="src", target_column="tgt")[0].target == "bob"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"source": "x", "target": "y"}) + "\n" + json.dumps({"text": "x"}) + "\n")
    with pytest.raises(InputFileError, match=r"bad.jsonl:2: no 'source' field"):
        read_pairs(bad)
    assert read_pairs(jsonl, target_column="missing", require_targets=False)[0].target is None
    (tmp_path / "p.txt").write_text("x")
    with pytest.raises(InputFileError, match="unknown format"):
        read_pairs(tmp_path / "p.txt")


def test_features_shift_the_target_and_batches_pad(tmp_path):
    examples = [Seq2SeqExample("alice lives in paris", "paris"), Seq2SeqExample("bob", "bob lives in rome today")]
    features, cut_src, cut_tgt = featurize_pairs(examples, TOK, max_source_len=3, max_target_len=5)
    assert (cut_src, cut_tgt) == (1, 1)
    assert features[0]["tgt_ids"] == [TOK.cls_id, TOK.vocab["paris"], TOK.sep_id]
    assert features[1]["tgt_ids"] == [TOK.cls_id, *(TOK.vocab[w] for w in ("bob", "lives", "in")), TOK.sep_id]
    batch = collate_pairs(features, TOK.pad_id)
    assert batch["src_ids"].shape == (2, 3) and batch["src_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["tgt_ids"][1].tolist() == features[1]["tgt_ids"][:-1]
    assert batch["labels"][1].tolist() == features[1]["tgt_ids"][1:]
    assert batch["labels"][0].tolist() == [TOK.vocab["paris"], TOK.sep_id, -100, -100]
    assert batch["tgt_mask"][0].tolist() == [1, 1, 0, 0]


def test_bbc_headline_split_is_fixed_disjoint_and_per_topic(bbc_dir):
    examples = bbc_headlines(bbc_dir)
    assert len(examples) == 2225 and all(e.target and e.source for e in examples)
    train, dev, test = headline_split(examples)
    assert headline_split(examples) == (train, dev, test)
    assert not (set(train) & set(dev) or set(train) & set(test) or set(dev) & set(test))
    assert len(train) + len(dev) + len(test) == len(examples)
    topics = {e.group for e in examples}
    assert {examples[i].group for i in test} == topics and abs(len(test) - 222) <= 5


def test_label_smoothing_matches_the_formula():
    torch.manual_seed(0)
    config = ModelConfig(arch="seq2seq", vocab_size=TOK.vocab_size, d_model=12, n_heads=2, n_layers=1, d_ff=37,
                         max_seq_len=16, dropout=0.0, attention_dropout=0.0)
    model = EncoderDecoder(config)
    features, _, _ = featurize_pairs([Seq2SeqExample("alice lives in paris", "paris"),
                                      Seq2SeqExample("bob", "bob lives")], TOK, max_source_len=8, max_target_len=8)
    batch = collate_pairs(features, TOK.pad_id)
    losses, metrics = Seq2SeqObjective(0.1)(model, batch)
    loss, n = losses["seq2seq"]
    logits = model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"], batch["tgt_mask"]).logits
    logp = logits.log_softmax(-1)
    valid = batch["labels"] != -100
    gold = logp.gather(-1, batch["labels"].clamp(min=0)[..., None])[..., 0]
    expected = -(0.9 * gold + 0.1 * logp.mean(-1))[valid].sum()
    torch.testing.assert_close(loss, expected)
    assert n == 5 == Seq2SeqObjective().counts(batch)["seq2seq"]
    torch.testing.assert_close(metrics["nll"][0], -gold[valid].sum())
    unsmoothed = F.cross_entropy(logits[valid], batch["labels"][valid], reduction="sum")
    assert float(unsmoothed.detach()) == pytest.approx(float(metrics["nll"][0]), rel=1e-5)
