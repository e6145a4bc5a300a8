"""The model folder format: ``config.json`` + ``model.safetensors`` (+ the tokenizer files), read and written.

Layout of a saved folder::

    config.json        {"format": "lmforge", "format_version": 2, "model": {the family's config}, "head": {...} | null,
                        "tied": {alias: stored name}}
    model.safetensors  the state dict of the saved module (never pickle); a tied weight is stored once
    vocab.txt, tokenizer_config.json   when a tokenizer was given

Format 2 writes only the model family's fields (``lmforge.config.families``); format 1 wrote every family's, and is
upgraded on read (``lmforge.config.upgrade_model_values``).

This is the base layer of persistence: it knows files, tensors and configs, and nothing of model classes or heads.
Building a model from a folder is ``lmforge.models.loading`` (a backbone) and ``lmforge.persistence`` (any folder,
task models and Hugging Face folders included); the Trainer's checkpoints write their model folders here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import nn

from lmforge import __version__
from lmforge.config import ModelConfig, from_dict, to_dict, upgrade_model_values
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.io import atomic_write_bytes, atomic_write_text, check_can_write, staged_output_dir

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 2  # 2: configs per family (1: every family's fields in every folder)
_MAX_HEADER_BYTES = 100 * 2**20  # safetensors refuses longer headers too
_MAX_COMPUTED_BYTES = 2**30  # buffers a model computes from its config (position tables): far above any real need


@dataclass
class Loaded:
    """What ``load_pretrained`` returns: the module, its config, the head description and the tokenizer."""

    model: nn.Module
    config: ModelConfig
    head: dict[str, Any] | None
    tokenizer: Any | None  # WordPieceTokenizer when the folder holds vocab.txt

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model: a ``Loaded`` can be called as the module it holds (``from_pretrained`` returns the
        module itself, with ``.config`` and ``.tokenizer`` attached)."""
        return self.model(*args, **kwargs)


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
                    overwrite: bool = False, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` (a backbone, or a ``TaskModel``) into ``directory``: a new folder whole (built under a
    temporary name, then renamed), an existing one file by file, each file atomically.

    Args:
        model: the module; its config is ``config`` or ``model.config`` (of a backbone or a TaskModel's backbone).
        head: how to rebuild the head of a ``TaskModel`` (``{"type": ..., options}``, see ``lmforge.heads``).
        tokenizer: written beside the weights when given (anything with ``save_pretrained(dir, overwrite=)``).
        overwrite: replace a model already in the folder.
        state_dict: the weights to write instead of ``model.state_dict()`` (e.g. a sharded model's gathered state,
            tied names aliasing one tensor).

    Raises:
        LmforgeError: the folder already holds a model and ``overwrite`` is false.
    """
    directory = Path(directory)
    check_can_write(directory / WEIGHTS_NAME, overwrite, "a model")
    config = config or config_of(model)
    if head is None and hasattr(model, "head"):
        head = getattr(model.head, "head_config", None)
        if head is None:
            raise LmforgeError("this TaskModel's head does not describe itself; pass head={'type': ...}")
    if not overwrite and (not directory.exists() or (directory.is_dir() and not any(directory.iterdir()))):
        # a new folder is built under a temporary name and renamed when complete: it never holds half a model
        # (overwrite=True, what checkpoints and run folders use, replaces the files one by one, each atomically)
        with staged_output_dir(directory) as tmp:
            _write_folder(model, tmp, config, head, tokenizer, state_dict)
        return directory
    _write_folder(model, directory, config, head, tokenizer, state_dict)
    return directory


def _write_folder(model: nn.Module, directory: Path, config: ModelConfig, head: dict[str, Any] | None,
                  tokenizer: Any | None, state_dict: dict[str, torch.Tensor] | None) -> None:
    """Weights, then ``config.json``, then the tokenizer, each file atomically."""
    tensors, tied = dedupe_tied(model.state_dict() if state_dict is None else state_dict)
    atomic_write_bytes(directory / WEIGHTS_NAME, save(tensors, metadata={"format": "pt"}))
    payload = {"format": "lmforge", "format_version": FORMAT_VERSION, "lmforge_version": __version__,
               "model": to_dict(config), "head": head, "tied": tied}
    atomic_write_text(directory / CONFIG_NAME, json.dumps(payload, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(directory, overwrite=True)


def config_of(model: nn.Module) -> ModelConfig:
    for candidate in (model, getattr(model, "backbone", None)):
        config = getattr(candidate, "config", None)
        if isinstance(config, ModelConfig):
            return config
    raise LmforgeError("cannot find the model's config; pass config=ModelConfig(...)")


def read_config(directory: str | Path) -> dict[str, Any]:
    """The raw ``config.json`` of a model folder, with a clear error when it is missing or malformed.

    For an lmforge config the fields loaders rely on are checked too: ``format_version``, ``model`` (an object) and
    ``tied`` (names to names); the model's values are checked by ``model_config``, the head by
    ``lmforge.persistence`` (which knows heads).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise InputFileError(f"{directory}: no such model folder")
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise InputFileError(f"{directory}: no {CONFIG_NAME}; is this a model folder (saved by lmforge or a "
                             "Hugging Face BERT/ALBERT/DistilBERT/GPT-2/XLNet checkpoint)?")
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise InputFileError(f"{path}: not a JSON object (it holds a {type(raw).__name__}); a model config is an "
                             "object such as {\"format\": \"lmforge\", \"model\": {...}}")
    if raw.get("format") == "lmforge":
        _check_lmforge_fields(raw, path)
    return raw


def read_json(path: Path) -> Any:
    def no_constant(name: str) -> None:  # NaN and Infinity are not JSON, and no setting can use them
        raise ValueError(f"{name} is not a JSON value")

    try:
        return json.loads(path.read_bytes().decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError as err:
        raise InputFileError(f"{path}: not UTF-8 text (bad byte at offset {err.start}); the file is corrupt — "
                             "save the model again or restore the file") from None
    except RecursionError:
        raise InputFileError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as err:  # JSONDecodeError, or an integer with too many digits to convert
        raise InputFileError(f"{path}: not valid JSON ({err})") from None


def _check_lmforge_fields(raw: dict[str, Any], path: Path) -> None:
    version = raw.get("format_version", FORMAT_VERSION)
    if type(version) is int and version > FORMAT_VERSION:
        raise InputFileError(f"{path}: saved by a newer lmforge (format_version {version}; this one reads 1 to "
                             f"{FORMAT_VERSION}); upgrade lmforge")
    if type(version) is not int or version < 1:
        raise InputFileError(f"{path}: format_version {version!r:.40} is not a format lmforge writes; it must be "
                             f"an integer from 1 to {FORMAT_VERSION}")
    if not isinstance(raw.get("model"), dict):
        raise InputFileError(f"{path}: \"model\" must be an object of model settings (see ModelConfig), got "
                             f"{raw.get('model')!r:.60}")
    tied = raw.get("tied", {})
    if not isinstance(tied, dict) or not all(isinstance(v, str) for v in tied.values()):
        raise InputFileError(f"{path}: \"tied\" must be an object mapping a weight's name to the name it is stored "
                             f"under, got {tied!r:.60}")


@contextmanager
def blaming(path: Path) -> Iterator[None]:
    """Prefix an LmforgeError raised inside with ``path``, the file whose values caused it."""
    try:
        yield
    except LmforgeError as err:
        raise InputFileError(f"{path}: {err}") from None


def check_weights_file(path: Path) -> None:
    if path.is_dir():
        raise InputFileError(f"{path}: a folder, not a safetensors file")
    if not path.is_file():
        alt = [p.name for p in path.parent.glob("*.bin")] + [p.name for p in path.parent.glob("*.pt")]
        hint = (f"; the folder has {', '.join(alt)}, which lmforge does not read (pickle can run code): "
                "convert it to safetensors first") if alt else ""
        raise InputFileError(f"{path}: weights file not found{hint}")


def _unreadable(path: Path, reason: str) -> InputFileError:
    return InputFileError(f"{path}: not a readable safetensors file ({reason}); the file is corrupt or truncated — "
                          "save the model again")


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file; a missing or corrupt file is a clear error (pickle is never read)."""
    path = Path(path)
    check_weights_file(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise _unreadable(path, str(err)) from err


def read_safetensors_header(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor name: (dtype, shape)}`` of a safetensors file, from its header alone (no tensor is read).

    The format: 8 bytes, a little-endian u64 N; N bytes of JSON ``{name: {"dtype", "shape", "data_offsets":
    [begin, end]}, "__metadata__": {...}}``; then the data, which the offsets index. Loaders compare these shapes
    with the model a config describes before building it, so a config that does not fit fails at once.

    Raises:
        InputFileError: the file is missing, not a file, or its header is truncated, absurd or malformed.
    """
    path = Path(path)
    check_weights_file(path)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            n = int.from_bytes(f.read(8), "little")
            if size < 8:
                raise _unreadable(path, f"{size} bytes, too short for a header")
            if n > min(size - 8, _MAX_HEADER_BYTES):
                raise _unreadable(path, f"its header length says {n} bytes but the file has {size}")
            text = f.read(n)
    except OSError as err:
        raise InputFileError(f"{path}: cannot read the weights ({err.strerror or err})") from None
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _unreadable(path, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _unreadable(path, "its header is not a JSON object")
    data_size = size - 8 - n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            valid = isinstance(dtype, str) and all(type(x) is int and x >= 0 for x in (*shape, begin, end))
        except (TypeError, KeyError, ValueError):
            valid = False
        if not valid:
            raise _unreadable(path, f"bad header entry for {name!r:.80}")
        if not begin <= end <= data_size:
            raise _unreadable(path, f"tensor {name!r:.80} lies at bytes {begin}-{end} of its data, which has "
                                    f"{data_size}")
        out[name] = (dtype, shape)
    return out


def _fit_problems(own: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], tied: dict[str, str],
                  allow_missing: tuple[str, ...]) -> list[str]:
    """What keeps weights of shapes ``found`` from loading into a module whose state has shapes ``own``."""
    problems = [f"{name} has shape {shape} in the checkpoint but {own[name]} in the model"
                for name, shape in found.items() if name in own and own[name] != shape]
    missing = [k for k in own if k not in found and k not in tied and not k.startswith(allow_missing)]
    unexpected = [k if k.isprintable() else repr(k) for k in found if k not in own]
    if missing:
        problems.append(f"missing key(s): {', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''}")
    if unexpected:
        problems.append(f"unexpected key(s): {', '.join(unexpected[:20])}"
                        f"{' ...' if len(unexpected) > 20 else ''}")
    return problems


def load_state(module: nn.Module, tensors: dict[str, torch.Tensor], tied: dict[str, str], source: str,
               allow_missing: tuple[str, ...] = ()) -> None:
    """Load ``tensors`` into ``module``, naming every missing, unexpected or mis-shaped key."""
    own = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    problems = _fit_problems(own, {k: tuple(v.shape) for k, v in tensors.items()}, tied, allow_missing)
    if problems:
        raise LmforgeError(f"{source}: the weights do not fit the model: " + "; ".join(problems))
    module.load_state_dict(tensors, strict=False)


def check_fits(build: Callable[[], nn.Module], config: ModelConfig, shapes: dict[str, tuple[int, ...]],
               tied: dict[str, str] | None, config_path: Path, weights: Path,
               allow_missing: tuple[str, ...] = ()) -> None:
    """Check that the model ``build()`` makes fits weights of ``shapes``, before anything is allocated.

    ``build`` runs on the meta device, where a tensor has a shape but no memory, so a ``config.json`` whose sizes
    are absurd (a vocabulary of 2e9) or merely wrong fails in milliseconds instead of allocating the model first.

    Args:
        tied: ``{alias: stored name}`` of the checkpoint; None: the aliases are the model's own shared tensors.
        allow_missing: prefixes of model keys the weights may lack (they keep their initialisation).

    Raises:
        InputFileError: naming the config or the weights and what does not fit.
    """
    # every distinct layer has weights (ALBERT's share_layers="all": one); this also bounds the build loop below
    layers = config.n_distinct_layers
    if layers > len(shapes) + len(tied or {}):
        raise InputFileError(f"{config_path}: the model has {layers} layers but {weights} holds only "
                             f"{len(shapes)} tensors; the config does not describe these weights")
    try:
        with torch.device("meta"):
            model = build()
    except LmforgeError as err:
        raise InputFileError(f"{config_path}: {err}") from None
    except (RuntimeError, ValueError, OverflowError) as err:  # only the config drives this build: it is the culprit
        raise InputFileError(f"{config_path}: cannot build the model it describes "
                             f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
    state = model.state_dict(keep_vars=True)
    own = {k: tuple(v.shape) for k, v in state.items()}
    if tied is None:  # tensors the module shares: the same object under two names (meta tensors have no address)
        first: dict[int, str] = {}
        tied = {}
        for name, tensor in state.items():
            if first.setdefault(id(tensor), name) != name:
                tied[name] = first[id(tensor)]
    problems = _fit_problems(own, shapes, tied, allow_missing)
    problems += [f"{alias} is tied to {target}, which has shape {shapes.get(target)} in the checkpoint but "
                 f"{own[alias]} in the model" for alias, target in tied.items()
                 if alias in own and alias not in shapes and shapes.get(target) != own[alias]]
    if problems:
        raise InputFileError(f"{weights}: the weights do not fit the model that {config_path.name} describes: "
                             + "; ".join(problems))
    # tables the model computes from its config (sinusoidal positions) are not weights: bound them separately
    computed = sum(b.numel() * b.element_size() for k, b in model.named_buffers() if k not in state)
    if computed > _MAX_COMPUTED_BYTES:
        raise InputFileError(f"{config_path}: the model would need {computed / 2**30:.1f} GiB for tables computed "
                             f"from its sizes (max_seq_len={config.max_seq_len}, d_model={config.d_model}); "
                             "is max_seq_len right?")


def strip_prefix(mapping: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries whose key starts with ``prefix``, without it (all of them for an empty prefix)."""
    return {k[len(prefix):]: v for k, v in mapping.items() if k.startswith(prefix)}




def tied_aliases(model: nn.Module) -> dict[str, str]:
    """``{alias: kept name}`` of the tensors ``model`` shares."""
    return dedupe_tied(model.state_dict())[1]


def model_config(raw: dict[str, Any], config_path: Path) -> ModelConfig:
    """The ``ModelConfig`` of an lmforge ``config.json`` (read by ``read_config``), upgraded from older formats;
    errors name the file."""
    if raw.get("format") != "lmforge" or "model" not in raw:
        raise InputFileError(f"{config_path}: not an lmforge model config (no \"format\": "
                             "\"lmforge\") and not a Hugging Face BERT/ALBERT/DistilBERT/GPT-2/XLNet config")
    with blaming(config_path):
        values = upgrade_model_values(raw["model"], raw.get("format_version", FORMAT_VERSION))
        return from_dict(ModelConfig, values, where="model")
