"""PNG pictures and the ``lmforge viz`` run functions (called through their own argument parsers, so these tests do
not depend on the command table in lmforge.cli)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from PIL import Image

from lmforge.commands import viz as viz_cmd
from lmforge.errors import InputFileError, LmforgeError
from lmforge.viz.attention import AttentionMap, AttentionSet
from lmforge.viz.html import read_attention_html
from lmforge.viz.plots import attention_grid_figure, positions_figure, training_figure
from tests.viz import PAIR, TEXT, save_tiny_model

COMMANDS = {"attention": (viz_cmd.add_attention_arguments, viz_cmd.run_attention),
            "positions": (viz_cmd.add_positions_arguments, viz_cmd.run_positions),
            "training": (viz_cmd.add_training_arguments, viz_cmd.run_training)}


def run(command: str, *argv: str) -> int:
    """Parse and run as lmforge.cli does (which stores the run function in ``args.run``)."""
    add, run_function = COMMANDS[command]
    parser = argparse.ArgumentParser(prog=f"lmforge viz {command}")
    add(parser)
    parser.set_defaults(run=run_function)
    args = parser.parse_args(list(argv))
    return args.run(args)


def _png(path) -> tuple[int, int]:
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.verify()
        return image.size


def _uniform_map(name: str, T: int, n_layers: int, n_heads: int) -> AttentionMap:
    tokens = [f"w{i}" for i in range(T)]
    w = np.full((n_layers, n_heads, T, T), 1.0 / T, dtype=np.float32)
    return AttentionMap(name, tokens, tokens, list(range(n_layers)), list(range(n_heads)), w)


def test_attention_grid_is_layers_by_heads():
    attn = AttentionSet("t", [_uniform_map("encoder self-attention", 5, 2, 3),
                              _uniform_map("cross-attention", 5, 3, 2)])
    fig = attention_grid_figure(attn)
    assert len(fig.axes) == (2 + 3) * 3  # maps stacked: 5 layer rows, 3 head columns
    assert sum(ax.axison for ax in fig.axes) == 2 * 3 + 3 * 2  # the cross map's third column is blank
    labelled = fig.axes[0]
    assert [t.get_text() for t in labelled.get_xticklabels()] == [f"w{i}" for i in range(5)]


def test_long_inputs_get_no_token_labels():
    fig = attention_grid_figure(AttentionSet("t", [_uniform_map("m", 41, 1, 2)]))
    assert len(fig.axes) == 2 and all(len(ax.get_xticks()) == 0 for ax in fig.axes)


def test_positions_figure():
    fig = positions_figure(16, 9)
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (9, 16)
    assert np.allclose(image[0, 0::2], 0.0) and np.allclose(image[0, 1::2], 1.0)  # sin 0 and cos 0 at position 0
    assert abs(image[1, 0] - np.sin(1.0)) < 1e-6
    with pytest.raises(LmforgeError, match="d_model >= 2"):
        positions_figure(1, 9)


def _write_metrics(path, with_evals: bool = True):
    records = []
    for step in range(10, 110, 10):
        records.append({"step": step, "epoch": step / 100, "loss": 3.0 / step ** 0.3, "loss_mlm": 2.0 / step ** 0.3,
                        "loss_nsp": 1.0 / step ** 0.3, "lr": min(step, 50) * 1e-5, "grad_norm": 1.0})
        if with_evals and step % 50 == 0:
            records.append({"step": step, "eval_loss": 2.5 / step ** 0.3, "eval_mlm_accuracy": step / 200,
                            "eval_ppl_mlm": 20.0 - step / 10})
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 1', encoding="utf-8")  # torn line
    return records


def test_training_figure_panels(tmp_path):
    _write_metrics(tmp_path / "metrics.jsonl")
    from lmforge.training.logging import read_metrics

    fig = training_figure(read_metrics(tmp_path / "metrics.jsonl"))
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 4 and "eval_mlm_accuracy" in titles and "eval_ppl_mlm" in titles
    loss_labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"train loss", "eval loss", "train loss_mlm", "train loss_nsp"} <= set(loss_labels)
    assert fig.axes[1].get_ylabel() == "learning rate"
    with pytest.raises(LmforgeError, match="no loss"):
        training_figure([{"step": 1, "lr": 0.1}])


# ------------------------------------------------------------------------------------------------ commands
def test_viz_positions_and_training_commands(tmp_path, capsys):
    assert run("positions", "--d-model", "128", "--length", "50", "--out", str(tmp_path / "pos.png")) == 0
    assert _png(tmp_path / "pos.png")[0] > 500
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _write_metrics(run_dir / "metrics.jsonl")
    assert run("training", str(run_dir), "--out", str(tmp_path / "train.png")) == 0
    _png(tmp_path / "train.png")
    assert "records (steps 10..100)" in capsys.readouterr().out
    with pytest.raises(LmforgeError, match="already exists"):
        run("training", str(run_dir), "--out", str(tmp_path / "train.png"))
    with pytest.raises(InputFileError, match="no such file"):
        run("training", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.png"))
    with pytest.raises(LmforgeError, match=r"name the file \*\.png"):
        run("positions", "--out", str(tmp_path / "pos.jpg"))


def test_viz_attention_command_png_and_html(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "enc", "encoder")
    assert run("attention", "--model", str(model), "--text", TEXT, "--pair", PAIR, "--layers", "-1",
               "--out", str(tmp_path / "a.png")) == 0
    width, height = _png(tmp_path / "a.png")
    assert width > height  # one layer row, two head columns
    assert "1 layers x 2 heads, 11 x 11" in capsys.readouterr().out
    assert run("attention", "--model", str(model), "--text", TEXT, "--heads", "1",
               "--out", str(tmp_path / "a.html")) == 0
    (m,) = read_attention_html(tmp_path / "a.html").maps
    assert m.layers == [0, 1] and m.heads == [1] and m.rows[0] == "[CLS]"
    with pytest.raises(LmforgeError, match="comma-separated"):
        run("attention", "--model", str(model), "--text", TEXT, "--layers", "0-1", "--out", str(tmp_path / "b.png"))
    with pytest.raises(LmforgeError, match=r"name the file \*\.png or \*\.html"):
        run("attention", "--model", str(model), "--text", TEXT, "--out", str(tmp_path / "b.svg"))


@pytest.mark.parametrize("arch,n_maps", [("seq2seq", 3), ("rnn_seq2seq", 1)])
def test_viz_attention_command_encoder_decoders_from_files(tmp_path, arch, n_maps):
    model = save_tiny_model(tmp_path / "s2s", arch)
    (tmp_path / "src.txt").write_text(TEXT + "\n", encoding="utf-8")
    (tmp_path / "tgt.txt").write_text(PAIR + "\n", encoding="utf-8")
    assert run("attention", "--model", str(model), "--text-file", str(tmp_path / "src.txt"), "--pair-file",
               str(tmp_path / "tgt.txt"), "--out", str(tmp_path / "s.html")) == 0
    maps = read_attention_html(tmp_path / "s.html").maps
    assert len(maps) == n_maps and maps[-1].name == "cross-attention"
    assert maps[-1].rows[0] == "[CLS]" and maps[-1].cols[0] == "alice"
    with pytest.raises(LmforgeError, match="--pair"):
        run("attention", "--model", str(model), "--text", TEXT, "--out", str(tmp_path / "t.html"))
