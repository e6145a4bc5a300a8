"""Word2Vec: skip-gram and CBOW with negative sampling (Mikolov et al., 2013a, 2013b), in two modes.

- ``mode="exact"`` (the default): the reference algorithm of the C tool (word2vec.c) and gensim. Every (context,
  centre) pair (CBOW: every centre word) draws its own K negatives and updates both tables at once with plain
  SGD, so each pair sees the previous pair's update; threads take chunks of the corpus and update the shared
  tables without locks (Hogwild!). The loop is compiled C (``_sgns.c``, through ``lmforge.embeddings.sgns``),
  built when lmforge is installed; it runs on the CPU.
- ``mode="fast"``: a batched approximation in PyTorch (``SkipGram`` / ``CBOW`` below): blocks of centre words share
  their negatives and a batch's updates are summed from the parameters at its start (the deviations listed
  below). It needs no compiler and runs on a GPU; on a real corpus it scores lower on word-similarity benchmarks
  than the exact loop (BENCHMARKS.md, "Static embeddings").

Shape legend (fast mode): N blocks in a batch, g centre words per block (``share_negatives``), W the window,
L = g + 2W rows (candidate context positions) per block, K negatives, D vector size, V vocabulary size.

What both modes share with the C tool and gensim, and where the fast mode deviates:

- **Vocabulary**: words with fewer than ``min_count`` occurrences are removed before windows are formed.
- **Subsampling**: each occurrence of word w is kept with probability ``min(1, sqrt(t / f(w)) + t / f(w))``,
  f(w) = count(w) / (occurrences of kept words), t = ``sample`` (1e-3 as gensim's default; 0 disables it). This
  is the C tool's formula (and gensim's), not the paper's ``1 - sqrt(t / f)`` discard probability.
- **Dynamic window**: for each centre word the effective window b is drawn uniformly from 1..W (the C tool's
  ``b = rand % window``, window - b), so near words are sampled more often than far ones.
- **Roles**: as in the C tool and gensim, the *input* vector (``input_vectors``, syn0) of a context word predicts
  the centre word's *output* vector (``output_vectors``, syn1neg) in skip-gram; the paper's v_c / u_o swap roles,
  which is the same model. CBOW averages the input vectors of the context words (gensim ``cbow_mean=1``).
- **Negatives** are drawn from the unigram distribution raised to 0.75 (``noise_distribution``); a negative equal
  to the positive target is skipped, as in the C tool. Per (context, target) pair the loss is
  ``-log sigma(u_t . v) - sum_k log sigma(-u_k . v)``; the reported epoch loss is its mean over all pairs of the
  epoch (CBOW: over all centre words). gensim's ``compute_loss`` sums a different quantity over a whole run
  and is known to be wrong (gensim issues #2617, #2735).
- **Learning rate**: linear decay from ``alpha`` to ``min_alpha`` over ``epochs x corpus words`` (words counted
  before subsampling and ``min_count``, as gensim and the C tool count progress), updated every batch.
  ``alpha`` defaults to 0.025 for both models, as in gensim (the C tool uses 0.05 for CBOW).
- **Exact mode, what differs from the C tool** (none of it changes the algorithm): the sigmoid and the loss are
  computed exactly (no 1,000-slot exp table, no clipping at |f| > 6); negatives come from an exact alias table
  (Vose) of the noise distribution; the learning rate decays word by word inside a chunk; random numbers are one
  splitmix64 stream per chunk seeded by (seed, epoch, chunk), so one worker gives the same vectors every run.
- **Fast mode, deviation, batching**: the C tool updates after every pair (Hogwild! across threads); here a batch of
  ``batch_size`` centre words with all their pairs is scored against the parameters as they were at the batch's
  start and all updates are added at once (``index_add_``: repeated words sum their updates). Plain SGD.
- **Fast mode, deviation, negatives are shared within a block**: the corpus (after subsampling) is cut into blocks of
  ``share_negatives`` (g, default 8) consecutive centre words, and one draw of K negatives serves every pair of
  the block. A block is then one small matrix product, (g + 2W) context rows x D times D x (g + K) targets,
  instead of one per pair, and each context vector is read once per block rather than once per pair; this
  is what makes batched training on a CPU about as fast as the C code. Each pair still has K negatives drawn
  from the noise distribution, so the expected gradient is unchanged; only pairs of the same block share them
  (the same idea as the per-window sharing of Ji et al., 2016, "Parallelizing Word2Vec in Shared and
  Distributed Memory", and BlazingText's, Gupta and Khare, 2017, at a larger scale). With g = 1, CBOW is the
  C tool's model (one draw per centre word) and skip-gram shares the draw within a window, as Ji et al. do.
- **Fast mode, deviation, hot rows are damped**: because a batch's updates are computed from the same (stale) parameters
  and summed, a word that takes part in very many pairs of one batch (a frequent word as a negative: it is drawn
  for many blocks, each shared by dozens of pairs) would take one huge step where the C tool takes many small
  ones, each seeing the previous one's effect; on small vocabularies (e.g. 8,000 word pieces) this made training
  diverge (vectors of norm 1e6). So each row's summed update is scaled by ``min(1, max_row_updates / n)``, n
  being the number of pairs (CBOW: centre words) it takes part in within the batch: a row moves at most as far
  as ``max_row_updates`` pairs' worth of stale gradient per batch. Rows below the cap (nearly all) get exactly
  the summed SGD update; ``max_row_updates=None`` switches the damping off. The default, 256, kept 13 of 13
  skip-gram runs on BBC word pieces stable (without it 2 of 6 diverged, with 1024 1 of 2) and left BBC
  word-level vectors as good as undamped (WordSim-353 0.217 against 0.222, SimLex-999 0.114 against 0.112, mean
  of 3 seeds); a cap of 64 also kept them stable but cost 0.05 on WordSim-353.
  The count cap alone was not enough on word pieces cut near characters ("th ##e": a few hundred pieces, each in
  hundreds of pairs of every batch): at gensim's alpha 0.025 the loss reached NaN within the first 20 batches
  (issue 23). The step of a row is therefore also bounded by its curvature: c = lr * sum over its uses of
  sigma'(s) |v|^2 (v the vector on the other side of score s) bounds the largest eigenvalue of lr times the
  Gauss-Newton matrix of the row's summed loss, and a row with c > ``max_row_curvature`` gets
  ``max_row_curvature / c`` of its summed update, so that the step cannot overshoot the minimum of the local
  quadratic model, as the C tool's many small steps never do. Both tables of a pair move at once, so each gets
  half of that unit budget: the default bound is 0.5 (1.0 still diverged on 2 of 4 seeds of BBC pieces, 0.5 on
  none). Rows under the bound, most rows on word-level text, still take the exact summed SGD step. On BBC words
  (mean of 3 seeds, defaults otherwise) skip-gram's WordSim-353 / SimLex-999 went from 0.206 / 0.120 to
  0.223 / 0.118 and CBOW's from 0.095 / 0.077 to 0.096 / 0.054 (CBOW's SimLex varies by 0.02 between seeds).
- **CBOW update**: the error of the averaged context vector is added unscaled to every context word's input
  vector, as in the C tool and gensim (the exact gradient of the mean would divide it by the number of
  context words).
- Initialisation: input vectors uniform in [-0.5 / D, 0.5 / D), output vectors zero (C tool, gensim).

In both modes ``workers`` lock-free threads share the work, as in the C tool (see ``train_word2vec``). The fast
mode's speed comes from batching (one update per ``batch_size`` centre words, a few dozen torch operations);
``device`` puts its tables on a GPU (the batches are still made on the CPU).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.choices import WORD2VEC_MODES
from lmforge.embeddings import sgns
from lmforge.embeddings.vectors import KeyedVectors
from lmforge.embeddings.vocab import EncodedCorpus, Vocabulary
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

ARCHITECTURES = ("skipgram", "cbow")


# ---------------------------------------------------------------------------------------------- sampling
def noise_distribution(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """The negative-sampling distribution ``count(w)^power / sum_v count(v)^power`` (float64, sums to 1)."""
    weights = np.asarray(counts, dtype=np.float64) ** power
    return weights / weights.sum()


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """Probability of keeping each occurrence of a word under subsampling (the C tool's formula).

    ``p(w) = min(1, sqrt(t / f) + t / f)`` with ``f = count(w) / sum(counts)`` and ``t = sample``; ``sample=0``
    keeps everything.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if sample <= 0:
        return np.ones_like(counts)
    ratio = sample / (counts / counts.sum())
    return np.minimum(1.0, np.sqrt(ratio) + ratio)


def subsample(ids: np.ndarray, keep_prob: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n,) bool: keep each occurrence ``ids[i]`` with probability ``keep_prob[ids[i]]``, independently."""
    return rng.random(ids.shape[0]) < keep_prob[ids]


class NoiseSampler:
    """Draws word ids from ``noise_distribution(counts, power)`` by inverse-CDF look-up (exact, no table).

    The C tool samples from a table of 10^8 slots and gensim bisects a cumulative table of integers; both
    approximate the same distribution that this samples exactly (up to float64 rounding).
    """

    def __init__(self, counts: np.ndarray, power: float = 0.75) -> None:
        self.probabilities = noise_distribution(counts, power)
        self.cumulative = np.cumsum(self.probabilities)
        self.cumulative[-1] = 1.0

    def sample(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """int64 ids of the given shape."""
        u = rng.random(shape)
        return np.minimum(np.searchsorted(self.cumulative, u, side="right"), len(self.cumulative) - 1)


@dataclass
class BlockBatch:
    """N blocks of g consecutive centre words (after subsampling) with the positions around them.

    Block k covers centre positions kg .. kg+g-1 and rows (candidate context positions) kg-W .. kg+g-1+W, so
    L = g + 2W rows; ``pairs[k, r, j]`` says whether row r is a context word of centre j (inside centre j's
    dynamic window and sentence, not centre j itself). The K negatives are drawn once per block.

    Attributes:
        rows: (N, L) word ids of the rows, 0 for positions outside the chunk.
        targets: (N, g + K) the g centre word ids, then the block's K negatives.
        pairs: (N, L, g) bool.
        lr: the learning rate for this batch.
        raw_words: corpus words (before subsampling) that this batch completes, for progress.
    """

    rows: Tensor
    targets: Tensor
    pairs: Tensor
    lr: float = 0.0
    raw_words: int = 0

    @property
    def share(self) -> int:
        return int(self.pairs.shape[2])

    def to(self, device: torch.device) -> BlockBatch:
        if device.type == "cpu":
            return self
        return BlockBatch(self.rows.to(device, non_blocking=True), self.targets.to(device, non_blocking=True),
                          self.pairs.to(device, non_blocking=True), self.lr, self.raw_words)


def make_blocks(ids: np.ndarray, sentence: np.ndarray, window: int, share: int, rng: np.random.Generator,
                keep_prob: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Subsample a chunk of words and cut it into blocks of ``share`` centre words with their windows.

    Args:
        ids: (n,) word ids of consecutive sentences.
        sentence: (n,) the sentence of each word; windows stop at a change of sentence.
        window: the maximal window W.
        share: g, centre words per block.
        rng: random generator (subsampling and the dynamic window sizes).
        keep_prob: (V,) subsampling keep probability per word, or None to keep every word.

    Returns:
        ``(rows, centers, pairs)``: (N, g + 2W), (N, g) and (N, g + 2W, g) as in ``BlockBatch``; blocks without a
        single pair are left out. Centre slots past the chunk's end hold word 0 and have no pairs.
    """
    if keep_prob is not None:
        keep = subsample(ids, keep_prob, rng)
        ids, sentence = ids[keep], sentence[keep]
    n, g, w = ids.shape[0], share, window
    if n == 0:
        return (np.zeros((0, g + 2 * w), np.int64), np.zeros((0, g), np.int64), np.zeros((0, g + 2 * w, g), bool))
    b = rng.integers(1, w + 1, size=n)  # the effective (dynamic) window of each centre word
    n_blocks = -(-n // g)
    center_pos = np.arange(n_blocks * g).reshape(n_blocks, g)
    row_pos = center_pos[:, :1] - w + np.arange(g + 2 * w)  # (N, L)
    dist = np.arange(g + 2 * w)[:, None] - w - np.arange(g)[None, :]  # (L, g): row offset from each centre
    center_ok = center_pos < n
    row_ok = (row_pos >= 0) & (row_pos < n)
    cp, rp = np.minimum(center_pos, n - 1), np.clip(row_pos, 0, n - 1)
    pairs = (row_ok[:, :, None] & center_ok[:, None, :] & (dist != 0)
             & (np.abs(dist) <= b[cp][:, None, :]) & (sentence[rp][:, :, None] == sentence[cp][:, None, :]))
    keep_blocks = pairs.any(axis=(1, 2))
    rows = np.where(row_ok, ids[rp], 0)
    centers = np.where(center_ok, ids[cp], 0)
    return rows[keep_blocks], centers[keep_blocks], pairs[keep_blocks]


# ---------------------------------------------------------------------------------------------- models
def _init_tables(vocab_size: int, dim: int, generator: torch.Generator | None) -> tuple[nn.Parameter, nn.Parameter]:
    if vocab_size < 1 or dim < 1:
        raise LmforgeError(f"vocab_size={vocab_size} and dim={dim} must both be at least 1")
    syn0 = (torch.rand(vocab_size, dim, generator=generator) - 0.5) / dim
    return nn.Parameter(syn0, requires_grad=False), nn.Parameter(torch.zeros(vocab_size, dim), requires_grad=False)


def _negative_ok(targets: Tensor, share: int) -> Tensor:
    """(N, g, K) float: 1 where negative k differs from centre j (a negative equal to the target is skipped)."""
    return (targets[:, :share, None] != targets[:, None, share:]).float()


def _damp_rows(update: Tensor, index: Tensor, uses: Tensor, cap: float | None, vocab_size: int,
               curvature: Tensor | None = None, bound: float | None = None) -> Tensor:
    """Scale the updates (M, D) of rows ``index`` (M,) so that no word's summed update counts more than ``cap``
    uses and no word's step overshoots.

    ``uses`` (M,), summed per word: a word with n > cap uses in the batch gets ``cap / n`` of each update.
    ``curvature`` (M,), summed per word, is ``lr * sum sigma'(s) * |v|^2`` over the word's uses (v: the vector on
    the other side of each score s), an upper bound on the largest eigenvalue of the step's Gauss-Newton matrix: a
    word whose bound exceeds ``bound`` gets ``bound / curvature`` of each update, so that the summed (stale) step
    cannot overshoot the minimum of the local quadratic model, as many small per-pair steps never do.
    """
    if cap is None and (curvature is None or bound is None):
        return update
    scale = torch.ones(vocab_size, dtype=update.dtype, device=update.device)
    if cap is not None:
        per_word = torch.zeros(vocab_size, dtype=update.dtype, device=update.device)
        per_word.index_add_(0, index, uses.to(update.dtype))
        scale = cap / per_word.clamp(min=cap)  # (V,) 1 for words at or below the cap
    if curvature is not None and bound is not None:
        per_word = torch.zeros(vocab_size, dtype=update.dtype, device=update.device)
        per_word.index_add_(0, index, curvature.to(update.dtype))
        scale = torch.minimum(scale, bound / per_word.clamp(min=bound))
    return update * scale.index_select(0, index)[:, None]


def _signed_softplus(s: Tensor, share: int, positive: Tensor, negative: Tensor) -> Tensor:
    """sum of ``positive * -log sigma(s[..., :g]) + negative * -log sigma(-s[..., g:])``."""
    return (F.softplus(-s[..., :share]) * positive).sum() + (F.softplus(s[..., share:]) * negative).sum()


class SkipGram(nn.Module):
    """Skip-gram with negative sampling (Mikolov et al., 2013b, "Distributed Representations of Words and
    Phrases and their Compositionality"), computed block-wise with negatives shared by a block of centre words.

    Each context word's input vector scores its centre word (label 1) and the block's K negatives (label 0) with
    their output vectors. For a block, all rows against all targets is one (L x D) @ (D x (g + K)) product;
    the pair mask picks the scores that belong to real pairs. ``pair_loss`` is the differentiable reference,
    one pair at a time; ``sgd_step`` is the fast manual update used for training, equal to one SGD step on it
    (see the tests).

    Args:
        vocab_size: V.
        dim: D.
        generator: torch generator for the initialisation.
    """

    def __init__(self, vocab_size: int, dim: int, generator: torch.Generator | None = None,
                 max_row_updates: float | None = None, max_row_curvature: float | None = None) -> None:
        super().__init__()
        self.input_vectors, self.output_vectors = _init_tables(vocab_size, dim, generator)
        self.max_row_updates, self.max_row_curvature = max_row_updates, max_row_curvature

    def pair_loss(self, batch: BlockBatch) -> tuple[Tensor, int]:
        """Summed loss over the batch's (context, centre) pairs, pair by pair, and the number of pairs."""
        g = batch.share
        block, row, col = batch.pairs.nonzero(as_tuple=True)  # one entry per pair
        context = batch.rows[block, row]
        center = batch.targets[block, col]
        negatives = batch.targets[block, g:]  # (P, K)
        v = self.input_vectors[context]  # (P, D)
        pos = (self.output_vectors[center] * v).sum(-1)  # (P,)
        neg = torch.einsum("pkd,pd->pk", self.output_vectors[negatives], v)  # (P, K)
        skip = (negatives != center[:, None]).float()
        loss = -F.logsigmoid(pos).sum() - (F.logsigmoid(-neg) * skip).sum()
        return loss, int(block.shape[0])

    @torch.no_grad()
    def sgd_step(self, batch: BlockBatch, lr: float) -> tuple[float, int]:
        """One plain SGD step of ``lr`` on ``pair_loss(batch)``; returns (loss before the step, pairs)."""
        g = batch.share
        n_blocks, n_rows = batch.rows.shape
        dim = self.input_vectors.shape[1]
        rows, targets = batch.rows.reshape(-1), batch.targets.reshape(-1)
        pairs = batch.pairs.float()  # (N, L, g)
        neg_weight = torch.bmm(pairs, _negative_ok(batch.targets, g))  # (N, L, K): pairs of row r using negative k
        x = self.input_vectors.index_select(0, rows).view(n_blocks, n_rows, dim)  # (N, L, D)
        t = self.output_vectors.index_select(0, targets).view(n_blocks, -1, dim)  # (N, g+K, D)
        s = torch.bmm(x, t.transpose(1, 2))  # (N, L, g+K)
        loss = _signed_softplus(s, g, pairs, neg_weight)
        sig = torch.sigmoid(s)
        # lr * sigma'(s) per score and pair (the curvature of each pair's loss along the score), for the damping
        curv = (sig * (1.0 - sig)).mul_(torch.cat([pairs, neg_weight], dim=2)).mul_(lr)  # (N, L, g+K)
        grad = sig.neg_()  # d(-loss)/ds = label - sigma(s), times the weights below
        grad[..., :g].add_(1.0).mul_(pairs)
        grad[..., g:].mul_(neg_weight)
        grad.mul_(lr)
        dx = torch.bmm(grad, t)  # (N, L, D)
        dt = torch.bmm(grad.transpose(1, 2), x)  # (N, g+K, D)
        cap, bound, vocab = self.max_row_updates, self.max_row_curvature, len(self.input_vectors)
        target_pairs = torch.cat([pairs.sum(1), neg_weight.sum(1)], dim=1)  # (N, g+K) pairs each target serves
        target_curv = torch.bmm(x.square().sum(-1)[:, None, :], curv)  # (N, 1, g+K): sum of curv * |x|^2
        row_curv = torch.bmm(curv, t.square().sum(-1)[:, :, None])  # (N, L, 1): sum of curv * |t|^2
        dt = _damp_rows(dt.view(-1, dim), targets, target_pairs.view(-1), cap, vocab, target_curv.view(-1), bound)
        dx = _damp_rows(dx.view(-1, dim), rows, pairs.sum(2).view(-1), cap, vocab, row_curv.view(-1), bound)
        self.output_vectors.index_add_(0, targets, dt)
        self.input_vectors.index_add_(0, rows, dx)
        return float(loss), int(batch.pairs.sum())


class CBOW(nn.Module):
    """Continuous bag of words with negative sampling (Mikolov et al., 2013a, "Efficient Estimation of Word
    Representations in Vector Space"; negative sampling from 2013b), computed block-wise.

    The mean of a centre word's context input vectors scores the centre word (label 1) and the block's K
    negatives (label 0). ``sgd_step`` adds the error of the mean to every context vector unscaled, as the C tool
    does, so for the input vectors it equals ``n_context`` times the SGD step on ``center_loss`` (for the output
    vectors it is exactly that step).

    Args:
        vocab_size: V.
        dim: D.
        generator: torch generator for the initialisation.
    """

    def __init__(self, vocab_size: int, dim: int, generator: torch.Generator | None = None,
                 max_row_updates: float | None = None, max_row_curvature: float | None = None) -> None:
        super().__init__()
        self.input_vectors, self.output_vectors = _init_tables(vocab_size, dim, generator)
        self.max_row_updates, self.max_row_curvature = max_row_updates, max_row_curvature

    def center_loss(self, batch: BlockBatch) -> tuple[Tensor, int]:
        """Summed loss over the batch's centre words (those with a context), one at a time, and their number."""
        g = batch.share
        counts = batch.pairs.sum(1)  # (N, g) context words of each centre
        block, col = (counts > 0).nonzero(as_tuple=True)
        losses = []
        for k, j in zip(block.tolist(), col.tolist(), strict=True):
            context = batch.rows[k][batch.pairs[k, :, j]]
            h = self.input_vectors[context].mean(0)  # (D,)
            center, negatives = batch.targets[k, j], batch.targets[k, g:]
            pos = self.output_vectors[center] @ h
            neg = self.output_vectors[negatives] @ h  # (K,)
            losses.append(-F.logsigmoid(pos) - (F.logsigmoid(-neg) * (negatives != center)).sum())
        return torch.stack(losses).sum(), len(losses)

    @torch.no_grad()
    def sgd_step(self, batch: BlockBatch, lr: float) -> tuple[float, int]:
        """One C-tool CBOW step; returns (loss before the step, centre words)."""
        g = batch.share
        n_blocks, n_rows = batch.rows.shape
        dim = self.input_vectors.shape[1]
        rows, targets = batch.rows.reshape(-1), batch.targets.reshape(-1)
        pairs = batch.pairs.float()  # (N, L, g)
        counts = pairs.sum(1)  # (N, g)
        has_context = (counts > 0).float()
        mean = pairs.transpose(1, 2) / counts.clamp(min=1)[:, :, None]  # (N, g, L) averaging weights
        x = self.input_vectors.index_select(0, rows).view(n_blocks, n_rows, dim)  # (N, L, D)
        t = self.output_vectors.index_select(0, targets).view(n_blocks, -1, dim)  # (N, g+K, D)
        h = torch.bmm(mean, x)  # (N, g, D)
        s = torch.bmm(h, t.transpose(1, 2))  # (N, g, g+K); only the diagonal of the first g columns is used
        positive = torch.diag_embed(has_context)  # (N, g, g)
        negative = _negative_ok(batch.targets, g) * has_context[:, :, None]  # (N, g, K)
        loss = _signed_softplus(s, g, positive, negative)
        sig = torch.sigmoid(s)
        weights = torch.cat([positive, negative], dim=2)  # (N, g, g+K)
        curv = (sig * (1.0 - sig)).mul_(weights).mul_(lr)  # lr * sigma'(s) of every scored (centre, target)
        grad = sig.neg_()
        grad[..., :g].add_(1.0).mul_(positive)
        grad[..., g:].mul_(negative)
        grad.mul_(lr)
        dh = torch.bmm(grad, t)  # (N, g, D)
        dx = torch.bmm(pairs, dh)  # (N, L, D): every context word gets its centre's whole error (C tool)
        dt = torch.bmm(grad.transpose(1, 2), h)  # (N, g+K, D)
        cap, bound, vocab = self.max_row_updates, self.max_row_curvature, len(self.input_vectors)
        target_uses = torch.cat([has_context, negative.sum(1)], dim=1)  # (N, g+K) centre words each target serves
        target_curv = torch.bmm(h.square().sum(-1)[:, None, :], curv)  # (N, 1, g+K)
        # a context word moves the mean by its whole (unscaled) error: its curvature is its centres' sum over t
        center_curv = torch.bmm(curv, t.square().sum(-1)[:, :, None])  # (N, g, 1)
        row_curv = torch.bmm(pairs, center_curv)  # (N, L, 1)
        dt = _damp_rows(dt.view(-1, dim), targets, target_uses.view(-1), cap, vocab, target_curv.view(-1), bound)
        dx = _damp_rows(dx.view(-1, dim), rows, pairs.sum(2).view(-1), cap, vocab, row_curv.view(-1), bound)
        self.output_vectors.index_add_(0, targets, dt)
        self.input_vectors.index_add_(0, rows, dx)
        return float(loss), int(has_context.sum())


MODELS: dict[str, type[nn.Module]] = {"skipgram": SkipGram, "cbow": CBOW}


# ---------------------------------------------------------------------------------------------- training
@dataclass
class Word2VecConfig:
    """Hyper-parameters; the defaults are gensim's (``Word2Vec()``) except ``batch_size``, which it has not."""

    architecture: str = "skipgram"
    mode: str = "exact"  # exact: the reference per-pair SGD (compiled loop); fast: the batched approximation
    dim: int = 100
    window: int = 5
    negative: int = 5
    min_count: int = 5
    sample: float = 1e-3
    alpha: float = 0.025
    min_alpha: float = 0.0001
    epochs: int = 5
    batch_size: int = 1024  # centre words per update
    share_negatives: int = 8  # consecutive centre words that share one draw of K negatives
    max_row_updates: float | None = 256.0  # a word's summed update per batch counts at most this many pairs
    max_row_curvature: float | None = 0.5  # and its step at most this much lr x curvature (fast mode damping)
    workers: int = 2
    seed: int = 1
    chunk_words: int = 50_000  # corpus words per chunk (the unit of work of a thread)
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise LmforgeError(f"architecture={self.architecture!r}; choose one of {', '.join(ARCHITECTURES)}")
        if self.mode not in WORD2VEC_MODES:
            raise LmforgeError(f"mode={self.mode!r}; choose one of {', '.join(WORD2VEC_MODES)}")
        for name in ("dim", "window", "negative", "min_count", "epochs", "batch_size", "share_negatives", "workers",
                     "chunk_words"):
            if getattr(self, name) < 1:
                raise LmforgeError(f"{name}={getattr(self, name)} must be at least 1")
        for name in ("max_row_updates", "max_row_curvature"):
            if getattr(self, name) is not None and not 0 < getattr(self, name) < math.inf:
                raise LmforgeError(f"{name}={getattr(self, name)} must be a positive number (or None: no damping)")
        if not 0 <= self.sample < 1:
            raise LmforgeError(f"sample={self.sample} must be in [0, 1); 0 disables subsampling")
        if not 0 < self.alpha or not 0 <= self.min_alpha <= self.alpha:
            raise LmforgeError(f"need 0 <= min_alpha ({self.min_alpha}) <= alpha ({self.alpha}) and alpha > 0")


@dataclass
class EpochStats:
    epoch: int
    loss: float  # mean loss per pair (skip-gram) or per centre word (CBOW)
    pairs: int
    words: int  # corpus words read (before subsampling)
    seconds: float
    lr_end: float


@dataclass
class Word2VecResult:
    vectors: KeyedVectors
    epochs: list[EpochStats] = field(default_factory=list)
    seconds: float = 0.0
    words_per_second: float = 0.0  # corpus words (all epochs, before subsampling) per training second


def chunk_batches(ids: np.ndarray, sentence: np.ndarray, raw: int, sampler: NoiseSampler,
                  keep_prob: np.ndarray | None, config: Word2VecConfig,
                  rng: np.random.Generator) -> Iterator[BlockBatch]:
    """The batches of one corpus chunk: subsampling, dynamic windows, blocks and negatives (``lr`` left 0;
    ``raw_words`` spreads the chunk's ``raw`` corpus words over its batches)."""
    rows, centers, pairs = make_blocks(ids, sentence, config.window, config.share_negatives, rng, keep_prob)
    negatives = sampler.sample((centers.shape[0], config.negative), rng)
    targets = np.concatenate([centers, negatives], axis=1)
    per_batch = max(1, config.batch_size // config.share_negatives)  # blocks per update
    n_batches = max(1, math.ceil(rows.shape[0] / per_batch))
    for k in range(n_batches):
        sl = slice(k * per_batch, (k + 1) * per_batch)
        raw_part = raw // n_batches + (1 if k < raw % n_batches else 0)
        yield BlockBatch(torch.from_numpy(rows[sl]), torch.from_numpy(targets[sl]), torch.from_numpy(pairs[sl]),
                         0.0, raw_part)


def parse_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        raise LmforgeError(f"device={name!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LmforgeError(f"device={name!r} but CUDA is not available; use cpu")
    return device


def diverged_message(config: Word2VecConfig, what: str, lr: float) -> str:
    """Why training stopped on a non-finite loss (``what`` happened), and which options to change."""
    fix = f"lower the learning rate (alpha, --lr; now {config.alpha:g})"
    if config.mode == "fast":
        fix += (f", or damp the summed updates of frequent words more (max_row_curvature, now "
                f"{config.max_row_curvature}; max_row_updates, now {config.max_row_updates}), or train the "
                "reference algorithm (--mode exact)")
    return (f"word2vec diverged: {what} (learning rate {lr:.3g}), so the vectors are NaN or "
            f"infinite and were not saved. Likely cause: too large a step for the most frequent words; {fix}")


class _Run:
    """Shared state of the worker threads of one training run (chunk hand-out, progress, epoch loss)."""

    def __init__(self, model: nn.Module, corpus: EncodedCorpus, vocab: Vocabulary, config: Word2VecConfig,
                 bar: Any) -> None:
        self.model, self.corpus, self.config, self.bar = model, corpus, config, bar
        self.device = torch.device(config.device)
        self.sampler = NoiseSampler(vocab.counts)
        self.keep_prob = keep_probabilities(vocab.counts, config.sample) if config.sample > 0 else None
        self.total = config.epochs * corpus.total_words
        self.done = 0  # corpus words finished, all epochs
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.loss_sum, self.pairs, self.lr = 0.0, 0, config.alpha
        self.chunks: Iterator[tuple[int, tuple[np.ndarray, np.ndarray, int]]] = iter(())
        self.epoch = 0
        self.exact = config.mode == "exact"
        if self.exact:  # the compiled loop works on the tables' memory in place
            self.noise = sgns.alias_table(self.sampler.probabilities)
            self.syn0 = model.input_vectors.data.numpy()
            self.syn1 = model.output_vectors.data.numpy()

    def lr_at(self, words: float) -> float:
        """Linear decay from alpha to min_alpha over all epochs' corpus words."""
        c = self.config
        return c.alpha - (c.alpha - c.min_alpha) * min(words / self.total, 1.0)

    def work(self) -> None:
        """Take chunks until the epoch's are gone; Hogwild!: threads update the shared tables without locks."""
        try:
            loss_sum, pairs = 0.0, 0
            while not self.stop.is_set():
                with self.lock:
                    item = next(self.chunks, None)
                    start_words = self.done
                if item is None:
                    break
                index, (ids, sentence, raw) = item
                # one generator per chunk: the data do not depend on which thread takes which chunk
                if self.exact:
                    lr = self.lr_at(start_words + raw)
                    chunk_loss, chunk_pairs = sgns.train_chunk(
                        self.syn0, self.syn1, ids, sentence, self.keep_prob, self.noise, window=self.config.window,
                        negative=self.config.negative, cbow=self.config.architecture == "cbow",
                        lr_start=self.lr_at(start_words), lr_end=lr, seed=sgns.seed_of(self.config.seed, self.epoch,
                                                                                        index))
                    self._check_finite(chunk_loss, lr)
                    loss_sum += chunk_loss
                    pairs += chunk_pairs
                    self._finish_chunk(raw, lr)
                    continue
                rng = np.random.default_rng([self.config.seed, self.epoch, index])
                seen = 0
                for batch in chunk_batches(ids, sentence, raw, self.sampler, self.keep_prob, self.config, rng):
                    lr = self.lr_at(start_words + seen)
                    if batch.rows.shape[0]:
                        batch_loss, batch_pairs = self.model.sgd_step(batch.to(self.device), lr)
                        self._check_finite(batch_loss, lr)
                        loss_sum += batch_loss
                        pairs += batch_pairs
                    seen += batch.raw_words
                    if self.stop.is_set():
                        return
                self._finish_chunk(raw, lr)
            with self.lock:
                self.loss_sum += loss_sum
                self.pairs += pairs
        except BaseException as err:  # re-raised by the main thread
            with self.lock:
                self.errors.append(err)
            self.stop.set()

    def _check_finite(self, loss: float, lr: float) -> None:
        """Stop at the first non-finite loss (a chunk's in exact mode, a batch's in fast mode): the tables are
        then NaN or infinite and every later update would only spread it."""
        if not math.isfinite(loss):
            raise LmforgeError(diverged_message(self.config, f"the loss became {loss} in epoch {self.epoch + 1}", lr))

    def _finish_chunk(self, raw: int, lr: float) -> None:
        with self.lock:
            self.done += raw
            self.lr = lr
            self.bar.update(raw)

    def run_epoch(self, epoch: int) -> tuple[float, int]:
        """Train one epoch on ``config.workers`` threads; returns (loss sum, pairs)."""
        self.epoch, self.loss_sum, self.pairs = epoch, 0.0, 0
        self.chunks = enumerate(self.corpus.chunks(self.config.chunk_words))
        if self.config.workers == 1:
            self.work()  # no thread: fully deterministic
        else:
            threads = [threading.Thread(target=self.work, daemon=True) for _ in range(self.config.workers)]
            for t in threads:
                t.start()
            try:
                for t in threads:
                    while t.is_alive():
                        t.join(0.2)  # a timeout keeps Ctrl-C working
            finally:
                if any(t.is_alive() for t in threads):  # interrupted: let the threads finish their batch and quit
                    self.stop.set()
        if self.errors:
            raise self.errors[0]
        return self.loss_sum, self.pairs


def train_word2vec(corpus: EncodedCorpus, vocab: Vocabulary, config: Word2VecConfig,
                   progress: bool = False,
                   on_epoch: Callable[[EpochStats], None] | None = None) -> Word2VecResult:
    """Train skip-gram or CBOW on ``corpus`` (whose vocabulary is ``vocab``) and return the input vectors.

    Parallelism is that of the C tool and gensim: ``config.workers`` threads each take chunks of the corpus
    (``chunk_words`` corpus words), make their batches with numpy and update the shared tables without locks
    (Hogwild!, Recht et al., 2011), while torch runs each operation on one thread (torch and numpy release the
    GIL in their heavy loops). Chunk data are drawn from a generator seeded by (seed, epoch, chunk), so one
    worker gives identical results run after run; several workers interleave their updates in varying order.

    This is a dedicated loop rather than ``lmforge.training.Trainer``: word2vec's learning rate follows corpus
    words read (not optimizer steps), its updates are manual sparse SGD without autograd or optimizer state,
    its parallelism is lock-free threads rather than data-parallel processes, and its loss is reported per
    epoch; none of that fits the Trainer's step-based contract.

    Args:
        corpus: the encoded corpus.
        vocab: the vocabulary (counts drive subsampling and the noise distribution); set on ``corpus`` here.
        config: hyper-parameters.
        progress: show a tqdm bar over corpus words.
        on_epoch: called with each epoch's statistics (the CLI logs and writes them).

    Returns:
        The vectors (rows = ``vocab.words``), the per-epoch statistics, training seconds and words/s.

    Raises:
        LmforgeError: no (context, centre) pair in the whole corpus; training diverged (it stops at the first
            non-finite loss, and never returns non-finite vectors).
    """
    from tqdm.auto import tqdm

    if config.mode == "exact":
        sgns.require()
        if parse_device(config.device).type != "cpu":
            raise LmforgeError(f"device={config.device!r}: Word2Vec's exact mode (the per-pair loop) runs on the CPU; "
                               "use --mode fast to train the batched approximation on a GPU")
    corpus.set_vocabulary(vocab)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # parallel by worker threads; intra-op threads would spin against them
    generator = torch.Generator().manual_seed(config.seed)
    model = MODELS[config.architecture](len(vocab), config.dim, generator=generator,
                                        max_row_updates=config.max_row_updates,
                                        max_row_curvature=config.max_row_curvature).to(parse_device(config.device))
    bar = tqdm(total=config.epochs * corpus.total_words, unit="word", unit_scale=True, disable=not progress,
               desc=f"word2vec {config.architecture}")
    run = _Run(model, corpus, vocab, config, bar)
    epochs: list[EpochStats] = []
    start = time.perf_counter()
    try:
        for epoch in range(config.epochs):
            epoch_start = time.perf_counter()
            loss_sum, pairs = run.run_epoch(epoch)
            stats = EpochStats(epoch + 1, loss_sum / pairs if pairs else math.nan, pairs, corpus.total_words,
                               time.perf_counter() - epoch_start, run.lr)
            epochs.append(stats)
            if on_epoch is not None:
                on_epoch(stats)
            if not pairs:
                raise LmforgeError("training saw no (context, centre) pair: every sentence has fewer than two kept "
                                   "words; give sentences of two or more words, or lower min_count")
    finally:
        bar.close()
        torch.set_num_threads(previous_threads)
    seconds = time.perf_counter() - start
    table = model.input_vectors.detach().cpu().numpy().copy()
    if not np.isfinite(table).all():  # a finite loss with an overflowing row: never hand such vectors on
        raise LmforgeError(diverged_message(config, "some vectors became infinite", run.lr))
    vectors = KeyedVectors(list(vocab.words), table)
    return Word2VecResult(vectors, epochs, seconds, config.epochs * corpus.total_words / max(seconds, 1e-9))
