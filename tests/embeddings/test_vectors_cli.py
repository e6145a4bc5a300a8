"""``lmforge word2vec train``, ``lmforge glove train`` and ``lmforge vectors evaluate`` end to end, with the bad
inputs a user can give."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmforge import cli
from lmforge.commands import vectors as vectors_cmd
from lmforge.embeddings import sgns
from lmforge.embeddings.io import load_word2vec, save_word2vec
from lmforge.embeddings.vectors import KeyedVectors
from tests.embeddings.synthetic import planted_corpus

# The commands as lmforge.cli registers them (set here too, so these tests do not depend on the table's state).
COMMANDS = {
    "word2vec train": ("train Word2Vec (skip-gram or CBOW, negative sampling) on text files",
                       vectors_cmd.add_word2vec_arguments, vectors_cmd.run_word2vec_train),
    "glove train": ("train GloVe on text files", vectors_cmd.add_glove_arguments, vectors_cmd.run_glove_train),
    "vectors evaluate": ("score word vectors on word-pair similarities or analogies",
                         vectors_cmd.add_evaluate_arguments, vectors_cmd.run_evaluate),
}


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    for name, command in COMMANDS.items():
        monkeypatch.setitem(cli.COMMANDS, name, command)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    sentences = [" ".join(s).capitalize() + "." for s in planted_corpus(600)]
    (folder / "a.txt").write_text("\n".join(sentences[:300]) + "\n", encoding="utf-8")
    (folder / "b.txt").write_text("\n".join(sentences[300:]) + "\n", encoding="utf-8")
    return folder


def test_word2vec_train_and_evaluate(tmp_path, corpus, capsys):
    out = tmp_path / "w2v.txt"
    args = ["word2vec", "train", "--input", str(corpus), "--out", str(out), "--dim", "12", "--window", "3",
            "--negative", "4", "--min-count", "2", "--epochs", "3", "--workers", "1"]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    assert "word2vec skipgram:" in captured.out and "epoch 3/3: loss" in captured.err
    kv = load_word2vec(out)
    assert kv.vectors.shape[1] == 12 and "automobile" in kv and "." not in kv  # punctuation dropped
    records = [json.loads(line) for line in (tmp_path / "w2v.metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3] and all(r["loss"] > 0 for r in records)

    # refuses to overwrite, then replaces with --overwrite (CBOW, binary this time)
    assert cli.main(args) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli.main([*args, "--cbow", "--binary", "--overwrite"]) == 0
    assert "word2vec cbow:" in capsys.readouterr().out
    assert load_word2vec(out, binary=True).vectors.shape == kv.vectors.shape

    pairs = tmp_path / "pairs.txt"
    pairs.write_text("car automobile 10\nfilm movie 9.5\ncar movie 1\nsong cash 0.5\nunicorn car 3\n",
                     encoding="utf-8")
    assert cli.main(["vectors", "evaluate", str(out), "--pairs", str(pairs)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pairs"] == 4 and report["oov_pairs"] == 1 and -1 <= report["spearman"] <= 1

    questions = tmp_path / "questions.txt"
    questions.write_text(": synonyms\ncar automobile film movie\nfilm movie song tune\ncar unicorn a b\n",
                         encoding="utf-8")
    assert cli.main(["vectors", "evaluate", str(out), "--analogies", str(questions)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["questions"] == 2 and report["oov_questions"] == 1
    assert report["sections"]["synonyms"]["questions"] == 2


def test_glove_train(tmp_path, corpus, capsys):
    out = tmp_path / "glove.txt"
    assert cli.main(["glove", "train", "--input", str(corpus / "a.txt"), str(corpus / "b.txt"), "--out", str(out),
                     "--dim", "10", "--window", "4", "--min-count", "1", "--epochs", "4", "--x-max", "10",
                     "--workers", "2"]) == 0
    captured = capsys.readouterr()
    assert "glove:" in captured.out and "epoch 4/4: loss" in captured.err
    kv = load_word2vec(out)
    assert kv.vectors.shape[1] == 10 and np.isfinite(kv.vectors).all()
    assert len((tmp_path / "glove.metrics.jsonl").read_text().splitlines()) == 4


def test_empty_corpus(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("\n  \n!!! ...\n", encoding="utf-8")
    for command in (["word2vec", "train"], ["glove", "train"]):
        assert cli.main([*command, "--input", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "v.txt")]) == 2
        assert "holds no words" in capsys.readouterr().err
    assert not (tmp_path / "v.txt").exists()


def test_min_count_removing_every_word(tmp_path, capsys):
    (tmp_path / "small.txt").write_text("a rose is a rose\n", encoding="utf-8")
    assert cli.main(["word2vec", "train", "--input", str(tmp_path / "small.txt"), "--out", str(tmp_path / "v.txt"),
                     "--min-count", "3"]) == 2
    err = capsys.readouterr().err
    assert "min_count=3 removes every word" in err and "lower --min-count to at most 2" in err


def test_missing_input(tmp_path, capsys):
    assert cli.main(["word2vec", "train", "--input", str(tmp_path / "nope"), "--out", str(tmp_path / "v.txt")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_evaluate_vectors_file_with_a_bad_header(tmp_path, capsys):
    path = tmp_path / "v.txt"
    save_word2vec(KeyedVectors(["a", "b", "c"], np.eye(3)), path)
    path.write_text(path.read_text().replace("3 3\n", "4 3\n", 1))
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("a b 1\n", encoding="utf-8")
    assert cli.main(["vectors", "evaluate", str(path), "--pairs", str(pairs)]) == 2
    err = capsys.readouterr().err
    assert f"{path}, line 5: the header says 4 vectors but the file ends after 3" in err
    assert cli.main(["vectors", "evaluate", str(path)]) == 2  # argparse: --pairs or --analogies is required
    assert "one of the arguments --pairs --analogies is required" in capsys.readouterr().err


def test_evaluate_refuses_vectors_that_hold_nan(tmp_path, capsys):
    """Issue 23: NaN vectors (a diverged training) were scored, Spearman -0.8; now they are refused by name."""
    path = tmp_path / "v.txt"
    path.write_text("3 2\nking nan nan\nqueen 0.5 0.1\nman 0.2 inf\n", encoding="utf-8")
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("king queen 8.5\nqueen man 3.0\nking man 5.0\n", encoding="utf-8")
    assert cli.main(["vectors", "evaluate", str(path), "--pairs", str(pairs)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: 2 of 3 vectors hold NaN or infinite values ('king', 'man')" in err and "Train them again" in err
    assert "spearman" not in capsys.readouterr().out


def test_a_diverging_word2vec_run_exits_2_and_writes_nothing(tmp_path, corpus, capsys):
    """A non-finite loss stops training with exit status 2 and a message naming the option, never "final loss nan"
    with exit 0 and NaN vectors on disk."""
    out = tmp_path / "w2v.txt"
    mode = ["--mode", "exact"] if sgns.available() else ["--mode", "fast", "--share-negatives", "1"]
    code = cli.main(["word2vec", "train", "--input", str(corpus), "--out", str(out), "--dim", "8", "--min-count",
                     "1", "--workers", "1", "--lr", "50", "--min-lr", "0", *mode])
    captured = capsys.readouterr()
    if code == 0:  # the batched mode's damping bounds every step: even this rate stays finite there
        assert not sgns.available() and np.isfinite(load_word2vec(out).vectors).all()
        return
    assert code == 2 and "word2vec diverged: the loss became nan in epoch 1" in captured.err
    assert "--lr; now 50" in captured.err and "final loss" not in captured.out
    assert not out.exists() and not (tmp_path / "w2v.metrics.jsonl").exists()
