"""Saving and loading models as folders: ``config.json`` + ``model.safetensors`` (+ the tokenizer files).

Layout of a saved folder::

    config.json        {"format": "lmforge", "format_version": 1, "model": {ModelConfig}, "head": {...} | null,
                        "tied": {alias: stored name}}
    model.safetensors  the state dict of the saved module (never pickle); a tied weight is stored once
    vocab.txt, tokenizer_config.json   when a tokenizer was given

A ``TaskModel`` (backbone + head) stores keys ``backbone.*`` and ``head.*``; ``load_backbone`` takes the backbone
out of such a folder. A Hugging Face BERT or GPT-2 folder (``config.json`` with ``model_type``) loads too: it is
converted on the fly by ``lmforge.interop``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import nn

from lmforge import __version__
from lmforge.config import ModelConfig, from_dict, to_dict
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.io import atomic_write_bytes, atomic_write_text, check_can_write

log = logging.getLogger("lmforge")

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 1


@dataclass
class Loaded:
    """What ``load_pretrained`` returns: the module, its config, the head description and the tokenizer."""

    model: nn.Module
    config: ModelConfig
    head: dict[str, Any] | None
    tokenizer: Any | None  # WordPieceTokenizer when the folder holds vocab.txt


def dedupe_tied(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store each tensor once; return the kept tensors and ``{alias: kept name}`` for shared ones."""
    kept: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype)
        if tensor.numel() and key in seen:
            tied[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = tensor.detach().contiguous().cpu()
    return kept, tied


def save_pretrained(model: nn.Module, directory: str | Path, *, config: ModelConfig | None = None,
                    head: dict[str, Any] | None = None, tokenizer: Any | None = None,
                    overwrite: bool = False) -> Path:
    """Write ``model`` (a backbone, or a ``TaskModel``) into ``directory`` atomically, file by file.

    Args:
        model: the module; its config is ``config`` or ``model.config`` (of a backbone or a TaskModel's backbone).
        head: how to rebuild the head of a ``TaskModel`` (``{"type": ..., options}``, see ``lmforge.heads``).
        tokenizer: written beside the weights when given (anything with ``save_pretrained(dir, overwrite=)``).
        overwrite: replace a model already in the folder.

    Raises:
        LmforgeError: the folder already holds a model and ``overwrite`` is false.
    """
    directory = Path(directory)
    check_can_write(directory / WEIGHTS_NAME, overwrite, "a model")
    config = config or _config_of(model)
    if head is None and hasattr(model, "head"):
        head = getattr(model.head, "head_config", None)
        if head is None:
            raise LmforgeError("this TaskModel's head does not describe itself; pass head={'type': ...}")
    tensors, tied = dedupe_tied(model.state_dict())
    atomic_write_bytes(directory / WEIGHTS_NAME, save(tensors, metadata={"format": "pt"}))
    payload = {"format": "lmforge", "format_version": FORMAT_VERSION, "lmforge_version": __version__,
               "model": to_dict(config), "head": head, "tied": tied}
    atomic_write_text(directory / CONFIG_NAME, json.dumps(payload, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(directory, overwrite=True)
    return directory


def _config_of(model: nn.Module) -> ModelConfig:
    for candidate in (model, getattr(model, "backbone", None)):
        config = getattr(candidate, "config", None)
        if isinstance(config, ModelConfig):
            return config
    raise LmforgeError("cannot find the model's config; pass config=ModelConfig(...)")


def read_config(directory: str | Path) -> dict[str, Any]:
    """The raw ``config.json`` of a model folder, with a clear error when it is missing or malformed."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputFileError(f"{directory}: no such model folder")
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise InputFileError(f"{directory}: no {CONFIG_NAME}; is this a model folder (saved by lmforge or a "
                             "Hugging Face BERT/GPT-2 checkpoint)?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputFileError(f"{path}: not valid JSON ({err})") from err


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file; a missing or corrupt file is a clear error (pickle is never read)."""
    path = Path(path)
    if not path.is_file():
        alt = [p.name for p in path.parent.glob("*.bin")] + [p.name for p in path.parent.glob("*.pt")]
        hint = (f"; the folder has {', '.join(alt)}, which lmforge does not read (pickle can run code): "
                "convert it to safetensors first") if alt else ""
        raise InputFileError(f"{path}: weights file not found{hint}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise InputFileError(f"{path}: not a readable safetensors file ({err}); the file is corrupt or "
                             "truncated — save the model again") from err


def build_backbone(config: ModelConfig) -> nn.Module:
    from lmforge.models import ARCHITECTURES

    return ARCHITECTURES[config.arch](config)


def build_model(config: ModelConfig, head: dict[str, Any] | None) -> nn.Module:
    backbone = build_backbone(config)
    if head is None:
        return backbone
    from lmforge.heads import TaskModel, build_head

    return TaskModel(backbone, build_head(head, config, backbone))


def load_state(module: nn.Module, tensors: dict[str, torch.Tensor], tied: dict[str, str], source: str,
               allow_missing: tuple[str, ...] = ()) -> None:
    """Load ``tensors`` into ``module``, naming every missing, unexpected or mis-shaped key."""
    own = module.state_dict()
    problems = []
    for name, tensor in tensors.items():
        if name in own and tuple(own[name].shape) != tuple(tensor.shape):
            problems.append(f"{name} has shape {tuple(tensor.shape)} in the checkpoint but "
                            f"{tuple(own[name].shape)} in the model")
    missing = [k for k in own if k not in tensors and k not in tied and not k.startswith(allow_missing)]
    unexpected = [k for k in tensors if k not in own]
    if missing:
        problems.append(f"missing key(s): {', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''}")
    if unexpected:
        problems.append(f"unexpected key(s): {', '.join(unexpected[:20])}"
                        f"{' ...' if len(unexpected) > 20 else ''}")
    if problems:
        raise LmforgeError(f"{source}: the weights do not fit the model: " + "; ".join(problems))
    module.load_state_dict(tensors, strict=False)


def _load_tokenizer(directory: Path) -> Any | None:
    if not (directory / "vocab.txt").is_file():
        return None
    from lmforge.tokenizers import WordPieceTokenizer

    return WordPieceTokenizer.from_pretrained(directory)


def _hf_model_type(raw: dict[str, Any]) -> str | None:
    return raw.get("model_type") if raw.get("format") != "lmforge" else None


def load_pretrained(directory: str | Path, *, with_head: bool = True) -> Loaded:
    """Load a model folder saved by ``save_pretrained``, or a Hugging Face BERT / GPT-2 folder.

    Args:
        with_head: for a folder holding a ``TaskModel``, build the head too (else only the backbone).

    Raises:
        InputFileError / LmforgeError: missing files, another format, keys or shapes that do not fit.
    """
    directory = Path(directory)
    raw = read_config(directory)
    hf_type = _hf_model_type(raw)
    if hf_type is not None:
        return _load_hf(directory, raw, hf_type, with_head)
    if raw.get("format") != "lmforge" or "model" not in raw:
        raise InputFileError(f"{directory / CONFIG_NAME}: not an lmforge model config (no \"format\": "
                             "\"lmforge\") and not a Hugging Face BERT/GPT-2 config")
    if raw.get("format_version", 0) > FORMAT_VERSION:
        raise InputFileError(f"{directory}: saved by a newer lmforge (format {raw['format_version']}); upgrade")
    config = from_dict(ModelConfig, raw["model"], where=f"{directory / CONFIG_NAME}: model")
    head = raw.get("head") if with_head else None
    tensors = read_weights(directory / WEIGHTS_NAME)
    tied = raw.get("tied", {})
    if raw.get("head") is not None and not with_head:
        prefix = "backbone."
        tensors = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        tied = {k[len(prefix):]: v[len(prefix):] for k, v in tied.items() if k.startswith(prefix)}
    model = build_model(config, head)
    load_state(model, tensors, tied, str(directory / WEIGHTS_NAME))
    model.eval()
    return Loaded(model, config, head, _load_tokenizer(directory))


def load_backbone(directory: str | Path) -> Loaded:
    """Only the backbone of a model folder (heads are dropped)."""
    return load_pretrained(directory, with_head=False)


def _load_hf(directory: Path, raw: dict[str, Any], hf_type: str, with_head: bool) -> Loaded:
    tensors = read_weights(directory / WEIGHTS_NAME)
    if hf_type == "bert":
        from lmforge.interop import hf_bert

        config = hf_bert.config_from_hf(raw)
        encoder_sd, heads_sd = hf_bert.state_dict_from_hf(tensors)
        head = {"type": "pretraining"} if (heads_sd is not None and with_head) else None
        model = build_model(config, head)
        # BertForMaskedLM checkpoints have no pooler and no NSP classifier: those start from fresh weights.
        if head is None:
            state, optional = encoder_sd, ("pooler.",)
        else:
            state = {**{f"backbone.{k}": v for k, v in encoder_sd.items()},
                     **{f"head.{k}": v for k, v in heads_sd.items()}}
            optional = ("backbone.pooler.", "head.nsp.")
        fresh = sorted({k.rsplit(".", 1)[0] for k in model.state_dict() if k.startswith(optional) and k not in state})
        if fresh:
            log.warning("%s has no weights for %s; they keep their random initialisation", directory,
                        ", ".join(fresh))
        load_state(model, state, _tied_aliases(model), str(directory / WEIGHTS_NAME), allow_missing=optional)
    elif hf_type == "gpt2":
        from lmforge.interop import hf_gpt2

        config = hf_gpt2.config_from_hf(raw)
        head = None
        model = build_model(config, None)
        load_state(model, hf_gpt2.state_dict_from_hf(tensors), _tied_aliases(model),
                   str(directory / WEIGHTS_NAME))
    else:
        raise InputFileError(f"{directory}: a Hugging Face {hf_type!r} checkpoint; lmforge reads BERT and GPT-2 "
                             "layouts (model_type 'bert' or 'gpt2')")
    model.eval()
    return Loaded(model, config, head, _load_tokenizer(directory))


def _tied_aliases(model: nn.Module) -> dict[str, str]:
    return dedupe_tied(model.state_dict())[1]
