"""The encoder-decoder family (``arch = "seq2seq"``, and ``"seq2seq_encoder"``: its encoder alone under task heads):
the Transformer and BART (``lmforge.models.seq2seq``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lmforge.config.model import MAX_SIZE, ModelConfig, register_family


@register_family
@dataclass
class Seq2SeqConfig(ModelConfig):
    """A Transformer encoder-decoder: ``n_layers`` counts encoder layers and ``n_decoder_layers`` decoder layers
    (default: the same). ``share_embeddings``: the source and target share one embedding matrix (a shared
    source-target vocabulary); ``scale_embeddings``: embeddings times sqrt(d_model) (Vaswani et al. 2017, 3.4)."""

    arch: str = "seq2seq"
    n_decoder_layers: int | None = None
    share_embeddings: bool = True
    scale_embeddings: bool = False

    archs: ClassVar[tuple[str, ...]] = ("seq2seq", "seq2seq_encoder")

    def __post_init__(self) -> None:
        if self.n_decoder_layers is None and self.arch == "seq2seq":
            self.n_decoder_layers = self.n_layers
        super().__post_init__()

    @property
    def n_distinct_layers(self) -> int:
        return self.n_layers + (self.n_decoder_layers or 0)

    def _family_problems(self) -> list[str]:
        if self.n_decoder_layers is not None and not 0 <= self.n_decoder_layers <= MAX_SIZE["n_layers"]:
            return [f"n_decoder_layers={self.n_decoder_layers} must be in [0, {MAX_SIZE['n_layers']:,}]"]
        return []


# Transformer sizes follow Vaswani et al. (2017), Table 3.
PRESETS: dict[str, dict[str, Any]] = {
    "transformer-base": dict(arch="seq2seq", n_layers=6, n_decoder_layers=6, d_model=512, n_heads=8, d_ff=2048,
                             positional="sinusoidal", activation="relu", layer_norm_eps=1e-6,
                             scale_embeddings=True, max_seq_len=1024),
    "transformer-big": dict(arch="seq2seq", n_layers=6, n_decoder_layers=6, d_model=1024, n_heads=16,
                            d_ff=4096, dropout=0.3, positional="sinusoidal", activation="relu",
                            layer_norm_eps=1e-6, scale_embeddings=True, max_seq_len=1024),
    # BART (Lewis et al. 2020; objective denoise): the encoder-decoder with BERT's choices, post-LN, GELU, learned
    # positions, no embedding scaling, one embedding matrix for the source, the target and the output. bart-base is
    # the paper's base size (6 + 6 layers, d_model 768, 12 heads, d_ff 3072, 1024 positions, GPT-2's 50,265 BPE
    # tokens). Deviation: BART also layer-normalises the embeddings of both stacks (layernorm_embedding), which
    # lmforge's EncoderDecoder has no option for. bart-tiny (2 + 2 layers, d_model 128) trains on a laptop in minutes.
    "bart-tiny": dict(arch="seq2seq", n_layers=2, n_decoder_layers=2, d_model=128, n_heads=4, d_ff=512,
                      positional="learned", activation="gelu", layer_norm_eps=1e-5, max_seq_len=512),
    "bart-base": dict(arch="seq2seq", n_layers=6, n_decoder_layers=6, d_model=768, n_heads=12, d_ff=3072,
                      positional="learned", activation="gelu", layer_norm_eps=1e-5, max_seq_len=1024,
                      vocab_size=50265),
}
