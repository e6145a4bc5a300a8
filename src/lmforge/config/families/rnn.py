"""The lectures' RNN families: ``arch = "rnn"`` (a classifier backbone with attention pooling,
``lmforge.models.rnn_encoder``) and ``arch = "rnn_seq2seq"`` (Luong's attentional encoder-decoder,
``lmforge.models.rnn_seq2seq``). ``d_model`` is the embedding and state width; ``n_layers`` counts stacked RNN
layers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from lmforge.choices import (
    DECODER_ORDERS,
    HARD_ATTENTION_ESTIMATORS,
    LOCAL_ALIGNMENTS,
    RNN_CELLS,
    RNN_SEQ2SEQ_ATTENTIONS,
)
from lmforge.config.model import MAX_SIZE, ModelConfig, register_family


@dataclass
class RecurrentOptions(ModelConfig):
    """What every recurrent family shares: the cell, the directions and the attention score."""

    rnn_cell: str = "gru"
    bidirectional: bool = True
    attention: str = "general"

    transformer: ClassVar[bool] = False

    def _family_problems(self) -> list[str]:
        problems = [f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}"
                    for name, choices in (("rnn_cell", RNN_CELLS), ("attention", RNN_SEQ2SEQ_ATTENTIONS))
                    if getattr(self, name) not in choices]
        if self._splits_d_model() and self.bidirectional and isinstance(self.d_model, int) and self.d_model % 2:
            problems.append(f"a bidirectional RNN splits d_model={self.d_model} between two directions; use an "
                            "even d_model")
        return problems

    def _splits_d_model(self) -> bool:
        """Whether a bidirectional RNN of this config gives each direction d_model / 2."""
        return True


@register_family
@dataclass
class RNNConfig(RecurrentOptions):
    """A (Bi)RNN encoder with attention pooling; ``attention_window`` has no meaning for pooling and is refused by
    the model (kept for configs that set it to None)."""

    arch: str = "rnn"
    attention_window: int | None = None

    archs: ClassVar[tuple[str, ...]] = ("rnn",)

    def _family_problems(self) -> list[str]:
        problems = super()._family_problems()
        if self.attention_window is not None and self.attention_window < 0:
            problems.append(f"attention_window={self.attention_window} must be >= 0 (None = global attention)")
        if self.attention == "none":
            problems.append("attention='none' leaves attention pooling nothing to pool with; choose a score")
        return problems


@register_family
@dataclass
class RNNSeq2SeqConfig(RecurrentOptions):
    """The attentional RNN encoder-decoder (the defaults are the model as it was before these options existed):
    attention "none" (Cho et al. 2014: one fixed context vector); local-m or local-p attention of
    ``attention_window``; Luong's or Bahdanau's decoder order; hard attention and its gradient estimator
    (REINFORCE: moving-average reward baseline, optional entropy bonus)."""

    arch: str = "rnn_seq2seq"
    attention_window: int | None = None
    input_feeding: bool = True
    attention_alignment: str = "monotonic"
    decoder_order: str = "luong"
    hard_attention: bool = False
    hard_attention_estimator: str = "straight_through"
    reinforce_baseline_decay: float = 0.9
    reinforce_entropy: float = 0.0
    n_decoder_layers: int | None = None
    share_embeddings: bool = True

    archs: ClassVar[tuple[str, ...]] = ("rnn_seq2seq",)

    def _family_problems(self) -> list[str]:
        problems = RecurrentOptions._family_problems(self)
        for name, choices in (("attention_alignment", LOCAL_ALIGNMENTS), ("decoder_order", DECODER_ORDERS),
                              ("hard_attention_estimator", HARD_ATTENTION_ESTIMATORS)):
            if getattr(self, name) not in choices:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}")
        if self.attention_window is not None and self.attention_window < 0:
            problems.append(f"attention_window={self.attention_window} must be >= 0 (None = global attention)")
        if self.attention_alignment == "predictive" and (self.attention_window is None or self.attention_window < 1):
            problems.append(f"attention_alignment='predictive' is local-p attention and needs attention_window >= 1 "
                            f"(its Gaussian has sigma = D/2); got attention_window={self.attention_window}")
        if self.attention == "none":
            if self.attention_window is not None:
                problems.append(f"attention='none' has no attention to make local; unset attention_window "
                                f"(got {self.attention_window})")
            if self.hard_attention:
                problems.append("attention='none' has no attention to make hard; unset hard_attention")
        if not 0.0 <= self.reinforce_baseline_decay < 1.0:  # also refuses NaN
            problems.append(f"reinforce_baseline_decay={self.reinforce_baseline_decay} must be in [0, 1)")
        if not 0.0 <= self.reinforce_entropy < math.inf:
            problems.append(f"reinforce_entropy={self.reinforce_entropy} must be a finite number >= 0 (0 = no bonus)")
        if self.n_decoder_layers is not None and not 0 <= self.n_decoder_layers <= MAX_SIZE["n_layers"]:
            problems.append(f"n_decoder_layers={self.n_decoder_layers} must be in [0, {MAX_SIZE['n_layers']:,}]")
        return problems


# a BiGRU classifier with attention pooling, and Luong et al.'s (2015) attentional encoder-decoder (bidirectional GRU
# encoder, "general" score, input feeding)
PRESETS: dict[str, dict[str, Any]] = {
    "rnn-attn": dict(arch="rnn", n_layers=1, d_model=256, dropout=0.1),
    "rnn-seq2seq": dict(arch="rnn_seq2seq", n_layers=1, d_model=256, dropout=0.1, attention="general",
                        input_feeding=True),
}
