"""Permutation language modelling (XLNet, Yang et al. 2019): predict the target tokens of a random factorisation
order, each from the tokens before it in the order, with the query stream of two-stream attention.

Batches follow plan ``"plm"`` of ``lmforge.data.pretraining``: ``input_ids``, ``attention_mask``, ``token_type_ids``,
``perm_mask`` (B, T, T) (the query stream's mask, True = may not see), ``target_mapping`` (B, N, T),
``target_mask`` (B, N) and ``labels`` (B, N) (-100 on padding rows).

The model runs once on the whole batch (``model(input_ids, attention_mask=..., perm_mask=..., target_mapping=...,
return_logits="query", logits_rows=...)``): the query stream's states of the real prediction rows go through the
model's LM head (tied, or its own with tie_embeddings=false) inside its forward, so the vocabulary projection runs
only where something is predicted, and
under DistributedDataParallel the LM head takes part in the wrapped forward (several processes train as one).

Segment recurrence (XLNet section 2.4; ``data.reuse_len``, plan "plm" read as a stream by
``lmforge.data.plm_stream``): the objective keeps a memory as Transformer-XL's (``lmforge.objectives.txl``): per
layer, the last ``mem_len`` (``ModelConfig.mem_len``) of [memory; the layer's inputs at the first ``reuse_len``
positions of this batch], detached, so no gradient reaches it (Yang et al.'s SG(.)); the next batch, whose row b
continues row b of this one, attends to it in both streams. The memory starts empty on a batch whose ``reset`` is
set (a new pass over the stream) or whose number of rows differs; training and evaluation keep separate memories,
and the training memory is checkpointed (``state_dict``), so a resumed run continues exactly. A batch with
``reversed_rows`` (XLNet's ``bi_data``) passes it to the model (negated relative distances on those rows). Without
``reuse_len`` every batch is read on its own.

One loss term ``plm``: the cross-entropy summed over the real targets (item count = their number; the Trainer
divides by the count over the whole step); metric ``plm_accuracy`` (argmax = label). With the identity order and
every token a target the loss is a causal LM's: token t predicted from the tokens before it (tested in
``tests/objectives/test_plm.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput, SegmentMemory, unwrapped
from lmforge.objectives.masked_lm import constant_guess_hits

IGNORE = -100


class PLMObjective(SegmentMemory):
    """``objective(model, batch)`` for an ``XLNet`` on plan ``"plm"`` batches (see the module docstring).
    ``reuse_len``: keep the states of each batch's first ``reuse_len`` positions as the next batch's memory (plan
    "plm" read as a stream); None: no memory."""

    # the Trainer logs this term's summed item count (the predicted tokens) as ``predicted_tokens``
    predicted_tokens_term = "plm"

    def __init__(self, reuse_len: int | None = None) -> None:
        if reuse_len is not None and (isinstance(reuse_len, bool) or not isinstance(reuse_len, int) or reuse_len < 1):
            raise LmforgeError(f"reuse_len={reuse_len!r} must be an integer >= 1, or None for no memory")
        super().__init__()
        self.reuse_len = reuse_len

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"plm": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        labels = batch["labels"]  # (B, N)
        real = labels != IGNORE  # the real prediction rows (target_mask, from the labels so that counts agree)
        mems = None
        if self.reuse_len is not None:
            config = getattr(unwrapped(model), "config", None)
            mem_len = getattr(config, "mem_len", None)
            if mem_len is None:
                raise LmforgeError("objective plm with data.reuse_len keeps a memory of mem_len states: set "
                                   "--model.mem_len (XLNet: 384 with reuse_len 256)")
            mems = self._memory_for(bool(model.training), batch)
        extra = {} if batch.get("reversed_rows") is None else {"reversed_rows": batch["reversed_rows"]}
        out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                    token_type_ids=batch.get("token_type_ids"), perm_mask=batch["perm_mask"],
                    target_mapping=batch["target_mapping"], return_logits="query", logits_rows=real, mems=mems,
                    output_hidden_states=self.reuse_len is not None, **extra)
        if self.reuse_len is not None:  # per layer, the last mem_len of [memory; the reused part's inputs], detached
            R = self.reuse_len
            self._mems[bool(model.training)] = tuple(
                (h[:, :R] if m is None else torch.cat((m.to(h.dtype), h[:, :R]), dim=1))[:, -mem_len:].detach()
                for h, m in zip(out.hidden_states[:-1], mems or [None] * (len(out.hidden_states) - 1), strict=True))
        targets = labels[real]  # (n,)
        logits = out.logits.float()  # (n, V), in row-major order of ``real``; fp32 even under bf16
        loss = F.cross_entropy(logits, targets, reduction="sum")
        correct = (logits.detach().argmax(-1) == targets).sum()
        n = targets.numel()
        # the accuracy beside its plateau, the best constant guess (lmforge.recipes.pretrain.plateau_warning)
        return ObjectiveOutput({"plm": (loss, n)}, {"plm_accuracy": (correct, n),
                                                    "plm_constant_accuracy": (constant_guess_hits(targets), n)})
