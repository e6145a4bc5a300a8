"""Tiny models for the generation tests: float64 Transformers, a fake RNN encoder-decoder following the
``RNNSeq2Seq`` contract, and a Markov-chain adapter with hand-set log-probabilities."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.generation import ModelAdapter
from lmforge.generation.search import length_normalizer
from lmforge.models.decoder import Decoder
from lmforge.models.seq2seq import EncoderDecoder

V, D, H, F = 29, 12, 3, 37
EOS, BOS = 3, 2


def _randomise(model: nn.Module, seed: int) -> nn.Module:
    # Large weights give peaked, varied next-token distributions (random small weights give near-uniform ones,
    # where argmax ties and near-ties would make the equality tests fragile).
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.copy_(1.0 + 0.1 * noise if "norm" in name and name.endswith("weight") else 0.4 * noise)
    return model


def decoder(seed: int = 0, **overrides) -> Decoder:
    values = dict(arch="decoder", vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=F, max_seq_len=24,
                  norm_first=True, layer_norm_eps=1e-5, activation="gelu_tanh")
    values.update(overrides)
    return _randomise(Decoder(ModelConfig(**values)).double().eval(), seed)


def encoder_decoder(seed: int = 0, **overrides) -> EncoderDecoder:
    values = dict(arch="seq2seq", vocab_size=V, d_model=D, n_heads=H, n_layers=2, n_decoder_layers=2, d_ff=F,
                  max_seq_len=24, positional="sinusoidal", activation="relu")
    values.update(overrides)
    return _randomise(EncoderDecoder(ModelConfig(**values)).double().eval(), seed)


def random_ids(seed: int, *shape: int, low: int = 4) -> Tensor:
    """Ids avoiding the special ids below ``low`` (so prompts hold no EOS)."""
    return torch.randint(low, V, shape, generator=torch.Generator().manual_seed(seed))


def padded_batch(seed: int, lengths: list[int], side: str = "left") -> tuple[Tensor, Tensor]:
    """Random rows of the given lengths padded to the longest; the padding ids are random too (they must not
    matter)."""
    width = max(lengths)
    ids = random_ids(seed, len(lengths), width, low=0)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        if side == "left":
            mask[row, width - n:] = 1
        else:
            mask[row, :n] = 1
    real = random_ids(seed + 1, len(lengths), width)
    return torch.where(mask.bool(), real, ids), mask


def unpadded(ids: Tensor, mask: Tensor, row: int) -> Tensor:
    """(1, n) the real tokens of one row."""
    return ids[row][mask[row].bool()][None]


# ------------------------------------------------------------------------------------- fake RNN encoder-decoder
@dataclass
class FakeRNNState:
    hidden: Tensor  # (B, D)
    feed: Tensor  # (B, D) input-feeding vector
    memory: Tensor  # (B, S, D)
    mask: Tensor | None  # (B, S)


class FakeRNNSeq2Seq(nn.Module):
    """Follows the ``RNNSeq2Seq`` generation contract: a GRU decoder with dot attention and input feeding over a
    bag-of-embeddings memory (padding-invariant by construction)."""

    def __init__(self, seed: int = 0, vocab_size: int = V, d: int = D) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab_size, d)
        self.cell = nn.GRUCell(2 * d, d)
        self.combine = nn.Linear(2 * d, d)
        self.out = nn.Linear(d, vocab_size)
        self.double()
        _randomise(self, seed)
        self.eval()

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> FakeRNNState:
        memory = torch.tanh(self.embed(src_ids))  # (B, S, D)
        keep = torch.ones_like(src_ids) if src_mask is None else src_mask
        summary = (memory * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)  # (B, D)
        return FakeRNNState(summary, torch.zeros_like(summary), memory, src_mask)

    def decode_step(self, prev_ids: Tensor, state: FakeRNNState) -> tuple[Tensor, FakeRNNState]:
        x = torch.cat((self.embed(prev_ids), state.feed), dim=-1)  # (B, 2D)
        hidden = self.cell(x, state.hidden)  # (B, D)
        scores = (state.memory @ hidden[:, :, None]).squeeze(-1)  # (B, S)
        if state.mask is not None:
            scores = scores.masked_fill(state.mask == 0, float("-inf"))
        context = (scores.softmax(-1)[:, :, None] * state.memory).sum(1)  # (B, D)
        feed = torch.tanh(self.combine(torch.cat((hidden, context), dim=-1)))
        return self.out(feed), FakeRNNState(hidden, feed, state.memory, state.mask)

    def reorder_state(self, state: FakeRNNState, index: Tensor) -> FakeRNNState:
        return FakeRNNState(state.hidden[index], state.feed[index], state.memory[index],
                            None if state.mask is None else state.mask[index])


# ---------------------------------------------------------------------------------------------- Markov chain
class MarkovAdapter(ModelAdapter):
    """A first-order Markov chain over tokens: ``first`` (V,) log-probabilities of the first new token,
    ``table`` (V, V) of the next token given the previous. ``input_ids`` are ignored but their batch size. Counts
    its steps."""

    def __init__(self, first: Tensor, table: Tensor) -> None:
        self.first, self.table = first.double(), table.double()
        self.steps = 0

    def start(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Tensor]:
        B = input_ids.shape[0]
        return self.first.expand(B, -1).clone(), torch.full((B,), -1)

    def step(self, state: Tensor, next_ids: Tensor) -> tuple[Tensor, Tensor]:
        self.steps += 1
        return self.table[next_ids].clone(), next_ids

    def reorder(self, state: Tensor, index: Tensor) -> Tensor:
        return state[index]

    def log_prob(self, tokens: list[int]) -> float:
        total = float(self.first[tokens[0]])
        for a, b in itertools.pairwise(tokens):
            total += float(self.table[a, b])
        return total


def random_markov(seed: int, vocab: int, sharpness: float = 2.0) -> MarkovAdapter:
    gen = torch.Generator().manual_seed(seed)
    first = torch.log_softmax(sharpness * torch.randn(vocab, generator=gen, dtype=torch.float64), -1)
    table = torch.log_softmax(sharpness * torch.randn(vocab, vocab, generator=gen, dtype=torch.float64), -1)
    return MarkovAdapter(first, table)


def exhaustive(chain: MarkovAdapter, max_len: int, stops: set[int], penalty: str) -> list[tuple[float, list[int]]]:
    """Every hypothesis the chain can produce (ending at a stop token, or at max_len without one), with its
    normalised score, best first. Sequences include their stop token."""
    vocab = chain.first.shape[0]
    lp = length_normalizer(penalty)
    out: list[tuple[float, list[int]]] = []

    def grow(prefix: list[int]) -> None:
        if prefix and (prefix[-1] in stops or len(prefix) == max_len):
            s = chain.log_prob(prefix)
            if s > -math.inf:
                out.append((s / lp(len(prefix)), prefix))
            return
        for token in range(vocab):
            grow(prefix + [token])

    grow([])
    return sorted(out, key=lambda x: -x[0])
