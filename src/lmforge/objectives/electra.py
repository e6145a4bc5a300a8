"""ELECTRA's replaced-token detection (Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators
Rather Than Generators", ICLR), section 2.

The model is ``TaskModel(discriminator, ElectraPreTrainingHeads)`` (``lmforge.heads.electra``): one call runs the
generator on the masked input, samples a replacement at each masked position, and runs the discriminator on the
corrupted text. Batches are the masked-LM plans' (``lmforge.data.pretraining``): ``input_ids`` (the masked input),
``attention_mask``, ``token_type_ids``, ``mlm_labels`` (the original id at the masked positions, -100 elsewhere).

Loss (equation 1 of the paper, summed over the batch here and divided by the Trainer):

    L = L_MLM(x, theta_G) + lambda * L_Disc(x, theta_D),   lambda = ``ElectraLoss.rtd_weight`` (50)

- ``mlm``: the generator's cross-entropy summed over the N masked tokens (items: N), so its term is the mean over
  masked tokens, as BERT's MLM;
- ``rtd``: lambda times the binary cross-entropy of the discriminator's "replaced" logit, summed over every real token
  (``attention_mask`` = 1, [CLS] and [SEP] included, as the released code weights the loss by the input mask; items:
  their number), so its term is lambda times the mean over real tokens. Label 1 = the token differs from the original
  (a sampled original is labelled original).

The sampling is a discrete draw, so the ``rtd`` term's gradient reaches the discriminator and the shared embeddings
only, never the generator's layers or MLM head (tested in ``tests/objectives/test_electra.py``).

Sampling temperature (``ElectraLoss.temperature``, off by default): a curriculum that draws the replacements from
softmax(logits / tau), tau descending to ``temperature_end`` (1: the paper's) over the run (the Trainer reports its
progress through ``set_progress``).

Metrics: ``mlm_accuracy`` (the generator's argmax at the masked positions), ``rtd_accuracy`` (logit > 0 agrees with
the label, over real tokens), ``rtd_bce`` (the unweighted mean BCE, comparable across lambdas), ``replaced_share``
(the share of real tokens that were replaced: falls as the generator learns), ``rtd_recall`` (of the replaced tokens,
the share detected).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.objectives.base import ObjectiveOutput
from lmforge.objectives.masked_lm import constant_guess_hits
from lmforge.objectives.options import ElectraLoss

IGNORE = -100


class ElectraObjective:
    """``objective(model, batch)`` for an ELECTRA ``TaskModel`` (see the module docstring).

    Args:
        options: the loss options (``ElectraLoss``: lambda, the paper's 50, and the sampling temperature's schedule).
    """

    # the Trainer logs this term's summed item count (the masked tokens) as ``predicted_tokens``
    predicted_tokens_term = "mlm"

    def __init__(self, options: ElectraLoss | None = None) -> None:
        self.options = options or ElectraLoss()
        self.fraction = 0.0  # the run's progress before the current update (the Trainer's set_progress)

    def set_progress(self, fraction: float) -> None:
        """Called by the Trainer before each update with the run's progress in [0, 1] (the budget's elapsed
        fraction, or the share of max_steps): it sets the generator's sampling temperature of that update."""
        self.fraction = fraction

    @property
    def rtd_weight(self) -> float:
        """lambda, the weight of the discriminator's loss (``ElectraLoss.rtd_weight``)."""
        return self.options.rtd_weight

    @property
    def temperature(self) -> float:
        """The generator's sampling temperature of the current training update (1 without a schedule)."""
        return self.options.temperature_at(self.fraction)

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        mask = batch.get("attention_mask")
        real = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        return {"mlm": int((batch["mlm_labels"] != IGNORE).sum()), "rtd": real}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        labels = batch["mlm_labels"]  # (B, T)
        mask = batch.get("attention_mask")
        # evaluation samples at temperature 1: held-out metrics measure the paper's task whatever the schedule.
        # With a schedule, tau reaches the model as a 0-d tensor on every training update (even where it is 1): dynamo
        # guards on a Python float (a recompile at its first change of value in torch 2.13, one per value where floats
        # are specialised), never on a tensor's value.
        extra = {}
        if model.training and self.options.scheduled:
            extra["temperature"] = torch.tensor(self.temperature, dtype=torch.float32, device=labels.device)
        out = model(batch["input_ids"], attention_mask=mask, token_type_ids=batch.get("token_type_ids"),
                    mlm_labels=labels, **extra)
        targets = labels[labels != IGNORE]  # (N,) row-major, the order of the generator's logits
        n = targets.numel()
        mlm_logits = out.mlm_logits.float()  # (N, V) fp32 even under bf16 autocast
        mlm_loss = F.cross_entropy(mlm_logits, targets, reduction="sum")
        mlm_correct = (mlm_logits.detach().argmax(-1) == targets).sum()

        real = mask.bool() if mask is not None else torch.ones_like(labels, dtype=torch.bool)  # (B, T)
        logits = out.rtd_logits.float()[real]  # (R,) R = real tokens
        replaced = out.replaced[real]  # (R,) bool
        bce = F.binary_cross_entropy_with_logits(logits, replaced.float(), reduction="sum")
        r = logits.numel()
        detected = (logits.detach() > 0) & replaced
        losses = {"mlm": (mlm_loss, n), "rtd": (self.rtd_weight * bce, r)}
        metrics = {
            "mlm_accuracy": (mlm_correct, n),
            "mlm_constant_accuracy": (constant_guess_hits(targets), n),  # the generator's plateau
            "rtd_accuracy": (((logits.detach() > 0) == replaced).sum(), r),
            "rtd_bce": (bce.detach(), r),
            "replaced_share": (replaced.sum(), r),
            "rtd_recall": (detected.sum(), replaced.sum()),
        }
        return ObjectiveOutput(losses, metrics)
