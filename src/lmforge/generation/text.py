"""Generated ids back to text a person reads: the prompt and its continuation, word pieces joined.

A language model continues its prompt, and its first new piece often continues the prompt's last word (``##e``
after ``sharp``). Decoding the new ids alone would print that piece as a word of its own; decoding the prompt and
the continuation together and keeping what the continuation added joins it. The text returned starts with the
prompt *as the user wrote it* (case and spacing kept), followed by the continuation as the tokenizer decodes it.

WordPiece decoding puts one space between words, punctuation included (``the match , he said .``);
``tidy_spacing`` removes the spaces English does not write (before ``. , ; : ! ? % )``, after ``(``, inside
``n't`` and ``'s``, inside ``1.5`` and ``2,000``), as Hugging Face's ``clean_up_tokenization_spaces`` does for most
of them. Byte-level BPE decodes exactly and is left as it is.

An encoder-decoder writes a new text rather than continuing its source: its text is the decoded target alone.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmforge.errors import InputFileError, LmforgeError
from lmforge.models import Architecture, architecture, architectures_with

log = logging.getLogger("lmforge")

__all__ = ["continuation_text", "encode_prompt", "generate_batched", "generated_text", "generated_texts",
           "load_generator", "tidy_spacing"]

_BEFORE = re.compile(r" +([.,;:!?%)\]}])")
_AFTER = re.compile(r"([(\[{$£]) +")
_CONTRACTION = re.compile(r"(\w) ?' ?(s|t|re|ve|m|ll|d)\b")
_NOT = re.compile(r" n't\b")
_DECIMAL = re.compile(r"(\d)\. (\d)")
_THOUSANDS = re.compile(r"(\d), (\d{3})\b")


def tidy_spacing(text: str) -> str:
    """``text`` without the spaces WordPiece decoding puts before punctuation and inside contractions.

    ``"shares rose 5 % , he said ."`` -> ``"shares rose 5%, he said."``; ``"don ' t"`` -> ``"don't"``;
    ``"the firm ' s"`` -> ``"the firm's"``; ``"$ 1 . 5bn"`` -> ``"$1.5bn"``; ``"2 , 000"`` -> ``"2,000"``. Hyphens and
    quotes keep their spaces: WordPiece decoding cannot tell ``"a - b"`` from ``"a-b"``, nor an opening quote from a
    closing one.
    """
    text = _BEFORE.sub(r"\1", text)
    text = _DECIMAL.sub(r"\1.\2", text)
    text = _THOUSANDS.sub(r"\1,\2", text)
    text = _AFTER.sub(r"\1", text)
    text = _NOT.sub("n't", text)
    return _CONTRACTION.sub(r"\1'\2", text)


def _lossy_spacing(tokenizer: Any) -> bool:
    """Whether the tokenizer's decoding spaces every word (WordPiece) rather than restoring the text's own spaces
    (byte-level BPE)."""
    from lmforge.tokenizers.wordpiece import WordPieceTokenizer

    return isinstance(tokenizer, WordPieceTokenizer)


def continuation_text(tokenizer: Any, prompt_ids: Sequence[int], new_ids: Sequence[int]) -> str:
    """The text that ``new_ids`` add after ``prompt_ids``: starts with a space when the continuation starts a new
    word, with none when its first piece continues the prompt's last word.

    Special tokens are dropped. When the prompt's own decoding is not a prefix of the whole (a byte-level BPE
    prompt cut inside a character, say), the continuation is decoded alone.
    """
    prompt, new = list(prompt_ids), list(new_ids)
    head = tokenizer.decode(prompt, skip_special_tokens=True)
    whole = tokenizer.decode(prompt + new, skip_special_tokens=True)
    if whole.startswith(head):
        tail = whole[len(head):]
    else:
        tail = tokenizer.decode(new, skip_special_tokens=True)
        if _lossy_spacing(tokenizer):
            tail = " " + tail.removeprefix("##")
    if not head and _lossy_spacing(tokenizer):
        tail = tail.lstrip()
    return tail


def generated_texts(tokenizer: Any, prompt: str, prompt_ids: Sequence[int], new_ids: Sequence[int], *,
                    continues: bool = True, tidy: bool = True) -> tuple[str, str]:
    """(the prompt followed by its continuation, the continuation alone) of one generation; an encoder-decoder's
    target (``continues`` False) is both. See ``generated_text`` for the arguments."""
    lossy = tidy and _lossy_spacing(tokenizer)
    if not continues:
        text = tokenizer.decode(list(new_ids), skip_special_tokens=True)
        text = tidy_spacing(text) if lossy else text
        return text, text
    tail = continuation_text(tokenizer, prompt_ids, new_ids)
    if lossy:
        # tidied together with the prompt's last word, so that "said" + " ." becomes "said."
        tail = tidy_spacing("x" + tail)[1:]
    joined = tail[1:] if prompt[-1:].isspace() and tail.startswith(" ") else tail  # "said " + " the": one space
    return prompt + joined, (tail.lstrip() if lossy else tail)


def generated_text(tokenizer: Any, prompt: str, prompt_ids: Sequence[int], new_ids: Sequence[int], *,
                   continues: bool = True, full_text: bool = True, tidy: bool = True) -> str:
    """The text of one generation.

    Args:
        tokenizer: the model's tokenizer (WordPiece or byte-level BPE).
        prompt: the prompt as the user wrote it.
        prompt_ids: the prompt's pieces as the model read them (special tokens may be among them; they are dropped).
        new_ids: the generated ids (without the stop token).
        continues: True for a language model (the new ids continue the prompt); False for an encoder-decoder (they
            are a new text, returned alone whatever ``full_text``).
        full_text: the prompt followed by its continuation (True, Hugging Face's ``return_full_text``), or the
            continuation alone.
        tidy: ``tidy_spacing`` on WordPiece text (no effect on byte-level BPE).
    """
    full, tail = generated_texts(tokenizer, prompt, prompt_ids, new_ids, continues=continues, tidy=tidy)
    return full if full_text else tail


# ---------------------------------------------------------------------------------------------- from a folder
def load_generator(directory: str | Path, runtime: str = "torch") -> tuple[Any, Any, Architecture]:
    """The model, its tokenizer and its family's record; refuses models that do not generate. ``runtime`` as
    ``lmforge.persistence.load_pretrained``'s."""
    from lmforge.persistence import load_pretrained

    loaded = load_pretrained(directory, with_head=False, runtime=runtime)
    arch = loaded.config.arch
    family = architecture(arch)
    if not family.generates:
        # a task model built on another family's folder (ELMo on its biLM): that folder generates
        base = [name for name in architectures_with("generates") if architecture(name).finetune_as == arch]
        if base:
            raise LmforgeError(f"{directory} holds a fine-tuned {arch!r} model, which does not generate; generation "
                               f"needs the {base[0]!r} folder it was fine-tuned from (its language model)")
        raise LmforgeError(f"{directory} holds a {arch!r} model; generation needs a GPT decoder (lmforge pretrain "
                           "--objective clm) or an encoder-decoder (lmforge train-seq2seq): one of "
                           f"{', '.join(architectures_with('generates'))}")
    if loaded.tokenizer is None:
        raise InputFileError(f"{directory}: no tokenizer to turn text into ids (no WordPiece vocab.txt, byte-level BPE "
                             "vocab.json + merges.txt or tokenizer.json). Save the model with its tokenizer, or call "
                             "lmforge.generation.generate on token ids from Python")
    log.info("loaded %s (%s, %d layers, vocabulary %d)", directory, arch, loaded.config.n_layers,
             loaded.config.vocab_size)
    return loaded.model, loaded.tokenizer, family


def encode_prompt(tokenizer: Any, text: str, family: Architecture, where: str, max_len: int) -> list[int]:
    """The ids of one prompt as training made them (see the module docstring); refuses a prompt longer than the
    positions the model has."""
    pieces = tokenizer.encode_ids(text)
    if not pieces:
        raise LmforgeError(f"{where}: the prompt is empty (no tokens); give some text")
    # A causal LM's prompt looks like the start of a document: right after the [SEP] that ends the previous one.
    ids = [tokenizer.sep_id, *pieces] if family.is_causal_lm else pieces
    if family.position_limited and len(ids) > max_len:  # a recurrent model reads any length
        extra = " with the leading [SEP]" if family.is_causal_lm else ""
        raise LmforgeError(f"{where}: the prompt has {len(ids)} tokens{extra}, longer than the model's context "
                           f"(max_seq_len={max_len}); shorten it")
    return ids


def generate_batched(model: Any, prompts: list[list[int]], config: Any, batch_size: int) -> list[tuple]:
    """Generate for id lists in batches of similar length (padded on the left); results in the input order, each
    ``(sequences, scores, log_probs, stop_tokens)`` of one prompt."""
    import torch

    from lmforge.generation import generate

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding per batch
    results: list[tuple] = [()] * len(prompts)
    generator = None
    if config.strategy == "sample":  # one stream for the whole run: batches do not repeat each other's draws
        generator = torch.Generator()
        if config.seed is None:
            generator.seed()
        else:
            generator.manual_seed(config.seed)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), config.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            n = len(prompts[i])
            ids[row, width - n:] = torch.tensor(prompts[i], dtype=torch.long)
            mask[row, width - n:] = 1
        out = generate(model, ids, mask, config=config, generator=generator)
        for row, i in enumerate(chunk):
            results[i] = (out.sequences[row], out.scores[row], out.log_probs[row], out.stop_tokens[row])
    return results
