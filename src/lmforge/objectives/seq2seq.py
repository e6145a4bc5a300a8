"""Sequence-to-sequence training with teacher forcing and label smoothing (Vaswani et al., 2017, section 5.4).

Batches hold ``src_ids``, ``src_mask``, ``tgt_ids`` (decoder inputs ``[CLS] y``), ``tgt_mask`` and ``labels``
(``y [SEP]``, -100 at padding); see ``lmforge.data.seq2seq``. The model (``EncoderDecoder`` or ``RNNSeq2Seq``) is
called as ``model(src_ids, tgt_ids, src_mask, tgt_mask)`` and returns ``.logits`` (B, T, V).

Label smoothing eps: the target distribution puts 1 - eps on the gold token and spreads eps uniformly over the
whole vocabulary (PyTorch's ``label_smoothing``, as in Szegedy et al. 2016; the gold token thus gets
1 - eps + eps / V). The loss term ``seq2seq`` is that smoothed cross-entropy summed over target tokens; the
unsmoothed token NLL is reported as the metric ``nll`` (its exp is the perplexity), with ``token_accuracy``.

Hard attention trained by REINFORCE (an ``RNNSeq2Seq`` with ``hard_attention_estimator='reinforce'``, in training):
the model's output carries ``alignment_samples``; each example's reward is R = log p(y | sampled positions, x), the
negated sum of its (unsmoothed) token NLLs, and ``lmforge.nn.attention.reinforce_loss`` (moving-average baseline,
entropy bonus) gives the score-function surrogate. It is added to the ``seq2seq`` term as ``surrogate -
surrogate.detach()``: its gradient reaches the attention scorer, its value (meaningless as a loss) does not reach the
reported loss. Normalised by the same token count as the cross-entropy, its gradient is the REINFORCE estimate of
that of the summed NLL / tokens. Evaluation runs the model in eval mode (argmax attention, no samples), so eval
losses and perplexity never contain it; training reports ``reinforce_reward`` (mean R per example).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.nn.reinforce import reinforce_loss
from lmforge.objectives.base import ObjectiveOutput

IGNORE = -100


class Seq2SeqObjective:
    def __init__(self, label_smoothing: float = 0.1) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.label_smoothing = label_smoothing

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"seq2seq": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        out = model(batch["src_ids"], batch["tgt_ids"], batch.get("src_mask"), batch.get("tgt_mask"))
        logits = out.logits.flatten(0, 1).float()  # (B*T, V)
        labels = batch["labels"].flatten()  # (B*T,)
        loss = F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum",
                               label_smoothing=self.label_smoothing)
        valid = labels != IGNORE
        n = int(valid.sum())
        metrics = {}
        with torch.no_grad():
            nll = F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum") \
                if self.label_smoothing else loss.detach()
            correct = ((logits.argmax(-1) == labels) & valid).sum()
        samples = getattr(out, "alignment_samples", None)
        if samples is not None:  # hard attention trained by REINFORCE
            with torch.no_grad():
                token_nll = F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="none")  # (B*T,), 0 ignored
                rewards = -token_nll.view(batch["labels"].shape).sum(-1)  # (B,) log p(y | sampled positions, x)
            surrogate = reinforce_loss(samples, rewards, valid.view(batch["labels"].shape))
            loss = loss + (surrogate - surrogate.detach())  # the gradient only
            metrics["reinforce_reward"] = (rewards.sum(), rewards.numel())
        return ObjectiveOutput({"seq2seq": (loss, n)}, {"nll": (nll, n), "token_accuracy": (correct, n), **metrics})
