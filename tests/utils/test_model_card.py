"""Every run folder gets a README.md model card (issue 23): what was trained, on what data, with which command, the
metrics and the plots, with Hugging Face model-card front matter. Reproduction: run folders had no README."""

from __future__ import annotations

import json
import shlex

import pytest

from lmforge.utils.model_card import MARKER, recording_command, write_model_card


def _front_matter(card: str) -> list[str]:
    assert card.startswith("---\n")
    return card.split("---\n", 2)[1].splitlines()


def test_a_finetuning_run_folder_has_a_model_card(finetuned):
    out, train, dev = finetuned("sequence")
    card = (out / "README.md").read_text(encoding="utf-8")
    front = _front_matter(card)
    assert "library_name: lmforge" in front
    assert {"- lmforge", "- encoder", "- sequence"} <= set(front)
    assert "metrics:" in front and "- accuracy" in front
    # the exact command line, as the CLI received it
    command = next(line for line in card.splitlines() if line.startswith("lmforge "))
    argv = shlex.split(command)
    assert argv[:3] == ["lmforge", "-q", "finetune"] and str(train) in argv and str(out) in argv
    # the data as given, with counts; the sizes; the metrics of eval_results.json; the plot, linked
    assert f"`{train}`" in card and f"`{dev}`" in card
    lines = sum(1 for _ in train.open(encoding="utf-8"))
    assert f"{lines:,} lines" in card
    config = json.loads((out / "config.json").read_text())["model"]
    assert f"d_model={config['d_model']}" in card and f"n_layers={config['n_layers']}" in card
    results = json.loads((out / "eval_results.json").read_text())
    assert f"| accuracy | {results['accuracy']:.4f} |" in card and f"step {results['best_step']}" in card
    assert "![loss_curve](loss_curve.png)" in card and (out / "loss_curve.png").is_file()
    from lmforge import __version__

    assert f"Written by lmforge {__version__}" in card and MARKER in card


def test_refreshing_keeps_the_command_history_and_a_users_readme_is_left_alone(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"format": "lmforge", "model": {"arch": "decoder", "d_model": 12},
                                                 "head": None}))
    (run / "run_config.json").write_text(json.dumps({"preset": "gpt-nano", "train": {"objective": "clm"}}))
    with recording_command(["pretrain", "--preset", "gpt-nano", "--out", str(run)]):
        write_model_card(run)
    with recording_command(["pretrain", "--preset", "gpt-nano", "--out", str(run), "--resume", "auto"]):
        write_model_card(run)  # a resumed run ends: the card is refreshed, both command lines kept
    card = (run / "README.md").read_text()
    commands = [line for line in card.splitlines() if line.startswith("lmforge pretrain")]
    assert len(commands) == 2 and commands[1].endswith("--resume auto")
    assert "Model family `decoder` (preset `gpt-nano`), pretrained with `clm`." in card
    assert "Trained from Python" not in card and "No dev evaluation was recorded." in card

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes\n")
    assert write_model_card(mine, command=["lmforge", "x"]) is None
    assert (mine / "README.md").read_text() == "my notes\n"
    assert "not written by lmforge" in caplog.text


@pytest.mark.parametrize("history", ["[[\"lmforge\", 1]]", "not json", "{}"])
def test_a_damaged_history_comment_is_ignored(tmp_path, history):
    (tmp_path / "README.md").write_text(f"old\n{MARKER}: commands = {history} -->\n")
    write_model_card(tmp_path, command=["lmforge", "pretrain"])
    card = (tmp_path / "README.md").read_text()
    assert [line for line in card.splitlines() if line.startswith("lmforge ")] == ["lmforge pretrain"]


@pytest.mark.parametrize(("model", "shown", "absent"), [
    ({"arch": "awd_lstm", "vocab_size": 50, "d_model": 16, "d_hidden": 24, "n_layers": 3, "n_heads": 12,
      "d_ff": 512, "max_seq_len": 1048576}, "vocab_size=50, d_model=16, d_hidden=24, n_layers=3",
     ("n_heads", "d_ff", "max_seq_len")),
    ({"arch": "decoder", "vocab_size": 50, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 64,
      "max_seq_len": 32}, "vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=64, max_seq_len=32",
     ("d_hidden",)),
])
def test_the_sizes_shown_are_the_familys_own(tmp_path, model, shown, absent):
    (tmp_path / "config.json").write_text(json.dumps({"format": "lmforge", "model": model, "head": None}))
    write_model_card(tmp_path, command=["lmforge", "pretrain"])
    sizes = next(line for line in (tmp_path / "README.md").read_text().splitlines() if line.startswith("Actual"))
    assert sizes == f"Actual sizes: {shown}."
    assert not any(name in sizes for name in absent)
