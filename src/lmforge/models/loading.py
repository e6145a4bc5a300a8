"""Building models from their configs and from model folders, without heads: ``build_backbone``, the memory check,
and ``load_folder``, which reads an lmforge folder or a Hugging Face BERT / ALBERT / DistilBERT / ELECTRA / GPT-2 /
XLNet folder (converted on the fly by ``lmforge.interop``) into the module its ``build`` makes.

``Encoder.from_pretrained(path)`` (``PretrainedMixin``) is ``load_folder`` with the default build, a backbone alone:
a fine-tuned folder gives its backbone. A folder's head is rebuilt by ``lmforge.persistence``, which passes a build
that knows heads. The folder format itself (files, tensors, configs) is ``lmforge.utils.model_folder``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.model_folder import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    Loaded,
    blaming,
    check_fits,
    check_weights_file,
    load_state,
    model_config,
    read_config,
    read_safetensors_header,
    read_weights,
    strip_prefix,
    tied_aliases,
)

log = logging.getLogger("lmforge")

# build(config, head description or None) -> the module a folder's weights load into
Build = Callable[[ModelConfig, "dict[str, Any] | None"], nn.Module]


def build_backbone(config: ModelConfig) -> nn.Module:
    """A freshly initialised model of ``config``, after checking on the meta device that it fits in memory."""
    from lmforge.models import ARCHITECTURES

    check_memory(config)
    return ARCHITECTURES[config.arch](config)


def check_memory(config: ModelConfig, *, fraction: float = 0.9) -> int:
    """The parameter count of ``config``'s model (counted on the meta device: nothing is allocated); raise when its
    float32 weights alone would take more than ``fraction`` of this machine's memory.

    Raises:
        LmforgeError: naming the size, the memory and the settings to lower.
    """
    from lmforge.models import ARCHITECTURES

    try:
        with torch.device("meta"):
            model = ARCHITECTURES[config.arch](config)
    except (RuntimeError, ValueError, OverflowError) as err:
        raise LmforgeError(f"cannot build a {config.arch} of this config ({str(err).splitlines()[0]})") from None
    n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on every platform
        return n
    if 4 * n > fraction * memory:
        raise LmforgeError(f"this model has {n:,} parameters ({4 * n / 2**30:,.1f} GiB in float32), more than this "
                           f"machine's {memory / 2**30:,.1f} GiB of memory; lower vocab_size, d_model, d_ff, "
                           "n_layers or max_seq_len")
    return n


def backbone_only(config: ModelConfig, head: dict[str, Any] | None) -> nn.Module:
    """The default ``Build`` of ``load_folder``: the backbone (a folder's head needs ``lmforge.persistence``)."""
    if head is not None:
        raise LmforgeError("this build makes backbones only; load a folder with its head through "
                           "lmforge.persistence.load_pretrained")
    return build_backbone(config)


def load_tokenizer(directory: Path, config: ModelConfig) -> Any | None:
    """The folder's tokenizer: WordPiece from vocab.txt, else GPT-2's byte-level BPE from vocab.json + merges.txt,
    else either from a Hugging Face tokenizer.json (None without any); it may not have more ids than the embeddings."""
    vocab = directory / "vocab.txt"
    if vocab.exists() and not vocab.is_file():
        raise InputFileError(f"{vocab}: is a folder, not a vocabulary file; remove it or put the vocab.txt there")
    if vocab.is_file():
        from lmforge.tokenizers import WordPieceTokenizer

        tokenizer = WordPieceTokenizer.from_pretrained(directory)
    elif (directory / "vocab.json").exists() and (directory / "merges.txt").exists():
        from lmforge.tokenizers import ByteLevelBPETokenizer

        vocab = directory / "vocab.json"
        tokenizer = ByteLevelBPETokenizer.from_pretrained(directory)
    elif (directory / "tokenizer.json").is_file():  # transformers 5 saves this file alone
        from lmforge.tokenizers.hf_json import from_tokenizer_json

        vocab = directory / "tokenizer.json"
        tokenizer = from_tokenizer_json(vocab)
    else:
        return None
    if tokenizer.vocab_size > config.vocab_size:
        raise InputFileError(f"{vocab}: {tokenizer.vocab_size:,} tokens, but the model's embeddings have "
                             f"{config.vocab_size:,} rows, so some ids have no vector; this {vocab.name} does not "
                             "belong to this model")
    return tokenizer


def hf_model_type(raw: dict[str, Any]) -> str | None:
    return raw.get("model_type") if raw.get("format") != "lmforge" else None


def load_folder(directory: str | Path, *, with_head: bool = False, build: Build = backbone_only,
                raw: dict[str, Any] | None = None) -> Loaded:
    """Load a model folder saved by ``save_pretrained``, or a Hugging Face BERT / ALBERT / DistilBERT / ELECTRA /
    GPT-2 / XLNet folder, into the module ``build`` makes.

    ``config.json`` is checked completely, then against the shapes in the weights' header (on the meta device),
    before the model is built: a hand-edited folder fails at once with one line, whatever sizes it claims.

    Args:
        with_head: for a folder holding a ``TaskModel``, build the head too (``build`` must know heads), else only
            the backbone (the ``backbone.`` weights).
        build: makes the module of a config and a head description (None: no head).
        raw: the folder's ``config.json`` when the caller has read (and checked) it already; else it is read here.

    Raises:
        InputFileError / LmforgeError: missing files, another format, keys or shapes that do not fit.
    """
    directory = Path(directory)
    raw = read_config(directory) if raw is None else raw
    hf_type = hf_model_type(raw)
    if hf_type is not None:
        return _load_hf(directory, raw, hf_type, with_head, build)
    config_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    config = model_config(raw, config_path)
    head = raw.get("head") if with_head else None
    tied = raw.get("tied", {})
    shapes = {name: shape for name, (_, shape) in read_safetensors_header(weights).items()}
    prefix = "backbone." if raw.get("head") is not None and not with_head else ""
    shapes, tied = strip_prefix(shapes, prefix), {k: v[len(prefix):] for k, v in strip_prefix(tied, prefix).items()}
    check_fits(lambda: build(config, head), config, shapes, tied, config_path, weights)
    tensors = strip_prefix(read_weights(weights), prefix)
    model = build(config, head)
    load_state(model, tensors, tied, str(weights))
    model.eval()
    return Loaded(model, config, head, load_tokenizer(directory, config))


def _load_hf(directory: Path, raw: dict[str, Any], hf_type: str, with_head: bool, build: Build) -> Loaded:
    from lmforge.interop.formats import HF_FORMATS, state_from_hf

    config_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    fmt = HF_FORMATS.get(hf_type)
    if fmt is None:
        raise InputFileError(f"{directory}: a Hugging Face {hf_type!r:.40} checkpoint; lmforge reads BERT, RoBERTa, "
                             "ALBERT, DistilBERT, GPT-2, XLNet and ELECTRA layouts (model_type 'bert', 'roberta', "
                             "'albert', 'distilbert', 'gpt2', 'xlnet' or 'electra')")
    check_weights_file(weights)  # first: a folder of pickle weights needs converting whatever its config says
    with blaming(config_path):
        config = fmt.config_from_hf(raw)
    header = read_safetensors_header(weights)
    # entries that copy another one (a tied decoder) are compared by value, which meta tensors do not have: the shape
    # check leaves them out (the real load checks them)
    meta = {k: torch.empty(shape, device="meta") for k, (_, shape) in header.items() if k not in fmt.compared_repeats}
    crf = _crf_tensors(directory, raw)
    try:
        state, head, optional = state_from_hf(fmt, meta, raw, with_head, config, crf)
    except LmforgeError as err:
        raise InputFileError(f"{weights}: {err}") from None
    except (IndexError, RuntimeError) as err:  # a tensor of a rank the conversion cannot split or transpose
        raise InputFileError(f"{weights}: not a {hf_type} checkpoint's tensors ({err})") from None
    # the untied head was left out above (it repeats the embedding in a tied model); an untied model needs it
    check_fits(lambda: build(config, head), config, {k: tuple(v.shape) for k, v in state.items()}, None,
               config_path, weights, allow_missing=optional + fmt.untied_head)
    with blaming(weights):
        state, head, optional = state_from_hf(fmt, read_weights(weights), raw, with_head, config, crf)
    model = build(config, head)
    fresh = sorted({k.rsplit(".", 1)[0] for k in model.state_dict() if k.startswith(optional) and k not in state})
    if fresh:
        # Bert/AlbertForMaskedLM checkpoints have no pooler and no NSP/SOP classifier, XLNetModel no LM bias: those
        # start fresh.
        log.warning("%s has no weights for %s; they keep their random initialisation", directory, ", ".join(fresh))
    load_state(model, state, tied_aliases(model), str(weights), allow_missing=optional)
    model.eval()
    return Loaded(model, config, head, load_tokenizer(directory, config))


def _crf_tensors(directory: Path, raw: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """The CRF that lmforge wrote beside an exported token model (``crf.safetensors``, named in ``config.json``), or
    None when the folder has none."""
    from lmforge.interop.hf_tasks import CRF_FILE, CRF_KEY

    named = raw.get(CRF_KEY)
    if not named:
        return None
    path = directory / CRF_FILE
    if not path.is_file():
        raise InputFileError(f"{directory / CONFIG_NAME}: names a CRF ({CRF_KEY}) but {path.name} is missing; copy it "
                             f"from the exported folder, or remove {CRF_KEY} to load the tagger without its CRF")
    check_weights_file(path)
    with blaming(path):
        return read_weights(path)


def as_module(loaded: Loaded, directory: str | Path, expect: type | None = None) -> nn.Module:
    """The module of ``loaded`` with ``.config``, ``.tokenizer`` (and a task model's ``.head_config``) attached: what
    ``from_pretrained`` returns.

    Raises:
        LmforgeError: ``expect`` is given and the folder holds another kind of model (naming the class that loads it).
    """
    model = loaded.model
    if expect is not None and not isinstance(model, expect):
        what = ("a bare backbone, no task head," if loaded.head is None and expect.__name__ == "TaskModel"
                else f"model class {type(model).__name__}")
        raise LmforgeError(f"{directory}: holds {what} ({loaded.config.arch!r} family), not a {expect.__name__}; "
                           f"load it with {type(model).__name__}.from_pretrained(...) or "
                           "lmforge.from_pretrained(...), which returns whatever the folder holds")
    model.config = loaded.config
    model.tokenizer = loaded.tokenizer
    if loaded.head is not None:
        model.head_config = loaded.head
    return model
