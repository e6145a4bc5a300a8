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

Output: for every prompt line, ``--num-return-sequences`` lines (its best hypotheses, best first; one by default).
A language model's line is the prompt as written followed by its continuation, word pieces joined to the word they
continue and no space before punctuation (``lmforge.generation.text``); ``--continuation-only`` prints the
continuation alone (Hugging Face's ``return_full_text=False``). An encoder-decoder's line is its target text.
Special tokens are dropped. ``--json`` writes one JSON object per prompt instead: ``{"prompt", "generations":
[{"text", "continuation", "score", "log_prob", "tokens", "stop"}]}``.

``--runtime onnx`` runs a GPT folder made by ``lmforge convert --to-onnx`` in ONNX Runtime, its KV cache fed
through the graph (``lmforge.persistence.onnx_decoder``): the same tokens as ``--runtime torch``, always decoded
with the cache.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from lmforge.choices import RUNTIMES
from lmforge.commands.options import POSITIVE, SEED, Count, Rate
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.compiling import RUNTIME_HELP, check_runtime_options

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
    p.add_argument("--continuation-only", action="store_true",
                   help="print what a language model adds, without the prompt (default: the prompt, then the "
                        "continuation)")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt with every hypothesis and score")
    p.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)


def run_generate(args: argparse.Namespace) -> int:
    from lmforge.generation import GenerationConfig
    from lmforge.generation.text import encode_prompt, generate_batched, generated_texts, load_generator

    if args.batch_size < 1:
        raise LmforgeError(f"--batch-size {args.batch_size} must be >= 1")
    check_runtime_options(args)
    options = _options(args)
    config = GenerationConfig(**options)  # validates the options before the model is loaded
    model, tokenizer, family = load_generator(args.model, runtime=args.runtime)
    texts, where = _read_prompts(args)
    special = _special_ids(tokenizer, args.stop)
    # An encoder-decoder's decoder starts from [CLS] (its training targets are [CLS] y [SEP]); a causal LM
    # continues the prompt and needs no start token.
    config = config.replace(eos_id=tokenizer.sep_id, stop_ids=special, pad_id=tokenizer.pad_id,
                            bos_id=tokenizer.cls_id if family.has_encoder_decoder else None)
    prompts = [encode_prompt(tokenizer, text, family, where(i), model.config.max_seq_len)
               for i, text in enumerate(texts)]
    results = generate_batched(model, prompts, config, args.batch_size)
    out = sys.stdout
    continues = not family.has_encoder_decoder
    for text, ids, result in zip(texts, prompts, results, strict=True):
        generations = []
        for seq, score, log_prob, stop in zip(*result, strict=True):
            full, tail = generated_texts(tokenizer, text, ids, seq, continues=continues)
            generations.append({"text": tail if args.continuation_only else full, "continuation": tail,
                                "score": round(score, 6), "log_prob": round(log_prob, 6), "tokens": len(seq),
                                "stop": None if stop is None else tokenizer.convert_ids_to_tokens([stop])[0]})
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
