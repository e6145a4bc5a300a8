"""``lmforge train-seq2seq`` end to end on a toy reversal task (Transformer and attentional RNN)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from lmforge.cli import main
from lmforge.persistence import load_pretrained
from tests.toy_tasks import CITIES, NAMES

TINY = {"transformer-base": ["--model.d_model=16", "--model.n_heads=2", "--model.n_layers=1",
                             "--model.n_decoder_layers=1", "--model.d_ff=32", "--model.max_seq_len=32"],
        "rnn-seq2seq": ["--model.d_model=16", "--model.attention=additive"]}


def _pairs(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            words = rng.sample(NAMES + CITIES, 3)
            f.write(json.dumps({"source": " ".join(words), "target": " ".join(reversed(words))}) + "\n")
    return path


@pytest.mark.parametrize("preset", ["transformer-base", "rnn-seq2seq"])
def test_train_seq2seq_writes_the_best_model_and_test_scores(preset, tiny_encoder_dir, tmp_path, capsys):
    train, dev = _pairs(tmp_path / "train.jsonl", 24, 0), _pairs(tmp_path / "dev.jsonl", 6, 1)
    out = tmp_path / "run"
    code = main(["-q", "train-seq2seq", "--preset", preset, *TINY[preset], "--model.dropout=0.0", "--tokenizer",
                 str(tiny_encoder_dir), "--train", str(train), "--dev", str(dev), "--test", str(dev),
                 "--out", str(out), "--epochs", "2", "--batch-size", "8", "--lr", "3e-3",
                 "--train.warmup_steps=2", "--data.max_source_len=8", "--data.max_target_len=8",
                 "--decode.beams=2"])
    assert code == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert {"rouge1", "rouge2", "rougeL", "best_step"} <= set(results)
    test = json.loads((out / "test_results.json").read_text())
    assert test["examples"] == 6 and test["decode"]["beams"] == 2 and 0.0 <= test["rougeL"] <= 100.0
    lines = (out / "test_predictions.jsonl").read_text().splitlines()
    assert len(lines) == 6 and {"prediction", "reference"} <= set(json.loads(lines[0]))
    assert load_pretrained(out).config.arch == ("seq2seq" if preset == "transformer-base" else "rnn_seq2seq")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("tokens_per_s", 0) > 0 for r in records)
    # issue 23: the summary named the preset ("trained transformer-base") for a model resized to d_model 16
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"trained {preset} with ") and "d_model " in first and " -> 16" in first
    assert re.search(r", \d+\.\dk parameters for \d+ steps -> ", first)


def test_train_seq2seq_refuses_an_encoder_preset(tiny_encoder_dir, tmp_path, capsys):
    train = _pairs(tmp_path / "train.jsonl", 4, 0)
    assert main(["train-seq2seq", "--preset", "bert-tiny", "--tokenizer", str(tiny_encoder_dir), "--train",
                 str(train), "--out", str(tmp_path / "out")]) == 2
    assert "needs an encoder-decoder" in capsys.readouterr().err


def test_without_a_tokenizer_one_is_trained_on_the_pairs_and_saved_with_the_model(tmp_path, capsys):
    train, dev = _pairs(tmp_path / "train.jsonl", 24, 0), _pairs(tmp_path / "dev.jsonl", 4, 1)
    out = tmp_path / "run"
    assert main(["-q", "train-seq2seq", "--preset", "rnn-seq2seq", *TINY["rnn-seq2seq"], "--train", str(train),
                 "--dev", str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "8",
                 "--vocab-size", "120", "--decode.dev_strategy=beam", "--decode.beams=2"]) == 0
    assert "best dev at step 3 (beam)" in capsys.readouterr().out
    loaded = load_pretrained(out)
    assert loaded.tokenizer is not None and loaded.tokenizer.vocab_size <= 120
    assert set(loaded.tokenizer.tokenize("oslo")) <= set(loaded.tokenizer.vocab)  # learnt from the pairs
    assert main(["generate", "--model", str(out), "--prompt", "alice oslo bob", "--max-new-tokens", "4"]) == 0
