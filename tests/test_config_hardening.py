"""--config files: binary, malformed or mistyped TOML is one clear line naming the file (issue 14)."""

from __future__ import annotations

import pytest

from lmforge.cli import main
from lmforge.config import TrainConfig, from_dict, load_toml
from lmforge.errors import InputFileError, LmforgeError


@pytest.mark.parametrize(("content", "match"), [
    (bytes(range(256)), r"not UTF-8 text \(bad byte at offset 128\)"),
    (b"name = \n", "not valid TOML"),
    (b"a = " + b"[" * 5000, "not valid TOML"),
    (b"a = " + b"{b = " * 5000, "not valid TOML"),
])
def test_unreadable_toml(tmp_path, content, match):
    path = tmp_path / "run.toml"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=match) as err:
        load_toml(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_folder_or_a_missing_file(tmp_path):
    with pytest.raises(InputFileError, match="a folder, not a TOML file"):
        load_toml(tmp_path)
    with pytest.raises(InputFileError, match="config file not found"):
        load_toml(tmp_path / "nothing.toml")


def test_values_of_the_wrong_type(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("max_steps = \"ten\"\n", encoding="utf-8")
    with pytest.raises(LmforgeError, match="run.max_steps: expected an integer, got 'ten'"):
        from_dict(TrainConfig, load_toml(path), where="run")
    path.write_text("lr = 1979-05-27\n", encoding="utf-8")
    with pytest.raises(LmforgeError, match="run.lr: expected a number"):
        from_dict(TrainConfig, load_toml(path), where="run")


@pytest.mark.parametrize("command", ["pretrain", "finetune", "train-seq2seq", "compare"])
@pytest.mark.parametrize(("content", "match"), [
    (bytes(range(256)), "not UTF-8 text"),
    (b"[train\n", "not valid TOML"),
    (b"train = 5\n", ""),
    (b'out = 3\n', "out: expected a string, got 3"),
])
def test_commands_report_bad_config_files_in_one_line(tmp_path, capsys, command, content, match):
    path = tmp_path / "run.toml"
    path.write_bytes(content)
    assert main([command, "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmforge: error: ") and "\n" not in err and str(path) in err and match in err
