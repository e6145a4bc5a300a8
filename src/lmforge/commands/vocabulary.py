"""One vocabulary of flags across every command, applied to the parser once it is built.

The rules (README, "Command-line conventions"):

* ``--out`` names what a command writes; ``--input`` the text or corpus it reads; ``--train`` / ``--dev`` /
  ``--test`` the labelled splits it reads; ``--resume auto|never|PATH`` continues an interrupted run.
* ``--lr`` is always a learning rate; generation options carry the names transformers gives them
  (``--num-beams``, ``--num-return-sequences``, ``--no-repeat-ngram-size``), as in Python and over HTTP.
* every option has a help text, and the help shows the default (the value the command uses when the option is
  absent, also when that value comes from the recipe's config rather than from argparse).
* ``-q/--quiet`` and ``-v/--verbose`` are accepted anywhere on the line, before or after the command.

Old spellings (``RENAMES``) keep working for one release: they are hidden from ``--help`` and print one
deprecation line naming the new spelling. Commands keep reading the same ``args`` attribute (the rename changes the
option's spelling, not its ``dest``), so no run function changes with a rename.

``check_vocabulary(parser)`` returns the violations of these rules; a test fails on any.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence

from lmforge.commands.options import annotate_ranges

__all__ = ["RENAMES", "SHARED_HELP", "apply_vocabulary", "check_required", "check_vocabulary", "walk"]

# command path -> {old spelling: new spelling}
RENAMES: dict[str, dict[str, str]] = {
    "tokenizer encode": {"--output": "--out"},
    "evaluate": {"--data": "--test", "--output": "--out"},
    "predict": {"--output": "--out"},
    "pretrain": {"--data": "--input"},
    "distill": {"--data": "--input"},
    "train-seq2seq": {"--train-data": "--train", "--dev-data": "--dev", "--test-data": "--test"},
    "word2vec train": {"--alpha": "--lr", "--min-alpha": "--min-lr"},
    "viz attention": {"--precision": "--html-dtype"},
    "generate": {"--beams": "--num-beams", "--top": "--num-return-sequences",
                 "--no-repeat-ngram": "--no-repeat-ngram-size"},
}

# Help for the flags every command shares, used where a command gives none (a command's own text wins).
SHARED_HELP: dict[str, str] = {
    "--out": "where the command writes its output",
    "--overwrite": "replace an existing output (a run folder is renamed aside, never deleted); without it an "
                   "existing output is refused",
    "--resume": "auto: continue from the newest checkpoint in --out (what to run after a crash or kill); never: "
                "start afresh; PATH: continue from that checkpoint folder",
    "--seed": "random seed (the same seed gives the same run)",
    "--lr": "the peak learning rate",
}

# Flags whose meaning must be the same wherever they appear: (flag, the words its help must hold).
_SAME_MEANING = {"--lr": "learning rate"}

# Options whose value the recipe resolves (argparse default None): the default shown in --help.
_RESOLVED_DEFAULTS: dict[str, dict[str, str]] = {
    "pretrain": {"--max-steps": "1000 without --budget", "--budget": "none: --max-steps ends the run",
                 "--lr": "1e-4", "--batch-size": "the preset's", "--seq-len": "128",
                 "--save-every": "the training config's cadence", "--eval-every": "0", "--seed": "0",
                 "--precision": "fp32", "--micro-batch-size": "= --batch-size", "--masking": "the objective's"},
}


def walk(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(command path, parser) for every leaf command under ``parser`` (``"tokenizer train"``, ``"pretrain"``)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for action in subs:
        for name, sub in action.choices.items():
            yield from walk(sub, f"{path} {name}".strip())


class _Deprecated(argparse.Action):
    """An old spelling: warns once, then acts exactly as the option it was renamed to."""

    def __init__(self, option_strings, dest, *, target: argparse.Action, new: str, **_):
        super().__init__(option_strings, dest, nargs=target.nargs, const=target.const, default=argparse.SUPPRESS,
                         type=target.type, choices=target.choices, required=False, help=argparse.SUPPRESS,
                         metavar=target.metavar)
        self.target, self.new = target, new

    def __call__(self, parser, namespace, values, option_string=None):
        # printed, not logged: parsing runs before the logger is set up
        print(f"lmforge: warning: {option_string} is deprecated: use {self.new} (the old spelling stops working "
              "in the next release)", file=sys.stderr)
        self.target(parser, namespace, values, option_string)


def _rename(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """``old`` -> ``new`` (or, when the command already declares ``new``, ``old`` becomes its alias)."""
    action = parser._option_string_actions.get(old)
    if action is None and new in parser._option_string_actions:
        action = parser._option_string_actions[new]
    elif action is None:
        raise ValueError(f"{parser.prog}: no option {old} to rename")
    elif new in parser._option_string_actions:
        raise ValueError(f"{parser.prog}: cannot rename {old} to {new}: both exist")
    else:
        action.option_strings = [new if s == old else s for s in action.option_strings]
        del parser._option_string_actions[old]
        parser._option_string_actions[new] = action
    if action.required:  # the old spelling must satisfy it too: checked after parsing (check_required)
        action.required = False
        parser._lmforge_required = [*getattr(parser, "_lmforge_required", []), action]
    parser.add_argument(old, action=_Deprecated, dest=action.dest, target=action, new=new)


def _describe_default(action: argparse.Action) -> str | None:
    value = action.default
    if value in (None, False, argparse.SUPPRESS) or value == [] or isinstance(
            action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)):
        return None  # a flag: its help says what giving it does
    return str(value)


def apply_vocabulary(parser: argparse.ArgumentParser) -> None:
    """Renames (keeping the old spellings as deprecated aliases), shared help texts, numeric ranges
    (``options.annotate_ranges``) and defaults in every help, and ``-q``/``-v`` on every command."""
    for path, sub in walk(parser):
        for old, new in RENAMES.get(path, {}).items():
            _rename(sub, old, new)
        resolved = _RESOLVED_DEFAULTS.get(path, {})
        documented = [a for a in sub._actions if a.option_strings and a.help != argparse.SUPPRESS
                      and not isinstance(a, (_Deprecated, argparse._HelpAction))]
        for action in documented:
            if not action.help:
                action.help = SHARED_HELP.get(action.option_strings[-1], action.help)
        sub._lmforge_undocumented = [a.option_strings[-1] for a in documented if not a.help]
        annotate_ranges(sub)
        for action in documented:
            flag = action.option_strings[-1]
            if action.help and "default" not in action.help.lower():
                shown = resolved.get(flag) or _describe_default(action)
                if shown is not None:
                    action.help = f"{action.help} (default: {shown})"
        if "-q" not in sub._option_string_actions:
            sub.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                             help="only print warnings and errors (also before the command)")
        if "-v" not in sub._option_string_actions:
            sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="also print debug messages (also before the command)")


def check_required(args: argparse.Namespace, argv: Sequence[str] = ()) -> None:
    """After parsing: a renamed required option given by neither spelling stops the command (argparse's own
    check cannot see the old spelling, so the rename moved it here), and so does one given by both spellings
    (``evaluate --data a.csv --test b.csv``: argparse would keep the last one without a word)."""
    parser = getattr(args, "command_parser", None)

    def given(option: str) -> bool:
        return any(arg == option or arg.startswith(option + "=") for arg in argv)

    for action in getattr(parser, "_actions", []):
        if isinstance(action, _Deprecated) and given(action.option_strings[0]) and given(action.new):
            parser.error(f"{action.option_strings[0]} is the old spelling of {action.new}, and both are given; "
                         f"give {action.new} only")
    missing = [a.option_strings[0] for a in getattr(parser, "_lmforge_required", [])
               if getattr(args, a.dest, None) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")


def check_vocabulary(parser: argparse.ArgumentParser) -> list[str]:
    """Every violation of the rules in the module docstring, one line each (empty: none)."""
    problems: list[str] = []
    for path, sub in walk(parser):
        for action in sub._actions:
            if not action.option_strings or isinstance(action, (argparse._HelpAction, _Deprecated)):
                continue
            flag = action.option_strings[-1]
            if flag in getattr(sub, "_lmforge_undocumented", []):
                problems.append(f"{path}: {flag} has no help text")
            for shared, words in _SAME_MEANING.items():
                if shared in action.option_strings and words not in (action.help or "").lower():
                    problems.append(f"{path}: {shared} must be a {words} (help: {action.help!r})")
            if flag in ("--output", "--data", "--train-data", "--dev-data",
                                                      "--test-data", "--beams", "--top", "--no-repeat-ngram"):
                problems.append(f"{path}: {flag} is not in the vocabulary (--out, --input, --train/--dev/--test)")
        resume = sub._option_string_actions.get("--resume")
        if resume is not None and (resume.nargs == 0 or "auto" not in (resume.help or "")):
            problems.append(f"{path}: --resume must take auto|never|PATH")
    return problems
