"""Numeric command-line options with a declared range, checked when the command line is parsed.

Every ``int`` or ``float`` option of every command is declared with one of these types, e.g.
``p.add_argument("--batch-size", type=Count(1))``; ``cli.build_parser`` appends the range to the option's help
(``[integer >= 1]``), and a value outside it stops the command at once with one line naming the option, the
value and the range. NaN and infinities are never accepted. A test walks the parser and fails on any numeric
option declared without a range.
"""

from __future__ import annotations

import argparse
import math


class Number:
    """An argparse ``type`` that parses a number and checks ``low <= value <= high`` (bounds may be open).

    Args:
        kind: ``int`` or ``float``.
        low / high: the bounds (``None``: unbounded on that side).
        low_open / high_open: exclude the bound itself (``> low`` rather than ``>= low``).
    """

    def __init__(self, kind: type, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False) -> None:
        self.kind, self.low, self.high, self.low_open, self.high_open = kind, low, high, low_open, high_open
        self.__name__ = "integer" if kind is int else "number"  # argparse names the type in its own messages

    def _show(self, value: float) -> str:
        return f"{int(value):,}" if self.kind is int else f"{value:g}"

    def describe(self) -> str:
        """``integer >= 1``, ``number in (0, 1]``, ``integer in [1, 65,536]``."""
        noun = "integer" if self.kind is int else "number"
        if self.low is not None and self.high is not None:
            return (f"{noun} in {'(' if self.low_open else '['}{self._show(self.low)}, {self._show(self.high)}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{noun} {'>' if self.low_open else '>='} {self._show(self.low)}"
        if self.high is not None:
            return f"{noun} {'<' if self.high_open else '<='} {self._show(self.high)}"
        return noun

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if self.kind is int else 'a number'} "
                                             f"({self.describe()})") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number ({self.describe()})")
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high:
            article = "an" if self.kind is int else "a"
            raise argparse.ArgumentTypeError(f"{text} is out of range: expected {article} {self.describe()}")
        return value


def Count(low: int = 1, high: int | None = None) -> Number:  # noqa: N802 (reads as a type in add_argument)
    """Integers ``low <= n <= high`` (default: positive)."""
    return Number(int, low, high)


def Rate(low: float = 0.0, high: float | None = None, *, low_open: bool = False,  # noqa: N802
         high_open: bool = False) -> Number:
    """Finite floats in a range (default: ``>= 0``)."""
    return Number(float, low, high, low_open=low_open, high_open=high_open)


SEED = Number(int, 0, 2**32 - 1)
POSITIVE = Number(float, 0.0, low_open=True)
PROBABILITY = Number(float, 0.0, 1.0)
FRACTION = Number(float, 0.0, 1.0, high_open=True)
LEARNING_RATE = Number(float, 0.0, 10.0, low_open=True)
PORT = Number(int, 0, 65535)


def annotate_ranges(parser: argparse.ArgumentParser) -> None:
    """Append ``[range]`` to the help of every option of ``parser`` whose type is a ``Number``."""
    for action in parser._actions:
        if isinstance(action.type, Number) and action.help is not argparse.SUPPRESS:
            note = f"[{action.type.describe()}]"
            if note not in (action.help or ""):
                action.help = f"{action.help} {note}" if action.help else note


def unranged_numeric_options(parser: argparse.ArgumentParser, prefix: str = "lmforge") -> list[str]:
    """``"command --option"`` for every int/float option declared without a range (the test keeps this empty)."""
    found = []
    for action in parser._actions:
        if action.type in (int, float):
            found.append(f"{prefix} {'/'.join(action.option_strings) or action.dest}")
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += unranged_numeric_options(sub, f"{prefix} {name}")
    return found


BUDGET_HELP = ("train for a time (30s, 10m, 1.5h of training) or a number of tokens (200ktok, 5Mtok, all processes "
               "together) instead of a number of steps: the warm-up (--train.warmup_ratio) and the lr decay follow the "
               "elapsed fraction of the budget, the run stops at it with a final checkpoint and model, and resumes "
               "where it stopped; --max-steps then is an optional cap")


def budget(text: str) -> str:
    """An argparse ``type`` for ``--budget``: a training time or a number of tokens (``TrainConfig.budget``)."""
    from lmforge.config import parse_budget
    from lmforge.errors import LmforgeError

    try:
        parse_budget(text)
    except LmforgeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text.strip()
