"""ELMo (Peters et al. 2018; ``lmforge.models.elmo``): ``arch = "bilm"`` (the biLM) and ``arch = "elmo"`` (a
frozen biLM's scalar mix under a task BiLSTM, what fine-tuning builds from a biLM folder)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from lmforge.choices import TOKEN_ENCODERS
from lmforge.config.families.rnn import RecurrentOptions
from lmforge.config.model import MAX_SIZE, register_family

INPUT_UNITS = ("word", "piece")  # what the biLM's tokens are: whole words (ELMo's) or word pieces


@register_family
@dataclass
class BiLMConfig(RecurrentOptions):
    """ELMo's biLM: ``d_model`` is the LSTMP projection (each direction's output) and the token representation width;
    ``d_cell`` the LSTM cell width (None: d_model); the token layer is a character CNN (``d_char``, ``char_filters``
    = [[width, n_filters], ...], ``n_highway``, ``max_chars_per_token``) or an embedding table; ``softmax_samples``
    > 0 trains with a sampled softmax of that many negatives (0: full softmax), drawn by ``softmax_sampler``:
    "log_uniform" (bilm-tf's: a Zipfian proposal over the tokens ranked by their frequency in the training corpus,
    with the log Q correction) or "uniform". ``input_unit``: "word" (the paper's: the tokenizer's tokens are whole
    words, a word-level vocabulary made by ``lmforge tokenizer train --algorithm words``) or "piece" (word pieces,
    each spelled with its ``##``; what a folder without the key reads). ``cell_clip`` / ``proj_clip``: clip the LSTM
    cell and the projected output to [-clip, clip] (bilm-tf: 3 and 3; None or 0: no clipping, ``nn.LSTM``).

    Fine-tuning (arch "elmo"): ``elmo_layer_norm`` layer-normalises the layers before the scalar mix;
    ``elmo_rnn_layers`` task BiLSTM layers (``rnn_cell``, ``bidirectional``) with ``attention`` pooling;
    ``elmo_token_dim`` > 0 adds a trainable token embedding of that width beside ELMo_k (the paper's [x_k; ELMo_k]);
    a new encoder (``ELMoEncoder.wrap``, what fine-tuning a biLM folder builds) defaults to d_model, while 0 here is
    what a folder without the key loads with.
    """

    arch: str = "bilm"
    token_encoder: str = "chars"
    d_cell: int | None = None
    d_char: int = 16
    char_filters: list[list[int]] = dataclasses.field(
        default_factory=lambda: [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]])
    n_highway: int = 2
    max_chars_per_token: int = 50
    softmax_samples: int = 0
    softmax_sampler: str = "log_uniform"
    input_unit: str = "piece"  # a folder without the key: word pieces, as before the key existed
    cell_clip: float | None = None  # None or 0: no clipping (a folder without the key), the fused nn.LSTM
    proj_clip: float | None = None
    elmo_layer_norm: bool = False
    elmo_rnn_layers: int = 1
    elmo_token_dim: int = 0

    archs: ClassVar[tuple[str, ...]] = ("bilm", "elmo")

    def _splits_d_model(self) -> bool:
        return self.arch == "elmo"  # the task BiLSTM; the biLM's own LSTMs are d_model wide in each direction

    def _family_problems(self) -> list[str]:
        problems = super()._family_problems()
        if self.token_encoder not in TOKEN_ENCODERS:
            problems.append(f"token_encoder={self.token_encoder!r} is not one of {', '.join(TOKEN_ENCODERS)}")
        for name in ("d_char", "n_highway", "max_chars_per_token", "softmax_samples", "elmo_rnn_layers",
                     "elmo_token_dim"):
            value, low = getattr(self, name), 1 if name in ("d_char", "elmo_rnn_layers") else 0
            if not isinstance(value, int) or not low <= value <= MAX_SIZE["d_ff"]:
                problems.append(f"{name}={value!r} must be an integer in [{low}, {MAX_SIZE['d_ff']:,}]")
        if self.softmax_sampler not in ("log_uniform", "uniform"):
            problems.append(f"softmax_sampler={self.softmax_sampler!r} is not one of log_uniform, uniform")
        if self.input_unit not in INPUT_UNITS:
            problems.append(f"input_unit={self.input_unit!r} is not one of {', '.join(INPUT_UNITS)}")
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not 0 <= value < float("inf")):
                problems.append(f"{name}={value!r} must be a number >= 0 (bilm-tf: 3), or 0 / null for no clipping")
        if self.d_cell is not None and not 1 <= self.d_cell <= MAX_SIZE["d_ff"]:
            problems.append(f"d_cell={self.d_cell} must be in [1, {MAX_SIZE['d_ff']:,}] (None: d_model)")
        filters = self.char_filters
        if not filters or not all(isinstance(f, list | tuple) and len(f) == 2 and all(
                isinstance(x, int) and 1 <= x <= MAX_SIZE["d_ff"] for x in f) for f in filters):
            problems.append(f"char_filters={filters!r:.80} must be a non-empty list of [width, n_filters] pairs of "
                            "positive integers")
        elif isinstance(self.max_chars_per_token, int) and self.max_chars_per_token < max(3, *(w for w, _ in filters)):
            problems.append(f"max_chars_per_token={self.max_chars_per_token} must be >= 3 (begin, one character, "
                            f"end) and >= the widest char filter ({max(w for w, _ in filters)})")
        return problems


# ELMo's biLM (section 3.4 and the released options file): 2 LSTMP layers of 4096 cells projected to 512, residual
# between them; a char CNN with filters (width, count) summing to 2048, 2 highway layers, 16-dim characters, 50
# characters per token; whole words in (input_unit "word"), LSTM cells and projections clipped at 3 (bilm-tf's
# cell_clip and proj_clip). elmo-small trains on a laptop CPU in minutes.
PRESETS: dict[str, dict[str, Any]] = {
    "elmo-original": dict(arch="bilm", n_layers=2, d_model=512, d_cell=4096, dropout=0.1, rnn_cell="lstm",
                          max_seq_len=1024, token_encoder="chars", d_char=16, n_highway=2, max_chars_per_token=50,
                          char_filters=[[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                          input_unit="word", cell_clip=3.0, proj_clip=3.0),
    "elmo-small": dict(arch="bilm", n_layers=2, d_model=128, d_cell=256, dropout=0.1, rnn_cell="lstm",
                       max_seq_len=1024, token_encoder="chars", d_char=16, n_highway=1, max_chars_per_token=20,
                       char_filters=[[1, 16], [2, 32], [3, 64], [4, 64], [5, 80]], input_unit="word",
                       cell_clip=3.0, proj_clip=3.0),
}
