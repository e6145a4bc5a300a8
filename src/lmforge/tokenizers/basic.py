"""BERT's basic pre-tokenizer: clean, normalise and split text into words, keeping character offsets.

The behaviour is that of BERT's ``BasicTokenizer`` (Devlin et al., 2019) as implemented by the Rust
``BertNormalizer`` + ``BertPreTokenizer`` that ``transformers.BertTokenizerFast`` uses, in this order:

1. clean: drop NUL, U+FFFD and control/format/private-use characters (Unicode categories Cc, Cf, Co, Cs,
   except tab, newline and carriage return); every other white-space character separates words;
2. put spaces around CJK ideographs (each becomes a word of its own);
3. strip accents (NFD, then drop non-spacing marks, category Mn) — on by default when lower-casing;
4. lower-case, one character at a time (no context-dependent rules such as the Greek final sigma);
5. split on white space, and isolate each punctuation character (ASCII symbols and Unicode P*).

How it is computed: a single compiled regular expression splits the *original* text into raw words,
punctuation characters and CJK characters, so every raw word's character offsets come for free. Each
distinct raw word is then normalised once (``analyze``), character by character with an alignment back to
the original characters, and re-split in the rare case where normalisation itself produced a separator
(U+1FEF GREEK VARIA decomposes to the ASCII back-tick, for example). The result is cached by raw word, so
the per-text cost is one regex scan plus dictionary look-ups.

Deviation (documented, not tested): character categories come from Python's ``unicodedata`` (Unicode 14
on Python 3.11), while the Rust tokenizers crate uses older tables; characters assigned since Unicode 8
can be classified differently. Canonical re-ordering of combining marks is not applied across characters
(it only matters for marks that accent stripping removes anyway).
"""

from __future__ import annotations

import re
import sys
import unicodedata
from functools import lru_cache

# White space that separates words. Controls that are also White_Space in Unicode (\x0b, \x0c, \x1c-\x1f,
# \x85) are *removed* by cleaning before the split, so they glue their neighbours, as in BERT.
WHITESPACE = "\t\n\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
             "\u2028\u2029\u202f\u205f\u3000"

# CJK Unified Ideographs blocks, as in BERT's _is_chinese_char (Hangul, Hiragana and Katakana are not here).
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)

_REMOVED_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs"})


def is_punctuation(ch: str) -> bool:
    """ASCII symbols (``!`` to ``/``, ``:`` to ``@``, ``[`` to `````, ``{`` to ``~``) and Unicode P*."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


def is_removed(ch: str) -> bool:
    """Characters that cleaning deletes: NUL, U+FFFD and Cc/Cf/Co/Cs except tab, newline, return."""
    if ch in "\t\n\r":
        return False
    return ch == "\x00" or ch == "\ufffd" or unicodedata.category(ch) in _REMOVED_CATEGORIES


def _ranges_to_class(codepoints: list[int]) -> str:
    """Turn sorted code points into the body of a regex character class using ranges."""
    parts: list[str] = []
    i = 0
    while i < len(codepoints):
        j = i
        while j + 1 < len(codepoints) and codepoints[j + 1] == codepoints[j] + 1:
            j += 1
        lo, hi = re.escape(chr(codepoints[i])), re.escape(chr(codepoints[j]))
        parts.append(lo if i == j else f"{lo}-{hi}")
        i = j + 1
    return "".join(parts)


@lru_cache(maxsize=1)
def _punctuation_codepoints() -> tuple[int, ...]:
    # One scan of the code space (about 0.25 s, once per process).
    return tuple(cp for cp in range(sys.maxunicode + 1) if is_punctuation(chr(cp)))


@lru_cache(maxsize=2)
def word_pattern(tokenize_chinese_chars: bool = True) -> re.Pattern[str]:
    """Regex whose matches are the raw words of a text: one isolated character (punctuation, and CJK when
    enabled) or a maximal run of other non-white-space characters.

    Only characters of the Basic Multilingual Plane are isolated here: a character class made only of BMP
    code points compiles to a constant-time bitmap, while one astral code point turns it into a linear
    list of ranges (about 9x slower on English text). ``BasicTokenizer.analyze`` splits off the few astral
    punctuation and CJK characters (U+10100..., U+20000...) instead.
    """
    isolated = list(_punctuation_codepoints())
    if tokenize_chinese_chars:
        isolated += [cp for lo, hi in CJK_RANGES for cp in range(lo, hi + 1)]
    iso = _ranges_to_class(sorted({cp for cp in isolated if cp <= 0xFFFF}))
    ws = re.escape(WHITESPACE)
    return re.compile(f"[{iso}]|[^{iso}{ws}]+")


class BasicTokenizer:
    """Normalise and split text the way BERT does, with character offsets into the original text.

    Args:
        lowercase: lower-case the text (BERT "uncased").
        strip_accents: remove accents (NFD, drop Mn). ``None`` follows ``lowercase``, as in BERT.
        tokenize_chinese_chars: make each CJK ideograph a word of its own.
    """

    def __init__(self, lowercase: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True) -> None:
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.pattern = word_pattern(tokenize_chinese_chars)
        self._char_cache: dict[str, str] = {}

    def normalize_char(self, ch: str) -> str:
        """The normalised form of one original character (possibly empty or several characters)."""
        out = self._char_cache.get(ch)
        if out is None:
            if is_removed(ch):
                out = ""
            elif ch in WHITESPACE:
                out = " "
            else:
                out = ch
                if self.strip_accents:
                    out = "".join(c for c in unicodedata.normalize("NFD", out)
                                  if unicodedata.category(c) != "Mn")
                if self.lowercase:
                    out = out.lower()
            self._char_cache[ch] = out
        return out

    def analyze(self, raw: str) -> list[tuple[str, list[tuple[int, int]]]]:
        """Normalise one raw word (a regex match) into the words BERT would see.

        Returns:
            A list of ``(word, alignment)``: the normalised word and, for each of its characters, the
            ``(start, end)`` span of the original character it came from, relative to the raw word.
            Usually one entry; none when the raw word is made only of removed characters.
        """
        if raw.isascii() and raw.isalnum():
            # Fast path for the common case: one word, one original character per normalised character.
            word = raw.lower() if self.lowercase else raw
            return [(word, [(i, i + 1) for i in range(len(raw))])]
        # Groups of normalised characters with their original spans; an astral isolated character (which
        # the regex leaves inside raw words) forms a group of its own.
        groups: list[tuple[list[str], list[tuple[int, int]]]] = [([], [])]
        for pos, ch in enumerate(raw):  # offsets are in code points, like the Python API of tokenizers
            out = self.normalize_char(ch)
            if ord(ch) > 0xFFFF and (is_punctuation(ch) or (self.tokenize_chinese_chars and is_cjk(ch))):
                groups.append((list(out), [(pos, pos + 1)] * len(out)))
                groups.append(([], []))
                continue
            chars, align = groups[-1]
            for out_ch in out:
                chars.append(out_ch)
                align.append((pos, pos + 1))
        # Re-split: normalisation can yield white space or punctuation (rare; see the module docstring).
        words: list[tuple[str, list[tuple[int, int]]]] = []
        for chars, align in groups:
            cur: list[str] = []
            cur_align: list[tuple[int, int]] = []
            for ch, span in zip(chars, align, strict=True):
                if ch in WHITESPACE or is_punctuation(ch):
                    if cur:
                        words.append(("".join(cur), cur_align))
                    if ch not in WHITESPACE:
                        words.append((ch, [span]))
                    cur, cur_align = [], []
                else:
                    cur.append(ch)
                    cur_align.append(span)
            if cur:
                words.append(("".join(cur), cur_align))
        return words

    def tokenize(self, text: str) -> list[str]:
        """The normalised words of ``text``."""
        return [w for raw in self.pattern.findall(text) for w, _ in self.analyze(raw)]

    def tokenize_with_offsets(self, text: str) -> list[tuple[str, int, int]]:
        """The normalised words of ``text`` with their ``(start, end)`` character span in ``text``."""
        out: list[tuple[str, int, int]] = []
        for m in self.pattern.finditer(text):
            base = m.start()
            for word, align in self.analyze(m.group()):
                out.append((word, base + align[0][0], base + align[-1][1]))
        return out

    def normalize(self, text: str) -> str:
        """The normalised text as BERT sees it: words joined by single spaces."""
        return " ".join(self.tokenize(text))
