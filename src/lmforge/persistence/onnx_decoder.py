"""ONNX Runtime for GPT decoders: the KV cache as graph inputs and outputs (``lmforge convert --to-onnx``).

Shape legend: B batch, T new tokens, P cached (past) positions, S = P + T, H heads, Dh head dim, D model dim,
V vocab, L layers.

A GPT folder (``arch="decoder"``: learned, sinusoidal or rotary positions, pre- or post-LN) exports as one graph::

    OUT/onnx/decoder.onnx
        inputs   input_ids (B, T), attention_mask (B, S) (1 = real token, 0 = padding),
                 past_key_i, past_value_i (B, H, P, Dh) for i = 0 .. L-1
        outputs  logits (B, T, V), last_hidden_state (B, T, D), hidden_state_0 .. hidden_state_L (B, T, D),
                 present_key_i, present_value_i (B, H, S, Dh)

P = 0 (the prompt pass) is the same graph fed empty (B, H, 0, Dh) pasts: the cached keys are concatenated with the
new ones, and a concatenation with nothing is the new keys. Positions come from the attention mask as in eager
(learned and sinusoidal: cumsum - 1, so left padding is skipped; rotary: offset by P), so left-padded prompts and
cached steps give eager's scores. The graph is checked at export on a left-padded prompt pass and on cached steps
of one and two tokens, and refused when it differs from eager by more than 1e-4 at the real positions (the
manifest records the largest difference). At padding positions, which nothing reads, the outputs are not eager's:
a padded query with no real key to its left averages the values (``lmforge.nn.attention.exported_attention``)
where eager gives zeros.

A GPT fine-tuned with a task head (GPT-1 fine-tuning: a ``TaskModel`` whose backbone is a ``Decoder``) exports the
same graph without ``logits``: the head reads ``last_hidden_state`` (and the pooled last real token, taken in
PyTorch), and the vocabulary projection, which it never reads, is not computed. Such a graph does not generate.

``OnnxDecoder`` takes ``Decoder.forward``'s arguments and returns its ``DecoderOutput``; its cache
(``OnnxDecoderCache``, from ``new_cache()``) holds the present keys and values ONNX Runtime returned, fed back as
the next call's pasts. ``lmforge.generation.generate`` decodes it with its ``DecoderAdapter``, the scores of each
step taken from the graph's ``logits`` (``logits_in_graph``): greedy search, sampling and beam search run
unchanged, always with the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lmforge.errors import InputFileError, LmforgeError
from lmforge.models.decoder import check_total_length
from lmforge.models.outputs import DecoderOutput
from lmforge.nn.inputs import check_input_ids
from lmforge.nn.masks import key_padding_mask
from lmforge.persistence.onnx import (
    MANIFEST_NAME,
    ONNX_DIR,
    OPSET,
    Exported,
    _session,
    check_parity,
    quantize_graph,
    require_onnx,
    require_onnxruntime,
    write_graph,
    write_manifest,
)

__all__ = ["DECODER_FILE", "OnnxDecoder", "OnnxDecoderCache", "decoder_names", "export_decoder",
           "export_decoder_onnx", "is_decoder", "onnx_decoder"]

DECODER_FILE = "decoder.onnx"
_NUMPY = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16}


def is_decoder(model: nn.Module) -> bool:
    """An lmforge GPT ``Decoder`` (the backbone this module exports)."""
    from lmforge.models.decoder import Decoder

    return isinstance(model, Decoder)


def decoder_names(n_layers: int, logits: bool = True) -> tuple[list[str], list[str]]:
    """The graph's input and output names for ``n_layers`` layers (without ``logits`` for a task model)."""
    past = [f"past_{kind}_{i}" for i in range(n_layers) for kind in ("key", "value")]
    present = [f"present_{kind}_{i}" for i in range(n_layers) for kind in ("key", "value")]
    hidden = [f"hidden_state_{i}" for i in range(n_layers + 1)]
    return ["input_ids", "attention_mask", *past], [*(["logits"] if logits else []), "last_hidden_state", *hidden,
                                                    *present]


# ------------------------------------------------------------------------------------------------ export
class _DecoderGraph(nn.Module):
    """What is exported: the decoder called with tensors only (its cache filled from the past inputs), returning a
    flat tuple of tensors in ``decoder_names`` order."""

    def __init__(self, decoder: nn.Module, logits: bool) -> None:
        super().__init__()
        self.decoder = decoder
        self.logits = logits

    def forward(self, input_ids: Tensor, attention_mask: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        cache = self.decoder.new_cache()
        for i, layer in enumerate(cache.layers):  # (B, H, P, Dh) each; while exporting, appending concatenates
            layer.self_attn.append(past[2 * i], past[2 * i + 1])
        out = self.decoder(input_ids, attention_mask=attention_mask, cache=cache, return_logits=self.logits,
                           output_hidden_states=True)
        present = [kv for layer in cache.layers for kv in (layer.self_attn.key, layer.self_attn.value)]
        return (*([out.logits] if self.logits else []), out.last_hidden_state, *out.hidden_states, *present)


def _geometry(config: Any) -> tuple[int, int, int]:
    """(L, H, Dh) of a decoder config."""
    return config.n_layers, config.n_heads, config.d_model // config.n_heads


def _random_ids(config: Any, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    return torch.randint(min(5, config.vocab_size - 1), config.vocab_size, shape, generator=generator)


def export_decoder(decoder: nn.Module, path: Path, *, logits: bool = True, opset: int = OPSET) -> dict[str, Any]:
    """Write ``decoder`` (an lmforge ``Decoder``) to ``path`` as ONNX; return its manifest entry.

    The graph takes any batch size, any T >= 1 and any P >= 0 with P + T up to ``max_seq_len``. It is traced on
    P = 3 cached and T = 4 new positions (sizes 0 and 1 would be specialised by ``torch.export``).
    """
    require_onnx()
    config = decoder.config
    L, H, Dh = _geometry(config)
    limit = config.max_seq_len
    if limit < 4:
        raise LmforgeError(f"max_seq_len={limit}: convert --to-onnx traces a decoder on at least 4 positions")
    T = min(4, limit - 2)
    P = min(3, limit - T)
    inputs, outputs = decoder_names(L, logits)
    g = torch.Generator().manual_seed(0)
    dtype = next(decoder.parameters()).dtype
    ids = _random_ids(config, (2, T), g)
    mask = torch.ones(2, P + T, dtype=torch.long)
    mask[1, :P + 1] = 0  # a left-padded row: its padding spans the past and the first new token
    past = [torch.randn(2, H, P, Dh, generator=g).to(dtype) for _ in range(2 * L)]
    batch = torch.export.Dim("batch", min=1)
    new = torch.export.Dim("sequence", min=1, max=limit)
    cached = torch.export.Dim("past", min=0, max=limit - 1)
    total = torch.export.Dim("total", min=1, max=limit)
    dynamic = ({0: batch, 1: new}, {0: batch, 1: total}, tuple({0: batch, 2: cached} for _ in past))
    graph = _DecoderGraph(decoder, logits).eval()
    write_graph(graph, (ids, mask, *past), path, what="decoder", inputs=inputs, outputs=outputs, dynamic=dynamic,
                opset=opset)
    return {"file": path.name, "kind": "decoder", "inputs": inputs, "outputs": outputs, "precision": "fp32",
            "opset": opset, "positional": config.positional, "cache": "past_*/present_* (batch, heads, positions, "
            "head dim); P = 0: empty pasts"}


def _parity(decoder: nn.Module, session: Any, entry: dict[str, Any]) -> dict[str, float]:
    """The largest |ONNX - eager| of the logits (or, without them, the final states) over the real positions of a
    left-padded prompt pass (P = 0), then of cached steps of 1, 1 and 2 tokens fed the graph's own presents."""
    config = decoder.config
    L, H, Dh = _geometry(config)
    has_logits = "logits" in entry["outputs"]
    g = torch.Generator().manual_seed(1)
    steps = [1, 1, 2]
    width = max(1, min(9, config.max_seq_len - sum(steps)))
    while width + sum(steps) > config.max_seq_len:
        steps.pop()
    B = 3
    ids = _random_ids(config, (B, width), g)
    mask = torch.ones(B, width, dtype=torch.long)
    mask[1, :width // 2] = 0  # left padding, as generation lays prompts out
    mask[2, :width - 1] = 0
    dtype = _NUMPY.get(session.get_inputs()[2].type, np.float32)
    past = [np.zeros((B, H, 0, Dh), dtype=dtype) for _ in range(2 * L)]
    names = [*(["logits"] if has_logits else []), "last_hidden_state",
             *[n for n in entry["outputs"] if n.startswith("present_")]]
    cache = decoder.new_cache()
    diffs: dict[str, float] = {}
    new_ids, real = ids, mask.bool()
    for step, T in enumerate([width, *steps]):
        if step:
            new_ids = _random_ids(config, (B, T), g)
            mask = torch.cat((mask, torch.ones(B, T, dtype=torch.long)), dim=1)
            real = torch.ones(B, T, dtype=torch.bool)
        with torch.no_grad():
            want = decoder(new_ids, attention_mask=mask, cache=cache, return_logits=has_logits)
        feeds = {"input_ids": new_ids.numpy(), "attention_mask": mask.numpy()}
        feeds.update({name: value for name, value in zip(entry["inputs"][2:], past, strict=True)})
        got = dict(zip(names, session.run(names, feeds), strict=True))
        past = [got[n] for n in names if n.startswith("present_")]
        diff = (torch.from_numpy(got["last_hidden_state"]) - want.last_hidden_state)[real].abs().max().item()
        if has_logits:
            diff = max(diff, (torch.from_numpy(got["logits"]) - want.logits)[real].abs().max().item())
        key = "prompt" if step == 0 else "cached_steps"
        diffs[key] = max(diffs.get(key, 0.0), diff)
    return diffs


def export_decoder_onnx(model: nn.Module, decoder: nn.Module, folder: Path, *, quantize: str | None = None,
                        opset: int = OPSET) -> Exported:
    """``lmforge.persistence.onnx.export_onnx`` for a GPT: ``model`` is the loaded model (a ``Decoder``, or a
    ``TaskModel`` around one, whose graph then has no ``logits``), ``decoder`` its ``Decoder``."""
    from lmforge.heads import TaskModel

    decoder = decoder.eval()
    task_model = isinstance(model, TaskModel)
    out = folder / ONNX_DIR
    entry = export_decoder(decoder, out / DECODER_FILE, logits=not task_model, opset=opset)
    ort = require_onnxruntime()
    diffs = _parity(decoder, _session(out / DECODER_FILE, ort), entry)
    entry["max_abs_diff_fp32"] = check_parity(max(diffs.values()), "decoder")
    entry["max_abs_diff_fp32_by_pass"] = diffs
    notes = []
    if task_model:
        notes.append("a task model: the graph has no logits (its head reads the final states); it does not "
                     "generate: export the language model's folder for that")
    if quantize == "int8":
        notes.append(quantize_graph(out / DECODER_FILE, entry, "the quality on your own prompts"))
    return Exported(write_manifest(out, {"decoder": entry}, ort), notes)


# ------------------------------------------------------------------------------------------------ running
class OnnxDecoderCache:
    """The state of incremental decoding with an ``OnnxDecoder``: the present keys and values the graph returned,
    fed back as the next call's pasts. Make one with ``model.new_cache()`` and pass the same object to every call.

    Attributes:
        keys, values: one (B, H, P, Dh) array per layer, or None while empty.
    """

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.keys: list[np.ndarray] | None = None
        self.values: list[np.ndarray] | None = None

    @property
    def length(self) -> int:
        """P, number of cached positions (padding included; 0 while empty)."""
        return 0 if self.keys is None else int(self.keys[0].shape[2])

    @property
    def batch_size(self) -> int | None:
        """B of the cached keys, or None while empty."""
        return None if self.keys is None else int(self.keys[0].shape[0])

    def reorder(self, index: Tensor) -> None:
        """Select batch rows, e.g. the surviving beams: ``index`` (B',) rows to keep in order (repeats allowed)."""
        if self.keys is None or self.values is None:
            return
        rows = index.detach().cpu().long().numpy()
        self.keys = [k.take(rows, axis=0) for k in self.keys]
        self.values = [v.take(rows, axis=0) for v in self.values]

    def __repr__(self) -> str:
        return f"OnnxDecoderCache(layers={self.n_layers}, length={self.length})"


class OnnxDecoder(nn.Module):
    """An lmforge ``Decoder``'s forward, run by ONNX Runtime with the KV cache as graph inputs and outputs (see the
    module docstring).

    Takes what ``Decoder.forward`` takes, with the same input checks and errors, and returns a ``DecoderOutput`` of
    CPU tensors; the cache is an ``OnnxDecoderCache`` from ``new_cache()``. Attention weights and explicit
    ``position_ids`` are not in the graph: ask for them with ``--runtime torch``.

    ``logits_in_graph`` tells ``lmforge.generation``'s decoder adapter to score each step with the graph's
    ``logits`` (projecting ``last_hidden_state`` again in PyTorch would compute the projection twice) and to decode
    with the cache always (``use_cache=False`` gives the same tokens in eager, and is not needed here).
    """

    logits_in_graph = True

    def __init__(self, session: Any, config: Any, entry: dict[str, Any]) -> None:
        super().__init__()
        self.session = session
        self.config = config
        self.entry = entry
        self.n_layers, self.n_heads, self.d_head = _geometry(config)
        self.has_logits = "logits" in entry["outputs"]
        self._past_names = list(entry["inputs"][2:])
        self._present_names = [n for n in entry["outputs"] if n.startswith("present_")]
        self._dtype = _NUMPY.get(session.get_inputs()[2].type, np.float32)
        # a parameter-less module has no device to report: run_model and the pipelines read it from here
        self._placeholder = nn.Parameter(torch.empty(0), requires_grad=False)

    def new_cache(self) -> OnnxDecoderCache:
        """An empty cache."""
        return OnnxDecoderCache(self.n_layers)

    def lm_logits(self, hidden: Tensor, out: Tensor | None = None) -> Tensor:
        raise LmforgeError("the vocabulary projection is inside the ONNX graph: call the model with "
                           "return_logits=True, or run with --runtime torch")

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: OnnxDecoderCache | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool | Any = False,
        return_logits: bool = True,
        last_only: bool = False,
    ) -> DecoderOutput:
        """As ``Decoder.forward`` (see there); ``cache`` is an ``OnnxDecoderCache``."""
        if output_attentions is not False:
            raise LmforgeError("attention weights are not in the ONNX graph; look inside with --runtime torch")
        if position_ids is not None:
            raise LmforgeError("position_ids are not an input of the ONNX graph (positions come from the attention "
                               "mask and the cache); run with --runtime torch to give them")
        if return_logits and not self.has_logits:
            raise LmforgeError("this ONNX graph was exported for a task head and has no logits (it does not "
                               "generate); export the language model's folder, or run with --runtime torch")
        cfg = self.config
        B, T = check_input_ids(input_ids, vocab_size=cfg.vocab_size)
        past = 0
        if cache is not None:
            if not isinstance(cache, OnnxDecoderCache):
                raise LmforgeError(f"cache must be an OnnxDecoderCache (model.new_cache()); got "
                                   f"{type(cache).__name__}")
            past = cache.length
            if cache.batch_size is not None and cache.batch_size != B:
                raise LmforgeError(f"cache holds batch size {cache.batch_size} but input_ids has {B} rows; reorder "
                                   "the cache (cache.reorder(index)) when the batch changes")
        S = check_total_length(cfg, past, T)
        if attention_mask is None:
            mask = torch.ones(B, S, dtype=torch.bool)
        else:
            given = attention_mask.detach().cpu() if isinstance(attention_mask, Tensor) else attention_mask
            mask = key_padding_mask(given, batch=B, length=S,
                                    length_label=f"cached + new = {past} + {T} = {S}")  # (B, S) bool
        feeds = {"input_ids": np.ascontiguousarray(input_ids.detach().cpu().long().numpy()),
                 "attention_mask": mask.long().numpy()}
        if cache is None or cache.keys is None or cache.values is None:
            empty = np.zeros((B, self.n_heads, 0, self.d_head), dtype=self._dtype)
            feeds.update({name: empty for name in self._past_names})
        else:
            pasts = [kv for pair in zip(cache.keys, cache.values, strict=True) for kv in pair]
            feeds.update(zip(self._past_names, pasts, strict=True))
        names = [*(["logits"] if return_logits else []), "last_hidden_state"]
        if output_hidden_states:
            names += [f"hidden_state_{i}" for i in range(self.n_layers + 1)]
        if cache is not None:
            names += self._present_names
        got = dict(zip(names, self.session.run(names, feeds), strict=True))
        if cache is not None:
            cache.keys = [got[f"present_key_{i}"] for i in range(self.n_layers)]
            cache.values = [got[f"present_value_{i}"] for i in range(self.n_layers)]
        x = torch.from_numpy(got["last_hidden_state"])  # (B, T, D)
        logits = torch.from_numpy(got["logits"]) if return_logits else None  # (B, T, V)
        hidden = tuple(torch.from_numpy(got[f"hidden_state_{i}"]) for i in range(self.n_layers + 1)) \
            if output_hidden_states else None
        last = None  # (B,) each row's last real new token, when a mask was given (as Decoder.forward)
        if attention_mask is not None:
            last = (mask[:, past:] * torch.arange(1, T + 1)).argmax(-1)
        if last_only:
            x, logits, last = x[:, -1:], None if logits is None else logits[:, -1:], None
        pooled = x[:, -1] if last is None else x[torch.arange(B), last]  # (B, D)
        return DecoderOutput(logits, x, cache, hidden, None, pooled)

    def extra_repr(self) -> str:
        return f"ONNX Runtime, {self.entry.get('precision', 'fp32')}, {self.entry.get('file')}"


def onnx_decoder(folder: str | Path, config: Any, manifest: dict[str, Any]) -> OnnxDecoder:
    """The ONNX Runtime stand-in for the ``Decoder`` of the model folder ``folder`` (``manifest`` its
    ``onnx/manifest.json``)."""
    where = f"{folder}/{ONNX_DIR}/{MANIFEST_NAME}"
    entry = manifest["graphs"].get("decoder")
    if not isinstance(entry, dict):
        raise InputFileError(f"{where}: no decoder graph for this GPT folder; export the folder again with lmforge "
                             "convert --to-onnx")
    ort = require_onnxruntime()
    path = Path(folder) / ONNX_DIR / str(entry.get("file", DECODER_FILE))
    if not path.is_file():
        raise InputFileError(f"{path}: missing; export the folder again with lmforge convert --to-onnx")
    outputs = entry.get("outputs")
    expected_in, expected_out = decoder_names(config.n_layers, logits=isinstance(outputs, list) and "logits" in outputs)
    if list(entry.get("inputs") or []) != expected_in or outputs != expected_out:
        raise InputFileError(f"{where}: its inputs and outputs are not those of this {config.n_layers}-layer GPT; "
                             "the graph belongs to another model: export the folder again")
    return OnnxDecoder(_session(path, ort), config, entry)
