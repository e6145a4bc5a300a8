"""Saving and loading models as folders: ``config.json`` + ``model.safetensors`` (+ the tokenizer files).

Layout of a saved folder::

    config.json        {"format": "lmforge", "format_version": 1, "model": {ModelConfig}, "head": {...} | null,
                        "tied": {alias: stored name}}
    model.safetensors  the state dict of the saved module (never pickle); a tied weight is stored once
    vocab.txt, tokenizer_config.json   when a tokenizer was given

A ``TaskModel`` (backbone + head) stores keys ``backbone.*`` and ``head.*``; ``load_backbone`` takes the backbone
out of such a folder. A Hugging Face BERT, ALBERT, DistilBERT, GPT-2 or XLNet folder (``config.json`` with
``model_type``) loads too: it is converted on the fly by ``lmforge.interop``.
"""

from __future__ import annotations

import json
import logging
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
from lmforge.config import ModelConfig, from_dict, to_dict
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.io import atomic_write_bytes, atomic_write_text, check_can_write, staged_output_dir

log = logging.getLogger("lmforge")

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 1
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
    config = config or _config_of(model)
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


def _config_of(model: nn.Module) -> ModelConfig:
    for candidate in (model, getattr(model, "backbone", None)):
        config = getattr(candidate, "config", None)
        if isinstance(config, ModelConfig):
            return config
    raise LmforgeError("cannot find the model's config; pass config=ModelConfig(...)")


def read_config(directory: str | Path) -> dict[str, Any]:
    """The raw ``config.json`` of a model folder, with a clear error when it is missing or malformed.

    For an lmforge config the fields loaders rely on are checked too: ``format_version``, ``model`` (an object),
    ``head`` (see ``lmforge.heads.check_head_spec``) and ``tied`` (names to names); the model's values are checked
    when ``load_pretrained`` parses them.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise InputFileError(f"{directory}: no such model folder")
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise InputFileError(f"{directory}: no {CONFIG_NAME}; is this a model folder (saved by lmforge or a "
                             "Hugging Face BERT/ALBERT/DistilBERT/GPT-2/XLNet checkpoint)?")
    raw = _read_json(path)
    if not isinstance(raw, dict):
        raise InputFileError(f"{path}: not a JSON object (it holds a {type(raw).__name__}); a model config is an "
                             "object such as {\"format\": \"lmforge\", \"model\": {...}}")
    if raw.get("format") == "lmforge":
        _check_lmforge_fields(raw, path)
    return raw


def _read_json(path: Path) -> Any:
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
        raise InputFileError(f"{path}: saved by a newer lmforge (format_version {version}; this one reads "
                             f"{FORMAT_VERSION}); upgrade lmforge")
    if type(version) is not int or version < 1:
        raise InputFileError(f"{path}: format_version {version!r:.40} is not a format lmforge writes; it must be "
                             f"the integer {FORMAT_VERSION}")
    if not isinstance(raw.get("model"), dict):
        raise InputFileError(f"{path}: \"model\" must be an object of model settings (see ModelConfig), got "
                             f"{raw.get('model')!r:.60}")
    tied = raw.get("tied", {})
    if not isinstance(tied, dict) or not all(isinstance(v, str) for v in tied.values()):
        raise InputFileError(f"{path}: \"tied\" must be an object mapping a weight's name to the name it is stored "
                             f"under, got {tied!r:.60}")
    if raw.get("head") is not None:
        from lmforge.heads import TASK_KEY, check_head_spec

        with _blaming(path):
            check_head_spec(raw["head"])
            if raw["head"].get(TASK_KEY) is not None:
                _check_task(raw["head"][TASK_KEY], raw["head"]["type"], f"head.{TASK_KEY}")


def _check_task(values: Any, kind: str, where: str) -> None:
    """The task settings saved with a fine-tuned head must describe a task that uses that head."""
    from lmforge.config import TaskConfig
    from lmforge.tasks import make_task

    if not isinstance(values, dict):
        raise LmforgeError(f"{where}: expected a table of task settings, got {values!r:.80}")
    wanted = make_task(from_dict(TaskConfig, values, where=where)).head_type
    if wanted != kind:
        raise LmforgeError(f"{where}: task {values.get('task', 'sequence')!r} uses a {wanted!r} head, not {kind!r}")


@contextmanager
def _blaming(path: Path) -> Iterator[None]:
    """Prefix an LmforgeError raised inside with ``path``, the file whose values caused it."""
    try:
        yield
    except LmforgeError as err:
        raise InputFileError(f"{path}: {err}") from None


def _check_weights_file(path: Path) -> None:
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
    _check_weights_file(path)
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
    _check_weights_file(path)
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


def build_model(config: ModelConfig, head: dict[str, Any] | None) -> nn.Module:
    backbone = build_backbone(config)
    if head is None:
        return backbone
    from lmforge.heads import TaskModel, build_head

    return TaskModel(backbone, build_head(head, config, backbone))


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
    layers = (1 if config.share_layers == "all" else config.n_layers) + (config.n_decoder_layers or 0)
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


def _load_tokenizer(directory: Path, config: ModelConfig) -> Any | None:
    """The folder's tokenizer: WordPiece from vocab.txt, else GPT-2's byte-level BPE from vocab.json + merges.txt
    (None without either); it may not have more ids than the embeddings."""
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
    else:
        return None
    if tokenizer.vocab_size > config.vocab_size:
        raise InputFileError(f"{vocab}: {tokenizer.vocab_size:,} tokens, but the model's embeddings have "
                             f"{config.vocab_size:,} rows, so some ids have no vector; this {vocab.name} does not "
                             "belong to this model")
    return tokenizer


def _hf_model_type(raw: dict[str, Any]) -> str | None:
    return raw.get("model_type") if raw.get("format") != "lmforge" else None


def load_pretrained(directory: str | Path, *, with_head: bool = True) -> Loaded:
    """Load a model folder saved by ``save_pretrained``, or a Hugging Face BERT / ALBERT / DistilBERT / GPT-2 /
    XLNet folder.

    ``config.json`` is checked completely, then against the shapes in the weights' header (on the meta device),
    before the model is built: a hand-edited folder fails at once with one line, whatever sizes it claims.

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
    config_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if raw.get("format") != "lmforge" or "model" not in raw:
        raise InputFileError(f"{config_path}: not an lmforge model config (no \"format\": "
                             "\"lmforge\") and not a Hugging Face BERT/ALBERT/DistilBERT/GPT-2/XLNet config")
    with _blaming(config_path):
        config = from_dict(ModelConfig, raw["model"], where="model")
    head = raw.get("head") if with_head else None
    tied = raw.get("tied", {})
    shapes = {name: shape for name, (_, shape) in read_safetensors_header(weights).items()}
    prefix = "backbone." if raw.get("head") is not None and not with_head else ""
    shapes, tied = _strip(shapes, prefix), {k: v[len(prefix):] for k, v in _strip(tied, prefix).items()}
    check_fits(lambda: build_model(config, head), config, shapes, tied, config_path, weights)
    tensors = _strip(read_weights(weights), prefix)
    model = build_model(config, head)
    load_state(model, tensors, tied, str(weights))
    model.eval()
    return Loaded(model, config, head, _load_tokenizer(directory, config))


def from_pretrained(directory: str | Path, *, expect: type | None = None) -> nn.Module:
    """The model a folder holds, as the callable module, with ``.config`` (its ``ModelConfig``; a task model's is
    its backbone's) and ``.tokenizer`` (None when the folder has none) attached; a task model also has
    ``.head_config`` (how its head is rebuilt). The Hugging Face-shaped face of ``load_pretrained``::

        model = lmforge.models.from_pretrained("runs/bert-mini")      # or Encoder.from_pretrained(...)
        out = model(**model.tokenizer(["a text"], return_tensors="pt"))

    Args:
        expect: the class wanted (what ``Encoder.from_pretrained`` passes). A model class loads the backbone of a
            folder that has a head (the head is dropped); ``TaskModel`` needs a folder with a head. None: whatever
            the folder holds, head included.

    Raises:
        LmforgeError: the folder holds another kind of model (naming the class that loads it), or anything
            ``load_pretrained`` refuses.
    """
    from lmforge.heads import TaskModel

    wants_head = expect is None or issubclass(expect, TaskModel)
    loaded = load_pretrained(directory, with_head=wants_head)
    model = loaded.model
    if expect is not None and not isinstance(model, expect):
        what = "a bare backbone, no task head," if expect is TaskModel else f"model class {type(model).__name__}"
        raise LmforgeError(f"{directory}: holds {what} ({loaded.config.arch!r} family), not a {expect.__name__}; "
                           f"load it with {type(model).__name__}.from_pretrained(...) or "
                           "lmforge.models.from_pretrained(...), which returns whatever the folder holds")
    model.config = loaded.config
    model.tokenizer = loaded.tokenizer
    if loaded.head is not None:
        model.head_config = loaded.head
    return model


def _strip(mapping: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries whose key starts with ``prefix``, without it (all of them for an empty prefix)."""
    return {k[len(prefix):]: v for k, v in mapping.items() if k.startswith(prefix)}


def load_backbone(directory: str | Path) -> Loaded:
    """Only the backbone of a model folder (heads are dropped)."""
    return load_pretrained(directory, with_head=False)


# Entries of Hugging Face checkpoints that copy another one (the tied decoder / LM head): the conversion compares
# them by value, which meta tensors do not have, so the shape check leaves them out (the real load checks them).
_HF_COPIES = {"bert": ("cls.predictions.decoder.weight",), "albert": ("predictions.decoder.weight",),
              "distilbert": ("vocab_projector.weight",), "gpt2": ("lm_head.weight",), "xlnet": ("lm_loss.weight",)}
_HF_COPIES["electra"] = ("generator_lm_head.weight",)  # ElectraForMaskedLM's tied un-embedding


def _load_hf(directory: Path, raw: dict[str, Any], hf_type: str, with_head: bool) -> Loaded:
    config_path, weights = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if hf_type not in _HF_COPIES:
        raise InputFileError(f"{directory}: a Hugging Face {hf_type!r:.40} checkpoint; lmforge reads BERT, ALBERT, "
                             "DistilBERT, GPT-2, XLNet and ELECTRA layouts (model_type 'bert', 'albert', 'distilbert', "
                             "'gpt2', 'xlnet' or 'electra')")
    _check_weights_file(weights)  # first: a folder of pickle weights needs converting whatever its config says
    with _blaming(config_path):
        config = _hf_config(hf_type, raw)
    header = read_safetensors_header(weights)
    meta = {k: torch.empty(shape, device="meta") for k, (_, shape) in header.items() if k not in _HF_COPIES[hf_type]}
    try:
        state, head, optional = _from_hf(hf_type, meta, with_head, config)
    except LmforgeError as err:
        raise InputFileError(f"{weights}: {err}") from None
    except (IndexError, RuntimeError) as err:  # a tensor of a rank the conversion cannot split or transpose
        raise InputFileError(f"{weights}: not a {hf_type} checkpoint's tensors ({err})") from None
    untied_head = ("lm_head.",) if hf_type == "gpt2" else ()  # left out above; an untied model needs it
    check_fits(lambda: build_model(config, head), config, {k: tuple(v.shape) for k, v in state.items()}, None,
               config_path, weights, allow_missing=optional + untied_head)
    with _blaming(weights):
        state, head, optional = _from_hf(hf_type, read_weights(weights), with_head, config)
    model = build_model(config, head)
    fresh = sorted({k.rsplit(".", 1)[0] for k in model.state_dict() if k.startswith(optional) and k not in state})
    if fresh:
        # Bert/AlbertForMaskedLM checkpoints have no pooler and no NSP/SOP classifier, XLNetModel no LM bias: those
        # start fresh.
        log.warning("%s has no weights for %s; they keep their random initialisation", directory, ", ".join(fresh))
    load_state(model, state, _tied_aliases(model), str(weights), allow_missing=optional)
    model.eval()
    return Loaded(model, config, head, _load_tokenizer(directory, config))


def _hf_config(hf_type: str, raw: dict[str, Any]) -> ModelConfig:
    if hf_type == "electra":
        from lmforge.interop import hf_electra

        return hf_electra.config_from_hf(raw)
    from lmforge.interop import hf_albert, hf_bert, hf_distilbert, hf_gpt2, hf_xlnet

    converters = {"bert": hf_bert, "albert": hf_albert, "distilbert": hf_distilbert, "gpt2": hf_gpt2,
                  "xlnet": hf_xlnet}
    return converters[hf_type].config_from_hf(raw)


def _from_hf(hf_type: str, tensors: dict[str, torch.Tensor], with_head: bool, config: ModelConfig
             ) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, tuple[str, ...]]:
    """(our state dict, head description, prefixes of keys the checkpoint may lack) of a Hugging Face state dict."""
    if hf_type == "electra":  # ElectraModel; ElectraForPreTraining: head "rtd"; ElectraForMaskedLM: head "mlm"
        from lmforge.interop import hf_electra

        encoder_sd, electra_heads, kind = hf_electra.state_dict_from_hf(tensors, config)
        if electra_heads is None or not with_head:
            return encoder_sd, None, ()
        return ({**{f"backbone.{k}": v for k, v in encoder_sd.items()},
                 **{f"head.{k}": v for k, v in electra_heads.items()}}, {"type": kind}, ())
    if hf_type == "gpt2":
        from lmforge.interop import hf_gpt2

        return hf_gpt2.state_dict_from_hf(tensors), None, ()
    if hf_type == "xlnet":  # XLNetModel has no LM bias: ours then starts at zero
        from lmforge.interop import hf_xlnet

        return hf_xlnet.state_dict_from_hf(tensors), None, ("lm_head.",)
    if hf_type == "distilbert":  # no pooler, MLM heads only: nothing may be missing
        from lmforge.interop import hf_distilbert

        encoder_sd, heads_sd = hf_distilbert.state_dict_from_hf(tensors)
        head = {"type": "mlm"}
        optional: tuple[str, ...] = ()
    elif hf_type == "albert":
        from lmforge.interop import hf_albert

        encoder_sd, heads_sd = hf_albert.state_dict_from_hf(tensors, config)
        head, optional = {"type": "pretraining"}, ("backbone.pooler.", "head.nsp.")  # SOP = our NSP classifier
    else:
        from lmforge.interop import hf_bert

        encoder_sd, heads_sd = hf_bert.state_dict_from_hf(tensors)
        head, optional = {"type": "pretraining"}, ("backbone.pooler.", "head.nsp.")
    if heads_sd is None or not with_head:
        return encoder_sd, None, tuple(p[len("backbone."):] for p in optional if p.startswith("backbone."))
    state = {**{f"backbone.{k}": v for k, v in encoder_sd.items()}, **{f"head.{k}": v for k, v in heads_sd.items()}}
    return state, head, optional


def _tied_aliases(model: nn.Module) -> dict[str, str]:
    return dedupe_tied(model.state_dict())[1]
