"""``lmforge compare`` on toy data: every approach x size x seed runs and lands in the CSV, table and plot."""

from __future__ import annotations

import csv
import json
import re

import pytest

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.recipes.compare import compare_config, learning_curve_figure, subset
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


def _result(approach: str, family: str, per_class: int, size: int, seed: int, accuracy: float) -> dict:
    return {"approach": approach, "family": family, "per_class": per_class, "size": size, "seed": seed,
            "accuracy": accuracy, "f1": accuracy, "seconds": 1.0, "steps": 2}


def test_the_learning_curve_counts_per_class_and_names_only_the_families_present():
    """issue 23: the curve counted examples in total while the table counts per class, and its title always named
    four families."""
    config = compare_config({"sizes": [10, 50, 0], "seeds": [0, 1], "approach": [
        {"name": "Transformer", "model": "bert-tiny"},
        {"name": "RNN + word2vec", "family": "static", "model": "rnn-attn", "vectors": "word2vec"},
        {"name": "MiniLM fine-tuned", "family": "finetune", "model": "@minilm"}]}, "test")
    results = [_result("Transformer", "scratch", 10, 40, 0, 0.3), _result("Transformer", "scratch", 10, 40, 1, 0.5),
               _result("Transformer", "scratch", 50, 200, 0, 0.6), _result("Transformer", "scratch", 0, 1000, 0, 0.9),
               _result("RNN + word2vec", "static", 10, 40, 0, 0.7)]  # 4 classes; the MiniLM runs never finished
    ax = learning_curve_figure(config, results).axes[0]
    assert ax.get_title() == "Learning curves: (a) from scratch, (b) static embeddings"
    assert ax.get_legend_handles_labels()[1] == ["(a) Transformer", "(b) RNN + word2vec"]
    assert ax.get_xlabel() == "training examples per class (log scale)"
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) and line.get_marker() == "o"]
    transformer = lines[0]
    assert list(transformer.get_xdata()) == [10, 50, 250]  # 'all' = 1000 examples / 4 classes
    assert list(transformer.get_ydata()) == pytest.approx([0.4, 0.6, 0.9])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10", "50", "all\n(250)"]
    assert learning_curve_figure(config, results, n_classes=5).axes[0].get_lines()[0].get_xdata()[-1] == 200
    with pytest.raises(LmforgeError, match="no finished run"):
        learning_curve_figure(config, [])


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


def _small_config(tmp_path, max_length: int = 16) -> str:
    """The toy comparison with one size, written to its own file."""
    data = write_sequence(tmp_path / "data.csv", 32, 0)
    text = CONFIG.format(out=tmp_path / "out", data=data).replace("sizes = [3, 0]", "sizes = [3]")
    path = tmp_path / f"compare-{max_length}.toml"
    path.write_text(text.replace("\nmax_length = 16\n", f"\nmax_length = {max_length}\n"), encoding="utf-8")
    return str(path)


def test_an_interrupted_comparison_resumes_without_repeating_finished_runs(tmp_path, monkeypatch):
    import lmforge.recipes.compare.run as compare  # where run_compare looks up its steps

    real, calls = compare.run_one, []

    def flaky(approach, config, *args, **kwargs):
        calls.append((approach.name, args[3]))  # (name, seed)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the machine goes down during the third run
        return real(approach, config, *args, **kwargs)

    monkeypatch.setattr(compare, "run_one", flaky)
    config = _small_config(tmp_path)
    assert main(["-q", "compare", "--config", config]) == 130  # interrupted
    out = tmp_path / "out"
    assert len((out / "runs.jsonl").read_text().splitlines()) == 2 and not (out / "compare.csv").exists()

    assert main(["-q", "compare", "--config", config]) == 2  # it holds a comparison: neither flag -> refused
    calls.clear()
    assert main(["-q", "compare", "--config", config, "--resume"]) == 0
    assert calls == [("RNN + word2vec (frozen)", 0), ("RNN + word2vec (frozen)", 1)]  # only the two not finished
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert len(rows) == 4

    calls.clear()  # adding a seed on resume runs only the new seed's runs
    assert main(["-q", "compare", "--config", config, "--resume", "--seeds", "0,1,2"]) == 0
    assert sorted(calls) == [("RNN + word2vec (frozen)", 2), ("Transformer (scratch)", 2)]
    assert len(list(csv.DictReader((out / "compare.csv").open()))) == 6


def test_a_failing_step_is_named_and_finished_runs_are_kept(tmp_path, monkeypatch, capsys):
    """Issue 23: a diverged word2vec surfaced later as "the loss is nan" on some classifier; now each step of the
    comparison (vectors, pretraining, every approach x size x seed) names itself in the error."""
    import lmforge.recipes.compare.run as compare  # where run_compare looks up its steps

    def diverging_vectors(kind, *args, **kwargs):
        raise LmforgeError("word2vec diverged: the loss became nan in epoch 1 (learning rate 0.02)")

    monkeypatch.setattr(compare, "train_static_vectors", diverging_vectors)
    config = _small_config(tmp_path)
    assert main(["-q", "compare", "--config", config]) == 2
    err = capsys.readouterr().err
    assert "compare stopped at training the word2vec vectors (vectors_dim 16, 1 epochs): word2vec diverged" in err
    monkeypatch.undo()

    real = compare.run_one

    def diverging_rnn(approach, *args, **kwargs):
        if approach.family == "static":
            raise LmforgeError("training diverged: the loss is nan at step 3 (lr 0.001)")
        return real(approach, *args, **kwargs)

    monkeypatch.setattr(compare, "run_one", diverging_rnn)
    assert main(["-q", "compare", "--config", config, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "compare stopped at approach 'RNN + word2vec (frozen)' (3 per class, seed 0; folder " in err
    assert "training diverged: the loss is nan at step 3" in err and "continue with --resume" in err
    assert len((tmp_path / "out" / "runs.jsonl").read_text().splitlines()) == 2  # the Transformer's two seeds


def test_resume_refuses_changed_data_settings_and_overwrite_moves_the_old_folder(tmp_path, capsys):
    config = _small_config(tmp_path)
    assert main(["-q", "compare", "--config", config, "--only", "Transformer (scratch)", "--seeds", "0"]) == 0
    changed = _small_config(tmp_path, max_length=12)
    assert main(["-q", "compare", "--config", changed, "--resume"]) == 2
    assert "max_length (was 16, now 12)" in capsys.readouterr().err
    assert main(["-q", "compare", "--config", changed, "--overwrite", "--only", "Transformer (scratch)",
                 "--seeds", "0"]) == 0
    assert len(list(tmp_path.glob("out.old-*"))) == 1 and (tmp_path / "out" / "compare.csv").is_file()


def test_a_missing_pretrained_model_fails_before_any_run(tmp_path, capsys):
    config = tmp_path / "compare.toml"
    data = write_sequence(tmp_path / "data.csv", 32, 0)
    config.write_text(f'out = "{tmp_path / "out"}"\ndata = "{data}"\npretrained = "{tmp_path / "nowhere"}"\n\n'
                      '[[approach]]\nname = "ours"\nfamily = "finetune"\nmodel = "@pretrained"\n', encoding="utf-8")
    assert main(["-q", "compare", "--config", str(config)]) == 2
    assert "uses @pretrained" in capsys.readouterr().err and not (tmp_path / "out").exists()


PRETRAIN = """
out = "{out}"
data = "{data}"
test_fraction = 0.25
sizes = [3]
seeds = [0]
vocab_size = 120
max_length = 16

[[pretrain]]
name = "tiny-mlm"
preset = "bert-tiny"
objective = "mlm"
model = {{ max_seq_len = 16, d_model = 16, n_heads = 2 }}
data = {{ seq_len = 16 }}
train = {{ max_steps = 4, batch_size = 4 }}

[[approach]]
name = "tiny, pretrained here"
family = "finetune"
model = "@tiny-mlm"
lr = 1e-3
epochs = 1
min_steps = 2
task = {{ layer_decay = 0.5 }}
train = {{ schedule = "cosine" }}
"""


def test_a_model_pretrained_by_the_comparison_is_built_once_timed_and_reused_on_resume(tmp_path, monkeypatch):
    import lmforge.recipes.compare.run as compare  # where run_compare looks up its steps

    data = write_sequence(tmp_path / "data.csv", 32, 0)
    config = tmp_path / "compare.toml"
    config.write_text(PRETRAIN.format(out=tmp_path / "out", data=data), encoding="utf-8")
    assert main(["-q", "compare", "--config", str(config)]) == 0
    out = tmp_path / "out"
    model = out / "pretrained" / "tiny-mlm"
    assert (model / "config.json").is_file() and (model / "metrics.jsonl").is_file()
    table = (out / "compare.md").read_text()
    assert re.search(r"\| tiny, pretrained here \(pretrained here: \d+ s\) \|", table)
    assert "Pretrained by lmforge once, on the training texts only" in table
    assert "tiny-mlm (bert-tiny, objective mlm)" in table
    run_config = (out / "runs" / "tiny,_pretrained_here-3-0" / "run_config.json").read_text()
    assert '"layer_decay": 0.5' in run_config and '"schedule": "cosine"' in run_config  # the approach's overrides

    calls = []
    monkeypatch.setattr(compare, "pretrain_here", lambda *a, **k: calls.append(a) or 1.0)
    assert main(["-q", "compare", "--config", str(config), "--resume", "--seeds", "0,1"]) == 0
    assert calls == []  # pretrained before: not again


def test_a_pretrain_table_takes_a_budget_instead_of_a_step_count(tmp_path):
    data = write_sequence(tmp_path / "data.csv", 32, 0)
    config = tmp_path / "compare.toml"
    text = PRETRAIN.replace("train = {{ max_steps = 4, batch_size = 4 }}",
                            'train = {{ budget = "150tok", batch_size = 4 }}')
    config.write_text(text.format(out=tmp_path / "out", data=data), encoding="utf-8")
    assert main(["-q", "compare", "--config", str(config)]) == 0
    model = tmp_path / "out" / "pretrained" / "tiny-mlm"
    run_config = json.loads((model / "run_config.json").read_text())
    assert run_config["train"]["budget"] == "150tok" and run_config["train"]["max_steps"] is None
    train = [json.loads(line) for line in (model / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "loss" in r]
    assert train[-1]["budget_fraction"] >= 1.0 and train[-1]["tokens"] >= 150 > train[-1]["tokens"] - 64
    assert (model / "config.json").is_file()


@pytest.mark.parametrize(("edit", "message"), [
    (('model = "@tiny-mlm"', 'model = "@nothing"'), "names no [[pretrain]] table"),
    (('name = "tiny-mlm"', 'name = "minilm"'), "use letters, digits"),
    (("data = {{ seq_len = 16 }}", 'data = {{ seq_len = 16, objective = "clm" }}'), "data.objective is set by"),
    (('preset = "bert-tiny"', 'preset = "bert-huge"'), "preset='bert-huge' is not one of"),
])
def test_bad_pretrain_tables_fail_before_any_work(tmp_path, capsys, edit, message):
    data = write_sequence(tmp_path / "data.csv", 32, 0)
    config = tmp_path / "compare.toml"
    text = PRETRAIN.replace(edit[0], edit[1])
    config.write_text(text.format(out=tmp_path / "out", data=data), encoding="utf-8")
    assert main(["-q", "compare", "--config", str(config)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "pretrained").exists()


def test_ulmfit_and_elmo_rows_pretrained_by_the_comparison(tmp_path):
    data = write_sequence(tmp_path / "data.csv", 32, 0)
    config = tmp_path / "compare.toml"
    config.write_text(f"""
out = "{tmp_path / 'out'}"
data = "{data}"
test_fraction = 0.25
sizes = [3]
seeds = [0]
vocab_size = 120
max_length = 16

[[pretrain]]
name = "awd"
preset = "awd-lstm-small"
objective = "awd_lm"
model = {{ d_model = 16, d_hidden = 32 }}
data = {{ seq_len = 8 }}
train = {{ max_steps = 3, batch_size = 4, schedule = "slanted_triangular" }}

[[pretrain]]
name = "elmo"
preset = "elmo-small"
objective = "bilm"
model = {{ d_model = 16, d_cell = 32, char_filters = [[1, 8], [2, 8]], max_chars_per_token = 10 }}
data = {{ seq_len = 8 }}
train = {{ max_steps = 3, batch_size = 4 }}

[[approach]]
name = "ULMFiT"
family = "finetune"
model = "@awd"
lr = 4e-3
epochs = 3
min_steps = 3
task = {{ gradual_unfreezing = true, layer_decay = 0.385 }}
train = {{ schedule = "slanted_triangular" }}

[[approach]]
name = "RNN on ELMo"
family = "frozen"
model = "@elmo"
lr = 2e-3
epochs = 1
min_steps = 2
""", encoding="utf-8")
    assert main(["-q", "compare", "--config", str(config)]) == 0
    out = tmp_path / "out"
    for name in ("awd", "elmo"):
        assert (out / "pretrained" / name / "config.json").is_file()
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert {r["approach"] for r in rows} == {"ULMFiT", "RNN on ELMo"}
    run_config = (out / "runs" / "ULMFiT-3-0" / "run_config.json").read_text()
    assert '"gradual_unfreezing": true' in run_config and '"schedule": "slanted_triangular"' in run_config
    table = (out / "compare.md").read_text()
    assert "awd (awd-lstm-small, objective awd_lm)" in table and "elmo (elmo-small, objective bilm)" in table


def test_static_vectors_fall_back_to_the_fast_mode_without_the_compiled_loop(tmp_path, monkeypatch, caplog):
    from lmforge.embeddings import sgns
    from lmforge.recipes.compare import train_static_vectors

    monkeypatch.setattr(sgns, "_library", lambda: None)
    sentences = [[f"w{(7 * i + j) % 300}" for j in range(8)] for i in range(400)]  # rare words: subsampling keeps them
    with caplog.at_level("WARNING", logger="lmforge"):
        out = train_static_vectors("word2vec", sentences, tmp_path / "w2v.txt", dim=4, epochs=1, window=2, seed=0)
    assert out.read_text().splitlines()[0] == "300 4"
    assert "mode fast" in caplog.text


def test_a_forward_and_backward_ensemble_and_a_pretrain_table_added_on_resume(tmp_path, capsys):
    data = write_sequence(tmp_path / "data.csv", 32, 0)
    common = f"""
out = "{tmp_path / 'out'}"
data = "{data}"
test_fraction = 0.25
sizes = [3]
seeds = [0]
vocab_size = 120
max_length = 16
keep_models = true

[[pretrain]]
name = "fwd"
preset = "awd-lstm-small"
objective = "awd_lm"
model = {{ d_model = 16, d_hidden = 32 }}
data = {{ seq_len = 8 }}
train = {{ max_steps = 3, batch_size = 4 }}
"""
    approach = """
[[approach]]
name = "ULMFiT"
family = "finetune"
model = "@fwd"
lr = 4e-3
epochs = 2
min_steps = 2
"""
    config = tmp_path / "compare.toml"
    config.write_text(common + approach, encoding="utf-8")
    assert main(["-q", "compare", "--config", str(config)]) == 0
    # a new [[pretrain]] table and an approach that uses it: the finished run and the forward model are kept
    config.write_text(common + """
[[pretrain]]
name = "bwd"
preset = "awd-lstm-small"
objective = "awd_lm"
model = { d_model = 16, d_hidden = 32, reverse = true }
data = { seq_len = 8 }
train = { max_steps = 3, batch_size = 4 }
""" + approach + """
[[approach]]
name = "ULMFiT fwd+bwd"
family = "finetune"
model = "@fwd"
ensemble = ["@bwd"]
lr = 4e-3
epochs = 2
min_steps = 2
""", encoding="utf-8")
    out = tmp_path / "out"
    forward_weights = (out / "pretrained" / "fwd" / "model.safetensors").stat().st_mtime_ns
    assert main(["-q", "compare", "--config", str(config), "--resume"]) == 0
    assert (out / "pretrained" / "fwd" / "model.safetensors").stat().st_mtime_ns == forward_weights
    assert json.loads((out / "pretrained" / "bwd" / "config.json").read_text())["model"]["reverse"] is True
    assert set(json.loads((out / "pretrained.json").read_text())) == {"fwd", "bwd"}
    rows = {r["approach"]: r for r in csv.DictReader((out / "compare.csv").open())}
    assert set(rows) == {"ULMFiT", "ULMFiT fwd+bwd"}
    members = [out / "runs" / "ULMFiT_fwd+bwd-3-0", out / "runs" / "ULMFiT_fwd+bwd-3-0-2"]
    assert all((m / "config.json").is_file() for m in members)
    from lmforge.recipes.ensemble import Ensemble

    ensemble = Ensemble([str(m) for m in members])
    test_file = str(out / "data" / "test.csv")
    examples = ensemble.read(test_file, labelled=True)
    expected = ensemble.task.metrics(examples, ensemble.predict(examples, test_file))
    assert float(rows["ULMFiT fwd+bwd"]["accuracy"]) == pytest.approx(expected["accuracy"], abs=1e-6)
    # a changed table is still refused, by name
    config.write_text(config.read_text().replace("max_steps = 3, batch_size = 4 }\n\n[[approach]]",
                                                 "max_steps = 4, batch_size = 4 }\n\n[[approach]]", 1), "utf-8")
    capsys.readouterr()
    assert main(["-q", "compare", "--config", str(config), "--resume"]) != 0
    assert "[[pretrain]] 'bwd' (changed)" in capsys.readouterr().err
