"""The encoder family (``arch = "encoder"``): BERT, and the options that make it ALBERT, DistilBERT or ELECTRA's
discriminator (``lmforge.models.encoder``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lmforge.choices import HF_ENCODER_LAYOUTS, LAYER_SHARINGS
from lmforge.config.model import MAX_SIZE, ModelConfig, register_family


@register_family
@dataclass
class EncoderConfig(ModelConfig):
    """A BERT-style encoder.

    ALBERT (Lan et al. 2020): ``embedding_size`` E < d_model factorises the token embedding into (V, E) and a
    projection E -> d_model (None: E = d_model, BERT); ``share_layers`` ties the layers' weights (LAYER_SHARINGS).
    DistilBERT (Sanh et al. 2019): ``pooler=False`` drops the pooler (``pooled_output`` is then the raw h_[CLS]), and
    ``type_vocab_size=0`` drops the segment embedding (``token_type_ids`` are then ignored).
    ELECTRA (Clark et al. 2020; objective electra, ``lmforge.heads.electra``): ``generator_size`` is the generator's
    width as a fraction of this model's (d_model, n_heads and d_ff each scaled; same depth; embeddings shared with
    this model, the discriminator); None: 1/4. Only pretraining reads it.
    ``hf_layout``: the Hugging Face family ``lmforge convert --to-hf`` writes this encoder as (``HF_ENCODER_LAYOUTS``;
    an imported RoBERTa records "roberta", so that it goes back as one); None: the family its options imply.
    """

    arch: str = "encoder"
    type_vocab_size: int = 2
    embedding_size: int | None = None
    share_layers: str = "none"
    pooler: bool = True
    generator_size: float | None = None
    hf_layout: str | None = None

    archs: ClassVar[tuple[str, ...]] = ("encoder",)

    @property
    def d_embedding(self) -> int:
        """The token embedding's width: ``embedding_size`` (ALBERT's E) or ``d_model``."""
        return self.d_model if self.embedding_size is None else self.embedding_size

    @property
    def n_distinct_layers(self) -> int:
        return 1 if self.share_layers == "all" else self.n_layers

    def _family_problems(self) -> list[str]:
        problems = []
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            problems.append(f"type_vocab_size={self.type_vocab_size!r} must be an integer >= 0 (0: no segment "
                            "embedding)")
        if self.share_layers not in LAYER_SHARINGS:
            problems.append(f"share_layers={self.share_layers!r} is not one of {', '.join(LAYER_SHARINGS)}")
        E = self.embedding_size
        if E is not None and (not isinstance(E, int) or not 1 <= E <= MAX_SIZE["d_model"]):
            problems.append(f"embedding_size={E!r} must be an integer in [1, {MAX_SIZE['d_model']:,}] (None: d_model)")
        g = self.generator_size
        if g is not None and (isinstance(g, bool) or not isinstance(g, int | float) or not 0.0 < g <= 1.0):
            problems.append(f"generator_size={g!r} must be a fraction in (0, 1] of the discriminator's width (ELECTRA: "
                            "1/4 for small, 1/3 for base), or unset for 1/4")  # the comparison also refuses NaN
        if self.hf_layout is not None and self.hf_layout not in HF_ENCODER_LAYOUTS:
            problems.append(f"hf_layout={self.hf_layout!r} is not one of {', '.join(HF_ENCODER_LAYOUTS)} (or unset: "
                            "the family the options imply)")
        return problems


# BERT sizes are those of Google's released BERTs (L, H, A).
PRESETS: dict[str, dict[str, Any]] = {
    "bert-tiny": dict(arch="encoder", n_layers=2, d_model=128, n_heads=2),
    "bert-mini": dict(arch="encoder", n_layers=4, d_model=256, n_heads=4),
    "bert-small": dict(arch="encoder", n_layers=4, d_model=512, n_heads=8),
    "bert-medium": dict(arch="encoder", n_layers=8, d_model=512, n_heads=8),
    "bert-base": dict(arch="encoder", n_layers=12, d_model=768, n_heads=12),
    "bert-large": dict(arch="encoder", n_layers=24, d_model=1024, n_heads=16),
    # ALBERT (Lan et al. 2020, Table 1; the v2 configs: no dropout, tanh-approximated GELU, 30k vocabulary):
    # factorised embeddings of size E = 128 and every layer sharing one set of weights. albert-mini is bert-mini's
    # shape made the same way (with dropout, for small corpora), to train here.
    "albert-mini": dict(arch="encoder", n_layers=4, d_model=256, n_heads=4, embedding_size=128, share_layers="all",
                        activation="gelu_tanh"),
    "albert-base": dict(arch="encoder", n_layers=12, d_model=768, n_heads=12, embedding_size=128,
                        share_layers="all", activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
                        vocab_size=30000),
    "albert-large": dict(arch="encoder", n_layers=24, d_model=1024, n_heads=16, embedding_size=128,
                         share_layers="all", activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
                         vocab_size=30000),
    "albert-xlarge": dict(arch="encoder", n_layers=24, d_model=2048, n_heads=16, embedding_size=128,
                          share_layers="all", activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
                          vocab_size=30000),
    "albert-xxlarge": dict(arch="encoder", n_layers=12, d_model=4096, n_heads=64, embedding_size=128,
                           share_layers="all", activation="gelu_tanh", dropout=0.0, attention_dropout=0.0,
                           vocab_size=30000),
    # DistilBERT (Sanh et al. 2019): BERT-base halved in depth, no segment embedding, no pooler
    "distilbert-base": dict(arch="encoder", n_layers=6, d_model=768, n_heads=12, type_vocab_size=0, pooler=False),
    # ELECTRA discriminators (Clark et al. 2020, Table 6; objective electra): post-LN BERT encoders without a pooler;
    # generator_size scales the generator's d_model, n_heads and d_ff (small: 1/4 -> 64 wide, 1 head, d_ff 256; base:
    # 1/3 -> 256, 4 heads, 1024). electra-small factorises the embedding (E = 128 < d_model 256); in electra-base
    # E = d_model = 768 and only the generator projects it (768 -> 256). electra-tiny trains on a laptop in minutes.
    "electra-tiny": dict(arch="encoder", n_layers=2, d_model=128, n_heads=2, d_ff=512, embedding_size=64,
                         pooler=False, generator_size=0.25),
    "electra-small": dict(arch="encoder", n_layers=12, d_model=256, n_heads=4, d_ff=1024, embedding_size=128,
                          pooler=False, generator_size=0.25),
    "electra-base": dict(arch="encoder", n_layers=12, d_model=768, n_heads=12, d_ff=3072, pooler=False,
                         generator_size=1 / 3),
}

# The small-budget shapes (issue 36; configs/*-small-budget.toml are their recipes): the same sizes, pre-LN with a
# final LayerNorm (norm_first), an MLM un-embedding of its own (tie_embeddings=false: a tied softmax drags the
# embeddings of rare tokens together in a short pretraining, Gao et al. 2019) and rotary positions (Su et al. 2021:
# attention by relative position from the first step; a learned position table must first be learned, and held
# MLM on a plateau, held-out accuracy 0.13 after 3 minutes against 0.22 with rotary). Measured one change at a time
# on a dev split of BBC's training articles (BENCHMARKS.md, "Issue 36"); bias-free gated layers (Cramming) did not
# pay at a few CPU-minutes and are left out. Fine-tune them with --task.pooling mean.
SMALL_BUDGET = dict(norm_first=True, tie_embeddings=False, positional="rotary")
PRESETS.update({
    "bert-mini-budget": {**PRESETS["bert-mini"], **SMALL_BUDGET},
    "albert-mini-budget": {**PRESETS["albert-mini"], **SMALL_BUDGET},
    # ELECTRA-Small cut to bert-mini's depth (4 layers of 256, 128-wide factorised embedding, a generator 1/4 wide)
    "electra-mini-budget": {**PRESETS["electra-small"], "n_layers": 4, **SMALL_BUDGET},
})
