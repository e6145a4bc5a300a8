"""``lmforge compare`` on toy data: every approach x size x seed runs and lands in the CSV, table and plot."""

from __future__ import annotations

import csv

from lmforge.cli import main
from lmforge.compare import subset
from tests.toy_tasks import write_sequence

CONFIG = """
out = "{out}"
data = "{data}"
test_fraction = 0.25
sizes = [3, 0]
seeds = [0, 1]
vocab_size = 120
max_length = 16
vectors_dim = 16
vectors_epochs = 1

[[approach]]
name = "Transformer (scratch)"
model = "bert-tiny"
preset_options = {{ max_seq_len = 16, d_model = 16, n_heads = 2 }}
lr = 1e-3
epochs = 1
min_steps = 2

[[approach]]
name = "RNN + word2vec (frozen)"
family = "static"
model = "rnn-attn"
preset_options = {{ d_model = 16 }}
vectors = "word2vec"
freeze = "embeddings"
lr = 1e-3
epochs = 1
min_steps = 2
"""


def test_subset_is_class_balanced_and_seeded():
    labels = ["a"] * 10 + ["b"] * 4
    train = list(range(14))
    chosen = subset(train, labels, 3, seed=0)
    assert sorted(labels[i] for i in chosen) == ["a"] * 3 + ["b"] * 3
    assert chosen == subset(train, labels, 3, seed=0) != subset(train, labels, 3, seed=1)
    assert subset(train, labels, 0, seed=0) == train
    assert len(subset(train, labels, 6, seed=0)) == 10  # a class with fewer examples gives them all


def test_compare_writes_the_table_csv_and_curve(tmp_path, capsys):
    data = write_sequence(tmp_path / "data.csv", 32, 0)
    config = tmp_path / "compare.toml"
    config.write_text(CONFIG.format(out=tmp_path / "out", data=data), encoding="utf-8")
    assert main(["-q", "compare", "--config", str(config)]) == 0
    rows = list(csv.DictReader((tmp_path / "out" / "compare.csv").open()))
    assert len(rows) == 2 * 2 * 2
    assert {r["approach"] for r in rows} == {"Transformer (scratch)", "RNN + word2vec (frozen)"}
    assert {r["size"] for r in rows if r["per_class"] == "3"} == {"6"} and {r["size"] for r in rows
                                                                          if r["per_class"] == "0"} == {"24"}
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in rows)
    table = (tmp_path / "out" / "compare.md").read_text()
    assert "| RNN + word2vec (frozen) | (b) static embeddings |" in table and "±" in table
    assert (tmp_path / "out" / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "out" / "word2vec.txt").is_file()
    assert not (tmp_path / "out" / "runs" / "Transformer_(scratch)-3-0" / "model.safetensors").exists()
    assert "compare.md" in capsys.readouterr().out
