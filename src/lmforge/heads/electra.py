"""ELECTRA's pretraining heads: replaced-token detection by a discriminator, fed by a small MLM generator.

Clark, Luong, Le & Manning (2020), "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators"
(ICLR), section 2. Shape legend: B batch, T sequence length, D the discriminator's width, D_g the generator's width,
E the shared embedding width, V vocabulary size, N number of masked positions.

    masked input x^masked (B, T) ─► generator (a small Encoder)           (B, T, D_g)
                                 ─► MLM head at the N masked positions    (N, V) = p_G(x_t | x^masked)
                                 ─► sample x̂_t ~ p_G, no gradient        (N,)
    x^corrupt = x with x̂_t at the masked positions                       (B, T)
                                 ─► discriminator (the backbone)          (B, T, D)
                                 ─► RTD head: w^T act(W h_t + b) + c      (B, T) logits of "replaced"

A position is labelled "replaced" only where the sample differs from the original token: a generator that samples
the original produces an "original" label there (section 2). The sampling is a discrete draw, so the discriminator's
loss sends no gradient into the generator's layers or head (the paper trains the generator by maximum likelihood
only, not adversarially); it does reach the shared embeddings, which both models read.

Sharing (section 3.2, "Weight sharing"): the generator reads the discriminator's embedding block: the token, position
and segment tables and their LayerNorm are the same modules (the paper shares the token and position embeddings; the
segment table and the LayerNorm go with them here, so that the generator's input is exactly the discriminator's
embedding output), each model then projecting E to its own width when it differs (``EncoderEmbeddings.projection``).
The generator's MLM un-embedding is tied to the shared token table.

Modules:

- ``ElectraPreTrainingHeads`` (head type ``"electra"``): the generator, its MLM head and the discriminator's RTD head.
  It drives the backbone (``drives_backbone``): ``TaskModel`` hands it the discriminator, which it calls on the
  corrupted input it made, so one ``model(...)`` call runs the whole step (as the Trainer and DDP need). State-dict
  keys: ``generator.*`` (an ``Encoder``; its ``embeddings.{tokens,positions,segments,norm}`` alias the backbone's),
  ``mlm.{dense,norm,bias}``, ``rtd.{dense,prediction}.*``. A saved run's backbone is the discriminator, so
  ``load_backbone`` (fine-tuning, ``lmforge embed``) reads it as any encoder.
- ``ReplacedTokenDetectionHeads`` (head type ``"rtd"``): the RTD head alone over a backbone's states (Hugging Face's
  ``ElectraForPreTraining``), keys ``rtd.{dense,prediction}.*``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads.pretraining import MaskedLMHead, _check_tied
from lmforge.models.encoder import Encoder
from lmforge.nn.feedforward import ACTIVATIONS

__all__ = [
    "DEFAULT_GENERATOR_SIZE",
    "ElectraOutput",
    "ElectraPreTrainingHeads",
    "ReplacedTokenDetectionHead",
    "ReplacedTokenDetectionHeads",
    "build_electra_head",
    "build_rtd_head",
    "generator_config",
    "sample_replacements",
]

IGNORE = -100
DEFAULT_GENERATOR_SIZE = 0.25  # ModelConfig.generator_size None: the paper's small-model value (Table 6)
# the embedding modules the generator takes from the discriminator (see the module docstring)
SHARED_EMBEDDINGS = ("tokens", "positions", "segments", "norm")


class ElectraOutput(NamedTuple):
    """What the ELECTRA heads return (the ``"rtd"`` head fills ``rtd_logits`` only).

    Attributes:
        rtd_logits: (B, T) the discriminator's logit of "this token was replaced", at every position (padding
            included: the loss masks it).
        mlm_logits: (N, V) the generator's logits at the masked positions, in row-major order of the mask.
        replaced: (B, T) bool, True where the corrupted input differs from the original (the RTD labels).
        corrupted_ids: (B, T) the discriminator's input: the original ids with the generator's samples at the masked
            positions.
    """

    rtd_logits: Tensor
    mlm_logits: Tensor | None = None
    replaced: Tensor | None = None
    corrupted_ids: Tensor | None = None


def generator_config(config: ModelConfig, size: float | None = None) -> ModelConfig:
    """The generator's config: the discriminator's, with d_model, n_heads and d_ff scaled by ``size``.

    Clark et al. (2020), Table 6: the generator's "hidden-size, FFN-size and num-attention-heads" are a fraction of the
    discriminator's (1/4 for ELECTRA-Small, 1/3 for Base), with the same depth. Each size is rounded and at least 1;
    the embedding width stays the discriminator's E (the tables are shared), so a generator narrower than E projects
    E -> D_g. The generator has no pooler (nothing reads it).

    Args:
        config: the discriminator's encoder config.
        size: the fraction; None reads ``config.generator_size`` (None there too: 1/4).

    Raises:
        LmforgeError: the scaled width is not divisible by the scaled head count (names both and the fix).
    """
    g = size if size is not None else config.generator_size if config.generator_size is not None \
        else DEFAULT_GENERATOR_SIZE
    d_model = max(1, round(config.d_model * g))
    n_heads = max(1, round(config.n_heads * g))
    if d_model % n_heads:
        raise LmforgeError(f"generator_size={g:g} gives a generator of d_model={d_model} (of {config.d_model}) and "
                           f"n_heads={n_heads} (of {config.n_heads}), which does not divide it; choose a "
                           "generator_size that keeps d_model divisible by n_heads (e.g. 1/4, 1/3 or 1/2)")
    return dataclasses.replace(config, d_model=d_model, n_heads=n_heads, d_ff=max(1, round(config.d_ff * g)),
                               embedding_size=config.d_embedding, pooler=False, generator_size=None)


def sample_replacements(logits: Tensor, temperature: float | Tensor = 1.0) -> Tensor:
    """One token per row drawn from softmax(logits / temperature) (1: the paper's sampling), without gradient.

    Uses the global torch generator, like dropout: the Trainer's checkpoints carry its state, so a resumed run draws
    the same samples.

    Args:
        logits: (N, V).
        temperature: tau > 0, a float or a 0-d tensor (the objective's schedule passes a tensor, which a compiled
            module does not specialise on); above 1 flattens the distribution (``ElectraLoss.temperature``).

    Returns:
        (N,) int64 token ids.
    """
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=logits.device)
    with torch.no_grad():
        scaled = logits.detach().float()  # (N, V) fp32 even under bf16 autocast
        if isinstance(temperature, Tensor) or temperature != 1.0:
            scaled = scaled / temperature
        probs = F.softmax(scaled, dim=-1)  # (N, V)
        return torch.multinomial(probs, 1).squeeze(-1)  # (N,)


class ReplacedTokenDetectionHead(nn.Module):
    """ELECTRA's discriminator output (Clark et al. 2020, section 2: D(x, t) = sigmoid(w^T h_D(x)_t)), with the
    released model's hidden transform: ``logit_t = w^T act(W h_t + b) + c``.

    State-dict keys: ``dense.*`` (D -> D), ``prediction.*`` (D -> 1).
    """

    def __init__(self, d_model: int, activation: str = "gelu", init_std: float = 0.02) -> None:
        """
        Args:
            d_model: D.
            activation: name in ``lmforge.nn.feedforward.ACTIVATIONS`` (ELECTRA: the model's hidden_act, GELU).
            init_std: standard deviation of the weights' normal initialisation.
        """
        super().__init__()
        if activation not in ACTIVATIONS:
            raise LmforgeError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        self.activation_name = activation
        self.activation = ACTIVATIONS[activation]
        self.dense = nn.Linear(d_model, d_model)
        self.prediction = nn.Linear(d_model, 1)
        for layer in (self.dense, self.prediction):
            nn.init.normal_(layer.weight, std=init_std)
            nn.init.zeros_(layer.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        """
        Args:
            hidden: (..., D) hidden states, e.g. (B, T, D).

        Returns:
            (...) logits of "replaced", e.g. (B, T).
        """
        return self.prediction(self.activation(self.dense(hidden))).squeeze(-1)  # (..., 1) -> (...)


class ReplacedTokenDetectionHeads(nn.Module):
    """The RTD head over an ``EncoderOutput`` (head type ``"rtd"``; Hugging Face's ``ElectraForPreTraining``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.rtd = ReplacedTokenDetectionHead(config.d_model, config.activation, config.init_std)

    def forward(self, encoder_output: Any) -> ElectraOutput:
        """``ElectraOutput(rtd_logits (B, T))`` from ``encoder_output.last_hidden_state`` (B, T, D)."""
        return ElectraOutput(self.rtd(encoder_output.last_hidden_state))


class ElectraPreTrainingHeads(nn.Module):
    """ELECTRA's generator and its MLM head, and the discriminator's RTD head (Clark et al. 2020, section 2).

    The backbone of the ``TaskModel`` is the discriminator; this head holds everything else and, being handed the
    backbone (``drives_backbone``), runs generator -> sampling -> discriminator in one forward pass. See the module
    docstring for the algorithm, the sharing and the state-dict keys.
    """

    drives_backbone = True  # TaskModel calls forward(backbone, input_ids, ...) instead of forward(backbone(...))

    def __init__(self, config: ModelConfig, discriminator: nn.Module) -> None:
        """
        Args:
            config: the discriminator's encoder config (``generator_size`` sizes the generator).
            discriminator: the backbone ``Encoder``, whose embedding block the generator shares.
        """
        super().__init__()
        embeddings = getattr(discriminator, "embeddings", None)
        if not all(hasattr(embeddings, name) for name in SHARED_EMBEDDINGS):
            raise LmforgeError(f"ELECTRA's generator shares the discriminator's embeddings, but "
                               f"{type(discriminator).__name__} is not an lmforge Encoder; use an encoder preset "
                               "(e.g. electra-small)")
        tokens = embeddings.tokens.weight
        _check_tied(config, tokens, "ElectraPreTrainingHeads", untied_ok=True)
        gen_config = generator_config(config)
        self.generator = Encoder(gen_config)
        for name in SHARED_EMBEDDINGS:  # the same modules: one set of parameters, two names in the state dict
            setattr(self.generator.embeddings, name, getattr(embeddings, name))
        self.mlm = MaskedLMHead(tokens, config.activation, config.layer_norm_eps, config.init_std,
                                d_model=gen_config.d_model, tied=config.tie_embeddings)
        self.rtd = ReplacedTokenDetectionHead(config.d_model, config.activation, config.init_std)

    def forward(self, discriminator: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, *, mlm_labels: Tensor,
                temperature: float | Tensor = 1.0) -> ElectraOutput:
        """One ELECTRA forward pass.

        Args:
            discriminator: the backbone (called on the corrupted input).
            input_ids: (B, T) the masked input (``lmforge.data.masking``: [MASK], random or kept tokens at the
                predicted positions).
            attention_mask: (B, T) 1 = real token, 0 = padding.
            token_type_ids: (B, T) segment ids, or None.
            mlm_labels: (B, T) the original id at the masked positions, -100 elsewhere.
            temperature: the generator's sampling temperature, a float or a 0-d tensor (1: the paper's;
                ``ElectraLoss.temperature``).

        Returns:
            ElectraOutput(rtd_logits (B, T), mlm_logits (N, V), replaced (B, T) bool, corrupted_ids (B, T)).
        """
        selected = mlm_labels != IGNORE  # (B, T) the masked positions
        # only the masked positions are read: the generator's last layer computes them alone (Encoder read_rows)
        hidden = self.generator(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                read_rows=selected).last_hidden_state  # (N, D_g), row-major order of the mask
        mlm_logits = self.mlm(hidden)  # (N, V)
        sampled = sample_replacements(mlm_logits, temperature)  # (N,) no gradient: a discrete draw
        original = torch.where(selected, mlm_labels, input_ids)  # (B, T) the uncorrupted text
        corrupted = original.masked_scatter(selected, sampled)  # (B, T) samples in row-major order of the mask
        replaced = corrupted != original  # (B, T) a sampled original counts as original
        out = discriminator(corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return ElectraOutput(self.rtd(out.last_hidden_state), mlm_logits, replaced, corrupted)  # rtd: (B, T)


def build_electra_head(config: ModelConfig, backbone: nn.Module) -> ElectraPreTrainingHeads:
    """The ``{"type": "electra"}`` builder: the generator (sized by ``config.generator_size``) and both heads."""
    return ElectraPreTrainingHeads(config, backbone)


def build_rtd_head(config: ModelConfig, backbone: nn.Module) -> ReplacedTokenDetectionHeads:
    """The ``{"type": "rtd"}`` builder: the discriminator's replaced-token-detection head alone."""
    return ReplacedTokenDetectionHeads(config)
