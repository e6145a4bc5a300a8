"""``lmforge fewshot``: zero- and few-shot prompting of a causal language model (GPT-2 / GPT-3 in-context
learning; see ``lmforge.prompting``).

The model reads K solved training examples, then the test input, and the label whose verbalisation it finds most
likely is the prediction (``--mode classify``), or it writes the answer itself (``--mode generate``). Accuracy is
printed per K as mean ± std over ``--draws`` draws of the demonstrations.

Escapes: the template, ``--separator`` and ``--stop`` accept ``\\n`` (newline), ``\\t`` (tab) and ``\\\\`` (a
backslash) written literally on the command line, so ``--template 'Review: {text}\\nSentiment: {label}'`` puts a
line break between the two lines.

Output: the table on stdout; with ``--out DIR``, ``DIR/fewshot.json`` (the settings, the rows, and the per-example
predictions of the first draw at each K) and ``DIR/fewshot.png`` (accuracy against K).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from lmforge.choices import RUNTIMES
from lmforge.commands.options import SEED, Count
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.compiling import RUNTIME_HELP

log = logging.getLogger("lmforge")

SCORINGS = ("sum", "mean", "unconditional")  # lmforge.prompting.SCORINGS (a test holds them equal)
DEMOS = ("fixed", "per-example")
MODES = ("classify", "generate")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """``\\n``, ``\\t`` and ``\\\\`` written literally become a newline, a tab and a backslash; any other backslash
    stays as it is."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


def shots_list(text: str) -> tuple[int, ...]:
    """``0,1,4,16`` -> (0, 1, 4, 16)."""
    try:
        shots = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated integers >= 0, e.g. 0,1,4,16") from None
    if any(k < 0 for k in shots):
        raise argparse.ArgumentTypeError(f"{text!r}: the number of demonstrations cannot be negative")
    if len(set(shots)) != len(shots):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a value; list each K once")
    return shots


def parse_verbalizer(text: str) -> dict[str, str]:
    """``label=word,label2=two words`` -> {"label": "word", "label2": "two words"} (escapes as the template).

    Raises:
        LmforgeError: an item without ``=``, an empty label or word, a label given twice.
    """
    out: dict[str, str] = {}
    for item in text.split(","):
        label, eq, words = item.partition("=")
        label, words = label.strip(), unescape(words).strip()
        if not eq or not label or not words:
            raise LmforgeError(f"--verbalizer: malformed item {item!r}; write label=word items separated by commas, "
                               "e.g. --verbalizer pos=great,neg=terrible")
        if label in out:
            raise LmforgeError(f"--verbalizer: label {label!r} is given twice; give each label one verbalisation")
        out[label] = words
    return out


def add_fewshot_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Example: lmforge fewshot --model runs/gpt --train train.csv --test dev.csv --shots 0,1,4,16 "
                "--template 'Review: {text}\\nSentiment: {label}' --verbalizer pos=positive,neg=negative "
                "--calibrate --out runs/fewshot.  \\n in --template, --separator and --stop is a newline.")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="a causal language model folder: lmforge GPT (pretrain --objective clm), AWD-LSTM or biLM "
                        "forward LM, or a Hugging Face GPT-2 folder with its tokenizer")
    p.add_argument("--train", metavar="FILE",
                   help="labelled examples the demonstrations are drawn from (CSV, TSV or JSON lines); needed "
                        "when a K > 0")
    p.add_argument("--test", required=True, metavar="FILE", help="labelled examples to predict (CSV, TSV, JSONL)")
    p.add_argument("--shots", type=shots_list, default=(0, 1, 4, 16), metavar="K,K,...",
                   help="numbers of demonstrations to evaluate (default 0,1,4,16)")
    p.add_argument("--draws", type=Count(1, 1000), default=3, metavar="N",
                   help="demonstration draws per K, seeds SEED, SEED+1, ... (K=0 has one; default 3)")
    p.add_argument("--template", default="{text} {label}", metavar="TEXT",
                   help="the prompt of one example: {text} (required), {text_pair}, {label} (required: where the "
                        "answer goes, normally last); default '{text} {label}'")
    p.add_argument("--verbalizer", type=str, metavar="LABEL=WORD,...",
                   help="the words standing for each label in prompts (default: the label names)")
    p.add_argument("--scoring", choices=SCORINGS, default="sum",
                   help="sum of the answer's token log-probs, their mean, or unconditional (minus the answer's "
                        "log-prob after the template's text before {label} alone, GPT-3); default sum")
    p.add_argument("--calibrate", action="store_true",
                   help="contextual calibration (Zhao et al. 2021): divide by the label probabilities of the "
                        "content-free inputs 'N/A', '' and the mask token")
    p.add_argument("--demos", choices=DEMOS, default="fixed",
                   help="fixed: the same K demonstrations for every test example of a draw; per-example: a fresh "
                        "draw per test example (default fixed)")
    p.add_argument("--mode", choices=MODES, default="classify",
                   help="classify: the most likely label; generate: greedy generation, exact match (default "
                        "classify)")
    p.add_argument("--stop", action="append", default=None, metavar="STR",
                   help="generate mode: a string that ends the answer (repeatable; default a newline)")
    p.add_argument("--max-new-tokens", type=Count(1, 100_000), default=10, metavar="N",
                   help="generate mode: tokens generated at most (default 10)")
    p.add_argument("--separator", default="\\n\\n", metavar="STR",
                   help="text between demonstrations (default a blank line, \\n\\n)")
    p.add_argument("--seed", type=SEED, default=0, metavar="S", help="seed of the first draw (default 0)")
    p.add_argument("--text-column", default="text", metavar="NAME", help="the text column (default text)")
    p.add_argument("--text-pair-column", default="text_pair", metavar="NAME",
                   help="the second text's column, for {text_pair} (default text_pair)")
    p.add_argument("--label-column", default="label", metavar="NAME", help="the label column (default label)")
    p.add_argument("--max-test", type=Count(1, 2**31 - 1), metavar="N", help="use only the first N test examples")
    p.add_argument("--batch-size", type=Count(1, 65_536), default=16, metavar="N",
                   help="sequences per forward pass (default 16)")
    p.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    p.add_argument("--out", metavar="DIR", help="write fewshot.json and fewshot.png into this new folder")
    p.add_argument("--overwrite", action="store_true",
                   help="with --out: move an existing folder aside (<name>.old-<time>) and write afresh")


def run_fewshot(args: argparse.Namespace) -> int:
    from lmforge.prompting import FewShotConfig, PromptTemplate, fewshot_evaluate
    from lmforge.utils.io import atomic_write_text, check_output_dir, prepare_output_dir, staged_output_dir

    config = FewShotConfig(
        template=unescape(args.template), verbalizer=parse_verbalizer(args.verbalizer) if args.verbalizer else None,
        shots=tuple(args.shots), draws=args.draws, seed=args.seed, demos=args.demos, scoring=args.scoring,
        calibrate=args.calibrate, separator=unescape(args.separator), mode=args.mode,
        max_new_tokens=args.max_new_tokens,
        stop=tuple(unescape(s) for s in args.stop) if args.stop else ("\n",), batch_size=args.batch_size)
    inputs = [args.model, args.train, args.test]
    if args.out:
        check_output_dir(args.out, overwrite=args.overwrite, inputs=inputs)  # before any work
    if max(config.shots) > 0 and not args.train:
        raise LmforgeError(f"--shots {','.join(map(str, config.shots))} needs --train FILE (the pool the "
                           "demonstrations are drawn from); or evaluate zero-shot only with --shots 0")
    model, tokenizer = _load(args.model, scoring=config.mode == "classify", runtime=args.runtime)
    columns = {"text_column": args.text_column, "text_pair_column": args.text_pair_column,
               "label_column": args.label_column, "pair": PromptTemplate.parse(config.template).uses_pair}
    train = _read(args.train, columns) if args.train else []
    test = _read(args.test, columns)
    if args.max_test is not None:
        test = test[:args.max_test]
    report = fewshot_evaluate(model, tokenizer, train, test, config, progress=not args.quiet, name=args.model)
    print(report.table())
    if args.out:
        out = prepare_output_dir(args.out, overwrite=args.overwrite, inputs=inputs, create=False)
        with staged_output_dir(out) as tmp:
            saved = report.to_dict()
            saved.update(model=str(args.model), train=args.train, test=str(args.test))
            atomic_write_text(tmp / "fewshot.json", json.dumps(saved, indent=2, ensure_ascii=False) + "\n")
            report.plot(tmp / "fewshot.png", title=f"{Path(args.model).name}: {Path(args.test).name}")
        print(f"wrote {out / 'fewshot.json'} and {out / 'fewshot.png'}", file=sys.stderr)
    return 0


def _load(directory: str, *, scoring: bool, runtime: str = "torch") -> tuple[Any, Any]:
    """The model and tokenizer of a folder; refuses a model that is not a causal LM before any data is read."""
    from lmforge.persistence import load_pretrained
    from lmforge.prompting import causal_lm_for

    loaded = load_pretrained(directory, with_head=False, runtime=runtime)
    causal_lm_for(loaded.model, directory, scoring=scoring)
    if loaded.tokenizer is None:
        raise InputFileError(f"{directory}: no tokenizer in the folder (vocab.txt, or a GPT-2 byte-level BPE's "
                             "vocab.json + merges.txt), so text cannot be turned into ids; save the model with its "
                             "tokenizer")
    log.info("loaded %s (%s, vocabulary %d)", directory, loaded.config.arch, loaded.config.vocab_size)
    return loaded.model, loaded.tokenizer


def _read(path: str, columns: dict[str, Any]) -> list[Any]:
    from lmforge.data.readers import read_classification

    data = read_classification(path, require_labels=True, **columns)
    if data.kind == "regression":
        raise InputFileError(f"{path}: the labels are numbers (a regression file); fewshot classifies into named "
                             "labels")
    return data.examples
