"""The AWD-LSTM family (``arch = "awd_lstm"``; Merity et al. 2018, ULMFiT's encoder, Howard & Ruder 2018;
``lmforge.models.awd_lstm``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lmforge.config.model import MAX_SIZE, ModelConfig, register_family


@register_family
@dataclass
class AWDLSTMConfig(ModelConfig):
    """``d_model`` is the embedding width (= the last LSTM layer's, tied), ``d_hidden`` the inner layers' width; the
    five dropouts (embedding rows, variational on the input / between layers / on the output, DropConnect on W_hh)
    default to fastai's AWD-LSTM classifier config; ``bptt``: the window of BPT3C; ``bpt3c_grad_len``: a document's
    last tokens that get gradients; ``reverse``: a backward model (each row's real tokens read right to left;
    ULMFiT's forward + backward ensemble); ``init_range``: a new model's embedding is drawn U(-init_range,
    init_range) (Merity et al.'s and fastai's ``initrange``; it matters only when the weights are drawn, never when a
    folder is loaded)."""

    arch: str = "awd_lstm"
    d_hidden: int = 1150
    # the dropouts of fastai's awd_lstm_clas_config (fastai/text/models/awdlstm.py: output_p 0.4, hidden_p 0.3,
    # input_p 0.4, embed_p 0.05, weight_p 0.5); its awd_lstm_lm_config (0.1, 0.15, 0.25, 0.02, 0.2) is what
    # configs/ulmfit-awd-lstm-small.toml sets for the language model
    embed_p: float = 0.05
    input_p: float = 0.4
    hidden_p: float = 0.3
    weight_p: float = 0.5
    output_p: float = 0.4
    bptt: int = 70
    bpt3c_grad_len: int = 1440
    reverse: bool = False
    # the embedding's U(-init_range, init_range): 1.0 for Adam, the paper's 0.1 for SGD / NT-ASGD (models.awd_lstm)
    init_range: float = 1.0

    archs: ClassVar[tuple[str, ...]] = ("awd_lstm",)
    transformer: ClassVar[bool] = False
    dropout_fields: ClassVar[tuple[str, ...]] = ("dropout", "attention_dropout", "embed_p", "input_p", "hidden_p",
                                                 "weight_p", "output_p")

    def _family_problems(self) -> list[str]:
        problems = []
        for name in ("d_hidden", "bptt", "bpt3c_grad_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= MAX_SIZE["d_ff"]:
                problems.append(f"{name}={value!r} must be an integer in [1, {MAX_SIZE['d_ff']:,}]")
        if not 0.0 < self.init_range <= 10.0:  # also refuses NaN
            problems.append(f"init_range={self.init_range} must be in (0, 10] (the paper's embedding range is 0.1)")
        for name in ("embed_p", "input_p", "hidden_p", "weight_p", "output_p"):
            if not 0.0 <= getattr(self, name) < 1.0:  # also refuses NaN
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1)")
        return problems


# "awd-lstm" at the sizes of Merity et al. (2018) and ULMFiT (emb 400, hidden 1150, 3 layers); "awd-lstm-small" trains
# on a 2-core laptop in minutes (same dropouts)
PRESETS: dict[str, dict[str, Any]] = {
    "awd-lstm": dict(arch="awd_lstm", d_model=400, d_hidden=1150, n_layers=3, max_seq_len=1 << 20),
    "awd-lstm-small": dict(arch="awd_lstm", d_model=128, d_hidden=256, n_layers=3, max_seq_len=1 << 20),
}
