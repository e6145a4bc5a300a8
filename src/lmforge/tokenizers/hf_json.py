"""Tokenizers from a Hugging Face ``tokenizer.json`` (the one file ``transformers`` 5 saves beside a model).

Read without the ``tokenizers`` package:

* ``WordPiece`` models (BERT, DistilBERT, ELECTRA): the vocabulary, ``[UNK]``, the ``##`` prefix and the longest
  word, with the ``BertNormalizer``'s flags (lower-casing, accent stripping, CJK characters) and the added special
  tokens, as ``WordPieceTokenizer``;
* byte-level ``BPE`` models (GPT-2, RoBERTa): the vocabulary and the ranked merges (either JSON spelling: ``"a b"``
  strings or ``["a", "b"]`` pairs) and the added tokens, as ``ByteLevelBPETokenizer``;
* SentencePiece ``Unigram`` models (ALBERT, XLNet, T5), with their normaliser, Metaspace pre-tokenizer and template,
  as ``UnigramTokenizer`` (``lmforge.tokenizers.unigram``).

Any other model (WordLevel, a BPE without the byte-level pre-tokenizer) is refused with a message that names it: a
tokenizer is never dropped or replaced without a word.

``wordpiece_tokenizer_json`` writes the other way: the ``tokenizer.json`` of a ``WordPieceTokenizer``, in the layout
``transformers``' ``BertTokenizerFast`` saves (BERT's normaliser and pre-tokenizer, ``[CLS] A [SEP]`` and ``[CLS] A
[SEP] B [SEP]`` with segment ids), which ``lmforge convert --to-hf`` puts beside ``vocab.txt``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmforge.errors import InputFileError, LmforgeError

__all__ = ["TOKENIZER_JSON", "from_tokenizer_json", "wordpiece_tokenizer_json"]

TOKENIZER_JSON = "tokenizer.json"
_ROLES = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
          "mask_token": "[MASK]"}


def tokenizer_json_path(path: str | Path) -> Path:
    """``path`` itself, or the ``tokenizer.json`` of the folder ``path``.

    Raises:
        InputFileError: there is no such file.
    """
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_JSON
    if not path.is_file():
        raise InputFileError(f"{path}: no such file; pass a tokenizer.json or the folder holding one")
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputFileError(f"{path}: cannot read it as JSON ({err}); save the tokenizer again") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise InputFileError(f"{path}: no \"model\" object; this is not a Hugging Face tokenizer.json")
    return data


def _parts(node: Any, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` steps of a normalizer or pre-tokenizer, looking inside ``Sequence`` steps."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        inner = node.get("normalizers") or node.get("pretokenizers") or []
        return [p for step in inner for p in _parts(step, kind)]
    return [node] if node.get("type") == kind else []


def _added(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(special tokens, other added tokens) of ``added_tokens``."""
    special, other = [], []
    for entry in data.get("added_tokens") or []:
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            (special if entry.get("special") else other).append(entry["content"])
    return special, other


def _wordpiece(path: Path, data: dict[str, Any]) -> Any:
    from lmforge.tokenizers import WordPieceTokenizer

    model = data["model"]
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise InputFileError(f"{path}: the WordPiece model has no vocabulary")
    prefix = model.get("continuing_subword_prefix", "##")
    if prefix != "##":
        raise InputFileError(f"{path}: word pieces continue with {prefix!r}; lmforge's WordPiece uses '##'")
    kwargs: dict[str, Any] = {"max_input_chars_per_word": int(model.get("max_input_chars_per_word", 100))}
    norm = _parts(data.get("normalizer"), "BertNormalizer")
    if norm:
        kwargs["lowercase"] = bool(norm[0].get("lowercase", True))
        kwargs["strip_accents"] = norm[0].get("strip_accents")
        kwargs["tokenize_chinese_chars"] = bool(norm[0].get("handle_chinese_chars", True))
    else:
        lowercase = _parts(data.get("normalizer"), "Lowercase")
        kwargs["lowercase"] = bool(lowercase)
    special, _ = _added(data)
    special = [t for t in special if t in vocab]
    if isinstance(model.get("unk_token"), str):
        kwargs["unk_token"] = model["unk_token"]
    for role, default in _ROLES.items():
        if role != "unk_token" and default not in special:
            raise InputFileError(f"{path}: no special token {default} among the added tokens; lmforge's WordPiece "
                                 "needs BERT's [CLS] [SEP] [PAD] [MASK] [UNK]")
    kwargs["special_tokens"] = list(dict.fromkeys([kwargs.get("unk_token", "[UNK]"), *special]))
    try:
        return WordPieceTokenizer(vocab, **kwargs)
    except LmforgeError as err:
        raise InputFileError(f"{path}: {err}") from None


def _byte_bpe(path: Path, data: dict[str, Any]) -> Any:
    from lmforge.tokenizers import ByteLevelBPETokenizer

    model = data["model"]
    if not _parts(data.get("pre_tokenizer"), "ByteLevel"):
        raise InputFileError(f"{path}: a BPE model without GPT-2's byte-level pre-tokenizer; lmforge reads "
                             "byte-level BPE (GPT-2, RoBERTa) only")
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise InputFileError(f"{path}: the BPE model needs a vocabulary and a list of merges")
    pairs = []
    for i, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) for p in parts):
            raise InputFileError(f"{path}: merge {i + 1} ({merge!r:.40}) is not a pair of tokens")
        pairs.append((parts[0], parts[1]))
    special, other = _added(data)
    eos = next((t for t in ("<|endoftext|>", "</s>") if t in special), None)
    bos = "<s>" if "<s>" in special else None
    pad = "<pad>" if "<pad>" in special else None
    mask = "<mask>" if "<mask>" in special else None  # RoBERTa's
    try:
        return ByteLevelBPETokenizer(vocab, pairs, eos_token=eos, bos_token=bos, pad_token=pad, mask_token=mask,
                                     special_tokens=special, added_tokens=other)
    except LmforgeError as err:
        raise InputFileError(f"{path}: {err}") from None


def from_tokenizer_json(path: str | Path) -> Any:
    """The lmforge tokenizer of a ``tokenizer.json`` file, or of the folder holding one (see the module docstring).

    Raises:
        InputFileError: the file is missing or damaged, or holds a model lmforge cannot read (named).
    """
    path = tokenizer_json_path(path)
    data = _read(path)
    kind = data["model"].get("type")
    if kind == "WordPiece":
        return _wordpiece(path, data)
    if kind == "BPE":
        return _byte_bpe(path, data)
    if kind == "Unigram":
        from lmforge.tokenizers.unigram import UnigramTokenizer

        return UnigramTokenizer.from_pretrained(path)
    raise InputFileError(f"{path}: a {kind or 'untyped'} tokenizer model, which lmforge cannot read yet (it reads "
                         "WordPiece, byte-level BPE and Unigram); keep using it with the tokenizers package, or save "
                         "the model's vocab.txt or vocab.json + merges.txt beside it")


def wordpiece_tokenizer_json(tokenizer: Any) -> dict[str, Any]:
    """The ``tokenizer.json`` content of a ``WordPieceTokenizer`` (see the module docstring)."""
    vocab = {tok: i for i, tok in enumerate(tokenizer.ids_to_tokens) if tok is not None}
    basic = tokenizer.basic
    cls, sep = tokenizer.cls_token, tokenizer.sep_token
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in tokenizer.special_tokens if t in vocab]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": True,
                       "handle_chinese_chars": basic.tokenize_chinese_chars,
                       "strip_accents": basic.strip_accents, "lowercase": basic.lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": cls, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": sep, "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": cls, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": sep, "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": sep, "type_id": 1}}],
            "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in (cls, sep)},
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": tokenizer.unk_token, "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": tokenizer.max_input_chars_per_word, "vocab": vocab},
    }


def byte_bpe_tokenizer_json(tokenizer: Any) -> dict[str, Any]:
    """The ``tokenizer.json`` content of a ``ByteLevelBPETokenizer``: GPT-2's byte-level pre-tokenizer (no prefix
    space), the BPE model with its merges in rank order, the added tokens, and RoBERTa's post-processor
    (``<s> A </s></s> B </s>``) when the tokenizer wraps texts, else GPT-2's (none)."""
    vocab = {tok: i for i, tok in enumerate(tokenizer.ids_to_tokens)}
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": t in tokenizer.special_tokens}
             for t in sorted(tokenizer.added_tokens, key=vocab.__getitem__)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if tokenizer.wraps_texts:
        post = {"type": "RobertaProcessing", "sep": [tokenizer.eos_token, tokenizer.eos_id],
                "cls": [tokenizer.bos_token, tokenizer.bos_id], "trim_offsets": True, "add_prefix_space": False}
    else:
        post = {**byte_level, "trim_offsets": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": post,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in tokenizer.merges]},
    }
