"""``lmforge viz attention``, ``lmforge viz positions`` and ``lmforge viz training``: look inside models and runs.

PyTorch, matplotlib and the model code are imported inside the run functions, so ``lmforge --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmforge.choices import ATTENTION_SCALES, VIEWER_PRECISIONS
from lmforge.commands.options import Count, Rate
from lmforge.data.text import read_user_text
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.io import prepare_output_file

METRICS_NAME = "metrics.jsonl"  # as lmforge.training.logging


def parse_indices(text: str | None, option: str) -> list[int] | None:
    """``"0,2,-1"`` -> [0, 2, -1]; None or "all" -> None (everything)."""
    if text is None or text.strip().lower() == "all":
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LmforgeError(f"{option} {text!r}: give comma-separated indices, e.g. {option} 0,1,-1") from None
    if not values:
        raise LmforgeError(f"{option} {text!r}: give at least one index")
    return values


def _output(path: str, suffixes: tuple[str, ...], overwrite: bool, inputs: tuple[str | None, ...] = ()) -> Path:
    out = Path(path)
    if out.suffix.lower() not in suffixes:
        raise LmforgeError(f"--out {out}: name the file *{' or *'.join(suffixes)}")
    return prepare_output_file(out, overwrite=overwrite, inputs=inputs)


def _read_text(text: str | None, file: str | None, option: str) -> str | None:
    if file is None:
        return text
    text = read_user_text(file, f"{option}-file").strip()
    if not text:
        raise InputFileError(f"{option}-file {file}: the file holds no text")
    return text


# ------------------------------------------------------------------------------------------------ attention
def add_attention_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("The HTML file is self-contained (no network): pick the attention (encoder, decoder, cross), "
                "layer and head, switch between a matrix and token-to-token lines, hover to read weights. For an "
                "encoder-decoder, --text is the source and --pair the target (read by the decoder as [CLS] + "
                "target, as in training).")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="an lmforge model folder (encoder, decoder, seq2seq, RNN) or a Hugging Face BERT one")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="the input (encoder-decoders: the source)")
    text.add_argument("--text-file", metavar="FILE", help="read the input from a UTF-8 file (long inputs)")
    pair = p.add_mutually_exclusive_group()
    pair.add_argument("--pair", help="second segment (encoder: [SEP] B [SEP]; encoder-decoder: the target)")
    pair.add_argument("--pair-file", metavar="FILE", help="read --pair from a UTF-8 file")
    p.add_argument("--layers", metavar="I[,J...]", help="layer indices to show, e.g. 0,1 or -1 (default: all)")
    p.add_argument("--heads", metavar="I[,J...]", help="head indices to show (default: all)")
    p.add_argument("--max-length", type=Count(1, 1_000_000), metavar="N",
                   help="truncate longer inputs (default: the model's limit)")
    p.add_argument("--precision", choices=VIEWER_PRECISIONS, default="auto",
                   help="HTML only: weights stored exactly (float32) or quantised per row (uint16, uint8); auto "
                        "keeps float32 up to about 2 million weights")
    p.add_argument("--scale", choices=ATTENTION_SCALES, default="absolute",
                   help="PNG only: absolute colours every weight from 0 to 1 on the one colour bar (near-uniform "
                        "attention stays pale; heat maps compare); relative stretches each heat map from 0 to its "
                        "own largest weight (shows the shape of diffuse heads, but paints uniform attention dark)")
    p.add_argument("--out", required=True, metavar="FILE.(png|html)",
                   help=".png: heat maps, a row per layer and a column per head; .html: the interactive viewer")
    p.add_argument("--overwrite", action="store_true")


def run_attention(args: argparse.Namespace) -> int:
    from lmforge.persistence import load_backbone
    from lmforge.viz.attention import collect_attention

    out = _output(args.out, (".png", ".html"), args.overwrite, (args.model, args.text_file, args.pair_file))
    layers = parse_indices(args.layers, "--layers")
    heads = parse_indices(args.heads, "--heads")
    text = _read_text(args.text, args.text_file, "--text")
    pair = _read_text(args.pair, args.pair_file, "--pair")
    loaded = load_backbone(args.model)
    if loaded.tokenizer is None:
        raise InputFileError(f"{args.model}: no vocab.txt in the model folder; save the model with its tokenizer")
    attn = collect_attention(loaded.model, loaded.tokenizer, text, pair, layers=layers, heads=heads,
                             max_length=args.max_length)
    if out.suffix.lower() == ".html":
        from lmforge.viz.html import choose_precision, write_attention_html

        write_attention_html(attn, out, precision=args.precision)
        stored = choose_precision(attn, args.precision)
    else:
        from lmforge.viz.plots import plot_attention_grid

        plot_attention_grid(attn, out, scale=args.scale)
        stored = "png"
    shapes = "; ".join(f"{m.name}: {len(m.layers)} layers x {len(m.heads)} heads, {len(m.rows)} x {len(m.cols)}"
                       for m in attn.maps)
    print(f"{shapes} -> {out} ({stored}, {out.stat().st_size / 1e6:.2f} MB)")
    return 0


# ------------------------------------------------------------------------------------------------ positions
def add_positions_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--d-model", type=Count(2, 100_000), default=128, metavar="D", help="embedding width (default 128)")
    p.add_argument("--length", type=Count(1, 100_000), default=50, metavar="N", help="number of positions (default 50)")
    p.add_argument("--base", type=Rate(1.0, low_open=True), default=10000.0,
                   help="wavelength base (10000 in Vaswani et al.)")
    p.add_argument("--out", required=True, metavar="FILE.png")
    p.add_argument("--overwrite", action="store_true")


def run_positions(args: argparse.Namespace) -> int:
    from lmforge.viz.plots import plot_positions

    out = _output(args.out, (".png",), args.overwrite)
    plot_positions(args.d_model, args.length, out, base=args.base)
    print(f"sinusoidal positions, {args.length} x {args.d_model} -> {out}")
    return 0


# ------------------------------------------------------------------------------------------------ training
def add_training_arguments(p: argparse.ArgumentParser) -> None:
    # dest is not "run": the command table stores the run function in args.run
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help=f"a training run folder (or its {METRICS_NAME} file, or a vectors *.metrics.jsonl): draws "
                        "train and dev loss, the learning rate and a panel per dev metric")
    p.add_argument("--out", required=True, metavar="FILE.png")
    p.add_argument("--title", help="figure title (default: the run folder's name)")
    p.add_argument("--overwrite", action="store_true")


def run_training(args: argparse.Namespace) -> int:
    from lmforge.training.logging import read_metrics
    from lmforge.viz.plots import plot_training

    run = Path(args.run_dir)
    path = run / METRICS_NAME if run.is_dir() else run
    if not path.is_file():
        raise InputFileError(f"{path}: no such file; give a run folder written by lmforge (it holds {METRICS_NAME})")
    out = _output(args.out, (".png",), args.overwrite, (str(path),))
    records = read_metrics(path)
    if not records:
        raise InputFileError(f"{path}: no records (an empty or unreadable metrics file)")
    try:
        plot_training(records, out, title=args.title or (run.name if run.is_dir() else run.parent.name))
    except LmforgeError as err:
        raise InputFileError(f"{path}: {err}") from err
    x = "step" if any(isinstance(r.get("step"), int | float) for r in records) else "epoch"
    values = [r[x] for r in records if isinstance(r.get(x), int | float)]
    print(f"{len(records)} records ({x}s {min(values, default=0)}..{max(values, default=0)}) -> {out}")
    return 0
