"""Prompts for in-context learning: templates, verbalizers, demonstrations, and the ids a causal LM reads.

A template is text with placeholders: ``{text}`` (required), ``{text_pair}`` (optional) and ``{label}`` (required,
once, normally last), e.g. ``"Review: {text}\\nSentiment: {label}"``. Literal braces are written ``{{`` and ``}}``.
It splits at ``{label}`` into three parts:

    query    the template up to ``{label}``, filled with an example's texts, trailing spaces removed
    answer   the spaces removed from the query, then the verbalised label (" positive")
    suffix   the template after ``{label}``, filled (often empty)

A demonstration is query + answer + suffix of a training example; a prompt is the demonstrations joined by the
separator, then the query of the test example (Brown et al. 2020, "Language Models are Few-Shot Learners",
section 2 and appendix G). Candidate answers are scored as the continuation of the prompt.

Why the spaces move to the answer: a byte-level BPE (GPT-2) attaches the space before a word to that word
(" positive" is one token, "positive" another); a prompt ending in a space would make the model predict a bare
space token first. Scoring " positive" after "Sentiment:" is what a filled demonstration contains, so the answer
is scored exactly as it appears in the demonstrations. WordPiece ignores whitespace either way.

Ids are built part by part: ``start + ids(demo_1) + ids(separator) + ... + ids(query)`` with
``ids(demo) = ids(query) + ids(answer) + ids(suffix)``, so each demonstration holds exactly the candidate's ids and a
demonstration can be dropped without re-encoding the rest. ``start`` is the token a document starts with (see
``document_start_ids``). A WordPiece tokenizer drops whitespace and newlines, so separators made of whitespace
vanish for lmforge's own GPTs: prefer templates with visible cues ("Review:", "Sentiment:").
"""

from __future__ import annotations

import logging
import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

__all__ = ["PLACEHOLDERS", "Example", "Prompt", "PromptBuilder", "PromptTemplate", "as_examples",
           "document_end_id", "document_start_ids", "draw_demonstrations", "resolve_verbalizer"]

PLACEHOLDERS = ("text", "text_pair", "label")


# ------------------------------------------------------------------------------------------------ tokenizer
def document_start_ids(tokenizer: Any) -> list[int]:
    """The ids a document starts with, as the model's training stream shows them.

    lmforge's causal-LM stream puts ``[SEP]`` before each document (``lmforge.data.instances``), so a WordPiece
    tokenizer's ``sep_id`` starts a prompt; a byte-level BPE (GPT-2) starts one with ``bos_id``
    (``<|endoftext|>``). Duck-typed: ``sep_id`` first, then ``bos_id``.

    Raises:
        LmforgeError: the tokenizer has neither.
    """
    for name in ("sep_id", "bos_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return [value]
    raise LmforgeError(f"{type(tokenizer).__name__} has neither sep_id nor bos_id: fewshot needs the token a "
                       "document starts with (WordPiece [SEP], GPT-2 <|endoftext|>)")


def document_end_id(tokenizer: Any) -> int | None:
    """The id that ends a document (where generation stops): ``eos_id``, else ``sep_id``."""
    for name in ("eos_id", "sep_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return None


# ------------------------------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class Example:
    """One labelled input: ``text``, an optional ``text_pair``, ``label`` (a class name; None = unlabelled)."""

    text: str
    text_pair: str | None = None
    label: str | None = None
    line: int | None = None


def _as_example(item: Any, where: str) -> Example:
    if isinstance(item, Example):
        return item
    if isinstance(item, Mapping):
        text, pair, label, line = item.get("text"), item.get("text_pair"), item.get("label"), item.get("line")
    elif isinstance(item, tuple | list):
        if len(item) == 2:
            (text, label), pair = item, None
        elif len(item) == 3:
            text, pair, label = item
        else:
            raise LmforgeError(f"{where}: a tuple example is (text, label) or (text, text_pair, label); got "
                               f"{len(item)} items")
        line = None
    elif hasattr(item, "text") and hasattr(item, "label"):
        text, pair, label = item.text, getattr(item, "text_pair", None), item.label
        line = getattr(item, "line", None)
    else:
        raise LmforgeError(f"{where}: an example is an object with .text and .label, a dict with 'text' and "
                           f"'label', or a (text, label) tuple; got {type(item).__name__}")
    if not isinstance(text, str):
        raise LmforgeError(f"{where}: the text must be a string; got {type(text).__name__}")
    if pair is not None and not isinstance(pair, str):
        raise LmforgeError(f"{where}: text_pair must be a string or None; got {type(pair).__name__}")
    if isinstance(label, bool) or isinstance(label, float):
        raise LmforgeError(f"{where}: label {label!r} is not a class name; fewshot classifies into named labels "
                           "(a regression file cannot be used)")
    if isinstance(label, int):
        label = str(label)
    if label is not None and not isinstance(label, str):
        raise LmforgeError(f"{where}: the label must be a string; got {type(label).__name__}")
    return Example(text, pair, label, line if isinstance(line, int) else None)


def as_examples(items: Sequence[Any], what: str) -> list[Example]:
    """Normalise examples: objects with ``.text`` / ``.label`` (``ClassificationExample``), dicts, or tuples.

    Args:
        what: how messages name the collection ("train", "test").
    """
    return [_as_example(item, f"{what} example {i + 1}" + (f" (line {item.line})" if getattr(item, "line", None)
                                                           else "")) for i, item in enumerate(items)]


# ------------------------------------------------------------------------------------------------- template
Segment = tuple[str, str | None]  # (literal text, placeholder after it or None)


@dataclass(frozen=True)
class PromptTemplate:
    """A parsed template (see the module docstring).

    Attributes:
        source: the template as given.
        before: the segments before ``{label}``.
        after: the segments after ``{label}``.
        lead: the spaces at the end of the text before ``{label}``; they start every answer instead.
        uses_pair: the template holds ``{text_pair}``.
    """

    source: str
    before: tuple[Segment, ...]
    after: tuple[Segment, ...]
    lead: str
    uses_pair: bool

    @classmethod
    def parse(cls, template: str) -> PromptTemplate:
        """Check and split a template.

        Raises:
            LmforgeError: not a string, unbalanced braces, a placeholder other than {text}, {text_pair} and
                {label}, a conversion or format spec, no {text}, no {label} or several.
        """
        if not isinstance(template, str):
            raise LmforgeError(f"template must be a string; got {type(template).__name__}")
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as err:
            raise LmforgeError(f"template {template!r}: {err}; write a literal brace as {{{{ or }}}}") from None
        segments: list[Segment] = []
        for literal, name, spec, conversion in parsed:
            if name is not None and name not in PLACEHOLDERS:
                shown = "{" + name + "}"
                raise LmforgeError(f"template {template!r}: unknown placeholder {shown}; use {{text}}, "
                                   "{text_pair} and {label} (a literal brace is written {{ or }})")
            if spec or conversion:
                raise LmforgeError(f"template {template!r}: placeholders take no conversion or format spec "
                                   f"({{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
                                   "); write plain {text}, {text_pair}, {label}")
            segments.append((literal, name))
        names = [name for _, name in segments if name is not None]
        if "text" not in names:
            raise LmforgeError(f"template {template!r} has no {{text}}: it must say where the input text goes, "
                               "e.g. \"Review: {text}\\nSentiment: {label}\"")
        if names.count("label") != 1:
            problem = "no {label}" if "label" not in names else "{label} more than once"
            raise LmforgeError(f"template {template!r} has {problem}: it must mark once where the answer goes, "
                               "normally at the end, e.g. \"{text} Answer: {label}\"")
        at = next(i for i, (_, name) in enumerate(segments) if name == "label")
        before = [*segments[:at], (segments[at][0], None)]
        literal = before[-1][0]
        stripped = literal.rstrip(" ")
        lead = literal[len(stripped):]
        before[-1] = (stripped, None)
        return cls(template, tuple(before), tuple(segments[at + 1:]), lead, "text_pair" in names)

    @staticmethod
    def _fill(segments: Sequence[Segment], text: str, text_pair: str | None) -> str:
        out = []
        for literal, name in segments:
            out.append(literal)
            if name == "text":
                out.append(text)
            elif name == "text_pair":
                out.append(text_pair or "")
        return "".join(out)

    def query(self, text: str, text_pair: str | None = None) -> str:
        """The template up to ``{label}`` filled with the texts (without the spaces that start the answer)."""
        return self._fill(self.before, text, text_pair)

    def answer(self, verbalisation: str) -> str:
        """The continuation scored for a label: the moved spaces, then its verbalisation."""
        return self.lead + verbalisation

    def suffix(self, text: str, text_pair: str | None = None) -> str:
        """The template after ``{label}``, filled (what closes a demonstration)."""
        return self._fill(self.after, text, text_pair)

    def answer_context(self) -> str:
        """The literal text right before ``{label}`` after the last input placeholder ("Answer:", "Sentiment:"),
        leading whitespace removed: the context of GPT-3's unconditional probability (Brown et al. 2020, section
        2.4: "A:" or "Answer:")."""
        return self.before[-1][0].lstrip()


def resolve_verbalizer(verbalizer: Mapping[str, str] | None, train: Sequence[Example],
                       test: Sequence[Example]) -> dict[str, str]:
    """The label -> words map: ``verbalizer`` checked against the data, or each label standing for itself.

    Labels are in the verbalizer's order, else sorted. A verbalizer label found in no example stays a candidate
    answer (it can be predicted, never be right) and is warned about.

    Raises:
        LmforgeError: a label of the data without a verbalisation (named), an empty or non-string verbalisation.
    """
    data_labels = list(dict.fromkeys(e.label for e in [*train, *test] if e.label is not None))
    if verbalizer is None:  # the task's labels are the training file's (the test file's when there is none)
        known = sorted({e.label for e in (train or test) if e.label is not None})
        stray = next((e for e in test if e.label is not None and e.label not in known), None)
        if stray is not None:
            line = getattr(stray, "line", None)
            raise LmforgeError(f"test label {stray.label!r}{f' (line {line})' if line else ''} never appears in the "
                               f"training data, whose labels are the candidate answers ({', '.join(map(repr, known))})"
                               "; fix the test file, or name every label's words with --verbalizer LABEL=WORD,...")
        return {label: label for label in known}
    if not isinstance(verbalizer, Mapping) or not verbalizer:
        raise LmforgeError("verbalizer must be a non-empty dict label -> word(s), e.g. {'pos': 'great', 'neg': "
                           "'terrible'}, or None to use the label names")
    out: dict[str, str] = {}
    for label, words in verbalizer.items():
        if not isinstance(words, str) or not words.strip():
            raise LmforgeError(f"verbalizer: label {label!r} has no words ({words!r}); give e.g. {label}=great")
        out[str(label)] = words
    missing = [label for label in data_labels if label not in out]
    if missing:
        raise LmforgeError(f"verbalizer has no words for label {missing[0]!r} of the data"
                           f"{f' (nor for {missing[1:]})' if len(missing) > 1 else ''}; add {missing[0]}=WORD "
                           f"(the data's labels: {', '.join(map(repr, data_labels))})")
    unused = [label for label in out if label not in data_labels]
    if unused:
        log.warning("verbalizer label(s) %s occur in no example; they stay candidate answers",
                    ", ".join(map(repr, unused)))
    return out


# ------------------------------------------------------------------------------------------ demonstrations
def draw_demonstrations(n_train: int, k: int, n_test: int, rng: random.Random, *, per_example: bool,
                        excluded: Sequence[frozenset[int]]) -> list[list[int]]:
    """The training indices shown to each test example, in prompt order (oldest first).

    ``per_example=False`` ("fixed"): one random draw of the training set for all test examples; each takes its
    first ``k`` entries that are not itself. ``per_example=True``: a fresh draw per test example, consumed in
    test order. Draws come from ``rng`` only, so the same seed gives the same demonstrations.

    Args:
        excluded: per test example, the training indices that are that example (same object, or same texts):
            a test example never sees itself as a demonstration.

    Raises:
        LmforgeError: fewer than ``k`` training examples remain for some test example.
    """
    if k == 0:
        return [[] for _ in range(n_test)]
    most = max((len(e) for e in excluded), default=0)
    shared = None if per_example else rng.sample(range(n_train), min(n_train, k + most))
    out = []
    for i in range(n_test):
        order = shared if shared is not None else rng.sample(range(n_train), min(n_train, k + len(excluded[i])))
        picked = [j for j in order if j not in excluded[i]][:k]
        if len(picked) < k:
            raise LmforgeError(f"{k} demonstrations are needed for test example {i + 1}, but only {len(picked)} "
                               "training examples differ from it; lower the number of shots or give more "
                               "training examples")
        out.append(picked)
    return out


# ---------------------------------------------------------------------------------------------------- prompt
@dataclass
class Prompt:
    """One built prompt.

    Attributes:
        ids: the token ids (start token, demonstrations, query).
        text: the same as text (separator-joined demonstrations and query; no start token).
        demos: the training indices kept, oldest first.
        dropped: demonstrations dropped (oldest first) because the prompt did not fit the context.
        cut: query tokens cut from its left because even the query alone did not fit.
    """

    ids: list[int]
    text: str
    demos: list[int] = field(default_factory=list)
    dropped: int = 0
    cut: int = 0


class PromptBuilder:
    """Turns (demonstrations, test input) into prompt ids, and labels into candidate answer ids.

    Args:
        tokenizer: ``encode_ids(text) -> list[int]`` and a ``sep_id`` or ``bos_id`` (``document_start_ids``).
        template: the parsed template.
        verbalizer: label -> words (``resolve_verbalizer``).
        separator: the text between demonstrations.
        train: the training examples (demonstrations are their indices).
        max_len: the model's context (None: unlimited, a recurrent LM).
        answer_room: positions kept free after the prompt (the longest candidate, or the generated tokens).

    Raises:
        LmforgeError: a verbalisation that tokenizes to nothing, two labels that tokenize alike, a context too
            small for the start token and one query token.
    """

    def __init__(self, tokenizer: Any, template: PromptTemplate, verbalizer: Mapping[str, str], separator: str,
                 train: Sequence[Example], max_len: int | None, answer_room: int | None = None) -> None:
        self.tokenizer, self.template, self.train = tokenizer, template, list(train)
        self.start = document_start_ids(tokenizer)
        self.labels = list(verbalizer)
        self.verbalizer = dict(verbalizer)
        self.separator = separator
        self.separator_ids = self.encode(separator)
        self.candidates: list[list[int]] = []
        seen: dict[tuple[int, ...], str] = {}
        for label in self.labels:
            ids = self.encode(template.answer(self.verbalizer[label]))
            if not ids:
                raise LmforgeError(f"verbalizer: the words {self.verbalizer[label]!r} of label {label!r} tokenize "
                                   "to nothing; give words the tokenizer keeps")
            if tuple(ids) in seen:
                raise LmforgeError(f"verbalizer: labels {seen[tuple(ids)]!r} and {label!r} have the same "
                                   f"verbalisation once tokenized ({self._show(ids)}), so no prediction can tell "
                                   "them apart; give them different words the tokenizer knows (--verbalizer "
                                   "label=word,...)")
            seen[tuple(ids)] = label
            self.candidates.append(ids)
        room = max(len(c) for c in self.candidates) if answer_room is None else answer_room
        self.max_len = max_len
        self.limit = None if max_len is None else max_len - room
        if self.limit is not None and self.limit < len(self.start) + 1:
            raise LmforgeError(f"the model's context (max_seq_len={max_len}) leaves no room for a prompt once "
                               f"{room} positions are kept for the answer; use a model with a longer context or "
                               "shorter answers (fewer --max-new-tokens)")
        self._demo_cache: dict[int, tuple[list[int], str]] = {}

    def _show(self, ids: list[int]) -> str:
        convert = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        return " ".join(convert(ids)) if callable(convert) else str(ids)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode_ids(text)) if text else []

    def demonstration(self, index: int) -> tuple[list[int], str]:
        """The ids and text of training example ``index`` filled into the template with its verbalised label."""
        if index not in self._demo_cache:
            ex = self.train[index]
            if ex.label not in self.verbalizer:
                raise LmforgeError(f"train example {index + 1} has label {ex.label!r}, which has no verbalisation")
            self._check_pair(ex, f"train example {index + 1}")
            query = self.template.query(ex.text, ex.text_pair)
            answer = self.template.answer(self.verbalizer[ex.label])
            suffix = self.template.suffix(ex.text, ex.text_pair)
            ids = self.encode(query) + self.encode(answer) + self.encode(suffix)
            self._demo_cache[index] = (ids, query + answer + suffix)
        return self._demo_cache[index]

    def _check_pair(self, ex: Example, where: str) -> None:
        if self.template.uses_pair and ex.text_pair is None:
            raise LmforgeError(f"{where}{f' (line {ex.line})' if ex.line else ''} has no text_pair, but the "
                               "template uses {text_pair}; give a pair file (--text-pair-column) or drop "
                               "{text_pair} from the template")

    def build(self, demos: Sequence[int], text: str, text_pair: str | None = None, *, where: str = "test example",
              check_pair: bool = True) -> Prompt:
        """The prompt for one input after the given demonstrations (oldest first).

        Demonstrations that do not fit ``max_len - answer_room`` are dropped oldest first. If the query alone does
        not fit, it is cut from the LEFT: its end, which holds the cue right before the answer ("Sentiment:"), is
        what the answer depends on most; the start token stays.
        """
        if check_pair:
            self._check_pair(Example(text, text_pair), where)
        query_text = self.template.query(text, text_pair)
        query = self.encode(query_text)
        parts = [self.demonstration(i) for i in demos]
        kept = list(demos)
        dropped = cut = 0
        if self.limit is not None:
            total = len(self.start) + sum(len(ids) + len(self.separator_ids) for ids, _ in parts) + len(query)
            while parts and total > self.limit:
                total -= len(parts[0][0]) + len(self.separator_ids)
                parts.pop(0)
                kept.pop(0)
                dropped += 1
            if total > self.limit:
                cut = total - self.limit
                query = query[cut:]
        ids = list(self.start)
        for demo_ids, _ in parts:
            ids += demo_ids + self.separator_ids
        ids += query
        prompt_text = self.separator.join([t for _, t in parts] + [query_text])
        return Prompt(ids, prompt_text, kept, dropped, cut)

    def context_ids(self) -> list[int]:
        """The unconditional context: the start token and the template's text right before ``{label}``."""
        return self.start + self.encode(self.template.answer_context())
