"""The ``lmforge`` command line: one table from command name to (help, arguments, run function)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from lmforge import __version__
from lmforge.commands import compare as compare_cmd
from lmforge.commands import data as data_cmd
from lmforge.commands import demo as demo_cmd
from lmforge.commands import distill as distill_cmd
from lmforge.commands import fewshot as fewshot_cmd
from lmforge.commands import finetune as finetune_cmd
from lmforge.commands import generate as generate_cmd
from lmforge.commands import models as model_cmd
from lmforge.commands import pretrain as pretrain_cmd
from lmforge.commands import seq2seq as seq2seq_cmd
from lmforge.commands import serve as serve_cmd
from lmforge.commands import tokenizer as tok_cmd
from lmforge.commands import vectors as vectors_cmd
from lmforge.commands import viz as viz_cmd
from lmforge.commands.vocabulary import apply_vocabulary, check_required
from lmforge.errors import LmforgeError
from lmforge.utils.io import describe_os_error
from lmforge.utils.log import setup_logging  # noqa: F401  (re-exported: lmforge.cli.setup_logging)

Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]

# Command path -> (help, add_arguments, run). Nested commands use a space: "tokenizer train".
COMMANDS: dict[str, Command] = {
    "tokenizer train": ("learn a WordPiece vocabulary from text files", tok_cmd.add_train_arguments,
                        tok_cmd.run_train),
    "tokenizer encode": ("encode text lines into ids, segment ids and offsets (JSONL)",
                         tok_cmd.add_encode_arguments, tok_cmd.run_encode),
    "embed": ("contextual embeddings of text lines from a model (.npy / .npz)", model_cmd.add_embed_arguments,
              model_cmd.run_embed),
    "data prepare": ("tokenize a corpus into memory-mapped shards for pretraining", data_cmd.add_prepare_arguments,
                     data_cmd.run_prepare),
    "pretrain": ("pretrain BERT (mlm+nsp), ALBERT (mlm+sop), RoBERTa (mlm), SpanBERT (span) or GPT (clm)",
                 pretrain_cmd.add_pretrain_arguments, pretrain_cmd.run_pretrain),
    "distill": ("distil a teacher encoder into a smaller student (DistilBERT's triple loss; MiniLM's attention "
                "relations when the teacher has no MLM head)", distill_cmd.add_distill_arguments,
                distill_cmd.run_distill),
    "finetune": ("fine-tune an encoder with a task head (sequence, pair, token, span, qa)",
                 finetune_cmd.add_finetune_arguments, finetune_cmd.run_finetune),
    "evaluate": ("score a fine-tuned model on labelled data; prints the metrics as JSON",
                 finetune_cmd.add_evaluate_arguments, finetune_cmd.run_evaluate),
    "predict": ("predictions of a fine-tuned model for a file of inputs (JSONL)", finetune_cmd.add_predict_arguments,
                finetune_cmd.run_predict),
    "generate": ("generate text: continue prompts (GPT, AWD-LSTM, biLM) or write targets (encoder-decoder); "
                 "greedy, beam, sampling",
                 generate_cmd.add_generate_arguments, generate_cmd.run_generate),
    "fewshot": ("zero- and few-shot prompting of a causal LM (GPT-2/GPT-3 in-context learning): accuracy per "
                "number of demonstrations, optional calibration; table, JSON and plot",
                fewshot_cmd.add_fewshot_arguments, fewshot_cmd.run_fewshot),
    "train-seq2seq": ("train a Transformer or attentional-RNN encoder-decoder on text pairs (BBC headlines built in)",
                      seq2seq_cmd.add_seq2seq_arguments, seq2seq_cmd.run_train_seq2seq),
    "compare": ("compare from-scratch, static-embedding and pretrained classifiers on one split (table + plot)",
                compare_cmd.add_compare_arguments, compare_cmd.run_compare_command),
    "demo": ("the whole story on the embedded BBC News corpus: tokenizers, pretraining, static vectors and the "
             "comparison (make demo; replaces its --out)", demo_cmd.add_demo_arguments, demo_cmd.run_demo),
    "word2vec train": ("train Word2Vec (skip-gram or CBOW, negative sampling) on text files; word2vec-format output",
                       vectors_cmd.add_word2vec_arguments, vectors_cmd.run_word2vec_train),
    "glove train": ("train GloVe on text files; word2vec-format output", vectors_cmd.add_glove_arguments,
                    vectors_cmd.run_glove_train),
    "vectors evaluate": ("score word vectors: Spearman on word pairs or 3CosAdd analogy accuracy",
                         vectors_cmd.add_evaluate_arguments, vectors_cmd.run_evaluate),
    "viz attention": ("attention weights of a model for a text: PNG heat maps (layers x heads) or a self-contained "
                      "HTML viewer", viz_cmd.add_attention_arguments, viz_cmd.run_attention),
    "viz positions": ("picture of the sinusoidal positional encodings (PNG)", viz_cmd.add_positions_arguments,
                      viz_cmd.run_positions),
    "viz training": ("curves of a run's metrics.jsonl: loss, learning rate, eval metrics (PNG)",
                     viz_cmd.add_training_arguments, viz_cmd.run_training),
    "serve": ("serve a model folder over HTTP: JSON endpoints with micro-batching (FastAPI + uvicorn)",
              serve_cmd.add_serve_arguments, serve_cmd.run_serve),
    "convert": ("import a Hugging Face BERT/GPT-2 folder, or export ours to that layout",
                model_cmd.add_convert_arguments, model_cmd.run_convert),
}

GROUP_HELP = {"tokenizer": "train and use WordPiece tokenizers", "data": "prepare corpora for pretraining",
              "viz": "look inside: attention weights, positional encodings, training curves",
              "word2vec": "static word vectors: skip-gram and CBOW", "glove": "static word vectors from co-occurrences",
              "vectors": "evaluate word vectors (word2vec format)"}


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors: ``lmforge: error: <command>: <what>; see <command> --help``.

    Options are never abbreviated (``--epoch`` is not taken for ``--epochs``: a prefix that works today would
    change meaning when a longer option is added); an unknown option or command gets the closest known ones as
    suggestions instead.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:  # a mistyped command
            choices = re.findall(r"'?([\w-]+)'?", match.group(2))
            message = f"{message}{_suggestion(match.group(1), choices)}"
        self.exit(2, f"lmforge: error: {self.prog}: {message}; see `{self.prog} --help`\n")

    def option_names(self) -> list[str]:
        return [name for action in self._actions for name in action.option_strings if name.startswith("--")]


def _close(word: str, known: Sequence[str]) -> str:
    """``"--epochs"`` (or ``"a or b"``) for the known names closest to ``word``; ``""`` when none is close."""
    return " or ".join(difflib.get_close_matches(word, known, n=2, cutoff=0.75))


def _suggestion(word: str, known: Sequence[str]) -> str:
    """``" (did you mean --epochs?)"`` for the closest of ``known`` to ``word``, or ``""`` when none is close."""
    close = _close(word, known)
    return f" (did you mean {close}?)" if close else ""


def _unknown_message(parser: argparse.ArgumentParser, bad: list[str]) -> str:
    """``unrecognized arguments: --epoch 3 (did you mean --epochs?)``: each unknown option with its suggestion."""
    known = parser.option_names() if isinstance(parser, Parser) else []
    hints = []
    for arg in bad:
        name = arg.split("=", 1)[0]
        close = _close(name, known) if name.startswith("--") else ""
        if close:
            hints.append(f"{name}: did you mean {close}?")
    return f"unrecognized arguments: {' '.join(bad)}" + (f" ({'; '.join(hints)})" if hints else "")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lmforge", description="From attention to transfer learning.")
    parser.add_argument("--version", action="version", version=f"lmforge {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only print warnings and errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print debug messages")
    parser.add_argument("--strict-utf8", action="store_true",
                        help="refuse input text that is not valid UTF-8 (default: replace the bad bytes by U+FFFD "
                             "and warn with their count)")
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    top.required = True
    groups: dict[str, argparse._SubParsersAction] = {}
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        parts = name.split()
        if len(parts) == 1:
            sub = top.add_parser(parts[0], help=help_text, description=help_text)
        else:
            group, leaf = parts
            if group not in groups:
                gp = top.add_parser(group, help=GROUP_HELP.get(group), description=GROUP_HELP.get(group))
                groups[group] = gp.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
                groups[group].required = True
            sub = groups[group].add_parser(leaf, help=help_text, description=help_text)
        add_arguments(sub)
        sub.set_defaults(run=run, command_parser=sub)
    apply_vocabulary(parser)
    return parser


# Options whose values may start with "-" (layer indices such as -4,-3,-2,-1), which argparse would take for flags.
NEGATIVE_VALUE_OPTIONS = ("--layers", "--heads")


def _join_negative_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in NEGATIVE_VALUE_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:  # parse errors (and --help) end here with their exit code, also when main() is called in-process
        words = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
        args, unknown = parser.parse_known_args(words)
        if unknown:
            dotted = [u for u in unknown if u.startswith("--") and "=" in u and "." in u.split("=", 1)[0]]
            if hasattr(args, "overrides") and len(dotted) == len(unknown):
                args.overrides = [*args.overrides, *dotted]
            else:
                bad = [u for u in unknown if u not in dotted] if hasattr(args, "overrides") else unknown
                command_parser = getattr(args, "command_parser", parser)
                command_parser.error(_unknown_message(command_parser, bad))
        check_required(args, words)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    setup_logging(args.quiet, verbose=args.verbose)
    from lmforge.data.text import strict_utf8
    from lmforge.utils.model_card import recording_command

    try:
        with strict_utf8(args.strict_utf8), recording_command(sys.argv[1:] if argv is None else argv):
            return args.run(args)  # recording_command: the run's README.md model card quotes the command line
    except LmforgeError as err:
        print(f"lmforge: error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except OSError as err:  # a read-only, full or missing folder met anywhere: one line, never a traceback
        if not err.filename:  # a failed write() names no file: name the command's output instead
            out = getattr(args, "out", None) or getattr(args, "output", None)
            err.filename = f"writing {out}" if out else None
        print(f"lmforge: error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # a training run saves a checkpoint first and says so (TrainingInterrupted)
        print(f"lmforge: {err}" if str(err) else "lmforge: interrupted", file=sys.stderr)
        return getattr(err, "exit_code", 130)  # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM


def _one_line(message: str) -> str:
    """Errors that wrap a library's multi-line message keep its first line (the rest is its internals)."""
    return message.strip().partition("\n")[0]


if __name__ == "__main__":
    sys.exit(main())
