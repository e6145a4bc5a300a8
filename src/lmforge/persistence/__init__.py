"""Model folders, whole: load whatever a folder holds (a backbone, a pretraining or fine-tuned task model, a Hugging
Face checkpoint), rebuild its head and check the task settings saved beside it; save any of them.

The layer above heads and tasks, so that it may know both: ``lmforge.utils.model_folder`` is the folder format
(files, tensors, configs; what the Trainer's checkpoints write), ``lmforge.models.loading`` builds backbones and
reads Hugging Face folders, ``lmforge.heads.build_model`` puts the head on. ``lmforge.from_pretrained`` and the
other names of the package root are these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from lmforge.config import TaskConfig, from_dict
from lmforge.errors import LmforgeError
from lmforge.heads import TASK_KEY, TaskModel, build_model, check_head_spec
from lmforge.models.loading import as_module, build_backbone, check_memory, load_folder
from lmforge.tasks import make_task
from lmforge.utils import model_folder
from lmforge.utils.model_folder import (
    CONFIG_NAME,
    FORMAT_VERSION,
    WEIGHTS_NAME,
    Loaded,
    blaming,
    dedupe_tied,
    read_safetensors_header,
    read_weights,
    save_pretrained,
)


def read_config(directory: str | Path) -> dict[str, Any]:
    """The raw ``config.json`` of a model folder, with a clear error when it is missing or malformed.

    For an lmforge config the fields loaders rely on are checked too: ``format_version``, ``model`` (an object),
    ``tied`` (names to names), ``head`` (``lmforge.heads.check_head_spec``) and the task settings saved with a
    fine-tuned head (a task that uses that head); the model's values are checked when ``load_pretrained`` parses
    them.
    """
    raw = model_folder.read_config(directory)
    if raw.get("format") == "lmforge" and raw.get("head") is not None:
        with blaming(Path(directory) / CONFIG_NAME):
            check_head_spec(raw["head"])
            if raw["head"].get(TASK_KEY) is not None:
                _check_task(raw["head"][TASK_KEY], raw["head"]["type"], f"head.{TASK_KEY}")
    return raw


def _check_task(values: Any, kind: str, where: str) -> None:
    """The task settings saved with a fine-tuned head must describe a task that uses that head."""
    if not isinstance(values, dict):
        raise LmforgeError(f"{where}: expected a table of task settings, got {values!r:.80}")
    wanted = make_task(from_dict(TaskConfig, values, where=where)).head_type
    if wanted != kind:
        raise LmforgeError(f"{where}: task {values.get('task', 'sequence')!r} uses a {wanted!r} head, not {kind!r}")


def load_pretrained(directory: str | Path, *, with_head: bool = True, runtime: str = "torch") -> Loaded:
    """Load a model folder saved by ``save_pretrained``, or a Hugging Face BERT / ALBERT / DistilBERT / ELECTRA /
    GPT-2 / XLNet folder, with its head.

    ``config.json`` is checked completely (head and task included), then against the shapes in the weights' header
    (on the meta device), before the model is built: a hand-edited folder fails at once with one line.

    Args:
        with_head: for a folder holding a ``TaskModel``, build the head too (else only the backbone).
        runtime: ``"torch"``, or ``"onnx"``: the backbone runs in ONNX Runtime from the folder's ``onnx/`` graph
            (``lmforge convert --to-onnx``; ``lmforge.persistence.onnx``), the head in PyTorch.

    Raises:
        InputFileError / LmforgeError: missing files, another format, keys or shapes that do not fit.
    """
    raw = read_config(directory)  # the head and task checks, before anything is built
    if runtime != "torch":
        from lmforge.persistence.onnx import read_manifest, with_runtime

        read_manifest(directory)  # a folder without a graph fails before its weights are read
        return with_runtime(load_folder(directory, with_head=with_head, build=build_model, raw=raw), directory,
                            runtime)
    return load_folder(directory, with_head=with_head, build=build_model, raw=raw)


def from_pretrained(directory: str | Path, *, expect: type | None = None) -> nn.Module:
    """The model a folder holds, as the callable module, with ``.config`` (its ``ModelConfig``; a task model's is
    its backbone's) and ``.tokenizer`` (None when the folder has none) attached; a task model also has
    ``.head_config`` (how its head is rebuilt)::

        model = lmforge.from_pretrained("runs/bert-mini")      # or Encoder.from_pretrained(...)
        out = model(**model.tokenizer(["a text"], return_tensors="pt"))

    Args:
        expect: the class wanted. A model class loads the backbone of a folder that has a head (the head is
            dropped); ``TaskModel`` needs a folder with a head. None: whatever the folder holds, head included.

    Raises:
        LmforgeError: the folder holds another kind of model (naming the class that loads it), or anything
            ``load_pretrained`` refuses.
    """
    wants_head = expect is None or issubclass(expect, TaskModel)
    return as_module(load_pretrained(directory, with_head=wants_head), directory, expect=expect)


def load_backbone(directory: str | Path, runtime: str = "torch") -> Loaded:
    """Only the backbone of a model folder (heads are dropped); ``runtime`` as ``load_pretrained``'s."""
    return load_pretrained(directory, with_head=False, runtime=runtime)


__all__ = ["CONFIG_NAME", "FORMAT_VERSION", "WEIGHTS_NAME", "Loaded", "build_backbone", "build_model", "check_memory",
           "dedupe_tied", "from_pretrained", "load_backbone", "load_pretrained", "read_config",
           "read_safetensors_header", "read_weights", "save_pretrained"]
