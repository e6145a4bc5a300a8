"""ONNX Runtime for inference: export a model folder's backbone to ONNX, and run it in place of the PyTorch one.

``lmforge convert --to-onnx DIR --out OUT`` writes OUT as a copy of the model folder (config, weights, tokenizer,
head) with ``onnx/`` beside it::

    OUT/onnx/encoder.onnx      the Transformer encoder: input_ids, attention_mask (B, T) [, token_type_ids] ->
                               last_hidden_state (B, T, D), pooled_output (B, D), hidden_state_0 .. hidden_state_L
    OUT/onnx/model.onnx        a sequence or pair classifier (or regressor) whole, its head included: the same
                               inputs -> logits (B, C); written beside encoder.onnx for a deployment without
                               lmforge (its manifest entry lists the labels in order)
    OUT/onnx/manifest.json     which graphs, their precision (fp32, or int8 with dynamic quantisation), the versions
                               that wrote them and the largest difference from eager measured at export

``load_pretrained(OUT, runtime="onnx")`` (and ``--runtime onnx`` on ``predict``, ``evaluate``, ``embed`` and
``serve``) loads the folder as usual, then puts an ``OnnxEncoder`` in the backbone's place: the encoder runs in ONNX
Runtime, the task head (a few small layers, with the word pooling, span enumeration and window pooling that make a
graph data-dependent) runs in PyTorch on its outputs, so that every head lmforge has works unchanged and gives
eager's outputs within 1e-4 (fp32; tests/persistence/test_onnx.py).

The graph is exported with ``torch.export`` (``torch.onnx.export(dynamo=True)``): one graph for any batch size and
length up to ``max_seq_len``. While exporting, lmforge's data-dependent shortcuts take one path for every input
(``lmforge.nn.capture.exporting``): the graph always unpads (the token-wise layers run on the real tokens only, as
in eager; Hugging Face optimum's graphs compute every padded position) and applies the mask as an additive bias.

``onnxruntime`` (running) and ``onnx`` + ``onnxscript`` (exporting) are the ``lmforge[onnx]`` extra; nothing else
in lmforge needs them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.errors import InputFileError, LmforgeError
from lmforge.models.encoder import check_encoder_inputs
from lmforge.models.outputs import EncoderOutput
from lmforge.utils.io import atomic_write_text

__all__ = ["MANIFEST_NAME", "ONNX_DIR", "OPSET", "OnnxEncoder", "export_onnx", "onnx_backbone", "require_onnx",
           "require_onnxruntime"]

ONNX_DIR = "onnx"
MANIFEST_NAME = "manifest.json"
ENCODER_FILE = "encoder.onnx"
TASK_FILE = "model.onnx"  # a sequence or pair classifier whole, head included (exports_whole)
FORMAT = "lmforge-onnx"
OPSET = 20  # ONNX Gelu (opset 20): ONNX Runtime fuses it with its bias (BiasGelu); onnxruntime >= 1.17
PARITY_TOLERANCE = 1e-4  # fp32 graphs: the largest |ONNX - eager| accepted at export
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]
EXTRA_HINT = "install the extra: pip install 'lmforge[onnx]'"


def require_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or a one-line error naming the extra."""
    try:
        import onnxruntime
    except ImportError:
        raise LmforgeError(f"--runtime onnx needs ONNX Runtime, which is not installed; {EXTRA_HINT}") from None
    return onnxruntime


def require_onnx() -> None:
    """``onnx`` and ``onnxscript`` (torch's exporter writes the graph with them), or a one-line error."""
    missing = []
    for name in ("onnx", "onnxscript"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise LmforgeError(f"convert --to-onnx needs {' and '.join(missing)}, not installed; {EXTRA_HINT}")


# ------------------------------------------------------------------------------------------------ export
class _TaskGraph(nn.Module):
    """What is exported for a sequence or pair classifier: the task model, head included, returning its logits."""

    def __init__(self, model: nn.Module, segments: bool) -> None:
        super().__init__()
        self.model = model
        self.segments = segments

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        return self.model(input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids if self.segments else None).logits


class _EncoderGraph(nn.Module):
    """What is exported: the encoder called with tensors only, returning a flat tuple of tensors."""

    def __init__(self, encoder: nn.Module, segments: bool) -> None:
        super().__init__()
        self.encoder = encoder
        self.segments = segments

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
                ) -> tuple[Tensor, ...]:
        out = self.encoder(input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids if self.segments else None, output_hidden_states=True)
        return (out.last_hidden_state, out.pooled_output, *out.hidden_states)


def _encoder_names(config: Any) -> tuple[list[str], list[str]]:
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if config.type_vocab_size else [])
    outputs = ["last_hidden_state", "pooled_output"] + [f"hidden_state_{i}" for i in range(config.n_layers + 1)]
    return inputs, outputs


def _example_batch(config: Any, batch: int, length: int, seed: int) -> dict[str, Tensor]:
    """Random ids (above the usual special ids) with the last row padded to half its length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(5, config.vocab_size - 1), config.vocab_size, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, max(1, length // 2):] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if config.type_vocab_size:
        segments = torch.zeros(batch, length, dtype=torch.long)
        segments[:, length // 2:] = 1 if config.type_vocab_size > 1 else 0
        feeds["token_type_ids"] = segments
    return feeds


def supports_onnx(model: nn.Module) -> bool:
    """An lmforge ``Encoder`` (BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA layouts) or GPT ``Decoder``
    (``lmforge.persistence.onnx_decoder``) exports."""
    from lmforge.models.decoder import Decoder
    from lmforge.models.encoder import Encoder

    return isinstance(model, Encoder | Decoder)


def export_encoder(encoder: nn.Module, path: Path, *, opset: int = OPSET) -> dict[str, Any]:
    """Write ``encoder`` (an lmforge ``Encoder``) to ``path`` as ONNX; return its manifest entry.

    The graph takes any batch size and any length up to ``max_seq_len``; it is checked against eager on a batch of
    another shape than the one traced, and refused when they differ by more than ``PARITY_TOLERANCE``.
    """
    require_onnx()
    config = encoder.config
    inputs, outputs = _encoder_names(config)
    graph = _EncoderGraph(encoder, segments=bool(config.type_vocab_size)).eval()
    length = min(16, config.max_seq_len)
    example = _example_batch(config, 2, length, seed=0)
    batch = torch.export.Dim("batch", min=1)
    seq = torch.export.Dim("sequence", min=1, max=config.max_seq_len)
    dynamic = {name: {0: batch, 1: seq} for name in inputs}
    write_graph(graph, tuple(example[n] for n in inputs), path, what="encoder", inputs=inputs, outputs=outputs,
                dynamic=dynamic, opset=opset)
    return {"file": path.name, "kind": "encoder", "inputs": inputs, "outputs": outputs, "precision": "fp32",
            "opset": opset}


def exports_whole(model: nn.Module) -> bool:
    """A task model whose head ONNX can hold too: sequence and pair classification or regression (``model.onnx``).
    The other heads' word pooling, span enumeration and window pooling stay in PyTorch on the encoder's states."""
    from lmforge.heads import TaskModel
    from lmforge.heads.classification import SequenceClassificationHead

    return isinstance(model, TaskModel) and type(model.head) is SequenceClassificationHead


def export_task_model(model: nn.Module, path: Path, *, opset: int = OPSET) -> dict[str, Any]:
    """Write a sequence or pair classifier (``exports_whole``), head included, to ``path``; return its manifest
    entry (its labels in the order of the logits' columns)."""
    require_onnx()
    config = model.backbone.config
    inputs, _ = _encoder_names(config)
    graph = _TaskGraph(model, segments=bool(config.type_vocab_size)).eval()
    example = _example_batch(config, 2, min(16, config.max_seq_len), seed=0)
    batch = torch.export.Dim("batch", min=1)
    seq = torch.export.Dim("sequence", min=1, max=config.max_seq_len)
    write_graph(graph, tuple(example[n] for n in inputs), path, what="task model", inputs=inputs, outputs=["logits"],
                dynamic={name: {0: batch, 1: seq} for name in inputs}, opset=opset)
    head = model.head
    return {"file": path.name, "kind": "task", "task": "regression" if head.regression else "classification",
            "labels": [] if head.regression else list(head.labels), "inputs": inputs, "outputs": ["logits"],
            "precision": "fp32", "opset": opset}


def _task_parity(model: nn.Module, session: Any) -> float:
    """The largest |ONNX - eager| of the logits on a batch shaped unlike the traced example."""
    config = model.backbone.config
    feeds = _example_batch(config, 3, max(1, min(23, config.max_seq_len)), seed=1)
    with torch.no_grad():
        want = model(feeds["input_ids"], attention_mask=feeds["attention_mask"],
                     token_type_ids=feeds.get("token_type_ids")).logits
    (got,) = session.run(["logits"], {k: v.numpy() for k, v in feeds.items()})
    return (torch.from_numpy(got) - want).abs().max().item()


def write_graph(graph: nn.Module, example: tuple[Tensor, ...], path: Path, *, what: str, inputs: list[str],
                outputs: list[str], dynamic: Any, opset: int) -> None:
    """``torch.onnx.export(dynamo=True)`` of ``graph`` on ``example`` to ``path``, quietly, with a one-line error."""
    import logging
    import warnings

    # the exporter's notes on renamed axes, its deprecations and the torchvision ops it skips are not the user's
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(graph, example, dynamo=True, input_names=inputs, output_names=outputs,
                                        dynamic_shapes=dynamic, opset_version=opset, verbose=False)
        except Exception as exc:  # the exporter's errors are pages long: keep the first line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LmforgeError(f"exporting the {what} to ONNX failed: {first:.300}") from exc
        finally:
            registration.setLevel(level)
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path))


def _parity(encoder: nn.Module, session: Any, entry: dict[str, Any]) -> float:
    """The largest |ONNX - eager| over the real positions of a batch shaped unlike the traced example."""
    config = encoder.config
    length = max(1, min(23, config.max_seq_len))
    feeds = _example_batch(config, 3, length, seed=1)
    with torch.no_grad():
        want = encoder(feeds["input_ids"], attention_mask=feeds["attention_mask"],
                       token_type_ids=feeds.get("token_type_ids"), output_hidden_states=True)
    got = session.run(["last_hidden_state", "pooled_output"], {k: v.numpy() for k, v in feeds.items()})
    real = feeds["attention_mask"].bool()
    diff = (torch.from_numpy(got[0]) - want.last_hidden_state)[real].abs().max().item()
    return max(diff, (torch.from_numpy(got[1]) - want.pooled_output).abs().max().item())


def quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime's dynamic quantisation: the weights of every MatMul in int8 (per tensor), activations
    quantised on the fly; the embeddings, norms and softmax stay fp32."""
    import logging

    require_onnxruntime()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()  # the quantiser advises pre-processing through the root logger: not the user's concern
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    finally:
        root.setLevel(level)


@dataclass
class Exported:
    """What ``export_onnx`` wrote: the manifest and notes for the user."""

    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def export_onnx(loaded: Any, folder: Path, *, quantize: str | None = None, opset: int = OPSET) -> Exported:
    """Write ``loaded``'s backbone under ``folder/onnx/`` (``folder`` already holds the model folder's files).

    Args:
        loaded: what ``load_pretrained`` returned for the source folder.
        folder: the output folder.
        quantize: None (fp32) or ``"int8"`` (dynamic quantisation of the MatMul weights).
        opset: the ONNX opset.

    Raises:
        LmforgeError: a model that does not export (not an lmforge Encoder), or a graph that differs from eager.
    """
    from lmforge.heads import TaskModel

    if quantize not in (None, "int8"):  # before anything is exported
        raise LmforgeError(f"--quantize {quantize!r}: the choice is int8 (or leave it out for fp32)")
    model = loaded.model
    backbone = model.backbone if isinstance(model, TaskModel) else model
    if not supports_onnx(backbone):
        raise LmforgeError(f"a {loaded.config.arch!r} model: convert --to-onnx exports Transformer encoders (BERT, "
                           "RoBERTa, ALBERT, DistilBERT, ELECTRA and their task heads) and GPT decoders; run this "
                           "one with --runtime torch")
    if isinstance(model, TaskModel) and getattr(model.head, "drives_backbone", False):
        raise LmforgeError("this head runs its own generator through the encoder (ELECTRA pretraining); export the "
                           "discriminator alone (convert --to-hf, then load it) or fine-tune it first")
    from lmforge.persistence.onnx_decoder import export_decoder_onnx, is_decoder

    if is_decoder(backbone):  # a GPT: the KV cache as graph inputs and outputs
        return export_decoder_onnx(model, backbone, folder, quantize=quantize, opset=opset)
    backbone = backbone.eval()
    out = folder / ONNX_DIR
    entry = export_encoder(backbone, out / ENCODER_FILE, opset=opset)
    ort = require_onnxruntime()
    session = _session(out / ENCODER_FILE, ort)
    entry["max_abs_diff_fp32"] = check_parity(_parity(backbone, session, entry), "encoder")
    graphs = {"encoder": entry}
    if exports_whole(model):  # the classifier whole too, for a deployment without lmforge
        model = model.eval()
        task = export_task_model(model, out / TASK_FILE, opset=opset)
        task["max_abs_diff_fp32"] = check_parity(_task_parity(model, _session(out / TASK_FILE, ort)), "task model")
        graphs["task"] = task
    notes = []
    if quantize == "int8":
        check = "the accuracy on your held-out data with `lmforge evaluate --runtime onnx`"
        notes += dict.fromkeys(quantize_graph(out / graph["file"], graph, check) for graph in graphs.values())
    return Exported(write_manifest(out, graphs, ort), notes)


def check_parity(diff: float, what: str) -> float:
    """``diff`` (the largest |ONNX - eager| of a fresh graph), or a one-line refusal beyond ``PARITY_TOLERANCE``
    (NaN included)."""
    if not diff <= PARITY_TOLERANCE:
        raise LmforgeError(f"the exported {what} differs from eager by {diff:.2e} (> {PARITY_TOLERANCE:g}); this is "
                           "a bug in lmforge's export, please report it with the model's config.json")
    return diff


def quantize_graph(path: Path, entry: dict[str, Any], check: str) -> str:
    """``path`` replaced by its int8 version (``quantize_int8``), ``entry`` marked so; the note for the user."""
    fp32 = path.with_suffix(".fp32.onnx")
    path.rename(fp32)
    quantize_int8(fp32, path)
    fp32.unlink()
    entry["precision"] = "int8"
    return f"int8: the MatMul weights are quantised (dynamic quantisation); check {check} against the fp32 folder"


def write_manifest(out: Path, graphs: dict[str, dict[str, Any]], ort: Any) -> dict[str, Any]:
    """``out/manifest.json`` for ``graphs`` (kind -> entry); returns the manifest."""
    manifest = {"format": FORMAT, "graphs": graphs, "torch": torch.__version__, "onnxruntime": ort.__version__}
    atomic_write_text(out / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")
    return manifest


# ------------------------------------------------------------------------------------------------ running
def _session(path: Path, ort: Any) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # as PyTorch's, which --threads / OMP_NUM_THREADS set
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: its warnings about unused initialisers are not the user's
    try:
        # SkipLayerNormFusion (the residual Add folded into the LayerNorm) made BERT's post-LN layers 10% slower on
        # ONNX Runtime's CPU kernels (BENCHMARKS, issue 39): the Add and LayerNormalization stay two nodes
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=DISABLED_OPTIMIZERS)
    except Exception as exc:
        raise InputFileError(f"{path}: ONNX Runtime could not load the graph ({str(exc).splitlines()[0]:.200}); "
                             "export it again with lmforge convert --to-onnx") from exc


class OnnxEncoder(nn.Module):
    """An lmforge ``Encoder``'s forward, run by ONNX Runtime (see the module docstring).

    Takes what ``Encoder.forward`` takes, with the same input checks and errors, and returns an ``EncoderOutput``
    of CPU tensors. Attention weights and explicit ``position_ids`` are not in the graph: ask for them with
    ``--runtime torch``. ``pooled_only`` is accepted and ignored (the graph computes every position).
    """

    def __init__(self, session: Any, config: Any, entry: dict[str, Any]) -> None:
        super().__init__()
        self.session = session
        self.config = config
        self.entry = entry
        self.inputs = list(entry["inputs"])
        # a parameter-less module has no device to report: run_model and the pipelines read it from here
        self._placeholder = nn.Parameter(torch.empty(0), requires_grad=False)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool | Any = False, pooled_only: bool = False) -> EncoderOutput:
        if output_attentions is not False:
            raise LmforgeError("attention weights are not in the ONNX graph; look inside with --runtime torch")
        if position_ids is not None:
            raise LmforgeError("position_ids are not an input of the ONNX graph (positions are 0 .. T - 1); run "
                               "with --runtime torch to give them")
        cfg = self.config
        key_mask = check_encoder_inputs(cfg, input_ids, attention_mask, token_type_ids, None)  # eager's checks
        B, T = input_ids.shape
        feeds = {"input_ids": input_ids.detach().cpu().long().numpy(),
                 "attention_mask": (torch.ones(B, T, dtype=torch.long) if key_mask is None
                                    else key_mask.detach().cpu().long()).numpy()}
        if "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = (torch.zeros(B, T, dtype=torch.long) if token_type_ids is None
                                       else token_type_ids.detach().cpu().long()).numpy()
        names = ["last_hidden_state", "pooled_output"]
        if output_hidden_states:
            names += [f"hidden_state_{i}" for i in range(cfg.n_layers + 1)]
        got = [torch.from_numpy(a) for a in self.session.run(names, feeds)]
        hidden = tuple(got[2:]) if output_hidden_states else None
        return EncoderOutput(got[0], got[1], hidden, None)

    def extra_repr(self) -> str:
        return f"ONNX Runtime, {self.entry.get('precision', 'fp32')}, {self.entry.get('file')}"


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """``folder/onnx/manifest.json``, with a one-line error naming the fix when it is missing or not ours."""
    path = Path(folder) / ONNX_DIR / MANIFEST_NAME
    if not path.is_file():
        raise InputFileError(f"{folder}: no ONNX graph ({ONNX_DIR}/{MANIFEST_NAME} is missing); make one with "
                             f"`lmforge convert --to-onnx {folder} --out DIR` and run that folder, or use --runtime "
                             "torch")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputFileError(f"{path}: not readable JSON ({exc}); export the folder again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(
            manifest.get("graphs"), dict):
        raise InputFileError(f"{path}: not an lmforge ONNX manifest (format {FORMAT!r}); export the folder again")
    return manifest


def onnx_backbone(folder: str | Path, config: Any) -> nn.Module:
    """The ONNX Runtime stand-in for the backbone of the model folder ``folder``."""
    manifest = read_manifest(folder)
    if getattr(config, "arch", None) == "decoder":  # a GPT (lmforge.persistence.onnx_decoder)
        from lmforge.persistence.onnx_decoder import onnx_decoder

        return onnx_decoder(folder, config, manifest)
    entry = manifest["graphs"].get("encoder")
    if entry is None:
        raise InputFileError(f"{folder}/{ONNX_DIR}/{MANIFEST_NAME}: no encoder graph; export the folder again")
    ort = require_onnxruntime()
    path = Path(folder) / ONNX_DIR / str(entry.get("file", ENCODER_FILE))
    if not path.is_file():
        raise InputFileError(f"{path}: missing; export the folder again with lmforge convert --to-onnx")
    expected = _encoder_names(config)[0]
    if list(entry.get("inputs", [])) != expected:
        raise InputFileError(f"{path}: its inputs {entry.get('inputs')} are not this model's {expected}; the graph "
                             "belongs to another model: export the folder again")
    return OnnxEncoder(_session(path, ort), config, entry)


def with_runtime(loaded: Any, folder: str | Path, runtime: str) -> Any:
    """``loaded`` (from ``load_pretrained``) with its backbone run by ``runtime`` ("torch": unchanged)."""
    from lmforge.heads import TaskModel

    if runtime == "torch":
        return loaded
    if runtime != "onnx":
        raise LmforgeError(f"--runtime {runtime!r}: choose torch or onnx")
    model = loaded.model
    if isinstance(model, TaskModel):
        if getattr(model.head, "drives_backbone", False):
            raise LmforgeError(f"{folder}: this head drives its own generator through the encoder; run it with "
                               "--runtime torch")
        model.backbone = onnx_backbone(folder, model.backbone.config)
    else:
        loaded.model = onnx_backbone(folder, getattr(model, "config", loaded.config))
    return loaded


def copy_model_folder(source: str | Path, target: Path) -> None:
    """The files of the model folder ``source`` into ``target`` (no subfolders: runs and checkpoints stay)."""
    for item in sorted(Path(source).iterdir()):
        if item.is_file():
            shutil.copy2(item, target / item.name)
