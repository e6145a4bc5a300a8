"""BERT's pretraining heads: masked language model (MLM) and next-sentence prediction (NSP).

Shape legend: B batch, T sequence length, D model dim, V vocabulary size, N number of gathered (masked) positions.

``TaskModel(Encoder(cfg), BertPreTrainingHeads(cfg, encoder.get_input_embeddings().weight))`` is the BERT
pretraining model; its state-dict keys are ``backbone.*`` and ``head.{mlm.dense, mlm.norm, mlm.bias,
nsp.classifier}.*``. The MLM un-embedding is tied to the token embedding and is not a separate state-dict entry.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.nn.feedforward import ACTIVATIONS
from lmforge.nn.kernels.tied_embedding import tied_linear

__all__ = [
    "BertPreTrainingHeads",
    "MaskedLMHeads",
    "SpanBertHeads",
    "SpanBoundaryHead",
    "MaskedLMHead",
    "NextSentenceHead",
    "PreTrainingOutput",
    "build_pretraining_head",
    "gather_positions",
    "read_positions",
]


class PreTrainingOutput(NamedTuple):
    """What the pretraining heads return (a head that lacks a part gives None for it).

    Attributes:
        mlm_logits: (B, T, V), or (N, V) for the gathered positions when ``masked_positions`` was given.
        nsp_logits: (B, 2); index 0 = "B follows A" (IsNext), 1 = random sentence (NotNext), as in BERT.
        sbo_logits: (N_sbo, V) span-boundary predictions of the masked tokens that have an SBO target
            (``sbo_left >= 0``: all of them, except the pieces of a long span past the position table), in the
            order of ``masked_positions`` (SpanBERT).
        token_states: the backbone's final token states (B, T, D) the logits were computed from, for diagnostics
            (``lmforge.objectives.masked_lm``: their mean cosine, the anisotropy of a collapsed encoder); None when
            the backbone computed some rows only (``EncoderRowsOutput.read_rows``).
    """

    mlm_logits: Tensor
    nsp_logits: Tensor | None = None
    sbo_logits: Tensor | None = None
    token_states: Tensor | None = None


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head (Devlin et al. 2019, section 3.1, "Task #1: Masked LM"; the transform follows
    Google's released code): ``logits = LayerNorm(act(h W + b)) E^T + bias``.

    ``E`` is the token embedding weight (V, D), tied (Press & Wolf 2017): the same ``nn.Parameter`` object, used
    but not saved by this module — its state dict holds ``dense.*``, ``norm.*`` and ``bias`` only, and loading one
    does not ask for the tied weight. Moving or casting the whole model keeps the tie (the parameter object is
    shared); replacing the embedding's parameter object (``load_state_dict(assign=True)``) needs a new head.

    With ``tied=False`` the un-embedding is a (V, E) matrix of its own (``weight`` in the state dict, drawn from
    N(0, init_std^2)): the input embeddings then learn only from the contexts their tokens appear in. Tied, every
    softmax step moves the embedding of every token that is *not* the target towards -h, so the rare tokens, seldom
    a target, drift together (the representation degeneration of Gao et al. 2019); after a short pretraining their
    embeddings are more alike than at initialisation, which costs a topic classifier the words it needs.
    """

    weight: nn.Parameter  # the tied (V, D) token embedding, not in the state dict (tied=False: its own, saved)

    def __init__(self, embedding_weight: nn.Parameter, activation: str = "gelu", layer_norm_eps: float = 1e-12,
                 init_std: float = 0.02, d_model: int | None = None, tied: bool = True) -> None:
        """
        Args:
            embedding_weight: the (V, E) token embedding parameter to tie to (tied=False: its shape only).
            activation: name in ``lmforge.nn.feedforward.ACTIVATIONS`` (BERT: exact "gelu").
            layer_norm_eps: LayerNorm epsilon (BERT 1e-12).
            init_std: standard deviation of the dense weight's normal initialisation.
            d_model: the width D of the hidden states it reads, when it differs from E (ALBERT's factorised
                embedding: the transform maps D -> E, as ALBERT's ``predictions.dense``); None: D = E.
            tied: share ``embedding_weight`` (BERT); False: an un-embedding of its own.
        """
        super().__init__()
        if not isinstance(embedding_weight, nn.Parameter) or embedding_weight.dim() != 2:
            raise LmforgeError("MaskedLMHead needs the (vocab_size, d_model) token embedding nn.Parameter to tie "
                               "to, e.g. encoder.get_input_embeddings().weight")
        if activation not in ACTIVATIONS:
            raise LmforgeError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        V, E = embedding_weight.shape
        self.activation_name = activation
        self.activation = ACTIVATIONS[activation]
        self.dense = nn.Linear(E if d_model is None else d_model, E)
        self.norm = nn.LayerNorm(E, eps=layer_norm_eps)
        self.tied = tied
        if tied:  # registered (so .to() and parameters() see it) but kept out of state_dict
            self.weight = embedding_weight
        else:
            self.weight = nn.Parameter(torch.empty(V, E, dtype=embedding_weight.dtype))
            nn.init.normal_(self.weight, std=init_std)
        self.bias = nn.Parameter(torch.zeros(V))  # BERT's per-token output bias
        nn.init.normal_(self.dense.weight, std=init_std)
        nn.init.zeros_(self.dense.bias)
        if tied:
            self.register_state_dict_post_hook(_drop_tied_weight)
            self.register_load_state_dict_pre_hook(_supply_tied_weight)

    def forward(self, hidden: Tensor) -> Tensor:
        """
        Args:
            hidden: (..., D) hidden states, e.g. (B, T, D) or gathered (N, D).

        Returns:
            (..., V) vocabulary logits.
        """
        h = self.norm(self.activation(self.dense(hidden)))  # (..., E)
        return tied_linear(h, self.weight, self.bias)  # (..., V)

    def extra_repr(self) -> str:
        V, E = self.weight.shape
        D = self.dense.in_features
        return (f"d_model={D}, embedding_size={E}, vocab_size={V}, activation={self.activation_name!r}, "
                f"tied={self.tied}")


def _drop_tied_weight(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    state_dict.pop(prefix + "weight", None)


def _supply_tied_weight(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    # The tied weight is never saved, so a loaded state dict lacks it; point the entry at the parameter itself
    # (a no-op copy; the embedding's own entry loads the values). torch hands hooks its own copy of the dict.
    state_dict.setdefault(prefix + "weight", module.weight)


class NextSentenceHead(nn.Module):
    """BERT's next-sentence-prediction classifier (Devlin et al. 2019, section 3.1, "Task #2"): a linear map
    from the pooled [CLS] representation to two classes (0 = IsNext, 1 = NotNext)."""

    def __init__(self, d_model: int, init_std: float = 0.02) -> None:
        """
        Args:
            d_model: D.
            init_std: standard deviation of the weight's normal initialisation.
        """
        super().__init__()
        self.classifier = nn.Linear(d_model, 2)
        nn.init.normal_(self.classifier.weight, std=init_std)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, pooled: Tensor) -> Tensor:
        """
        Args:
            pooled: (B, D) pooled output.

        Returns:
            (B, 2) logits.
        """
        return self.classifier(pooled)  # (B, 2)


class BertPreTrainingHeads(nn.Module):
    """Both BERT pretraining heads over an ``EncoderOutput`` (Devlin et al. 2019, section 3.1).

    State-dict keys: ``mlm.dense.*``, ``mlm.norm.*``, ``mlm.bias``, ``nsp.classifier.*`` (the MLM un-embedding is
    tied to ``embedding_weight`` and not saved here).
    """

    def __init__(self, config: ModelConfig, embedding_weight: nn.Parameter) -> None:
        """
        Args:
            config: uses activation, layer_norm_eps, init_std, d_model (must match the embedding width).
            embedding_weight: the encoder's token embedding parameter, ``encoder.get_input_embeddings().weight``.
        """
        super().__init__()
        _check_tied(config, embedding_weight, "BertPreTrainingHeads", untied_ok=True)
        self.mlm = _mlm_head(config, embedding_weight)
        self.nsp = NextSentenceHead(config.d_model, config.init_std)

    def forward(self, encoder_output: Any, masked_positions: Tensor | None = None) -> PreTrainingOutput:
        """
        Args:
            encoder_output: an ``EncoderOutput`` (uses ``last_hidden_state`` (B, T, D) and ``pooled_output`` (B, D)).
            masked_positions: optional; either an (N, 2) integer tensor of (batch, position) pairs or a (B, T)
                bool mask. Only those hidden states go through the (expensive) vocabulary projection.

        With an output of some rows only (``EncoderRowsOutput.read_rows``, see ``rows_read``) the masked positions are
        picked among them.

        Returns:
            PreTrainingOutput(mlm_logits (B, T, V) or (N, V), nsp_logits (B, 2)).
        """
        hidden = encoder_output.last_hidden_state  # (B, T, D), or (R, D) rows
        if masked_positions is not None:
            hidden = read_positions(encoder_output, masked_positions)  # (N, D)
        return PreTrainingOutput(self.mlm(hidden), self.nsp(encoder_output.pooled_output),
                                 token_states=_token_states(encoder_output))

    @staticmethod
    def rows_read(masked_positions: Tensor | None = None, **_: Any) -> Tensor | None:
        """(B, T) bool, the positions ``forward`` reads for these inputs: the masked ones and [CLS] (the pooled
        output); None without ``masked_positions`` (every position is read). ``TaskModel`` hands it to the encoder
        as ``read_rows`` (``TaskModel.forward(rows_only=True)``)."""
        if masked_positions is None or masked_positions.dtype != torch.bool:
            return None
        rows = masked_positions.clone()
        rows[:, 0] = True
        return rows


def build_pretraining_head(config: ModelConfig, backbone: nn.Module) -> BertPreTrainingHeads:
    """The ``{"type": "pretraining"}`` builder of ``lmforge.heads.build_head``: heads tied to ``backbone``'s
    token embedding (``backbone.get_input_embeddings().weight``)."""
    get = getattr(backbone, "get_input_embeddings", None)
    if get is None:
        raise LmforgeError(f"the pretraining head ties to the backbone's token embedding, but "
                           f"{type(backbone).__name__} has no get_input_embeddings()")
    return BertPreTrainingHeads(config, get().weight)


def gather_positions(hidden: Tensor, positions: Tensor) -> Tensor:
    """Pick hidden states at given positions.

    Args:
        hidden: (B, T, D).
        positions: (N, 2) integer (batch, position) pairs, or a (B, T) bool mask (row-major order, as
            ``hidden[mask]``).

    Returns:
        (N, D).
    """
    B, T, _ = hidden.shape
    if positions.dtype == torch.bool:
        if tuple(positions.shape) != (B, T):
            raise LmforgeError(f"a bool masked_positions mask must be (batch={B}, length={T}); got "
                               f"{tuple(positions.shape)}")
        return hidden[positions]  # (N, D)
    if positions.is_floating_point() or positions.is_complex():
        raise LmforgeError(f"masked_positions must be (N, 2) integer pairs or a (B, T) bool mask; got dtype "
                           f"{positions.dtype}")
    if positions.dim() != 2 or positions.shape[1] != 2:
        raise LmforgeError(f"masked_positions must be (N, 2) (batch, position) pairs; got shape "
                           f"{tuple(positions.shape)}")
    if positions.numel():
        lo, hi = torch.aminmax(positions, dim=0)  # (2,), (2,)
        if int(lo.min()) < 0 or int(hi[0]) >= B or int(hi[1]) >= T:
            raise LmforgeError(f"masked_positions hold (batch, position) pairs up to ({int(hi[0])}, {int(hi[1])}) "
                               f"and down to ({int(lo[0])}, {int(lo[1])}); they must lie in [0, {B}) x [0, {T})")
    return hidden[positions[:, 0], positions[:, 1]]  # (N, D)


def read_positions(encoder_output: Any, positions: Tensor) -> Tensor:
    """The final states at ``positions`` ((N, 2) pairs or a (B, T) bool mask, as ``gather_positions``): gathered
    from ``last_hidden_state`` (B, T, D), or picked among its (R, D) rows when the encoder computed only the rows of
    ``encoder_output.read_rows`` (each position must be one of them).

    Returns:
        (N, D), in the order of ``positions``.
    """
    hidden = encoder_output.last_hidden_state
    read = getattr(encoder_output, "read_rows", None)
    if read is None:
        return gather_positions(hidden, positions)
    B, T = read.shape
    if positions.dtype == torch.bool:
        if tuple(positions.shape) != (B, T):
            raise LmforgeError(f"a bool masked_positions mask must be (batch={B}, length={T}); got "
                               f"{tuple(positions.shape)}")
        if positions is read:
            return hidden  # (R, D) every row
        flat = positions.reshape(-1).nonzero().squeeze(1)  # (N,)
    else:
        gather_positions(read[..., None], positions)  # checks the pairs
        flat = positions[:, 0] * T + positions[:, 1]  # (N,)
    read_flat = read.reshape(-1)
    if flat.numel() and not bool(read_flat.index_select(0, flat).all()):
        raise LmforgeError("a position to read is not among the rows the encoder computed (read_rows)")
    rank = read_flat.cumsum(0) - 1  # (B*T,) each read position's row
    return hidden.index_select(0, rank.index_select(0, flat))  # (N, D)


def _token_states(encoder_output: Any) -> Tensor | None:
    """The final states for diagnostics, or None when the encoder computed some rows only."""
    return None if getattr(encoder_output, "read_rows", None) is not None else encoder_output.last_hidden_state


def _check_tied(config: ModelConfig, embedding_weight: nn.Parameter, who: str, untied_ok: bool = False) -> None:
    if not config.tie_embeddings and not untied_ok:
        raise LmforgeError(f"{who} ties the un-embedding to the token embedding; tie_embeddings=False is not "
                           "supported there (it is for the MLM heads: objectives mlm, mlm+nsp, mlm+sop, electra)")
    E = config.d_embedding
    if embedding_weight.dim() != 2 or tuple(embedding_weight.shape) != (config.vocab_size, E):
        raise LmforgeError(f"embedding_weight has shape {tuple(embedding_weight.shape)} but the config says "
                           f"(vocab_size={config.vocab_size}, embedding width={E})")


def _mlm_head(config: ModelConfig, embedding_weight: nn.Parameter) -> MaskedLMHead:
    """The MLM head of ``config`` (its transform maps d_model to the embedding width: ALBERT's factorisation)."""
    return MaskedLMHead(embedding_weight, config.activation, config.layer_norm_eps, config.init_std,
                        d_model=config.d_model, tied=config.tie_embeddings)


class MaskedLMHeads(nn.Module):
    """The MLM head alone, for RoBERTa-style pretraining without next-sentence prediction (Liu et al., 2019).

    State-dict keys: ``mlm.dense.*``, ``mlm.norm.*``, ``mlm.bias`` (the same names as in BertPreTrainingHeads).
    """

    def __init__(self, config: ModelConfig, embedding_weight: nn.Parameter) -> None:
        super().__init__()
        _check_tied(config, embedding_weight, "MaskedLMHeads", untied_ok=True)
        self.mlm = _mlm_head(config, embedding_weight)

    def forward(self, encoder_output: Any, masked_positions: Tensor | None = None) -> PreTrainingOutput:
        hidden = encoder_output.last_hidden_state  # (B, T, D), or (R, D) rows
        if masked_positions is not None:
            hidden = read_positions(encoder_output, masked_positions)  # (N, D)
        return PreTrainingOutput(self.mlm(hidden), token_states=_token_states(encoder_output))

    @staticmethod
    def rows_read(masked_positions: Tensor | None = None, **_: Any) -> Tensor | None:
        """(B, T) bool, the positions ``forward`` reads: the masked ones (see ``BertPreTrainingHeads.rows_read``)."""
        return masked_positions if masked_positions is not None and masked_positions.dtype == torch.bool else None


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective (Joshi et al., 2020, section 3.2).

    Each token x_i of a masked span (s, e) is predicted from the encodings of the two boundary tokens
    x_{s-1}, x_{e+1} and a relative-position embedding p_{i-s+1}, through a 2-layer feed-forward network with
    GELU and layer normalisation:

        h = LayerNorm(GELU(W1 [x_{s-1}; x_{e+1}; p_{i-s+1}]))
        y = LayerNorm(GELU(W2 h))
        logits = y E^T + b       (E tied to the token embedding, as the MLM head)

    State-dict keys: ``position.weight`` (max_span_len, D), ``fc1.*``, ``norm1.*``, ``fc2.*``, ``norm2.*``,
    ``bias``.

    Spans are drawn in words (at most ``max_span_len``) but indexed here by word piece, so a span can hold more
    pieces than the table has rows. As in SpanBERT's released code (pair targets truncated to
    ``max_pair_targets`` pieces), only a span's first ``max_span_len`` pieces are SBO targets; the masking marks
    the others with ``sbo_left = -1`` (``lmforge.data.masking``) and ``SpanBertHeads`` leaves them to the MLM.
    The table keeps its size so that saved span heads (and their optimizer state) still load.
    """

    def __init__(self, config: ModelConfig, embedding_weight: nn.Parameter, max_span_len: int = 10) -> None:
        super().__init__()
        if max_span_len < 1:
            raise LmforgeError(f"max_span_len must be >= 1, got {max_span_len}")
        D, E = config.d_model, config.d_embedding  # E: the embedding width y is un-embedded by (ALBERT: E < D)
        self.max_span_len = max_span_len
        self.position = nn.Embedding(max_span_len, D)
        self.fc1 = nn.Linear(3 * D, D)
        self.norm1 = nn.LayerNorm(D, eps=config.layer_norm_eps)
        self.fc2 = nn.Linear(D, E)
        self.norm2 = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.weight = embedding_weight  # tied, not saved (the MLM head's hooks pattern)
        self.register_state_dict_post_hook(_drop_tied_weight)
        self.register_load_state_dict_pre_hook(_supply_tied_weight)
        for module in (self.position, self.fc1, self.fc2):
            nn.init.normal_(module.weight, std=config.init_std)
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, hidden: Tensor, rows: Tensor, left: Tensor, right: Tensor, offset: Tensor) -> Tensor:
        """
        Args:
            hidden: (B, T, D) encoder output.
            rows: (N,) batch index of each predicted token.
            left, right: (N,) positions of the boundary tokens just before and after its span.
            offset: (N,) 0-based position of the token inside its span (< max_span_len).

        Returns:
            (N, V) logits.
        """
        return self.from_boundaries(hidden[rows, left], hidden[rows, right], offset)

    def from_boundaries(self, left: Tensor, right: Tensor, offset: Tensor) -> Tensor:
        """``forward`` from the boundary tokens' states: ``left``, ``right`` (N, D), ``offset`` (N,); (N, V)."""
        if offset.numel() and int(offset.max()) >= self.max_span_len:
            raise LmforgeError(f"a span offset of {int(offset.max())} exceeds max_span_len={self.max_span_len} "
                               "(the rows of the SBO's position table); give such tokens sbo_left=-1 (no SBO "
                               "target), as lmforge.data.masking does")
        x = torch.cat([left, right, self.position(offset)], dim=-1)  # (N, 3D)
        h = self.norm1(F.gelu(self.fc1(x)))  # (N, D)
        y = self.norm2(F.gelu(self.fc2(h)))  # (N, E)
        return tied_linear(y, self.weight, self.bias)  # (N, V)


class SpanBertHeads(nn.Module):
    """SpanBERT's pretraining heads: MLM plus the span boundary objective (no NSP, as in the paper).

    State-dict keys: ``mlm.*`` (as BertPreTrainingHeads) and ``sbo.*`` (SpanBoundaryHead).
    """

    def __init__(self, config: ModelConfig, embedding_weight: nn.Parameter, max_span_len: int = 10) -> None:
        super().__init__()
        _check_tied(config, embedding_weight, "SpanBertHeads")
        self.mlm = _mlm_head(config, embedding_weight)
        self.sbo = SpanBoundaryHead(config, embedding_weight, max_span_len)

    def forward(self, encoder_output: Any, masked_positions: Tensor | None = None, sbo_left: Tensor | None = None,
                sbo_right: Tensor | None = None, sbo_offset: Tensor | None = None) -> PreTrainingOutput:
        """
        Args:
            encoder_output: an ``EncoderOutput``.
            masked_positions: (B, T) bool mask of the predicted tokens.
            sbo_left, sbo_right, sbo_offset: (B, T) span boundaries and offsets, read where the mask is True and
                ``sbo_left >= 0`` (a masked token with ``sbo_left = -1`` has no SBO target: a piece of a long span
                past the position table).

        Returns:
            PreTrainingOutput(mlm_logits (N, V), None, sbo_logits (N_sbo, V)), N_sbo = masked tokens with
            ``sbo_left >= 0``.
        """
        hidden = encoder_output.last_hidden_state  # (B, T, D), or (R, D) rows
        if masked_positions is None:
            return PreTrainingOutput(self.mlm(hidden))
        if masked_positions.dtype != torch.bool:
            raise LmforgeError("SpanBertHeads needs masked_positions as a (B, T) bool mask")
        mlm_logits = self.mlm(read_positions(encoder_output, masked_positions))  # (N, V)
        states = _token_states(encoder_output)
        if sbo_left is None or sbo_right is None or sbo_offset is None:
            return PreTrainingOutput(mlm_logits, token_states=states)
        sbo_mask = masked_positions & (sbo_left >= 0)  # (B, T) the tokens with an SBO target
        rows = sbo_mask.nonzero()[:, 0]  # (N_sbo,) row-major, the order of hidden[mask]
        left, right = sbo_left[sbo_mask], sbo_right[sbo_mask]  # (N_sbo,)
        sbo_logits = self.sbo.from_boundaries(read_positions(encoder_output, torch.stack([rows, left], 1)),
                                              read_positions(encoder_output, torch.stack([rows, right], 1)),
                                              sbo_offset[sbo_mask])  # (N_sbo, V)
        return PreTrainingOutput(mlm_logits, None, sbo_logits, token_states=states)

    @staticmethod
    def rows_read(masked_positions: Tensor | None = None, sbo_left: Tensor | None = None,
                  sbo_right: Tensor | None = None, **_: Any) -> Tensor | None:
        """(B, T) bool, the positions ``forward`` reads: the masked ones and the boundaries of the spans with an
        SBO target (see ``BertPreTrainingHeads.rows_read``)."""
        if masked_positions is None or masked_positions.dtype != torch.bool:
            return None
        rows = masked_positions.clone()
        if sbo_left is not None and sbo_right is not None:
            sbo_mask = masked_positions & (sbo_left >= 0)  # (B, T)
            batch = sbo_mask.nonzero()[:, 0]  # (N_sbo,)
            rows[batch, sbo_left[sbo_mask]] = True
            rows[batch, sbo_right[sbo_mask]] = True
        return rows


def _embedding_of(backbone: nn.Module) -> nn.Parameter:
    get = getattr(backbone, "get_input_embeddings", None)
    if get is None:
        raise LmforgeError(f"pretraining heads tie to the backbone's token embedding, but "
                           f"{type(backbone).__name__} has no get_input_embeddings()")
    return get().weight


def build_mlm_head(config: ModelConfig, backbone: nn.Module) -> MaskedLMHeads:
    """The ``{"type": "mlm"}`` builder (RoBERTa-style MLM only)."""
    return MaskedLMHeads(config, _embedding_of(backbone))


def build_span_head(config: ModelConfig, backbone: nn.Module, max_span_len: int = 10) -> SpanBertHeads:
    """The ``{"type": "span", "max_span_len": 10}`` builder (SpanBERT)."""
    return SpanBertHeads(config, _embedding_of(backbone), max_span_len)
