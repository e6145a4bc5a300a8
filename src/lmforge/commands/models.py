"""``lmforge embed`` and ``lmforge convert``.

PyTorch and the model code are imported inside the run functions, so that ``lmforge --help`` and the
tokenizer commands start without loading them.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from lmforge.choices import HF_ENCODER_LAYOUTS, PRECISIONS, RUNTIMES, TEXT_POOLINGS, WORD_POOLINGS
from lmforge.commands.finetune import prepare_inference
from lmforge.commands.options import Count
from lmforge.data.text import read_user_text
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.compiling import (
    INFERENCE_COMPILE_HELP,
    INFERENCE_PRECISION_HELP,
    RUNTIME_HELP,
    check_runtime_options,
    compile_errors,
)
from lmforge.utils.io import (
    atomic_write_bytes,
    atomic_write_text,
    prepare_output_dir,
    prepare_output_file,
    staged_output_dir,
)

WEIGHTS_NAME = "model.safetensors"  # as lmforge.utils.model_folder
COMBINES = ("mean", "sum", "concat")


def add_embed_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR", help="an lmforge model folder or a Hugging Face BERT one")
    p.add_argument("--input", required=True, metavar="FILE", help="UTF-8 text, one input per line")
    p.add_argument("--out", required=True, metavar="FILE",
                   help=".npy for mean/cls pooling, .npz for --pooling none and for --word-pooling")
    p.add_argument("--layers", default="-1", metavar="I[,J...]",
                   help="hidden-state indices: 0 = embeddings, -1 = last layer (default); e.g. -4,-3,-2,-1")
    p.add_argument("--combine", choices=COMBINES, default="mean", help="how several layers are combined")
    p.add_argument("--pooling", choices=TEXT_POOLINGS, default=None,
                   help="none: one vector per token (.npz, one array per line); mean over real tokens (default); "
                        "cls")
    p.add_argument("--word-pooling", choices=WORD_POOLINGS, default=None,
                   help="one vector per word instead (words split as the tokenizer splits them), from its first "
                        "sub-word or the mean of its sub-words; writes .npz with arr_I (words, D), words_I and "
                        "spans_I (character start, end) for line I")
    p.add_argument("--batch-size", type=Count(1, 65_536), default=32, help="lines per forward pass")
    p.add_argument("--max-length", type=Count(1, 1_000_000), default=None,
                   help="truncate longer inputs (default: the model's)")
    p.add_argument("--compile", action="store_true", help=INFERENCE_COMPILE_HELP)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help=INFERENCE_PRECISION_HELP)
    p.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    p.add_argument("--overwrite", action="store_true")


def run_embed(args: argparse.Namespace) -> int:
    import numpy as np

    from lmforge.embeddings.contextual import embed_texts, parse_layers
    from lmforge.models import architecture
    from lmforge.persistence import load_pretrained

    out = Path(args.out)
    check_runtime_options(args)
    if args.word_pooling is not None and args.pooling is not None:
        raise LmforgeError("--pooling and --word-pooling exclude each other: --pooling makes vectors per text or "
                           "token, --word-pooling per word; give one")
    pooling = args.pooling or "mean"
    what = f"word pooling '{args.word_pooling}'" if args.word_pooling else f"pooling '{pooling}'"
    want = ".npz" if args.word_pooling or pooling == "none" else ".npy"
    if out.suffix != want:
        raise LmforgeError(f"--out {out}: {what} writes a {want} file; name it *{want}")
    prepare_output_file(out, overwrite=args.overwrite, inputs=[args.model, args.input])
    layers = parse_layers(args.layers)
    lines = read_user_text(args.input, "input file").splitlines()
    if not any(line.strip() for line in lines):
        raise InputFileError(f"{args.input}: the file holds no text; write one text per line")
    loaded = load_pretrained(args.model, with_head=False, runtime=args.runtime)
    if loaded.tokenizer is None:
        raise InputFileError(f"{args.model}: no vocab.txt in the model folder; save the model with its tokenizer")
    family = architecture(loaded.config.arch)
    if not family.encodes_text and family.finetune_as:  # an encoder-decoder: its encoder alone embeds
        loaded.model = architecture(family.finetune_as).load().wrap(loaded.model)
    prepare_inference(loaded.model, args)
    buffer = io.BytesIO()
    if args.word_pooling:
        from lmforge.embeddings.contextual import embed_words

        with compile_errors(args.compile):
            items = embed_words(loaded.model, loaded.tokenizer, lines, layers=layers, combine=args.combine,
                                word_pooling=args.word_pooling, batch_size=args.batch_size,
                                max_length=args.max_length, show_progress=True)
        arrays = {}
        for i, item in enumerate(items):
            arrays[f"arr_{i}"] = item.vectors
            arrays[f"words_{i}"] = np.array(item.words, dtype=str)  # a unicode array: loads without pickle
            arrays[f"spans_{i}"] = np.array(item.spans, dtype=np.int64).reshape(-1, 2)
        np.savez(buffer, **arrays)
        atomic_write_bytes(out, buffer.getvalue())
        width = items[0].vectors.shape[1] if items else 0
        print(f"embedded {len(lines)} lines -> {out} {len(items)} arrays (words, {width}) with words_I, spans_I")
        return 0
    with compile_errors(args.compile):
        vectors = embed_texts(loaded.model, loaded.tokenizer, lines, layers=layers, combine=args.combine,
                              pooling=pooling, batch_size=args.batch_size, max_length=args.max_length,
                              show_progress=True)
    if pooling == "none":
        np.savez(buffer, **{f"arr_{i}": v for i, v in enumerate(vectors)})
        shape = f"{len(vectors)} arrays (tokens, {vectors[0].shape[1] if vectors else 0})"
    else:
        np.save(buffer, vectors)
        shape = str(vectors.shape)
    atomic_write_bytes(out, buffer.getvalue())
    print(f"embedded {len(lines)} lines -> {out} {shape}")
    return 0


def add_convert_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", metavar="DIR",
                     help="a Hugging Face BERT, RoBERTa, ALBERT, DistilBERT, GPT-2, XLNet or ELECTRA folder "
                          "(safetensors) to import: a bare model, a pretraining class or a task class (sequence, "
                          "token, question answering, multiple choice), its labels and tokenizer included")
    src.add_argument("--to-hf", metavar="DIR",
                     help="an lmforge model folder to export: an encoder as BERT, ALBERT (embedding_size or "
                          "share_layers set), DistilBERT (type_vocab_size=0, no pooler) or ELECTRA (no pooler, a "
                          "segment embedding; an ELECTRA run's discriminator as ElectraForPreTraining), or as "
                          "--hf-layout says; a GPT decoder as GPT-2; an XLNet as XLNet. A task head becomes its "
                          "transformers class (BertForSequenceClassification ...), with its labels")
    src.add_argument("--to-onnx", metavar="DIR",
                     help="an lmforge model folder to run in ONNX Runtime: --out is the same folder with onnx/ "
                          "added (the encoder of a BERT-family model or task model as one graph for any batch and "
                          "length; the head stays in PyTorch; a GPT decoder with its KV cache as graph inputs and "
                          "outputs). Run it with --runtime onnx on predict, evaluate, embed, generate and serve. "
                          "Needs the lmforge[onnx] extra")
    p.add_argument("--quantize", choices=("int8",), default=None,
                   help="with --to-onnx: int8 weights for every matrix product (ONNX Runtime's dynamic "
                        "quantisation); measure its accuracy with evaluate --runtime onnx (default: fp32)")
    p.add_argument("--hf-layout", choices=HF_ENCODER_LAYOUTS, default=None,
                   help="with --to-hf, the Hugging Face family an encoder is written as (roberta for a model "
                        "pretrained with RoBERTa's recipe); without it, the family its config implies")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--overwrite", action="store_true")


def run_convert(args: argparse.Namespace) -> int:
    from safetensors.torch import save

    from lmforge.persistence import dedupe_tied, load_pretrained, read_config, save_pretrained
    from lmforge.persistence.hf_export import export_model

    source = args.from_hf or args.to_hf or args.to_onnx
    if args.quantize and not args.to_onnx:
        raise LmforgeError("--quantize is an option of --to-onnx; drop it, or export with --to-onnx")
    if args.hf_layout and not args.to_hf:
        raise LmforgeError("--hf-layout chooses the family of a --to-hf export; drop it")
    if args.to_onnx:
        return _convert_to_onnx(args)
    if args.from_hf and args.hf_layout:
        raise LmforgeError("--hf-layout chooses the family of an export; drop it with --from-hf (the folder's "
                           "config.json says what it is)")
    out = prepare_output_dir(args.out, overwrite=args.overwrite, inputs=[source], create=False)
    if args.from_hf:
        raw = read_config(args.from_hf)
        if raw.get("format") == "lmforge":
            raise LmforgeError(f"{args.from_hf} is already an lmforge model; use --to-hf to export it")
        loaded = load_pretrained(args.from_hf)
        with staged_output_dir(out) as tmp:
            save_pretrained(loaded.model, tmp, config=loaded.config, head=loaded.head, tokenizer=loaded.tokenizer)
        what = f"{loaded.config.arch}, {loaded.config.n_layers} layers"
        if loaded.head is not None:
            what += f", {_head_words(loaded.head)}"
        if loaded.tokenizer is None:
            print(f"note: {args.from_hf} has no tokenizer lmforge reads (vocab.txt, vocab.json + merges.txt or "
                  "tokenizer.json); the converted folder has none: give it one before embed, fine-tune or predict")
        print(f"converted {args.from_hf} ({what}) -> {out}")
        return 0
    loaded = load_pretrained(args.to_hf)
    exported = export_model(loaded, args.hf_layout)
    tensors, _ = dedupe_tied(exported.state)
    with staged_output_dir(out) as tmp:
        atomic_write_bytes(tmp / WEIGHTS_NAME, save(tensors, metadata={"format": "pt"}))
        for name, extra in exported.files.items():
            atomic_write_bytes(tmp / name, save(extra, metadata={"format": "pt"}))
        atomic_write_text(tmp / "config.json", json.dumps(exported.config, indent=2) + "\n")
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(tmp)
            from lmforge.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
            from lmforge.tokenizers.hf_json import TOKENIZER_JSON, byte_bpe_tokenizer_json, wordpiece_tokenizer_json

            # tokenizer.json, what transformers 5 reads first (a Unigram tokenizer wrote its own above)
            write = {WordPieceTokenizer: wordpiece_tokenizer_json,
                     ByteLevelBPETokenizer: byte_bpe_tokenizer_json}.get(type(loaded.tokenizer))
            if write is not None:
                atomic_write_text(tmp / TOKENIZER_JSON,
                                  json.dumps(write(loaded.tokenizer), ensure_ascii=False) + "\n")
        else:
            exported.notes.append(f"{args.to_hf} has no tokenizer, so the export has none: copy the tokenizer files "
                                  "of the data it was trained on beside it")
    for note in exported.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"exported {args.to_hf} -> {out} (Hugging Face {exported.config['architectures'][0]})")
    return 0


def _convert_to_onnx(args: argparse.Namespace) -> int:
    from lmforge.persistence import load_pretrained, read_config
    from lmforge.persistence.onnx import copy_model_folder, export_onnx, require_onnx

    require_onnx()
    if read_config(args.to_onnx).get("format") != "lmforge":
        raise LmforgeError(f"{args.to_onnx} is not an lmforge model folder; import it first with "
                           f"`lmforge convert --from-hf {args.to_onnx} --out DIR`, then export DIR")
    out = prepare_output_dir(args.out, overwrite=args.overwrite, inputs=[args.to_onnx], create=False)
    loaded = load_pretrained(args.to_onnx)
    with staged_output_dir(out) as tmp:
        copy_model_folder(args.to_onnx, tmp)
        exported = export_onnx(loaded, tmp, quantize=args.quantize)
    for note in exported.notes:
        print(f"note: {note}", file=sys.stderr)
    entry = next(iter(exported.manifest["graphs"].values()))  # the encoder's, or a GPT's decoder graph
    print(f"exported {args.to_onnx} -> {out}/onnx/{entry['file']} ({entry['precision']}; fp32 graph within "
          f"{entry['max_abs_diff_fp32']:.1e} of eager); run it with --runtime onnx")
    task = exported.manifest["graphs"].get("task")
    if task is not None:
        print(f"exported the classifier whole -> {out}/onnx/{task['file']} (logits; within "
              f"{task['max_abs_diff_fp32']:.1e} of eager): runs in ONNX Runtime alone, without lmforge")
    return 0


def _head_words(head: dict) -> str:
    """"a 'sequence_classification' head (3 labels)" for the convert line."""
    labels = head.get("labels")
    return f"a {head.get('type')!r} head" + (f" ({len(labels)} labels)" if labels else "")
