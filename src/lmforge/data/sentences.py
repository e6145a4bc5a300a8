"""A small rule-based sentence splitter, for corpora that are not already one sentence per line.

BERT's pretraining data is one sentence per line (google-research/bert, ``create_pretraining_data.py``);
sentences matter because segment pairs are cut at sentence boundaries. Prose (the BBC News articles, a web page)
holds whole paragraphs per line, so it is split here with these rules:

A boundary is placed after a run of sentence-final punctuation ``. ! ? …`` (``?!`` and ``...`` are one run),
together with any closing quotes or brackets that follow it (``."`` ``?)`` ``!’``), when

* white space follows, and
* the next character after the white space is an upper-case letter, a digit, or an opening quote or bracket.

A period (alone, not ``?`` or ``!``) is *not* a boundary when the word it ends is

* a common abbreviation (``Mr. Mrs. Ms. Dr. St. Prof. Jr. Sr. Gen. Inc. Ltd. Co. vs. etc.`` and the month
  abbreviations, see ``ABBREVIATIONS``), compared without case;
* one letter, or letters joined by periods: initials and dotted abbreviations (``J. K. Rowling``,
  ``U.S. The``, ``e.g. The``, ``i.e. Most``);
* an abbreviation that is followed by a number (``No. 10``, ``pp. 4``, ``Fig. 2``; see
  ``NUMBER_ABBREVIATIONS``) — only before a digit, so ``the answer was no. The`` still splits.

Periods inside numbers (``3.14``, ``$1.13bn``) and inside words (``google.com``) never split: no white space
follows them. Lines inside a paragraph are joined by a space before splitting (hard-wrapped text).

Known limits (by design, it is a rule list, not a model): an abbreviation really ending a sentence (``... in
the U.S. The next``) stays attached to the next sentence; a sentence starting with a lower-case word
(``iPhone sales rose.``) is not split off; a period after a plain number ending a sentence (``rose 5. The``)
does split, which is right far more often than not.
"""

from __future__ import annotations

import re

__all__ = ["ABBREVIATIONS", "NUMBER_ABBREVIATIONS", "ends_sentence", "split_paragraphs", "split_sentences"]

# Compared lower-cased, without the final period. Dotted forms (u.s, e.g, i.e, a.m) are covered by the
# initials rule below and need not be listed.
ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "st", "prof", "jr", "sr", "rev", "hon", "gen", "col", "lt", "sgt", "capt", "cmdr",
    "gov", "sen", "rep", "pres", "supt", "mt", "ft", "ave", "blvd", "rd",
    "inc", "ltd", "co", "corp", "plc", "bros", "dept", "univ", "assn",
    "vs", "etc", "cf", "al", "approx", "est", "ca",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
})
# Abbreviations that end a sentence too often to be listed above; they only block a split before a digit.
NUMBER_ABBREVIATIONS = frozenset({"no", "nos", "nr", "vol", "vols", "p", "pp", "fig", "figs", "art", "sec", "ch",
                                  "op", "para"})

_TERMINALS = ".!?\u2026"  # . ! ? …
_CLOSERS = "\"'\u201d\u2019\u00bb)]}"  # " ' ” ’ » ) ] }
_OPENERS = "\"'\u201c\u2018\u00ab([{"  # " ' “ ‘ « ( [ {
_CANDIDATE = re.compile(f"([{re.escape(_TERMINALS)}]+)[{re.escape(_CLOSERS)}]*(?=\\s)")
_INITIALS = re.compile(r"(?:[^\W\d_]\.)*[^\W\d_]")  # J | U.S | e.g | i.e | a.m
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")


def _is_boundary(text: str, punct_start: int, punct: str, next_char: str) -> bool:
    if not (next_char.isupper() or next_char.isdigit() or next_char in _OPENERS):
        return False
    if punct != ".":
        return True
    word_start = punct_start
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:punct_start].lstrip(_OPENERS)
    if not word:
        return True
    lower = word.lower()
    if lower in ABBREVIATIONS or _INITIALS.fullmatch(word):
        return False
    return not (lower in NUMBER_ABBREVIATIONS and next_char.isdigit())


def split_sentences(text: str) -> list[str]:
    """Split one paragraph of prose into sentences by the rules in this module's docstring.

    Args:
        text: a paragraph; line breaks inside it count as spaces.

    Returns:
        The sentences, stripped of surrounding white space; empty ones are dropped.

    Example:
        >>> split_sentences('Mr. Smith went to Washington. He arrived at 3.30 p.m. "Good," he said.')
        ['Mr. Smith went to Washington.', 'He arrived at 3.30 p.m. "Good," he said.']
    """
    sentences: list[str] = []
    start = 0
    n = len(text)
    for m in _CANDIDATE.finditer(text):
        end = m.end()
        nxt = end
        while nxt < n and text[nxt].isspace():
            nxt += 1
        if nxt >= n:
            break  # the rest is the last sentence
        if _is_boundary(text, m.start(), m.group(1), text[nxt]):
            piece = text[start:end].strip()
            if piece:
                sentences.append(" ".join(piece.split()))
            start = nxt
    piece = text[start:].strip()
    if piece:
        sentences.append(" ".join(piece.split()))
    return sentences


def ends_sentence(line: str) -> bool:
    """Whether ``line`` ends with sentence-final punctuation, possibly followed by closing quotes or brackets."""
    stripped = line.rstrip().rstrip(_CLOSERS)
    return bool(stripped) and stripped[-1] in _TERMINALS


def split_paragraphs(text: str) -> list[str]:
    """Blocks of text separated by blank lines (lines of white space count as blank), stripped, non-empty."""
    return [p.strip() for p in _BLANK_LINE.split(text.replace("\r\n", "\n")) if p.strip()]
