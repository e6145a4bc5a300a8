"""Byte-level BPE (Sennrich et al., 2016; Radford et al., 2019), exact to GPT-2's tokenizer.

``ByteLevelBPETokenizer`` reads a Hugging Face GPT-2 folder (``vocab.json`` + ``merges.txt``) and gives the same
ids as ``transformers.GPT2TokenizerFast`` on the same files. Encoding a text takes four steps:

1. Added tokens written in the text (``<|endoftext|>``, tokens from ``add_tokens``) are cut out first and become
   one id each; the pieces of text between them go through the next steps separately.
2. Pre-tokenisation splits a piece of text into words with GPT-2's pattern, tried left to right::

       's | 't | 're | 've | 'm | 'll | 'd        English contractions (ASCII apostrophe, lower case only)
       ␣?L+                                      letters, with at most one space in front
       ␣?N+                                      numbers (digits of any script, ², Ⅷ, ½ ...)
       ␣?[^WLN]+                                 anything else that is not white space (punctuation, emoji)
       W+(?!\\S)                                 white space not followed by a word (it leaves the last space
                                                 of a run to the word after it)
       W+                                        the white space at the end of the text

   where L is Unicode's letter categories (Lu Ll Lt Lm Lo), N its number categories (Nd Nl No) and W its
   White_Space property. Python's ``re`` has no ``\\p{L}``, and its ``\\s`` also matches U+001C..U+001F (which
   GPT-2's pattern treats as symbols), so the three classes are built once from ``unicodedata``.
3. Each word's UTF-8 bytes are written as printable characters: every byte has one character that stands for it
   (below), so no text is ever unknown and the vocabulary needs no ``[UNK]``.
4. Byte-pair merges: starting from one symbol per byte, the adjacent pair whose merge comes first in
   ``merges.txt`` is joined, again and again, until no adjacent pair has a merge. Ties (the same pair twice)
   are taken leftmost first. Words' ids are cached, so a text's common words cost one dictionary look-up.

Decoding joins the tokens, maps the characters back to bytes and decodes them as UTF-8, so
``decode(encode_ids(text)) == text`` for every text (a text holding a lone surrogate cannot be encoded at all).
The character classes come from the running Python's Unicode tables; a character newer than them (or than the
reference's) can be classed differently.
"""

from __future__ import annotations

import heapq
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from functools import cache
from itertools import chain
from pathlib import Path
from typing import Any

from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers.wordpiece import ModelInputs, _as_list, _as_rows, split_around
from lmforge.utils.io import atomic_write_text, check_can_write

VOCAB_NAME = "vocab.json"
MERGES_NAME = "merges.txt"
CONFIG_NAME = "tokenizer_config.json"
SPECIAL_MAP_NAME = "special_tokens_map.json"
ADDED_NAME = "added_tokens.json"
ENDOFTEXT = "<|endoftext|>"
MERGES_HEADER = "#version: 0.2"


def _byte_characters() -> tuple[str, ...]:
    """The character that stands for each byte value (index = byte).

    Bytes that are already printable, non-space Latin-1 characters (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``)
    stand for themselves. The other 68 (controls, space, DEL, the C1 block, no-break space, soft hyphen) are
    given the characters U+0100, U+0101, ... in increasing byte order, so space (byte 32) is ``Ġ`` (U+0120) and
    newline (byte 10) is ``Ċ`` (U+010A). Every token is thus a string of visible characters.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars, spare = [], 0x100
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(spare))
            spare += 1
    return tuple(chars)


BYTE_TO_CHAR: tuple[str, ...] = _byte_characters()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table from a Latin-1 decoded byte string (character i = byte i) to the byte characters.
_LATIN1_TO_BYTE_CHARS = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def _ranges(code_points: Iterable[int]) -> str:
    """A regex character-class body for sorted code points, runs written as ``a-b``."""
    parts, start, prev = [], None, None
    for cp in code_points:
        if prev is not None and cp == prev + 1:
            prev = cp
            continue
        if start is not None:
            parts.append(_class_range(start, prev))
        start = prev = cp
    if start is not None:
        parts.append(_class_range(start, prev))
    return "".join(parts)


def _class_range(a: int, b: int) -> str:
    return f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}"


@cache
def pretokenize_pattern() -> re.Pattern[str]:
    """GPT-2's pre-tokenisation pattern, with ``\\p{L}``, ``\\p{N}`` and ``\\s`` spelled out as Unicode classes.

    Built once per process from a scan of all code points (about a fifth of a second).
    """
    letters, numbers, spaces = [], [], []
    for cp in range(0x110000):
        cat = unicodedata.category(chr(cp))
        if cat[0] == "L":
            letters.append(cp)
        elif cat[0] == "N":
            numbers.append(cp)
        elif cat in ("Zs", "Zl", "Zp") or 0x09 <= cp <= 0x0D or cp == 0x85:  # Unicode's White_Space property
            spaces.append(cp)
    L, N, W = _ranges(letters), _ranges(numbers), _ranges(spaces)
    return re.compile(
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{W}{L}{N}]+|[{W}]+(?![^{W}])|[{W}]+")


class ByteLevelBPETokenizer(ModelInputs):
    """GPT-2's tokenizer (Radford et al., 2019): added tokens cut out, GPT-2's pre-tokenisation, byte characters,
    then ranked merges (see the module docstring).

    Args:
        vocab: ``{token: id}``; the ids must be 0, 1, ..., n-1 and the 256 byte characters must be tokens.
        merges: the merge pairs in priority order (first = applied first); both parts and their
            concatenation must be tokens. A pair listed twice keeps its later position, as in GPT-2.
        eos_token: the end-of-text token (``<|endoftext|>`` in GPT-2), or None for a vocabulary without one.
        bos_token: the start token; None means ``eos_token`` (GPT-2 uses one token for both).
        pad_token: the padding token; None means ``eos_token``: GPT-2 has no padding token, and padded
            positions are masked out by ``attention_mask`` anyway, so any id serves.
        special_tokens: tokens never split when written in the text and dropped by
            ``decode(..., skip_special_tokens=True)``; the role tokens above are always among them.
        added_tokens: tokens never split but kept by ``decode`` (Hugging Face's non-special added tokens).
        model_max_length: the longest input the model takes (GPT-2: 1024), recorded in the saved config.
        mask_token: the masked-LM token (RoBERTa's ``<mask>``), or None (GPT-2 has none).

    Called as ``tokenizer(texts, pairs, padding=True, return_tensors="pt")`` (``ModelInputs``) it adds what the
    vocabulary's model adds: nothing for GPT-2 (a pair is the two texts one after the other), RoBERTa's
    ``<s> A </s>`` and ``<s> A </s></s> B </s>`` when a start token other than the end token is set.
    """

    lowercase = False  # byte-level BPE keeps the text as it is
    unk_id = None  # every byte has a token: nothing is unknown
    padding_side = "right"

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]], *,
                 eos_token: str | None = ENDOFTEXT, bos_token: str | None = None, pad_token: str | None = None,
                 special_tokens: Sequence[str] = (), added_tokens: Sequence[str] = (),
                 model_max_length: int = 1024, mask_token: str | None = None) -> None:
        if not vocab:
            raise LmforgeError("the vocabulary is empty")
        self.vocab: dict[str, int] = dict(vocab)
        self.ids_to_tokens: list[str] = _ids_to_tokens(self.vocab)
        missing = [c for c in BYTE_TO_CHAR if c not in self.vocab]
        if missing:
            raise LmforgeError(f"the vocabulary lacks {len(missing)} of the 256 byte tokens (such as "
                               f"{', '.join(map(repr, missing[:5]))}); a byte-level BPE vocabulary holds every byte's "
                               "character so that any text can be encoded")
        self.merges: list[tuple[str, str]] = []
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, (left, right) in enumerate(merges):
            for part in (left, right, left + right):
                if part not in self.vocab:
                    raise LmforgeError(f"merge {rank + 1} ({left} {right}) needs the token {part!r}, which is not "
                                       "in the vocabulary")
            self.merges.append((left, right))
            self._ranks[(left, right)] = rank
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.pad_token = pad_token
        self.mask_token = mask_token
        roles = {"eos_token": eos_token, "bos_token": bos_token, "pad_token": pad_token, "mask_token": mask_token}
        for role, token in roles.items():
            if token is not None and token not in self.vocab:
                raise LmforgeError(f"{role}={token!r} is not in the vocabulary; name a token of vocab.json, or "
                                   f"pass {role}=None")
        self.eos_id = None if eos_token is None else self.vocab[eos_token]
        self.bos_id = self.eos_id if bos_token is None else self.vocab[bos_token]
        self.pad_id = self.eos_id if pad_token is None else self.vocab[pad_token]
        self.mask_id = None if mask_token is None else self.vocab[mask_token]
        self.model_max_length = model_max_length
        self.special_tokens: list[str] = []
        self.added_tokens: list[str] = []  # special or not: every token kept whole, in the order added
        self._register([t for t in (eos_token, bos_token, pad_token, mask_token) if t is not None], special=True)
        self._register(list(special_tokens), special=True)
        self._register(list(added_tokens), special=False)
        self._cache: dict[str, tuple[int, ...]] = {}  # raw word -> ids
        self.cache_size = 200_000
        self._pattern = pretokenize_pattern()

    # ------------------------------------------------------------------ properties
    @property
    def sep_id(self) -> int | None:
        """The end-of-document token under lmforge's name for it: a causal LM's prompt starts after it and
        generation stops at it (GPT-2's ``<|endoftext|>`` plays the part of lmforge's [SEP])."""
        return self.eos_id

    @property
    def cls_id(self) -> int | None:
        """The sequence-start token under BERT's name (GPT-2's ``<|endoftext|>``): BERT-layout features start with
        it, and GPT-1 fine-tuning turns it into [START] (``lmforge.tasks.gpt_inputs``)."""
        return self.bos_id

    def __repr__(self) -> str:
        return (f"ByteLevelBPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={self.special_tokens})")

    # ------------------------------------------------------------------ added tokens
    def _register(self, tokens: list[str], special: bool) -> None:
        """Mark vocabulary tokens as added (never split), and special or not; rebuild the matcher."""
        for tok in tokens:
            if tok not in self.vocab:
                raise LmforgeError(f"the added token {tok!r} is not in the vocabulary; add it with add_tokens()")
            if tok not in self.added_tokens:
                self.added_tokens.append(tok)
            if special and tok not in self.special_tokens:
                self.special_tokens.append(tok)
        self.special_ids = frozenset(self.vocab[t] for t in self.special_tokens)
        self._added_ids = frozenset(self.vocab[t] for t in self.added_tokens)
        # Longest first: at one position the longest added token wins (leftmost-longest, as Hugging Face).
        alternatives = sorted(self.added_tokens, key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None

    def add_tokens(self, tokens: Sequence[str]) -> list[int]:
        """Add special tokens (GPT-1's start / delimiter / extract, say) and return their ids.

        A new token gets the next free id, so the vocabulary grows: resize the model's embeddings to
        ``vocab_size``. A token already in the vocabulary keeps its id and becomes special. Special tokens
        are never split when written in a text and are dropped by ``decode(..., skip_special_tokens=True)``.

        Raises:
            LmforgeError: a token is not a non-empty string.
        """
        if isinstance(tokens, str):
            raise LmforgeError(f"add_tokens takes a list of tokens, got the string {tokens!r:.60}; "
                               "write add_tokens([token])")
        for tok in tokens:
            if not isinstance(tok, str) or not tok:
                raise LmforgeError(f"add_tokens: {tok!r:.60} is not a token; tokens are non-empty strings")
        for tok in tokens:
            if tok not in self.vocab:
                self.vocab[tok] = len(self.ids_to_tokens)
                self.ids_to_tokens.append(tok)
        self._register(list(tokens), special=True)
        return [self.vocab[t] for t in tokens]

    # ------------------------------------------------------------------ word level
    def bpe(self, word: str) -> list[str]:
        """Merge the byte characters of one pre-tokenised word (already byte-mapped) into tokens.

        The symbols form a linked list; a heap holds ``(rank, position)`` of every adjacent pair that has a
        merge. Popping the lowest rank (leftmost on ties) and joining that pair touches only its two
        neighbouring pairs, so a word of n bytes costs O(n log n) rather than the O(n^2) of rescanning.
        Heap entries whose pair has changed since they were pushed are skipped when popped.
        """
        symbols: list[str | None] = list(word)
        n = len(symbols)
        if n < 2:
            return list(word)
        ranks = self._ranks
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap = [(r, i) for i in range(n - 1) if (r := ranks.get((word[i], word[i + 1]))) is not None]
        heapq.heapify(heap)
        while heap:
            rank, i = heapq.heappop(heap)
            left = symbols[i]
            j = nxt[i]
            if left is None or j == -1 or ranks.get((left, symbols[j])) != rank:  # stale entry
                continue
            merged = left + symbols[j]
            symbols[i], symbols[j] = merged, None
            k = nxt[j]
            nxt[i] = k
            if k != -1:
                prv[k] = i
                r = ranks.get((merged, symbols[k]))
                if r is not None:
                    heapq.heappush(heap, (r, i))
            p = prv[i]
            if p != -1:
                r = ranks.get((symbols[p], merged))
                if r is not None:
                    heapq.heappush(heap, (r, p))
        return [s for s in symbols if s is not None]

    def _word_ids(self, raw: str) -> tuple[int, ...]:
        """Ids of one raw (not byte-mapped) word, through the cache."""
        ids = self._cache.get(raw)
        if ids is not None:
            return ids
        mapped = raw.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)
        vocab = self.vocab
        ids = tuple(vocab[t] for t in self.bpe(mapped))
        if len(self._cache) >= self.cache_size:
            self._cache.clear()  # bounded memory; the common words come straight back
        self._cache[raw] = ids
        return ids

    def _ids_of_words(self, words: list[str]) -> list[int]:
        lookup = self._cache.__getitem__
        try:
            return list(chain.from_iterable(map(lookup, words)))
        except KeyError:
            return [i for w in words for i in self._word_ids(w)]  # fills the cache for next time

    # ------------------------------------------------------------------ text level
    def encode_ids(self, text: str) -> list[int]:
        """Token ids of one text (no tokens added around it).

        Raises:
            LmforgeError: the text holds a lone surrogate, which has no UTF-8 bytes.
        """
        try:
            if self._added_re is None or self._added_re.search(text) is None:
                return self._ids_of_words(self._pattern.findall(text))
            ids: list[int] = []
            for start, end, added in split_around(self._added_re, text):
                if added:
                    ids.append(self.vocab[text[start:end]])
                else:
                    ids.extend(self._ids_of_words(self._pattern.findall(text, start, end)))
            return ids
        except UnicodeEncodeError as err:
            raise _surrogate_error(err) from None

    def encode_text(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[int]]:
        """Token ids, character offsets and word indices of one text (no tokens added around it).

        Words are the pre-tokenisation's (GPT-2's pattern: a word with the space before it, a run of punctuation, a
        run of spaces; an added token is a word of its own), as Hugging Face's ``word_ids``. A token's offsets are
        the characters its bytes come from, without the spaces it carries (Hugging Face's ``trim_offsets``,
        RoBERTa's setting: " Paris" is (1, 6) in " Paris"; a token of spaces only gets an empty span); a character
        whose UTF-8 bytes are split between two tokens belongs to both.
        """
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        words: list[int] = []
        n_words = 0
        try:
            for start, end, added in split_around(self._added_re, text):
                if added:
                    ids.append(self.vocab[text[start:end]])
                    offsets.append((start, end))
                    words.append(n_words)
                    n_words += 1
                    continue
                for m in self._pattern.finditer(text, start, end):
                    self._word_offsets(m.group(), m.start(), n_words, ids, offsets, words)
                    n_words += 1
        except UnicodeEncodeError as err:
            raise _surrogate_error(err) from None
        return ids, offsets, words

    def _word_offsets(self, word: str, base: int, index: int, ids: list[int], offsets: list[tuple[int, int]],
                      words: list[int]) -> None:
        """Append one pre-token's ids, character offsets (``base`` + position, leading spaces trimmed) and word."""
        word_ids = self._word_ids(word)
        char_of_byte = [i for i, c in enumerate(word) for _ in range(len(c.encode("utf-8")))]
        b = 0
        space = BYTE_TO_CHAR[ord(" ")]
        for token_id in word_ids:
            token = self.ids_to_tokens[token_id]  # one character per byte
            first, last = char_of_byte[b], char_of_byte[b + len(token) - 1] + 1
            # trim the spaces the token carries (Hugging Face's rule: a token of spaces only ends up empty)
            leading, trailing = len(token) - len(token.lstrip(space)), len(token) - len(token.rstrip(space))
            if leading == 1 and base + first == 0:  # the text's first token keeps one leading space, as theirs
                leading = 0
            first = min(first + leading, last)
            if trailing and last >= trailing:
                last = max(last - trailing, first)
            ids.append(token_id)
            offsets.append((base + first, base + last))
            words.append(index)
            b += len(token)

    @property
    def wraps_texts(self) -> bool:
        """RoBERTa's template (a start token other than the end token): ``<s> A </s>``; else GPT-2's: none."""
        return self.bos_token is not None and self.eos_token is not None and self.bos_token != self.eos_token

    def num_special_tokens(self, pair: bool = False) -> int:
        """RoBERTa's template adds 2 (4 for a pair), GPT-2's none."""
        return (4 if pair else 2) if self.wraps_texts else 0

    @property
    def words_need_spaces(self) -> bool:
        """A word's tokens carry the space before it (" Paris" is not "Paris"): a sentence given as words is encoded
        word by word with a space before every word but the first (``lmforge.data.token_features``), as the words
        joined by spaces would be."""
        return True

    def _assemble(self, a, b, return_offsets, return_word_ids) -> dict[str, list]:
        def wrap(k: int, first: Any, end: Any) -> list:  # field k in the template: <s> A </s> (</s> B </s>)
            if not self.wraps_texts:
                return [*a[k], *(b[k] if b is not None else ())]
            return [first, *a[k], end, *((end, *b[k], end) if b is not None else ())]

        ids = wrap(0, self.bos_id, self.eos_id)
        row: dict[str, list] = {"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids)}
        if return_offsets:
            row["offsets"] = wrap(1, (0, 0), (0, 0))
        if return_word_ids:
            row["word_ids"] = wrap(2, None, None)
        return row

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` as strings (byte characters: a leading space shows as ``Ġ``)."""
        return [self.ids_to_tokens[i] for i in self.encode_ids(text)]

    # ------------------------------------------------------------------ ids and tokens
    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in _as_list(ids):
            if not 0 <= i < len(self.ids_to_tokens):
                raise LmforgeError(f"token id {i} is outside the vocabulary (size {self.vocab_size})")
            out.append(self.ids_to_tokens[i])
        return out

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        """Ids of vocabulary tokens (byte characters, as ``tokenize`` gives them).

        Raises:
            LmforgeError: a token is not in the vocabulary (byte-level BPE has no unknown token to map it to).
        """
        out = []
        for t in tokens:
            i = self.vocab.get(t)
            if i is None:
                raise LmforgeError(f"{t!r:.60} is not a token of this vocabulary; use encode_ids(text) to turn text "
                                   "into ids")
            out.append(i)
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Turn ids back into text: byte characters back to bytes, bytes decoded as UTF-8.

        Added tokens are written as they are (special ones left out when ``skip_special_tokens``). Bytes that
        are not valid UTF-8 (ids cut mid-character, say) become U+FFFD, as in GPT-2. A character of a regular
        token that stands for no byte (possible only in hand-made vocabularies) is written as its UTF-8 bytes.
        """
        parts: list[str] = []
        buffer = bytearray()
        added, special = self._added_ids, self.special_ids
        for i, tok in zip(_as_list(ids), self.convert_ids_to_tokens(ids), strict=True):
            if i in added:
                if buffer:
                    parts.append(buffer.decode("utf-8", errors="replace"))
                    buffer.clear()
                if not (skip_special_tokens and i in special):
                    parts.append(tok)
                continue
            for c in tok:
                b = CHAR_TO_BYTE.get(c)
                if b is None:
                    buffer += c.encode("utf-8", errors="surrogatepass")
                else:
                    buffer.append(b)
        if buffer:
            parts.append(buffer.decode("utf-8", errors="replace"))
        return "".join(parts)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = True) -> list[str]:
        """``decode`` of each row of a batch (a list of id lists, or a (B, T) tensor or array), as Hugging Face's
        ``batch_decode``."""
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in _as_rows(sequences)]

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict[str, Any]:
        """Settings in the layout of a Hugging Face GPT-2 ``tokenizer_config.json`` (readable by both)."""
        return {
            "tokenizer_class": "RobertaTokenizer" if self.wraps_texts else "GPT2Tokenizer",
            "add_prefix_space": False,
            "add_bos_token": False,
            "eos_token": self.eos_token,
            "bos_token": self.bos_token if self.bos_token is not None else self.eos_token,
            "pad_token": self.pad_token,
            **({"mask_token": self.mask_token} if self.mask_token is not None else {}),
            "model_max_length": self.model_max_length,
            "errors": "replace",
            "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": {
                str(self.vocab[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                     "single_word": False, "special": t in self.special_tokens}
                for t in sorted(self.added_tokens, key=self.vocab.__getitem__)},
        }

    def save_pretrained(self, directory: str | Path, overwrite: bool = False) -> Path:
        """Write ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` into ``directory`` (atomically).

        ``vocab.json`` holds every token, added ones included; ``merges.txt`` starts with GPT-2's
        ``#version: 0.2`` line. Hugging Face's ``GPT2Tokenizer(Fast).from_pretrained`` reads the folder too.

        Raises:
            LmforgeError: the folder already holds a tokenizer and ``overwrite`` is false.
        """
        directory = Path(directory)
        check_can_write(directory / VOCAB_NAME, overwrite, "a tokenizer")
        check_can_write(directory / MERGES_NAME, overwrite, "a tokenizer")
        for left, right in self.merges:
            if any(c in part for part in (left, right) for c in " \r\n"):  # only a hand-made merge list can
                raise LmforgeError(f"the merge ({left!r}, {right!r}) holds a space or line break and cannot be "
                                   "written as a line of merges.txt")
        by_id = {tok: i for i, tok in enumerate(self.ids_to_tokens)}
        atomic_write_text(directory / VOCAB_NAME, json.dumps(by_id, ensure_ascii=False, indent=2) + "\n")
        atomic_write_text(directory / MERGES_NAME,
                          "".join(f"{line}\n" for line in [MERGES_HEADER, *(f"{a} {b}" for a, b in self.merges)]))
        atomic_write_text(directory / CONFIG_NAME, json.dumps(self.config(), ensure_ascii=False, indent=2) + "\n")
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, **overrides: Any) -> ByteLevelBPETokenizer:
        """Load from a folder holding ``vocab.json`` and ``merges.txt`` (ours, or any GPT-2 checkpoint's).

        When present, ``tokenizer_config.json`` (roles, ``added_tokens_decoder``, ``model_max_length``),
        ``special_tokens_map.json`` (roles, ``additional_special_tokens``) and ``added_tokens.json`` (tokens
        added after training, beyond ``vocab.json``) are read too; the config wins over the map. Without
        them GPT-2's defaults hold: ``<|endoftext|>`` (when in the vocabulary) is end, start and padding.
        Keyword arguments override what the files say.

        Raises:
            InputFileError: a file is missing or malformed; the message names it (and the line).
        """
        directory = Path(directory)
        if not directory.is_dir():
            raise InputFileError(f"{directory}: no such tokenizer folder; pass a folder holding {VOCAB_NAME} and "
                                 f"{MERGES_NAME} (a GPT-2 checkpoint folder)")
        vocab_file, merges_file = directory / VOCAB_NAME, directory / MERGES_NAME
        for path, what in ((vocab_file, "the token -> id map"), (merges_file, "the merge list")):
            if not path.is_file():
                raise InputFileError(f"{path}: not found ({what} of a byte-level BPE tokenizer); a GPT-2 tokenizer "
                                     f"folder holds both {VOCAB_NAME} and {MERGES_NAME}")
        vocab = _read_vocab(vocab_file)
        merges = _read_merges(merges_file, vocab)
        config = _read_json_object(directory / CONFIG_NAME)
        special_map = _read_json_object(directory / SPECIAL_MAP_NAME)
        added_json = _read_json_object(directory / ADDED_NAME)
        extra: dict[str, tuple[int, bool, Path]] = {}  # token -> (id, special, where it was named)
        for tok, i in _added_json_tokens(added_json, directory / ADDED_NAME).items():
            extra[tok] = (i, False, directory / ADDED_NAME)
        for tok, (i, special) in _added_tokens_decoder(config, directory / CONFIG_NAME).items():
            extra[tok] = (i, special, directory / CONFIG_NAME)
        for tok, (i, _, where) in extra.items():
            known = vocab.get(tok)
            if known is not None and known != i:
                raise InputFileError(f"{where}: the added token {tok!r} has id {i}, but {vocab_file} gives it id "
                                     f"{known}; the files come from different tokenizers")
            vocab[tok] = i
        if config.get("add_prefix_space") is True:
            raise InputFileError(f"{directory / CONFIG_NAME}: add_prefix_space is true; lmforge's byte-level BPE "
                                 "encodes texts as they are (GPT-2's add_prefix_space=false); set it to false")
        kwargs: dict[str, Any] = {}
        for role in ("eos_token", "bos_token", "pad_token", "mask_token"):
            for source, path in ((config, directory / CONFIG_NAME), (special_map, directory / SPECIAL_MAP_NAME)):
                if role in source:
                    kwargs[role] = _token_value(source[role], path, role)
                    break
        kwargs.setdefault("eos_token", ENDOFTEXT if ENDOFTEXT in vocab else None)
        specials = [t for t, (_, special, _) in extra.items() if special]
        for source, path in ((special_map, directory / SPECIAL_MAP_NAME), (config, directory / CONFIG_NAME)):
            listed = source.get("additional_special_tokens", [])
            if not isinstance(listed, list):
                raise InputFileError(f"{path}: additional_special_tokens must be a list of tokens, got {listed!r:.60}")
            specials += [_token_value(t, path, "additional_special_tokens") for t in listed]
        unk = config.get("unk_token", special_map.get("unk_token"))
        if isinstance(unk, str | dict):  # GPT-2 names <|endoftext|> as unk: it is kept whole like the others
            unk = _token_value(unk, directory / CONFIG_NAME, "unk_token")
            if unk is not None and unk in vocab:
                specials.append(unk)
        kwargs["special_tokens"] = [t for t in specials if t is not None]
        kwargs["added_tokens"] = [t for t, (_, special, _) in extra.items() if not special]
        max_len = config.get("model_max_length")
        if type(max_len) is int and 0 < max_len < 1_000_000:  # Hugging Face writes 1e30 for "no limit"
            kwargs["model_max_length"] = max_len
        kwargs.update(overrides)
        try:
            return cls(vocab, merges, **kwargs)
        except LmforgeError as err:
            raise InputFileError(f"{vocab_file}: {err}") from None


# ---------------------------------------------------------------------------------------------------- file readers
def _surrogate_error(err: UnicodeEncodeError) -> LmforgeError:
    return LmforgeError(f"the text holds a lone surrogate {err.object[err.start]!r} (within {err.object!r:.60}), "
                        "which is not a character and has no UTF-8 bytes; fix the text's decoding")


def _ids_to_tokens(vocab: dict[str, int]) -> list[str]:
    """The token of each id; the ids must be exactly 0..n-1."""
    tokens: list[str | None] = [None] * len(vocab)
    for tok, i in vocab.items():
        if type(i) is not int or not 0 <= i < len(vocab):
            raise LmforgeError(f"token {tok!r:.60} has id {i!r:.30}; the ids of {len(vocab):,} tokens must be "
                               f"the integers 0..{len(vocab) - 1}, each once")
        if tokens[i] is not None:
            raise LmforgeError(f"tokens {tokens[i]!r:.60} and {tok!r:.60} share id {i}; each id belongs to one token")
        tokens[i] = tok
    return tokens  # type: ignore[return-value]  # n distinct ids in 0..n-1 leave no gap


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputFileError(f"{path}:{line}: not valid UTF-8 (byte {err.start}); the file is UTF-8 text, as "
                             "Hugging Face writes it") from None


def _parse_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as err:
        raise InputFileError(f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from None
    except (ValueError, RecursionError) as err:  # a number too long, nesting too deep
        raise InputFileError(f"{path}: not valid JSON ({err})") from None


def _read_vocab(path: Path) -> dict[str, int]:
    """``vocab.json``: a JSON object ``{token: id}`` whose ids are 0..n-1 once each (checked by the class)."""
    vocab = _parse_json(path)
    if not isinstance(vocab, dict):
        raise InputFileError(f"{path}: not a JSON object (it holds a {type(vocab).__name__}); vocab.json maps each "
                             "token to its id, as in {\"!\": 0, \"\\\"\": 1}")
    if not vocab:
        raise InputFileError(f"{path}: the vocabulary is empty")
    for tok, i in vocab.items():
        if type(i) is not int or i < 0:
            raise InputFileError(f"{path}: token {tok!r:.60} has id {i!r:.30}; ids are non-negative integers")
    return vocab


def _read_merges(path: Path, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """``merges.txt``: an optional ``#version`` line, then one merge ``left right`` per line, first = first applied.

    Blank lines are skipped. Lines are split on ``\\n`` only (a ``\\r`` before it is dropped): byte characters
    never include line or space characters, whereas ``str.splitlines`` would also break at U+0085 or U+2028.
    """
    merges = []
    for lineno, line in enumerate(_read_text(path).split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise InputFileError(f"{path}:{lineno}: {line!r:.80} is not a merge; each line holds two tokens "
                                 "separated by one space, such as \"Ġ t\"")
        for part in (parts[0], parts[1], parts[0] + parts[1]):
            if part not in vocab:
                raise InputFileError(f"{path}:{lineno}: the merge {line!r:.80} needs the token {part!r:.60}, which "
                                     f"is not in {VOCAB_NAME}; the two files come from different tokenizers")
        merges.append((parts[0], parts[1]))
    return merges


def _read_json_object(path: Path) -> dict[str, Any]:
    """An optional JSON object file ({} when absent)."""
    if not path.exists():
        return {}
    if not path.is_file():
        raise InputFileError(f"{path}: is a folder, not a JSON file; remove it")
    data = _parse_json(path)
    if not isinstance(data, dict):
        raise InputFileError(f"{path}: not a JSON object (it holds a {type(data).__name__})")
    return data


def _token_value(value: Any, path: Path, key: str) -> str | None:
    """A token as Hugging Face writes it: a string, an AddedToken object ``{"content": ...}``, or null."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and (not isinstance(value, str) or not value):
        raise InputFileError(f"{path}: {key} must be a token (a non-empty string or {{\"content\": token}}), got "
                             f"{value!r:.60}")
    return value


def _added_tokens_decoder(config: dict[str, Any], path: Path) -> dict[str, tuple[int, bool]]:
    """``added_tokens_decoder`` of a tokenizer config: ``{"50256": {"content": ..., "special": true}}``."""
    table = config.get("added_tokens_decoder", {})
    if not isinstance(table, dict):
        raise InputFileError(f"{path}: added_tokens_decoder must be an object {{id: {{\"content\": token}}}}, got "
                             f"{table!r:.60}")
    out = {}
    for key, entry in table.items():
        if not key.isdigit() or not isinstance(entry, dict) or not isinstance(entry.get("content"), str) \
                or not entry["content"]:
            raise InputFileError(f"{path}: added_tokens_decoder entry {key!r:.30}: {entry!r:.60} is not "
                                 "id: {\"content\": token, \"special\": true|false}")
        out[entry["content"]] = (int(key), bool(entry.get("special", False)))
    return out


def _added_json_tokens(table: dict[str, Any], path: Path) -> dict[str, int]:
    """``added_tokens.json``: ``{token: id}`` of tokens added beyond ``vocab.json``."""
    for tok, i in table.items():
        if type(i) is not int or i < 0 or not tok:
            raise InputFileError(f"{path}: token {tok!r:.60} has id {i!r:.30}; ids are non-negative integers")
    return table
