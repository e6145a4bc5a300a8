"""The demo: its steps (``lmforge.recipes.demo``) in the story's order, printed by ``lmforge demo`` as before the
split; ``python -m lmforge.demo`` still runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.recipes import demo


def test_the_demo_folder_is_replaced_only_when_the_demo_made_it(tmp_path):
    out = tmp_path / "demo"
    demo.replace_demo_folder(out)
    (out / "left-over.txt").write_text("x")
    demo.replace_demo_folder(out)
    assert sorted(p.name for p in out.iterdir()) == [demo.MARKER]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(LmforgeError, match="was not made by the demo"):
        demo.replace_demo_folder(mine)
    assert (mine / "notes.txt").read_text() == "keep"


class _Stats:
    def summary(self) -> str:
        return "1,780 files, 2.1 MB"


class _Run:
    preset, model, dropout_off = "bert-mini", {"norm_first": True}, True

    class train:  # noqa: N801 (stands in for a TrainConfig)
        max_steps, batch_size, budget, precision = 0, 32, "3m", "fp32"

    class data:  # noqa: N801
        seq_len, objective, mask_prob = 64, "mlm", 0.4

    def __init__(self, out: Path) -> None:
        self.out = str(out / "bert-mini")


def test_lmforge_demo_runs_the_steps_in_order_and_prints_them(tmp_path, monkeypatch, capsys):
    out, steps = tmp_path / "demo", []

    def step(name, result):
        def run(*args, **kwargs):
            steps.append(name)
            return result(*args) if callable(result) else result
        monkeypatch.setattr(demo, name, run)

    step("training_split", ([Path("a.txt")] * 4, [Path("b.txt")]))
    step("read_training_texts", (["text"] * 4, _Stats()))
    step("replace_demo_folder", None)
    step("train_tokenizer", lambda texts, out, vocab_size, algorithm: demo.TrainedTokenizer(
        algorithm, out / f"tokenizer-{algorithm}", vocab_size, 1.25, 1.5, ["t+h", "th+e"],
        [("Hello there.", ["[CLS]", "hello", "there", ".", "[SEP]"])]))
    step("prepare_shards", lambda tok, files, out: demo.Shards(out / "bbc-shards", {
        "documents": 1780, "sentences": 35242, "tokens": 921818}, 2.4))
    step("build_pretraining", lambda shards, out: demo.Pretraining(_Run(out), None))
    step("pretrain", lambda p: demo.Pretrained(
        p.folder, {"eval_mlm_accuracy": 0.0, "eval_mlm_constant_accuracy": 0.05, "eval_token_cosine": 0.4},
        {"eval_mlm_accuracy": 0.112, "eval_mlm_constant_accuracy": 0.05, "eval_token_cosine": 0.2}, 3.0))

    config = SimpleNamespace(approach=[1, 2, 3], sizes=[10, 50], seeds=[0, 1], out=str(out / "compare"))
    step("comparison_config", lambda path, out, tok, pretrained: steps.append((tok.name, pretrained.name)) or config)
    md = tmp_path / "compare.md"
    md.write_text("| the table |\n", encoding="utf-8")
    step("compare", ({"md": md, "csv": Path("c.csv"), "png": Path("c.png")}, 7.5))

    assert main(["demo", "--out", str(out), "--vocab-size", "500"]) == 0
    assert steps == ["training_split", "read_training_texts", "replace_demo_folder", "train_tokenizer",
                     "train_tokenizer", "prepare_shards", "build_pretraining", "pretrain", "comparison_config",
                     ("tokenizer-bpe-count", "bert-mini"), "compare"]
    printed = capsys.readouterr().out
    expected = f"""BBC News training split (4 articles; 1 held out): 1,780 files, 2.1 MB

== tokenizer (wordpiece): 500 tokens in 1.2 s; 1.50 pieces per word on BBC News
   first merges: t+h, th+e
   Hello there.
     -> [CLS] hello there . [SEP]

== tokenizer (bpe-count): 500 tokens in 1.2 s; 1.50 pieces per word on BBC News
   first merges: t+h, th+e
   Hello there.
     -> [CLS] hello there . [SEP]

== shards: 1,780 documents, 35,242 sentences, 921,818 tokens in 2.4 s -> {out}/bbc-shards

== pretraining bert-mini (objective mlm, mask rate 0.4, pre-LN, no dropout while pretraining; a budget of 3m, \
batches of 32 x 64) -> {out}/bert-mini

   held-out documents      before    after (3.0 min)
   MLM accuracy              0.000    0.112
     best constant guess     0.050    0.050
   token-state cosine        0.400    0.200
   loss curve: {out}/bert-mini/loss_curve.png; metrics: {out}/bert-mini/metrics.jsonl; model: {out}/bert-mini \
(loads with lmforge.load_pretrained, `lmforge embed --model {out}/bert-mini`)

== the comparison (3 approaches x 2 sizes x 2 seeds) -> {out}/compare

| the table |

   7.5 min; table: {md}; csv: c.csv; learning curve: c.png
"""
    assert printed.startswith(expected), printed
    assert printed[len(expected):].startswith("\nthe demo took ")


def test_python_m_lmforge_demo_still_answers():
    """The old invocation (``make demo`` before ``lmforge demo``) keeps its options; a bad value exits 2."""
    result = subprocess.run([sys.executable, "-m", "lmforge.demo", "--help"], capture_output=True, text=True,
                            check=True)
    for option in ("--out", "--vocab-size", "--steps", "--compare-config"):
        assert option in result.stdout
    bad = subprocess.run([sys.executable, "-m", "lmforge.demo", "--steps", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--steps" in bad.stderr


def test_the_demo_pretrains_with_the_small_budget_recipe(tmp_path, monkeypatch):
    import lmforge.recipes.pretrain as pretrain

    monkeypatch.setattr(pretrain, "build_trainer", lambda run, overwrite: None)
    shards = demo.Shards(tmp_path / "shards", {}, 0.0)
    made = demo.build_pretraining(shards, tmp_path)
    run = made.run
    assert run.data.path == str(tmp_path / "shards") and run.out == str(tmp_path / "bert-mini")
    assert run.data.objective == "mlm" and run.data.mask_prob == 0.4 and run.dropout_off
    from lmforge.config import model_config_from_preset

    config = model_config_from_preset(run.preset, **run.model)
    assert config.norm_first and not config.tie_embeddings and run.train.precision == "auto"
    assert run.train.budget == "6m" and run.train.eval_every == 200
    assert demo.build_pretraining(shards, tmp_path, budget="5m").run.train.budget == "5m"
    counted = demo.build_pretraining(shards, tmp_path, steps=40).run.train
    assert counted.budget == "" and counted.max_steps == 40 and counted.eval_every == 10
    assert made.describe().startswith("bert-mini-budget (objective mlm, mask rate 0.4, pre-LN, untied MLM "
                                      "un-embedding, rotary positions, no dropout while pretraining, precision "
                                      "auto; a budget of 6m")
