"""``lmforge generate``: continue prompts with a language model, or write targets with an encoder-decoder.

The model folder is an lmforge folder with its WordPiece tokenizer (``vocab.txt``): a ``Decoder`` from
``lmforge pretrain --objective clm``, an ``AWDLSTM`` from ``--objective awd_lm`` or a ``BiLM`` from ``--objective
bilm`` (its forward LM), or an ``EncoderDecoder`` / ``RNNSeq2Seq`` from ``lmforge train-seq2seq``.
How a text becomes ids mirrors training:

* decoder-only: ``[SEP]`` followed by the text's pieces. Causal-LM training streams documents each followed by
  ``[SEP]`` (``lmforge.data.instances.make_causal_blocks``), so a document starts right after a ``[SEP]``; the
  prompt is made to look like the start of a document. Generation stops at the next ``[SEP]`` (the end of the
  document) or at a ``--stop`` token.
* encoder-decoder: the source is the text's pieces without special tokens, the decoder starts from ``[CLS]`` and
  stops at ``[SEP]`` (``lmforge.data.seq2seq``: targets are ``[CLS] y [SEP]``).

Output: for every prompt line, ``--num-return-sequences`` lines (its best hypotheses, best first; one by default),
each the generated text only (the prompt is not repeated; special tokens are dropped). ``--json`` writes one JSON object
per prompt instead: ``{"prompt", "generations": [{"text", "score", "log_prob", "tokens", "stop"}]}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from lmforge.commands.options import POSITIVE, SEED, Count, Rate
from lmforge.errors import InputFileError, LmforgeError
from lmforge.models import Architecture, architecture, architectures_with

log = logging.getLogger("lmforge")

STRATEGIES = ("greedy", "beam", "sample")


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Examples: lmforge generate --model runs/gpt --prompt 'the match' --strategy sample --top-p 0.9 "
                "--seed 1;  lmforge generate --model runs/headlines --input articles.txt --strategy beam --num-beams 4 "
                "--length-penalty gnmt:0.6")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="an lmforge model folder with its tokenizer (GPT decoder, AWD-LSTM or biLM language model, "
                        "Transformer or RNN seq2seq)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", metavar="TEXT", help="one prompt (decoder) or source text (seq2seq)")
    source.add_argument("--input", metavar="FILE", help="UTF-8 text, one prompt per line (batched)")
    p.add_argument("--strategy", choices=STRATEGIES, default="greedy", help="default greedy")
    p.add_argument("--num-beams", dest="beams", type=Count(1, 1024), default=4, metavar="K",
                   help="beam size (beam; default 4)")
    p.add_argument("--num-return-sequences", dest="top", type=Count(1, 1024), default=1, metavar="T",
                   help="hypotheses printed per prompt (beam: the best T <= K; sample: T samples; default 1)")
    p.add_argument("--length-penalty", default="none", metavar="NAME",
                   help="beam ranking: none (sum of log-probs), average (per token) or gnmt:ALPHA "
                        "(((5+|Y|)/6)^ALPHA; larger ALPHA favours longer outputs); default none")
    p.add_argument("--temperature", type=POSITIVE, metavar="T", help="sampling temperature (> 0; default 1)")
    p.add_argument("--top-k", type=Count(1, 10_000_000), metavar="K",
                   help="sample from the K most likely tokens (default: all)")
    p.add_argument("--top-p", type=Rate(0.0, 1.0, low_open=True), metavar="P",
                   help="nucleus sampling: the smallest set with probability >= P")
    p.add_argument("--repetition-penalty", type=POSITIVE, metavar="R",
                   help="CTRL penalty for tokens already seen, prompt included (> 1 avoids them)")
    p.add_argument("--no-repeat-ngram-size", dest="no_repeat_ngram", type=Count(1, 1024), metavar="N",
                   help="never repeat an N-gram")
    p.add_argument("--max-new-tokens", type=Count(1, 1_000_000), default=30, metavar="N", help="default 30")
    p.add_argument("--stop", action="append", default=[], metavar="TOKEN",
                   help="a further vocabulary token that ends a generation besides [SEP] (repeatable), e.g. '.'")
    p.add_argument("--seed", type=SEED, metavar="S", help="seed of sampling (default: a random seed)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole prefix at every step (slow)")
    p.add_argument("--batch-size", type=Count(1, 65_536), default=16, metavar="N",
                   help="prompts per batch (default 16)")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt with every hypothesis and score")


def run_generate(args: argparse.Namespace) -> int:
    from lmforge.generation import GenerationConfig

    if args.batch_size < 1:
        raise LmforgeError(f"--batch-size {args.batch_size} must be >= 1")
    options = _options(args)
    config = GenerationConfig(**options)  # validates the options before the model is loaded
    model, tokenizer, family = _load(args.model)
    texts, where = _read_prompts(args)
    special = _special_ids(tokenizer, args.stop)
    # An encoder-decoder's decoder starts from [CLS] (its training targets are [CLS] y [SEP]); a causal LM
    # continues the prompt and needs no start token.
    config = config.replace(eos_id=tokenizer.sep_id, stop_ids=special, pad_id=tokenizer.pad_id,
                            bos_id=tokenizer.cls_id if family.has_encoder_decoder else None)
    prompts = [_encode(tokenizer, text, family, where(i), model.config.max_seq_len) for i, text in enumerate(texts)]
    results = generate_batched(model, prompts, config, args.batch_size)
    out = sys.stdout
    for text, result in zip(texts, results, strict=True):
        generations = [{"text": tokenizer.decode(seq, skip_special_tokens=True), "score": round(score, 6),
                        "log_prob": round(log_prob, 6), "tokens": len(seq),
                        "stop": None if stop is None else tokenizer.convert_ids_to_tokens([stop])[0]}
                       for seq, score, log_prob, stop in zip(*result, strict=True)]
        if args.json:
            out.write(json.dumps({"prompt": text, "generations": generations}, ensure_ascii=False) + "\n")
        else:
            for g in generations:
                out.write(g["text"] + "\n")
    out.flush()
    return 0


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"strategy": args.strategy, "max_new_tokens": args.max_new_tokens,
                               "num_return_sequences": args.top, "use_cache": not args.no_cache, "seed": args.seed}
    if args.top > 1 and args.strategy == "greedy":
        raise LmforgeError(f"--num-return-sequences {args.top}: greedy search finds one text per prompt; use "
                           "--strategy beam or sample for several")
    if args.strategy == "beam":
        if args.top > args.beams:
            raise LmforgeError(f"--num-return-sequences {args.top} exceeds --num-beams {args.beams}: beam search "
                               "keeps only K hypotheses; raise --num-beams or lower --num-return-sequences")
        options.update(num_beams=args.beams, length_penalty=args.length_penalty)
    elif args.length_penalty != "none":
        raise LmforgeError(f"--length-penalty applies to --strategy beam (got --strategy {args.strategy})")
    for flag, name in (("temperature", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                       ("repetition_penalty", "repetition_penalty"), ("no_repeat_ngram", "no_repeat_ngram_size")):
        value = getattr(args, flag)
        if value is not None:
            options[name] = value
    return options


def _load(directory: str) -> tuple[Any, Any, Architecture]:
    """The model, its tokenizer and its family's record; refuses models that do not generate."""
    from lmforge.persistence import load_pretrained

    loaded = load_pretrained(directory, with_head=False)
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
        raise InputFileError(f"{directory}: no tokenizer to turn text into ids (neither a WordPiece vocab.txt nor a "
                             "byte-level BPE vocab.json + merges.txt). Save the model with its tokenizer, or call "
                             "lmforge.generation.generate on token ids from Python")
    log.info("loaded %s (%s, %d layers, vocabulary %d)", directory, arch, loaded.config.n_layers,
             loaded.config.vocab_size)
    return loaded.model, loaded.tokenizer, family


def _read_prompts(args: argparse.Namespace) -> tuple[list[str], Any]:
    if args.prompt is not None:
        return [args.prompt], lambda i: "--prompt"
    from lmforge.data.text import read_user_text

    path = Path(args.input)
    lines = read_user_text(path, "input file").splitlines()
    if not lines:
        raise InputFileError(f"{path}: the file is empty; write one prompt per line")
    return lines, lambda i: f"{path}:{i + 1}"


def _special_ids(tokenizer: Any, stops: list[str]) -> list[int]:
    ids = []
    for token in stops:
        if token not in tokenizer.vocab:
            raise LmforgeError(f"--stop {token!r} is not in the model's vocabulary; give a vocabulary token such as "
                               "'.' or '[SEP]' (word pieces are written '##ing')")
        ids.append(tokenizer.vocab[token])
    return ids


def _encode(tokenizer: Any, text: str, family: Architecture, where: str, max_len: int) -> list[int]:
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
