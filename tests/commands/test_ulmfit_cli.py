"""ULMFiT's three stages end to end on a small slice of BBC News (Howard & Ruder 2018): (a) AWD-LSTM language-model
pretraining, (b) LM fine-tuning on the target text from stage (a)'s run, (c) the classifier; plus generation from
the LM run and the clear errors of bad input."""

from __future__ import annotations

import csv
import json

import pytest

from lmforge.cli import main
from lmforge.persistence import load_pretrained

TINY = ["--model.d_model=16", "--model.d_hidden=24", "--model.n_layers=2", "--train.log_every=1",
        "--train.eval_batches=2"]


@pytest.fixture(scope="module")
def ulmfit(tmp_path_factory, bbc_dir):
    root = tmp_path_factory.mktemp("ulmfit")
    general, target = root / "general", root / "target"
    general.mkdir()
    target.mkdir()
    for topic in ("business", "politics"):
        for path in sorted((bbc_dir / topic).glob("*.txt"))[:12]:
            (general / f"{topic}-{path.name}").write_bytes(path.read_bytes())
    rows = []
    for topic in ("tech", "sports"):
        for path in sorted((bbc_dir / topic).glob("*.txt"))[:12]:
            (target / f"{topic}-{path.name}").write_bytes(path.read_bytes())
            rows.append((path.read_text(encoding="utf-8", errors="replace").replace("\n", " "), topic))
    with open(root / "train.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *rows[::2], *rows[1::4]])
    with open(root / "dev.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *rows[1::2]])
    assert main(["-q", "tokenizer", "train", "--input", str(general), "--vocab-size", "500", "--out",
                 str(root / "tok"), "--algorithm", "bpe-count"]) == 0
    assert main(["-q", "data", "prepare", "--tokenizer", str(root / "tok"), "--input", str(general), "--out",
                 str(root / "data_a"), "--workers", "1"]) == 0
    # stage (a): general-domain LM
    assert main(["-q", "pretrain", "--preset", "awd-lstm-small", "--objective", "awd_lm", "--input",
                 str(root / "data_a"), "--out", str(root / "lm_a"), "--max-steps", "4", "--batch-size", "4",
                 "--seq-len", "20", "--lr", "3e-3", "--train.schedule=slanted_triangular", *TINY]) == 0
    # stage (b): the target text, prepared with stage (a)'s tokenizer, from stage (a)'s weights
    assert main(["-q", "data", "prepare", "--tokenizer", str(root / "lm_a"), "--input", str(target), "--out",
                 str(root / "data_b"), "--workers", "1"]) == 0
    assert main(["-q", "pretrain", "--init-from", str(root / "lm_a"), "--objective", "awd_lm", "--input",
                 str(root / "data_b"), "--out", str(root / "lm_b"), "--max-steps", "3", "--batch-size", "4",
                 "--seq-len", "20", "--layer-decay", "0.385", "--train.schedule=slanted_triangular",
                 "--train.log_every=1"]) == 0
    return root


def records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_stage_a_logs_held_out_perplexity(ulmfit):
    results = json.loads((ulmfit / "lm_a" / "eval_results.json").read_text())
    assert results["eval_ppl_lm"] > 1 and "eval_loss_lm" in results
    assert [r["step"] for r in records(ulmfit / "lm_a") if "loss" in r] == [1, 2, 3, 4]
    loaded = load_pretrained(ulmfit / "lm_a")
    assert loaded.config.arch == "awd_lstm" and loaded.config.d_model == 16 and loaded.tokenizer is not None


def test_stage_b_starts_from_stage_a_with_discriminative_rates(ulmfit):
    import torch

    a, b = load_pretrained(ulmfit / "lm_a"), load_pretrained(ulmfit / "lm_b")
    assert b.config == a.config  # the sizes come from the run it starts from, not from a preset
    run_config = json.loads((ulmfit / "lm_b" / "run_config.json").read_text())
    assert run_config["init_from"] == str(ulmfit / "lm_a") and run_config["layer_decay"] == 0.385
    # it trained: weights moved from stage (a)'s, the bottom (embeddings) least, by the 2.6-fold rates
    delta = {n: float((pb - a.model.state_dict()[n]).abs().max()) for n, pb in b.model.state_dict().items()}
    assert delta["lm_bias"] > 0 and delta["embeddings.weight"] > 0
    assert delta["embeddings.weight"] < delta["lm_bias"]
    assert torch.is_tensor(b.model.lm_bias)


def test_stage_c_classifier_with_gradual_unfreezing_and_stlr(ulmfit, capsys):
    out = ulmfit / "clf"
    assert main(["-q", "finetune", "--task", "sequence", "--model", str(ulmfit / "lm_b"), "--train",
                 str(ulmfit / "train.csv"), "--dev", str(ulmfit / "dev.csv"), "--out", str(out), "--max-length",
                 "300", "--batch-size", "6", "--epochs", "3", "--lr", "5e-3", "--task.gradual_unfreezing=true",
                 "--task.layer_decay=0.385", "--train.schedule=slanted_triangular"]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert {"accuracy", "f1"} <= set(results)
    loaded = load_pretrained(out)
    assert loaded.head["type"] == "sequence_classification"
    assert type(loaded.model.head).__name__ == "ConcatPoolingClassifierHead"
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--test", str(ulmfit / "dev.csv")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["accuracy"] == pytest.approx(results["accuracy"])
    # the stage-(c) folder holds a finetune checkpoint: resuming it as an LM stage is refused, naming both
    code = main(["pretrain", "--init-from", str(ulmfit / "lm_a"), "--objective", "awd_lm", "--input",
                 str(ulmfit / "data_b"), "--out", str(out), "--max-steps", "6", "--batch-size", "4",
                 "--seq-len", "20", "--resume", "auto"])
    assert code != 0
    err = capsys.readouterr().err
    assert "another kind of run (finetune (task sequence))" in err and "own --out folder" in err


def test_generate_continues_a_prompt_from_the_lm_run(ulmfit, capsys):
    capsys.readouterr()
    assert main(["generate", "--model", str(ulmfit / "lm_b"), "--prompt", "the company said", "--max-new-tokens",
                 "5", "--json"]) == 0
    [line] = capsys.readouterr().out.strip().splitlines()
    assert json.loads(line)["prompt"] == "the company said"


def test_stage_a_with_the_papers_initialisation_and_nt_asgd(ulmfit, tmp_path, capsys):
    from lmforge.training import latest_checkpoint, load_trainer_state

    out = tmp_path / "nt"
    args = ["pretrain", "--preset", "awd-lstm-small", "--objective", "awd_lm", "--input", str(ulmfit / "data_a"),
            "--out", str(out), "--batch-size", "4", "--seq-len", "20", "--train.lr=30", "--train.optimizer=nt_asgd",
            "--train.max_grad_norm=0.25", "--train.schedule=constant", "--train.warmup_steps=0",
            "--model.init_range=0.1", *TINY]
    assert main([*args, "--max-steps", "2"]) != 0  # no evaluation: the trigger could never fire
    assert "optimizer nt_asgd starts averaging when the held-out loss stops improving" in capsys.readouterr().err
    assert main(["-q", *args, "--max-steps", "3", "--eval-every", "1", "--train.nonmono=2"]) == 0
    trigger = load_trainer_state(latest_checkpoint(out))["components"]["optimizer"]["nt_asgd"]
    evals = [r["eval_loss"] for r in records(out) if "eval_loss" in r]
    assert trigger["logs"] == pytest.approx(evals) and trigger["trigger_step"] is None  # 3 checks: n = 2 needs 3+
    assert main(["-q", *args, "--max-steps", "5", "--eval-every", "1", "--train.nonmono=2", "--resume", "auto"]) == 0
    assert [r["step"] for r in records(out) if "eval_loss" in r] == [1, 2, 3, 4, 5]
    assert load_pretrained(out).config.init_range == 0.1


def test_a_corpus_too_small_for_the_bptt_length(ulmfit, tmp_path, capsys):
    code = main(["pretrain", "--preset", "awd-lstm-small", "--objective", "awd_lm", "--input", str(ulmfit / "data_a"),
                 "--out", str(tmp_path / "x"), "--max-steps", "2", "--batch-size", "4", "--seq-len", "100000",
                 *TINY])
    assert code != 0
    assert "fewer than one BPTT window of data.seq_len=100000 + 1; add text, or lower --seq-len" in \
        capsys.readouterr().err


def test_a_pretrained_folder_fine_tunes_with_other_dropouts_but_not_other_sizes(ulmfit):
    import torch

    from lmforge.errors import LmforgeError
    from lmforge.recipes.finetune import load_encoder

    lm = load_pretrained(ulmfit / "lm_b")
    backbone, config, _ = load_encoder(str(ulmfit / "lm_b"), preset_options={"output_p": 0.2, "weight_p": 0.1})
    assert (config.output_p, config.weight_p) == (0.2, 0.1)
    assert backbone.layers[0].weight_p == 0.1  # the DropConnect module was rebuilt with the new rate
    weights = lm.model.state_dict()
    mine = backbone.state_dict()
    assert weights.keys() <= mine.keys()
    assert all(torch.equal(mine[k], weights[k]) for k in weights if k in mine)
    with pytest.raises(LmforgeError, match=r"--model\.d_model.*dropouts may change.*--model\.output_p"):
        load_encoder(str(ulmfit / "lm_b"), preset_options={"d_model": 8})


def test_stage_b_on_one_text_per_line_holds_texts_out_for_its_perplexity(ulmfit, tmp_path, capsys):
    # the target data of ULMFiT is often short texts, one per line with no blank line (tweets, reviews, questions):
    # `data prepare` reads each line as a document, so stage (b) holds some out and reports a held-out perplexity
    # (issue 37, item 7)
    texts = []
    for path in sorted((ulmfit / "target").glob("*.txt")):
        texts += [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
                  if 20 < len(line.strip()) < 400]
    assert len(texts) > 40
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "reviews.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["data", "prepare", "--tokenizer", str(ulmfit / "lm_a"), "--input", str(tmp_path / "texts"),
                 "--out", str(tmp_path / "data"), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "1 file(s) as texts (one text per line, each a document" in err
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["counts"]["documents"] == len(texts)
    assert main(["-q", "pretrain", "--init-from", str(ulmfit / "lm_a"), "--objective", "awd_lm", "--input",
                 str(tmp_path / "data"), "--out", str(tmp_path / "lm_b"), "--max-steps", "2", "--batch-size", "2",
                 "--seq-len", "16", "--train.schedule=slanted_triangular"]) == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "lm_b" / "eval_results.json").read_text())
    assert results["eval_ppl_lm"] > 1
