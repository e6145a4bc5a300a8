"""The decoder family (``arch = "decoder"``): GPT (``lmforge.models.decoder``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lmforge.config.model import ModelConfig, register_family


@register_family
@dataclass
class DecoderConfig(ModelConfig):
    """A GPT-style causal Transformer language model. ``scale_embeddings`` multiplies the token embeddings by
    sqrt(d_model) (Vaswani et al. 2017, section 3.4; GPT does not)."""

    arch: str = "decoder"
    scale_embeddings: bool = False

    archs: ClassVar[tuple[str, ...]] = ("decoder",)


# minGPT's small models and GPT-2 small (pre-LN, tanh GELU, 1024 positions)
PRESETS: dict[str, dict[str, Any]] = {
    "gpt-nano": dict(arch="decoder", n_layers=3, d_model=48, n_heads=3, norm_first=True, layer_norm_eps=1e-5,
                     activation="gelu_tanh", max_seq_len=1024),
    "gpt-micro": dict(arch="decoder", n_layers=4, d_model=128, n_heads=4, norm_first=True, layer_norm_eps=1e-5,
                      activation="gelu_tanh", max_seq_len=1024),
    "gpt-mini": dict(arch="decoder", n_layers=6, d_model=192, n_heads=6, norm_first=True, layer_norm_eps=1e-5,
                     activation="gelu_tanh", max_seq_len=1024),
    "gpt2-small": dict(arch="decoder", n_layers=12, d_model=768, n_heads=12, norm_first=True,
                       layer_norm_eps=1e-5, activation="gelu_tanh", max_seq_len=1024, vocab_size=50257),
}
