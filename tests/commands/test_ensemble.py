"""``lmforge evaluate`` / ``predict`` with several ``--model`` folders: the class probabilities of sequence
classifiers averaged (ULMFiT's forward + backward ensemble), and the clear errors of members that do not agree."""

from __future__ import annotations

import csv
import json

import pytest

from lmforge.cli import main
from lmforge.metrics import classification_metrics
from tests.toy_tasks import write_task_data


def finetune(model_dir, train, out, *extra: str) -> None:
    assert main(["-q", "finetune", "--task", "sequence", "--model", str(model_dir), "--train", str(train), "--out",
                 str(out), "--max-steps", "3", "--batch-size", "8", "--lr", "3e-3", "--max-length", "32",
                 "--train.log_every=5", *extra]) == 0


def predict(models: list[str], data, out) -> list[dict]:
    assert main(["-q", "predict", *[a for m in models for a in ("--model", str(m))], "--input", str(data),
                 "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def classifiers(tiny_encoder_dir, tmp_path_factory):
    """Two sequence classifiers of the same labels (other seeds), their dev file, and the root folder."""
    root = tmp_path_factory.mktemp("ensemble")
    train, dev = write_task_data(root, "sequence")
    for seed in ("0", "1"):
        finetune(tiny_encoder_dir, train, root / f"clf{seed}", "--seed", seed)
    return root / "clf0", root / "clf1", dev, root


def test_the_ensemble_averages_the_members_probabilities(classifiers, tmp_path, capsys):
    a, b, dev, _ = classifiers
    pa, pb = predict([a], dev, tmp_path / "a.jsonl"), predict([b], dev, tmp_path / "b.jsonl")
    # repeated --model, or one comma list: the same ensemble
    both = predict([a, b], dev, tmp_path / "ab.jsonl")
    assert predict([f"{a},{b}"], dev, tmp_path / "ab2.jsonl") == both
    assert len(both) == len(pa) == 16
    for ra, rb, r in zip(pa, pb, both, strict=True):
        assert r["text"] == ra["text"] and set(r["probabilities"]) == {"neg", "pos"}
        for label in ("neg", "pos"):
            assert r["probabilities"][label] == pytest.approx((ra["probabilities"][label] +
                                                               rb["probabilities"][label]) / 2, abs=1e-6)
        assert r["label"] == max(r["probabilities"], key=r["probabilities"].get)
        assert r["score"] == pytest.approx(r["probabilities"][r["label"]])
    assert any(ra["probabilities"]["pos"] != pytest.approx(rb["probabilities"]["pos"], abs=1e-4)
               for ra, rb in zip(pa, pb, strict=True))  # the members differ, so the check above means something
    # evaluate scores the averaged labels
    capsys.readouterr()
    assert main(["-q", "evaluate", "--model", str(a), "--model", str(b), "--test", str(dev)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    with open(dev, newline="", encoding="utf-8") as f:
        gold = [row["label"] for row in csv.DictReader(f)]
    assert metrics == pytest.approx(classification_metrics(gold, [r["label"] for r in both]))


def test_members_that_do_not_agree_are_refused(classifiers, tiny_encoder_dir, tmp_path, capsys):
    a, _, dev, root = classifiers
    # other labels: the same texts, labels renamed
    with open(root / "sequence-train.csv", newline="", encoding="utf-8") as f:
        rows = [{**r, "label": {"pos": "good", "neg": "bad"}[r["label"]]} for r in csv.DictReader(f)]
    other = tmp_path / "other.csv"
    with open(other, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["text", "label"])
        writer.writeheader()
        writer.writerows(rows)
    finetune(tiny_encoder_dir, other, tmp_path / "renamed")
    capsys.readouterr()
    assert main(["evaluate", "--model", str(a), "--model", str(tmp_path / "renamed"), "--test", str(dev)]) != 0
    err = capsys.readouterr().err
    assert "the ensemble's label sets differ" in err and str(a) in err and str(tmp_path / "renamed") in err
    # another task
    train, _ = write_task_data(tmp_path / "tok", "token", n_train=8, n_dev=2)
    assert main(["-q", "finetune", "--task", "token", "--model", str(tiny_encoder_dir), "--train", str(train),
                 "--out", str(tmp_path / "tagger"), "--max-steps", "1", "--batch-size", "8", "--max-length", "32"]) == 0
    capsys.readouterr()
    out = tmp_path / "p.jsonl"
    assert main(["predict", "--model", f"{a},{tmp_path / 'tagger'}", "--input", str(dev), "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'tagger'}: a model fine-tuned for 'token'; an ensemble" in err and not out.exists()


def test_forward_and_backward_awd_lstm_classifiers(tmp_path):
    """ULMFiT's ensemble: a classifier on a forward and one on a backward AWD-LSTM; the flag travels from the
    backbone folder through fine-tuning to prediction."""
    import torch

    from lmforge.config import ModelConfig
    from lmforge.models.awd_lstm import AWDLSTM
    from lmforge.persistence import load_pretrained, save_pretrained
    from lmforge.tokenizers import WordPieceTokenizer
    from tests.toy_tasks import vocab

    tokenizer = WordPieceTokenizer(vocab())
    train, dev = write_task_data(tmp_path, "sequence", n_train=16, n_dev=6)
    runs = []
    for name, reverse in (("fwd", False), ("bwd", True)):
        torch.manual_seed(0)
        config = ModelConfig(arch="awd_lstm", vocab_size=tokenizer.vocab_size, d_model=8, d_hidden=8, n_layers=1,
                             reverse=reverse)
        save_pretrained(AWDLSTM(config), tmp_path / f"lm_{name}", tokenizer=tokenizer)
        finetune(tmp_path / f"lm_{name}", train, tmp_path / f"clf_{name}")
        assert load_pretrained(tmp_path / f"clf_{name}").model.backbone.config.reverse is reverse
        runs.append(tmp_path / f"clf_{name}")
    fwd, bwd = (predict([r], dev, tmp_path / f"{r.name}.jsonl") for r in runs)
    both = predict(runs, dev, tmp_path / "both.jsonl")
    for rf, rb, r in zip(fwd, bwd, both, strict=True):
        assert r["probabilities"]["pos"] == pytest.approx((rf["probabilities"]["pos"] + rb["probabilities"]["pos"])
                                                          / 2, abs=1e-6)
    assert any(rf["probabilities"]["pos"] != pytest.approx(rb["probabilities"]["pos"], abs=1e-6)
               for rf, rb in zip(fwd, bwd, strict=True))  # the backward model reads the texts otherwise
