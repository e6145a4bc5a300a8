"""Transformer-XL against a GPT decoder of the same size on BBC News: held-out perplexity at equal training time,
and Transformer-XL evaluated with a longer memory than it trained with.

Models (both from scratch, on the same 8k WordPiece vocabulary):

* ``gpt-micro``, objective ``clm``: the GPT decoder (4 layers, d_model 128, 4 heads, d_ff 512), pre-LN, GELU (tanh),
  learned absolute positions; trained on causal blocks of ``--seq-len`` tokens drawn in a new order every epoch.
* ``transformer-xl-tiny``, objective ``txl``: the XLNet family with causal attention (4 layers, d_model 128, 4 heads,
  d_ff 512), post-LN, ReLU, relative positions; trained on consecutive segments of ``--seq-len`` tokens
  (``--data.variable_bptt=false``, Dai et al.'s fixed segments) of 32 rows of the stream, with a memory of the
  previous 64 states per layer (``mem_len``; no gradient through it).

Stages (each writes its result under ``--work`` and is skipped when that result exists, so an interrupted run
continues; ``--fresh`` starts over):

1. ``data``: BBC News split as ``lmforge compare`` splits it (stratified 80/20 over the topics, split seed 0); an 8k
   WordPiece vocabulary trained on the training articles (``WordPieceTrainer(8000, algorithm="bpe-count")``, as
   compare does); the training articles, one file each, prepared as shards (``lmforge data prepare``), and the test
   articles too (only to tokenize them exactly as the training text is). Pretraining holds out nothing
   (``--data.eval_fraction=0``): the evaluation is this script's, on the test articles.
2. ``calibrate``: each model trains ``--calib-steps`` steps; its seconds per step are read from the logged training
   time (``elapsed_s`` of ``metrics.jsonl``), leaving out the first logging interval (start-up).
3. ``train``: each model trains ``round(--minutes * 60 / seconds per step)`` steps (so the same wall time on this
   machine, as calibrated) at batch 32 and ``--seq-len``, AdamW lr ``--lr`` with 5% warm-up and linear decay,
   dropout 0.1 (the presets' default). The training time actually logged and the tokens seen are reported.
4. ``eval``: the test articles' token stream, built as the training streams are (each document followed by [SEP]),
   with one [SEP] in front so that the first article's first token is predicted too: S[0..N]. Every token S[1..N]
   is predicted exactly once in every setting. The stream is cut into ``--eval-rows`` contiguous rows (a batch;
   the rows' lengths are rounded up to a multiple of ``--seq-len`` and the tail of the last row is padding that no
   setting scores), and each row is read in windows of ``--seq-len`` inputs, window k's inputs being the tokens
   just before its targets (so its first target is predicted from the previous window's last token):

   * GPT, blocks: consecutive non-overlapping windows (context 1 .. seq_len tokens, seq_len / 2 on average);
   * GPT, sliding: windows of seq_len moved by ``--stride`` tokens, only the last ``stride`` targets of each
     scored (context at least seq_len - stride, but at a row's start): a stronger baseline, seq_len / stride times
     the compute (GPT's learned positions end where its training blocks did, so its window cannot grow);
   * Transformer-XL, the same windows as GPT blocks, with the memory carried from window to window along each row
     (``lmforge.objectives.txl.TXLObjective`` in evaluation, ``eval_mem_len``): memory 0 (each window alone, GPT's
     blocks' context), the training memory 64, and longer ones (``--mems``).

   Each row starts without context (one token) in every setting: ``--eval-rows`` - 1 row starts in a stream of
   N tokens. NLL per token (nats) and perplexity over the word pieces.

Run: ``.venv/bin/python benchmarks/bench_txl.py [--quick] [--minutes 8] [--work runs/bench-txl]``. Prints Markdown
and writes ``benchmarks/results/txl.json`` (``txl-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import fmt, machine_description, markdown_table, print_machine, reproduce_command
from lmforge.cli import main as lmforge
from lmforge.utils.io import atomic_write_text

HERE = Path(__file__).resolve().parent
IGNORE = -100
MODELS = {  # key -> (preset, objective, extra pretrain options)
    "gpt": ("gpt-micro", "clm", []),
    "txl": ("transformer-xl-tiny", "txl", ["--data.variable_bptt=false"]),
}
NAMES = {"gpt": "GPT decoder (gpt-micro)", "txl": "Transformer-XL (transformer-xl-tiny)"}


# ---------------------------------------------------------------------------------------------- stages
def stage_data(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Split, vocabulary, shards of the training and of the test articles; returns the paths and counts."""
    from types import SimpleNamespace

    from lmforge.data.readers import stratified_split
    from lmforge.recipes.compare import CompareConfig, load_labelled
    from lmforge.tokenizers import WordPieceTrainer

    done = work / "data.json"
    if done.is_file():
        return json.loads(done.read_text())
    defaults = CompareConfig.__dataclass_fields__  # the split of `lmforge compare` with its default settings
    pairs = load_labelled(SimpleNamespace(data="bbc"))
    train_idx, test_idx = stratified_split([label for _, label in pairs], defaults["test_fraction"].default,
                                           defaults["split_seed"].default)
    if args.max_articles:  # --quick: a few of each split, evenly spaced (the split itself is unchanged)
        n_test = max(args.max_articles // 4, 1)
        train_idx = train_idx[::max(len(train_idx) // args.max_articles, 1)][:args.max_articles]
        test_idx = test_idx[::max(len(test_idx) // n_test, 1)][:n_test]
    start = time.perf_counter()
    tokenizer = WordPieceTrainer(args.vocab_size, algorithm="bpe-count").train([pairs[i][0] for i in train_idx])
    tokenizer.save_pretrained(str(work / "tokenizer"), overwrite=True)
    print(f"data: a {tokenizer.vocab_size}-token vocabulary on {len(train_idx)} training articles in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    for split, indices in (("train", train_idx), ("test", test_idx)):
        text_dir = work / f"{split}-text"
        shutil.rmtree(text_dir, ignore_errors=True)
        text_dir.mkdir(parents=True)
        for i in indices:
            (text_dir / f"{i:05d}.txt").write_text(pairs[i][0] + "\n", encoding="utf-8")
        code = lmforge(["data", "prepare", "--tokenizer", str(work / "tokenizer"), "--input", str(text_dir),
                        "--out", str(work / f"shards-{split}"), "--workers", "1", "--format", "documents",
                        "--overwrite"])
        if code:
            sys.exit(f"data prepare ({split}) failed ({code})")
    info = {"train_articles": len(train_idx), "test_articles": len(test_idx), "vocab_size": tokenizer.vocab_size}
    atomic_write_text(done, json.dumps(info) + "\n")
    return info


def lr_of(key: str, args: argparse.Namespace) -> float:
    """The peak learning rate of a model: ``--lr``, or ``--txl-lr`` for Transformer-XL when given (a post-LN model;
    at GPT's 1e-3 with 5% warm-up it stalls at the unigram loss)."""
    return args.txl_lr if key == "txl" and args.txl_lr is not None else args.lr


def pretrain(work: Path, key: str, out: Path, steps: int, args: argparse.Namespace, log_every: int,
             save_every: int) -> int:
    preset, objective, extra = MODELS[key]
    if key == "txl" and args.txl_norm_first:  # pre-LN with a final LayerNorm (issue 36), as GPT is
        extra = [*extra, "--model.norm_first=true"]
    if args.dropout_off:  # the small-budget recipe (issue 36): no dropout while pretraining, both models alike
        extra = [*extra, "--dropout-off"]
    if args.precision != "fp32":
        extra = [*extra, f"--train.precision={args.precision}"]
    return lmforge(["pretrain", "--preset", preset, "--objective", objective, "--input", str(work / "shards-train"),
                    "--out", str(out), "--max-steps", str(steps), "--batch-size", str(args.batch_size),
                    "--seq-len", str(args.seq_len), "--lr", str(lr_of(key, args)), "--eval-every", "0",
                    "--save-every", str(save_every), "--seed", "0", "--resume", "auto",
                    "--train.warmup_ratio=0.05", f"--train.log_every={log_every}", "--data.eval_fraction=0", *extra])


def read_log(run: Path) -> list[dict[str, Any]]:
    """The training lines of a run's metrics.jsonl (those with ``elapsed_s``)."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in (json.loads(line) for line in lines if line.strip()) if "elapsed_s" in r and "step" in r]


def stage_calibrate(work: Path, args: argparse.Namespace) -> dict[str, float]:
    """Seconds per training step of each model, from a short run (the first logging interval left out)."""
    done = work / "calibration.json"
    if done.is_file():
        return json.loads(done.read_text())
    every = max(args.calib_steps // 3, 1)
    seconds: dict[str, float] = {}
    for key in MODELS:
        out = work / f"calibrate-{key}"
        shutil.rmtree(out, ignore_errors=True)
        if pretrain(work, key, out, args.calib_steps, args, every, 0):  # no checkpoints
            sys.exit(f"calibration of {key} failed")
        records = read_log(out)
        first, last = records[0], records[-1]
        if last["step"] <= first["step"]:
            sys.exit(f"calibration of {key}: too few logged steps; raise --calib-steps")
        seconds[key] = (last["elapsed_s"] - first["elapsed_s"]) / (last["step"] - first["step"])
        print(f"calibrate: {key} {seconds[key]:.3f} s/step", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    atomic_write_text(done, json.dumps(seconds) + "\n")
    return seconds


def stage_train(work: Path, key: str, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    done = work / f"train-{key}.json"
    if done.is_file():
        return json.loads(done.read_text())
    out = work / key
    start = time.perf_counter()
    if pretrain(work, key, out, steps, args, max(steps // 20, 1), max(steps // 4, 1)):
        sys.exit(f"training {key} failed")
    last = read_log(out)[-1]
    info = {"steps": steps, "trained_steps": last["step"], "training_s": last["elapsed_s"],
            "wall_s_this_session": time.perf_counter() - start, "tokens": last.get("tokens"),
            "train_loss_last": last.get("loss")}
    atomic_write_text(done, json.dumps(info) + "\n")
    return info


# ---------------------------------------------------------------------------------------------- evaluation
def eval_rows(work: Path, rows: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The test stream [SEP] doc [SEP] doc [SEP] ... as ``rows`` rows of inputs and targets (see the docstring)."""
    from lmforge.data.shards import ShardedCorpus
    from lmforge.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(work / "tokenizer")
    corpus = ShardedCorpus(work / "shards-test", tokenizer)
    sep = np.array([tokenizer.sep_id], dtype=np.int64)
    parts = [sep]
    for d in range(corpus.num_documents):
        parts += [np.asarray(corpus.document_tokens(d), dtype=np.int64), sep]
    stream = np.concatenate(parts)
    n = len(stream) - 1  # targets S[1..N]
    row_len = math.ceil(n / rows / seq_len) * seq_len
    x = np.full(rows * row_len, tokenizer.pad_id, dtype=np.int64)
    y = np.full(rows * row_len, IGNORE, dtype=np.int64)
    x[:n], y[:n] = stream[:-1], stream[1:]
    return torch.from_numpy(x.reshape(rows, row_len)), torch.from_numpy(y.reshape(rows, row_len)), n


@torch.inference_mode()
def eval_gpt(model, x: torch.Tensor, y: torch.Tensor, seq_len: int, stride: int) -> tuple[float, int]:
    """Summed NLL and targets of the GPT decoder over windows of ``seq_len`` moved by ``stride`` (blocks: stride =
    seq_len), scoring only the last ``stride`` targets of each window."""
    from lmforge.objectives.causal_lm import CausalLMObjective

    objective = CausalLMObjective()
    total, count = 0.0, 0
    for p in range(0, x.shape[1], stride):
        end = min(p + stride, x.shape[1])
        begin = max(0, end - seq_len)
        labels = y[:, begin:end].clone()
        labels[:, :p - begin] = IGNORE  # context only: scored by an earlier window
        out = objective(model, {"input_ids": x[:, begin:end], "labels": labels,
                                "attention_mask": torch.ones_like(labels)})
        loss, n = out.losses["lm"]
        total, count = total + float(loss), count + int(n)
    return total, count


@torch.inference_mode()
def eval_txl(model, x: torch.Tensor, y: torch.Tensor, seq_len: int, mem: int) -> tuple[float, int]:
    """Summed NLL and targets of Transformer-XL over consecutive windows, the memory (``mem`` states per layer, 0:
    none) carried along each row by the txl objective in evaluation."""
    from lmforge.objectives.txl import TXLObjective

    objective = TXLObjective(eval_mem_len=max(mem, 1))
    total, count = 0.0, 0
    for k, p in enumerate(range(0, x.shape[1], seq_len)):
        reset = int(k == 0 or mem == 0)
        out = objective(model, {"input_ids": x[:, p:p + seq_len], "labels": y[:, p:p + seq_len],
                                "reset": torch.full((x.shape[0],), reset, dtype=torch.long)})
        loss, n = out.losses["lm"]
        total, count = total + float(loss), count + int(n)
    return total, count


def stage_eval(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from lmforge.persistence import load_backbone

    path = work / "eval.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    x, y, n = eval_rows(work, args.eval_rows, args.seq_len)
    models = {key: load_backbone(work / key).model.eval() for key in MODELS}
    settings = [("gpt-blocks", "gpt", "GPT, non-overlapping windows", args.seq_len),
                ("gpt-sliding", "gpt", f"GPT, sliding windows (stride {args.stride})", args.stride)]
    settings += [(f"txl-mem{m}", "txl", f"Transformer-XL, memory {m}" + (" (training)" if m == args.train_mem else ""),
                  m) for m in args.mems]
    for name, key, label, value in settings:
        if name in results:
            continue
        start = time.perf_counter()
        if key == "gpt":
            total, count = eval_gpt(models[key], x, y, args.seq_len, value)
        else:
            total, count = eval_txl(models[key], x, y, args.seq_len, value)
        if count != n:
            sys.exit(f"{name}: scored {count} targets, expected {n}")
        results[name] = {"model": key, "label": label, "nll": total / count, "ppl": math.exp(total / count),
                         "targets": count, "seconds": time.perf_counter() - start}
        print(f"eval: {label}: ppl {results[name]['ppl']:.2f} ({results[name]['seconds']:.1f} s)", flush=True)
        atomic_write_text(path, json.dumps(results, indent=2) + "\n")
    return results


def describe_models(work: Path) -> dict[str, Any]:
    """Parameters (all, and without the token and absolute position embeddings: GPT's table has max_seq_len rows
    however few its training blocks use) and the settings that differ."""
    from lmforge.persistence import load_backbone

    out: dict[str, Any] = {}
    for key in MODELS:
        loaded = load_backbone(work / key)
        c = loaded.config
        total = sum(p.numel() for p in loaded.model.parameters())
        embeddings = sum(p.numel() for name, p in loaded.model.named_parameters()  # token and position tables
                         if name.endswith("embedding.weight"))
        out[key] = {"parameters": total, "non_embedding_parameters": total - embeddings, "n_layers": c.n_layers,
                    "d_model": c.d_model, "n_heads": c.n_heads, "d_ff": c.d_ff or 4 * c.d_model,
                    "activation": c.activation, "norm": "pre-LN" if c.norm_first else "post-LN",
                    "positions": "relative (Transformer-XL)" if c.arch == "xlnet" else f"{c.positional} absolute",
                    "dropout": c.dropout, "attention_dropout": c.attention_dropout}
    return out


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="runs/bench-txl", help="working folder (resumable)")
    parser.add_argument("--minutes", type=float, default=8.0, help="training time of each model")
    parser.add_argument("--calib-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--txl-lr", type=float, default=None, help="Transformer-XL's own peak lr (default: --lr)")
    parser.add_argument("--txl-norm-first", action="store_true",
                        help="Transformer-XL pre-LN with a final LayerNorm (--model.norm_first=true), as GPT is")
    parser.add_argument("--dropout-off", action="store_true",
                        help="both models without dropout while pretraining (the small-budget recipe of issue 36)")
    parser.add_argument("--precision", default="fp32",
                        help="both models' --train.precision: fp32, bf16 or auto (bf16 autocast where the CPU has it "
                             "natively)")
    parser.add_argument("--result", default="", help="the result file's name under benchmarks/results (default: "
                                                     "txl.json, txl-quick.json with --quick)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--mems", default="0,64,256,512", help="Transformer-XL evaluation memories")
    parser.add_argument("--stride", type=int, default=16, help="GPT sliding-window stride")
    parser.add_argument("--eval-rows", type=int, default=8)
    parser.add_argument("--max-articles", type=int, default=0, help="0: all (--quick: 120 train, 30 test)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few articles, a few seconds of training")
    parser.add_argument("--fresh", action="store_true", help="remove --work first")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.calib_steps, args.max_articles, args.vocab_size = 0.2, 9, 120, 2000
        args.mems, args.eval_rows = "0,64,512", 4
        args.work = args.work + "-quick"
    args.mems = [int(m) for m in args.mems.split(",")]
    args.train_mem = 64  # transformer-xl-tiny's mem_len
    work = Path(args.work)
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    result_path = HERE / "results" / (args.result or ("txl-quick.json" if args.quick else "txl.json"))
    result: dict[str, Any] = {"machine": machine_description(),
                              "command": reproduce_command(__file__, sys.argv[1:]),
                              "settings": {k: v for k, v in vars(args).items() if k != "fresh"}}

    def save() -> None:
        atomic_write_text(result_path, json.dumps(result, indent=2) + "\n")

    result["data"] = stage_data(work, args)
    result["seconds_per_step"] = stage_calibrate(work, args)
    result["training"] = {}
    for key in MODELS:
        steps = max(round(args.minutes * 60 / result["seconds_per_step"][key]), 1)
        result["training"][key] = stage_train(work, key, steps, args)
        save()
    result["models"] = describe_models(work)
    result["eval"] = stage_eval(work, args)
    save()
    report(result)


def report(result: dict[str, Any]) -> None:
    print_machine(result["machine"])
    print(f"\n```bash\n{result['command']}\n```\n")
    s, d = result["settings"], result["data"]
    print(f"BBC News: {d['train_articles']} training articles, {d['test_articles']} test articles; "
          f"{d['vocab_size']}-token WordPiece vocabulary; batch {s['batch_size']} x {s['seq_len']} tokens, "
          f"lr {s['lr']}" + (f" (Transformer-XL: {s['txl_lr']})" if s.get("txl_lr") is not None else "")
          + f", {s['minutes']} min of training each (calibrated).\n")
    models = result["models"]
    rows = []
    for key in MODELS:
        m, t = models[key], result["training"][key]
        rows.append([NAMES[key], f"{m['parameters'] / 1e6:.2f}M", f"{m['non_embedding_parameters'] / 1e6:.2f}M",
                     f"{m['n_layers']} x {m['d_model']}, {m['n_heads']} heads, d_ff {m['d_ff']}",
                     f"{m['activation']}, {m['norm']}, {m['positions']}",
                     fmt(result["seconds_per_step"][key], 3), str(t["trained_steps"]), fmt(t["training_s"] / 60, 2),
                     fmt((t["tokens"] or 0) / 1e6, 2)])
    print(markdown_table(["model", "parameters", "without embeddings", "sizes", "differs", "s/step (calibrated)",
                          "steps", "training min", "tokens seen (M)"], rows, align="lrrllrrrr"))
    times = [result["training"][key]["training_s"] for key in MODELS]
    print(f"\nTraining times logged: {' / '.join(f'{t:.0f} s' for t in times)} (ratio {max(times) / min(times):.2f}; "
          "the step counts come from the calibration, so a machine whose load changed in between shows here).")
    print()
    ev = result["eval"]
    targets = next(iter(ev.values()))["targets"] if ev else 0
    print(f"Held-out: the {d['test_articles']} test articles' stream, {targets:,} word pieces, each predicted once "
          "in every setting.\n")
    print(markdown_table(["setting", "NLL / token", "perplexity", "eval s"],
                         [[v["label"], fmt(v["nll"], 4), fmt(v["ppl"], 2), fmt(v["seconds"], 1)]
                          for v in ev.values()]))


if __name__ == "__main__":
    main()
