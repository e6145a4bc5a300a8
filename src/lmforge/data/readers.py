"""Readers for fine-tuning data: sentence classification/regression, tagged tokens, token spans, SQuAD.

Every example remembers where it came from (``line``: the 1-based line in the file; for SQuAD, which is one
JSON document, the question ``id``), so later errors — a text too long, an unknown label — can name it. Every
problem a user can cause raises :class:`~lmforge.errors.InputFileError` with ``FILE:LINE:`` and the fix.
All files are read as UTF-8; a leading byte-order mark is accepted.

Formats
-------
**Classification / regression** (:func:`read_classification`), chosen by the file suffix:

* ``.csv``: comma-separated with a header row (the ``csv`` module: quoted fields may hold commas and line breaks);
* ``.tsv``: tab-separated with a header row; quoting off (a ``"`` is an ordinary character, as in GLUE's files);
* ``.parquet`` files and ``datasets`` folders (``Dataset.save_to_disk``; :mod:`lmforge.data.tables`, needs pyarrow):
  the same columns, typed like JSON lines; a ClassLabel column gives its class names;
* ``.txt`` (prediction input only): one text per line, no labels;
* ``.jsonl`` / ``.json``: JSON lines — one object per line, blank lines skipped::

      {"text": "A fine film.", "label": "pos"}
      {"text": "Two dogs run.", "text_pair": "Animals move.", "label": 4.2}

Labels decide the task. JSON strings stay strings; JSON integers become strings (``3`` -> ``"3"``: class ids
are names, not quantities); JSON floats stay floats. In CSV/TSV a label written as an integer (``0``, ``3``) is
a class name and one written with a ``.`` or an exponent (``2.5``, ``4.0``, ``1e-3``) is a float. If *any* label
is a float the data is **regression**: every label must then be a number (integer-looking ones become floats);
otherwise it is **classification**.

**Tagged tokens** (:func:`read_conll`): CoNLL columns separated by tabs or spaces, one token per line, the token
in the first column and the tag in the last, a blank line between sentences; ``-DOCSTART-`` lines are skipped::

    Empire      B-facility
    State       I-facility
    .           O

**Token spans** (:func:`read_spans`): JSON lines ``{"tokens": [...], "spans": [{"start", "end", "label"}]}``.
**``end`` is exclusive**: a span covers ``tokens[start:end]``, so ``{"start": 0, "end": 2}`` is the first two
tokens (Python slicing, as in spaCy; *not* the inclusive ends of some BRAT exports).

**Multiple choice** (:func:`read_choices`): a context, its options and the index of the right one. JSON lines
hold the options as a list, and the label is the option's 0-based index or its text::

    {"text": "Karen was assigned a roommate. ...", "choices": ["Karen became friends.", "Karen hated..."], "label": 0}

A CSV/TSV table numbers the option columns after the choices column's name: ``choices0``, ``choices1``, ...
(every column of that name and a number, in number order; an empty cell ends a row's options).

**Question answering** (:func:`read_squad`): SQuAD v1.1 and v2.0 JSON (Rajpurkar et al., 2016; 2018)::

    {"data": [{"title": ..., "paragraphs": [{"context": ..., "qas": [
        {"id": ..., "question": ..., "answers": [{"text": ..., "answer_start": <char offset>}],
         "is_impossible": false}]}]}]}

Splits
------
:func:`stratified_split`, :func:`group_split` and :func:`random_split` give fixed, seeded train/test index
splits for data that ships without one (benchmarks use them).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lmforge.data.text import read_user_text
from lmforge.errors import InputFileError, LmforgeError

__all__ = [
    "ChoiceExample",
    "ClassificationData",
    "ClassificationExample",
    "QAExample",
    "SpanExample",
    "TaggedSentence",
    "group_split",
    "random_split",
    "read_choices",
    "read_classification",
    "read_conll",
    "read_spans",
    "read_squad",
    "stratified_split",
]

TaskKind = Literal["classification", "regression"]

_CLASSIFICATION_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json")
_INT_LABEL = re.compile(r"[+-]?\d+")
_FLOAT_LABEL = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_COLUMN_SEPARATOR = re.compile(r"[ \t]+")
_DOCSTART = "-DOCSTART-"


# ----------------------------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class ClassificationExample:
    """One sentence (or sentence pair) with its label.

    Attributes:
        text: the first (or only) text.
        text_pair: the second text of a pair task, else None.
        label: a class name (str), a regression target (float), or None when the file has no label.
        line: 1-based line in the file where the example starts.
    """

    text: str
    text_pair: str | None
    label: str | float | None
    line: int


@dataclass(frozen=True)
class ClassificationData:
    """The examples of one file and the task they imply.

    Attributes:
        examples: in file order.
        kind: ``"regression"`` when any label is a float, ``"classification"`` otherwise, None when no example
            has a label.
        path: the file read.
    """

    examples: list[ClassificationExample]
    kind: TaskKind | None
    path: str

    @property
    def labels(self) -> list[str]:
        """The sorted distinct class names (empty for regression or unlabelled data)."""
        if self.kind != "classification":
            return []
        return sorted({ex.label for ex in self.examples if ex.label is not None})  # type: ignore[misc]


@dataclass(frozen=True)
class ChoiceExample:
    """A context and its candidate options; ``label`` is the index of the right option (None when unlabelled).

    Attributes:
        text: the context (a story, a question with its passage).
        choices: the options, two or more.
        label: 0-based index into ``choices``, or None.
        line: 1-based line in the file where the example starts.
    """

    text: str
    choices: tuple[str, ...]
    label: int | None
    line: int


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence of a CoNLL file.

    Attributes:
        tokens: the first column.
        tags: the last column, or None for a one-column (untagged) file.
        line: 1-based line of the first token.
    """

    tokens: list[str]
    tags: list[str] | None
    line: int


@dataclass(frozen=True)
class SpanExample:
    """One tokenised sentence with labelled token spans.

    Attributes:
        tokens: the words.
        spans: ``(start, end, label)`` with ``end`` EXCLUSIVE (the span is ``tokens[start:end]``), in file order;
            None when the line has no ``"spans"`` and they were not required. Overlapping spans are kept.
        line: 1-based line in the file.
    """

    tokens: list[str]
    spans: list[tuple[int, int, str]] | None
    line: int


@dataclass(frozen=True)
class QAExample:
    """One SQuAD question.

    Attributes:
        id: the question id (unique in the file; errors name it).
        title: the article title ("" when absent).
        question: the question text.
        context: the paragraph that holds the answer.
        answers: ``(text, answer_start)`` pairs, ``answer_start`` a character offset into ``context``;
            verified so that ``context[start:start + len(text)] == text``. Empty for an impossible question.
        is_impossible: SQuAD v2.0's unanswerable questions.
    """

    id: str
    title: str
    question: str
    context: str
    answers: list[tuple[str, int]]
    is_impossible: bool


# ----------------------------------------------------------------------------------------------- file access


def _read_text(path: Path) -> str:
    """The file as text (UTF-8, optional BOM). Raises InputFileError when missing, a folder or blank."""
    text = read_user_text(path)  # invalid UTF-8: replaced with a warning, or refused under --strict-utf8
    if not text.strip():
        raise InputFileError(f"{path}: the file is empty; it must hold at least one example")
    return text


def _lines(text: str) -> list[str]:
    """Physical lines without their ending (LF or CRLF). Not str.splitlines: that also breaks at U+2028, U+0085
    and form feeds, which occur inside tweets and web text and must stay inside their line."""
    lines = text.split("\n")
    return [line[:-1] if line.endswith("\r") else line for line in lines]


# ----------------------------------------------------------------------------------------------- classification


@dataclass
class _Record:
    line: int
    fields: dict[str, Any]


def _table_records(path: Path, text: str, delimiter: str) -> tuple[list[str], list[_Record]]:
    quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    records: list[_Record] = []
    header: list[str] | None = None
    header_line = 0
    previous_end = 0
    try:
        for row in reader:
            start, previous_end = previous_end + 1, reader.line_num
            if not row or all(not field.strip() for field in row):
                continue  # blank line
            if header is None:
                header = [name.strip() for name in row]
                header_line = start
                duplicates = sorted({name for name in header if header.count(name) > 1})
                if duplicates:
                    raise InputFileError(f"{path}:{start}: the header repeats the column(s) {duplicates}; "
                                         f"give every column a distinct name")
                continue
            if len(row) != len(header):
                hint = (" (a field holding a comma must be in double quotes)" if delimiter == ","
                        else " (a field must not hold a tab)")
                raise InputFileError(f"{path}:{start}: expected {len(header)} fields as in the header "
                                     f"(line {header_line}), found {len(row)}{hint}")
            records.append(_Record(start, dict(zip(header, row, strict=True))))
    except csv.Error as err:
        # Name the line where the broken record starts: an unclosed quote is only noticed at the end of the file.
        raise InputFileError(f"{path}:{previous_end + 1}: malformed {'CSV' if delimiter == ',' else 'TSV'} "
                             f"({err}); check the quoting of the record starting on this line") from None
    assert header is not None  # _read_text rejected a blank file
    return header, records


def _json_records(path: Path, text: str) -> tuple[list[str], list[_Record]]:
    records: list[_Record] = []
    for number, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputFileError(f"{path}:{number}: malformed JSON ({err.msg} at column {err.colno}); a "
                                 f"{path.suffix} file must hold one JSON object per line") from None
        if not isinstance(value, dict):
            raise InputFileError(f"{path}:{number}: expected a JSON object per line, found a "
                                 f"{type(value).__name__}; write one {{\"text\": ..., \"label\": ...}} object per "
                                 f"line (JSON lines), not one array for the whole file")
        records.append(_Record(number, value))
    assert records  # _read_text rejected a blank file
    return list(records[0].fields), records


def _parse_label(path: Path, record: _Record, value: Any, from_json: bool) -> str | float | None:
    """A label as written: str (class name), float (regression target) or None (missing)."""
    where = f"{path}:{record.line}"
    if value is None:
        return None
    if from_json:
        if isinstance(value, bool):
            return "true" if value else "false"  # the JSON text of the value, like integers
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InputFileError(f"{where}: the label {value} is not a finite number; fix or drop the line")
            return value
        if isinstance(value, str):
            return value.strip() or None
        raise InputFileError(f"{where}: a label must be a string or a number, found a {type(value).__name__} "
                             f"({json.dumps(value)[:60]})")
    value = value.strip()
    if not value:
        return None
    if _INT_LABEL.fullmatch(value):
        return value
    if _FLOAT_LABEL.fullmatch(value):
        return float(value)
    return value


def _text_field(path: Path, record: _Record, column: str, option: str) -> str:
    value = record.fields.get(column)
    if value is None:
        raise InputFileError(f"{path}:{record.line}: no {column!r} field (fields: {sorted(record.fields)}); "
                             f"every line needs it, or choose another column with {option}")
    if not isinstance(value, str):
        raise InputFileError(f"{path}:{record.line}: the {column!r} field must be a string, found "
                             f"{json.dumps(value)[:60]}")
    if not value.strip():
        raise InputFileError(f"{path}:{record.line}: the {column!r} field is empty; fill it in or drop the line")
    return value


def _records(path: Path) -> tuple[bool, list[str], list[_Record]]:
    """(typed values, columns, records) of a CSV, TSV, JSON-lines or Parquet file or a ``datasets`` folder, chosen
    by its suffix (typed: JSON lines and Arrow tables, whose numbers are numbers)."""
    from lmforge.data.tables import TABLE_SUFFIXES, is_table_source, read_table_rows

    if is_table_source(path):
        columns, rows = read_table_rows(path)
        return True, columns, [_Record(number, row) for number, row in enumerate(rows, start=1)]
    suffix = path.suffix.lower()
    if suffix not in _CLASSIFICATION_SUFFIXES:
        raise InputFileError(f"{path}: unknown file type {path.suffix!r}; use one of "
                             f"{', '.join(_CLASSIFICATION_SUFFIXES + TABLE_SUFFIXES)} (.json means JSON lines), a "
                             "datasets folder (Dataset.save_to_disk), or .txt (one text per line) for prediction")
    text = _read_text(path)
    if suffix in (".jsonl", ".json"):
        return True, *_json_records(path, text)
    return False, *_table_records(path, text, "," if suffix == ".csv" else "\t")


def read_classification(path: str | Path, *, text_column: str = "text", text_pair_column: str = "text_pair",
                        label_column: str = "label", require_labels: bool = True,
                        pair: bool | None = None, read_labels: bool = True) -> ClassificationData:
    """Read a sentence(-pair) classification or regression file (CSV, TSV or JSON lines; see the module doc).

    Args:
        path: a ``.csv``, ``.tsv``, ``.jsonl`` or ``.json`` (JSON lines) file.
        text_column: the column of the first text (CLI ``--text-column``).
        text_pair_column: the column of the second text (CLI ``--text-pair-column``).
        label_column: the column of the label (CLI ``--label-column``).
        require_labels: every example must have a label (training, evaluation); False for prediction input,
            where missing labels become None.
        pair: True requires the pair column, False ignores it, None uses it when it exists (in the header of a
            table; in the first object of a JSON lines file).
        read_labels: False leaves the label column unread (every label None, ``kind`` None): prediction input,
            whose labels, if any, are not used and must not stop it (a class the model never saw, a mix of numbers
            and names).

    Returns:
        The examples, the task kind and the path.

    Raises:
        InputFileError: unknown suffix, missing file/column, empty text, missing label, non-numeric label in a
            regression file, malformed line; the message names ``FILE:LINE`` and the fix.
    """
    path = Path(path)
    if path.suffix.lower() == ".txt" and path.is_file():
        return _plain_texts(path, require_labels=require_labels, pair=pair)
    from_json, columns, records = _records(path)
    if not records:
        raise InputFileError(f"{path}: the file has a header but no examples")

    def need(column: str, option: str, role: str) -> None:
        if column not in columns:
            where = "in the header" if not from_json else "in the first line"
            raise InputFileError(f"{path}: no {role} column {column!r} {where} (columns: {columns}); "
                                 f"name the {role} column with {option}")

    need(text_column, "--text-column", "text")
    if pair is True:
        need(text_pair_column, "--text-pair-column", "text-pair")
    use_pair = pair is True or (pair is None and text_pair_column in columns)
    # A JSON line may simply omit a missing label; a table must have the column.
    has_label_column = read_labels and (from_json or label_column in columns)
    if require_labels:
        need(label_column, "--label-column", "label")

    texts: list[tuple[int, str, str | None]] = []
    raw_labels: list[str | float | None] = []
    for record in records:
        first = _text_field(path, record, text_column, "--text-column")
        second = _text_field(path, record, text_pair_column, "--text-pair-column") if use_pair else None
        label = _parse_label(path, record, record.fields.get(label_column), from_json) if has_label_column else None
        if label is None and require_labels:
            raise InputFileError(f"{path}:{record.line}: missing label in column {label_column!r}; every example "
                                 f"needs one for training or evaluation (or choose the column with --label-column)")
        texts.append((record.line, first, second))
        raw_labels.append(label)

    labels, kind = _resolve_labels(path, [line for line, _, _ in texts], raw_labels)
    examples = [ClassificationExample(first, second, label, line)
                for (line, first, second), label in zip(texts, labels, strict=True)]
    return ClassificationData(examples, kind, str(path))


def _plain_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every non-blank line of a plain text file's text."""
    return [(number, line) for number, line in enumerate(_lines(text), start=1) if line.strip()]


def _plain_texts(path: Path, *, require_labels: bool, pair: bool | None) -> ClassificationData:
    """A ``.txt`` file: one text per line, no labels (prediction input)."""
    if require_labels:
        raise InputFileError(f"{path}: a .txt file holds one text per line and no labels; training and evaluation "
                             "need labelled data (CSV, TSV, JSON lines, Parquet or a datasets folder with text and "
                             "label columns)")
    if pair is True:
        raise InputFileError(f"{path}: the model classifies pairs of texts, and a .txt file holds one text per "
                             "line; give a CSV/TSV/JSON-lines file with both text columns")
    examples = [ClassificationExample(line, None, None, number) for number, line in _plain_lines(_read_text(path))]
    return ClassificationData(examples, None, str(path))


def read_choices(path: str | Path, *, text_column: str = "text", choices_column: str = "choices",
                 label_column: str = "label", require_labels: bool = True,
                 read_labels: bool = True) -> list[ChoiceExample]:
    """Read a multiple-choice file (CSV, TSV or JSON lines; see the module doc). ``read_labels=False`` leaves the
    label column unread (prediction input: labels None).

    Raises:
        InputFileError: unknown suffix, missing column, fewer than two options, an empty option, a label that is
            neither an option's index nor its text; the message names ``FILE:LINE`` and the fix.
    """
    path = Path(path)
    from_json, columns, records = _records(path)
    numbered: list[str] = []
    if not from_json:
        pattern = re.compile(re.escape(choices_column) + r"(\d+)")
        numbered = sorted((c for c in columns if pattern.fullmatch(c)), key=lambda c: int(c[len(choices_column):]))
        if not numbered:
            raise InputFileError(f"{path}: no option columns {choices_column}0, {choices_column}1, ... in the header "
                                 f"(columns: {columns}); number the option columns after --choices-column")
    if not records:
        raise InputFileError(f"{path}: the file has a header but no examples")
    if text_column not in columns:
        raise InputFileError(f"{path}: no text column {text_column!r} (columns: {columns}); name the context column "
                             "with --text-column")
    examples = []
    for record in records:
        where = f"{path}:{record.line}"
        context = _text_field(path, record, text_column, "--text-column")
        if from_json:
            raw = record.fields.get(choices_column)
            if not isinstance(raw, list):
                raise InputFileError(f"{where}: the {choices_column!r} field must be a list of option strings, found "
                                     f"{json.dumps(raw)[:60]} (choose the field with --choices-column)")
        else:
            raw = [record.fields[c] for c in numbered]
            while raw and not raw[-1].strip():  # fewer options on this row
                raw.pop()
        if len(raw) < 2:
            raise InputFileError(f"{where}: {len(raw)} option(s); a multiple-choice example needs two or more")
        if not all(isinstance(o, str) and o.strip() for o in raw):
            raise InputFileError(f"{where}: every option must be a non-empty string, found "
                                 f"{json.dumps(raw, ensure_ascii=False)[:80]}")
        choices = tuple(raw)
        label = _choice_label(where, record.fields.get(label_column), choices) if read_labels else None
        if label is None and require_labels:
            raise InputFileError(f"{where}: missing label in column {label_column!r} (the right option's 0-based "
                                 "index or its text); every example needs one for training or evaluation")
        examples.append(ChoiceExample(context, choices, label, record.line))
    return examples


def _choice_label(where: str, value: Any, choices: tuple[str, ...]) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip() in choices:
        return choices.index(value.strip())
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if type(value) is int and 0 <= value < len(choices):
        return value
    raise InputFileError(f"{where}: the label {json.dumps(value, ensure_ascii=False)[:60]} is neither an option's "
                         f"0-based index (0..{len(choices) - 1}) nor one of the options' text")


def _resolve_labels(path: Path, lines: list[int], labels: list[str | float | None]
                    ) -> tuple[list[str | float | None], TaskKind | None]:
    """Decide classification vs regression; for regression turn every label into a float."""
    present = [(line, label) for line, label in zip(lines, labels, strict=True) if label is not None]
    if not present:
        return labels, None
    float_at = next((line for line, label in present if isinstance(label, float)), None)
    if float_at is None:
        return labels, "classification"
    resolved: list[str | float | None] = []
    for line, label in zip(lines, labels, strict=True):
        if isinstance(label, str):
            if not _FLOAT_LABEL.fullmatch(label):
                raise InputFileError(f"{path}:{line}: the label {label!r} is not a number, but the label on line "
                                     f"{float_at} is a float, so the file reads as regression; make every label "
                                     f"a number, or write class labels without a decimal point")
            label = float(label)
        resolved.append(label)
    return resolved, "regression"


# ----------------------------------------------------------------------------------------------- CoNLL


def read_conll(path: str | Path, *, require_tags: bool = True, tokens_column: str = "tokens",
               tags_column: str | None = None) -> list[TaggedSentence]:
    """Read tagged tokens in CoNLL columns (token first, tag last; tabs or spaces; blank line between sentences).

    ``-DOCSTART-`` lines are skipped; several blank lines count as one; the last sentence need not be followed
    by a blank line; CRLF line ends are accepted. Tags are returned as written: check or convert their scheme
    with :mod:`lmforge.data.schemes`.

    A Parquet file or a ``datasets`` folder holds one sentence per row: its words in ``tokens_column`` and its tags
    in ``tags_column`` (default: the first of ``ner_tags``, ``tags``, ``labels`` present), as Hugging Face's NER
    datasets do; ClassLabel tag ids become their names.

    Prediction input (``require_tags`` False) may also be running text, one sentence per line, words split at
    whitespace: a file whose lines have different numbers of words and no blank line between sentences.

    Args:
        path: the file.
        require_tags: True (training, evaluation) needs a tag column, i.e. at least two columns. False also
            accepts one-column files (tokens only, e.g. text to tag), whose sentences have ``tags=None``, and
            running text.
        tokens_column, tags_column: the columns of a Parquet file or datasets folder.

    Returns:
        The sentences in file order.

    Raises:
        InputFileError: a line with a different number of columns than the first token line, a one-column file
            when tags are required, a file without tokens.
    """
    path = Path(path)
    from lmforge.data.tables import is_table_source

    if is_table_source(path):
        return _tagged_table(path, require_tags=require_tags, tokens_column=tokens_column, tags_column=tags_column)
    text = _read_text(path)
    if not require_tags and _is_running_text(text):
        # prediction input written as sentences, one per line: words split at whitespace
        return [TaggedSentence(line.split(), None, number) for number, line in _plain_lines(text)]
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0
    n_columns = 0
    first_line = 0

    def flush() -> None:
        if tokens:
            sentences.append(TaggedSentence(list(tokens), list(tags) if n_columns > 1 else None, start))
            tokens.clear()
            tags.clear()

    for number, line in enumerate(_lines(text), start=1):
        stripped = line.strip(" \t")
        if not stripped:
            flush()
            continue
        columns = _COLUMN_SEPARATOR.split(stripped)
        if columns[0] == _DOCSTART:
            flush()  # a document boundary also ends a sentence
            continue
        if not n_columns:
            n_columns, first_line = len(columns), number
            if n_columns == 1 and require_tags:
                raise InputFileError(f"{path}:{number}: only one column (the token) — no tag column; a tagged "
                                     f"file has the token first and the tag last on each line, separated by a "
                                     f"tab or spaces (untagged text is input for `lmforge predict`)")
        elif len(columns) != n_columns:
            raise InputFileError(f"{path}:{number}: expected {n_columns} columns, found {len(columns)} (line "
                                 f"{first_line} has {n_columns}); every token line needs the same columns — a "
                                 f"token must not contain spaces or tabs, and no tag may be missing; fix the line")
        if not tokens:
            start = number
        tokens.append(columns[0])
        tags.append(columns[-1])
    flush()
    if not sentences:
        raise InputFileError(f"{path}: no tokens found (only blank or -DOCSTART- lines); a CoNLL file has one "
                             f"token per line with its tag in the last column")
    return sentences


_TAG_LIKE = re.compile(r"(O|[BIESLU][-_]\S+)")  # a BIO / BIOES / BILOU tag: the last column of a tagged CoNLL line


def _is_running_text(text: str) -> bool:
    """Whether an untagged file is sentences, one per line, rather than CoNLL columns: no blank line between its
    lines, and either not the same number of whitespace-separated fields on every line (a CoNLL file of one
    sentence has the same number of columns on every line; a single line counts as text from three words on), or
    the same number of two or more on every line while no line ends with a tag (sentences that happen to have
    equal lengths; a CoNLL file with columns ends its lines with tags, "O" at least once)."""
    lines = [line.strip(" \t") for line in _lines(text)]
    while lines and not lines[-1]:
        lines.pop()
    if not lines or any(not line for line in lines) or any(line.startswith(_DOCSTART) for line in lines):
        return False
    fields = [_COLUMN_SEPARATOR.split(line) for line in lines]
    widths = {len(f) for f in fields}
    # one line: "a O" is a one-token CoNLL file, a line of three or more words a sentence (a one-token file with
    # three columns or more is not a plausible input)
    if len(widths) > 1 or (len(lines) == 1 and max(widths) >= 3):
        return True
    return len(lines) > 1 and max(widths) >= 2 and not any(_TAG_LIKE.fullmatch(f[-1]) for f in fields)


def _tagged_table(path: Path, *, require_tags: bool, tokens_column: str,
                  tags_column: str | None) -> list[TaggedSentence]:
    from lmforge.data.tables import read_table_rows

    columns, rows = read_table_rows(path)
    if tokens_column not in columns:
        raise InputFileError(f"{path}: no {tokens_column!r} column (columns: {columns}); a tagged table holds "
                             "each sentence's words as a list (Hugging Face's NER layout: tokens, ner_tags)")
    if tags_column is None:
        tags_column = next((c for c in ("ner_tags", "tags", "labels") if c in columns), None)
    elif tags_column not in columns:
        raise InputFileError(f"{path}: no tag column {tags_column!r} (columns: {columns})")
    if tags_column is None and require_tags:
        raise InputFileError(f"{path}: no tag column (ner_tags, tags or labels) among {columns}; training and "
                             "evaluation need each sentence's tags")
    sentences = []
    for number, row in enumerate(rows, start=1):
        words = row[tokens_column]
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
            raise InputFileError(f"{path}:{number}: {tokens_column} must be a non-empty list of words, found "
                                 f"{json.dumps(words)[:80]}")
        tags = row[tags_column] if tags_column is not None else None
        if tags is not None:
            if not isinstance(tags, list) or len(tags) != len(words):
                raise InputFileError(f"{path}:{number}: {tags_column} must be a list of one tag per word "
                                     f"({len(words)} words), found {json.dumps(tags)[:80]}")
            tags = [str(t) for t in tags]
        elif require_tags:
            raise InputFileError(f"{path}:{number}: the sentence has no tags in {tags_column!r}")
        sentences.append(TaggedSentence(list(words), tags, number))
    return sentences


# ----------------------------------------------------------------------------------------------- spans


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_spans(path: str | Path, *, require_spans: bool = True) -> list[SpanExample]:
    """Read span-labelled sentences from JSON lines ``{"tokens": [...], "spans": [{"start", "end", "label"}]}``.

    ``end`` is EXCLUSIVE: a span covers ``tokens[start:end]``. Each span must satisfy
    ``0 <= start < end <= len(tokens)`` and have a non-empty string label. Overlapping and nested spans are
    accepted here (a span-classification head can predict them); converting to tags rejects them.

    Args:
        path: the JSON lines file (blank lines skipped).
        require_spans: every line must have a ``"spans"`` list (it may be empty: a sentence with no entity).
            False accepts lines without the key (text to label), read as ``spans=None``.

    Returns:
        The examples in file order.

    Raises:
        InputFileError: malformed JSON, missing or empty tokens, a bad span; the message names ``FILE:LINE``.
    """
    path = Path(path)
    text = _read_text(path)
    examples: list[SpanExample] = []
    for number, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputFileError(f"{where}: malformed JSON ({err.msg} at column {err.colno}); the file must "
                                 f"hold one JSON object per line") from None
        if not isinstance(value, dict):
            raise InputFileError(f"{where}: expected a JSON object {{\"tokens\": [...], \"spans\": [...]}}, "
                                 f"found a {type(value).__name__}")
        tokens = value.get("tokens")
        if (not isinstance(tokens, list) or not tokens
                or not all(isinstance(t, str) and t.strip() for t in tokens)):
            raise InputFileError(f"{where}: \"tokens\" must be a non-empty list of non-empty strings, found "
                                 f"{json.dumps(tokens)[:80]}")
        if "spans" not in value:
            if require_spans:
                raise InputFileError(f"{where}: no \"spans\" list; write \"spans\": [] for a sentence without "
                                     f"spans (or read unlabelled text with require_spans=False)")
            examples.append(SpanExample(tokens, None, number))
            continue
        raw = value["spans"]
        if not isinstance(raw, list):
            raise InputFileError(f"{where}: \"spans\" must be a list of {{\"start\", \"end\", \"label\"}} objects")
        spans = [_parse_span(where, span, len(tokens)) for span in raw]
        examples.append(SpanExample(tokens, spans, number))
    return examples


def _parse_span(where: str, span: Any, n_tokens: int) -> tuple[int, int, str]:
    shown = json.dumps(span)[:80]
    if not isinstance(span, dict) or not {"start", "end", "label"} <= span.keys():
        raise InputFileError(f"{where}: a span must be an object with \"start\", \"end\" and \"label\", found "
                             f"{shown}")
    start, end, label = span["start"], span["end"], span["label"]
    if not (_is_index(start) and _is_index(end)):
        raise InputFileError(f"{where}: span {shown}: \"start\" and \"end\" must be integers (token indices)")
    if not 0 <= start < end <= n_tokens:
        raise InputFileError(f"{where}: span {shown} is out of range for {n_tokens} tokens; spans need "
                             f"0 <= start < end <= {n_tokens}, with end EXCLUSIVE (tokens[start:end]) — "
                             f"a one-token span at i is start=i, end=i+1")
    if not isinstance(label, str) or not label.strip():
        raise InputFileError(f"{where}: span {shown}: \"label\" must be a non-empty string")
    return start, end, label


# ----------------------------------------------------------------------------------------------- SQuAD


def _field(where: str, obj: Any, key: str, kind: type | tuple[type, ...], fix: str = "") -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise InputFileError(f"{where}: missing \"{key}\"; SQuAD JSON is {{\"data\": [{{\"title\", \"paragraphs\": "
                             f"[{{\"context\", \"qas\": [{{\"id\", \"question\", \"answers\"}}]}}]}}]}}{fix}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InputFileError(f"{where}: \"{key}\" must be a {names}, found {json.dumps(value)[:60]}")
    return value


def _explain_answer_mismatch(path: Path, qid: str, context: str, text: str, start: int) -> str:
    found = context[start:start + len(text)]
    message = (f"{path}: question {qid!r}: the answer {text!r} with answer_start={start} does not match the "
               f"context, which holds {found!r} at [{start}:{start + len(text)}]")
    if " ".join(found.split()) == " ".join(text.split()):
        message += " (they differ only in white space; the text must match character for character)"
    hits = [m.start() for m in re.finditer(re.escape(text), context)] if text else []
    if hits:
        message += f"; the text occurs at offset(s) {hits[:5]}: fix answer_start"
    else:
        message += "; the text does not occur in the context: fix the answer text or the context"
    return message


def read_squad(path: str | Path, *, require_answers: bool = True) -> list[QAExample]:
    """Read SQuAD v1.1 or v2.0 JSON, verifying every answer against its context.

    Every answer must satisfy ``context[answer_start:answer_start + len(text)] == text`` exactly (white-space
    differences included: models are trained on those offsets). ``plausible_answers`` (v2.0) are ignored.

    Args:
        path: the JSON file.
        require_answers: a question that is not ``is_impossible`` must have at least one answer (training,
            evaluation). False accepts questions without answers (prediction input).

    Returns:
        One example per question, in file order.

    Raises:
        InputFileError: malformed JSON or structure, duplicate question ids, an answer whose offset does not
            match, an answerable question without answers, an impossible question with answers.
    """
    path = Path(path)
    text = _read_text(path)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        if path.suffix.lower() in (".csv", ".tsv", ".txt", ".jsonl", ".conll") or err.pos == 0:
            raise InputFileError(f"{path}: not SQuAD JSON; question answering reads one JSON document, {{\"data\": "
                                 "[{\"paragraphs\": [{\"context\": ..., \"qas\": [...]}]}]} (SQuAD v1.1 or "
                                 "v2.0); convert the file to that layout") from None
        raise InputFileError(f"{path}:{err.lineno}: malformed JSON ({err.msg} at column {err.colno})") from None
    articles = _field(f"{path}", document, "data", list)
    examples: list[QAExample] = []
    seen: set[str] = set()
    for a, article in enumerate(articles):
        where_article = f"{path}: data[{a}]"
        title = article.get("title", "") if isinstance(article, dict) else ""
        title = title if isinstance(title, str) else str(title)
        for p, paragraph in enumerate(_field(where_article, article, "paragraphs", list)):
            where_paragraph = f"{where_article}.paragraphs[{p}]"
            context = _field(where_paragraph, paragraph, "context", str)
            if not context.strip():
                raise InputFileError(f"{where_paragraph}: the context is empty")
            for q, qa in enumerate(_field(where_paragraph, paragraph, "qas", list)):
                where_q = f"{where_paragraph}.qas[{q}]"
                qid = _field(where_q, qa, "id", (str, int))
                qid = str(qid)
                where_q = f"{path}: question {qid!r}"
                if qid in seen:
                    raise InputFileError(f"{where_q}: the id occurs twice; question ids must be unique")
                seen.add(qid)
                question = _field(where_q, qa, "question", str)
                if not question.strip():
                    raise InputFileError(f"{where_q}: the question is empty")
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise InputFileError(f"{where_q}: \"is_impossible\" must be true or false")
                answers = _read_answers(path, qid, qa.get("answers", []), context)
                if impossible and answers:
                    raise InputFileError(f"{where_q}: is_impossible is true but the question has answers; put "
                                         f"them under \"plausible_answers\" or set is_impossible to false")
                if not impossible and not answers and require_answers:
                    raise InputFileError(f"{where_q}: no answers; give at least one {{\"text\", "
                                         f"\"answer_start\"}} or mark the question \"is_impossible\": true "
                                         f"(SQuAD v2.0)")
                examples.append(QAExample(qid, title, question, context, answers, impossible))
    if not examples:
        raise InputFileError(f"{path}: no questions found; the file must follow the SQuAD JSON layout")
    return examples


def _read_answers(path: Path, qid: str, raw: Any, context: str) -> list[tuple[str, int]]:
    where = f"{path}: question {qid!r}"
    if not isinstance(raw, list):
        raise InputFileError(f"{where}: \"answers\" must be a list of {{\"text\", \"answer_start\"}} objects")
    answers = []
    for answer in raw:
        answer_text = _field(where, answer, "text", str)
        start = _field(where, answer, "answer_start", int)
        if not answer_text:
            raise InputFileError(f"{where}: an answer text is empty; remove it (an unanswerable question is "
                                 f"marked \"is_impossible\": true)")
        if not 0 <= start <= len(context) - len(answer_text):
            raise InputFileError(f"{where}: answer {answer_text!r} has answer_start={start}, outside the "
                                 f"context of {len(context)} characters; fix answer_start")
        if context[start:start + len(answer_text)] != answer_text:
            raise InputFileError(_explain_answer_mismatch(path, qid, context, answer_text, start))
        answers.append((answer_text, start))
    return answers


# ----------------------------------------------------------------------------------------------- splits


def _check_fraction(test_fraction: float, n: int, what: str) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise LmforgeError(f"test_fraction must be strictly between 0 and 1, got {test_fraction}")
    if n < 2:
        raise LmforgeError(f"cannot split {n} {what} into a train and a test part; need at least 2")


def random_split(n: int, test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A seeded random split of ``range(n)`` (for regression data, where strata are not classes).

    Returns:
        ``(train_idx, test_idx)``, each sorted; the test part has ``round(test_fraction * n)`` indices,
        clamped to ``[1, n - 1]``.
    """
    _check_fraction(test_fraction, n, "examples")
    n_test = min(max(int(math.floor(test_fraction * n + 0.5)), 1), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    return sorted(order[n_test:].tolist()), sorted(order[:n_test].tolist())


def stratified_split(labels: Sequence[Hashable], test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A seeded split with each class in (about) the same proportion in train and test.

    The test part holds ``round(test_fraction * n)`` examples, allotted to the classes by largest remainder
    under two bounds: every class with at least 2 examples gets at least one test and one train example, and a
    class with a single example stays in train (the total moves off the target only when the bounds force it).
    Classes are processed in sorted order of ``repr`` and shuffled by one generator seeded with ``seed``, so the
    split depends only on the labels and the seed.

    Args:
        labels: one label per example.
        test_fraction: in (0, 1).
        seed: the random seed.

    Returns:
        ``(train_idx, test_idx)``, each sorted.
    """
    _check_fraction(test_fraction, len(labels), "examples")
    groups: dict[Hashable, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    classes = sorted(groups, key=repr)
    sizes = [len(groups[c]) for c in classes]
    exact = [test_fraction * n for n in sizes]
    low = [1 if n >= 2 else 0 for n in sizes]
    high = [n - 1 if n >= 2 else 0 for n in sizes]
    counts = [min(max(int(math.floor(x)), lo), hi) for x, lo, hi in zip(exact, low, high, strict=True)]
    missing = int(math.floor(test_fraction * len(labels) + 0.5)) - sum(counts)
    # Hand out (or take back) one example at a time to the class furthest below (above) its exact share;
    # max() keeps the first of equals, so ties are deterministic.
    while missing > 0:
        open_ = [k for k in range(len(classes)) if counts[k] < high[k]]
        if not open_:
            break
        counts[max(open_, key=lambda k: exact[k] - counts[k])] += 1
        missing -= 1
    while missing < 0:
        open_ = [k for k in range(len(classes)) if counts[k] > low[k]]
        if not open_:
            break
        counts[max(open_, key=lambda k: counts[k] - exact[k])] -= 1
        missing += 1
    rng = np.random.default_rng(seed)
    train: list[int] = []
    test: list[int] = []
    for c, n_test in zip(classes, counts, strict=True):
        members = groups[c]
        order = rng.permutation(len(members))
        test.extend(members[j] for j in order[:n_test])
        train.extend(members[j] for j in order[n_test:])
    return sorted(train), sorted(test)


def group_split(groups: Sequence[str], test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """A seeded split that keeps each group whole (e.g. SQuAD questions by paragraph or title).

    The distinct groups (in sorted order) are shuffled with ``seed`` and moved to test one by one until the
    test part holds at least ``test_fraction`` of the examples; at least one group always stays in train.

    Args:
        groups: one group key per example.
        test_fraction: in (0, 1); the test share of *examples* reached group by group (so it overshoots by at
            most one group).
        seed: the random seed.

    Returns:
        ``(train_idx, test_idx)``, each sorted; no group has indices in both.
    """
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    _check_fraction(test_fraction, len(members), "groups")
    keys = sorted(members)
    order = np.random.default_rng(seed).permutation(len(keys))
    target = test_fraction * len(groups)
    test: list[int] = []
    for taken, k in enumerate(order):
        if len(test) >= target or taken == len(keys) - 1:
            break
        test.extend(members[keys[k]])
    test_set = set(test)
    train = [i for i in range(len(groups)) if i not in test_set]
    return train, sorted(test)
