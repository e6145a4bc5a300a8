"""Model-agnostic Transformer building blocks: masks, attention, positions, feed-forward, layers, input checks.

Flat keyword arguments only (never a config object). Mask conventions: see ``lmforge.nn.masks``.
"""

from lmforge.nn.attention import KERNELS, MultiHeadAttention, attention_weights, math_attention, sdpa_attention
from lmforge.nn.crf import LinearChainCRF
from lmforge.nn.feedforward import ACTIVATIONS, FeedForward, gelu_sigmoid
from lmforge.nn.generic_attention import Attention
from lmforge.nn.inputs import check_flag, check_id_range, check_input_ids, check_integer_tensor, select_layers
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.layers import DecoderLayer, EncoderLayer, LayerCache, LayerOutput, StackCache
from lmforge.nn.masks import (
    combine_masks,
    guard_empty_rows,
    key_padding_mask,
    make_causal_mask,
    padding_to_key_mask,
    positions_from_mask,
    to_additive_mask,
)
from lmforge.nn.positional import LearnedPositional, Positions, RotaryEmbedding, SinusoidalPositional, build_positional
from lmforge.nn.reinforce import RewardBaseline, SampledAlignments, reinforce_loss
from lmforge.nn.relative import (
    RelativeAttentionOutput,
    RelativeMultiHeadAttention,
    rel_shift,
    relative_positions_encoding,
)
from lmforge.nn.rnn import AttentionPooling, RNNOutput, StackedRNN, compact_padding, make_rnn, make_state_score
from lmforge.nn.scores import (
    SCORES,
    AdditiveScore,
    AttentionOutput,
    CosineScore,
    DotScore,
    GeneralScore,
    LocationScore,
    ScaledDotScore,
    make_score,
    masked_softmax,
)
from lmforge.nn.stack import StackOutput, run_layers

__all__ = [
    "ACTIVATIONS",
    "KERNELS",
    "SCORES",
    "AdditiveScore",
    "Attention",
    "AttentionOutput",
    "CosineScore",
    "DecoderLayer",
    "DotScore",
    "EncoderLayer",
    "FeedForward",
    "GeneralScore",
    "KVCache",
    "LayerCache",
    "LayerOutput",
    "LearnedPositional",
    "LocationScore",
    "MultiHeadAttention",
    "Positions",
    "RewardBaseline",
    "RotaryEmbedding",
    "SampledAlignments",
    "ScaledDotScore",
    "SinusoidalPositional",
    "StackCache",
    "attention_weights",
    "build_positional",
    "check_flag",
    "check_id_range",
    "check_input_ids",
    "check_integer_tensor",
    "combine_masks",
    "gelu_sigmoid",
    "guard_empty_rows",
    "key_padding_mask",
    "make_causal_mask",
    "make_score",
    "masked_softmax",
    "math_attention",
    "padding_to_key_mask",
    "positions_from_mask",
    "reinforce_loss",
    "sdpa_attention",
    "select_layers",
    "to_additive_mask",
    "AttentionPooling",
    "LinearChainCRF",
    "RNNOutput",
    "StackedRNN",
    "compact_padding",
    "make_rnn",
    "make_state_score",
    "RelativeAttentionOutput",
    "RelativeMultiHeadAttention",
    "rel_shift",
    "relative_positions_encoding",
    "StackOutput",
    "run_layers",
]
