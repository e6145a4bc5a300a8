"""Fuzz cases for every ``lmforge`` command: bad inputs that must fail cleanly (issue 14, item 8).

Shared by ``tests/test_fuzz_cli.py`` (the fast subset, ``fast=True``) and ``benchmarks/bench_fuzz.py`` (the whole
sweep). Every case runs ``lmforge.cli.main(argv)`` in this process, in a fresh folder of its own (also the working
directory), with copies of small valid inputs built once (``build_fixtures``), one of them broken. A case passes
when the command

* exits with code 2 (``SystemExit(code)`` counts as its code; any other exception escaping ``main`` is a traceback),
* prints no traceback and exactly one stderr line with ``error:``, the last non-empty one (``lmforge: ...`` info
  and warning lines, progress bars, may come before it), and that line is not torch's multi-line C++ internals,
* leaves every file that existed before byte-identical (none deleted).

argparse's own two-line form (``usage: ...`` then ``lmforge X: error: ...``) is accepted for now but counted as
``multi-line``. Cases with ``may_succeed`` (legitimate values such as ``--seed 0``, an empty recipe, text with bytes
that are not UTF-8, which is replaced with a warning) may also exit 0, but must not crash or change files.

Write failures are simulated at the OS boundary for paths under the case's output folder (``os.open``,
``open``/``io.open`` for writing, ``os.fdopen`` of such a descriptor, ``os.mkdir``, ``os.replace``/``os.rename``,
``os.unlink``/``os.rmdir``; ``tempfile.mkstemp`` goes through ``os.open``) raising ``OSError(EROFS/EACCES/ENOSPC)``,
or for ENOSPC at the first ``write``. We run as root, so ``chmod`` would not stop writes. Where ``mount -t tmpfs``
works (root with CAP_SYS_ADMIN; else these cases are skipped) the output folder is also a real 64 KiB tmpfs:
``tmpfs-full`` fills it first, ``tmpfs-64k`` leaves it empty (too small for a training checkpoint, so torch.save
meets a genuinely full disk). Guards keep a broken command from taking the machine down: a time budget per case
(``SIGALRM``), an address-space limit (``RLIMIT_AS``), caps on threads, worker pools and torch's intra-op threads,
and ``lmforge serve`` never binds (``uvicorn.Server.run`` raises ``WouldServe``, which counts as exit 0).
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import errno
import functools
import hashlib
import io
import json
import math
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ============================================================================================== fixtures
TINY_BERT = ["--model.n_layers=1", "--model.d_model=16", "--model.n_heads=2", "--model.d_ff=32",
             "--model.max_seq_len=32", "--train.log_every=1", "--train.eval_batches=1"]


def _sentences(n: int, seed: int) -> list[str]:
    from tests.toy_tasks import BAD, CITIES, FILLER, GOOD, NAMES

    rng = random.Random(seed)
    words = NAMES + CITIES + FILLER + GOOD + BAD
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) + " ." for _ in range(n)]


def _quiet_main(argv: list[str]) -> None:
    """Run the CLI for a fixture; raise with its output if it fails."""
    from lmforge.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"fixture command failed ({code}): lmforge {shlex.join(argv)}\n{err.getvalue()[-3000:]}")


def build_fixtures(root: Path) -> dict[str, Path]:
    """Small valid inputs for every command, under ``root``; {name: path}. About 10-20 s (three tiny trainings)."""
    import torch

    from lmforge.config import ModelConfig, model_config_from_preset
    from lmforge.models import Decoder, EncoderDecoder
    from lmforge.persistence import save_pretrained
    from lmforge.tokenizers import WordPieceTokenizer
    from tests.toy_tasks import (
        CITIES,
        NAMES,
        make_encoder_dir,
        vocab,
        write_choice,
        write_conll,
        write_sequence,
        write_squad,
    )

    root.mkdir(parents=True, exist_ok=True)
    fx: dict[str, Path] = {}
    # text: a corpus (documents separated by blank lines), a few lines, prompts
    lines = _sentences(240, 0)
    corpus = "\n\n".join("\n".join(lines[i:i + 6]) for i in range(0, len(lines), 6)) + "\n"
    fx["corpus.txt"] = root / "corpus.txt"
    fx["corpus.txt"].write_text(corpus, encoding="utf-8")
    fx["lines.txt"] = root / "lines.txt"
    fx["lines.txt"].write_text("\n".join(_sentences(4, 1)) + "\n", encoding="utf-8")
    fx["prompts.txt"] = root / "prompts.txt"
    fx["prompts.txt"].write_text("alice went to\nthe capital of\n", encoding="utf-8")
    # tokenizer and models
    fx["tokenizer"] = root / "tokenizer"
    WordPieceTokenizer(vocab()).save_pretrained(fx["tokenizer"])
    fx["encoder"] = make_encoder_dir(root / "encoder")
    tokenizer = WordPieceTokenizer(vocab())
    torch.manual_seed(0)
    gpt = ModelConfig(arch="decoder", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                      max_seq_len=32, dropout=0.0, attention_dropout=0.0, norm_first=True)
    fx["gpt"] = save_pretrained(Decoder(gpt), root / "gpt", tokenizer=tokenizer)
    torch.manual_seed(0)
    bart = model_config_from_preset("bart-tiny", vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=1,
                                    n_decoder_layers=1, d_ff=32, max_seq_len=32, dropout=0.0)
    fx["seq2seq"] = save_pretrained(EncoderDecoder(bart), root / "seq2seq", tokenizer=tokenizer)
    # labelled data
    fx["train.csv"] = write_sequence(root / "train.csv", 20, 1)
    fx["dev.csv"] = write_sequence(root / "dev.csv", 8, 2)
    fx["train.conll"] = write_conll(root / "train.conll", 12, 1)
    fx["train-squad.json"] = write_squad(root / "train-squad.json", 8, 1)
    fx["train-choice.jsonl"] = write_choice(root / "train-choice.jsonl", 12, 1)
    rng = random.Random(0)
    with (root / "pairs.jsonl").open("w", encoding="utf-8") as f:
        for _ in range(16):
            words = rng.sample(NAMES + CITIES, 3)
            f.write(json.dumps({"source": " ".join(words), "target": " ".join(reversed(words))}) + "\n")
    fx["pairs.jsonl"] = root / "pairs.jsonl"
    fx["pairs-dev.jsonl"] = root / "pairs-dev.jsonl"
    fx["pairs-dev.jsonl"].write_text("".join(fx["pairs.jsonl"].read_text().splitlines(True)[:4]), encoding="utf-8")
    # TOML recipes (paths in them are relative to the case folder, the working directory of a case)
    fx["pretrain.toml"] = root / "pretrain.toml"
    fx["pretrain.toml"].write_text('[train]\nwarmup_ratio = 0.0\n[data]\neval_fraction = 0.1\n', encoding="utf-8")
    fx["seq2seq.toml"] = root / "seq2seq.toml"
    fx["seq2seq.toml"].write_text('[decode]\nbeams = 2\nmax_new_tokens = 4\n', encoding="utf-8")
    fx["compare.toml"] = root / "compare.toml"
    fx["compare.toml"].write_text(
        'out = "out/compare-default"\ndata = "in/train.csv"\ntokenizer = "in/tokenizer"\nsizes = [4]\n'
        'seeds = [0]\nmax_length = 16\ntest_fraction = 0.3\n\n[[approach]]\nname = "tiny"\nfamily = "scratch"\n'
        'model = "bert-tiny"\npreset_options = { d_model = 16, n_heads = 2, n_layers = 1, d_ff = 32, '
        'max_seq_len = 16 }\nepochs = 1\nmin_steps = 1\nbatch_size = 4\n', encoding="utf-8")
    # word vectors and their test files
    words = sorted({w for line in lines for w in line.split()})
    vrng = random.Random(3)
    fx["vectors.txt"] = root / "vectors.txt"
    fx["vectors.txt"].write_text(f"{len(words)} 4\n" + "".join(
        w + " " + " ".join(f"{vrng.uniform(-1, 1):.4f}" for _ in range(4)) + "\n" for w in words), encoding="utf-8")
    fx["wordsim.txt"] = root / "wordsim.txt"
    fx["wordsim.txt"].write_text("alice bob 7.5\nparis rome 8.0\ngreat awful 1.0\nlovely superb 9.0\n",
                                 encoding="utf-8")
    fx["analogies.txt"] = root / "analogies.txt"
    fx["analogies.txt"].write_text(": names\nalice bob carol dave\nparis rome oslo lima\n", encoding="utf-8")
    # CLI-made folders: prepared data, a pretraining run (metrics.jsonl), a fine-tuned classifier, an HF export
    fx["data"] = root / "data"
    _quiet_main(["data", "prepare", "--tokenizer", str(fx["tokenizer"]), "--input", str(fx["corpus.txt"]),
                 "--out", str(fx["data"]), "--workers", "1"])
    fx["pretrain-run"] = root / "pretrain-run"
    _quiet_main(["-q", "pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--input", str(fx["data"]),
                 "--out", str(fx["pretrain-run"]), "--max-steps", "2", "--batch-size", "4", "--seq-len", "32",
                 *TINY_BERT])
    fx["classifier"] = root / "classifier"
    _quiet_main(["-q", "finetune", "--task", "sequence", "--model", str(fx["encoder"]), "--train",
                 str(fx["train.csv"]), "--out", str(fx["classifier"]), "--max-steps", "2", "--batch-size", "8",
                 "--max-length", "32", "--train.log_every=1"])
    fx["hf-bert"] = root / "hf-bert"
    _quiet_main(["convert", "--to-hf", str(fx["encoder"]), "--out", str(fx["hf-bert"])])
    fx["hf-classifier"] = root / "hf-classifier"  # a BertForSequenceClassification with its labels
    _quiet_main(["convert", "--to-hf", str(fx["classifier"]), "--out", str(fx["hf-classifier"])])
    return fx


# ============================================================================================== commands
@dataclass(frozen=True)
class Input:
    """One input path of a command: its flag ("" for a positional), the fixture copied there, and its kind."""

    flag: str
    fixture: str
    kind: str  # text, csv, conll, jsonl, toml, compare-toml, model, classifier, gpt, hf-model, tokenizer, data, run,
    #            vectors, wordsim, analogies
    accepts_dir: bool = False  # a folder is a valid value (text corpora: folders searched for .txt files)


@dataclass(frozen=True)
class Output:
    flag: str
    name: str  # under the case's out/ folder
    is_dir: bool


@dataclass(frozen=True)
class Spec:
    """How to run a command on valid inputs (``inputs`` + ``output`` + ``base``), for mutating one thing."""

    command: str
    inputs: tuple[Input, ...] = ()
    output: Output | None = None
    base: tuple[str, ...] = ()
    variant: str = ""  # a second spec of the same command (another input format)
    context: dict[str, tuple[str, ...]] = field(default_factory=dict)  # option -> extra args making it relevant
    drop_for: dict[str, tuple[str, ...]] = field(default_factory=dict)  # option -> flags (of inputs) to leave out
    has_overwrite: bool = True
    # malformed variants of an input that this command legitimately never reads (they may succeed)
    unread: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.command + (f" [{self.variant}]" if self.variant else "")


SAMPLE = ("--strategy", "sample", "--seed", "1")
SPECS: list[Spec] = [
    Spec("tokenizer train", (Input("--input", "corpus.txt", "text", accepts_dir=True),), Output("--out", "tok", True),
         ("--vocab-size", "80")),
    Spec("tokenizer encode", (Input("--tokenizer", "tokenizer", "tokenizer"), Input("--input", "lines.txt", "lines")),
         Output("--out", "encoded.jsonl", False)),
    Spec("embed", (Input("--model", "encoder", "model"), Input("--input", "lines.txt", "lines")),
         Output("--out", "emb.npy", False), ("--batch-size", "4")),
    Spec("data prepare", (Input("--tokenizer", "tokenizer", "tokenizer"),
                          Input("--input", "corpus.txt", "text", accepts_dir=True)),
         Output("--out", "data", True), ("--workers", "1")),
    Spec("pretrain", (Input("--input", "data", "data"), Input("--config", "pretrain.toml", "toml")),
         Output("--out", "run", True),
         ("--preset", "bert-tiny", "--objective", "mlm", "--max-steps", "2", "--batch-size", "4", "--seq-len", "32",
          *TINY_BERT)),
    Spec("pretrain", (Input("--input", "data", "data"),), Output("--out", "run", True),
         ("--preset", "electra-tiny", "--objective", "electra", "--max-steps", "2", "--batch-size", "4", "--seq-len",
          "32", *TINY_BERT), variant="electra"),
    Spec("pretrain", (Input("--input", "data", "data"),), Output("--out", "run", True),
         ("--preset", "bart-tiny", "--objective", "denoise", "--max-steps", "2", "--batch-size", "4", "--seq-len",
          "32", *TINY_BERT, "--model.n_decoder_layers=1"), variant="denoise"),
    Spec("distill", (Input("--teacher", "encoder", "model"), Input("--input", "data", "data")),
         Output("--out", "dist", True), ("--max-steps", "2", "--batch-size", "4", "--seq-len", "32",
                                         "--train.log_every=1"),
         # distillation reads the corpus with the TEACHER's tokenizer (the manifest's fingerprint is checked against
         # it), never the copy saved beside the shards
         unread=("tokenizer-missing", "tokenizer-vocab-binary", "tokenizer-smaller-than-the-data")),
    Spec("finetune", (Input("--model", "encoder", "model"), Input("--train", "train.csv", "csv"),
                      Input("--dev", "dev.csv", "csv-eval")),
         Output("--out", "ft", True),
         ("--task", "sequence", "--max-steps", "2", "--batch-size", "8", "--max-length", "32", "--train.log_every=1"),
         drop_for={"--epochs": ("--max-steps",)}),
    Spec("finetune", (Input("--model", "encoder", "model"), Input("--train", "train.conll", "conll")),
         Output("--out", "ft", True),
         ("--task", "token", "--max-steps", "2", "--batch-size", "8", "--max-length", "32", "--train.log_every=1"),
         variant="token"),
    Spec("finetune", (Input("--model", "encoder", "model"), Input("--train", "train-squad.json", "squad")),
         Output("--out", "ft", True),
         ("--task", "qa", "--max-steps", "2", "--batch-size", "8", "--max-length", "24", "--task.doc_stride=6",
          "--task.max_query_length=8", "--train.log_every=1"),
         variant="qa"),
    Spec("finetune", (Input("--model", "encoder", "model"), Input("--train", "train-choice.jsonl", "choice")),
         Output("--out", "ft", True),
         ("--task", "choice", "--max-steps", "2", "--batch-size", "4", "--max-length", "32", "--train.log_every=1"),
         variant="choice"),
    Spec("finetune", (Input("--model", "gpt", "gpt"), Input("--train", "train.csv", "csv")),
         Output("--out", "ft", True),
         ("--task", "sequence", "--max-steps", "2", "--batch-size", "8", "--max-length", "32", "--train.log_every=1"),
         variant="gpt"),
    Spec("finetune", (Input("--model", "seq2seq", "seq2seq"), Input("--train", "train.csv", "csv")),
         Output("--out", "ft", True),
         ("--task", "sequence", "--max-steps", "2", "--batch-size", "8", "--max-length", "32", "--train.log_every=1"),
         variant="seq2seq"),
    Spec("fewshot", (Input("--model", "gpt", "gpt"), Input("--train", "train.csv", "csv"),
                     Input("--test", "dev.csv", "csv-eval")),
         Output("--out", "fs", True), ("--shots", "0,1", "--draws", "1", "--template", "{text} is {label}")),
    Spec("evaluate", (Input("--model", "classifier", "classifier"), Input("--test", "dev.csv", "csv-eval")),
         Output("--out", "metrics.json", False), ("--batch-size", "4")),
    Spec("predict", (Input("--model", "classifier", "classifier"), Input("--input", "dev.csv", "csv-unlabelled")),
         Output("--out", "predictions.jsonl", False), ("--batch-size", "4")),
    # issue 37: plain text, one input per line, with the options that say how to read a file
    Spec("predict", (Input("--model", "classifier", "classifier"), Input("--input", "prompts.txt", "lines")),
         Output("--out", "predictions.jsonl", False), ("--batch-size", "4", "--max-length", "16"), variant="txt"),
    Spec("generate", (Input("--model", "gpt", "gpt"), Input("--input", "prompts.txt", "prompts")), None,
         ("--max-new-tokens", "3"), has_overwrite=False,
         context={"--num-beams": ("--strategy", "beam"), "--num-return-sequences": SAMPLE, "--temperature": SAMPLE,
                  "--top-k": SAMPLE, "--top-p": SAMPLE, "--seed": ("--strategy", "sample")}),
    Spec("train-seq2seq", (Input("--tokenizer", "tokenizer", "tokenizer"),
                           Input("--train", "pairs.jsonl", "jsonl"),
                           Input("--dev", "pairs-dev.jsonl", "jsonl"),
                           Input("--config", "seq2seq.toml", "toml")),
         Output("--out", "s2s", True),
         ("--preset", "rnn-seq2seq", "--model.d_model=16", "--max-steps", "2", "--batch-size", "4",
          "--data.max_source_len=8", "--data.max_target_len=8", "--train.log_every=1"),
         drop_for={"--vocab-size": ("--tokenizer",), "--epochs": ("--max-steps",)}),
    Spec("compare", (Input("--config", "compare.toml", "compare-toml"),), Output("--out", "cmp", True)),
    Spec("word2vec train", (Input("--input", "corpus.txt", "text", accepts_dir=True),),
         Output("--out", "w2v.txt", False), ("--dim", "8", "--epochs", "1", "--min-count", "1", "--workers", "1")),
    Spec("glove train", (Input("--input", "corpus.txt", "text", accepts_dir=True),),
         Output("--out", "glove.txt", False), ("--dim", "8", "--epochs", "1", "--min-count", "1", "--workers", "1")),
    Spec("vectors evaluate", (Input("", "vectors.txt", "vectors"), Input("--pairs", "wordsim.txt", "wordsim")), None,
         has_overwrite=False),
    Spec("vectors evaluate", (Input("", "vectors.txt", "vectors"), Input("--analogies", "analogies.txt", "analogies")),
         None, variant="analogies", has_overwrite=False),
    Spec("viz attention", (Input("--model", "encoder", "model"), Input("--text-file", "lines.txt", "text")),
         Output("--out", "attention.html", False)),
    Spec("viz positions", (), Output("--out", "positions.png", False), ("--d-model", "16", "--length", "10")),
    Spec("viz training", (Input("", "pretrain-run", "run"),), Output("--out", "curves.png", False)),
    Spec("serve", (Input("--model", "classifier", "classifier"),), None, (), has_overwrite=False),
    Spec("convert", (Input("--to-hf", "encoder", "model"),), Output("--out", "hf", True)),
    Spec("convert", (Input("--from-hf", "hf-bert", "hf-model"),), Output("--out", "ours", True), variant="from-hf"),
    Spec("convert", (Input("--from-hf", "hf-classifier", "hf-task"),), Output("--out", "ours", True),
         variant="from-hf-task"),
]
DIR_KINDS = {"model", "classifier", "gpt", "seq2seq", "hf-model", "hf-task", "tokenizer", "data", "run"}
# Fixtures a command needs beside its argv (paths inside the compare recipe are relative to the case folder).
SUPPORT = {"compare": ("train.csv", "tokenizer")}


# ============================================================================================== mutations
BINARY = b"\x00\xff\xfe\x80PK\x03\x04\x00\x00" + random.Random(14).randbytes(2048) + b"\xc3\x28\x00\xa0\xa1"
NON_UTF8_JSON = b'{"format": "lmforge", "note": "caf\xe9 \xff\xfe"}\n'
USER_TEXT = "a user's precious results: keep me\n"

Mutate = Callable[[Path, Path], None]  # (destination, the valid fixture it replaces)


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def _write(data: str | bytes) -> Mutate:
    def mutate(dst: Path, src: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return mutate


def _in_copy(name: str, data: str | bytes | None) -> Mutate:
    """Copy the valid folder, then replace (``None``: delete) its file ``name``."""
    def mutate(dst: Path, src: Path) -> None:
        _copy(src, dst)
        target = dst / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        if data is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return mutate


def _dir_in_copy(name: str) -> Mutate:
    """Copy the valid folder, then make its file ``name`` a folder."""
    def mutate(dst: Path, src: Path) -> None:
        _copy(src, dst)
        (dst / name).unlink(missing_ok=True)
        (dst / name).mkdir()
        (dst / name / "readme.txt").write_text("a folder where a file belongs\n", encoding="utf-8")
    return mutate


def _json_in_copy(name: str, edit: Callable[[Any], Any]) -> Mutate:
    """Copy the valid folder, then rewrite its JSON file ``name`` with ``edit(value)``."""
    def mutate(dst: Path, src: Path) -> None:
        _copy(src, dst)
        value = json.loads((dst / name).read_text(encoding="utf-8"))
        (dst / name).write_text(json.dumps(edit(value), indent=2) + "\n", encoding="utf-8")
    return mutate


def _other_weights(fixture: str) -> Mutate:
    """Copy the valid folder with the weights of another model (keys and shapes that do not fit)."""
    def mutate(dst: Path, src: Path) -> None:
        _copy(src, dst)
        shutil.copyfile(src.parent / fixture / "model.safetensors", dst / "model.safetensors")
    return mutate


def _truncated(name: str) -> Mutate:
    def mutate(dst: Path, src: Path) -> None:
        _copy(src, dst)
        data = (dst / name).read_bytes()
        (dst / name).write_bytes(data[:len(data) // 2])
    return mutate


def _set(path: tuple[str, ...], value: Any) -> Callable[[Any], Any]:
    def edit(config: Any) -> Any:
        node = config
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return config
    return edit


def _delete(path: tuple[str, ...]) -> Callable[[Any], Any]:
    def edit(config: Any) -> Any:
        node = config
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
        return config
    return edit


def _vocab_shifted(dst: Path, src: Path) -> None:
    """vocab.txt with 5,000 extra tokens before the real ones: ids beyond the model's embedding table."""
    _copy(src, dst)
    tokens = (dst / "vocab.txt").read_text(encoding="utf-8").splitlines()
    specials = [t for t in tokens if t.startswith("[")]
    rest = [t for t in tokens if not t.startswith("[")]
    (dst / "vocab.txt").write_text("\n".join(specials + [f"filler{i}" for i in range(5000)] + rest) + "\n",
                                   encoding="utf-8")


MODEL_CONFIG = {  # config.json of an lmforge model folder
    "config-list": _in_copy("config.json", "[]\n"),
    "config-string": _in_copy("config.json", '"lmforge"\n'),
    "config-malformed-json": _in_copy("config.json", '{"format": "lmforge", "model": {\n'),
    "config-non-utf8": _in_copy("config.json", NON_UTF8_JSON),
    "config-binary": _in_copy("config.json", BINARY),
    "config-missing": _in_copy("config.json", None),
    "config-is-a-folder": _dir_in_copy("config.json"),
    "config-format-version-string": _json_in_copy("config.json", _set(("format_version",), "1")),
    "config-format-version-future": _json_in_copy("config.json", _set(("format_version",), 99)),
    "config-model-not-a-table": _json_in_copy("config.json", _set(("model",), "bert")),
    "config-huge-vocab-size": _json_in_copy("config.json", _set(("model", "vocab_size"), 2_000_000_000)),
    "config-huge-d-model": _json_in_copy("config.json", _set(("model", "d_model"), 2**40)),
    "config-negative-layers": _json_in_copy("config.json", _set(("model", "n_layers"), -1)),
    "config-float-heads": _json_in_copy("config.json", _set(("model", "n_heads"), 2.5)),
    "config-unknown-model-key": _json_in_copy("config.json", _set(("model", "bogus_option"), 1)),
    "config-unknown-arch": _json_in_copy("config.json", _set(("model", "arch"), "lstm-transformer")),
    "config-tied-not-a-table": _json_in_copy("config.json", _set(("tied",), [1, 2])),
    "config-null-model": _json_in_copy("config.json", _set(("model",), None)),
}
WEIGHTS = {
    "weights-missing": _in_copy("model.safetensors", None),
    "weights-empty": _in_copy("model.safetensors", b""),
    "weights-binary": _in_copy("model.safetensors", BINARY),
    "weights-truncated": _truncated("model.safetensors"),
    "weights-of-another-model": None,  # filled per kind (the encoder gets the GPT's and vice versa)
    "weights-is-a-folder": _dir_in_copy("model.safetensors"),
}
VOCAB = {  # the tokenizer files inside a model or tokenizer folder
    "vocab-binary": _in_copy("vocab.txt", BINARY),
    "vocab-empty": _in_copy("vocab.txt", b""),
    "vocab-non-utf8": _in_copy("vocab.txt", b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncaf\xe9\n\xff\xfe\n"),
    "vocab-no-special-tokens": _in_copy("vocab.txt", "alice\nbob\nparis\n"),
    "vocab-duplicates": _in_copy("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nalice\nalice\nalice\n"),
    "vocab-is-a-folder": _dir_in_copy("vocab.txt"),
    "tokenizer-config-malformed": _in_copy("tokenizer_config.json", "{\n"),
    "tokenizer-config-list": _in_copy("tokenizer_config.json", "[1, 2]\n"),
    "tokenizer-config-non-utf8": _in_copy("tokenizer_config.json", NON_UTF8_JSON),
    "tokenizer-config-bad-values": _in_copy("tokenizer_config.json",
                                            '{"do_lower_case": "maybe", "strip_accents": 7}\n'),
}
MODEL_VOCAB = {**VOCAB, "vocab-larger-than-the-model": _vocab_shifted}
HEAD = {  # the head of a fine-tuned model's config.json
    "head-unknown-option": _json_in_copy("config.json", _set(("head", "bogus_option"), 1)),
    "head-missing-labels": _json_in_copy("config.json", _delete(("head", "labels"))),
    "head-labels-not-a-list": _json_in_copy("config.json", _set(("head", "labels"), "pos")),
    "head-no-labels": _json_in_copy("config.json", _set(("head", "labels"), [])),
    "head-unknown-type": _json_in_copy("config.json", _set(("head", "type"), "telepathy")),
    "head-not-a-table": _json_in_copy("config.json", _set(("head",), [1, 2])),
    "head-task-unknown": _json_in_copy("config.json", _set(("head", "task", "task"), "astrology")),
    "head-task-bad-max-length": _json_in_copy("config.json", _set(("head", "task", "max_length"), -5)),
    "head-null": _json_in_copy("config.json", _set(("head",), None)),
}
HF_CONFIG = {
    "hf-config-list": _in_copy("config.json", "[]\n"),
    "hf-config-model-type-t5": _json_in_copy("config.json", _set(("model_type",), "t5")),
    "hf-config-missing-fields": _in_copy("config.json", '{"model_type": "bert"}\n'),
    "hf-config-huge-vocab-size": _json_in_copy("config.json", _set(("vocab_size",), 2_000_000_000)),
    "hf-config-string-sizes": _json_in_copy("config.json", _set(("hidden_size",), "24")),
    "hf-config-bad-activation": _json_in_copy("config.json", _set(("hidden_act",), "sparkles")),
    "hf-config-non-utf8": _in_copy("config.json", b'{"model_type": "bert", "x": "\xff"}\n'),
}
HF_TASK = {  # a Hugging Face task model's config.json (labels, class, lmforge's own notes)
    "hf-task-id2label-gap": _json_in_copy("config.json", _set(("id2label",), {"0": "a", "5": "b"})),
    "hf-task-id2label-too-few": _json_in_copy("config.json", _set(("id2label",), {"0": "a"})),
    "hf-task-multi-label": _json_in_copy("config.json", _set(("problem_type",), "multi_label_classification")),
    "hf-task-architecture-bare": _json_in_copy("config.json", _set(("architectures",), ["BertModel"])),
    "hf-task-architecture-not-a-list": _json_in_copy("config.json", _set(("architectures",), "BertModel")),
    "hf-task-crf-file-missing": _json_in_copy("config.json", _set(("lmforge_crf",), {"file": "crf.safetensors"})),
    "hf-task-lmforge-head-bogus": _json_in_copy("config.json", _set(("lmforge_head", "bogus_option"), 1)),
}
DATA = {  # a folder made by `lmforge data prepare`
    "manifest-missing": _in_copy("manifest.json", None),
    "manifest-malformed": _in_copy("manifest.json", '{"format": "lmforge-shards",\n'),
    "manifest-list": _in_copy("manifest.json", "[]\n"),
    "manifest-non-utf8": _in_copy("manifest.json", NON_UTF8_JSON),
    "manifest-future-version": _json_in_copy("manifest.json", _set(("version",), 99)),
    "manifest-huge-vocab-size": _json_in_copy("manifest.json", _set(("vocab_size",), 2_000_000_000)),
    "manifest-no-shards": _json_in_copy("manifest.json", _set(("shards",), [])),
    "manifest-shard-counts-lie": _json_in_copy("manifest.json", _set(("shards", 0, "tokens"), 10**9)),
    "manifest-bad-dtype": _json_in_copy("manifest.json", _set(("dtype",), "complex128")),
    "shard-ids-binary": _in_copy("shard-00000.ids.npy", BINARY),
    "shard-ids-truncated": _truncated("shard-00000.ids.npy"),
    "shard-ids-missing": _in_copy("shard-00000.ids.npy", None),
    "shard-doc-binary": _in_copy("shard-00000.doc.npy", BINARY),
    "shard-sent-empty": _in_copy("shard-00000.sent.npy", b""),
    "tokenizer-missing": _in_copy("tokenizer", None),
    "tokenizer-vocab-binary": _in_copy("tokenizer/vocab.txt", BINARY),
    "tokenizer-smaller-than-the-data": _in_copy("tokenizer/vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\n"),
}
RUN = {  # a training run folder for `viz training`
    "metrics-binary": _in_copy("metrics.jsonl", BINARY),
    "metrics-empty": _in_copy("metrics.jsonl", b""),
    "metrics-malformed-lines": _in_copy("metrics.jsonl", '{"step": 1, "loss": 2.0}\n{"step": 2, "loss"\n'
                                        '{"step": 3, "loss": 1.0}\n'),  # skipping it with a warning is fine
    "metrics-not-objects": _in_copy("metrics.jsonl", "[1, 2]\n3\n\"text\"\n"),
    "metrics-no-step": _in_copy("metrics.jsonl", '{"loss": 1.0}\n{"loss": 0.5}\n'),
    "metrics-string-values": _in_copy("metrics.jsonl", '{"step": "one", "loss": "high"}\n'),
    "metrics-non-finite": _in_copy("metrics.jsonl", '{"step": 1, "loss": NaN}\n{"step": 2, "loss": Infinity}\n'),
    "metrics-is-a-folder": _dir_in_copy("metrics.jsonl"),
    "metrics-missing": _in_copy("metrics.jsonl", None),
}
CSV_TRAIN = {
    "csv-header-only": _write("text,label\n"),
    "csv-no-text-column": _write("sentence,category\nalice went,pos\nbob saw,neg\n"),
    "csv-unclosed-quote": _write('text,label\n"alice went to paris,pos\nbob saw rome,neg\n'),
    "csv-ragged-rows": _write("text,label\nalice went,pos,extra,columns\nbob\n"),
    "csv-one-label": _write("text,label\nalice is great,pos\nbob is lovely,pos\n"),
    "csv-nul-bytes": _write("text,label\nal\x00ice is great,pos\nbob is awful,neg\n"),
    "csv-non-utf8": _write(b"text,label\ncaf\xe9 is great,pos\nbob \xff awful,neg\n"),
    "csv-duplicate-header": _write("text,text,label\na,b,pos\nc,d,neg\n"),
    "csv-empty-header": _write("\nalice,pos\n"),
}
CSV_EVAL = {  # labelled data for a model trained on labels pos/neg
    "csv-header-only": _write("text,label\n"),
    "csv-no-text-column": _write("sentence,category\nalice went,pos\nbob saw,neg\n"),
    "csv-unclosed-quote": _write('text,label\n"alice went to paris,pos\nbob saw rome,neg\n'),
    "csv-ragged-rows": _write("text,label\nalice went,pos,extra,columns\nbob\n"),
    "csv-unknown-labels": _write("text,label\nalice is great,joy\nbob is awful,rage\n"),
    "csv-missing-labels": _write("text,label\nalice is great,\nbob is awful,\n"),
    "csv-nul-bytes": _write("text,label\nal\x00ice is great,pos\nbob is awful,neg\n"),
}
CSV_UNLABELLED = {k: v for k, v in CSV_EVAL.items() if k not in ("csv-unknown-labels", "csv-missing-labels")}
CONLL = {
    "conll-one-column": _write("alice\nwent\nto\nparis\n\n"),
    "conll-bad-tags": _write("alice\tX-PER\nwent\tQ\n\nbob\tI-LOC\n\n"),
    "conll-only-blank-lines": _write("\n\n\n"),
    "conll-comma-separated": _write("alice,B-PER\nwent,O\n\n"),
    "conll-one-tag": _write("alice\tO\nwent\tO\n\nbob\tO\n\n"),
}
SQUAD = {
    "squad-malformed-json": _write('{"version": "1.1", "data": [{"paragraphs": [\n'),
    "squad-list": _write("[]\n"),
    "squad-no-data": _write('{"version": "1.1"}\n'),
    "squad-paragraphs-not-a-list": _write('{"data": [{"title": "t", "paragraphs": "text"}]}\n'),
    "squad-no-questions": _write('{"data": [{"title": "t", "paragraphs": [{"context": "alice lives in oslo .", '
                                 '"qas": []}]}]}\n'),
    "squad-answer-outside-the-context": _write(
        '{"data": [{"title": "t", "paragraphs": [{"context": "alice lives in oslo .", "qas": [{"id": "q", '
        '"question": "where ?", "answers": [{"text": "oslo", "answer_start": 9999}]}]}]}]}\n'),
    "squad-wrong-types": _write('{"data": [{"title": "t", "paragraphs": [{"context": 5, "qas": [{"id": 1, '
                                '"question": null, "answers": [{"text": 3, "answer_start": "x"}]}]}]}]}\n'),
    "squad-non-utf8": _write(b'{"data": [{"title": "caf\xe9", "paragraphs": []}]}\n'),
}
JSONL_PAIRS = {
    "jsonl-truncated-line": _write('{"source": "alice oslo bob", "target"\n'),
    "jsonl-arrays": _write('["alice", "bob"]\n[1, 2]\n'),
    "jsonl-missing-keys": _write('{"src": "alice oslo", "tgt": "oslo alice"}\n'),
    "jsonl-wrong-types": _write('{"source": 5, "target": null}\n{"source": [1], "target": {"a": 1}}\n'),
    "jsonl-empty-target": _write('{"source": "alice oslo bob", "target": ""}\n'),
    "jsonl-scalars": _write('1\n"text"\nnull\n'),
}
CHOICE = {
    "choice-one-option": _write('{"text": "alice lives in oslo", "choices": ["oslo"], "label": 0}\n'),
    "choice-label-out-of-range": _write('{"text": "alice lives in oslo", "choices": ["oslo", "rome"], "label": 5}\n'),
    "choice-label-not-an-option": _write('{"text": "alice", "choices": ["oslo", "rome"], "label": "lima"}\n'),
    "choice-options-not-a-list": _write('{"text": "alice lives in oslo", "choices": "oslo rome", "label": 0}\n'),
    "choice-empty-option": _write('{"text": "alice lives in oslo", "choices": ["oslo", ""], "label": 0}\n'),
    "choice-no-text": _write('{"context": "alice", "choices": ["oslo", "rome"], "label": 0}\n'),
    "jsonl-truncated-line": _write('{"text": "alice lives in oslo", "choices"\n'),
    "jsonl-scalars": _write('1\n"text"\nnull\n'),
}
TOML = {
    "toml-syntax-error": _write("[train\nlr = \n"),
    "toml-wrong-type": _write('[train]\nlr = "fast"\n'),
    "toml-unknown-key": _write("[train]\nbogus_option = 1\n"),
    "toml-bad-value": _write("[train]\nwarmup_ratio = 7.0\n"),  # keys the command line does not set
    "toml-non-utf8": _write(b"# caf\xe9\n[train]\nlr = 0.1\n"),
    "toml-section-is-a-value": _write("train = [1, 2]\n"),
    "toml-huge-int": _write("[train]\nseed = 99999999999999999999\n"),
}
COMPARE_TOML = {
    "toml-syntax-error": _write("out = \n[[approach]\n"),
    "toml-no-approach": _write('out = "out/c"\ndata = "in/train.csv"\n'),
    "toml-bad-approach": _write('data = "in/train.csv"\n[[approach]]\nname = "x"\nfamily = "nope"\n'
                                'model = "bert-tiny"\n'),
    "toml-missing-data-file": _write('data = "in/absent.csv"\ntokenizer = "in/tokenizer"\n[[approach]]\nname = "x"\n'
                                     'model = "bert-tiny"\n'),
    "toml-negative-sizes": _write('data = "in/train.csv"\nsizes = [-1]\n[[approach]]\nname = "x"\n'
                                  'model = "bert-tiny"\n'),
    "toml-sizes-not-a-list": _write('data = "in/train.csv"\nsizes = "ten"\n[[approach]]\nname = "x"\n'
                                    'model = "bert-tiny"\n'),
    "toml-approach-not-a-table": _write('data = "in/train.csv"\napproach = [1, 2]\n'),
    "toml-unknown-model": _write('data = "in/train.csv"\ntokenizer = "in/tokenizer"\n[[approach]]\nname = "x"\n'
                                 'model = "no-such-model"\n'),
    "toml-non-utf8": _write(b"# caf\xe9\nout = 1\n"),
}
TEXT_CORPUS = {  # text that holds no words
    "text-whitespace-only": _write("   \n\t\n\n  \n"),
    "text-nul-bytes-only": _write(b"\x00" * 64),
}
PROMPTS = {
    "prompts-whitespace-only": _write("   \n\t\n"),
    "prompts-too-long": _write(" ".join(["alice"] * 500) + "\n"),
    "prompts-unknown-words-only": _write("\u2603\u2603 \U0001f600\n"),
}
VECTORS = {
    "vectors-glove-no-header": _write("alice 0.1 0.2\nbob 0.3 0.4\n"),  # GloVe's own format: readable
    "vectors-no-header-ragged": _write("alice 0.1 0.2\nbob 0.3\n"),
    "vectors-count-too-big": _write("5 2\nalice 0.1 0.2\n"),
    "vectors-huge-header": _write("1000000000000 300\nalice 0.1 0.2\n"),
    "vectors-negative-header": _write("-1 2\nalice 0.1 0.2\n"),
    "vectors-zero-dim": _write("2 0\nalice\nbob\n"),
    "vectors-wrong-width": _write("2 3\nalice 0.1\nbob 0.1 0.2 0.3\n"),
    "vectors-not-numbers": _write("1 2\nalice x y\n"),
    "vectors-binary-truncated": _write(b"3 4\nalice " + b"\x00\x01\x02\x03\x04"),
    "vectors-non-utf8-words": _write(b"2 2\ncaf\xe9 0.1 0.2\n\xff\xfe 0.3 0.4\n"),
}
WORDSIM = {
    "pairs-two-fields": _write("alice bob\nparis rome\n"),
    "pairs-score-not-a-number": _write("alice bob high\nparis rome low\n"),
    "pairs-non-utf8": _write(b"alice caf\xe9 1.0\n\xff\xfe bob 2.0\n"),
}
ANALOGIES = {
    "analogies-three-words": _write(": s\nalice bob carol\n"),
    "analogies-five-words": _write(": s\nalice bob carol dave erin\n"),
    "analogies-non-utf8": _write(b": s\nalice bob caf\xe9 \xff\n"),
}
MALFORMED: dict[str, dict[str, Mutate | None]] = {
    "model": {**MODEL_CONFIG, **WEIGHTS, **MODEL_VOCAB}, "gpt": {**MODEL_CONFIG, **WEIGHTS, **MODEL_VOCAB},
    "seq2seq": {**MODEL_CONFIG, **WEIGHTS, **MODEL_VOCAB},
    "classifier": {**MODEL_CONFIG, **WEIGHTS, **MODEL_VOCAB, **HEAD}, "hf-model": {**HF_CONFIG, **WEIGHTS, **VOCAB},
    "hf-task": {**HF_CONFIG, **WEIGHTS, **VOCAB, **HF_TASK},
    "tokenizer": VOCAB, "data": DATA, "run": RUN, "csv": CSV_TRAIN, "csv-eval": CSV_EVAL,
    "csv-unlabelled": CSV_UNLABELLED, "conll": CONLL, "squad": SQUAD, "choice": CHOICE, "jsonl": JSONL_PAIRS,
    "toml": TOML,
    "compare-toml": COMPARE_TOML,
    "text": TEXT_CORPUS, "lines": TEXT_CORPUS, "prompts": PROMPTS, "vectors": VECTORS, "wordsim": WORDSIM,
    "analogies": ANALOGIES,
}
# which family a malformed variant is reported under (the first word of its name)
FAMILY = {"config": "config", "hf": "config", "weights": "weights", "vocab": "vocab", "tokenizer": "vocab",
          "head": "head"}
# variants that are not necessarily errors: they may exit 0, but must not crash or change files
MAY_SUCCEED_VARIANTS = {"csv-nul-bytes", "csv-non-utf8", "csv-duplicate-header", "jsonl-empty-target",
                        "metrics-non-finite", "metrics-no-step", "vectors-non-utf8-words", "vectors-glove-no-header",
                        "pairs-non-utf8",
                        "analogies-non-utf8", "prompts-unknown-words-only", "vocab-non-utf8", "vocab-duplicates",
                        "tokenizer-config-bad-values", "conll-one-tag", "hf-config-non-utf8",
                        "manifest-shard-counts-lie", "manifest-huge-vocab-size", "manifest-bad-dtype",
                        "metrics-malformed-lines",
                        "csv-unknown-labels"}  # a dev/test label the model cannot produce: a miss, with a warning
# per input kind: "lines" are one input per line, and an empty line is an input like any other
MAY_SUCCEED_BY_KIND = {"lines": {"text-whitespace-only", "text-nul-bytes-only"}}
# an empty file is a valid value: a recipe with no settings, zero input lines
EMPTY_OK = {"toml", "lines"}
# free text: bytes that are not UTF-8 are replaced (with a warning) unless --strict-utf8 is given
FREE_TEXT = {"text", "lines", "prompts"}


# ============================================================================================== numeric options
INT_VALUES = ("0", "-1", "nan", str(2**31), str(10**20))
FLOAT_VALUES = ("0", "-1", "nan", "inf", "-inf", "1e30")
LIST_VALUES = {"--sizes": ("-1", "", "x"), "--seeds": ("", "x", "-1")}  # compare's comma-separated integers
HUGE = (str(2**31), str(10**20))
# (option or (command, option)) -> values that are legitimate: the case may exit 0
ZERO_OK = {"--seed", "--min-frequency", "--min-count", "--weight-decay", "--warmup-ratio", "--sample", "--min-lr",
           "--save-every", "--save-minutes", "--eval-every", "--no-repeat-ngram-size", "--port", "--max-wait-ms",
           "--graceful-timeout",
           "--top-k", ("glove train", "--alpha"), ("distill", "--teacher-layer"), "--reinit-layers"}
HUGE_OK = {"--seed", "--min-frequency", "--limit-alphabet", "--max-input-chars-per-word", "--shard-tokens",
           "--save-every", "--eval-every", "--max-entries", "--top-k", "--no-repeat-ngram-size", "--share-negatives",
           "--window", "--max-batch", "--max-texts", "--max-chars", "--max-new-tokens", "--vocab-size",
           ("tokenizer encode", "--max-length"), ("embed", "--max-length"), ("viz attention", "--max-length"),
           ("serve", "--max-length"), ("data prepare", "--workers"), ("embed", "--batch-size"),
           ("evaluate", "--batch-size"), ("predict", "--batch-size"), ("generate", "--batch-size"),
           ("finetune", "--batch-size"), ("train-seq2seq", "--batch-size"), ("word2vec train", "--batch-size"),
           ("glove train", "--batch-size"), ("pretrain", "--micro-batch-size"), ("word2vec train", "--workers"),
           ("glove train", "--workers")}
BIG_FLOAT_BAD = {"--warmup-ratio", "--top-p"}  # 1e30 is out of range; elsewhere it is merely odd
INF_OK = {"--graceful-timeout"}
# values that are legitimate but would only make the command run for a long time: not generated
LONG_RUNNING_OPTIONS = {"--max-steps", "--epochs"}
LONG_RUNNING = {(o, v) for o in LONG_RUNNING_OPTIONS for v in (*HUGE, "1e30")}


def _matches(table: set, command: str, option: str) -> bool:
    return option in table or (command, option) in table


def numeric_expectation(command: str, option: str, value: str, bound: bool | None = None) -> bool | None:
    """None: do not generate; True: the value is legitimate (may succeed); False: it must be refused.
    ``bound``: the value is a bound of the option's declared range, included (True) or excluded (False)."""
    if (option, value) in LONG_RUNNING or (bound and option in LONG_RUNNING_OPTIONS):
        return None
    if bound is not None and value not in (*INT_VALUES, *FLOAT_VALUES):
        return bound
    if option in LIST_VALUES:
        return value == "-1" and option == "--seeds"
    if value == "nan":
        return False
    if option == "--seed":
        return True
    if value == "0":
        return _matches(ZERO_OK, command, option)
    if value in HUGE:
        return _matches(HUGE_OK, command, option)
    if value == "1e30":
        return option not in BIG_FLOAT_BAD
    if value == "inf":
        return option in INF_OK
    return False  # -1, -inf


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """{"tokenizer train": its parser, ...} from ``lmforge.cli.build_parser()``."""
    from lmforge.cli import build_parser

    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*prefix, name])
                return
        out[" ".join(prefix)] = parser

    walk(build_parser(), [])
    return out


def numeric_options(parser: argparse.ArgumentParser) -> list[tuple[str, tuple[str, ...]]]:
    """(long option, values to try) for every option of type int or float (plain, or a type object with ``kind``
    int/float such as ``lmforge.commands.options.Number``), and compare's integer lists. The values: 0, -1, nan,
    inf, -inf, 1e30 (floats), huge integers, and the bounds of a declared range (``low``/``high``) themselves."""
    found = []
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.help == argparse.SUPPRESS:  # deprecated spellings act as their new names
            continue
        kind = action.type if action.type in (int, float) else getattr(action.type, "kind", None)
        if kind in (int, float):
            values = list(INT_VALUES if kind is int else FLOAT_VALUES)
            for bound in ("low", "high"):
                value = getattr(action.type, bound, None)
                if isinstance(value, int | float) and math.isfinite(value):
                    text = repr(kind(value))
                    if text not in values:
                        values.append(text)
            found.append((longs[0], tuple(values)))
        elif longs[0] in LIST_VALUES:
            found.append((longs[0], LIST_VALUES[longs[0]]))
    return found


def declared_bound(parser: argparse.ArgumentParser, option: str, value: str) -> bool | None:
    """For a value that is a bound of the option's declared range: whether the range includes it (else None)."""
    for action in parser._actions:
        if option in action.option_strings:
            t = action.type
            for bound, is_open in (("low", "low_open"), ("high", "high_open")):
                b = getattr(t, bound, None)
                if isinstance(b, int | float) and math.isfinite(b) and repr(getattr(t, "kind", float)(b)) == value:
                    return not getattr(t, is_open, False)
    return None


# ============================================================================================== cases
@dataclass
class Case:
    spec: Spec
    kind: str  # the mutation family: missing, empty, binary, dir-for-file, ..., num, write, tmpfs
    detail: str
    prepare: Callable[[Path, dict[str, Path]], list[str]]  # (case folder, fixtures) -> argv
    may_succeed: bool = False
    fault: str | None = None  # erofs | eacces | enospc-open | enospc-write | tmpfs-full | tmpfs-64k: see run_case
    fast: bool = False

    @property
    def id(self) -> str:
        """``command-kind-detail`` in characters pytest's ``-k`` accepts, e.g. ``embed-config-model_config-list``."""
        slug = re.sub(r"[^A-Za-z0-9.+-]+", "_", self.detail.replace("--", "")).strip("_")
        name = self.spec.command.replace(" ", "-") + (f".{self.spec.variant}" if self.spec.variant else "")
        return f"{name}-{self.kind}-{slug}" if slug else f"{name}-{self.kind}"


def _drop(args: list[str], flag: str) -> list[str]:
    """``args`` without ``flag`` and its value (``--x v`` or ``--x=v``)."""
    out, i = [], 0
    while i < len(args):
        if args[i] == flag:
            i += 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
            continue
        if not args[i].startswith(flag + "="):
            out.append(args[i])
        i += 1
    return out


def build_argv(spec: Spec, case_dir: Path, fx: dict[str, Path], *, slot: int | None = None,
               mutate: Mutate | None = None, out: Path | None = None, out_setup: Callable[[Path], None] | None = None,
               extra: tuple[str, ...] = (), drop: tuple[str, ...] = (), overwrite: bool = False,
               prefix: tuple[str, ...] = ()) -> list[str]:
    """The argv of a valid run of ``spec`` in ``case_dir`` (inputs copied to in/, outputs to out/), with input
    ``slot`` made by ``mutate`` instead, another output path, options dropped or added."""
    (case_dir / "in").mkdir(parents=True, exist_ok=True)
    (case_dir / "out").mkdir(parents=True, exist_ok=True)
    for name in SUPPORT.get(spec.command, ()):
        _copy(fx[name], case_dir / "in" / name)
    argv = [*prefix, *spec.command.split()]
    for i, inp in enumerate(spec.inputs):
        path = case_dir / "in" / inp.fixture
        if i == slot and mutate is not None:
            mutate(path, fx[inp.fixture])
        elif inp.flag in drop:
            continue
        elif not path.exists():
            _copy(fx[inp.fixture], path)
        argv += [inp.flag, str(path)] if inp.flag else [str(path)]
    if spec.output is not None and spec.output.flag not in drop:
        target = out if out is not None else case_dir / "out" / spec.output.name
        if out_setup is not None:
            out_setup(target)
        argv += [spec.output.flag, str(target)]
    base = list(spec.base)
    for flag in drop:
        base = _drop(base, flag)
    argv += base + list(extra) + (["--overwrite"] if overwrite else [])
    return argv


@functools.cache
def strict_utf8_flag() -> bool:
    """Whether the CLI has the global ``--strict-utf8`` (refuse text that is not UTF-8)."""
    from lmforge.cli import build_parser

    return any("--strict-utf8" in a.option_strings for a in build_parser()._actions)


def _input_cases(spec: Spec) -> Iterator[Case]:
    for i, inp in enumerate(spec.inputs):
        label = inp.flag or f"<{inp.fixture}>"
        is_dir = inp.kind in DIR_KINDS

        def case(kind: str, detail: str, mutate: Mutate, may: bool = False, prefix: tuple[str, ...] = (),
                 _i: int = i) -> Case:
            return Case(spec, kind, detail,
                        lambda d, fx: build_argv(spec, d, fx, slot=_i, mutate=mutate, prefix=prefix),
                        may_succeed=may)

        yield case("missing", label, lambda dst, src: None)
        if is_dir:
            yield case("empty", f"{label} empty folder", lambda dst, src: dst.mkdir(parents=True))
            yield case("file-for-dir", label, _write("not a folder\n"))
            yield case("binary", f"{label} every file random bytes", _all_binary)
        else:
            yield case("empty", label, _write(b""), may=inp.kind in EMPTY_OK)
            yield case("binary", label, _write(BINARY), may=inp.kind in FREE_TEXT)
            if inp.kind in FREE_TEXT and strict_utf8_flag():
                yield case("binary", f"{label} --strict-utf8", _write(BINARY), prefix=("--strict-utf8",))
            if inp.accepts_dir:
                yield case("dir-for-file", f"{label} folder without .txt files", _folder_without_text)
            else:
                yield case("dir-for-file", label, _folder)
        variants = dict(MALFORMED.get(inp.kind, {}))
        if "weights-of-another-model" in variants:
            variants["weights-of-another-model"] = _other_weights("encoder" if inp.kind == "gpt" else "gpt")
        for name, mutate in variants.items():
            family = FAMILY.get(name.split("-")[0], "malformed")
            may = (name in MAY_SUCCEED_VARIANTS or name in MAY_SUCCEED_BY_KIND.get(inp.kind, ())
                   or name in spec.unread)
            yield case(family, f"{label} {name}", mutate, may=may)


def _folder(dst: Path, src: Path) -> None:
    dst.mkdir(parents=True)
    (dst / "readme.txt").write_text("a folder where a file belongs\n", encoding="utf-8")


def _folder_without_text(dst: Path, src: Path) -> None:
    dst.mkdir(parents=True)
    (dst / "data.bin").write_bytes(BINARY)


def _all_binary(dst: Path, src: Path) -> None:
    _copy(src, dst)
    for path in sorted(dst.rglob("*")):
        if path.is_file():
            path.write_bytes(BINARY)


def _user_folder(path: Path) -> None:
    """An existing folder holding a user's files (a model of theirs and notes)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.safetensors").write_bytes(BINARY)
    (path / "config.json").write_text('{"user": "my own model, not lmforge\'s"}\n', encoding="utf-8")
    (path / "vocab.txt").write_text("[PAD]\nmine\n", encoding="utf-8")
    (path / "notes.txt").write_text(USER_TEXT, encoding="utf-8")


def _user_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(USER_TEXT, encoding="utf-8")


def _output_cases(spec: Spec) -> Iterator[Case]:
    out = spec.output
    if out is None:
        return
    ow = (False, True) if spec.has_overwrite else (False,)

    def case(kind: str, detail: str, *, target: Callable[[Path], Path] | None = None,
             setup: Callable[[Path], None] | None = None, overwrite: bool = False, fault: str | None = None) -> Case:
        def prepare(d: Path, fx: dict[str, Path]) -> list[str]:
            return build_argv(spec, d, fx, out=None if target is None else target(d), out_setup=setup,
                              overwrite=overwrite)
        suffix = " --overwrite" if overwrite else ""
        return Case(spec, kind, detail + suffix, prepare, fault=fault)

    if out.is_dir:
        yield case("out-existing", f"{out.flag} folder with a user's files", setup=_user_folder)
        for o in ow:
            yield case("out-type", f"{out.flag} is an existing file", setup=_user_file, overwrite=o)
    else:
        yield case("out-existing", f"{out.flag} an existing file", setup=_user_file)
        for o in ow:
            yield case("out-type", f"{out.flag} is a folder", setup=_user_folder, overwrite=o)
    yield case("out-type", f"{out.flag} under a file",
               target=lambda d: d / "out" / "blocker.txt" / out.name,
               setup=lambda p: _user_file(p.parent))
    same = [i for i in spec.inputs if (i.kind in DIR_KINDS) == out.is_dir]
    if spec.inputs:
        first = (same or list(spec.inputs))[0]
        for o in ow:
            yield case("out-is-input", f"{out.flag} = {first.flag or first.fixture}",
                       target=lambda d, f=first: d / "in" / f.fixture, overwrite=o)
    for fault in ("erofs", "eacces", "enospc-open", "enospc-write"):
        yield case("write", fault, fault=fault)
    yield case("tmpfs", "full", fault="tmpfs-full")
    small = case("tmpfs", "64k", fault="tmpfs-64k")  # big enough for some outputs, never for a checkpoint
    small.may_succeed = spec.command not in CHECKPOINTING
    yield small


def _numeric_cases(spec: Spec, parser: argparse.ArgumentParser) -> Iterator[Case]:
    for option, values in numeric_options(parser):
        for value in values:
            may = numeric_expectation(spec.command, option, value, declared_bound(parser, option, value))
            if may is None:
                continue
            drop = (option, *spec.drop_for.get(option, ()))
            extra = (*spec.context.get(option, ()), f"{option}={value}")

            def prepare(d: Path, fx: dict[str, Path], _drop: tuple = drop, _extra: tuple = extra) -> list[str]:
                return build_argv(spec, d, fx, drop=_drop, extra=_extra)
            yield Case(spec, "num", f"{option}={value}", prepare, may_succeed=may)


def _argument_cases(spec: Spec, parser: argparse.ArgumentParser) -> Iterator[Case]:
    yield Case(spec, "args", "unknown option", lambda d, fx: build_argv(spec, d, fx, extra=("--no-such-option",)))
    flags = [i.flag for i in spec.inputs if i.flag] + ([spec.output.flag] if spec.output else [])
    required = {o for a in parser._actions if a.required for o in a.option_strings}
    # an option argparse requires, else the output (a run without one must be refused too)
    missing = next((f for f in flags if f in required), spec.output.flag if spec.output else None)
    if missing:
        yield Case(spec, "args", f"without {missing}", lambda d, fx: build_argv(spec, d, fx, drop=(missing,)))


def all_cases() -> list[Case]:
    """Every case of the sweep, in a fixed order; ``fast`` marks the subset of tests/test_fuzz_cli.py."""
    parsers = command_parsers()
    cases: list[Case] = []
    for spec in SPECS:
        cases += [*_input_cases(spec), *_output_cases(spec)]
        if not spec.variant:  # a variant has the same options as its command
            cases += [*_numeric_cases(spec, parsers[spec.command]), *_argument_cases(spec, parsers[spec.command])]
    _mark_fast(cases)
    seen: set[str] = set()
    for case in cases:
        assert case.id not in seen, f"duplicate fuzz case id {case.id}"
        seen.add(case.id)
    return cases


# The fast subset: per command (and variant), the first must-fail case of every mutation family (write faults:
# erofs and enospc-write; both tmpfs cases where they must fail) and one must-fail case per numeric value, rotated
# over the command's options.
CHECKPOINTING = {"pretrain", "finetune", "train-seq2seq", "compare"}  # their checkpoints do not fit in 64 KiB
# Also in the fast subset: cases of the sweep that found bugs (each takes well under a second).
FAST_EXTRA = {
    "pretrain-malformed-input_manifest-list", "pretrain-malformed-input_manifest-non-utf8",
    "pretrain-malformed-input_shard-sent-empty", "pretrain-malformed-config_toml-huge-int",
    "train-seq2seq-malformed-config_toml-huge-int", "viz-training-malformed-pretrain-run_metrics-not-objects",
    "vectors-evaluate-malformed-vectors.txt_vectors-huge-header", "word2vec-train-num-window_2147483648",
    "word2vec-train-num-window_100000000000000000000", "word2vec-train-num-share-negatives_2147483648",
    "word2vec-train-num-workers_128", "glove-train-num-workers_128", "generate-num-num-beams_2147483648",
    "convert-vocab-to-hf_vocab-larger-than-the-model", "convert-vocab-to-hf_vocab-is-a-folder",
}


def _mark_fast(cases: list[Case]) -> None:
    seen: set[tuple[str, str]] = set()
    numeric: dict[tuple[str, str], list[Case]] = {}
    for case in cases:
        if case.may_succeed:
            continue
        if case.kind == "num":
            value = case.detail.split("=", 1)[1]
            if value in (*INT_VALUES, *FLOAT_VALUES):  # not the bounds of declared ranges
                numeric.setdefault((case.spec.name, value), []).append(case)
            continue
        if case.kind == "write" and case.detail not in ("erofs", "enospc-write"):
            continue
        key = (case.spec.name, case.kind + (case.detail if case.kind == "tmpfs" else ""))
        if key not in seen:
            seen.add(key)
            case.fast = True
    for n, group in enumerate(group for _, group in sorted(numeric.items())):
        group[n % len(group)].fast = True
    by_id = {case.id: case for case in cases}
    for case_id in FAST_EXTRA:
        by_id[case_id].fast = True  # a KeyError here: a case was renamed; update FAST_EXTRA


# ============================================================================================== running a case
class CaseTimeout(BaseException):
    """The case ran past its time budget (raised by SIGALRM; a BaseException so ``except Exception`` lets it by)."""


class ResourceGuard(BaseException):
    """The case started too many threads or worker processes."""


class WouldServe(BaseException):
    """``lmforge serve`` got as far as binding its socket (``uvicorn.Server.run``)."""


MAX_THREADS = 256
MAX_PROCESSES = 16
MAX_TORCH_THREADS = 8  # torch.set_num_threads(n) is capped at this during a case


class _FullFile:
    """A file whose writes fail with ENOSPC (a disk that is full once the file is open)."""

    def __init__(self, f: Any, name: Any) -> None:
        self._f, self._name = f, name

    def _full(self, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a real write(2) failure: no file name

    write = writelines = _full

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._f)


class FaultInjector:
    """Make writes under ``root`` fail as on a read-only (EROFS), forbidden (EACCES) or full (ENOSPC) disk:
    ``enospc-open`` fails when the file is opened, ``enospc-write`` at its first write (mkdir and rename work)."""

    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    ERRNO = {"erofs": errno.EROFS, "eacces": errno.EACCES, "enospc-open": errno.ENOSPC, "enospc-write": errno.ENOSPC}

    def __init__(self, root: Path, mode: str) -> None:
        self.root = os.path.realpath(root)
        self.mode = mode
        self.errno = self.ERRNO[mode]
        self.fds: set[int] = set()
        self.hits = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def under(self, path: Any) -> bool:
        if isinstance(path, int):
            return False
        try:
            p = os.path.realpath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return False
        return p == self.root or p.startswith(self.root + os.sep)

    def fail(self, path: Any) -> None:
        self.hits += 1
        raise OSError(self.errno, os.strerror(self.errno), os.fsdecode(os.fspath(path)))

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        real = getattr(owner, name)
        self._saved.append((owner, name, real))
        setattr(owner, name, make(real))

    def __enter__(self) -> FaultInjector:
        full_on_write = self.mode == "enospc-write"
        soft = self.mode == "enospc-write"  # a full disk still lets you mkdir, rename and delete in this model

        def os_open(real):
            def patched(path, flags, mode=0o777, *, dir_fd=None):
                if flags & self.WRITE_FLAGS and dir_fd is None and self.under(path):
                    if not full_on_write:
                        self.fail(path)
                    fd = real(path, flags, mode)
                    self.fds.add(fd)
                    self.hits += 1
                    return fd
                return real(path, flags, mode, dir_fd=dir_fd)
            return patched

        def py_open(real):
            def patched(file, mode="r", *args, **kwargs):
                if isinstance(file, str | bytes | os.PathLike) and set(mode) & set("wax+") and self.under(file):
                    if not full_on_write:
                        self.fail(file)
                    self.hits += 1
                    return _FullFile(real(file, mode, *args, **kwargs), file)
                return real(file, mode, *args, **kwargs)
            return patched

        def fdopen(real):
            def patched(fd, *args, **kwargs):
                f = real(fd, *args, **kwargs)
                return _FullFile(f, fd) if fd in self.fds else f
            return patched

        def guarded(real, n_paths=1):
            def patched(*args, **kwargs):
                if not soft and any(self.under(a) for a in args[:n_paths]) and kwargs.get("dir_fd") is None:
                    self.fail(args[n_paths - 1])
                return real(*args, **kwargs)
            return patched

        self._patch(os, "open", os_open)
        self._patch(builtins, "open", py_open)
        self._patch(io, "open", lambda real: builtins.open)
        self._patch(os, "fdopen", fdopen)
        for name in ("mkdir", "unlink", "remove", "rmdir"):
            self._patch(os, name, guarded)
        for name in ("replace", "rename"):
            self._patch(os, name, lambda real: guarded(real, 2))
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)
        self._saved.clear()


_TMPFS: bool | None = None


def tmpfs_available() -> bool:
    """Whether ``mount -t tmpfs`` works here (root with CAP_SYS_ADMIN); checked once."""
    global _TMPFS
    if _TMPFS is None:
        import tempfile

        probe = Path(tempfile.mkdtemp(prefix="lmforge-tmpfs-probe-"))
        try:
            _TMPFS = _mount_tmpfs(probe)
            if _TMPFS:
                _umount(probe)
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    return _TMPFS


def _mount_tmpfs(path: Path, size: str = "64k") -> bool:
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, check=False, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _fill(path: Path) -> None:
    """Write ``path`` until its file system is full (a user's file that must survive the case unchanged)."""
    chunk = bytes(range(256)) * 16
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False, timeout=30)


@contextlib.contextmanager
def _guards(budget_s: float, memory_headroom: int) -> Iterator[None]:
    """Time budget (SIGALRM), address-space limit, caps on threads, pools and torch's intra-op threads, no
    serving; torch's thread count is restored afterwards."""
    import multiprocessing.pool

    import torch

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"ran past its {budget_s:.0f} s budget")

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    limit = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + memory_headroom, limit[1]))
    except (OSError, ValueError, StopIteration):
        pass
    threads = [0]
    real_thread_init = threading.Thread.__init__
    real_pool_init = multiprocessing.pool.Pool.__init__

    def thread_init(self, *args: Any, **kwargs: Any) -> None:
        threads[0] += 1
        if threads[0] > MAX_THREADS:
            raise ResourceGuard(f"started more than {MAX_THREADS} threads")
        real_thread_init(self, *args, **kwargs)

    def pool_init(self, processes: Any = None, *args: Any, **kwargs: Any) -> None:
        if isinstance(processes, int) and processes > MAX_PROCESSES:
            raise ResourceGuard(f"asked for a pool of {processes} processes")
        real_pool_init(self, processes, *args, **kwargs)

    threading.Thread.__init__ = thread_init  # type: ignore[method-assign]
    multiprocessing.pool.Pool.__init__ = pool_init  # type: ignore[method-assign]
    server = None
    try:
        import uvicorn

        server = uvicorn.Server
        real_run = server.run

        def run(self, *args: Any, **kwargs: Any) -> None:
            raise WouldServe("uvicorn.Server.run: the server would now bind and serve")
        server.run = run  # type: ignore[method-assign]
    except ImportError:
        pass
    torch_threads = torch.get_num_threads()
    real_set_threads = torch.set_num_threads

    def set_num_threads(n: int) -> None:  # thousands of OpenMP threads under RLIMIT_AS abort the whole process
        real_set_threads(min(n, MAX_TORCH_THREADS) if isinstance(n, int) and n > 0 else n)
    torch.set_num_threads = set_num_threads
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_AS, limit)
        threading.Thread.__init__ = real_thread_init  # type: ignore[method-assign]
        multiprocessing.pool.Pool.__init__ = real_pool_init  # type: ignore[method-assign]
        if server is not None:
            server.run = real_run  # type: ignore[method-assign]
        torch.set_num_threads = real_set_threads
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)


# ---------------------------------------------------------------------------------------------- snapshots
def snapshot(root: Path, *, hash_files: bool = True) -> dict[str, str]:
    """{relative path: "dir" | sha256 of the bytes | "link -> target"} of everything under ``root``."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = f"link -> {os.readlink(path)}"
            elif path.is_dir():
                out[rel] = "dir"
            elif hash_files:
                try:
                    out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
                except OSError as err:
                    out[rel] = f"unreadable: {err}"
            else:
                out[rel] = "file"
    return out


TEMP_NAME = re.compile(r"(^\..*\.tmp$|\.tmp$|^tmp|\.partial$|\.incomplete$|\.lock$)")


def compare_snapshots(before: dict[str, str], after: dict[str, str]) -> tuple[list[str], list[str]]:
    """(pre-existing paths changed or deleted, new paths that are not clearly temporary files)."""
    changed = [f"{p} ({'deleted' if p not in after else 'modified'})" for p, h in before.items()
               if after.get(p) != h and not (h == "dir" and after.get(p) == "dir")]
    new = [p for p in after if p not in before]
    new_set = set(new)
    leftovers = []
    for p in new:
        parent = p.rsplit("/", 1)[0] if "/" in p else ""
        if parent in new_set or TEMP_NAME.search(p.rsplit("/", 1)[-1]):
            continue
        if after[p] == "dir":
            inside = [q[len(p) + 1:] for q in new if q.startswith(p + "/") and after[q] != "dir"]
            shown = ": " + ", ".join(inside[:4]) + (", ..." if len(inside) > 4 else "") if inside else ""
            p = f"{p}/ ({len(inside)} files{shown})"
        leftovers.append(p)
    return changed, leftovers


# ---------------------------------------------------------------------------------------------- results
ERROR_LINE = re.compile(r"^lmforge(?: [\w-]+)*: error: \S")
TORCH_INTERNALS = re.compile(r"inline_container|PytorchStreamWriter|PytorchStreamReader|Exception raised from|"
                             r"frame #\d|c10::|\.cpp:\d|\.cc:\d|\[enforce fail|CapturedTraceback")
TRACEBACK = "Traceback (most recent call last)"
OK_OUTCOMES = ("clean", "multi-line")


@dataclass
class Result:
    id: str
    command: str
    kind: str
    detail: str
    fast: bool
    may_succeed: bool
    argv: list[str]  # relative to the case folder (the working directory of the run)
    rc: int | None
    outcome: str  # clean | multi-line | accepted | traceback | silent | unclean | timeout | guard | skipped
    problem: str = ""
    exception: str = ""
    where: str = ""  # the innermost lmforge frame of an escaped exception
    stderr: str = ""
    stdout: str = ""
    changed: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def command_line(self) -> str:
        return "lmforge " + shlex.join(self.argv)

    @property
    def ok(self) -> bool:
        """The four properties: clean exit 2 (or a legitimate exit 0), one line, no traceback, files unchanged."""
        good = self.outcome in OK_OUTCOMES or (self.may_succeed and self.outcome == "accepted")
        return good and not self.changed

    def stderr_summary(self, n: int = 2) -> str:
        lines = visible_lines(self.stderr)
        if len(lines) <= 2 * n:
            return "\n".join(lines)
        return "\n".join([*lines[:n], f"... ({len(lines) - 2 * n} more lines)", *lines[-n:]])

    def describe(self) -> str:
        """The failure message of a test: what went wrong, the command line and the stderr."""
        parts = [f"{self.id}: {self.outcome}" + (f" ({self.problem})" if self.problem else "")]
        if self.changed:
            parts.append("FILES CHANGED: " + ", ".join(self.changed))
        parts.append(f"command (in the case folder): {self.command_line}")
        parts.append(f"exit code: {self.rc}")
        if self.exception:
            parts.append(f"exception: {self.exception}" + (f" at {self.where}" if self.where else ""))
        parts.append("stderr:\n" + (self.stderr_summary(6) or "(empty)"))
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        """A record for results files: everything for a case that is not clean or left files, else the outcome."""
        if self.ok and not self.leftovers:
            return {"id": self.id, "outcome": self.outcome, "rc": self.rc, "ok": True,
                    "seconds": round(self.seconds, 3)}
        out = dataclasses.asdict(self)
        del out["argv"]
        out["command_line"] = self.command_line
        out["ok"] = self.ok
        out["seconds"] = round(self.seconds, 3)
        out["stderr"] = self.stderr[-4000:]
        out["stdout"] = self.stdout[-1000:]
        return out


def visible_lines(text: str) -> list[str]:
    """The non-empty lines a terminal would show (progress bars redrawn with \\r count once)."""
    lines = []
    for raw in text.split("\n"):
        segments = [s for s in raw.split("\r") if s.strip()]
        if segments:
            lines.append(segments[-1].rstrip())
    return lines


def classify(rc: int | None, stderr: str, stdout: str, may_succeed: bool,
             escaped: BaseException | None) -> tuple[str, str]:
    """(outcome, problem) of a finished case."""
    if isinstance(escaped, CaseTimeout):
        return "timeout", str(escaped)
    if isinstance(escaped, ResourceGuard):
        return "guard", f"{type(escaped).__name__}: {escaped}"
    if escaped is not None and not isinstance(escaped, WouldServe):
        return "traceback", f"{type(escaped).__name__} escaped main"
    if TRACEBACK in stderr or TRACEBACK in stdout:
        return "traceback", "a traceback was printed"
    if rc == 0:
        note = " (serve would have bound its socket)" if isinstance(escaped, WouldServe) else ""
        return ("accepted", note.strip(" ()")) if may_succeed else ("silent", "exit code 0" + note)
    lines = visible_lines(stderr)
    errors = [i for i, line in enumerate(lines) if "error:" in line]
    if rc != 2:
        return "unclean", f"exit code {rc}"
    if not errors:
        return "unclean", "no 'lmforge: error:' line on stderr"
    if len(errors) > 1:
        return "unclean", f"{len(errors)} lines with 'error:'"
    if errors[0] != len(lines) - 1:
        return "unclean", f"the error message spans {len(lines) - errors[0]} lines"
    line = lines[errors[0]]
    if TORCH_INTERNALS.search(line):
        return "unclean", "the message is torch's internals"
    if not ERROR_LINE.match(line):
        return "unclean", "the error line does not start with 'lmforge: error:'"
    if any(line.startswith("usage:") for line in lines):
        return "multi-line", "argparse's usage + error form"
    return "clean", ""


def _innermost_lmforge_frame(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/lmforge/" in frame.filename.replace(os.sep, "/"):
            rel = frame.filename.replace(os.sep, "/").split("/lmforge/", 1)[1]
            return f"lmforge/{rel}:{frame.lineno} in {frame.name}"
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""


def run_case(case: Case, fx: dict[str, Path], case_dir: Path, *, budget_s: float = 60.0,
             memory_headroom: int = 6 * 2**30) -> Result:
    """Prepare ``case`` in the empty folder ``case_dir``, run it in this process, and judge it."""
    from lmforge.cli import main

    case_dir.mkdir(parents=True, exist_ok=True)
    out_dir = case_dir / "out"
    out_dir.mkdir(exist_ok=True)
    mounted = False
    result = Result(case.id, case.spec.name, case.kind, case.detail, case.fast, case.may_succeed, [], None, "skipped")
    try:
        if case.fault in ("tmpfs-full", "tmpfs-64k"):
            if not tmpfs_available() or not _mount_tmpfs(out_dir):
                result.problem = "mount -t tmpfs is not allowed here"
                return result
            mounted = True
            if case.fault == "tmpfs-full":
                _fill(out_dir / "ballast.bin")
        argv = case.prepare(case_dir, fx)
        prefix = str(case_dir) + os.sep
        result.argv = [a.replace(prefix, "") for a in argv]
        before = snapshot(case_dir)
        fixture_root = Path(os.path.commonpath([str(p) for p in fx.values()]))
        fixtures_before = snapshot(fixture_root)
        stdout, stderr = io.StringIO(), io.StringIO()
        rc: int | None = None
        escaped: BaseException | None = None
        cwd = os.getcwd()
        injector = FaultInjector(out_dir, case.fault) if case.fault in FaultInjector.ERRNO else None
        start = time.perf_counter()
        try:
            os.chdir(case_dir)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
                    _guards(budget_s, memory_headroom), (injector or contextlib.nullcontext()):
                rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                stderr.write(exc.code + "\n")
        except WouldServe as exc:
            rc, escaped = 0, exc
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - everything else is what the fuzzer is looking for
            escaped = exc
            if not isinstance(exc, CaseTimeout | ResourceGuard):  # MemoryError too: the guard only makes it sooner
                result.where = _innermost_lmforge_frame(exc)
            result.exception = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        finally:
            os.chdir(cwd)
        result.seconds = time.perf_counter() - start
        result.rc = rc
        result.stdout, result.stderr = stdout.getvalue(), stderr.getvalue()
        result.outcome, result.problem = classify(rc, result.stderr, result.stdout, case.may_succeed, escaped)
        if injector is not None and injector.hits == 0 and result.outcome in ("accepted", "silent"):
            result.problem = (result.problem + "; " if result.problem else "") + "no write reached the faulty folder"
        result.changed, leftovers = compare_snapshots(before, snapshot(case_dir))
        changed_fixtures, _ = compare_snapshots(fixtures_before, snapshot(fixture_root))
        result.changed += [f"(a shared fixture outside the case folder) {fixture_root / p}" for p in changed_fixtures]
        result.leftovers = [] if rc == 0 else leftovers
        return result
    finally:
        if mounted:
            _umount(out_dir)
