"""Transformer-XL language modelling (Dai et al. 2019): a causal LM over consecutive segments of a stream, each
segment attending to a memory of the previous segment's states (no gradient through the memory).

The model is the XLNet family (``lmforge.models.xlnet``) with ``attn_type="uni"`` (causal attention over the memory
and the segment; the ``transformer-xl-*`` presets): the CONTENT state at position t predicts token t + 1 through the
LM head (tied, or its own with tie_embeddings=false), computed inside the model's forward
(``return_logits="content"``, so one call of the whole model, which DistributedDataParallel may wrap).
``attn_type="bi"`` is refused: every position would see the token it predicts.

Batches come from plan ``"stream"`` (``lmforge.data.lm_stream.LMStreamData``, the AWD-LSTM's): consecutive windows of
the same rows of one contiguous stream, so row b of a batch continues row b of the previous one. The objective keeps
the memory each call ends with, per layer the last ``mem_len`` inputs of that layer (the previous memory, then this
segment's states), detached: the gradient stops at the segment's start (Dai et al.'s SG(.)), and the next call
attends to it. As the AWD-LSTM's state, the memory starts empty on a batch whose ``reset`` is set (the first window
of a pass over the stream: a new epoch, with a new document order, or a new evaluation) or whose number of rows
differs; training and evaluation keep separate memories (the Trainer evaluates between training steps). The
training memory is checkpointed (``state_dict``, saved by the Trainer for each rank beside its data position), so a
resumed run continues its stream with the memory the interrupted one had: resume is exact.

Memory lengths: training keeps ``ModelConfig.mem_len`` states (it must be set: ``None`` would keep the whole stream);
evaluation keeps ``TXLLoss.eval_mem_len`` (``--loss.eval_mem_len``; default: the same), which may be longer: "the
evaluation context length can exceed the training one" (Dai et al. section 3.3; their WikiText-103 base model trains
with a memory of 150 and evaluates with 640). Evaluation reads the eval stream in order with the memory, from its
first window.

Window lengths: the stream plan draws them around ``seq_len`` (Merity et al.'s variable BPTT, ``data.variable_bptt``,
on by default); Dai et al. train on segments of a fixed length: set ``--data.variable_bptt=false`` for that. The
memory works with either.

Loss term ``lm`` (cross-entropy summed over the tokens, number of tokens): the Trainer reports ``eval_ppl_lm``, the
perplexity on the held-out documents. Metric ``lm_accuracy``: next-token accuracy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput, SegmentMemory, unwrapped
from lmforge.objectives.options import TXLLoss  # noqa: F401  (its loss options, for importers)

IGNORE = -100


def check_txl_model(config: Any, data: Any = None) -> None:
    """Refuse a model config that objective txl cannot train (see the module docstring)."""
    if getattr(config, "arch", None) != "xlnet":
        raise LmforgeError(f"objective txl trains the XLNet family (arch='xlnet', e.g. preset transformer-xl-tiny); "
                           f"got arch={getattr(config, 'arch', None)!r}")
    if config.attn_type != "uni":
        raise LmforgeError(f"objective txl is a causal language model: it needs attn_type='uni', but the model has "
                           f"attn_type={config.attn_type!r}, with which every position sees the token it predicts; "
                           "use a transformer-xl-* preset or --model.attn_type=uni")
    if getattr(config, "lm_stream", "content") != "content":
        raise LmforgeError("objective txl trains the content stream to predict the next token, so generation must "
                           "read it: set --model.lm_stream=content (the transformer-xl-* presets do)")
    if config.mem_len is None:
        raise LmforgeError("objective txl carries a memory of mem_len states from segment to segment: set "
                           "--model.mem_len (transformer-xl-tiny: 64); mem_len=None would keep the whole stream")


def _config(model: nn.Module) -> Any:
    """The model's config under DistributedDataParallel and ``torch.compile`` wrappers."""
    inner = unwrapped(model)
    if not hasattr(inner, "config"):
        raise LmforgeError(f"objective txl needs an XLNet (a model with a config); got {type(model).__name__}")
    return inner.config


class TXLObjective(SegmentMemory):
    """``objective(model, batch)`` for an ``XLNet`` with ``attn_type="uni"`` on plan ``"stream"`` batches (see the
    module docstring). ``eval_mem_len``: the memory kept in evaluation (None: the model's ``mem_len``)."""

    def __init__(self, eval_mem_len: int | None = None) -> None:
        if eval_mem_len is not None and (isinstance(eval_mem_len, bool) or not isinstance(eval_mem_len, int)
                                         or eval_mem_len < 1):
            raise LmforgeError(f"eval_mem_len={eval_mem_len!r} must be an integer >= 1, or None for the model's "
                               "mem_len")
        super().__init__()
        self.eval_mem_len = eval_mem_len

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"lm": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        config = _config(model)
        check_txl_model(config)
        flag = batch.get("backward")
        if flag is not None and bool(flag.any()):
            raise LmforgeError("objective txl reads the stream left to right; these are a backward LM's windows")
        input_ids, labels = batch["input_ids"], batch["labels"]  # (B, T)
        key = bool(model.training)
        mem_len = config.mem_len if key or self.eval_mem_len is None else self.eval_mem_len
        mems = self._memory_for(key, batch)
        out = model(input_ids, mems=mems, output_hidden_states=True, return_logits="content")
        # the new memory: per layer, the last mem_len of [memory; this segment's inputs to the layer], detached
        self._mems[key] = tuple((h if m is None else torch.cat((m.to(h.dtype), h), dim=1))[:, -mem_len:].detach()
                                for h, m in zip(out.hidden_states[:-1], mems or [None] * len(out.hidden_states[:-1]),
                                                strict=True))
        logits = out.logits  # (B, T, V): the content state at t scores token t + 1
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        valid = labels != IGNORE
        correct = ((logits.detach().argmax(-1) == labels) & valid).sum()
        n = int(valid.sum())
        return ObjectiveOutput({"lm": (loss, n)}, {"lm_accuracy": (correct, n)})
