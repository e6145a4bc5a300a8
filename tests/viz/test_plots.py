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
from lmforge.viz.plots import attention_grid_figure, positions_figure, training_curves, training_figure
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
    *maps, bar = fig.axes
    assert len(maps) == (2 + 3) * 3  # maps stacked: 5 layer rows, 3 head columns; then the colour bar
    assert sum(ax.axison for ax in maps) == 2 * 3 + 3 * 2  # the cross map's third column is blank
    labelled = maps[0]
    assert [t.get_text() for t in labelled.get_xticklabels()] == [f"w{i}" for i in range(5)]


def test_long_inputs_get_no_token_labels():
    fig = attention_grid_figure(AttentionSet("t", [_uniform_map("m", 41, 1, 2)]))
    *maps, bar = fig.axes
    assert len(maps) == 2 and all(len(ax.get_xticks()) == 0 for ax in maps)
    assert bar.get_ylabel().startswith("attention weight")  # long inputs get the colour bar too


@pytest.mark.parametrize("T", [5, 41])  # token labels (constrained layout) and bare heat maps (fixed margins)
def test_attention_png_has_a_colour_bar_axis_labels_and_an_absolute_scale(T):
    """issue 23: no colour bar, no query/key labels, and a per-map scale that painted uniform attention dark."""
    fig = attention_grid_figure(AttentionSet("t", [_uniform_map("m", T, 2, 2)]))
    *maps, bar = fig.axes
    assert bar.get_ylabel() == "attention weight (0 to 1, every heat map)"
    assert all(ax.get_xlabel() == "key" for ax in maps)
    assert [ax.get_ylabel() for ax in maps] == ["query", "", "query", ""]  # the first column of every row
    for ax in maps:
        image = ax.images[0]
        assert image.norm.vmin == 0.0 and image.norm.vmax == 1.0
        # uniform attention (1/T per key) is pale: its colour is near the bottom of the map, not the top
        assert image.norm(1.0 / T) <= 0.2 and image.to_rgba(np.array([1.0 / T]))[0][0] > 0.75
    fig.canvas.draw()  # the layout with the bar draws
    bar_box, last = bar.get_position(), maps[-1].get_position()
    assert bar_box.x0 >= last.x1  # the bar sits right of the heat maps, not over them


def test_the_relative_scale_stretches_each_heat_map_to_its_own_maximum():
    weights = np.full((1, 2, 4, 4), 0.25, dtype=np.float32)
    weights[0, 1] = np.eye(4) * 0.5 + 0.125  # a peaked head: rows sum to 1, max 0.625
    tokens = list("abcd")
    attn = AttentionSet("t", [AttentionMap("m", tokens, tokens, [0], [0, 1], weights)])
    *maps, bar = attention_grid_figure(attn, scale="relative").axes
    assert bar.get_ylabel() == "weight / the heat map's largest weight"
    assert np.allclose(maps[0].images[0].get_array(), 1.0)  # uniform: every weight is its map's maximum
    assert np.isclose(maps[1].images[0].get_array().max(), 1.0) and np.isclose(
        maps[1].images[0].get_array().min(), 0.125 / 0.625)
    *maps, bar = attention_grid_figure(attn).axes  # absolute (the default): the weights as they are
    assert np.allclose(maps[1].images[0].get_array(), weights[0, 1])
    with pytest.raises(LmforgeError, match="absolute, relative"):
        attention_grid_figure(attn, scale="log")


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


def _panel(fig, title: str):
    (ax,) = [ax for ax in fig.axes if ax.get_title() == title]
    return ax


def _points(ax, label: str | None = None) -> list[tuple[float, float]]:
    """The (x, y) points of the one line of ``ax`` with that legend label (or its only labelled-or-not line)."""
    lines = [line for line in ax.get_lines() if label is None or line.get_label() == label]
    assert len(lines) == 1, [line.get_label() for line in ax.get_lines()]
    return list(zip(lines[0].get_xdata(), lines[0].get_ydata(), strict=True))


def test_training_figure_panels(tmp_path):
    _write_metrics(tmp_path / "metrics.jsonl")
    from lmforge.training.logging import read_metrics

    fig = training_figure(read_metrics(tmp_path / "metrics.jsonl"))
    loss = fig.axes[0]
    assert [ax.get_ylabel() for ax in fig.axes].count("learning rate") == 1
    assert {ax.get_title() for ax in fig.axes} >= {"loss", "dev mlm_accuracy", "dev ppl_mlm"}
    assert len(fig.axes) == 4  # loss (with the lr on its twin axis) and two metric panels
    assert {"train loss", "dev loss", "train loss_mlm", "train loss_nsp", "learning rate"} <= {
        t.get_text() for t in loss.get_legend().get_texts()}
    assert _points(_panel(fig, "dev mlm_accuracy")) == [(50, 0.25), (100, 0.5)]
    with pytest.raises(LmforgeError, match="no loss"):
        training_figure([{"step": 1, "lr": 0.1}])


def _finetune_records(steps=(10, 20, 30), evals=(15, 30)) -> list[dict]:
    """Records as lmforge finetune writes them: training lines, and the task evaluator's plain-named dev metrics."""
    records = [{"step": s, "epoch": s // 15, "loss": 1.0 / s, "loss_cls": 1.0 / s, "lr": 5e-5, "grad_norm": 1.0}
               for s in steps]
    records += [{"step": s, "accuracy": s / 40, "f1": s / 50, "mcc": s / 60} for s in evals]
    return sorted(records, key=lambda r: r["step"])


def test_the_dev_metrics_of_a_finetuning_and_a_seq2seq_run_get_their_own_panels():
    """issue 23: the plots only picked up eval_* keys; fine-tuning logs accuracy/f1, seq2seq rougeL."""
    curves = training_curves(_finetune_records())
    assert curves.metrics == ["accuracy", "f1", "mcc"] and curves.train == ["loss"] and curves.lr == "lr"
    fig = training_figure(_finetune_records())
    assert _points(_panel(fig, "dev accuracy")) == [(15, 0.375), (30, 0.75)]
    assert _points(_panel(fig, "dev f1")) == [(15, 0.3), (30, 0.6)]
    seq2seq = [{"step": 4, "epoch": 0, "loss": 5.0, "loss_seq2seq": 5.0, "lr": 1e-3},
               {"step": 4, "rouge1": 12.0, "rouge2": 3.0, "rougeL": 11.0}]
    fig = training_figure(seq2seq)
    assert [ax.get_title() for ax in fig.axes if ax.get_title() != "loss" and ax.get_title()] == [
        "dev rouge1", "dev rouge2", "dev rougeL"]
    assert _points(_panel(fig, "dev rougeL")) == [(4, 11.0)]


def test_a_one_point_run_is_drawn_with_markers_and_no_empty_axes():
    """issue 23: a short run (1-2 logged points) drew empty axes: a line through one point is invisible."""
    records = [{"step": 3, "epoch": 0, "loss": 2.5, "lr": 1e-4}, {"step": 3, "accuracy": 0.5}]
    fig = training_figure(records)
    for ax in fig.axes:
        drawn = [line for line in ax.get_lines() if len(line.get_xdata())]
        assert drawn, f"panel {ax.get_title() or ax.get_ylabel()!r} is empty"
        assert all(line.get_marker() not in (None, "None", "", " ") for line in drawn)
        lo, hi = ax.get_xlim()
        assert lo <= 3 <= hi and hi - lo >= 1  # the point inside a readable range, not a 0.1-step sliver
    train_line = _points(fig.axes[0], "train loss")
    assert train_line == [(3, 2.5)]
    assert any(t.get_text() == "2.5" for t in fig.axes[0].texts)  # a few points: their values are written


def test_the_learning_rate_is_drawn_beneath_the_loss_on_a_secondary_axis():
    """issue 23: in a short pretraining chart the loss line hid under the lr line."""
    fig = training_figure(_finetune_records())
    loss = fig.axes[0]
    (lr,) = [ax for ax in fig.axes if ax.get_ylabel() == "learning rate"]
    assert lr.get_shared_x_axes().joined(loss, lr) and lr.bbox.bounds == loss.bbox.bounds  # a twin, not a panel
    assert loss.get_zorder() > lr.get_zorder() and not loss.patch.get_visible()  # the loss axes in front
    assert _points(lr) == [(10, 5e-5), (20, 5e-5), (30, 5e-5)]


def test_keys_without_a_finite_value_get_no_panel_and_a_nan_loss_is_marked():
    records = [{"step": 1, "loss": 2.0, "lr": 1e-3}, {"step": 2, "loss": float("nan"), "lr": 1e-3},
               {"step": 2, "accuracy": float("nan"), "f1": 0.5}]
    curves = training_curves(records)
    assert curves.metrics == ["f1"]
    fig = training_figure(records)
    assert "loss not finite from step 2" in {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert [ax.get_title() for ax in fig.axes if ax.get_title().startswith("dev")] == ["dev f1"]


def test_train_and_dev_values_of_the_same_metric_share_a_panel_and_vectors_plot_by_epoch():
    records = [{"step": 5, "loss": 3.0, "mlm_accuracy": 0.1, "lr": 1e-3},
               {"step": 5, "eval_loss": 3.2, "eval_mlm_accuracy": 0.08, "eval_ppl_mlm": 24.5}]
    curves = training_curves(records)
    assert curves.train_metrics == {"eval_mlm_accuracy": "mlm_accuracy"} and curves.dev_loss == ["eval_loss"]
    fig = training_figure(records)
    panel = _panel(fig, "dev mlm_accuracy")
    assert _points(panel, "train mlm_accuracy") == [(5, 0.1)] and _points(panel, "dev mlm_accuracy") == [(5, 0.08)]
    vectors = [{"method": "word2vec-skipgram", "epoch": e, "loss": 3.0 - e / 10, "pairs": 100,
                "lr_end": 0.025 - e / 1000, "seconds": 1.0} for e in (1, 2)]
    curves = training_curves(vectors)
    assert curves.x == "epoch" and curves.lr == "lr_end" and curves.metrics == []
    fig = training_figure(vectors)
    assert fig.axes[0].get_xlabel() == "epoch" and _points(fig.axes[0], "train loss") == [(1, 2.9), (2, 2.8)]


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
    assert run("attention", "--model", str(model), "--text", TEXT, "--layers", "0", "--scale", "relative",
               "--out", str(tmp_path / "relative.png")) == 0
    _png(tmp_path / "relative.png")
    with pytest.raises(SystemExit):
        run("attention", "--model", str(model), "--text", TEXT, "--scale", "log", "--out", str(tmp_path / "c.png"))
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
