"""SentencePiece's Unigram tokenizer (Kudo, 2018; Kudo & Richardson, 2018), read from a Hugging Face
``tokenizer.json`` and encoding exactly as the ``tokenizers`` package does (ALBERT, XLNet, T5 and many Hub models).

The unigram language model (Kudo, 2018, "Subword Regularization") gives each vocabulary piece a log-probability;
a word's segmentation is the one whose pieces' scores sum highest. SentencePiece (Kudo & Richardson, 2018) treats
the text as a raw character stream in which a space is the visible "▁" (U+2581), so decoding is lossless.

Encoding one text follows the ``tokenizers`` pipeline step by step:

1. Added tokens written in the raw text ([CLS], <unk> ...) are cut out; each is one token. ``lstrip`` / ``rstrip``
   tokens take the white space beside them along, ``single_word`` ones match only between non-word characters.
2. Each remaining piece is normalised (``normalizer``): NFC / NFD / NFKC / NFKD, Lowercase, StripAccents (drops
   marks), Replace, Strip, Prepend, and SentencePiece's ``Precompiled`` rewrite map (below). Every normalised
   character remembers the span of the input it came from, by the rules of ``tokenizers``' NormalizedString, so
   token offsets point into the input text as the reference's do. Added tokens with ``normalized: true`` are then
   cut out of the normalised text.
3. The pre-tokenizer splits the pieces: Metaspace turns spaces into "▁", puts one "▁" in front (``prepend_scheme``
   "always"; "first": only at the start of the text; "never") and, with ``split``, cuts before every "▁";
   WhitespaceSplit cuts at white space and drops it.
4. Each split is segmented by Viterbi: ``best[j] = max over pieces s[i:j] of best[i] + score(piece)``, positions
   taken left to right, so on a tie the piece that starts first (the longer last piece) wins, as in
   ``tokenizers``. A character that is no one-character piece of the vocabulary may also be read as the unknown
   piece, with score ``lowest score - 10``; consecutive unknowns are fused into one unknown token. With
   ``byte_fallback`` an unknown stretch becomes its UTF-8 bytes as ``<0xXX>`` pieces instead, when the vocabulary
   has all of them. Splits are cached, so a text's common words cost a dictionary look-up.
5. The post-processor (TemplateProcessing) adds the special tokens and type ids of the single or pair template.

``Precompiled`` holds SentencePiece's compiled normalisation rules (its ``nmt_nfkc`` map): a little-endian uint32
trie size, a Darts-clone double-array trie over UTF-8 bytes (32-bit units: label in bits 0-7 and 31, has-leaf flag
in bit 8, child offset in bits 10-30, shifted by 8 when bit 9 is set), then NUL-terminated replacement strings that
the leaf values index. ``tokenizers`` applies it per grapheme cluster: a cluster shorter than 6 bytes is replaced
whole when its bytes start with a key (the first, shortest key found), otherwise each character is replaced by its
own entry or kept. (SentencePiece's own normaliser takes the longest key at each byte position instead; the two
agree on maps whose keys are single characters.) Grapheme clusters are approximated with the standard library:
a character joins the previous one when it is a mark (Mn, Mc, Me), a zero-width (non-)joiner, an emoji modifier or
a tag and the previous one is no control character, when the previous one is a prepended concatenation mark, or when
it is a line feed after a carriage return; clusters that Unicode forms otherwise (Hangul syllable sequences,
regional-indicator pairs, emoji ZWJ sequences) are 6 bytes or longer, which ``tokenizers`` handles per character
anyway.

Decoding maps ids to pieces and runs the ``decoder`` (Metaspace: "▁" back to a space, the first token's dropped;
ByteFallback, Fuse, Replace, Strip and Sequences of them).

Known limits (the reference's Unicode tables are its own): NFx use Python's ``unicodedata`` where ``tokenizers``
has Unicode 9 tables, so characters added since can normalise differently; regular-expression patterns of Replace
are read only when they are literal characters with quantifiers (such as SentencePiece converters' ``" {2,}"``).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import struct
import unicodedata
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers.hf_json import TOKENIZER_JSON, _read, tokenizer_json_path
from lmforge.tokenizers.wordpiece import ModelInputs, _as_list, _as_rows
from lmforge.utils.io import atomic_write_bytes, check_can_write

log = logging.getLogger("lmforge")
UNK_PENALTY = 10.0  # an unknown character scores (lowest piece score - 10), as in SentencePiece
# Unicode's White_Space property (Rust's char::is_whitespace); Python's str.isspace adds U+001C..U+001F.
WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                       "\u200a\u2028\u2029\u202f\u205f\u3000")
_SAFE_REGEX = re.compile(r"(?:(?:[^\\^$.|?*+()\[\]{}]|\\[^A-Za-z0-9])(?:[?*+]|\{\d+(?:,\d*)?\})?)+")
Span = tuple[int, int]
_Template = list[tuple[str, Any, int]]  # ("A" | "B" | "special", special ids, type id) per item


# ---------------------------------------------------------------------------------------------------- aligned text
class _Text:
    """A piece of text being normalised: its characters, the input span each came from, and where it starts.

    ``start`` is the input offset the piece was cut at (``tokenizers``' ``original_shift``); Metaspace's "first"
    scheme prepends only when it is 0.
    """

    __slots__ = ("chars", "spans", "start")

    def __init__(self, chars: list[str], spans: list[Span], start: int) -> None:
        self.chars, self.spans, self.start = chars, spans, start

    @classmethod
    def of(cls, text: str, start: int = 0) -> _Text:
        return cls(list(text), [(start + i, start + i + 1) for i in range(len(text))], start)

    def __str__(self) -> str:
        return "".join(self.chars)

    def slice(self, i: int, j: int) -> _Text:
        return _Text(self.chars[i:j], self.spans[i:j], self.spans[i][0])

    def keep(self, keep: Callable[[str], bool]) -> None:
        """Drop characters; the others keep their spans."""
        kept = [(c, s) for c, s in zip(self.chars, self.spans, strict=True) if keep(c)]
        self.chars, self.spans = [c for c, _ in kept], [s for _, s in kept]

    def transform(self, dest: list[tuple[str, int]], skip: int = 0) -> None:
        """Rewrite the text as ``(char, change)`` pairs, by ``tokenizers``' alignment rule: change 0 replaces the
        next input character (and takes its span), -n also removes the n characters after it, 1 is inserted and
        takes the span of the character before it. ``skip`` characters at the start are removed first."""
        pos, chars, spans = skip, [], []
        for c, change in dest:
            if change > 0:
                spans.append(self.spans[pos - 1] if pos > 0 else (self.start, self.start))
            else:
                spans.append(self.spans[pos])
                pos += 1 - change
            chars.append(c)
        self.chars, self.spans = chars, spans

    def split(self, is_delimiter: Callable[[str], bool], merge_with_next: bool) -> list[_Text]:
        """Cut at each delimiter character: removed, or (``merge_with_next``) starting the part after it, as
        ``tokenizers``' MergedWithNext (of a run of delimiters only the last joins the next part)."""
        parts: list[tuple[int, int, bool]] = []  # (start, end, is delimiter): delimiters one each, others in runs
        for i, c in enumerate(self.chars):
            delim = is_delimiter(c)
            if not delim and parts and not parts[-1][2]:
                parts[-1] = (parts[-1][0], i + 1, False)
            else:
                parts.append((i, i + 1, delim))
        if merge_with_next:
            merged: list[tuple[int, int, bool]] = []
            following_is_delim = False
            for start, end, delim in reversed(parts):
                if delim and not following_is_delim and merged:
                    merged[-1] = (start, merged[-1][1], False)
                else:
                    merged.append((start, end, False))
                following_is_delim = delim
            parts = merged[::-1]
        return [self.slice(i, j) for i, j, delim in parts if not delim and j > i]


# ---------------------------------------------------------------------------------------------------- normalizers
@lru_cache(maxsize=65536)
def _decomposition(c: str, compat: bool) -> str:
    return unicodedata.normalize("NFKD" if compat else "NFD", c)


@lru_cache(maxsize=65536)
def _compose(a: str, b: str) -> str | None:
    """The primary composite of a starter and the next character, if any."""
    s = unicodedata.normalize("NFC", a + b)
    return s if len(s) == 1 else None


def _decompose(chars: list[str], compat: bool) -> list[tuple[str, int]]:
    """Full decomposition with canonical reordering: a character's first part replaces it (change 0), the others
    are inserted (1); runs of combining marks are stably sorted by combining class, changes travelling along."""
    out: list[tuple[str, int]] = []
    pending: list[tuple[int, str, int]] = []
    for c in chars:
        for k, d in enumerate(_decomposition(c, compat)):
            ccc = unicodedata.combining(d)
            if ccc == 0 and pending:
                pending.sort(key=lambda p: p[0])
                out += [(ch, change) for _, ch, change in pending]
                pending = []
            pending.append((ccc, d, 0 if k == 0 else 1))
    pending.sort(key=lambda p: p[0])
    return out + [(ch, change) for _, ch, change in pending]


def _recompose(items: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Canonical composition of a decomposed stream: a mark that composes with the last starter merges into it
    (the change values add up, less one per merge); blocked marks wait and follow the starter."""
    out: list[tuple[str, int]] = []
    starter: tuple[str, int] | None = None
    blocked: list[tuple[str, int]] = []
    last_ccc: int | None = None
    for ch, change in items:
        ccc = unicodedata.combining(ch)
        if starter is None:
            if ccc:
                out.append((ch, change))
            else:
                starter = (ch, change)
            continue
        if last_ccc is None or last_ccc < ccc:
            composite = _compose(starter[0], ch)
            if composite is not None:
                starter = (composite, starter[1] + change - 1)
                continue
        if ccc == 0:
            out += [starter, *blocked]
            starter, blocked, last_ccc = (ch, change), [], None
        else:
            blocked.append((ch, change))
            last_ccc = ccc
    return out + ([starter] if starter is not None else []) + blocked


def _unicode_form(form: str) -> Callable[[_Text], None]:
    compat, compose = form.startswith("NFK"), form in ("NFC", "NFKC")

    def normalize(text: _Text) -> None:
        if unicodedata.is_normalized(form, str(text)):
            return
        dest = _decompose(text.chars, compat)
        text.transform(_recompose(dest) if compose else dest)
    return normalize


def _lowercase(text: _Text) -> None:
    s = str(text)
    if s.lower() != s:  # character by character, as Rust's char::to_lowercase (no final-sigma rule)
        text.transform([(lc, int(k > 0)) for c in text.chars for k, lc in enumerate(c.lower())])


def _strip_accents(text: _Text) -> None:
    text.keep(lambda c: unicodedata.category(c)[0] != "M")


def _strip(left: bool, right: bool) -> Callable[[_Text], None]:
    def normalize(text: _Text) -> None:
        i, j = 0, len(text.chars)
        while left and i < j and text.chars[i] in WHITESPACE:
            i += 1
        while right and j > i and text.chars[j - 1] in WHITESPACE:
            j -= 1
        text.chars, text.spans = text.chars[i:j], text.spans[i:j]
    return normalize


def _prepend(prefix: str) -> Callable[[_Text], None]:
    def normalize(text: _Text) -> None:
        if text.chars:  # every prepended character takes the span of the first one
            text.chars, text.spans = [*prefix, *text.chars], [text.spans[0]] * len(prefix) + text.spans
    return normalize


def _replace(pattern: re.Pattern[str], content: str) -> Callable[[_Text], None]:
    def normalize(text: _Text) -> None:
        s = str(text)
        chars: list[str] = []
        spans: list[Span] = []
        last = 0
        for m in pattern.finditer(s):  # the new characters take the span of the last one replaced
            chars += text.chars[last:m.start()]
            spans += text.spans[last:m.start()]
            chars += content
            spans += [text.spans[m.end() - 1]] * len(content)
            last = m.end()
        if last:
            text.chars, text.spans = chars + text.chars[last:], spans + text.spans[last:]
    return normalize


class CharsMap:
    """SentencePiece's ``precompiled_charsmap``: a Darts-clone double-array trie of UTF-8 keys whose leaf values
    index NUL-terminated replacement strings (see the module docstring). An empty map changes nothing."""

    def __init__(self, blob: bytes) -> None:
        self.units: tuple[int, ...] = ()
        self.strings = b""
        if blob:
            if len(blob) < 4:
                raise ValueError("shorter than its 4-byte header")
            (size,) = struct.unpack_from("<I", blob)
            if size % 4 or 4 + size > len(blob):
                raise ValueError(f"its trie size {size} does not fit its {len(blob)} bytes")
            self.units = struct.unpack_from(f"<{size // 4}I", blob, 4)
            self.strings = blob[4 + size:]
            self.strings.decode("utf-8")

    @staticmethod
    def _offset(unit: int) -> int:
        return (unit >> 10) << ((unit & (1 << 9)) >> 6)

    def prefix_values(self, key: bytes) -> list[int]:
        """Leaf values of the keys that are prefixes of ``key``, shortest first (Darts' commonPrefixSearch)."""
        units, out = self.units, []
        if not units:
            return out
        pos = self._offset(units[0])
        for byte in key:
            if byte == 0:
                break
            pos ^= byte
            unit = units[pos] if pos < len(units) else 0
            if unit & ((1 << 31) | 0xFF) != byte:  # bit 31 marks value units, which no byte matches
                break
            pos ^= self._offset(unit)
            if unit >> 8 & 1 and pos < len(units):  # has a leaf: its value sits at the child labelled 0
                out.append(units[pos] & ((1 << 31) - 1))
        return out

    def lookup(self, chunk: str) -> str | None:
        """The replacement of the first (shortest) key that ``chunk`` starts with, as ``tokenizers`` looks up."""
        values = self.prefix_values(chunk.encode("utf-8"))
        if not values:
            return None
        end = self.strings.find(b"\0", values[0])
        return self.strings[values[0]:end if end >= 0 else None].decode("utf-8", errors="replace")


def _is_extend(c: str) -> bool:
    cp = ord(c)
    return (unicodedata.category(c)[0] == "M" or c in "\u200c\u200d" or 0x1F3FB <= cp <= 0x1F3FF
            or 0xE0020 <= cp <= 0xE007F)


_PREPEND = frozenset("\u0600\u0601\u0602\u0603\u0604\u0605\u06dd\u070f\u0890\u0891\u08e2\U000110bd\U000110cd")


def _joins_previous(prev: str, c: str) -> bool:
    """Whether ``c`` continues the grapheme cluster of ``prev`` (UAX #29 in part: see the module docstring)."""
    def control(ch: str) -> bool:
        category = unicodedata.category(ch)
        return category in ("Cc", "Zl", "Zp") or (category == "Cf" and not _is_extend(ch) and ch not in _PREPEND)

    if prev == "\r":
        return c == "\n"
    if control(prev) or control(c):
        return False
    return _is_extend(c) or prev in _PREPEND


def _precompiled(charsmap: CharsMap) -> Callable[[_Text], None]:
    def normalize(text: _Text) -> None:
        clusters: list[list[str]] = []
        for c in text.chars:
            if clusters and _joins_previous(clusters[-1][-1], c):
                clusters[-1].append(c)
            else:
                clusters.append([c])
        dest: list[tuple[str, int]] = []
        modified = False

        def replace(old: int, new: str) -> None:  # tokenizers' rule: extra characters inserted, fewer remove
            dest.extend((c, 0) for c in new)
            diff = len(new) - old
            if diff > 0:
                dest[len(dest) - diff:] = [(c, 1) for c, _ in dest[len(dest) - diff:]]
            elif diff < 0 and dest:
                dest[-1] = (dest[-1][0], dest[-1][1] + diff)

        for cluster in clusters:
            whole = "".join(cluster)
            new = charsmap.lookup(whole) if len(whole.encode("utf-8")) < 6 else None
            if new is not None:
                replace(len(cluster), new)
                modified = True
                continue
            for c in cluster:
                new = charsmap.lookup(c)
                if new is None:
                    dest.append((c, 0))
                else:
                    replace(1, new)
                    modified = True
        if modified:
            text.transform(dest)
    return normalize


# ---------------------------------------------------------------------------------------------------- reading the file
class _Reader:
    """Turns the JSON parts of a ``tokenizer.json`` into steps, with errors that name the file and the part."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, what: str) -> InputFileError:
        return InputFileError(f"{self.path}: {what}")

    def field(self, node: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str,
              default: Any = ...) -> Any:
        if key not in node and default is not ...:
            return default
        value = node.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(f"{where}: \"{key}\" must be a {getattr(kind, '__name__', 'value')}, got {value!r:.60}; "
                            "save the tokenizer again with the tokenizers package")
        return value

    def typed(self, node: Any, where: str) -> str:
        if not isinstance(node, dict) or not isinstance(node.get("type"), str):
            raise self.fail(f"{where} {node!r:.60} is not an object with a \"type\"; the file is damaged: save the "
                        "tokenizer again with the tokenizers package")
        return node["type"]

    def normalizer(self, node: Any) -> list[Callable[[_Text], None]]:
        if node is None:
            return []
        kind = self.typed(node, "normalizer")
        where = f"normalizer {kind}"
        if kind == "Sequence":
            return [step for inner in self.field(node, "normalizers", list, where) for step in self.normalizer(inner)]
        if kind in ("NFC", "NFD", "NFKC", "NFKD"):
            return [_unicode_form(kind)]
        if kind == "Lowercase":
            return [_lowercase]
        if kind == "StripAccents":
            return [_strip_accents]
        if kind == "Strip":
            return [_strip(bool(node.get("strip_left", True)), bool(node.get("strip_right", True)))]
        if kind == "Prepend":
            return [_prepend(self.field(node, "prepend", str, where))]
        if kind == "Replace":
            return [_replace(self.pattern(node, where), self.field(node, "content", str, where))]
        if kind == "Precompiled":
            raw = node.get("precompiled_charsmap")
            if raw is None or raw == "":
                return []
            if not isinstance(raw, str):
                raise self.fail(f"{where}: precompiled_charsmap must be a base64 string, got {raw!r:.40}")
            try:
                charsmap = CharsMap(base64.b64decode(raw, validate=True))
            except ValueError as err:  # binascii.Error, struct.error, UnicodeDecodeError are ValueErrors
                raise self.fail(f"{where}: the precompiled_charsmap is damaged ({err}); save the tokenizer again "
                                "from its SentencePiece model") from None
            return [_precompiled(charsmap)] if charsmap.units else []
        raise self.fail(f"a {kind} normalizer, which lmforge's Unigram tokenizer cannot apply (it reads Sequence, "
                        "NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Replace, Strip, Prepend and Precompiled); "
                        "keep using this file with the tokenizers package")

    def pattern(self, node: dict[str, Any], where: str) -> re.Pattern[str]:
        pattern = node.get("pattern")
        if isinstance(pattern, dict) and isinstance(pattern.get("String"), str) and pattern["String"]:
            return re.compile(re.escape(pattern["String"]))
        if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
            regex = pattern["Regex"]
            if not _SAFE_REGEX.fullmatch(regex) or re.fullmatch(regex, ""):
                raise self.fail(f"{where}: the regular expression {regex!r:.60} is not one lmforge reads exactly as "
                                "the tokenizers package (Oniguruma) does; only literal characters with quantifiers "
                                "such as \" {2,}\" are; keep using this file with the tokenizers package")
            return re.compile(regex)
        raise self.fail(f"{where}: \"pattern\" must be {{\"String\": text}} or {{\"Regex\": pattern}}, got "
                        f"{pattern!r:.60}")

    def pre_tokenizer(self, node: Any) -> list[Callable[[_Text], list[_Text]]]:
        if node is None:
            return []
        kind = self.typed(node, "pre_tokenizer")
        where = f"pre_tokenizer {kind}"
        if kind == "Sequence":
            return [s for inner in self.field(node, "pretokenizers", list, where) for s in self.pre_tokenizer(inner)]
        if kind == "WhitespaceSplit":
            return [lambda text: text.split(WHITESPACE.__contains__, merge_with_next=False)]
        if kind == "Metaspace":
            replacement = self.field(node, "replacement", str, where)
            if len(replacement) != 1:
                raise self.fail(f"{where}: the replacement {replacement!r:.20} must be one character")
            scheme = self.field(node, "prepend_scheme", str, where, None)
            if scheme is None:
                scheme = "always" if node.get("add_prefix_space", True) else "never"
            if scheme not in ("always", "first", "never"):
                raise self.fail(f"{where}: prepend_scheme {scheme!r:.30} is not one of always, first, never")
            return [_metaspace(replacement, scheme, bool(self.field(node, "split", bool, where, True)))]
        raise self.fail(f"a {kind} pre-tokenizer, which lmforge's Unigram tokenizer cannot apply (it reads Metaspace, "
                        "WhitespaceSplit and Sequences of them); keep using this file with the tokenizers package")

    def decoder(self, node: Any) -> tuple[list[Callable[[list[str]], list[str]]] | None, str]:
        """The decoding steps (None: joined by spaces, as ``tokenizers`` does without a decoder), or a problem."""
        if node is None:
            return None, ""
        kind = node.get("type") if isinstance(node, dict) else None
        if kind == "Sequence" and isinstance(node.get("decoders"), list):
            steps: list[Callable[[list[str]], list[str]]] = []
            for inner in node["decoders"]:
                more, problem = self.decoder(inner)
                if problem or more is None:
                    return None, problem or "a null decoder inside a Sequence"
                steps += more
            return steps, ""
        if kind == "Metaspace" and isinstance(node.get("replacement"), str):
            scheme = node.get("prepend_scheme") or ("always" if node.get("add_prefix_space", True) else "never")
            return [_metaspace_decoder(node["replacement"], scheme != "never")], ""
        if kind == "ByteFallback":
            return [_byte_fallback_decoder], ""
        if kind == "Fuse":
            return [lambda tokens: ["".join(tokens)]], ""
        if kind == "Replace" and isinstance(node.get("content"), str):
            try:
                pattern, content = self.pattern(node, "decoder Replace"), node["content"]
            except InputFileError as err:
                return None, str(err)
            return [lambda tokens: [pattern.sub(lambda _: content, t) for t in tokens]], ""
        if kind == "Strip" and all(type(node.get(k)) is int for k in ("start", "stop")) \
                and isinstance(node.get("content"), str):
            return [_strip_decoder(node["content"], node["start"], node["stop"])], ""
        return None, f"{self.path}: a {kind or 'malformed'} decoder, which lmforge cannot apply"


def _metaspace(rep: str, scheme: str, split: bool) -> Callable[[_Text], list[_Text]]:
    def pre_tokenize(text: _Text) -> list[_Text]:
        text.chars = [rep if c == " " else c for c in text.chars]  # a space's "▁" keeps the space's span
        if text.chars[0] != rep and (scheme == "always" or (scheme == "first" and text.start == 0)):
            text.chars, text.spans = [rep, *text.chars], [text.spans[0], *text.spans]
        return text.split(rep.__eq__, merge_with_next=True) if split else [text]
    return pre_tokenize


def _metaspace_decoder(rep: str, drop_first: bool) -> Callable[[list[str]], list[str]]:
    def decode(tokens: list[str]) -> list[str]:
        return [t.replace(rep, "" if i == 0 and drop_first else " ") for i, t in enumerate(tokens)]
    return decode


def _byte_fallback_decoder(tokens: list[str]) -> list[str]:
    out: list[str] = []
    pending = bytearray()

    def flush() -> None:
        if pending:
            try:
                out.append(pending.decode("utf-8"))
            except UnicodeDecodeError:
                out.extend("\ufffd" * len(pending))
            pending.clear()

    for t in tokens:
        m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", t)
        if m:
            pending.append(int(m.group(1), 16))
        else:
            flush()
            out.append(t)
    flush()
    return out


def _strip_decoder(content: str, start: int, stop: int) -> Callable[[list[str]], list[str]]:
    def decode(tokens: list[str]) -> list[str]:
        out = []
        for t in tokens:
            i = 0
            while i < min(start, len(t)) and t[i] == content:
                i += 1
            j, n = len(t), 0
            while n < stop and j > i and t[j - 1] == content:
                j, n = j - 1, n + 1
            out.append(t[i:j])
        return out
    return decode


# ---------------------------------------------------------------------------------------------------- the tokenizer
class UnigramTokenizer(ModelInputs):
    """A SentencePiece Unigram tokenizer as described by a ``tokenizer.json`` (see the module docstring).

    Build it with ``UnigramTokenizer.from_pretrained(folder_or_file)`` or ``lmforge.tokenizers.hf_json.
    from_tokenizer_json``; it offers the interface of lmforge's WordPiece and byte-level BPE tokenizers.

    Args:
        data: the parsed ``tokenizer.json`` (its ``model`` of type ``Unigram``).
        source: the file it came from, named in error messages.
        raw: the file's bytes, written back unchanged by ``save_pretrained`` (else ``data`` is written as JSON).
        model_max_length: the default ``max_length`` of truncation.

    Raises:
        InputFileError: a part of the file is malformed or cannot be applied exactly; the message names it.
    """

    def __init__(self, data: dict[str, Any], *, source: str | Path = TOKENIZER_JSON, raw: bytes | None = None,
                 model_max_length: int = 512) -> None:
        reader = _Reader(str(source))
        self.source, self._data, self._raw = str(source), data, raw
        model = data.get("model")
        if not isinstance(model, dict) or model.get("type") != "Unigram":
            raise reader.fail("not a Unigram model; read other tokenizer.json files with "
                              "lmforge.tokenizers.hf_json.from_tokenizer_json")
        self.pieces = self._read_pieces(reader, model)
        self.byte_fallback = bool(reader.field(model, "byte_fallback", bool, "model", False))
        unk = model.get("unk_id")
        if unk is not None and (type(unk) is not int or not 0 <= unk < len(self.pieces)):
            raise reader.fail(f"model: unk_id {unk!r:.30} is not the index of a piece of the {len(self.pieces):,} "
                              "in the vocabulary")
        self.unk_id: int | None = unk
        self._ids: dict[str, tuple[int, float]] = {}  # piece -> (id, score); a repeated piece keeps its last id
        for i, (piece, score) in enumerate(self.pieces):
            self._ids[piece] = (i, score)
        self._prefixes = {p[:k] for p in self._ids for k in range(1, len(p) + 1)}
        self._max_piece = max((len(p) for p in self._ids), default=1)
        self._unk_score = min((s for _, s in self.pieces), default=0.0) - UNK_PENALTY
        self.vocab: dict[str, int] = {piece: i for piece, (i, _) in self._ids.items()}
        self.ids_to_tokens: list[str | None] = [piece for piece, _ in self.pieces]
        self._normalizer = reader.normalizer(data.get("normalizer"))
        self.lowercase = _lowercase in self._normalizer  # whether encoding lower-cases (decode gives lower case)
        self._read_added(reader, data.get("added_tokens"))
        self._pre_tokenizer = reader.pre_tokenizer(data.get("pre_tokenizer"))
        self._single, self._pair = self._read_template(reader, data.get("post_processor"))
        self._decoder, self._decoder_problem = reader.decoder(data.get("decoder"))
        self.model_max_length = model_max_length
        self._cache: dict[str, tuple[tuple[int, int, int], ...]] = {}
        self.cache_size = 200_000
        self._set_roles()

    # ------------------------------------------------------------------ reading
    @staticmethod
    def _read_pieces(reader: _Reader, model: dict[str, Any]) -> list[tuple[str, float]]:
        vocab = model.get("vocab")
        if not isinstance(vocab, list) or not vocab:
            raise reader.fail("model: the Unigram vocabulary must be a non-empty list of [piece, score] pairs")
        pieces = []
        for i, entry in enumerate(vocab):
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and isinstance(entry[1], int | float) and not isinstance(entry[1], bool)):
                raise reader.fail(f"model: vocabulary entry {i} ({entry!r:.60}) is not a [piece, score] pair")
            pieces.append((entry[0], float(entry[1])))
        return pieces

    def _read_added(self, reader: _Reader, added: Any) -> None:
        """``added_tokens``: pieces cut out of the text before the model sees it; the special ones are the
        tokens that ``decode`` drops."""
        if added is None:
            added = []
        if not isinstance(added, list):
            raise reader.fail(f"added_tokens must be a list, got {added!r:.60}")
        self.added: list[dict[str, Any]] = []
        for entry in added:
            if not (isinstance(entry, dict) and type(entry.get("id")) is int and entry["id"] >= 0
                    and isinstance(entry.get("content"), str) and entry["content"]):
                raise reader.fail(f"added_tokens: {entry!r:.80} is not {{\"id\": n, \"content\": token, ...}}")
            token, i = entry["content"], entry["id"]
            if self.vocab.get(token, i) != i:
                raise reader.fail(f"added_tokens: {token!r:.40} has id {i}, but the vocabulary gives it "
                                  f"{self.vocab[token]}; the file is inconsistent")
            if i >= len(self.ids_to_tokens):
                self.ids_to_tokens += [None] * (i + 1 - len(self.ids_to_tokens))
            if self.ids_to_tokens[i] not in (None, token):
                raise reader.fail(f"added_tokens: {token!r:.40} has id {i}, which belongs to the piece "
                                  f"{self.ids_to_tokens[i]!r:.40}")
            self.ids_to_tokens[i] = token
            self.vocab[token] = i
            self.added.append({"id": i, "content": token, "special": bool(entry.get("special")),
                               "normalized": bool(entry.get("normalized", not entry.get("special"))),
                               **{k: bool(entry.get(k)) for k in ("lstrip", "rstrip", "single_word")}})
        self.special_tokens = [a["content"] for a in self.added if a["special"]]
        self.special_ids = frozenset(self.vocab[t] for t in self.special_tokens)
        self._added_by_content = {a["content"]: a for a in self.added}
        raw = [a["content"] for a in self.added if not a["normalized"]]
        self._raw_added = self._alternation(raw)
        normalized = []
        self._decoded_as: dict[int, str] = {}  # a normalised added token decodes to its normalised form
        for a in self.added:
            if a["normalized"]:
                text = _Text.of(a["content"])
                for step in self._normalizer:
                    step(text)
                if text.chars:
                    normalized.append(str(text))
                    self._added_by_content.setdefault(str(text), a)
                    self._decoded_as[a["id"]] = str(text)
        self._normalized_added = self._alternation(normalized)

    @staticmethod
    def _alternation(tokens: list[str]) -> re.Pattern[str] | None:
        """Leftmost-longest matcher of the tokens (longest first: Python's alternation takes the first that fits)."""
        tokens = sorted(set(tokens), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, tokens))) if tokens else None

    def _read_template(self, reader: _Reader, node: Any) -> tuple[_Template, _Template]:
        """The single and pair templates as ``("A" | "B" | "special", ids, type_id)`` items."""
        if node is None:
            return [("A", None, 0)], [("A", None, 0), ("B", None, 1)]
        kind = reader.typed(node, "post_processor")
        if kind != "TemplateProcessing":
            raise reader.fail(f"a {kind} post-processor, which lmforge's Unigram tokenizer cannot apply (it reads "
                              "TemplateProcessing); keep using this file with the tokenizers package")
        specials = reader.field(node, "special_tokens", dict, "post_processor")
        templates = []
        for name in ("single", "pair"):
            items = []
            for piece in reader.field(node, name, list, "post_processor"):
                kind_, body = next(iter(piece.items())) if isinstance(piece, dict) and len(piece) == 1 else ("", None)
                if not isinstance(body, dict) or type(body.get("type_id")) is not int:
                    raise reader.fail(f"post_processor {name}: {piece!r:.60} is not a Sequence or SpecialToken item")
                if kind_ == "Sequence" and body.get("id") in ("A", "B"):
                    items.append((body["id"], None, body["type_id"]))
                elif kind_ == "SpecialToken" and isinstance(specials.get(body.get("id")), dict):
                    ids = specials[body["id"]].get("ids")
                    if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < len(self.ids_to_tokens)
                                                            and self.ids_to_tokens[i] is not None for i in ids):
                        raise reader.fail(f"post_processor: the special token {body['id']!r:.40} has ids {ids!r:.40} "
                                          "outside the vocabulary")
                    items.append(("special", tuple(ids), body["type_id"]))
                else:
                    raise reader.fail(f"post_processor {name}: {piece!r:.60} names no sequence A or B nor a special "
                                      "token of \"special_tokens\"")
            sequences = sorted(kind_ for kind_, _, _ in items if kind_ != "special")
            if sequences != (["A"] if name == "single" else ["A", "B"]):
                raise reader.fail(f"post_processor: the {name} template must hold " +
                                  ("$A once" if name == "single" else "$A and $B once each"))
            templates.append(items)
        return templates[0], templates[1]

    def _set_roles(self) -> None:
        """Role tokens: [CLS] and [SEP] from the single template (the special token before / after $A), else by
        name; the others by name among the added tokens (ALBERT: [CLS] [SEP] <pad> [MASK] <unk>)."""
        def named(*names: str) -> str | None:
            return next((n for n in names if n in self._added_by_content and n in self.vocab), None)

        first_a = next(k for k, item in enumerate(self._single) if item[0] == "A")
        before = [ids for kind, ids, _ in self._single[:first_a] if kind == "special" and len(ids) == 1]
        after = [ids for kind, ids, _ in self._single[first_a + 1:] if kind == "special" and len(ids) == 1]
        self.cls_token = self.ids_to_tokens[before[0][0]] if before else named("[CLS]", "<cls>", "<s>")
        self.sep_token = self.ids_to_tokens[after[0][0]] if after else named("[SEP]", "<sep>", "</s>")
        padding = self._data.get("padding")  # tokenizers' padding settings, when the file has them
        padding = padding if isinstance(padding, dict) else {}
        self.padding_side = "left" if padding.get("direction") == "Left" else "right"
        self.pad_type_id = padding["pad_type_id"] if type(padding.get("pad_type_id")) is int else 0
        self.pad_token = padding.get("pad_token") if padding.get("pad_token") in self.vocab else named("<pad>", "[PAD]")
        self.mask_token = named("[MASK]", "<mask>")
        self.unk_token = None if self.unk_id is None else self.ids_to_tokens[self.unk_id]
        self.cls_id, self.sep_id, self.pad_id, self.mask_id = (
            None if t is None else self.vocab[t] for t in (self.cls_token, self.sep_token, self.pad_token,
                                                          self.mask_token))

    # ------------------------------------------------------------------ properties
    def __repr__(self) -> str:
        return f"UnigramTokenizer(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"

    # ------------------------------------------------------------------ the model
    def segment(self, s: str) -> tuple[tuple[int, int, int], ...]:
        """Viterbi segmentation of one pre-tokenized split: ``(id, start, end)`` per token (see the module
        docstring), unknown stretches fused (and spelled in bytes with ``byte_fallback``)."""
        cached = self._cache.get(s)
        if cached is not None:
            return cached
        n, ids, prefixes = len(s), self._ids, self._prefixes
        best, start_at, node = [0.0] * (n + 1), [-1] * (n + 1), [0] * (n + 1)
        for i in range(n):
            base, single = best[i], False
            for j in range(i + 1, min(n, i + self._max_piece) + 1):
                piece = s[i:j]
                if piece not in prefixes:
                    break
                hit = ids.get(piece)
                if hit is None:
                    continue
                score = base + hit[1]
                if start_at[j] < 0 or score > best[j]:
                    best[j], start_at[j], node[j] = score, i, hit[0]
                single = single or j == i + 1
            if not single:
                if self.unk_id is None:
                    raise LmforgeError(f"{self.source}: the text holds {s[i]!r}, which no piece covers, and the model "
                                       "has no unk_id; the tokenizers package refuses such text too")
                score = base + self._unk_score
                if start_at[i + 1] < 0 or score > best[i + 1]:
                    best[i + 1], start_at[i + 1], node[i + 1] = score, i, self.unk_id
        spans: list[tuple[int, int, bool]] = []  # (start, end, unknown), right to left, unknowns fused
        j = n
        while j > 0:
            i = start_at[j]
            unknown = node[j] == self.unk_id
            if unknown and spans and spans[-1][2]:
                spans[-1] = (i, spans[-1][1], True)
            else:
                spans.append((i, j, unknown))
            j = i
        out: list[tuple[int, int, int]] = []
        for i, j, _ in reversed(spans):  # each token's string looked up again, as tokenizers does
            hit = ids.get(s[i:j])
            if hit is not None:
                out.append((hit[0], i, j))
                continue
            byte_ids = [self.vocab.get(f"<0x{b:02X}>") for b in s[i:j].encode("utf-8")] if self.byte_fallback else []
            if byte_ids and None not in byte_ids:
                out += [(b, i, j) for b in byte_ids]  # type: ignore[misc]
            else:
                out.append((self.unk_id, i, j))  # type: ignore[arg-type]
        result = tuple(out)
        if len(self._cache) >= self.cache_size:
            self._cache.clear()
        self._cache[s] = result
        return result

    # ------------------------------------------------------------------ text level
    def _cut_added(self, text: _Text, matcher: re.Pattern[str] | None) -> list[tuple[_Text, int | None]]:
        """Cut the added tokens out of ``text``: ``(part, token id or None)`` in order (``tokenizers``' rules for
        ``single_word``, ``lstrip`` and ``rstrip``)."""
        s = str(text)
        if matcher is None or not s:  # cut all the same: the part starts where its first character came from
            return [(text.slice(0, len(s)), None)] if s else []
        out: list[tuple[_Text, int | None]] = []
        done = 0
        for m in matcher.finditer(s):
            token = self._added_by_content[m.group()]
            start, stop = m.start(), m.end()
            if token["single_word"] and ((start > 0 and re.match(r"\w", s[start - 1]))
                                         or (stop < len(s) and re.match(r"\w", s[stop]))):
                continue
            if token["lstrip"]:
                while start > done and s[start - 1] in WHITESPACE:
                    start -= 1
            if token["rstrip"]:
                while stop < len(s) and s[stop] in WHITESPACE:
                    stop += 1
            if start < done:  # an rstrip token took these characters already
                start = done
            if done < start:
                out.append((text.slice(done, start), None))
            out.append((text.slice(start, stop), token["id"]))
            done = stop
        if done < len(s):
            out.append((text.slice(done, len(s)), None))
        return out

    def _splits(self, text: str) -> list[tuple[_Text, int | None]]:
        """The text cut and normalised as ``tokenizers`` does: added tokens, normaliser, normalised added tokens,
        pre-tokenizer. Each part is a split (a "word") with its token id when it is an added token."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise LmforgeError(f"the text holds a lone surrogate {err.object[err.start]!r} (within "
                               f"{err.object!r:.60}), which is not a character; fix the text's decoding") from None
        parts: list[tuple[_Text, int | None]] = []
        for part, token in self._cut_added(_Text.of(text), self._raw_added):
            if token is not None:
                parts.append((part, token))
                continue
            for step in self._normalizer:
                step(part)
            parts += self._cut_added(part, self._normalized_added)
        out: list[tuple[_Text, int | None]] = []
        for part, token in parts:
            if token is not None:
                out.append((part, token))
                continue
            pieces = [part]
            for step in self._pre_tokenizer:
                pieces = [p for piece in pieces for p in step(piece) if p.chars]
            out += [(p, None) for p in pieces]
        return out

    def encode_text(self, text: str) -> tuple[list[int], list[Span], list[int]]:
        """Ids, character offsets and word indices of one text, without special tokens, equal to ``tokenizers``'
        ``ids``, ``offsets`` and ``word_ids``: a word is a split of the pre-tokenizer (Metaspace with ``split``:
        a white-space separated word, with the "▁" of the space before it, so its offsets cover that space; a run
        of spaces adds one-space words) or an added token. An unknown stretch's bytes share its offsets."""
        ids: list[int] = []
        offsets: list[Span] = []
        words: list[int] = []
        for w, (part, token) in enumerate(self._splits(text)):
            if token is not None:
                ids.append(token)
                offsets.append((part.spans[0][0], part.spans[-1][1]))
                words.append(w)
                continue
            spans = part.spans
            for piece, i, j in self.segment(str(part)):
                ids.append(piece)
                offsets.append((spans[i][0], spans[j - 1][1]))
                words.append(w)
        return ids, offsets, words

    def encode_ids(self, text: str) -> list[int]:
        """Piece ids of one text, without special tokens."""
        return [i for part, token in self._splits(text)
                for i in ([token] if token is not None else [t[0] for t in self.segment(str(part))])]

    def tokenize(self, text: str) -> list[str]:
        """The pieces of ``text`` (an unknown stretch shows as the unknown piece; ``tokenizers`` shows its text)."""
        return self.convert_ids_to_tokens(self.encode_ids(text))

    # ------------------------------------------------------------------ model inputs
    def num_special_tokens(self, pair: bool = False) -> int:
        """How many special tokens the template adds to one text (or to a pair)."""
        return sum(len(ids) for kind, ids, _ in (self._pair if pair else self._single) if kind == "special")

    def _assemble(self, a, b, return_offsets: bool, return_word_ids: bool) -> dict[str, list]:
        ids: list[int] = []
        types: list[int] = []
        offsets: list[Span] = []
        words: list[int | None] = []
        for kind, special, type_id in (self._single if b is None else self._pair):
            if kind == "special":
                ids += special
                offsets += [(0, 0)] * len(special)
                words += [None] * len(special)
                types += [type_id] * len(special)
            else:
                seq_ids, seq_offsets, seq_words = a if kind == "A" else b  # no details unless asked for
                ids += seq_ids
                offsets += seq_offsets or []
                words += seq_words or []
                types += [type_id] * len(seq_ids)
        row: dict[str, list] = {"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids)}
        if return_offsets:
            row["offsets"] = offsets
        if return_word_ids:
            row["word_ids"] = words
        return row

    # ------------------------------------------------------------------ decoding
    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in _as_list(ids):
            if not 0 <= i < len(self.ids_to_tokens) or self.ids_to_tokens[i] is None:
                raise LmforgeError(f"token id {i} is outside the vocabulary (size {self.vocab_size})")
            out.append(self.ids_to_tokens[i])
        return out

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        """Ids of pieces; a string that is not a piece maps to the unknown id (an error without one)."""
        out = []
        for t in tokens:
            i = self.vocab.get(t, self.unk_id)
            if i is None:
                raise LmforgeError(f"{t!r:.60} is not a piece of this vocabulary, which has no unknown token")
            out.append(i)
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Turn ids back into text as ``tokenizers`` does: pieces (special ones dropped when
        ``skip_special_tokens``), then the file's decoder (Metaspace: "▁" becomes a space, the first token's is
        dropped); without a decoder the pieces are joined by spaces.

        Raises:
            LmforgeError: the file's decoder is one lmforge cannot apply.
        """
        if self._decoder_problem:
            raise LmforgeError(f"{self._decoder_problem}; decode with the tokenizers package")
        pieces = zip(_as_list(ids), self.convert_ids_to_tokens(ids), strict=True)
        tokens = [self._decoded_as.get(i, t) for i, t in pieces if not (skip_special_tokens and i in self.special_ids)]
        if self._decoder is None:
            return " ".join(tokens)
        for step in self._decoder:
            tokens = step(tokens)
        return "".join(tokens)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = True) -> list[str]:
        """``decode`` of each row of a batch (a list of id lists, or a (B, T) tensor or array)."""
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in _as_rows(sequences)]

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> bytes:
        """The ``tokenizer.json`` content: the bytes it was read from, unchanged, else ``data`` as JSON."""
        if self._raw is not None:
            return self._raw
        return (json.dumps(self._data, ensure_ascii=False, indent=2) + "\n").encode("utf-8")

    def save_pretrained(self, directory: str | Path, overwrite: bool = False) -> Path:
        """Write ``tokenizer.json`` into ``directory`` (atomically), the file it was read from byte for byte.

        Raises:
            LmforgeError: the folder already holds a tokenizer.json and ``overwrite`` is false.
        """
        directory = Path(directory)
        check_can_write(directory / TOKENIZER_JSON, overwrite, "a tokenizer")
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(directory / TOKENIZER_JSON, self.to_json())
        return directory

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides: Any) -> UnigramTokenizer:
        """Load from a folder holding ``tokenizer.json``, or from the file itself. ``model_max_length`` comes from a
        ``tokenizer_config.json`` beside it when that names one; keyword arguments override.

        Raises:
            InputFileError: the file is missing, damaged, not a Unigram model, or uses a part lmforge cannot
                apply (named).
        """
        path = tokenizer_json_path(path)
        data = _read(path)
        kwargs: dict[str, Any] = {}
        config = path.parent / "tokenizer_config.json"
        try:
            max_len = json.loads(config.read_text(encoding="utf-8")).get("model_max_length")
        except (OSError, ValueError, AttributeError):
            max_len = None
        if type(max_len) is int and 0 < max_len < 1_000_000:  # Hugging Face writes 1e30 for "no limit"
            kwargs["model_max_length"] = max_len
        kwargs.update(overrides)
        return cls(data, source=path, raw=path.read_bytes(), **kwargs)
