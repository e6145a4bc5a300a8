"""``lmforge embed`` and ``lmforge convert``.

PyTorch and the model code are imported inside the run functions, so that ``lmforge --help`` and the
tokenizer commands start without loading them.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

from lmforge.choices import TEXT_POOLINGS, WORD_POOLINGS
from lmforge.commands.options import Count
from lmforge.data.text import read_user_text
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.compiling import INFERENCE_COMPILE_HELP, compile_errors, compile_in_place
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
    p.add_argument("--overwrite", action="store_true")


def run_embed(args: argparse.Namespace) -> int:
    import numpy as np

    from lmforge.embeddings.contextual import embed_texts, parse_layers
    from lmforge.models import architecture
    from lmforge.persistence import load_pretrained

    out = Path(args.out)
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
    loaded = load_pretrained(args.model, with_head=False)
    if loaded.tokenizer is None:
        raise InputFileError(f"{args.model}: no vocab.txt in the model folder; save the model with its tokenizer")
    family = architecture(loaded.config.arch)
    if not family.encodes_text and family.finetune_as:  # an encoder-decoder: its encoder alone embeds
        loaded.model = architecture(family.finetune_as).load().wrap(loaded.model)
    if args.compile:
        compile_in_place(loaded.model)
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
                     help="a Hugging Face BERT, ALBERT, DistilBERT, GPT-2, XLNet or ELECTRA folder (safetensors) to "
                          "import")
    src.add_argument("--to-hf", metavar="DIR",
                     help="an lmforge model folder to export: an encoder as BERT, ALBERT (embedding_size or "
                          "share_layers set), DistilBERT (type_vocab_size=0, no pooler) or ELECTRA (no pooler, a "
                          "segment embedding; an ELECTRA run's discriminator as ElectraForPreTraining); a GPT decoder "
                          "as GPT-2; an XLNet as XLNetLMHeadModel")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--overwrite", action="store_true")


def run_convert(args: argparse.Namespace) -> int:
    from safetensors.torch import save

    from lmforge.persistence import dedupe_tied, load_pretrained, read_config, save_pretrained

    source = args.from_hf or args.to_hf
    out = prepare_output_dir(args.out, overwrite=args.overwrite, inputs=[source], create=False)
    if args.from_hf:
        raw = read_config(args.from_hf)
        if raw.get("format") == "lmforge":
            raise LmforgeError(f"{args.from_hf} is already an lmforge model; use --to-hf to export it")
        loaded = load_pretrained(args.from_hf)
        with staged_output_dir(out) as tmp:
            save_pretrained(loaded.model, tmp, config=loaded.config, head=loaded.head, tokenizer=loaded.tokenizer)
        print(f"converted {args.from_hf} ({loaded.config.arch}, {loaded.config.n_layers} layers) -> {out}")
        return 0
    loaded = load_pretrained(args.to_hf)
    hf_config, hf_state = export_to_hf(loaded)
    tensors, _ = dedupe_tied(hf_state)
    with staged_output_dir(out) as tmp:
        atomic_write_bytes(tmp / WEIGHTS_NAME, save(tensors, metadata={"format": "pt"}))
        atomic_write_text(tmp / "config.json", json.dumps(hf_config, indent=2) + "\n")
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(tmp)
            from lmforge.tokenizers import WordPieceTokenizer

            if isinstance(loaded.tokenizer, WordPieceTokenizer):  # what transformers 5 reads first
                from lmforge.tokenizers.hf_json import TOKENIZER_JSON, wordpiece_tokenizer_json

                atomic_write_text(tmp / TOKENIZER_JSON,
                                  json.dumps(wordpiece_tokenizer_json(loaded.tokenizer), ensure_ascii=False) + "\n")
    print(f"exported {args.to_hf} -> {out} (Hugging Face {hf_config['model_type']} layout)")
    return 0


def export_to_hf(loaded) -> tuple[dict, dict]:
    """Hugging Face config dict and state dict of a loaded lmforge model (BERT-family encoder, GPT decoder, XLNet).

    The family's ``hf_export`` names the layout; the branches below are about those concrete layouts (each has its
    own converter in ``lmforge.interop``), not about lmforge's families. The encoder family's "bert" layout is
    refined by the config (``encoder_layout``): BERT, ALBERT or DistilBERT.
    """
    from lmforge.models import architecture, architectures_with

    config = loaded.config
    layout = architecture(config.arch).hf_export
    if layout is not None and (not config.bias or config.ffn != "mlp"):
        raise LmforgeError(f"bias={config.bias}, ffn={config.ffn!r}: Hugging Face's {layout} layout has biases in "
                           "every projection and a plain feed-forward; this model (Cramming's options) has no Hugging "
                           "Face layout; keep it as an lmforge folder")
    state = loaded.model.state_dict()
    if layout == "bert":
        return _export_encoder(loaded, state)
    if layout == "gpt2":
        from lmforge.interop import hf_gpt2

        return hf_gpt2.config_to_hf(config), hf_gpt2.state_dict_to_hf(state, config)
    if layout == "xlnet":
        from lmforge.interop import hf_xlnet

        if loaded.head is not None:
            raise LmforgeError(f"exporting a {loaded.head.get('type')!r} head of an XLNet to Hugging Face is not "
                               "supported; export the backbone (written as XLNetLMHeadModel, with its LM bias)")
        return hf_xlnet.config_to_hf(config), hf_xlnet.state_dict_to_hf(state)
    exportable = ", ".join(f"{name} as {architecture(name).hf_export}" for name in architectures_with("hf_export"))
    raise LmforgeError(f"exporting a {config.arch!r} model to Hugging Face is not supported (BERT and GPT-2 are: "
                       f"{exportable})")


# What each encoder layout writes for each head: {layout: {head type or None: architectures entry}}.
_ENCODER_ARCHITECTURES = {
    # a bare encoder is BertModel: naming a class with heads makes transformers warn that the checkpoint "seems
    # corrupted" and add random heads (issue 23)
    "bert": {None: "BertModel", "pretraining": "BertForPreTraining"},
    "albert": {None: "AlbertModel", "pretraining": "AlbertForPreTraining", "mlm": "AlbertForMaskedLM"},
    "distilbert": {None: "DistilBertModel", "mlm": "DistilBertForMaskedLM"},
}


def encoder_layout(config) -> str:
    """The Hugging Face layout an encoder config exports as: "distilbert" (no segment embedding and no pooler),
    "albert" (a factorised embedding or shared layers), else "bert". Each converter then names any option its
    layout cannot express."""
    if config.type_vocab_size == 0 and not config.pooler:
        return "distilbert"
    if config.embedding_size is not None or config.share_layers != "none":
        return "albert"
    return "bert"


def _export_encoder(loaded, state: dict) -> tuple[dict, dict]:
    from lmforge.interop import hf_albert, hf_bert, hf_distilbert

    if _exports_as_electra(loaded):
        return _export_electra(loaded, state)
    config = loaded.config
    layout = encoder_layout(config)
    head_type = None if loaded.head is None else loaded.head.get("type")
    names = {"bert": "BERT", "albert": "ALBERT", "distilbert": "DistilBERT"}
    if head_type not in _ENCODER_ARCHITECTURES[layout]:
        supported = ", ".join(f"{k!r} as {v}" for k, v in _ENCODER_ARCHITECTURES[layout].items() if k)
        raise LmforgeError(f"exporting a {head_type!r} head of a {names[layout]}-layout encoder to Hugging Face is not "
                           f"supported (heads that are: {supported}); export the backbone")
    if layout == "bert" and (config.type_vocab_size == 0 or not config.pooler):
        raise LmforgeError(
            f"no Hugging Face layout expresses this encoder (type_vocab_size={config.type_vocab_size}, "
            f"pooler={config.pooler}): BERT and ALBERT need a segment embedding (type_vocab_size >= 1) and a pooler "
            "(ALBERT without one only with an 'mlm' head, as AlbertForMaskedLM), DistilBERT needs "
            "type_vocab_size=0 and pooler=False")
    architecture_name = _ENCODER_ARCHITECTURES[layout][head_type]
    if head_type is None:
        enc, heads = state, None
    else:
        enc = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
        heads = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")}
    if layout == "distilbert":
        return (hf_distilbert.config_to_hf(config, architecture_name),
                hf_distilbert.state_dict_to_hf(enc, heads))
    if layout == "albert":
        return (hf_albert.config_to_hf(config, architecture_name),
                hf_albert.state_dict_to_hf(enc, heads, share_layers=config.share_layers))
    return hf_bert.config_to_hf(config, architecture_name), hf_bert.state_dict_to_hf(enc, heads)


def _exports_as_electra(loaded) -> bool:
    """ELECTRA's heads, or an encoder in ELECTRA's shape: no pooler, a segment embedding, no layer sharing, and no head
    (BERT's and ALBERT's models have a pooler) or an MLM head with GELU (an ELECTRA generator; with another activation
    a factorised encoder keeps exporting as AlbertForMaskedLM, whose MLM transform uses the model's activation)."""
    config = loaded.config
    head_type = None if loaded.head is None else loaded.head.get("type")
    if head_type in ("electra", "rtd"):
        return True
    return (not config.pooler and config.type_vocab_size >= 1 and config.share_layers == "none"
            and (head_type is None or (head_type == "mlm" and config.activation == "gelu")))


def _export_electra(loaded, state: dict) -> tuple[dict, dict]:
    """An ELECTRA pretraining run exports its discriminator (the backbone and the RTD head) as
    ElectraForPreTraining; the generator is a checkpoint of its own on Hugging Face's side (``lmforge.interop.
    hf_electra.generator_state_dicts``)."""
    from lmforge.interop import hf_electra

    head_type = None if loaded.head is None else loaded.head.get("type")
    if head_type is None:
        return hf_electra.config_to_hf(loaded.config, "ElectraModel"), hf_electra.state_dict_to_hf(state)
    enc = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    kind = "rtd" if head_type == "electra" else head_type
    heads = {k[len("head."):]: v for k, v in state.items() if k.startswith(f"head.{kind}.")}
    return (hf_electra.config_to_hf(loaded.config, hf_electra.architecture_of(kind)),
            hf_electra.state_dict_to_hf(enc, heads))

