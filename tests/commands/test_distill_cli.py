"""``lmforge distill`` end to end: a tiny BERT teacher with an MLM head (DistilBERT's triple loss), the same teacher
without its head (MiniLM's relations), resume, and the embedded MiniLM as a teacher."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from lmforge.cli import main
from lmforge.persistence import load_backbone, load_pretrained, save_pretrained

TINY = ["--model.n_layers=4", "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32",
        "--model.max_seq_len=32", "--train.log_every=1", "--train.eval_batches=1"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, bbc_dir):
    root = tmp_path_factory.mktemp("distill")
    corpus = root / "corpus"
    corpus.mkdir()
    for topic in ("business", "sports"):
        for path in sorted((bbc_dir / topic).glob("*.txt"))[:10]:
            (corpus / f"{topic}-{path.name}").write_bytes(path.read_bytes())
    assert main(["tokenizer", "train", "--input", str(corpus), "--vocab-size", "500", "--out", str(root / "tok"),
                 "--algorithm", "bpe-count"]) == 0
    assert main(["data", "prepare", "--tokenizer", str(root / "tok"), "--input", str(corpus), "--out",
                 str(root / "data"), "--workers", "1"]) == 0
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--input", str(root / "data"), "--out",
                 str(root / "teacher"), "--max-steps", "2", "--batch-size", "4", "--seq-len", "32", *TINY]) == 0
    loaded = load_backbone(root / "teacher")  # the same teacher without its MLM head
    save_pretrained(loaded.model, root / "headless", config=loaded.config, tokenizer=loaded.tokenizer)
    return root


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_distilbert_triple_loss_student(teacher, tmp_path, caplog, capsys):
    out = tmp_path / "student"
    args = ["distill", "--teacher", str(teacher / "teacher"), "--input", str(teacher / "data"), "--out", str(out),
            "--batch-size", "4", "--seq-len", "32", "--save-every", "2", "--train.log_every=1",
            "--train.eval_batches=1"]
    with caplog.at_level(logging.INFO, logger="lmforge"):
        assert main([*args, "--max-steps", "2"]) == 0, capsys.readouterr().err
    assert "DistilBERT's triple loss" in caplog.text
    train = [r for r in records(out) if "loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert {"loss_ce", "loss_mlm", "loss_cos", "distill_ce", "teacher_agreement"} <= set(r)
        assert r["loss"] == pytest.approx(r["loss_ce"] + r["loss_mlm"] + r["loss_cos"], rel=1e-4)
        assert r["loss_ce"] == pytest.approx(5.0 * r["distill_ce"], rel=1e-4)
    final = [r for r in records(out) if "eval_ppl_mlm" in r][-1]  # the student's MLM perplexity, not the weighted
    assert final["eval_loss_mlm"] == pytest.approx(2.0 * final["eval_distill_mlm"], rel=1e-4)  # alpha_mlm = 2
    assert final["eval_ppl_mlm"] == pytest.approx(math.exp(final["eval_distill_mlm"]), rel=1e-4)
    student = load_pretrained(out)
    assert student.config.n_layers == 2 and student.config.type_vocab_size == 0 and not student.config.pooler
    assert student.head == {"type": "mlm"}
    # resume: two more steps continue the run
    assert main([*args, "--max-steps", "4", "--resume", "auto"]) == 0, capsys.readouterr().err
    assert [r["step"] for r in records(out) if "loss" in r] == [1, 2, 3, 4]
    # the student fine-tunes like any encoder folder
    assert load_backbone(out).model(torch.tensor([[2, 5, 6, 3]])).last_hidden_state.shape == (1, 4, 16)


def test_distill_takes_a_budget(teacher, tmp_path, capsys):
    out = tmp_path / "student"
    assert main(["distill", "--teacher", str(teacher / "teacher"), "--input", str(teacher / "data"), "--out",
                 str(out), "--batch-size", "2", "--seq-len", "32", "--budget", "100tok",
                 "--train.log_every=1", "--train.eval_batches=1"]) == 0, capsys.readouterr().err
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["train"]["budget"] == "100tok" and run_config["train"]["max_steps"] is None
    train = [r for r in records(out) if "loss" in r]
    assert train[-1]["budget_fraction"] >= 1.0 and (out / "model.safetensors").is_file()


def test_headless_teacher_uses_attention_relations(teacher, tmp_path, caplog, capsys):
    out = tmp_path / "minilm-style"
    with caplog.at_level(logging.INFO, logger="lmforge"):
        assert main(["distill", "--teacher", str(teacher / "headless"), "--student-layers", "1,3", "--input",
                     str(teacher / "data"), "--out", str(out), "--max-steps", "2", "--batch-size", "4",
                     "--seq-len", "32", "--train.log_every=1"]) == 0, capsys.readouterr().err
    assert "has no MLM head" in caplog.text and "value relations" in caplog.text
    train = [r for r in records(out) if "loss" in r]
    assert all({"loss_cos", "loss_att", "loss_val"} <= set(r) and "loss_ce" not in r for r in train)
    assert load_pretrained(out).head is None  # a bare encoder: there was no MLM to train


def test_a_student_with_other_heads_learns_minilm_v2_relations(teacher, tmp_path, caplog, capsys):
    # MiniLM compares head by head; a 4-head student of a 2-head teacher gets MiniLMv2's Q-Q, K-K, V-V relations
    out = tmp_path / "minilm-v2"
    with caplog.at_level(logging.INFO, logger="lmforge"):
        assert main(["distill", "--teacher", str(teacher / "headless"), "--student", "bert-tiny", "--input",
                     str(teacher / "data"), "--out", str(out), "--max-steps", "2", "--batch-size", "4",
                     "--seq-len", "32", "--model.n_layers=2", "--model.d_model=16", "--model.n_heads=4",
                     "--model.d_ff=32", "--model.max_seq_len=32", "--relation-heads", "4", "--teacher-layer", "2",
                     "--train.log_every=1"]) == 0, capsys.readouterr().err
    assert "as MiniLMv2, its layer 2's query, key and value relations over 4 relation heads" in caplog.text
    train = [r for r in records(out) if "loss" in r]
    assert all("loss_rel" in r and "loss_att" not in r and "loss_val" not in r for r in train)
    assert load_pretrained(out).config.n_heads == 4


@pytest.mark.parametrize(("extra", "message"), [
    (["--alpha-ce", "5"], "needs a teacher with an MLM head"),
    (["--student", "gpt-nano"], "distillation trains an encoder"),
    (["--student-layers", "0,7"], "student_layers=[0, 7]"),
    (["--student-layers", "0,2,0"], "layer 0 is listed twice"),
])
def test_bad_distillation_options(teacher, tmp_path, capsys, extra, message):
    code = main(["distill", "--teacher", str(teacher / "headless"), "--input", str(teacher / "data"), "--out",
                 str(tmp_path / "x"), "--max-steps", "1", "--batch-size", "2", "--seq-len", "32", *extra])
    assert code != 0
    assert message in capsys.readouterr().err


def test_a_decoder_folder_is_no_student(teacher, tmp_path, capsys):
    from lmforge.config import ModelConfig
    from lmforge.models.decoder import Decoder

    loaded = load_backbone(teacher / "headless")
    config = ModelConfig(arch="decoder", vocab_size=loaded.config.vocab_size, d_model=16, n_heads=2, n_layers=1,
                         d_ff=32, max_seq_len=32)
    save_pretrained(Decoder(config), tmp_path / "gpt", tokenizer=loaded.tokenizer)
    code = main(["distill", "--teacher", str(teacher / "headless"), "--student", str(tmp_path / "gpt"), "--input",
                 str(teacher / "data"), "--out", str(tmp_path / "x"), "--max-steps", "1", "--batch-size", "2"])
    assert code != 0
    assert "holds a 'decoder' model; distillation trains an encoder" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_minilm_teacher(minilm_dir, bbc_dir, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in sorted((bbc_dir / "tech").glob("*.txt"))[:4]:
        (corpus / path.name).write_bytes(path.read_bytes())
    assert main(["data", "prepare", "--tokenizer", str(minilm_dir), "--input", str(corpus), "--out",
                 str(tmp_path / "data"), "--workers", "1"]) == 0
    out = tmp_path / "student"
    assert main(["distill", "--teacher", str(minilm_dir), "--input", str(tmp_path / "data"), "--out", str(out),
                 "--max-steps", "1", "--batch-size", "2", "--seq-len", "32", "--train.eval_batches=1"]) == 0, \
        capsys.readouterr().err
    student = load_pretrained(out)
    assert student.config.n_layers == 3 and student.config.d_model == 384


def test_a_folder_student_takes_settings_that_keep_its_weights(teacher, tmp_path, capsys):
    # --model.n_heads on a folder student re-splits the same projections (MiniLMv2's students); a size change is refused
    out = tmp_path / "heads"
    assert main(["-q", "distill", "--teacher", str(teacher / "headless"), "--student", str(teacher / "headless"),
                 "--input", str(teacher / "data"), "--out", str(out), "--max-steps", "1", "--batch-size", "2",
                 "--seq-len", "32", "--model.n_heads=4"]) == 0, capsys.readouterr().err
    student = load_pretrained(out)
    assert student.config.n_heads == 4 and student.model.layers[0].self_attn.n_heads == 4
    code = main(["distill", "--teacher", str(teacher / "headless"), "--student", str(teacher / "headless"),
                 "--input", str(teacher / "data"), "--out", str(tmp_path / "wide"), "--max-steps", "1",
                 "--batch-size", "2", "--seq-len", "32", "--model.d_model=32"])
    assert code != 0 and "changes the shape of its weights" in capsys.readouterr().err
