"""One spelling per knob: model settings are ``--model.X=v`` on every command and a ``model`` table in TOML; the
older ``preset_options`` spelling still works, with a deprecation warning."""

from __future__ import annotations

import json

import pytest

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.recipes.resolve import model_overrides, split_model_table
from tests.toy_tasks import write_task_data


def test_model_table_and_overrides_become_preset_settings(caplog):
    assert split_model_table({"model": {"source": "bert-tiny", "d_model": 16}, "lr": 1}, "x.toml") == {
        "model": "bert-tiny", "preset_options": {"d_model": 16}, "lr": 1}
    assert model_overrides(["--model.d_model=16", "--train.lr=1e-3"]) == ["preset_options.d_model=16",
                                                                          "--train.lr=1e-3"]
    assert "deprecated" not in caplog.text
    with caplog.at_level("WARNING", logger="lmforge"):
        assert split_model_table({"model": "m", "preset_options": {"d_model": 8}}, "old.toml")["preset_options"] == {
            "d_model": 8}
        model_overrides(["--preset_options.d_model=8"])
    assert "old.toml: preset_options is deprecated" in caplog.text and "write --model.d_model" in caplog.text
    with pytest.raises(LmforgeError, match="the model table needs source"):
        split_model_table({"model": {"d_model": 16}}, "x.toml")


@pytest.mark.parametrize("spelling", ["flag", "toml"])
def test_finetune_a_preset_with_model_settings(tmp_path, tiny_encoder_dir, spelling, capsys):
    train, _ = write_task_data(tmp_path, "sequence", n_train=8, n_dev=4)
    common = ["finetune", "--task", "sequence", "--tokenizer", str(tiny_encoder_dir), "--train", str(train),
              "--out", str(tmp_path / "run"), "--epochs", "1", "--max-length", "16"]
    settings = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 24, "max_seq_len": 16}
    if spelling == "flag":
        argv = [*common, "--model", "bert-tiny", *(f"--model.{k}={v}" for k, v in settings.items())]
    else:
        config = tmp_path / "ft.toml"
        inline = ", ".join(f"{k} = {v}" for k, v in settings.items())
        config.write_text(f'model = {{ source = "bert-tiny", {inline} }}\n')
        argv = [*common, "--config", str(config)]
    assert main(argv) == 0, capsys.readouterr().err
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert {k: saved[k] for k in settings} == settings
