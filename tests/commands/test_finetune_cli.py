"""``lmforge finetune`` / ``evaluate`` / ``predict`` end to end on toy data with a tiny encoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.persistence import load_pretrained
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
    assert _run("evaluate", "--model", str(out), "--test", str(dev)) == 0
    again = json.loads(capsys.readouterr().out)
    for name in METRICS[task]:
        assert again[name] == pytest.approx(results[name], abs=1e-9), name
    # predict: one JSON line per input, in input order
    predictions = tmp_path / "pred.jsonl"
    assert _run("predict", "--model", str(out), "--input", str(dev), "--out", str(predictions)) == 0
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
    _run("predict", "--model", str(out), "--input", str(dev), "--out", str(predictions))
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
    assert _run("predict", "--model", str(out), "--input", str(dev), "--out", str(target)) == 2
    assert "already exists" in capsys.readouterr().err and target.read_text() == "keep me\n"


# ------------------------------------------------------------------------------------------------ bad input
def _finetune(tiny_encoder_dir: Path, task: str, train: Path, dev: Path | None, out: Path, *extra: str) -> int:
    args = ["finetune", "--task", task, "--model", str(tiny_encoder_dir), "--train", str(train), "--out", str(out),
            "--epochs", "1", "--batch-size", "8", "--max-length", "32", *extra]
    return _run(*args, *(["--dev", str(dev)] if dev else []))


def test_dev_label_never_seen_in_training_is_a_miss_with_one_warning(tiny_encoder_dir, tmp_path, capsys):
    train = write_sequence(tmp_path / "train.csv", 8, 0)
    dev = tmp_path / "dev.csv"
    dev.write_text("text,label\nalice great,pos\nbob awful,neutral\ncarol boring,neutral\n", encoding="utf-8")
    assert _finetune(tiny_encoder_dir, "sequence", train, dev, tmp_path / "out") == 0
    err = capsys.readouterr().err
    assert err.count("the model cannot produce") == 1
    assert str(dev) in err and "'neutral' x2 (first at line 3)" in err and "scored as misses" in err
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["accuracy"] <= 1 / 3  # the two neutral examples are misses


def test_conll_line_with_wrong_column_count(tiny_encoder_dir, tmp_path, capsys):
    train = tmp_path / "train.conll"
    train.write_text("alice\tB-PER\nlives\tO\n\nbob\tX\tB-PER\n", encoding="utf-8")
    assert _finetune(tiny_encoder_dir, "token", train, None, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"{train}:4" in err and "columns" in err


def test_unseen_tag_in_dev_is_named_with_its_line_and_scored_as_a_miss(tiny_encoder_dir, tmp_path, capsys):
    train = write_conll(tmp_path / "train.conll", 8, 0)
    dev = tmp_path / "dev.conll"
    dev.write_text("alice\tB-PER\n\nparis\tB-GPE\n", encoding="utf-8")
    assert _finetune(tiny_encoder_dir, "token", train, dev, tmp_path / "out") == 0
    err = capsys.readouterr().err
    assert str(dev) in err and "'B-GPE' x1 (first at line 3)" in err and "scored as misses" in err


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


def test_reinit_layers_redraws_the_top_layers_of_the_pretrained_backbone(tiny_encoder_dir, tmp_path):
    train, dev = write_task_data(tmp_path, "sequence", 16, 8)
    out = tmp_path / "reinit"  # frozen after the re-draw: what is saved is what was drawn
    assert _finetune(tiny_encoder_dir, "sequence", train, dev, out, "--freeze", "all", "--reinit-layers", "1") == 0
    before = load_pretrained(tiny_encoder_dir).model.state_dict()
    after = load_pretrained(out).model.state_dict()
    top = f"layers.{load_pretrained(tiny_encoder_dir).config.n_layers - 1}."
    for name, tensor in before.items():  # matrices drawn again (biases and norms were at their initial 0 and 1)
        if name.startswith((top, "pooler.")):
            assert tensor.dim() < 2 or not torch.equal(after[f"backbone.{name}"], tensor), name
        else:
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


# ------------------------------------------------------------------------------------------------ issue 23: labels
def _tagged(path: Path, sentences: list[list[tuple[str, str]]]) -> Path:
    path.write_text("\n\n".join("\n".join(f"{w}\t{t}" for w, t in s) for s in sentences) + "\n", encoding="utf-8")
    return path


# the toy training data tags every city as one word, B-LOC: I-LOC never appears in it (the B-sportsteam)
TEST_SENTENCES = [[("alice", "B-PER"), ("went", "O"), ("to", "O"), ("paris", "B-LOC"), ("rome", "I-LOC")],
                  [("bob", "B-PER"), ("saw", "O"), ("oslo", "B-GPE")],
                  [("carol", "B-PER"), ("dave", "I-PER"), ("visited", "O"), ("lima", "B-LOC")]]


def test_tag_set_is_closed_under_the_scheme(finetuned):
    out, train, _ = finetuned("token")
    assert "I-LOC" not in train.read_text()
    assert load_pretrained(out).head["labels"] == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]


def test_evaluate_scores_unseen_tags_as_misses_instead_of_aborting(finetuned, tmp_path, capsys):
    """Issue 23: `evaluate` aborted on I-sportsteam when only B-sportsteam was in training; a wholly new type too."""
    out, _, _ = finetuned("token")
    test = _tagged(tmp_path / "test.conll", TEST_SENTENCES)
    capsys.readouterr()
    assert _run("evaluate", "--model", str(out), "--test", str(test)) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert 0.0 <= metrics["f1"] <= 1.0 and metrics["recall"] <= 4 / 5  # B-GPE can never be found
    # one warning for the tag the model cannot produce, with its count and first line; I-LOC is known now
    assert captured.err.count("cannot produce") == 1
    assert "1 gold tag the model cannot produce" in captured.err and "'B-GPE' x1 (first at line 7)" in captured.err
    assert "I-LOC" not in captured.err


def test_predict_ignores_gold_tags_even_unseen_ones(finetuned, tmp_path):
    out, _, _ = finetuned("token")
    test = _tagged(tmp_path / "test.conll", TEST_SENTENCES)
    predictions = tmp_path / "tags.jsonl"
    assert _run("predict", "--model", str(out), "--input", str(test), "--out", str(predictions)) == 0
    records = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [len(r["tags"]) for r in records] == [5, 3, 4]


def test_predict_ignores_unseen_classes_in_a_label_column(finetuned, tmp_path):
    out, _, _ = finetuned("sequence")
    data = tmp_path / "new.csv"
    data.write_text("text,label\nalice great,neutral\nbob awful,0.5\n", encoding="utf-8")
    predictions = tmp_path / "p.jsonl"
    assert _run("predict", "--model", str(out), "--input", str(data), "--out", str(predictions)) == 0
    assert len(predictions.read_text().splitlines()) == 2


def test_evaluate_writes_a_per_class_report_and_a_confusion_matrix(finetuned, tmp_path, capsys):
    out, _, _ = finetuned("token")
    test = _tagged(tmp_path / "test.conll", TEST_SENTENCES)
    metrics = tmp_path / "eval" / "metrics.json"
    assert main(["evaluate", "--model", str(out), "--test", str(test), "--out", str(metrics)]) == 0
    err = capsys.readouterr().err
    written = {name: metrics.with_name(name) for name in
               ("metrics.per_class.json", "metrics.per_class.md", "metrics.confusion.png")}
    assert "per-entity type report: " + ", ".join(map(str, written.values())) in err  # says where
    report = json.loads(written["metrics.per_class.json"].read_text())
    assert report["unit"] == "entity type" and report["unknown_labels"] == {"B-GPE": 1}
    assert set(report["per_class"]) == {"GPE", "LOC", "PER"} and report["per_class"]["GPE"]["recall"] == 0.0
    assert report["per_class"]["PER"]["support"] == 3
    assert report["confusion"]["labels"][:1] == ["O"] and sum(map(sum, report["confusion"]["matrix"])) == 12
    assert "| GPE | 0.0000 | 0.0000 | 0.0000 | 1 |" in written["metrics.per_class.md"].read_text()
    assert written["metrics.confusion.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # existing report files are never replaced silently
    metrics.unlink()
    assert _run("evaluate", "--model", str(out), "--test", str(test), "--out", str(metrics)) == 2
    assert "metrics.per_class.json: the file already exists" in capsys.readouterr().err
    assert _run("evaluate", "--model", str(out), "--test", str(test), "--out", str(metrics), "--overwrite") == 0


def test_evaluate_reports_classes_with_an_unseen_one(finetuned, tmp_path, capsys):
    out, _, _ = finetuned("sequence")
    data = tmp_path / "test.csv"
    data.write_text("text,label\nalice great,pos\nbob awful,neg\ncarol lovely,neutral\n", encoding="utf-8")
    metrics = tmp_path / "m.json"
    assert _run("evaluate", "--model", str(out), "--test", str(data), "--out", str(metrics)) == 0
    assert "'neutral' x1 (first at line 4)" in capsys.readouterr().err
    report = json.loads((tmp_path / "m.per_class.json").read_text())
    assert report["per_class"]["neutral"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert report["confusion"]["labels"] == ["neg", "pos", "neutral"]
    assert (tmp_path / "m.confusion.png").is_file()


def test_evaluate_and_predict_show_progress_unless_quiet(finetuned, tmp_path, capsys):
    out, _, dev = finetuned("sequence")
    assert main(["evaluate", "--model", str(out), "--test", str(dev)]) == 0
    assert "evaluate:" in capsys.readouterr().err
    assert main(["predict", "--model", str(out), "--input", str(dev), "--out", str(tmp_path / "p.jsonl")]) == 0
    assert "predict:" in capsys.readouterr().err
    assert _run("evaluate", "--model", str(out), "--test", str(dev)) == 0
    assert "evaluate:" not in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ issue 23: logs
def test_dev_evaluation_shows_progress_and_the_log_names_no_vanishing_folder(tiny_encoder_dir, tmp_path, capsys):
    train, dev = write_task_data(tmp_path, "sequence", 16, 8)
    out = tmp_path / "run"
    assert main(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(train), "--dev",
                 str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length", "32"]) == 0
    err = capsys.readouterr().err
    assert "dev:" in err  # the dev evaluation's progress bar
    assert "best accuracy so far" in err and str(out / "best") not in err  # best/ is gone at the end
    assert not (out / "best").exists()


def test_pair_truncation_is_one_summary_with_line_numbers(tiny_encoder_dir, tmp_path, capsys):
    """Issue 23: one warning per truncated line (279 for 279 lines), and no line numbers."""
    long = " ".join(["alice great"] * 20)
    rows = [f"{long},bob,pos" if i % 3 == 0 else "carol,dave awful,neg" for i in range(12)]
    train = tmp_path / "pairs.csv"
    train.write_text("text,text_pair,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    assert main(["finetune", "--task", "pair", "--model", str(tiny_encoder_dir), "--train", str(train), "--out",
                 str(tmp_path / "out"), "--epochs", "1", "--max-length", "16"]) == 0
    err = capsys.readouterr().err
    assert err.count("longer than") == 1 and "truncated to max_length" not in err  # not the tokenizer's, per line
    assert "4 of 12 pairs are longer than max_length=16 tokens and were cut longest-first (longest 44 tokens; " \
           "lines 2, 5, 8, 11)" in err


def test_long_token_sentences_are_summarised_once(tiny_encoder_dir, tmp_path, capsys):
    sentences = [[("alice", "B-PER")] + [("went", "O")] * 40 for _ in range(3)] + [[("bob", "B-PER")]]
    train = _tagged(tmp_path / "train.conll", sentences)
    assert main(["finetune", "--task", "token", "--model", str(tiny_encoder_dir), "--train", str(train), "--out",
                 str(tmp_path / "out"), "--epochs", "1", "--max-length", "16"]) == 0
    err = capsys.readouterr().err
    assert "3 of 4 sentences are longer than max_length=16 sub-words and lost their last words (predicted O) " \
           "(longest 43 sub-words; lines 1, 43, 85)" in err


# ------------------------------------------------------------------------------------------------ issue 23: defaults
def test_learning_rate_default_depends_on_the_backbone(tiny_encoder_dir, tmp_path, capsys):
    """Issue 23: finetune applied BERT's 5e-5 to a model trained from scratch."""
    train = write_sequence(tmp_path / "train.csv", 8, 0)

    def lr_of(*args: str) -> float:
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        assert main(["finetune", "--task", "sequence", "--train", str(train), "--out", str(out), "--epochs", "1",
                     "--max-length", "16", *args]) == 0
        return json.loads((out / "run_config.json").read_text())["train"]["lr"]

    assert lr_of("--model", str(tiny_encoder_dir)) == 5e-5  # a pretrained Transformer folder: BERT's
    assert lr_of("--model", "bert-tiny", "--tokenizer", str(tiny_encoder_dir)) == 5e-4  # random weights
    assert "learning rate 0.0005 (the default for a random transformer backbone" in capsys.readouterr().err
    assert lr_of("--model", "rnn-attn", "--tokenizer", str(tiny_encoder_dir), "--model.d_model=16") == 2e-3
    assert lr_of("--model", "bert-tiny", "--tokenizer", str(tiny_encoder_dir), "--lr", "1e-4") == 1e-4
    assert lr_of("--model", "bert-tiny", "--tokenizer", str(tiny_encoder_dir), "--train.lr=2e-4") == 2e-4


def test_crf_head_learns_faster_than_a_pretrained_encoder_by_default(tiny_encoder_dir, tmp_path):
    """Issue 23: a CRF tagger on 300 tweets at the default lr scored F1 0 for three epochs (0.47 with a head lr)."""
    train = write_conll(tmp_path / "train.conll", 8, 0)
    for name, extra, expected in (("default", [], 3e-2), ("given", ["--head-lr", "3e-4"], 3e-4),
                                  ("high-lr", ["--lr", "5e-2"], None)):
        assert _finetune(tiny_encoder_dir, "token", train, None, tmp_path / name, "--crf", *extra) == 0
        config = json.loads((tmp_path / name / "run_config.json").read_text())
        assert config["task"]["head_lr"] == expected, name


def test_help_documents_the_learning_rate_defaults(capsys):
    assert main(["finetune", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "5e-05 for a pretrained Transformer folder" in text or "5e-5 for a pretrained Transformer folder" in text
    assert "5e-4 for a preset" in text and "2e-3 for a recurrent model" in text
    assert "at least 0.03" in text


def test_group_by_length_trains_and_is_kept_in_the_run_config(tiny_encoder_dir, tmp_path):
    train, dev = write_task_data(tmp_path, "token", 24, 8)
    out = tmp_path / "grouped"
    assert _finetune(tiny_encoder_dir, "token", train, dev, out, "--train.group_by_length=true") == 0
    assert json.loads((out / "run_config.json").read_text())["train"]["group_by_length"] is True
