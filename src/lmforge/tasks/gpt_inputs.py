"""GPT-1's input transformations (Radford et al. 2018, section 3.3 and Figure 1).

A decoder reads left to right, so a task's input is laid out for it to end on one token that has read everything:

- classification:  ``[START] text [EXTRACT]``
- entailment:      ``[START] premise [DELIM] hypothesis [EXTRACT]``
- similarity:      both orders, ``[START] a [DELIM] b [EXTRACT]`` and ``[START] b [DELIM] a [EXTRACT]``, whose
  extract-token states are added before the linear layer (``--task pair --task.symmetric=true``)
- multiple choice: ``[START] context [DELIM] option_k [EXTRACT]`` for every option k, a score per option, a softmax
  over the options (``--task choice``)

The task reads the decoder's state at ``[EXTRACT]`` (``DecoderOutput.pooled_output``). The three tokens are added to
the vocabulary and the embeddings when the model lacks them (the paper's "randomly initialized start and end
tokens"; here ``[START]`` starts as a copy of the document-start token the model was pretrained with, and ``[DELIM]`` /
``[EXTRACT]`` as the mean of the embeddings, so the first steps do not read noise: an initialisation choice the paper
leaves open).

Every task keeps building its BERT layout (``[CLS] a [SEP] b [SEP]``, QA's ``[CLS] question [SEP] context [SEP]``,
tagging's ``[CLS] words [SEP]``); ``to_gpt_layout`` then maps it token for token: the leading ``[CLS]`` becomes
``[START]``, the row's last ``[SEP]`` becomes ``[EXTRACT]`` and any earlier ``[SEP]`` becomes ``[DELIM]``. Positions
are unchanged, so span and token labels keep pointing at the same tokens.
"""

from __future__ import annotations

import logging
from typing import Any

from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

START, DELIM, EXTRACT = "[START]", "[DELIM]", "[EXTRACT]"
GPT_TOKENS = (START, DELIM, EXTRACT)


def gpt_token_ids(tokenizer: Any) -> tuple[int, int, int]:
    """The ids of [START], [DELIM], [EXTRACT] in ``tokenizer``.

    Raises:
        LmforgeError: one is missing (the fine-tuning recipe adds them; a folder saved without them is not a
            GPT-1 fine-tuned model).
    """
    vocab = tokenizer.vocab
    missing = [t for t in GPT_TOKENS if t not in vocab]
    if missing:
        raise LmforgeError(f"the tokenizer has no {', '.join(missing)} token(s), which GPT-1 style inputs need "
                           "(input_format='gpt'); `lmforge finetune` adds them to a decoder's vocabulary — use the "
                           "tokenizer saved with the fine-tuned model")
    return vocab[START], vocab[DELIM], vocab[EXTRACT]


def to_gpt_layout(ids: list[int], cls_id: int, sep_id: int, gpt_ids: tuple[int, int, int]) -> list[int]:
    """Map one BERT-layout row to GPT-1's: leading [CLS] -> [START], last [SEP] -> [EXTRACT], other [SEP] ->
    [DELIM]; every other id (and every position) is kept."""
    start, delim, extract = gpt_ids
    out = list(ids)
    first = 1 if out and out[0] == cls_id else 0  # (GPT-2's tokenizer has one token for both [CLS] and [SEP])
    if first:
        out[0] = start
    seps = [i for i in range(first, len(out)) if out[i] == sep_id]
    for i in seps[:-1]:
        out[i] = delim
    if seps:
        out[seps[-1]] = extract
    return out


def apply_gpt_layout(features: list[dict[str, Any]], tokenizer: Any) -> None:
    """Rewrite every feature's rows in place: ``input_ids`` (token, span and QA features) or each of ``windows``
    (sequence, pair and choice features)."""
    gpt_ids = gpt_token_ids(tokenizer)
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    for feature in features:
        if "input_ids" in feature:
            feature["input_ids"] = to_gpt_layout(feature["input_ids"], cls_id, sep_id, gpt_ids)
        if "windows" in feature:
            feature["windows"] = [to_gpt_layout(w, cls_id, sep_id, gpt_ids) for w in feature["windows"]]


def add_gpt_tokens(tokenizer: Any) -> tuple[Any, list[str]]:
    """``(tokenizer with [START], [DELIM], [EXTRACT], the tokens that were added)``; a tokenizer that has them all
    is returned as it is. Added tokens are special: never split, never lowercased, dropped by ``decode``.

    A WordPiece tokenizer is rebuilt with the longer vocabulary (the original is left unchanged); another tokenizer
    must offer ``add_tokens(tokens)`` (the byte-level BPE does).
    """
    missing = [t for t in GPT_TOKENS if t not in tokenizer.vocab]
    if not missing:
        return tokenizer, []
    from lmforge.tokenizers import WordPieceTokenizer

    if isinstance(tokenizer, WordPieceTokenizer):
        rows = list(tokenizer.ids_to_tokens)
        if any(t is None for t in rows):
            raise LmforgeError("the tokenizer's vocabulary has gaps in its ids; cannot add GPT-1's special tokens")
        grown = WordPieceTokenizer(
            [*rows, *missing], lowercase=tokenizer.lowercase, strip_accents=tokenizer.basic.strip_accents,
            tokenize_chinese_chars=tokenizer.basic.tokenize_chinese_chars,
            special_tokens=[*tokenizer.special_tokens, *missing], unk_token=tokenizer.unk_token,
            cls_token=tokenizer.cls_token, sep_token=tokenizer.sep_token, pad_token=tokenizer.pad_token,
            mask_token=tokenizer.mask_token, max_input_chars_per_word=tokenizer.max_input_chars_per_word,
            model_max_length=tokenizer.model_max_length)
        return grown, missing
    add = getattr(tokenizer, "add_tokens", None)
    if add is None:
        raise LmforgeError(f"a {type(tokenizer).__name__} cannot take new tokens; GPT-1 fine-tuning needs "
                           f"{', '.join(missing)} in the vocabulary")
    add(missing)
    return tokenizer, missing


def grow_embeddings(backbone: Any, tokenizer: Any, added: list[str]) -> None:
    """Give the tokens ``added`` to ``tokenizer`` rows in ``backbone``'s embeddings (``resize_token_embeddings``):
    [START] copies the document-start token's row, the others start at the mean row (see the module docstring).
    A separate LM head's new rows get the same vectors."""
    import torch

    if not added:
        return
    old = min(backbone.config.vocab_size, min(tokenizer.vocab[t] for t in added))  # rows trained before
    if tokenizer.vocab_size > backbone.config.vocab_size:  # else spare rows of the table take the new ids
        backbone.resize_token_embeddings(tokenizer.vocab_size)
    # the token the pretrained model saw at every document start: [SEP] in lmforge's causal-LM stream, GPT-2's
    # <|endoftext|> (which its byte-level BPE tokenizer also names sep_id)
    start_from = getattr(tokenizer, "sep_id", None)
    tables = [backbone.get_input_embeddings().weight]
    if getattr(backbone, "lm_head", None) is not None:
        tables.append(backbone.lm_head.weight)
    with torch.no_grad():
        for table in tables:
            mean = table[:old].mean(0)
            for token in added:
                row = tokenizer.vocab[token]
                table[row] = table[start_from] if token == START and start_from is not None else mean
    log.info("GPT-1 inputs: added %s to the vocabulary (%d tokens, %d embedding rows)", ", ".join(added),
             tokenizer.vocab_size, backbone.config.vocab_size)
