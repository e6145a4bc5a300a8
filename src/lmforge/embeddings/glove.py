"""GloVe: global vectors from a weighted least-squares fit to log co-occurrence counts (Pennington et al., 2014).

Shape legend: E co-occurrence entries in a batch, D vector size, V vocabulary size.

1. **Co-occurrences** (``cooccurrence_matrix``): for every pair of words at distance d <= ``window`` in the same
   sentence (line), X_ij += 1 / d, in both directions (the reference ``cooccur`` tool's defaults: symmetric
   window, 1/d weighting). Words below ``min_count`` are removed first and take no position. Memory stays
   bounded: each chunk of the corpus is reduced to sorted unique (i, j) keys with summed weights; buffered
   chunks are merged whenever they exceed ``max_entries``, merged runs that are still large are written to
   temporary files, and the runs are finally merged key range by key range, each range holding at most
   ``max_entries`` entries. Only the result (12 bytes per non-zero) must fit in memory.
2. **Fit** (``GloVe``, ``train_glove``): minimise J = sum_ij f(X_ij) (w_i . w~_j + b_i + b~_j - log X_ij)^2 with
   f(x) = (x / x_max)^alpha for x < x_max, else 1 (x_max 100, alpha 0.75), over the non-zero entries in shuffled
   mini-batches, with AdaGrad as in the reference code (glove.c): initial learning rate 0.05, squared-gradient
   sums starting at 1, and the step taken on J / 2 (the reference's ``fdiff``; it accumulates the squares of the
   learning-rate-scaled gradients, and so do we). Parameters start uniform in [-0.5 / D, 0.5 / D).
   The reported loss is J divided by the number of entries (the reference tool prints half of that).
3. **Output**: W + W~, the sum of word and context vectors (the reference's default ``-model 2``).

Deviation: the reference updates one entry at a time on many threads (Hogwild!); here a batch of entries is
scored against the parameters as they were at the batch's start and the updates are added at once (repeated
words sum their updates; their squared-gradient sums grow by the sum of the squares). Worker threads then run
batches lock-free, as the reference's threads do.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from lmforge.embeddings.vectors import KeyedVectors
from lmforge.embeddings.vocab import EncodedCorpus, Vocabulary
from lmforge.embeddings.word2vec import parse_device
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")


# ---------------------------------------------------------------------------------------------- co-occurrences
@dataclass
class Cooccurrence:
    """The non-zero entries of X, sorted by (row, col).

    Attributes:
        rows: (nnz,) int32 word ids i.
        cols: (nnz,) int32 context word ids j.
        values: (nnz,) float32 X_ij.
        vocab_size: V.
    """

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    vocab_size: int

    @property
    def nnz(self) -> int:
        return int(self.values.shape[0])

    def to_dense(self) -> np.ndarray:
        """(V, V) float64 matrix (small vocabularies only: tests)."""
        dense = np.zeros((self.vocab_size, self.vocab_size))
        dense[self.rows, self.cols] = self.values
        return dense


def _reduce(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and the summed weight of each (float64)."""
    if keys.shape[0] == 0:
        return keys.astype(np.int64), weights.astype(np.float64)
    unique, inverse = np.unique(keys, return_inverse=True)
    return unique, np.bincount(inverse.reshape(-1), weights=weights, minlength=unique.shape[0])


def chunk_cooccurrences(ids: np.ndarray, sentence: np.ndarray, window: int,
                        vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Co-occurrence counts of one chunk as sorted unique keys ``i * V + j`` with their summed 1/d weights."""
    keys, weights = [], []
    for d in range(1, window + 1):
        same = sentence[:-d] == sentence[d:]
        left, right = ids[:-d][same].astype(np.int64), ids[d:][same].astype(np.int64)
        keys += [left * vocab_size + right, right * vocab_size + left]  # symmetric window
        weights += [np.full(2 * left.shape[0], 1.0 / d)]
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0)
    return _reduce(np.concatenate(keys), np.concatenate(weights))


class _Runs:
    """Sorted (key, value) runs: a few in memory, the big ones spilled to temporary .npy files."""

    def __init__(self, max_entries: int, tmp_dir: str | Path | None) -> None:
        self.max_entries = max_entries
        self.tmp_dir = tmp_dir
        self.workdir: Path | None = None
        self.buffer: list[tuple[np.ndarray, np.ndarray]] = []
        self.buffered = 0
        self.files: list[tuple[Path, Path]] = []

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        self.buffer.append((keys, values))
        self.buffered += keys.shape[0]
        if self.buffered > self.max_entries:
            keys, values = self._merge_buffer()
            if keys.shape[0] > self.max_entries // 2:  # merging again would not shrink it much: spill
                self._spill(keys, values)
            else:
                self.buffer, self.buffered = [(keys, values)], keys.shape[0]

    def _merge_buffer(self) -> tuple[np.ndarray, np.ndarray]:
        keys = np.concatenate([k for k, _ in self.buffer])
        values = np.concatenate([v for _, v in self.buffer])
        self.buffer, self.buffered = [], 0
        return _reduce(keys, values)

    def _spill(self, keys: np.ndarray, values: np.ndarray) -> None:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="lmforge-cooccur-", dir=self.tmp_dir))
        n = len(self.files)
        kf, vf = self.workdir / f"keys-{n}.npy", self.workdir / f"values-{n}.npy"
        np.save(kf, keys)
        np.save(vf, values)
        self.files.append((kf, vf))

    def merged(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The merged entries, key range by key range (each range at most ``max_entries`` run entries)."""
        runs = [(np.load(kf, mmap_mode="r"), np.load(vf, mmap_mode="r")) for kf, vf in self.files]
        if self.buffer:
            runs.append(self._merge_buffer())
        runs = [r for r in runs if r[0].shape[0]]
        if not runs:
            return
        if len(runs) == 1:
            yield np.asarray(runs[0][0]), np.asarray(runs[0][1])
            return
        end = max(int(k[-1]) for k, _ in runs) + 1
        lo = min(int(k[0]) for k, _ in runs)
        starts = [0] * len(runs)
        while lo < end:
            # the largest hi with at most max_entries run entries in [lo, hi) (at least one key's worth)
            a, b = lo + 1, end
            while a < b:
                mid = (a + b + 1) // 2
                size = sum(int(np.searchsorted(k, mid)) - s for (k, _), s in zip(runs, starts, strict=True))
                if size <= self.max_entries:
                    a = mid
                else:
                    b = mid - 1
            hi = a
            stops = [int(np.searchsorted(k, hi)) for k, _ in runs]
            keys = np.concatenate([np.asarray(k[s:e]) for (k, _), s, e in zip(runs, starts, stops, strict=True)])
            values = np.concatenate([np.asarray(v[s:e]) for (_, v), s, e in zip(runs, starts, stops, strict=True)])
            if keys.shape[0]:
                yield _reduce(keys, values)
            starts, lo = stops, hi

    def close(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def cooccurrence_matrix(corpus: EncodedCorpus, vocab: Vocabulary, window: int = 15,
                        max_entries: int = 20_000_000, chunk_words: int = 100_000,
                        tmp_dir: str | Path | None = None, progress: bool = False) -> Cooccurrence:
    """Count distance-weighted co-occurrences X_ij = sum over pairs at distance d <= window of 1/d (symmetric).

    Args:
        corpus: the encoded corpus; ``vocab`` is set on it here.
        vocab: the vocabulary (words below ``min_count`` already removed).
        window: the maximal distance.
        max_entries: entries held in memory while counting (each 16 bytes, plus sorting space), not counting
            the result.
        chunk_words: corpus words counted at a time.
        tmp_dir: where spilled runs go (default: the system's temporary folder).
        progress: show a progress bar over corpus words.
    """
    from tqdm.auto import tqdm

    if window < 1:
        raise LmforgeError(f"window={window} must be at least 1")
    if max_entries < 1:
        raise LmforgeError(f"max_entries={max_entries} must be at least 1")
    corpus.set_vocabulary(vocab)
    v = len(vocab)
    runs = _Runs(max_entries, tmp_dir)
    try:
        with tqdm(total=corpus.total_words, unit="word", unit_scale=True, disable=not progress,
                  desc="co-occurrences") as bar:
            for ids, sentence, raw in corpus.chunks(chunk_words):
                runs.add(*chunk_cooccurrences(ids, sentence, window, v))
                bar.update(raw)
        parts = list(runs.merged())
    finally:
        runs.close()
    keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.int64)
    values = np.concatenate([x for _, x in parts]) if parts else np.zeros(0)
    return Cooccurrence((keys // v).astype(np.int32), (keys % v).astype(np.int32), values.astype(np.float32), v)


# ---------------------------------------------------------------------------------------------- model
def glove_weight(x: Tensor, x_max: float = 100.0, alpha: float = 0.75) -> Tensor:
    """f(x) = (x / x_max)^alpha for x < x_max, else 1."""
    return torch.where(x < x_max, (x / x_max) ** alpha, torch.ones_like(x))


class GloVe(nn.Module):
    """GloVe (Pennington et al., 2014, "GloVe: Global Vectors for Word Representation") with AdaGrad as in the
    reference code.

    Word and context tables live in one (2V, D + 1) tensor, the bias in the last column (rows 0..V-1: w_i and
    b_i; rows V..2V-1: w~_j and b~_j), so that a batch reads and writes each of its rows once; ``sq_grads``
    holds AdaGrad's sums of squared gradients in the same layout.

    Args:
        vocab_size: V.
        dim: D.
        x_max, alpha: the weighting function's constants.
        generator: torch generator for the initialisation.
    """

    def __init__(self, vocab_size: int, dim: int, x_max: float = 100.0, alpha: float = 0.75,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if vocab_size < 1 or dim < 1:
            raise LmforgeError(f"vocab_size={vocab_size} and dim={dim} must both be at least 1")
        self.vocab_size, self.dim, self.x_max, self.alpha = vocab_size, dim, x_max, alpha
        init = (torch.rand(2 * vocab_size, dim + 1, generator=generator) - 0.5) / dim
        self.params = nn.Parameter(init, requires_grad=False)
        self.sq_grads = nn.Parameter(torch.ones(2 * vocab_size, dim + 1), requires_grad=False)

    @property
    def word_vectors(self) -> Tensor:
        return self.params[:self.vocab_size, :self.dim]

    @property
    def context_vectors(self) -> Tensor:
        return self.params[self.vocab_size:, :self.dim]

    @property
    def word_biases(self) -> Tensor:
        return self.params[:self.vocab_size, self.dim]

    @property
    def context_biases(self) -> Tensor:
        return self.params[self.vocab_size:, self.dim]

    def loss(self, rows: Tensor, cols: Tensor, values: Tensor) -> Tensor:
        """J over the given entries: sum of f(X_ij) (w_i . w~_j + b_i + b~_j - log X_ij)^2 (differentiable)."""
        w, c = self.params[rows], self.params[cols + self.vocab_size]  # (E, D+1) each
        diff = (w[:, :-1] * c[:, :-1]).sum(-1) + w[:, -1] + c[:, -1] - torch.log(values)
        return (glove_weight(values, self.x_max, self.alpha) * diff * diff).sum()

    @torch.no_grad()
    def adagrad_step(self, rows: Tensor, cols: Tensor, values: Tensor, lr: float) -> float:
        """One AdaGrad step of the reference code on a batch of entries; returns J over the batch before it."""
        index = torch.cat([rows, cols + self.vocab_size])  # (2E,)
        p = self.params.index_select(0, index)  # (2E, D+1): word rows, then context rows
        sq = self.sq_grads.index_select(0, index)
        n = rows.shape[0]
        w, c = p[:n], p[n:]
        diff = (w[:, :-1] * c[:, :-1]).sum(-1) + w[:, -1] + c[:, -1] - torch.log(values)  # (E,)
        fdiff = glove_weight(values, self.x_max, self.alpha) * diff  # dJ/2 / d(dot)
        loss = float((fdiff * diff).sum())
        step = fdiff.mul_(lr)[:, None]  # (E, 1)
        grad = torch.empty_like(p)  # the lr-scaled gradients of J/2
        grad[:n, :-1] = step * c[:, :-1]
        grad[n:, :-1] = step * w[:, :-1]
        grad[:n, -1:] = step
        grad[n:, -1:] = step
        self.params.index_add_(0, index, grad * sq.rsqrt_(), alpha=-1.0)
        self.sq_grads.index_add_(0, index, grad.square_())
        return loss

    def vectors(self) -> np.ndarray:
        """(V, D) W + W~, the output of the reference's default ``-model 2``."""
        return (self.word_vectors + self.context_vectors).detach().cpu().numpy().copy()


# ---------------------------------------------------------------------------------------------- training
@dataclass
class GloVeConfig:
    """Hyper-parameters; defaults from the paper and the reference code (x_max 100, alpha 0.75, lr 0.05, window
    15, 15 epochs as in its demo)."""

    dim: int = 100
    window: int = 15
    min_count: int = 5
    epochs: int = 15
    lr: float = 0.05
    x_max: float = 100.0
    alpha: float = 0.75
    batch_size: int = 4096  # co-occurrence entries per update
    workers: int = 2
    seed: int = 1
    max_entries: int = 20_000_000
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("dim", "window", "min_count", "epochs", "batch_size", "workers", "max_entries"):
            if getattr(self, name) < 1:
                raise LmforgeError(f"{name}={getattr(self, name)} must be at least 1")
        if self.lr <= 0 or self.x_max <= 0 or self.alpha <= 0:
            raise LmforgeError(f"lr ({self.lr}), x_max ({self.x_max}) and alpha ({self.alpha}) must be positive")


@dataclass
class GloVeEpoch:
    epoch: int
    loss: float  # J / entries
    entries: int
    seconds: float


@dataclass
class GloVeResult:
    vectors: KeyedVectors
    epochs: list[GloVeEpoch] = field(default_factory=list)
    cooccurrence_seconds: float = 0.0
    seconds: float = 0.0  # training (the fit), without counting co-occurrences
    nnz: int = 0


def diverged_message(config: GloVeConfig, what: str) -> str:
    """Why the fit stopped on a non-finite loss (``what`` happened), and which option to change."""
    return (f"GloVe diverged: {what} (AdaGrad learning rate {config.lr:g}), so the vectors are NaN or infinite and "
            f"were not saved. Likely cause: too large a learning rate; lower it (lr, --lr; now {config.lr:g}, the "
            "reference's is 0.05)")


def _run_batches(model: GloVe, entries: tuple[Tensor, Tensor, Tensor], order: Tensor, config: GloVeConfig,
                 bar: object, epoch: int = 1) -> float:
    """One epoch over ``entries`` (rows, cols, values) in ``order`` on ``config.workers`` lock-free threads;
    returns J summed over the epoch."""
    rows, cols, values = entries
    starts = iter(range(0, order.shape[0], config.batch_size))
    lock = threading.Lock()
    totals: list[float] = []
    errors: list[BaseException] = []

    def work() -> None:
        total = 0.0
        try:
            while not errors:
                with lock:
                    start = next(starts, None)
                if start is None:
                    break
                sel = order[start:start + config.batch_size]
                loss = model.adagrad_step(rows.index_select(0, sel), cols.index_select(0, sel),
                                          values.index_select(0, sel), config.lr)
                if not math.isfinite(loss):  # stop at once: later steps would only spread the NaN
                    raise LmforgeError(diverged_message(config, f"the loss became {loss} in epoch {epoch}"))
                total += loss
                with lock:
                    bar.update(sel.shape[0])  # type: ignore[attr-defined]
        except BaseException as err:
            errors.append(err)
        with lock:
            totals.append(total)

    if config.workers == 1:
        work()
    else:
        threads = [threading.Thread(target=work, daemon=True) for _ in range(config.workers)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    if errors:
        raise errors[0]
    return sum(totals)


def train_glove(corpus: EncodedCorpus, vocab: Vocabulary, config: GloVeConfig, progress: bool = False,
                on_epoch: Callable[[GloVeEpoch], None] | None = None,
                tmp_dir: str | Path | None = None) -> GloVeResult:
    """Count co-occurrences, fit GloVe and return W + W~ (rows = ``vocab.words``).

    Raises:
        LmforgeError: the corpus holds no co-occurring pair (every sentence has one kept word); the fit diverged (it
            stops at the first non-finite batch loss, and never returns non-finite vectors).
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    x = cooccurrence_matrix(corpus, vocab, config.window, config.max_entries, tmp_dir=tmp_dir, progress=progress)
    cooccurrence_seconds = time.perf_counter() - start
    if x.nnz == 0:
        raise LmforgeError("no two kept words co-occur: every sentence has fewer than two kept words; give "
                           "sentences of two or more words, or lower min_count")
    log.info("co-occurrence matrix: %s non-zero entries for %s words (%.1f s)", f"{x.nnz:,}", f"{len(vocab):,}",
             cooccurrence_seconds)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # parallel by worker threads
    device = parse_device(config.device)
    model = GloVe(len(vocab), config.dim, config.x_max, config.alpha,
                  generator=torch.Generator().manual_seed(config.seed)).to(device)
    generator = torch.Generator().manual_seed(config.seed + 1)
    entries = (torch.from_numpy(x.rows).long().to(device), torch.from_numpy(x.cols).long().to(device),
               torch.from_numpy(x.values).to(device))
    result = GloVeResult(vectors=None, cooccurrence_seconds=cooccurrence_seconds, nnz=x.nnz)  # type: ignore[arg-type]
    fit_start = time.perf_counter()
    try:
        with tqdm(total=config.epochs * x.nnz, unit="entry", unit_scale=True, disable=not progress,
                  desc="glove") as bar:
            for epoch in range(config.epochs):
                epoch_start = time.perf_counter()
                order = torch.randperm(x.nnz, generator=generator).to(device)
                total = _run_batches(model, entries, order, config, bar, epoch + 1)
                stats = GloVeEpoch(epoch + 1, total / x.nnz, x.nnz, time.perf_counter() - epoch_start)
                if not math.isfinite(stats.loss):  # every batch was finite, their sum overflowed
                    raise LmforgeError(diverged_message(config, f"the loss of epoch {epoch + 1} became {stats.loss}"))
                result.epochs.append(stats)
                if on_epoch is not None:
                    on_epoch(stats)
    finally:
        torch.set_num_threads(previous_threads)
    result.seconds = time.perf_counter() - fit_start
    table = model.vectors()
    if not np.isfinite(table).all():
        raise LmforgeError(diverged_message(config, "some vectors became infinite"))
    result.vectors = KeyedVectors(list(vocab.words), table)
    return result
