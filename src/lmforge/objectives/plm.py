"""Permutation language modelling (XLNet, Yang et al. 2019): predict the target tokens of a random factorisation
order, each from the tokens before it in the order, with the query stream of two-stream attention.

Batches follow plan ``"plm"`` of ``lmforge.data.pretraining``: ``input_ids``, ``attention_mask``, ``token_type_ids``,
``perm_mask`` (B, T, T) (the query stream's mask, True = may not see), ``target_mapping`` (B, N, T),
``target_mask`` (B, N) and ``labels`` (B, N) (-100 on padding rows).

The model runs once on the whole batch (``model(input_ids, attention_mask=..., perm_mask=..., target_mapping=...)``);
the query stream's states of the real prediction rows go through the model's tied LM head (``lm_logits``), so the
vocabulary projection runs only where something is predicted. One loss term ``plm``: the cross-entropy summed over
the real targets (item count = their number; the Trainer divides by the count over the whole step); metric
``plm_accuracy`` (argmax = label). With the identity order and every token a target the loss is a causal LM's:
token t predicted from the tokens before it (tested in ``tests/objectives/test_plm.py``).

Limitation: the LM head is applied outside ``XLNet.forward`` (which returns states only), so under
DistributedDataParallel the LM bias would be used outside the wrapped forward; the objective refuses a DDP-wrapped
model rather than fail inside backward. Computing the logits inside ``XLNet.forward`` would lift it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput
from lmforge.training.distributed import unwrap_model

IGNORE = -100


class PLMObjective:
    """``objective(model, batch)`` for an ``XLNet`` on plan ``"plm"`` batches (see the module docstring)."""

    # the Trainer logs this term's summed item count (the predicted tokens) as ``predicted_tokens``
    predicted_tokens_term = "plm"

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"plm": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        if isinstance(model, DistributedDataParallel):
            raise LmforgeError("objective plm does not run under several processes yet: XLNet's LM head is applied "
                               "outside the model's forward (run on one process)")
        out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                    token_type_ids=batch.get("token_type_ids"), perm_mask=batch["perm_mask"],
                    target_mapping=batch["target_mapping"])
        labels = batch["labels"]  # (B, N)
        real = labels != IGNORE  # the real prediction rows (target_mask, from the labels so that counts agree)
        targets = labels[real]  # (n,)
        logits = unwrap_model(model).lm_logits(out.query_state[real]).float()  # (n, V), fp32 even under bf16
        loss = F.cross_entropy(logits, targets, reduction="sum")
        correct = (logits.detach().argmax(-1) == targets).sum()
        n = targets.numel()
        return ObjectiveOutput({"plm": (loss, n)}, {"plm_accuracy": (correct, n)})
