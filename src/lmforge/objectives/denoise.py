"""Denoising autoencoding (BART, Lewis et al. 2020, section 2.2): reconstruct a text from a corruption of it.

Batches follow plan ``"denoise"`` (``lmforge.data.corruption.DenoisingData``): ``src_ids`` / ``src_mask`` (B, S) the
corrupted text, ``tgt_ids`` / ``tgt_mask`` (B, T) the original text shifted right (it starts with [CLS], the
decoder's start token), ``labels`` (B, T) the original text (ending with [SEP]; -100 at padding). The
``EncoderDecoder`` reads the corrupted text with its encoder and is teacher-forced on the original:
``model(src_ids, tgt_ids, src_mask, tgt_mask).logits`` (B, T, V).

One loss term ``denoise``: the cross-entropy of the decoder's predictions of the original tokens, summed over the
real target tokens (item count = their number; the Trainer divides by the count over the whole step), in fp32 even
under bf16 autocast; metric ``denoise_accuracy`` (argmax = label). BART's paper trains with this plain negative
log-likelihood (no label smoothing in pretraining), so there is no smoothing option.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.objectives.base import ObjectiveOutput

IGNORE = -100


class DenoisingObjective:
    """``objective(model, batch)`` for an ``EncoderDecoder`` on plan ``"denoise"`` batches (see the module
    docstring)."""

    # the Trainer logs this term's summed item count (the reconstructed tokens) as ``predicted_tokens``
    predicted_tokens_term = "denoise"

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"denoise": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        out = model(batch["src_ids"], batch["tgt_ids"], batch.get("src_mask"), batch.get("tgt_mask"))
        labels = batch["labels"]  # (B, T)
        logits = out.logits  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        valid = labels != IGNORE
        correct = ((logits.detach().argmax(-1) == labels) & valid).sum()
        n = int(valid.sum())
        return ObjectiveOutput({"denoise": (loss, n)}, {"denoise_accuracy": (correct, n)})
