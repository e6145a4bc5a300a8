"""WordPiece encoding (Schuster & Nakajima, 2012; Wu et al., 2016; Devlin et al., 2019), exact to BERT.

``WordPieceTokenizer`` turns text into the model inputs BERT expects, with the same ids, segment ids and
character offsets as ``transformers.BertTokenizerFast`` given the same ``vocab.txt``:

    [CLS] A [SEP]            token_type_ids 0 ... 0
    [CLS] A [SEP] B [SEP]    token_type_ids 0 ... 0 1 ... 1

Each word (see ``BasicTokenizer``) is split greedily, longest match first, into pieces of the vocabulary;
pieces after the first carry the ``##`` prefix. A word longer than ``max_input_chars_per_word`` characters,
or one that cannot be covered by pieces, becomes ``[UNK]`` as a whole. Special tokens written in the text
(``[MASK]``) are never split. Results are cached per raw word, which makes encoding a dictionary look-up per
word once a text's vocabulary has been seen.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers.basic import BasicTokenizer
from lmforge.tokenizers.vocab import load_vocab, save_vocab
from lmforge.utils.io import atomic_write_text, check_can_write

log = logging.getLogger("lmforge")

CONFIG_NAME = "tokenizer_config.json"
VOCAB_NAME = "vocab.txt"
DEFAULT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
PADDING_STRATEGIES = ("longest", "max_length")

Span = tuple[int, int]
# A cached raw word: piece ids, piece offsets relative to the raw word, word index (relative) of each
# piece, and the number of words the raw word holds (usually 1, 0 if it normalises to nothing).
_Entry = tuple[tuple[int, ...], tuple[Span, ...], tuple[int, ...], int]



def split_around(pattern: re.Pattern[str] | None, text: str) -> list[tuple[int, int, bool]]:
    """``(start, end, matched)`` runs of ``text``: the matches of ``pattern`` (the special or added tokens written in
    the text) and the text between them, in order; the whole text when ``pattern`` is None."""
    out, pos = [], 0
    for m in pattern.finditer(text) if pattern is not None else ():
        if m.start() > pos:
            out.append((pos, m.start(), False))
        out.append((m.start(), m.end(), True))
        pos = m.end()
    if pos < len(text):
        out.append((pos, len(text), False))
    return out

class Encoding(dict):
    """The encoding of one text or text pair: a dict of lists with a record of truncation.

    Keys: ``input_ids``, ``token_type_ids``, ``attention_mask``; ``offsets`` (``(start, end)`` characters of
    the input each token came from; ``(0, 0)`` for special and padding tokens; for the second text of a pair
    they index into that text) and ``word_ids`` (index of the word within its text; ``None`` for special and
    padding tokens) when requested. ``num_truncated_tokens`` counts the tokens that truncation removed.
    """

    num_truncated_tokens: int = 0

    @property
    def truncated(self) -> bool:
        return self.num_truncated_tokens > 0


class BatchEncoding(dict):
    """The encodings of a batch: a dict of lists of lists (or tensors), with ``num_truncated`` sequences."""

    num_truncated: int = 0
    truncated_tokens: list[int] = []  # noqa: RUF012 - replaced per instance


class ModelInputs:
    """Model inputs from any lmforge tokenizer: ``tokenizer(texts, pairs, padding=..., truncation=...,
    return_tensors="pt")`` as Hugging Face's tokenizers are called. A tokenizer class supplies ``encode_ids`` (and
    ``encode_text`` for offsets and word ids), ``_assemble`` (its template: where the special tokens go),
    ``pad_id``, ``padding_side``, ``model_max_length`` and ``num_special_tokens`` (what its template adds)."""

    pad_type_id = 0  # the segment id of padding (XLNet's files say 3)

    @property
    def vocab_size(self) -> int:
        """The number of ids, added tokens included (the embedding rows a model needs)."""
        return len(self.ids_to_tokens)

    def __len__(self) -> int:
        return self.vocab_size

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None, *,
                 max_length: int | None = None, truncation: bool | str = False,
                 padding: bool | str = False, return_offsets: bool = False, return_word_ids: bool = False,
                 return_tensors: str | None = None) -> Encoding | BatchEncoding:
        """Encode a text or a pair of texts, or a batch (a list) of them, into model inputs.

        Args:
            text: one text, or a list of texts.
            text_pair: the second segment (or a list of them), for sentence-pair tasks.
            max_length: the length limit of truncation and of ``padding="max_length"`` (in tokens, with the
                special tokens). Defaults to ``model_max_length`` when truncating.
            truncation: ``False``; ``True`` or ``"longest_first"`` (cut the longer text of a pair first);
                ``"only_first"``; ``"only_second"``. Truncation is counted in the result and logged.
            padding: ``False``; ``True`` or ``"longest"`` (to the longest in the batch); ``"max_length"``.
            return_offsets: add ``offsets``, character spans in the input text.
            return_word_ids: add ``word_ids``.
            return_tensors: ``None`` (lists), ``"pt"`` (torch) or ``"np"`` (numpy); needs equal lengths.

        Returns:
            An ``Encoding`` for one input, a ``BatchEncoding`` for a list.
        """
        if isinstance(text, str):
            if text_pair is not None and not isinstance(text_pair, str):
                raise LmforgeError("text is one string but text_pair is not; pass both as strings or lists")
            batch = self._encode_batch([text], None if text_pair is None else [text_pair], max_length,
                                       truncation, padding, return_offsets, return_word_ids,
                                       return_tensors, single=True)
            enc = Encoding({k: v[0] for k, v in batch.items()})
            enc.num_truncated_tokens = batch.truncated_tokens[0]
            return enc
        texts = list(text)
        pairs = None if text_pair is None else list(text_pair)
        if pairs is not None and len(pairs) != len(texts):
            raise LmforgeError(f"got {len(texts)} texts but {len(pairs)} text pairs; pass one pair per text")
        return self._encode_batch(texts, pairs, max_length, truncation, padding, return_offsets,
                                  return_word_ids, return_tensors, single=False)

    encode = __call__

    def _encode_batch(self, texts, pairs, max_length, truncation, padding, return_offsets,
                      return_word_ids, return_tensors, single):
        strategy = _truncation_strategy(truncation)
        pad = _padding_strategy(padding)
        if strategy and max_length is None:
            max_length = self.model_max_length
        if pad == "max_length" and max_length is None:
            raise LmforgeError("padding='max_length' needs max_length=N")
        if pad and self.pad_id is None:
            raise LmforgeError("this tokenizer names no padding token; encode without padding")
        if max_length is not None and max_length < 1:
            raise LmforgeError(f"max_length must be >= 1, got {max_length}")
        want_details = return_offsets or return_word_ids
        rows: list[dict[str, list]] = []
        truncated_tokens: list[int] = []
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise LmforgeError(f"text {i} is {type(t).__name__}, not a string")
            b = None if pairs is None else pairs[i]
            if b is not None and not isinstance(b, str):
                raise LmforgeError(f"text pair {i} is {type(b).__name__}, not a string")
            a_enc = self.encode_text(t) if want_details else (self.encode_ids(t), None, None)
            b_enc = None
            if b is not None:
                b_enc = self.encode_text(b) if want_details else (self.encode_ids(b), None, None)
            removed = 0
            if strategy:
                a_enc, b_enc, removed = _truncate(a_enc, b_enc, max_length, strategy,
                                                  self.num_special_tokens(b_enc is not None))
            truncated_tokens.append(removed)
            rows.append(self._assemble(a_enc, b_enc, return_offsets, return_word_ids))
        n_trunc = sum(1 for r in truncated_tokens if r)
        if n_trunc:
            what = "the input was" if single else f"{n_trunc} of {len(texts)} inputs were"
            log.warning("%s truncated to max_length=%d (%d tokens removed)", what, max_length,
                        sum(truncated_tokens))
        if pad:
            target = max_length if pad == "max_length" else max(len(r["input_ids"]) for r in rows)
            for r in rows:
                self._pad(r, target)
        out = BatchEncoding({k: [r[k] for r in rows] for k in (rows[0] if rows else ())})
        out.num_truncated = n_trunc
        out.truncated_tokens = truncated_tokens
        if return_tensors is not None:
            out = _to_tensors(out, return_tensors)
        return out

    def _pad(self, row: dict[str, list], target: int) -> None:
        n = target - len(row["input_ids"])
        if n <= 0:
            return
        fill = {"input_ids": self.pad_id, "token_type_ids": self.pad_type_id, "attention_mask": 0,
                "offsets": (0, 0), "word_ids": None}
        for k, v in row.items():
            row[k] = v + [fill[k]] * n if self.padding_side == "right" else [fill[k]] * n + v


class WordPieceTokenizer(ModelInputs):
    """BERT's tokenizer: basic pre-tokenization, then greedy longest-match-first WordPiece.

    Args:
        vocab: ``{token: id}`` or a list of tokens (id = position), as in ``vocab.txt``.
        lowercase: lower-case (and, unless ``strip_accents`` says otherwise, strip accents).
        strip_accents: ``None`` follows ``lowercase``.
        tokenize_chinese_chars: make each CJK ideograph a word.
        special_tokens: tokens never split when written in the text; must be in the vocabulary.
            The roles below must be among them.
        unk_token, cls_token, sep_token, pad_token, mask_token: the tokens playing each role.
        max_input_chars_per_word: longer words become ``[UNK]``.
        model_max_length: the default ``max_length`` of truncation.
        newline_token: a token that each line break of the text becomes (``"\n"`` or ``"\r\n"``), and that decodes
            back to ``"\n"``: BERT's basic tokenizer treats line breaks as spaces, so a GPT trained on its pieces
            could never write one (``lmforge tokenizer train --keep-newlines`` adds ``[NL]``). None: BERT's
            behaviour. The token is special (never split, masked or predicted by the masked objectives).
    """

    def __init__(self, vocab: dict[str, int] | Sequence[str], *, lowercase: bool = True,
                 strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS, unk_token: str = "[UNK]",
                 cls_token: str = "[CLS]", sep_token: str = "[SEP]", pad_token: str = "[PAD]",
                 mask_token: str = "[MASK]", max_input_chars_per_word: int = 100,
                 model_max_length: int = 512, newline_token: str | None = None) -> None:
        if not isinstance(vocab, dict):
            vocab = {tok: i for i, tok in enumerate(vocab)}
        if not vocab:
            raise LmforgeError("the vocabulary is empty")
        if max_input_chars_per_word < 1:
            raise LmforgeError(f"max_input_chars_per_word must be >= 1, got {max_input_chars_per_word}")
        self.vocab: dict[str, int] = dict(vocab)
        self.ids_to_tokens: list[str | None] = [None] * (max(self.vocab.values()) + 1)
        for tok, i in self.vocab.items():
            self.ids_to_tokens[i] = tok
        self.basic = BasicTokenizer(lowercase, strip_accents, tokenize_chinese_chars)
        self.unk_token, self.cls_token, self.sep_token = unk_token, cls_token, sep_token
        self.pad_token, self.mask_token = pad_token, mask_token
        roles = {"unk_token": unk_token, "cls_token": cls_token, "sep_token": sep_token,
                 "pad_token": pad_token, "mask_token": mask_token}
        if newline_token is not None:
            roles["newline_token"] = newline_token
        self.newline_token = newline_token
        self.special_tokens = list(dict.fromkeys([*special_tokens, *roles.values()]))
        missing = [t for t in self.special_tokens if t not in self.vocab]
        if missing:
            raise LmforgeError(
                f"the vocabulary lacks the special token(s) {', '.join(missing)}; add them to vocab.txt "
                "(one per line) or name the tokens it uses for these roles "
                "(unk_token=, cls_token=, sep_token=, pad_token=, mask_token=, newline_token=)")
        self.max_input_chars_per_word = max_input_chars_per_word
        self.model_max_length = model_max_length
        self.padding_side = "right"
        self.unk_id = self.vocab[unk_token]
        self.cls_id, self.sep_id = self.vocab[cls_token], self.vocab[sep_token]
        self.pad_id, self.mask_id = self.vocab[pad_token], self.vocab[mask_token]
        self.special_ids = frozenset(self.vocab[t] for t in self.special_tokens)
        # Longest piece, to bound the greedy search (in characters, without the ## prefix).
        self._max_piece = max((len(t) - 2 if t.startswith("##") else len(t)) for t in self.vocab)
        self.newline_id = None if newline_token is None else self.vocab[newline_token]
        alternatives = [re.escape(t) for t in sorted(self.special_tokens, key=len, reverse=True)]
        if newline_token is not None:
            alternatives.append(r"\r?\n")  # each line break is the newline token
        self._special_re = re.compile("|".join(alternatives))
        self._cache: dict[str, _Entry] = {}
        self._ids_cache: dict[str, tuple[int, ...]] = {}  # raw word -> piece ids, for encode_ids
        self.cache_size = 200_000

    # ------------------------------------------------------------------ properties
    @property
    def lowercase(self) -> bool:
        return self.basic.lowercase

    def __repr__(self) -> str:
        return (f"WordPieceTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
                f"special_tokens={self.special_tokens})")

    # ------------------------------------------------------------------ word level
    def wordpiece(self, word: str) -> list[tuple[int, int, int]]:
        """Split one normalised word into ``(id, start, end)`` pieces (character spans in the word)."""
        n = len(word)
        if n > self.max_input_chars_per_word:
            return [(self.unk_id, 0, n)]
        vocab, pieces, start = self.vocab, [], 0
        while start < n:
            end = min(n, start + self._max_piece)
            found = None
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                found = vocab.get(sub)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [(self.unk_id, 0, n)]
            pieces.append((found, start, end))
            start = end
        return pieces

    def _entry(self, raw: str) -> _Entry:
        entry = self._cache.get(raw)
        if entry is not None:
            return entry
        ids: list[int] = []
        offsets: list[Span] = []
        words: list[int] = []
        analyzed = self.basic.analyze(raw)
        for w, (word, align) in enumerate(analyzed):
            for piece_id, s, e in self.wordpiece(word):
                ids.append(piece_id)
                offsets.append((align[s][0], align[e - 1][1]))
                words.append(w)
        entry = (tuple(ids), tuple(offsets), tuple(words), len(analyzed))
        if len(self._cache) >= self.cache_size:
            self._cache.clear()  # bounded memory; the common words come straight back
            self._ids_cache.clear()
        self._cache[raw] = entry
        self._ids_cache[raw] = entry[0]
        return entry

    # ------------------------------------------------------------------ text level
    def _segments(self, text: str) -> list[tuple[int, int, bool]]:
        """Split around special tokens written in the text: ``(start, end, is_special)``."""
        return split_around(self._special_re, text)

    def encode_ids(self, text: str) -> list[int]:
        """Piece ids of one text, without special tokens (the fastest path: regex, then C-level look-ups)."""
        if self._special_re.search(text) is None:
            return self._ids_of_raw_words(self.basic.pattern.findall(text))
        ids: list[int] = []
        for start, end, special in self._segments(text):
            if special:
                ids.append(self._special_id(text[start:end]))
            else:
                ids.extend(self._ids_of_raw_words(self.basic.pattern.findall(text, start, end)))
        return ids

    def _special_id(self, written: str) -> int:
        """The id of a special token written in the text (a line break: the newline token's)."""
        if self.newline_id is not None and written in ("\n", "\r\n"):
            return self.newline_id
        return self.vocab[written]

    def _ids_of_raw_words(self, raws: list[str]) -> list[int]:
        lookup = self._ids_cache.__getitem__
        try:
            return list(chain.from_iterable(map(lookup, raws)))
        except KeyError:
            return [i for raw in raws for i in self._entry(raw)[0]]  # fills the cache for next time

    def encode_text(self, text: str) -> tuple[list[int], list[Span], list[int]]:
        """Piece ids, character offsets and word indices of one text, without special tokens."""
        ids: list[int] = []
        offsets: list[Span] = []
        words: list[int] = []
        n_words = 0
        finditer, cache, entry = self.basic.pattern.finditer, self._cache, self._entry
        for start, end, special in self._segments(text) if text else ():
            if special:
                ids.append(self._special_id(text[start:end]))
                offsets.append((start, end))
                words.append(n_words)
                n_words += 1
                continue
            for m in finditer(text, start, end):
                raw = m.group()
                e_ids, e_offs, e_words, e_n = cache.get(raw) or entry(raw)
                base = m.start()
                if len(e_ids) == 1:  # most words are one piece
                    ids.append(e_ids[0])
                    s, t = e_offs[0]
                    offsets.append((base + s, base + t))
                    words.append(n_words)
                elif e_n:
                    ids.extend(e_ids)
                    offsets.extend([(base + s, base + t) for s, t in e_offs])
                    words.extend([n_words + w for w in e_words] if e_n > 1 else [n_words] * len(e_ids))
                n_words += e_n
        return ids, offsets, words

    def tokenize(self, text: str) -> list[str]:
        """The pieces of ``text`` as strings (no special tokens added)."""
        return [self.ids_to_tokens[i] for i in self.encode_ids(text)]

    def num_special_tokens(self, pair: bool = False) -> int:
        """BERT's template: [CLS] A [SEP], and B [SEP] for a pair."""
        return 3 if pair else 2

    def _assemble(self, a, b, return_offsets, return_word_ids) -> dict[str, list]:
        a_ids, a_offs, a_words = a
        ids = [self.cls_id, *a_ids, self.sep_id]
        types = [0] * len(ids)
        if b is not None:
            ids += [*b[0], self.sep_id]
            types += [1] * (len(b[0]) + 1)
        row: dict[str, list] = {"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids)}
        if return_offsets:
            offs = [(0, 0), *a_offs, (0, 0)]
            if b is not None:
                offs += [*b[1], (0, 0)]
            row["offsets"] = offs
        if return_word_ids:
            words = [None, *a_words, None]
            if b is not None:
                words += [*b[2], None]
            row["word_ids"] = words
        return row

    # ------------------------------------------------------------------ decoding
    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        ids = _as_list(ids)
        out = []
        for i in ids:
            if not 0 <= i < len(self.ids_to_tokens) or self.ids_to_tokens[i] is None:
                raise LmforgeError(f"token id {i} is outside the vocabulary (size {self.vocab_size})")
            out.append(self.ids_to_tokens[i])
        return out

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        return [self.vocab.get(t, self.unk_id) for t in tokens]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Turn ids back into text: pieces joined into words, words separated by one space.

        Decoding inverts encoding up to normalisation: ``decode(encode(text))`` is the normalised text with
        one space between words (punctuation is a word), unless a word became ``[UNK]``. The newline token (if the
        tokenizer has one) decodes to a line break, with no space beside it, also when special tokens are skipped.
        """
        lines: list[list[str]] = [[]]
        for i, tok in zip(_as_list(ids), self.convert_ids_to_tokens(ids), strict=True):
            if i == self.newline_id:
                lines.append([])
                continue
            if skip_special_tokens and i in self.special_ids:
                continue
            words = lines[-1]
            if tok.startswith("##") and words:
                words[-1] += tok[2:]
            else:
                words.append(tok)
        return "\n".join(" ".join(words) for words in lines)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = True) -> list[str]:
        """``decode`` of each row of a batch (a list of id lists, or a (B, T) tensor or array), as Hugging Face's
        ``batch_decode``: padding is a special token, so padded rows decode like unpadded ones."""
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in _as_rows(sequences)]

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict[str, Any]:
        """Settings in the layout of a Hugging Face ``tokenizer_config.json`` (readable by both)."""
        return {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.basic.lowercase,
            "strip_accents": self.basic.strip_accents,
            "tokenize_chinese_chars": self.basic.tokenize_chinese_chars,
            "unk_token": self.unk_token, "sep_token": self.sep_token, "pad_token": self.pad_token,
            "cls_token": self.cls_token, "mask_token": self.mask_token,
            "model_max_length": self.model_max_length,
            "lmforge": {"special_tokens": self.special_tokens,
                        "max_input_chars_per_word": self.max_input_chars_per_word,
                        **({} if self.newline_token is None else {"newline_token": self.newline_token})},
        }

    def save_pretrained(self, directory: str | Path, overwrite: bool = False) -> Path:
        """Write ``vocab.txt`` and ``tokenizer_config.json`` into ``directory`` (atomically).

        Raises:
            LmforgeError: the folder already holds a tokenizer and ``overwrite`` is false.
        """
        directory = Path(directory)
        check_can_write(directory / VOCAB_NAME, overwrite, "a tokenizer")
        if any(t is None for t in self.ids_to_tokens):
            raise LmforgeError("the vocabulary has gaps in its ids and cannot be written as vocab.txt")
        save_vocab(self.ids_to_tokens, directory / VOCAB_NAME)  # type: ignore[arg-type]
        atomic_write_text(directory / CONFIG_NAME, json.dumps(self.config(), indent=2) + "\n")
        return directory

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides: Any) -> WordPieceTokenizer:
        """Load from a folder holding ``vocab.txt`` (ours or any BERT checkpoint's), or a vocab file.

        ``tokenizer_config.json`` is read when present. Without it, lower-casing is inferred from the
        vocabulary: a vocabulary with no upper-case letters outside special tokens is an uncased one.
        Keyword arguments override what the files say.
        """
        path = Path(path)
        if path.is_dir():
            vocab_file, config_file = path / VOCAB_NAME, path / CONFIG_NAME
            if not vocab_file.is_file():
                raise InputFileError(f"{path}: no {VOCAB_NAME} in this folder; train a tokenizer with "
                                     "`lmforge tokenizer train` or point at a BERT checkpoint folder")
        elif path.is_file():
            vocab_file, config_file = path, path.parent / CONFIG_NAME
        else:
            raise InputFileError(f"{path}: no such tokenizer folder or vocab file")
        vocab = load_vocab(vocab_file)  # a binary or non-UTF-8 file: an error naming the file and line
        kwargs: dict[str, Any] = {}
        if config_file.is_file():
            try:
                cfg = json.loads(config_file.read_bytes().decode("utf-8"))
            except UnicodeDecodeError as err:
                raise InputFileError(f"{config_file}: not UTF-8 text (bad byte at offset {err.start}); delete it or "
                                     "save the tokenizer again") from None
            except (ValueError, RecursionError) as err:  # JSONDecodeError, a number too long, nesting too deep
                raise InputFileError(f"{config_file}: not valid JSON ({err})") from None
            if not isinstance(cfg, dict):
                raise InputFileError(f"{config_file}: not a JSON object (it holds a {type(cfg).__name__}); a "
                                     "tokenizer config is an object such as {\"do_lower_case\": true}")
            kwargs = _kwargs_from_config(cfg, config_file)
        else:
            kwargs["lowercase"] = not any(
                any(c.isupper() for c in tok) for tok in vocab if not (tok.startswith("[") and tok.endswith("]")))
        kwargs.update(overrides)
        try:
            return cls(vocab, **kwargs)
        except LmforgeError as err:
            raise LmforgeError(f"{vocab_file}: {err}") from None


def _kwargs_from_config(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if "do_lower_case" in cfg:
        kwargs["lowercase"] = bool(cfg["do_lower_case"])
    if "strip_accents" in cfg:
        kwargs["strip_accents"] = cfg["strip_accents"]
    if "tokenize_chinese_chars" in cfg:
        kwargs["tokenize_chinese_chars"] = bool(cfg["tokenize_chinese_chars"])
    for role in ("unk_token", "cls_token", "sep_token", "pad_token", "mask_token"):
        value = cfg.get(role)
        if isinstance(value, dict):  # Hugging Face's serialised AddedToken
            value = value.get("content")
        if isinstance(value, str):
            kwargs[role] = value
    max_len = cfg.get("model_max_length")
    if isinstance(max_len, int) and 0 < max_len < 1_000_000:  # HF writes 1e30 for "no limit"
        kwargs["model_max_length"] = max_len
    ours = cfg.get("lmforge", {})
    if not isinstance(ours, dict):
        raise InputFileError(f"{path}: \"lmforge\" must be an object, got {ours!r:.60}")
    tokens = ours.get("special_tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise InputFileError(f"{path}: lmforge.special_tokens must be a list of tokens, got {tokens!r:.60}")
    if "special_tokens" in ours:
        kwargs["special_tokens"] = tokens
    if "max_input_chars_per_word" in ours:
        value = ours["max_input_chars_per_word"]
        if type(value) is not int:
            raise InputFileError(f"{path}: lmforge.max_input_chars_per_word must be an integer, got {value!r:.60}")
        kwargs["max_input_chars_per_word"] = value
    if "newline_token" in ours:
        value = ours["newline_token"]
        if not isinstance(value, str) or not value:
            raise InputFileError(f"{path}: lmforge.newline_token must be a token (a string), got {value!r:.60}")
        kwargs["newline_token"] = value
    return kwargs


def _truncation_strategy(truncation: bool | str) -> str | None:
    if truncation is False or truncation is None:
        return None
    if truncation is True:
        return "longest_first"
    if truncation not in TRUNCATION_STRATEGIES:
        raise LmforgeError(f"truncation={truncation!r} is not one of False, True, "
                           + ", ".join(repr(s) for s in TRUNCATION_STRATEGIES))
    return truncation


def _padding_strategy(padding: bool | str) -> str | None:
    if padding is False or padding is None:
        return None
    if padding is True:
        return "longest"
    if padding not in PADDING_STRATEGIES:
        raise LmforgeError(f"padding={padding!r} is not one of False, True, 'longest', 'max_length'")
    return padding


def _cut(enc, n: int):
    ids, offs, words = enc
    return ids[:n], None if offs is None else offs[:n], None if words is None else words[:n]


def _truncate(a, b, max_length: int, strategy: str, n_special: int | None = None):
    """Cut the piece sequences so that, with ``n_special`` special tokens (BERT's 2, or 3 for a pair, by
    default), they fit ``max_length``.

    ``longest_first`` gives the budget to the shorter text when it fits in half of it, otherwise cuts the
    shorter one to half (rounded down; on a tie the first text counts as the shorter) and gives the rest to
    the other. This is the rule of Hugging Face tokenizers, so the results agree token for token.
    """
    n1, n2 = len(a[0]), (len(b[0]) if b is not None else 0)
    if n_special is None:
        n_special = 3 if b is not None else 2
    budget = max_length - n_special
    if budget < 0:
        raise LmforgeError(f"max_length={max_length} is shorter than the special tokens alone; "
                           f"use at least {n_special} plus room for the text")
    if n1 + n2 <= budget:
        return a, b, 0
    if b is None:
        if strategy == "only_second":
            raise LmforgeError("truncation='only_second' needs a text pair")
        return _cut(a, budget), None, n1 - budget
    if strategy == "only_first":
        keep1, keep2 = budget - n2, n2
    elif strategy == "only_second":
        keep1, keep2 = n1, budget - n1
    else:
        first_is_shorter = n1 <= n2
        shorter, longer = (n1, n2) if first_is_shorter else (n2, n1)
        shorter = min(shorter, budget // 2)
        longer = budget - shorter
        keep1, keep2 = (shorter, longer) if first_is_shorter else (longer, shorter)
    if keep1 < 0 or keep2 < 0:
        which = "first" if keep1 < 0 else "second"
        raise LmforgeError(f"truncation={strategy!r} cannot fit the pair in max_length={max_length}: the "
                           f"other text alone has {n2 if which == 'first' else n1} tokens; raise max_length "
                           "or use truncation='longest_first'")
    return _cut(a, keep1), _cut(b, keep2), (n1 - keep1) + (n2 - keep2)


def _as_list(ids: Any) -> list[int]:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return [int(i) for i in ids]


def _as_rows(sequences: Any) -> list[Any]:
    """The rows of a batch of id sequences: a list of lists, a 2-D tensor or array (one row per sequence)."""
    if hasattr(sequences, "tolist"):
        sequences = sequences.tolist()
    if not isinstance(sequences, (list, tuple)) or any(isinstance(s, (int, str)) for s in sequences):
        raise LmforgeError("batch_decode takes a batch of id sequences (a list of lists or a 2-D tensor); "
                           "use decode(ids) for one sequence")
    return list(sequences)


def _to_tensors(batch: BatchEncoding, kind: str) -> BatchEncoding:
    if kind not in ("pt", "np"):
        raise LmforgeError(f"return_tensors={kind!r} is not one of None, 'pt', 'np'")
    lengths = {len(x) for x in batch["input_ids"]}
    if len(lengths) > 1:
        raise LmforgeError("return_tensors needs sequences of equal length; pass padding=True")
    import numpy as np

    out = BatchEncoding()
    for k, v in batch.items():
        if k == "word_ids":
            out[k] = v  # holds None; stays a list
            continue
        arr = np.asarray(v, dtype=np.int64)
        if kind == "pt":
            import torch

            arr = torch.from_numpy(arr)
        out[k] = arr
    out.num_truncated = batch.num_truncated
    out.truncated_tokens = batch.truncated_tokens
    return out
