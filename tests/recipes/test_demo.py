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
    class train:  # noqa: N801 (stands in for a TrainConfig)
        max_steps, batch_size = 300, 32

    class data:  # noqa: N801
        seq_len = 64

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
    step("build_pretraining", lambda shards, out, n: demo.Pretraining(_Run(out), None))
    step("pretrain", lambda p: demo.Pretrained(p.folder, {"eval_mlm_accuracy": 0.0, "eval_nsp_accuracy": 0.5},
                                               {"eval_mlm_accuracy": 0.048, "eval_nsp_accuracy": 0.449}, 2.5))

    config = SimpleNamespace(approach=[1, 2, 3], sizes=[10, 50], seeds=[0, 1], out=str(out / "compare"))
    step("comparison_config", lambda path, out, tok, pretrained: steps.append((tok.name, pretrained.name)) or config)
    md = tmp_path / "compare.md"
    md.write_text("| the table |\n", encoding="utf-8")
    step("compare", ({"md": md, "csv": Path("c.csv"), "png": Path("c.png")}, 7.5))

    assert main(["demo", "--out", str(out), "--vocab-size", "500", "--steps", "300"]) == 0
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

== pretraining bert-mini (MLM + NSP, 300 steps of 32 x 64) -> {out}/bert-mini

   held-out documents      before    after (2.5 min)
   MLM accuracy              0.000    0.048
   NSP accuracy              0.500    0.449
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
