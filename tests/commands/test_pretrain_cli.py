"""``lmforge data prepare`` + ``lmforge pretrain`` end to end on a small slice of BBC News."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.persistence import load_pretrained
from lmforge.training import load_trainer_state

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model.n_layers=1", "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32",
        "--model.max_seq_len=32", "--train.log_every=1", "--train.eval_batches=1"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, bbc_dir):
    root = tmp_path_factory.mktemp("pretrain")
    corpus = root / "corpus"
    corpus.mkdir()
    for topic in ("business", "tech"):
        for path in sorted((bbc_dir / topic).glob("*.txt"))[:15]:
            (corpus / f"{topic}-{path.name}").write_bytes(path.read_bytes())
    assert main(["tokenizer", "train", "--input", str(corpus), "--vocab-size", "600", "--out", str(root / "tok"),
                 "--algorithm", "bpe-count"]) == 0
    assert main(["data", "prepare", "--tokenizer", str(root / "tok"), "--input", str(corpus), "--out",
                 str(root / "data"), "--workers", "1"]) == 0
    return root


def test_dropout_off_pretrains_without_dropout_and_saves_the_fine_tuning_dropouts(prepared, tmp_path, capsys):
    import torch

    from lmforge.recipes.pretrain import PretrainRun, build_pretraining_model

    run = PretrainRun(preset="bert-tiny", model={"dropout": 0.2, "n_layers": 1}, dropout_off=True)
    model, config, _ = build_pretraining_model(run, vocab_size=99)
    assert config.dropout == 0.2  # what the saved folder keeps
    ids = torch.randint(5, 99, (2, 12))
    model.train()
    with torch.no_grad():  # no dropout anywhere: two training-mode passes agree
        torch.testing.assert_close(model(ids).mlm_logits, model(ids).mlm_logits, rtol=0, atol=0)
    out = tmp_path / "run"
    code = main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--data", str(prepared / "data"),
                 "--out", str(out), "--max-steps", "2", "--batch-size", "4", "--seq-len", "32", *TINY,
                 "--model.dropout=0.2", "--dropout-off"])
    assert code == 0, capsys.readouterr().err
    assert load_pretrained(out).config.dropout == 0.2  # fine-tuning gets its dropout back
    assert json.loads((out / "run_config.json").read_text())["dropout_off"] is True


@pytest.mark.parametrize(("preset", "objective"), [("bert-tiny", "mlm+nsp"), ("bert-tiny", "span"),
                                                   ("albert-mini", "mlm+sop"), ("gpt-nano", "clm")])
def test_pretrain_writes_a_loadable_run(prepared, tmp_path, preset, objective, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--preset", preset, "--objective", objective, "--data", str(prepared / "data"),
                 "--out", str(out), "--max-steps", "3", "--batch-size", "4", "--seq-len", "32", *TINY])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all({"step", "loss", "lr", "tokens_per_s"} <= set(r) for r in train)
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = load_pretrained(out)
    assert loaded.tokenizer is not None and loaded.config.n_layers == 1
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["data"]["objective"] == objective and run_config["preset"] == preset
    if objective != "clm":  # a masked LM logs its plateau beside its accuracy, and the anisotropy of its states
        evals = [r for r in records if "eval_mlm_accuracy" in r]
        assert evals and all(0.0 <= r["eval_mlm_constant_accuracy"] <= 1.0 and -1.0 <= r["eval_token_cosine"] <= 1.0
                             for r in evals)
        # three steps leave no tiny model off its plateau: the finished run says so
        assert "has not left the plateau" in capsys.readouterr().err
    if objective == "mlm+sop":  # ALBERT: the sentence-order loss is logged under its own name
        assert all("sop_accuracy" in r and "nsp_accuracy" not in r for r in train)
        assert loaded.config.share_layers == "all" and loaded.config.embedding_size == 128
    if objective != "clm":
        assert main(["embed", "--model", str(out), "--input", str(prepared / "tok" / "vocab.txt"),
                     "--out", str(tmp_path / "e.npy")]) == 0
    else:  # the causal-LM run continues prompts with lmforge generate, greedy (cached == uncached) and sampled
        capsys.readouterr()
        texts = []
        for flags in ([], ["--no-cache"], ["--strategy", "sample", "--top-p", "0.9", "--seed", "1"]):
            assert main(["generate", "--model", str(out), "--prompt", "the company said", "--max-new-tokens", "6",
                         "--json", *flags]) == 0
            [line] = capsys.readouterr().out.strip().splitlines()
            texts.append(json.loads(line))
        assert texts[0] == texts[1] and texts[0]["prompt"] == "the company said"


def test_xlnet_plm_run(prepared, tmp_path, capsys):
    """XLNet's permutation LM end to end: a loadable run that logs plm_accuracy, with the tokenizer's [PAD] id."""
    out = tmp_path / "run"
    code = main(["pretrain", "--preset", "xlnet-tiny", "--objective", "plm", "--data", str(prepared / "data"),
                 "--out", str(out), "--max-steps", "3", "--batch-size", "4", "--seq-len", "32", *TINY])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(0.0 <= r["plm_accuracy"] <= 1.0 and r["predicted_tokens"] > 0 for r in train)
    assert any("eval_plm_accuracy" in r for r in records)
    assert all(0.0 < r["plm_constant_accuracy"] <= 1.0 for r in train)  # the plateau beside the accuracy
    loaded = load_pretrained(out)
    assert loaded.config.arch == "xlnet" and loaded.config.n_layers == 1
    assert loaded.config.vocab_size == loaded.tokenizer.vocab_size
    assert loaded.config.pad_token_id == loaded.tokenizer.pad_id == 0  # not the preset's SentencePiece id 5
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["data"]["objective"] == "plm" and run_config["data"]["partial_k"] == 6


def test_config_file_flags_and_overrides(prepared, tmp_path, capsys):
    recipe = tmp_path / "r.toml"
    recipe.write_text('preset = "bert-tiny"\n[data]\nobjective = "mlm"\nseq_len = 32\n'
                      '[train]\nmax_steps = 5\nbatch_size = 4\nlr = 0.01\n', encoding="utf-8")
    out = tmp_path / "run"
    assert main(["pretrain", "--config", str(recipe), "--data", str(prepared / "data"), "--out", str(out),
                 "--max-steps", "2", "--train.lr=0.002", *TINY]) == 0
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["train"]["max_steps"] == 2 and run_config["train"]["lr"] == 0.002
    assert run_config["data"]["objective"] == "mlm" and run_config["model"]["d_model"] == 16
    # an existing run is never overwritten silently
    assert main(["pretrain", "--config", str(recipe), "--data", str(prepared / "data"), "--out", str(out),
                 *TINY]) == 2
    assert "--resume auto" in capsys.readouterr().err


def test_roberta_recipe_exports_as_roberta_and_fills_masks_in_transformers(prepared, tmp_path, capsys):
    # RoBERTa pretrain -> export -> transformers' fill-mask pipeline (issue 37): the recipe's hf_layout writes it as
    # RobertaForMaskedLM, whose positions start after the padding id, with the same MLM logits as ours
    transformers = pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    import torch

    out = tmp_path / "run"
    code = main(["pretrain", "--config", str(ROOT / "configs" / "roberta-mini.toml"), "--input", str(prepared / "data"),
                 "--out", str(out), "--max-steps", "2", "--batch-size", "4", "--seq-len", "32",
                 "--train.eval_every=0", "--train.save_every=0", *TINY])
    assert code == 0, capsys.readouterr().err
    assert main(["-q", "convert", "--to-hf", str(out), "--out", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "roberta" and config["architectures"] == ["RobertaForMaskedLM"]
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    ours = load_pretrained(out)
    ids = torch.tensor([ours.tokenizer.encode("the market rose in the [MASK] quarter")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(ours.model(ids).mlm_logits, hf(ids).logits, rtol=1e-4, atol=1e-5)
    fill = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), device="cpu")
    guesses = fill("the market rose in the [MASK] quarter")
    assert len(guesses) == 5 and all("[MASK]" not in g["sequence"] for g in guesses)
    # and back: the imported folder remembers it is a RoBERTa
    assert main(["-q", "convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "again")]) == 0
    assert load_pretrained(tmp_path / "again").config.hf_layout == "roberta"


def test_a_token_budget_replaces_the_default_step_count(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--preset", "gpt-nano", "--objective", "clm", "--data", str(prepared / "data"),
                 "--out", str(out), "--budget", "300tok", "--batch-size", "2", "--seq-len", "32", *TINY])
    assert code == 0, capsys.readouterr().err
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["train"]["budget"] == "300tok" and run_config["train"]["max_steps"] is None
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "loss" in r]
    assert train[-1]["budget_fraction"] >= 1.0 > train[-2]["budget_fraction"]
    assert train[-1]["tokens"] >= 300 > train[-2]["tokens"]
    assert f"for {train[-1]['step']} steps" in capsys.readouterr().out
    assert load_pretrained(out).config.n_layers == 1


def test_a_bad_budget_stops_the_command_line(capsys):
    assert main(["pretrain", "--budget", "10 minutes", "--data", "x", "--out", "y"]) == 2
    assert "argument --budget: budget='10 minutes' is not a budget" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), [
    (["--preset", "bert-tiny", "--objective", "clm"], "use a gpt-* preset"),
    (["--preset", "bert-tiny", "--train.learning_rate=1"], "unknown key(s) 'learning_rate'"),
    (["--preset", "bert-tiny", "--seq-len", "64"], "exceeds the model's max_seq_len=32"),
    (["--preset", "bert-tiny", "--objective", "plm", "--seq-len", "32"], "use a xlnet-* preset"),
    (["--preset", "xlnet-tiny", "--objective", "plm", "--seq-len", "32", "--data.partial_k=0"],
     "partial_k=0.0 must be in [1, seq_len=32]"),
    (["--preset", "xlnet-tiny", "--objective", "plm", "--seq-len", "32", "--data.num_predict=33"],
     "num_predict=33 must be an integer in [1, seq_len=32]"),
])
def test_bad_pretraining_options(prepared, tmp_path, capsys, extra, message):
    code = main(["pretrain", "--data", str(prepared / "data"), "--out", str(tmp_path / "run"),
                 "--max-steps", "1", "--batch-size", "2", *TINY, *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_one_document_corpus_falls_back_to_mlm(prepared, tmp_path, caplog):
    one = tmp_path / "one"
    one.mkdir()
    (one / "doc.txt").write_text(" ".join(["The market rose again today."] * 80), encoding="utf-8")
    assert main(["data", "prepare", "--tokenizer", str(prepared / "tok"), "--input", str(one), "--out",
                 str(tmp_path / "data"), "--workers", "1"]) == 0
    with caplog.at_level("WARNING", logger="lmforge"):
        code = main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm+nsp", "--data", str(tmp_path / "data"),
                     "--out", str(tmp_path / "run"), "--max-steps", "1", "--batch-size", "2", "--seq-len", "32",
                     "--data.eval_fraction=0", *TINY])
    assert code == 0
    assert "falling back to objective 'mlm'" in caplog.text


def test_transformer_xl_run_evaluates_with_memory_resumes_and_loads(prepared, tmp_path, capsys):
    """Transformer-XL (objective txl): 3 steps on consecutive segments with memory, eval perplexity over several
    segments with a longer evaluation memory, then 2 more steps resumed, and a loadable run."""
    out = tmp_path / "run"
    args = ["pretrain", "--preset", "transformer-xl-tiny", "--objective", "txl", "--data", str(prepared / "data"),
            "--out", str(out), "--batch-size", "4", "--seq-len", "16", *TINY, "--model.mem_len=16",
            "--data.variable_bptt=false", "--loss.eval_mem_len=48", "--train.eval_batches=4"]
    code = main([*args, "--max-steps", "3"])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and 0.0 <= r["lm_accuracy"] <= 1.0 for r in records if "loss" in r)
    evals = [r for r in records if "eval_ppl_lm" in r]
    assert evals and all(1.0 < r["eval_ppl_lm"] < float("inf") for r in evals)
    code = main([*args, "--max-steps", "5", "--resume", "auto"])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5]
    loaded = load_pretrained(out)
    assert (loaded.config.arch, loaded.config.attn_type, loaded.config.mem_len) == ("xlnet", "uni", 16)
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["data"]["objective"] == "txl" and run_config["loss"]["eval_mem_len"] == 48


def test_transformer_xl_resumes_with_its_memory_exactly(prepared, tmp_path, capsys):
    # the training memory is checkpointed (issue 38): the steps after a resume equal the uninterrupted run's
    args = ["pretrain", "--preset", "transformer-xl-tiny", "--objective", "txl", "--input", str(prepared / "data"),
            "--batch-size", "4", "--seq-len", "16", *TINY, "--model.mem_len=16", "--max-steps", "4",
            "--save-every", "2", "--train.eval_every=0", "--data.eval_fraction=0"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0, capsys.readouterr().err
    state = load_trainer_state(tmp_path / "whole" / "checkpoints" / "step-2")
    memory = state["objective"][0]["train_memory"]
    assert len(memory) == 1 and tuple(memory[0].shape) == (4, 16, 16)  # n_layers x (rows, mem_len, d_model)
    assert main([*args, "--out", str(tmp_path / "resumed"), "--resume",
                 str(tmp_path / "whole" / "checkpoints" / "step-2")]) == 0, capsys.readouterr().err
    from tests.training.helpers import losses_by_step

    assert losses_by_step(tmp_path / "resumed") == [r for r in losses_by_step(tmp_path / "whole") if r[0] > 2]


@pytest.mark.parametrize(("extra", "message"), [
    (["--model.attn_type=bi"], "needs attn_type='uni'"),
    (["--model.mem_len=0"], "mem_len=0 must be an integer"),
    (["--loss.eval_mem_len=0"], "eval_mem_len=0 must be an integer"),
    (["--data.eval_mem_len=0"], "eval_mem_len=0 must be an integer"),  # the old place, moved with a warning
    (["--loss.rtd_weight=1"], "unknown key(s) 'rtd_weight'; valid keys are eval_mem_len"),
])
def test_bad_transformer_xl_options(prepared, tmp_path, capsys, extra, message):
    code = main(["pretrain", "--preset", "transformer-xl-tiny", "--objective", "txl", "--data",
                 str(prepared / "data"), "--out", str(tmp_path / "run"), "--max-steps", "1", "--batch-size", "2",
                 "--seq-len", "16", *TINY, *extra])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---------------------------------------------------------------------------------------------- checkpoints by default
def _pretrain_process(prepared, out, *extra: str) -> subprocess.Popen:
    """``lmforge pretrain`` (GPT, clm) of a tiny model in its own process, with the default checkpoint options."""
    args = [sys.executable, "-m", "lmforge", "-q", "pretrain", "--preset", "gpt-nano", "--objective", "clm", "--data",
            str(prepared / "data"), "--out", str(out), "--batch-size", "2", "--seq-len", "16", *TINY, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before {what}: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.02)


def test_kill_9_of_a_default_pretrain_then_resume_auto_equals_the_uninterrupted_run(prepared, tmp_path, capsys):
    """Issue 23: without --save-every nothing was kept, so "after kill -9, continues exactly" did not hold by default.
    Now the default cadence (every 500 steps or 10 minutes) keeps step-500 of a 700-step run."""
    from safetensors.torch import load_file

    from tests.training.helpers import without_timing

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    procs = [_pretrain_process(prepared, whole, "--max-steps", "700"),
             _pretrain_process(prepared, killed, "--max-steps", "700")]
    _wait_for(lambda: (killed / "checkpoints" / "step-500").is_dir(), procs[1], "checkpoint step-500")
    procs[1].kill()  # SIGKILL: no handler, no last checkpoint
    assert procs[1].wait() == -signal.SIGKILL
    assert procs[0].wait(timeout=600) == 0, procs[0].stderr.read()
    assert not (killed / "model.safetensors").exists()
    code = main(["pretrain", "--preset", "gpt-nano", "--objective", "clm", "--data", str(prepared / "data"), "--out",
                 str(killed), "--batch-size", "2", "--seq-len", "16", *TINY, "--max-steps", "700", "--resume", "auto"])
    assert code == 0, capsys.readouterr().err
    a, b = (json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()), \
        (json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines())
    a, b = without_timing(list(a)), without_timing(list(b))
    assert [r["step"] for r in b if "loss" in r] == list(range(1, 701)) and a == b
    wa, wb = load_file(str(whole / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigterm_saves_a_checkpoint_exits_143_and_resume_auto_continues(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    proc = _pretrain_process(prepared, out, "--max-steps", "100000", "--save-every", "0", "--save-minutes", "0")
    metrics = out / "metrics.jsonl"
    _wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 3, proc, "3 logged steps")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    [checkpoint] = (out / "checkpoints").iterdir()
    step = int(checkpoint.name.split("-")[1])
    assert 3 <= step < 100000 and f"training interrupted by SIGTERM: saved {checkpoint}" in err
    assert "continue with --resume auto" in err
    code = main(["pretrain", "--preset", "gpt-nano", "--objective", "clm", "--data", str(prepared / "data"), "--out",
                 str(out), "--batch-size", "2", "--seq-len", "16", *TINY, "--max-steps", str(step + 2), "--resume",
                 "auto"])
    assert code == 0, capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps[-3:] == [step + 1, step + 2, step + 2]  # two more training lines, then the final evaluation


def test_a_recipe_records_how_its_models_fine_tune_and_finetune_takes_it(prepared, tmp_path, capsys, caplog):
    import csv
    import logging

    out = tmp_path / "run"
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('preset = "bert-tiny"\n[finetune]\ntrain = { lr = 2e-3 }\ntask = { pooling = "mean" }\n',
                      encoding="utf-8")
    code = main(["pretrain", "--config", str(recipe), "--objective", "mlm", "--data", str(prepared / "data"),
                 "--out", str(out), "--max-steps", "2", "--batch-size", "4", "--seq-len", "32", *TINY])
    assert code == 0, capsys.readouterr().err
    assert json.loads((out / "run_config.json").read_text())["finetune"] == {"train": {"lr": 2e-3},
                                                                             "task": {"pooling": "mean"}}
    train = tmp_path / "train.csv"
    with train.open("w", newline="") as f:
        csv.writer(f).writerows([["text", "label"]] + [[f"some words number {i}", str(i % 2)] for i in range(8)])
    with caplog.at_level(logging.INFO, logger="lmforge"):
        assert main(["finetune", "--model", str(out), "--train", str(train), "--out", str(tmp_path / "ft"),
                     "--epochs", "1", "--batch-size", "4", "--max-length", "16"]) == 0
    settings = json.loads((tmp_path / "ft" / "run_config.json").read_text())
    assert settings["train"]["lr"] == 2e-3 and settings["task"]["pooling"] == "mean"
    assert "fine-tuning defaults recorded by the pretraining recipe" in caplog.text
    assert main(["finetune", "--model", str(out), "--train", str(train), "--out", str(tmp_path / "ft2"),
                 "--epochs", "1", "--batch-size", "4", "--max-length", "16", "--lr", "1e-4",
                 "--task.pooling=cls"]) == 0  # the user's options win
    settings = json.loads((tmp_path / "ft2" / "run_config.json").read_text())
    assert settings["train"]["lr"] == 1e-4 and settings["task"]["pooling"] == "cls"


def test_a_bad_finetune_table_is_refused_before_training(prepared, tmp_path, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('preset = "bert-tiny"\n[finetune]\ntask = { pooling = "max" }\n', encoding="utf-8")
    assert main(["pretrain", "--config", str(recipe), "--input", str(prepared / "data"), "--out",
                 str(tmp_path / "run"), "--max-steps", "1", "--seq-len", "32", *TINY]) == 2
    err = capsys.readouterr().err
    assert "[finetune] task table" in err and "pooling='max' is not one of cls, mean" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("preset", "objective"), [("gpt-nano", "clm"), ("bert-tiny", "mlm")])
def test_init_from_continues_a_transformer_run_and_refuses_a_size_change(prepared, tmp_path, preset, objective,
                                                                         capsys):
    # a Transformer family has no d_hidden (the LSTMs' size): --init-from compared it and crashed
    first, second = tmp_path / "first", tmp_path / "second"
    base = ["--objective", objective, "--input", str(prepared / "data"), "--max-steps", "2", "--batch-size", "4",
            "--seq-len", "32", *TINY]
    assert main(["pretrain", "--preset", preset, "--out", str(first), *base]) == 0, capsys.readouterr().err
    assert main(["pretrain", "--init-from", str(first), "--out", str(second), *base, "--train.lr=1e-9"]) == 0, \
        capsys.readouterr().err
    a, b = load_pretrained(first).model.state_dict(), load_pretrained(second).model.state_dict()
    assert a.keys() == b.keys()
    for name in a:  # two Adam steps at lr 1e-9 move no weight by more than ~2e-9: the second run starts at the first
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-7, msg=name)
    # the recorded preset is the first run's, not the default the continued run never used
    recorded = json.loads((second / "run_config.json").read_text())
    assert recorded["preset"] == preset and recorded["init_from"] == str(first)
    code = main(["pretrain", "--init-from", str(first), "--out", str(tmp_path / "third"), *base,
                 "--model.d_ff=64"])
    assert code != 0 and "change d_ff" in capsys.readouterr().err


# -------------------------------------------------------------------------------- memories across a kill -9 (issue 38)
_DIE_AT = """
import os, signal, sys
from lmforge.data.lm_stream import LMStreamData
from lmforge.data.plm_stream import PLMStreamData
die_at = int(os.environ["LMFORGE_TEST_DIE_AT"])
for cls in (LMStreamData, PLMStreamData):  # SIGKILL when the die_at-th training batch is asked for
    def wrapped(self, *args, _original=cls.__dict__["_train_batches"], **kwargs):
        for i, batch in enumerate(_original(self, *args, **kwargs), 1):
            if i == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            yield batch
    cls._train_batches = wrapped
from lmforge.cli import main
sys.exit(main(sys.argv[1:]))
"""

_MEMORY_RUNS = {
    "plm": ["--preset", "xlnet-tiny", "--objective", "plm", "--seq-len", "24", "--model.mem_len=16",
            "--data.reuse_len=8", "--data.perm_size=8", "--data.bi_data=true"],
    "txl": ["--preset", "transformer-xl-tiny", "--objective", "txl", "--seq-len", "16", "--model.mem_len=16"],
}


@pytest.mark.parametrize("objective", sorted(_MEMORY_RUNS))
def test_kill_9_then_resume_auto_is_bit_identical_with_the_memory(prepared, tmp_path, capsys, objective):
    """XLNet with memory and Transformer-XL: killed by SIGKILL after the step-4 checkpoint, resumed with --resume
    auto, the run logs the same losses and ends with the same weights as the uninterrupted one (the memory the
    checkpoint kept is the memory the run had)."""
    from safetensors.torch import load_file

    from tests.training.helpers import without_timing

    args = ["pretrain", *_MEMORY_RUNS[objective], "--data", str(prepared / "data"), "--batch-size", "4", *TINY,
            "--model.n_layers=2", "--max-steps", "6", "--save-every", "2", "--train.eval_every=0",
            "--data.eval_fraction=0"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main([*args, "--out", str(whole)]) == 0, capsys.readouterr().err
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src"), "LMFORGE_TEST_DIE_AT": "5"}
    proc = subprocess.run([sys.executable, "-c", _DIE_AT, "-q", *args, "--out", str(killed)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (killed / "checkpoints" / "step-4").is_dir() and not (killed / "model.safetensors").exists()
    memory = load_trainer_state(killed / "checkpoints" / "step-4")["objective"][0]["train_memory"]
    assert memory is not None and len(memory) == 2 and memory[0].shape[:2] == (4, 16)
    assert main([*args, "--out", str(killed), "--resume", "auto"]) == 0, capsys.readouterr().err

    def records(run):
        return without_timing([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()])

    a, b = records(whole), records(killed)
    assert [r["step"] for r in b if "loss" in r] == list(range(1, 7)) and a == b
    wa, wb = load_file(str(whole / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_xlnet_memory_under_two_gloo_processes_resumes_exactly(prepared, tmp_path):
    """Each rank keeps the memory of its own rows; the checkpoint keeps both, and two processes resumed from step 2
    end with the weights of the uninterrupted two-process run."""
    import socket

    from safetensors.torch import load_file

    def launch(out, *extra):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = [sys.executable, "-m", "lmforge", "-q", "pretrain", *_MEMORY_RUNS["plm"], "--data",
                str(prepared / "data"), "--batch-size", "4", *TINY, "--model.n_layers=2", "--max-steps", "4",
                "--save-every", "2", "--train.eval_every=0", "--data.eval_fraction=0", "--out", str(out), *extra]
        procs = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={
            **os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}) for r in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    launch(whole)
    state = load_trainer_state(whole / "checkpoints" / "step-2")
    memories = [s["train_memory"] for s in state["objective"]]
    assert len(memories) == 2 and memories[0][0].shape[:2] == (2, 16)  # per rank: its 2 rows x mem_len
    assert not torch.equal(memories[0][0], memories[1][0])
    launch(resumed, "--resume", str(whole / "checkpoints" / "step-2"))
    wa, wb = load_file(str(whole / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
