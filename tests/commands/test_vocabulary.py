"""One flag vocabulary (issue 23, item 1): every option documented with its default, one spelling for the shared
flags, old spellings accepted with a deprecation warning, -q/-v anywhere on the line."""

from __future__ import annotations

import argparse
import re

import pytest

from lmforge.cli import build_parser, main
from lmforge.commands.vocabulary import RENAMES, check_vocabulary, walk


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_every_option_has_help_and_the_shared_flags_one_spelling(parser):
    assert check_vocabulary(parser) == []


def test_the_checker_sees_a_missing_help_and_an_old_spelling():
    p = build_parser()
    sub = dict(walk(p))["embed"]
    sub._lmforge_undocumented = ["--batch-size"]
    sub.add_argument("--output", help="x")
    problems = check_vocabulary(p)
    assert "embed: --batch-size has no help text" in problems
    assert any(line.startswith("embed: --output is not in the vocabulary") for line in problems)


def test_no_command_offers_an_old_spelling_in_its_help(parser):
    for path, sub in walk(parser):
        shown = sub.format_help()
        for old, new in RENAMES.get(path, {}).items():
            assert re.search(rf"(?<![\w.-]){new}(?![\w.-])", shown), (path, new)
            assert not re.search(rf"(?<![\w.-]){old}(?![\w.-])", shown), (path, old)


def test_defaults_are_shown_also_when_the_recipe_resolves_them(parser):
    helps = {a.option_strings[-1]: a.help for a in dict(walk(parser))["pretrain"]._actions if a.option_strings}
    assert "default: 1000" in helps["--max-steps"]
    assert "default: 1e-4" in helps["--lr"]
    generate = {a.option_strings[-1]: a.help for a in dict(walk(parser))["generate"]._actions if a.option_strings}
    assert "default 30" in generate["--max-new-tokens"]


@pytest.mark.parametrize("path, old, new, value", [
    ("evaluate", "--data", "--test", "t.jsonl"),
    ("evaluate", "--output", "--out", "m.json"),
    ("pretrain", "--data", "--input", "shards"),
    ("train-seq2seq", "--train-data", "--train", "pairs.tsv"),
    ("generate", "--beams", "--num-beams", "3"),
    ("word2vec train", "--alpha", "--lr", "0.01"),
])
def test_old_spellings_still_work_with_a_warning(parser, capsys, path, old, new, value):
    base = {"evaluate": ["--model", "m"], "pretrain": [], "train-seq2seq": [], "generate": ["--model", "m", "--prompt",
            "hi"], "word2vec train": ["--input", "c.txt", "--out", "v.txt"]}[path]
    argv = [*path.split(), *base]
    new_args = parser.parse_args([*argv, new, value])
    capsys.readouterr()
    old_args = parser.parse_args([*argv, old, value])
    warning = capsys.readouterr().err
    action = build_parser()._subparsers  # noqa: F841  (a fresh parser must be buildable twice)
    dest = next(a.dest for a in dict(walk(parser))[path]._actions if new in a.option_strings)
    assert getattr(old_args, dest) == getattr(new_args, dest)
    assert f"{old} is deprecated: use {new}" in warning


def test_a_renamed_required_option_is_still_required(capsys):
    assert main(["evaluate", "--model", "m"]) == 2
    assert "required: --test" in capsys.readouterr().err


def test_quiet_and_verbose_after_the_command(parser):
    args = parser.parse_args(["viz", "positions", "--out", "p.png", "-q"])
    assert args.quiet is True and args.verbose is False
    args = parser.parse_args(["-q", "viz", "positions", "--out", "p.png"])
    assert args.quiet is True
    args = parser.parse_args(["viz", "positions", "--out", "p.png", "-v"])
    assert args.verbose is True and args.quiet is False


def test_compare_resume_takes_auto_or_never(parser):
    assert parser.parse_args(["compare", "--config", "c.toml", "--resume"]).resume == "auto"
    assert parser.parse_args(["compare", "--config", "c.toml", "--resume", "never"]).resume == "never"
    assert parser.parse_args(["compare", "--config", "c.toml"]).resume == "never"


def test_the_command_line_help_does_not_import_torch():
    """`lmforge --help` and a command's --help answer without importing torch (seconds on a cold start)."""
    import subprocess
    import sys

    code = ("import sys\nfrom lmforge.cli import main\n"
            "for argv in (['--help'], ['pretrain', '--help'], ['vectors', 'word2vec', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]


def test_options_are_never_abbreviated_and_typos_get_a_suggestion(capsys):
    assert main(["finetune", "--epoch", "3"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --epoch 3" in err and "did you mean --epochs?" in err
    assert main(["pretrain", "--budgett", "3m"]) == 2
    assert "--budgett: did you mean --budget?" in capsys.readouterr().err
    assert main(["finetun"]) == 2
    assert "invalid choice: 'finetun'" in (err := capsys.readouterr().err) and "did you mean finetune?" in err
    assert main(["finetune", "--zzzz", "1"]) == 2
    assert "did you mean" not in capsys.readouterr().err  # nothing close: no suggestion


def test_a_flag_shows_no_default_in_its_help(parser):
    for path, sub in walk(parser):
        for action in sub._actions:
            if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                assert "(default: True)" not in (action.help or ""), f"{path} {action.option_strings}"
                assert "(default: False)" not in (action.help or ""), f"{path} {action.option_strings}"


def test_an_option_given_in_both_spellings_is_refused(capsys):
    assert main(["evaluate", "--model", "m", "--data", "a.csv", "--test", "b.csv"]) == 2
    assert "--data is the old spelling of --test, and both are given; give --test only" in capsys.readouterr().err
    assert main(["evaluate", "--model", "m", "--test", "b.csv", "--data=a.csv"]) == 2
    assert "give --test only" in capsys.readouterr().err
