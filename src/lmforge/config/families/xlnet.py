"""The XLNet family (``arch = "xlnet"``): XLNet's permutation language model and Transformer-XL
(``lmforge.models.xlnet``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lmforge.choices import XLNET_ATTN_TYPES
from lmforge.config.model import MAX_SIZE, ModelConfig, register_family


@register_family
@dataclass
class XLNetConfig(ModelConfig):
    """XLNet (Yang et al. 2019) on Transformer-XL (Dai et al. 2019).

    ``attn_type``: "bi" (permutation masks decide who sees whom) or "uni" (causal, Transformer-XL); ``mem_len``: the
    states each layer keeps as memory for the next segment (None: all of them); ``clamp_len``: relative distances
    beyond it use its encoding (None: no clamping); ``same_length`` ("uni" only): every query sees the same number
    of keys; ``lm_stream``: the stream whose states predict the next token in generation, "query" (XLNet's PLM
    trains it) or "content" (Transformer-XL's causal LM, objective txl). ``norm_first`` (shared): pre-LN layers and a
    final LayerNorm on both streams (the paper's and Hugging Face's XLNet are post-LN). ``tie_embeddings=false``
    (shared): an LM head of its own, ``lm_head.weight``; ``bias=false`` (shared): no feed-forward biases (the
    relative attention has no projection biases anyway); both are lmforge's, the Hugging Face export refuses them.
    """

    arch: str = "xlnet"
    attn_type: str = "bi"
    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool = False
    lm_stream: str = "query"

    archs: ClassVar[tuple[str, ...]] = ("xlnet",)

    def _family_problems(self) -> list[str]:
        problems = []
        if self.attn_type not in XLNET_ATTN_TYPES:
            problems.append(f"attn_type={self.attn_type!r} is not one of {', '.join(XLNET_ATTN_TYPES)}")
        limit = MAX_SIZE["max_seq_len"]
        for name, what in (("mem_len", "None keeps every state"), ("clamp_len", "None: no clamping")):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 1 <= value <= limit):
                problems.append(f"{name}={value!r} must be an integer in [1, {limit:,}] or None ({what})")
        if self.lm_stream not in ("query", "content"):
            problems.append(f"lm_stream={self.lm_stream!r} is not one of query, content")
        if self.same_length and self.attn_type != "uni":
            problems.append("same_length=true shapes the causal mask of attn_type='uni'; with attn_type="
                            f"{self.attn_type!r} it would do nothing: unset it")
        if self.ffn != "mlp":
            # XLNet's own feed-forward has no gated variant yet: refused rather than silently ignored (bias=false, no
            # feed-forward biases, and norm_first, pre-LN, it has; its relative attention has no projection biases)
            problems.append(f"ffn={self.ffn!r}: XLNet's layers have no gated variant yet; keep ffn='mlp'")
        if isinstance(self.d_model, int) and self.d_model % 2:
            problems.append(f"XLNet's relative position encodings pair sines and cosines: d_model={self.d_model} "
                            "must be even")
        return problems


PRESETS: dict[str, dict[str, Any]] = {
    # XLNet (the released xlnet-*-cased configs: 32k SentencePiece vocabulary, d_inner 4 D, GELU, dropout 0.1,
    # attn_type "bi", no clamping); xlnet-tiny trains on a laptop
    "xlnet-tiny": dict(arch="xlnet", n_layers=4, d_model=128, n_heads=4, d_ff=512, vocab_size=32000,
                       max_seq_len=512, pad_token_id=5),
    "xlnet-base": dict(arch="xlnet", n_layers=12, d_model=768, n_heads=12, d_ff=3072, vocab_size=32000,
                       max_seq_len=512, pad_token_id=5),
    "xlnet-large": dict(arch="xlnet", n_layers=24, d_model=1024, n_heads=16, d_ff=4096, vocab_size=32000,
                        max_seq_len=512, pad_token_id=5),
    # Transformer-XL language models (Dai et al. 2019; objective txl): causal attention (attn_type "uni"), relative
    # positions, a memory of mem_len states per layer, ReLU feed-forward as the original code, no same_length in
    # training. transformer-xl-base has the sizes of their WikiText-103 base model (16 layers, d_model 410, 10 heads,
    # d_inner 2100, segment and memory 150, dropout 0.1, no attention dropout) with a full tied softmax in place of the
    # adaptive one; transformer-xl-tiny trains on a laptop
    "transformer-xl-tiny": dict(arch="xlnet", n_layers=4, d_model=128, n_heads=4, d_ff=512, vocab_size=32000,
                                max_seq_len=512, attn_type="uni", mem_len=64, same_length=False, activation="relu",
                                lm_stream="content"),
    "transformer-xl-base": dict(arch="xlnet", n_layers=16, d_model=410, n_heads=10, d_ff=2100, vocab_size=32000,
                                max_seq_len=512, attn_type="uni", mem_len=150, same_length=False, activation="relu",
                                dropout=0.1, attention_dropout=0.0, lm_stream="content"),
}

# The small-budget shapes (issue 36; as the encoder family's *-budget presets): pre-LN with a final LayerNorm on both
# streams and an LM un-embedding of its own
PRESETS.update({
    "xlnet-tiny-budget": {**PRESETS["xlnet-tiny"], "norm_first": True, "tie_embeddings": False},
    "transformer-xl-tiny-budget": {**PRESETS["transformer-xl-tiny"], "norm_first": True, "tie_embeddings": False},
})
