"""``lmforge compare`` with a dev split: settings chosen on it from a small grid, the test split scored once, by the
chosen model only; the dev split never trained on."""

from __future__ import annotations

import contextlib
import csv
import json

import pytest

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.recipes.compare import compare_config
from lmforge.recipes.compare.config import Approach
from lmforge.recipes.compare.data import split_data
from lmforge.recipes.compare.folder import run_key
from tests.toy_tasks import write_sequence

CONFIG = """
out = "{out}"
data = "{data}"
test_fraction = 0.25
dev_fraction = 0.25
sizes = [3]
seeds = [0, 1]
vocab_size = 120
max_length = 16

[[approach]]
name = "Transformer (scratch)"
model = "bert-tiny"
preset_options = {{ max_seq_len = 16, d_model = 16, n_heads = 2 }}
lr = 1e-3
epochs = 1
min_steps = 2
grid = {{ lr = [1e-3, 3e-3], "task.reinit_layers" = [0] }}
"""


def test_the_dev_split_is_carved_from_the_training_split_stratified_and_capped(tmp_path):
    data = write_sequence(tmp_path / "data.csv", 64, 0)
    base = {"data": str(data), "test_fraction": 0.25, "approach": [{"name": "a", "model": "bert-tiny"}]}
    plain = split_data(compare_config(base, "t"), tmp_path / "plain")
    with_dev = split_data(compare_config({**base, "dev_fraction": 0.25}, "t"), tmp_path / "dev")
    assert with_dev.test == plain.test  # the test split does not move
    assert sorted(with_dev.train + with_dev.dev) == plain.train and not set(with_dev.train) & set(with_dev.dev)
    assert len(with_dev.dev) == round(0.25 * len(plain.train))
    labels = with_dev.labels
    assert {labels[i] for i in with_dev.dev} == {labels[i] for i in plain.train}  # every class in dev
    assert with_dev.dev_file is not None and len(list(csv.reader(with_dev.dev_file.open()))) == len(with_dev.dev) + 1
    assert plain.dev_file is None and not (tmp_path / "plain" / "dev.csv").exists()
    capped = split_data(compare_config({**base, "dev_fraction": 0.25, "max_dev": 4}, "t"), tmp_path / "capped")
    assert len(capped.dev) == 4 and sorted(capped.train + capped.dev) == plain.train  # the rest trains
    assert sorted(labels[i] for i in capped.dev) == ["neg", "neg", "pos", "pos"]  # class-balanced


def test_grid_points_and_their_settings():
    approach = Approach(name="a", model="bert-tiny", lr=1e-4, task={"freeze": "none"},
                        grid={"lr": [1e-3, 2e-3], "task.reinit_layers": [0, 1], "train.warmup_ratio": [0.2]})
    points = approach.grid_points()
    assert points == [{"lr": 1e-3, "task.reinit_layers": 0, "train.warmup_ratio": 0.2},
                      {"lr": 1e-3, "task.reinit_layers": 1, "train.warmup_ratio": 0.2},
                      {"lr": 2e-3, "task.reinit_layers": 0, "train.warmup_ratio": 0.2},
                      {"lr": 2e-3, "task.reinit_layers": 1, "train.warmup_ratio": 0.2}]
    chosen = approach.at(points[3])
    assert chosen.lr == 2e-3 and chosen.task == {"freeze": "none", "reinit_layers": 1}
    assert chosen.train == {"warmup_ratio": 0.2} and chosen.grid == {} and approach.lr == 1e-4
    assert Approach(name="b", model="m").grid_points() == [{}]


@pytest.mark.parametrize("grid, message", [({"dropout": [0.1]}, "grid key 'dropout' is not one of"),
                                           ({"lr": []}, "grid.lr must be a non-empty list"),
                                           ({"lr": 1e-3}, "grid.lr must be a non-empty list")])
def test_bad_grids_are_refused_by_name(grid, message):
    with pytest.raises(LmforgeError, match=message):
        Approach(name="a", model="bert-tiny", grid=grid)


def test_a_grid_without_a_dev_split_is_refused():
    with pytest.raises(LmforgeError, match="set dev_fraction"):
        compare_config({"approach": [{"name": "a", "model": "bert-tiny", "grid": {"lr": [1e-3]}}]}, "t")


def test_an_empty_grid_keeps_the_run_keys_of_earlier_folders():
    key = json.loads(run_key(Approach(name="a", model="bert-tiny"), 10, 0))
    assert "grid" not in key["approach"]
    assert "grid" in json.loads(run_key(Approach(name="a", model="bert-tiny", grid={"lr": [1.0]}), 10, 0))["approach"]


def test_the_grid_is_chosen_on_dev_and_only_the_chosen_model_meets_the_test_split(tmp_path, monkeypatch):
    import lmforge.recipes.compare.approaches as approaches

    data = write_sequence(tmp_path / "data.csv", 64, 0)
    config = tmp_path / "compare.toml"
    config.write_text(CONFIG.format(out=tmp_path / "out", data=data), encoding="utf-8")
    out = tmp_path / "out"
    real_run, real_score = approaches.run_one, approaches.score_folders
    scored_on, trained = [], []

    def run_one(approach, config, train_file, eval_file, *args):
        trained.append((approach.lr, eval_file.name, train_file.name))
        return real_run(approach, config, train_file, eval_file, *args)

    def score(folders, path):
        scored_on.append((folders, path.name))
        return real_score(folders, path)

    monkeypatch.setattr(approaches, "run_one", run_one)
    monkeypatch.setattr(approaches, "score_folders", score)
    assert main(["-q", "compare", "--config", str(config)]) == 0
    assert [t[1] for t in trained] == ["dev.csv"] * 4  # 2 points x 2 seeds, each scored on dev while training
    assert [lr for lr, _, _ in trained] == [1e-3, 3e-3, 1e-3, 3e-3]
    assert [p for _, p in scored_on] == ["test.csv", "test.csv"]  # one test score per run: the chosen point's
    records = [json.loads(line)["result"] for line in (out / "runs.jsonl").read_text().splitlines()]
    for record, (folders, _) in zip(records, scored_on, strict=True):
        dev = [g["dev_accuracy"] for g in record["grid"]]
        best = dev.index(max(dev))
        assert record["chosen"] == record["grid"][best]["point"] and record["dev_accuracy"] == max(dev)
        assert folders[0].endswith(f"-grid{best}")
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert len(rows) == 2 and json.loads(rows[0]["chosen"])["lr"] in (1e-3, 3e-3) and rows[0]["dev_accuracy"]
    table = (out / "compare.md").read_text()
    assert "Settings chosen on the dev split (12 examples" in table and "task.reinit_layers 0" in table
    assert not list((out / "runs").glob("*/model.safetensors"))  # weights of every point deleted after scoring
    dev_texts = {r["text"] for r in csv.DictReader((out / "data" / "dev.csv").open())}
    for name in ("train-3-0.csv", "train-3-1.csv"):
        assert not dev_texts & {r["text"] for r in csv.DictReader((out / "data" / name).open())}


def test_resuming_an_old_folder_treats_the_new_setup_keys_as_their_defaults(tmp_path):
    data = write_sequence(tmp_path / "data.csv", 32, 0)
    text = CONFIG.format(out=tmp_path / "out", data=data).replace("dev_fraction = 0.25\n", "").replace(
        'grid = { lr = [1e-3, 3e-3], "task.reinit_layers" = [0] }\n', "")
    config = tmp_path / "compare.toml"
    config.write_text(text, encoding="utf-8")
    assert main(["-q", "compare", "--config", str(config), "--seeds", "0"]) == 0
    saved = tmp_path / "out" / "compare-config.json"
    values = json.loads(saved.read_text())
    del values["dev_fraction"], values["max_dev"]  # as a folder written before they existed
    saved.write_text(json.dumps(values))
    assert main(["-q", "compare", "--config", str(config), "--seeds", "0", "--resume"]) == 0
    config.write_text(text.replace("test_fraction = 0.25\n", "test_fraction = 0.25\ndev_fraction = 0.2\n"))
    assert main(["-q", "compare", "--config", str(config), "--seeds", "0", "--resume"]) == 2  # a changed split


def test_a_test_file_of_its_own_keeps_all_of_data_for_training_and_dev(tmp_path):
    data = write_sequence(tmp_path / "data.csv", 40, 0)
    test = write_sequence(tmp_path / "test.csv", 12, 5)
    values = {"data": str(data), "test_data": str(test), "dev_fraction": 0.25,
              "approach": [{"name": "a", "model": "bert-tiny"}]}
    split = split_data(compare_config(values, "t"), tmp_path / "out")
    assert len(split.test) == 12 and sorted(split.train + split.dev) == list(range(40)) and len(split.dev) == 10
    written = [r["text"] for r in csv.DictReader(split.test_file.open())]
    assert written == [r["text"] for r in csv.DictReader(open(test))]
    with pytest.raises(LmforgeError, match="BBC corpus is split by test_fraction"):
        compare_config({**values, "data": "bbc"}, "t")
    other = tmp_path / "other.csv"
    other.write_text("text,label\nsome words here,zzz\n", encoding="utf-8")
    with pytest.raises(LmforgeError, match="label\\(s\\) zzz never occur"):
        split_data(compare_config({**values, "test_data": str(other)}, "t"), tmp_path / "out2")


def test_only_matches_names_that_hold_commas():
    from lmforge.commands.compare import only_names

    known = {"bert-mini, no pretraining", "bert-mini, MLM here", "ulmfit"}
    assert only_names("bert-mini, no pretraining,ulmfit", known) == ["bert-mini, no pretraining", "ulmfit"]
    assert only_names("ulmfit, bert-mini, MLM here", known) == ["ulmfit", "bert-mini, MLM here"]
    assert only_names("nope,ulmfit", known) == ["nope", "ulmfit"]  # the unknown one is reported by the caller


def test_train_and_test_options_override_the_config_files(tmp_path, capsys):
    data = write_sequence(tmp_path / "data.csv", 40, 0)
    test = write_sequence(tmp_path / "test.csv", 12, 5)
    text = CONFIG.format(out=tmp_path / "out", data=tmp_path / "missing.csv").replace(
        'grid = { lr = [1e-3, 3e-3], "task.reinit_layers" = [0] }\n', "")
    config = tmp_path / "compare.toml"
    config.write_text(text, encoding="utf-8")
    capsys.readouterr()
    assert main(["-q", "compare", "--config", str(config), "--seeds", "0"]) == 2  # the config's file is missing
    assert "missing.csv: no such file (data (--train))" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written: the same --out works next time
    assert main(["-q", "compare", "--config", str(config), "--seeds", "0", "--test", str(tmp_path / "nope.csv"),
                 "--train", str(data)]) == 2
    assert "nope.csv: no such file (test_data (--test))" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    out = tmp_path / "out"
    assert main(["-q", "compare", "--config", str(config), "--seeds", "0", "--train", str(data),
                 "--test", str(test), "--out", str(out)]) == 0
    saved = json.loads((out / "compare-config.json").read_text())
    assert saved["data"] == str(data) and saved["test_data"] == str(test)
    written = [r["text"] for r in csv.DictReader((out / "data" / "test.csv").open())]
    assert written == [r["text"] for r in csv.DictReader(open(test))]


def test_truncation_is_said_once_for_the_comparison_not_twice_per_run(tmp_path, capsys):
    rows = list(csv.DictReader(write_sequence(tmp_path / "short.csv", 32, 0).open()))
    data = tmp_path / "data.csv"
    with data.open("w", newline="", encoding="utf-8") as f:  # every text three sentences: all longer than 8 pieces
        writer = csv.DictWriter(f, ["text", "label"])
        writer.writeheader()
        writer.writerows({"text": " ".join([r["text"]] * 3), "label": r["label"]} for r in rows)
    text = CONFIG.format(out=tmp_path / "out", data=data).replace("max_length = 16", "max_length = 8").replace(
        'grid = { lr = [1e-3, 3e-3], "task.reinit_layers" = [0] }\n', "")
    config = tmp_path / "compare.toml"
    config.write_text(text, encoding="utf-8")
    assert main(["compare", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert err.count("8 of 8 test texts are longer than max_length=8 word pieces") == 1
    assert "were truncated" not in err  # the per-run warnings: debug level inside a comparison
    import logging

    from lmforge.tasks.base import quiet_truncation, warn_truncated

    levels: list[int] = []
    handler = logging.Handler()
    handler.emit = lambda record: levels.append(record.levelno)
    logger = logging.getLogger("lmforge")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        for quiet in (False, True):
            with quiet_truncation() if quiet else contextlib.nullcontext():
                warn_truncated([(3, 9)], 5, "examples", max_length=8, unit="tokens", action="were truncated", fix="")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert levels == [logging.WARNING, logging.DEBUG]  # a warning outside a comparison, as before
