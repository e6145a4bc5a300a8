"""``lmforge finetune`` / ``evaluate`` / ``predict`` end to end on toy data with a tiny encoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.models.pretrained import load_pretrained
from tests.toy_tasks import write_conll, write_sequence, write_squad, write_task_data

METRICS = {"sequence": {"accuracy", "f1", "mcc"}, "pair": {"accuracy", "f1", "mcc"},
           "token": {"precision", "recall", "f1", "accuracy"}, "span": {"precision", "recall", "f1"},
           "qa": {"exact_match", "f1"}}
RECORD_KEYS = {"sequence": {"text", "label", "score", "probabilities"}, "pair": {"text", "text_pair", "label"},
               "token": {"tokens", "tags", "entities"}, "span": {"tokens", "spans"},
               "qa": {"id", "question", "answer", "start", "end", "score"}}


def _run(*args: str) -> int:
    return main(["-q", *args])


@pytest.mark.parametrize("task", ["sequence", "pair", "token", "span", "qa"])
def test_finetune_evaluate_predict_round_trip(task, finetuned, tmp_path, capsys):
    out, train, dev = finetuned(task)
    results = json.loads((out / "eval_results.json").read_text())
    assert METRICS[task] <= set(results)
    assert 1 <= results["best_step"] <= results["last_step"]
    # the folder holds the best model: evaluating it again gives the recorded dev metrics exactly
    capsys.readouterr()
    assert _run("evaluate", "--model", str(out), "--data", str(dev)) == 0
    again = json.loads(capsys.readouterr().out)
    for name in METRICS[task]:
        assert again[name] == pytest.approx(results[name], abs=1e-9), name
    # predict: one JSON line per input, in input order
    predictions = tmp_path / "pred.jsonl"
    assert _run("predict", "--model", str(out), "--input", str(dev), "--output", str(predictions)) == 0
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(lines) == 16 and RECORD_KEYS[task] <= set(lines[0])
    # the folder loads with its head, labels and task settings
    loaded = load_pretrained(out)
    assert loaded.head["task"]["task"] == task and loaded.tokenizer is not None
    assert not (out / "best").exists()  # promoted into the run folder at the end


@pytest.mark.parametrize("task, metric, floor", [("sequence", "accuracy", 0.9), ("token", "f1", 0.9),
                                                 ("span", "f1", 0.8)])
def test_toy_tasks_are_learned(task, metric, floor, finetuned):
    out, _, _ = finetuned(task)
    assert json.loads((out / "eval_results.json").read_text())[metric] >= floor


def test_best_model_is_kept_not_the_last(finetuned):
    out, _, _ = finetuned("sequence")
    results = json.loads((out / "eval_results.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "accuracy" in r]
    assert len(evals) == 12  # one evaluation per epoch
    best = max(evals, key=lambda r: r["accuracy"])
    assert results["accuracy"] == best["accuracy"]
    first_best = next(r for r in evals if r["accuracy"] == best["accuracy"])
    assert results["best_step"] == first_best["step"]  # ties keep the earlier model


def test_token_predictions_use_the_file_tags(finetuned, tmp_path):
    out, _, dev = finetuned("token")
    predictions = tmp_path / "tags.jsonl"
    _run("predict", "--model", str(out), "--input", str(dev), "--output", str(predictions))
    record = json.loads(predictions.read_text().splitlines()[0])
    assert len(record["tags"]) == len(record["tokens"])
    assert set(record["tags"]) <= {"O", "B-PER", "I-PER", "B-LOC"}
    for entity in record["entities"]:
        assert entity["text"] == " ".join(record["tokens"][entity["start"]:entity["end"]])


def test_crf_head_is_saved_with_its_options(finetuned):
    out, _, _ = finetuned("token")
    loaded = load_pretrained(out)
    assert loaded.head["crf"] is True and loaded.head["scheme"] == "BIO"
    assert loaded.model.head.crf is not None


def test_predict_refuses_to_overwrite(finetuned, tmp_path, capsys):
    out, _, dev = finetuned("sequence")
    target = tmp_path / "p.jsonl"
    target.write_text("keep me\n")
    assert _run("predict", "--model", str(out), "--input", str(dev), "--output", str(target)) == 2
    assert "already exists" in capsys.readouterr().err and target.read_text() == "keep me\n"


# ------------------------------------------------------------------------------------------------ bad input
def _finetune(tiny_encoder_dir: Path, task: str, train: Path, dev: Path | None, out: Path, *extra: str) -> int:
    args = ["finetune", "--task", task, "--model", str(tiny_encoder_dir), "--train", str(train), "--out", str(out),
            "--epochs", "1", "--batch-size", "8", "--max-length", "32", *extra]
    return _run(*args, *(["--dev", str(dev)] if dev else []))


def test_dev_label_never_seen_in_training_names_file_and_line(tiny_encoder_dir, tmp_path, capsys):
    train = write_sequence(tmp_path / "train.csv", 8, 0)
    dev = tmp_path / "dev.csv"
    dev.write_text("text,label\nalice great,pos\nbob awful,neutral\n", encoding="utf-8")
    assert _finetune(tiny_encoder_dir, "sequence", train, dev, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert str(dev) in err and "line 3" in err and "'neutral' never appears in the training data" in err


def test_conll_line_with_wrong_column_count(tiny_encoder_dir, tmp_path, capsys):
    train = tmp_path / "train.conll"
    train.write_text("alice\tB-PER\nlives\tO\n\nbob\tX\tB-PER\n", encoding="utf-8")
    assert _finetune(tiny_encoder_dir, "token", train, None, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"{train}:4" in err and "columns" in err


def test_unseen_tag_in_dev_names_the_line(tiny_encoder_dir, tmp_path, capsys):
    train = write_conll(tmp_path / "train.conll", 8, 0)
    dev = tmp_path / "dev.conll"
    dev.write_text("alice\tB-PER\n\nparis\tB-GPE\n", encoding="utf-8")
    assert _finetune(tiny_encoder_dir, "token", train, dev, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert str(dev) in err and "line 3" in err and "B-GPE" in err


def test_qa_answer_offsets_that_do_not_match(tiny_encoder_dir, tmp_path, capsys):
    train = write_squad(tmp_path / "train.json", 4, 0)
    data = json.loads(train.read_text())
    data["data"][0]["paragraphs"][1]["qas"][0]["answers"][0]["answer_start"] += 2
    train.write_text(json.dumps(data))
    assert _finetune(tiny_encoder_dir, "qa", train, None, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert str(train) in err and "q1" in err


def test_model_folder_without_tokenizer(tiny_encoder_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((tiny_encoder_dir / name).read_bytes())
    train = write_sequence(tmp_path / "train.csv", 8, 0)
    assert _finetune(bare, "sequence", train, None, tmp_path / "out") == 2
    assert "no tokenizer" in capsys.readouterr().err


def test_preset_needs_a_tokenizer(tmp_path, capsys):
    train = write_sequence(tmp_path / "train.csv", 8, 0)
    assert _run("finetune", "--task", "sequence", "--model", "bert-tiny", "--train", str(train), "--out",
                str(tmp_path / "out")) == 2
    assert "--tokenizer" in capsys.readouterr().err


def test_head_options_point_to_the_task_section(tmp_path, capsys):
    train = write_sequence(tmp_path / "train.csv", 8, 0)
    assert _run("finetune", "--task", "token", "--model", "bert-tiny", "--train", str(train), "--out",
                str(tmp_path / "out"), "--head.crf=true") == 2
    assert "--task.crf=true (or --crf)" in capsys.readouterr().err


def test_preset_trains_from_scratch_with_a_tokenizer(tiny_encoder_dir, tmp_path):
    train = write_sequence(tmp_path / "train.csv", 8, 0)
    code = _run("finetune", "--task", "sequence", "--model", "bert-tiny", "--tokenizer", str(tiny_encoder_dir),
                "--train", str(train), "--out", str(tmp_path / "out"), "--epochs", "1", "--max-length", "16")
    assert code == 0
    assert load_pretrained(tmp_path / "out").config.d_model == 128  # bert-tiny


def test_long_texts_are_truncated_with_a_counted_warning(tiny_encoder_dir, tmp_path, capsys):
    train = tmp_path / "train.csv"
    long_text = " ".join(["alice great"] * 40)
    train.write_text(f"text,label\n{long_text},pos\nbob awful,neg\n{long_text},pos\ncarol boring,neg\n")
    main(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(train), "--out",
          str(tmp_path / "out"), "--epochs", "1", "--max-length", "16"])
    assert "2 of 4 examples are longer than max_length=16 tokens and were truncated" in capsys.readouterr().err


def test_existing_run_folder_is_refused(finetuned, tiny_encoder_dir, tmp_path, capsys):
    out, train, _ = finetuned("sequence")
    before = (out / "model.safetensors").read_bytes()
    assert _finetune(tiny_encoder_dir, "sequence", train, None, out) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == before


def test_freeze_all_trains_only_the_head(tiny_encoder_dir, tmp_path):
    train, dev = write_task_data(tmp_path, "sequence", 16, 8)
    out = tmp_path / "frozen"
    assert _finetune(tiny_encoder_dir, "sequence", train, dev, out, "--freeze", "all", "--lr", "1e-2") == 0
    before = load_pretrained(tiny_encoder_dir).model.state_dict()
    after = load_pretrained(out).model.state_dict()
    for name, tensor in before.items():
        assert torch.equal(after[f"backbone.{name}"], tensor), name


def test_a_hugging_face_bert_folder_fine_tunes_from_its_weights(tiny_encoder_dir, tmp_path):
    hf_dir = tmp_path / "hf-bert"  # the tiny encoder in Hugging Face's layout (config.json, model.safetensors, vocab)
    assert main(["-q", "convert", "--to-hf", str(tiny_encoder_dir), "--out", str(hf_dir)]) == 0
    assert json.loads((hf_dir / "config.json").read_text())["model_type"] == "bert"
    train, dev = write_task_data(tmp_path, "sequence", 16, 8)
    out = tmp_path / "from-hf"
    assert _finetune(hf_dir, "sequence", train, dev, out, "--freeze", "all") == 0
    before = load_pretrained(tiny_encoder_dir).model.state_dict()
    after = load_pretrained(out).model.state_dict()
    for name, tensor in before.items():  # the frozen backbone is the HF folder's weights, unchanged
        assert torch.equal(after[f"backbone.{name}"], tensor), name
    assert (out / "vocab.txt").read_text() == (tiny_encoder_dir / "vocab.txt").read_text()


def test_interrupted_finetune_resumes_to_the_same_model(tiny_encoder_dir, tmp_path, monkeypatch):
    from lmforge.training.trainer import Trainer

    train, dev = write_task_data(tmp_path, "sequence", 24, 8)
    common = ["--epochs", "3", "--batch-size", "8", "--max-length", "32", "--lr", "3e-3", "--seed", "3"]

    def finetune(out: Path, *extra: str) -> int:
        return _run("finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(train),
                    "--dev", str(dev), "--out", str(out), *common, *extra)

    assert finetune(tmp_path / "whole") == 0
    original = Trainer._train_step

    def crash_at_step_5(self):
        if self.step == 4:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(Trainer, "_train_step", crash_at_step_5)
    assert finetune(tmp_path / "cut") == 130  # interrupted after the epoch-1 checkpoint (step 3)
    monkeypatch.setattr(Trainer, "_train_step", original)
    assert finetune(tmp_path / "cut", "--resume", "auto") == 0
    whole = load_pretrained(tmp_path / "whole").model.state_dict()
    resumed = load_pretrained(tmp_path / "cut").model.state_dict()
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert json.loads((tmp_path / "whole" / "eval_results.json").read_text()) == \
        json.loads((tmp_path / "cut" / "eval_results.json").read_text())

    def last_loss(out: Path) -> float:  # the training after the resumed checkpoint matches too
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [r for r in records if "loss" in r and r["step"] == 9][0]["loss"]

    assert last_loss(tmp_path / "cut") == pytest.approx(last_loss(tmp_path / "whole"), rel=1e-6)


def test_two_gloo_processes_finetune_like_one(tiny_encoder_dir, tmp_path):
    """``torchrun --nproc-per-node 2 -m lmforge finetune``: same global batches, so the same model."""
    import os
    import socket
    import subprocess
    import sys

    train, dev = write_task_data(tmp_path, "sequence", 24, 8)
    common = ["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(train), "--dev",
              str(dev), "--epochs", "2", "--batch-size", "8", "--max-length", "32", "--lr", "3e-3", "--seed", "1"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "lmforge", "-q", *common, "--out", str(tmp_path / "ddp")],
                                      cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    assert _run(*common, "--out", str(tmp_path / "single")) == 0
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    ddp = load_pretrained(tmp_path / "ddp").model.state_dict()
    single = load_pretrained(tmp_path / "single").model.state_dict()
    for name, tensor in single.items():
        torch.testing.assert_close(ddp[name], tensor, rtol=0, atol=1e-5, msg=name)
    a = json.loads((tmp_path / "ddp" / "eval_results.json").read_text())
    b = json.loads((tmp_path / "single" / "eval_results.json").read_text())
    assert a == b
