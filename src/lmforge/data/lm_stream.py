"""Language-model data for stateful truncated BPTT (plan ``"stream"``: the AWD-LSTM, Merity et al. 2018; ULMFiT
stages (a) and (b), Howard & Ruder 2018).

The split's documents, each followed by an end-of-text id ([SEP], the id a causal-LM prompt starts with), are
concatenated into one stream; the stream is cut into R = micro_batch_size x world_size equal rows ("batchify"),
and rank r reads rows r, r + world_size, ... Consecutive micro-batches are consecutive windows of the same rows, so
the LSTM state at the end of one window is the right start of the next: the objective
(``lmforge.objectives.awd_lm``) carries it across batches, detached.

Batch format (int64 tensors, B = micro_batch_size rows, L = this window's length):

- ``input_ids`` (B, L) = rows[:, p : p + L], ``labels`` (B, L) = rows[:, p + 1 : p + L + 1] (the next tokens);
- ``attention_mask`` (B, L), all 1 (counts tokens for the logs);
- ``reset`` (B,): 1 on the first window of a pass over the stream (the state starts from zeros), else 0;
- ``backward`` (B,), all 1, only when ``reverse`` (see below).

Window lengths (training split, ``DataConfig.variable_bptt``; Merity et al. 2018, section 4.1): the base is
``seq_len`` with probability 0.95, else ``seq_len / 2``; the length is drawn from N(base, 5), at least 5 and at most
``seq_len + 20`` (a cap of ours, so that a batch never grows without bound). Merity et al. also rescale the
learning rate by L / seq_len; with Adam that is not done here (deviation). The eval split uses fixed windows of
``seq_len``. Every draw comes from a generator keyed by (seed, epoch, position), so the state is just
(epoch, position) and a resumed run reads the same windows; the LSTM state itself is not saved: a resumed run
restarts it at zero at its first window (a few tokens of context lost once).

Each training epoch concatenates the documents in a new order (keyed by (seed, epoch)), as fastai's LM data does;
the eval stream keeps the corpus order.

Backward language model (``reverse``; a model with ``ModelConfig.reverse``, which reads each row right to left):
the same rows are read from their end to their start. Each window is still given in text order, the next window
is the text to its left (the model's state, which stopped at the window's first token, continues there), and
``labels[:, j]`` is the token before ``input_ids[:, j]`` (its previous token; the token left of the window for j =
0). Concretely, with the rows flipped (F = rows[:, ::-1]) the windows are F's forward windows, each flipped back:
``input_ids = F[:, p : p + L][:, ::-1]``, ``labels = F[:, p + 1 : p + L + 1][:, ::-1]``; the state (epoch,
position) counts along F. Every batch then also has ``backward`` (B,), all 1, so that the objective refuses a
forward model given backward windows (or the reverse). The pretraining recipe sets ``reverse`` from the model's
config, whose flag a run started ``--init-from`` a backward LM inherits.

Both directions at once (``bidirectional``; ELMo's biLM, ``lmforge.objectives.bilm``): each batch holds the
forward window above and, as ``backward_input_ids`` / ``backward_labels`` (B, L), the backward window of the same
(epoch, position) counted along the flipped rows F, exactly what ``reverse`` would give: the two LMs read the same
rows from opposite ends, so each one's carried state meets the text it stopped at. ``reverse`` stays False.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.config import DataConfig
from lmforge.data.pretraining import read_data_state, split_documents
from lmforge.data.shards import ShardedCorpus
from lmforge.errors import LmforgeError

__all__ = ["LMStreamData", "window_length"]

_ORDER, _LENGTH = 1, 2
EVAL_SEED = 20190524
MIN_WINDOW, LENGTH_STD, LONGEST_EXTRA = 5, 5.0, 20


def window_length(bptt: int, rng: np.random.Generator) -> int:
    """Merity et al.'s variable BPTT length around ``bptt`` (see the module docstring)."""
    base = bptt if rng.random() < 0.95 else bptt / 2
    return int(min(max(MIN_WINDOW, round(rng.normal(base, LENGTH_STD))), bptt + LONGEST_EXTRA))


class LMStreamData:
    """Consecutive BPTT windows of a contiguous token stream (see the module docstring).

    The constructor has the signature of ``lmforge.data.pretraining.PretrainingData`` (``plan`` must be
    ``"stream"``; ``masking`` must be None), so the pretraining recipe builds either the same way; ``reverse``
    (also an attribute, set by the recipe once the model's config is known): a backward LM's windows.

    Raises:
        LmforgeError: an empty split; ``batches`` also when the split is too short for one window per row.
    """

    def __init__(self, corpus: ShardedCorpus | str | Path | None, data_config: DataConfig, tokenizer, *,
                 plan: str = "stream", masking: str | None = None, split: str = "train", seed: int = 0,
                 rank: int = 0, world_size: int = 1, reverse: bool = False) -> None:
        if plan != "stream" or masking is not None:
            raise LmforgeError(f"LMStreamData reads plan 'stream' without masking, not plan={plan!r}, "
                               f"masking={masking!r}")
        if split not in ("train", "eval"):
            raise LmforgeError(f"split={split!r} is not one of 'train', 'eval'")
        if world_size < 1 or not 0 <= rank < world_size:
            raise LmforgeError(f"rank={rank} must be in [0, world_size={world_size})")
        if corpus is None:
            corpus = data_config.path
        if isinstance(corpus, ShardedCorpus):
            corpus.check_tokenizer(tokenizer)
        else:
            corpus = ShardedCorpus(corpus, tokenizer)
        self.corpus, self.config, self.split = corpus, data_config, split
        self.seed, self.rank, self.world_size = int(seed), rank, world_size
        self.reverse = bool(reverse)  # a backward LM's windows (module docstring); may be set before batches()
        self.bidirectional = False  # the biLM's windows of both directions (module docstring); set by the recipe
        self.eos_id = int(tokenizer.sep_id)
        train_docs, eval_docs = split_documents(corpus.num_documents, data_config.eval_fraction)
        self.documents = train_docs if split == "train" else eval_docs
        if not len(self.documents):
            raise LmforgeError(f"{corpus.path}: the {split} split has no document (eval_fraction="
                               f"{data_config.eval_fraction}, {corpus.num_documents} document(s)); "
                               + ("set eval_fraction > 0 with at least two documents" if split == "eval" else
                                  "add documents or lower eval_fraction"))
        self.bptt = data_config.seq_len
        self.variable = data_config.variable_bptt and split == "train"
        self._key_seed = self.seed if split == "train" else EVAL_SEED
        self._epoch, self._position = 0, 0
        self._stream_cache: tuple[int, np.ndarray] | None = None
        self.num_tokens = int(np.asarray(corpus.document_lengths)[self.documents].sum()) + len(self.documents)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "position": self._position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._epoch, self._position = read_data_state(state, self.seed)

    @property
    def epoch(self) -> int:
        return self._epoch

    # ------------------------------------------------------------------ the stream
    def _stream(self, epoch: int) -> np.ndarray:
        """The epoch's documents (each + eos) as one int64 array."""
        key = epoch if self.split == "train" else 0
        if self._stream_cache is not None and self._stream_cache[0] == key:
            return self._stream_cache[1]
        docs = self.documents
        if self.split == "train":
            docs = docs[np.random.default_rng([self._key_seed, key, _ORDER, 0]).permutation(len(docs))]
        eos = np.array([self.eos_id], dtype=np.int64)
        parts = []
        for d in docs.tolist():
            parts.append(np.asarray(self.corpus.document_tokens(d), dtype=np.int64))
            parts.append(eos)
        stream = np.concatenate(parts)
        self._stream_cache = (key, stream)
        return stream

    def rows(self, n_rows: int, epoch: int = 0) -> np.ndarray:
        """The stream of ``epoch`` cut into ``n_rows`` equal rows (R, N // R); the tail that does not fill a row is
        dropped."""
        stream = self._stream(epoch)
        width = len(stream) // n_rows
        return stream[:n_rows * width].reshape(n_rows, width)

    def _check_size(self, n_rows: int, micro_batch_size: int) -> int:
        width = self.num_tokens // n_rows
        if width < self.bptt + 1:
            raise LmforgeError(
                f"the {self.split} split of {self.corpus.path} has {self.num_tokens:,} tokens: cut into {n_rows} rows "
                f"(micro-batch {micro_batch_size} x {self.world_size} process(es)) each row has {width} tokens, fewer "
                f"than one BPTT window of data.seq_len={self.bptt} + 1; add text, or lower --seq-len or "
                "--micro-batch-size")
        return width

    # ------------------------------------------------------------------ iteration
    def batches(self, micro_batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Training: endless windows, epoch after epoch, from the current state. Eval: one pass with fixed windows
        (fewer rows than ``micro_batch_size`` when the split is short, at least one)."""
        if micro_batch_size < 1:
            raise LmforgeError(f"micro_batch_size={micro_batch_size} must be >= 1")
        if self.split == "eval":
            rows = micro_batch_size
            while rows > 1 and self.num_tokens // (rows * self.world_size) < self.bptt + 1:
                rows -= 1
            self._check_size(rows * self.world_size, rows)
            return self._eval_batches(rows)
        self._check_size(micro_batch_size * self.world_size, micro_batch_size)
        return self._train_batches(micro_batch_size)

    def _reading_rows(self, n_rows: int, epoch: int) -> np.ndarray:
        """This rank's rows in reading order: flipped for a backward LM."""
        rows = self.rows(n_rows, epoch)[self.rank::self.world_size]
        return rows[:, ::-1] if self.reverse else rows

    def _window(self, rows: np.ndarray, p: int, length: int) -> dict[str, torch.Tensor]:
        x = rows[:, p:p + length]
        y = rows[:, p + 1:p + length + 1]
        if self.reverse:  # rows in reading order (flipped): the window back in text order, y = the previous tokens
            x, y = x[:, ::-1], y[:, ::-1]
        B = rows.shape[0]
        batch = {"input_ids": torch.from_numpy(np.ascontiguousarray(x)),
                 "labels": torch.from_numpy(np.ascontiguousarray(y)),
                 "attention_mask": torch.ones(x.shape, dtype=torch.long),
                 "reset": torch.full((B,), int(p == 0), dtype=torch.long)}
        if self.reverse:
            batch["backward"] = torch.ones(B, dtype=torch.long)
        if self.bidirectional:  # the biLM's backward LM: the same window of the flipped rows (reverse's windows)
            flipped = rows[:, ::-1]
            batch["backward_input_ids"] = torch.from_numpy(np.ascontiguousarray(flipped[:, p:p + length][:, ::-1]))
            batch["backward_labels"] = torch.from_numpy(
                np.ascontiguousarray(flipped[:, p + 1:p + length + 1][:, ::-1]))
        return batch

    def _eval_batches(self, B: int) -> Iterator[dict[str, torch.Tensor]]:
        rows = self._reading_rows(B * self.world_size, 0)
        last = rows.shape[1] - 1  # the last position that has a next token
        for p in range(0, last, self.bptt):
            yield self._window(rows, p, min(self.bptt, last - p))

    def _length(self, epoch: int, p: int) -> int:
        if not self.variable:
            return self.bptt
        return window_length(self.bptt, np.random.default_rng([self._key_seed, epoch, _LENGTH, p]))

    def _train_batches(self, B: int) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            epoch = self._epoch
            rows = self._reading_rows(B * self.world_size, epoch)
            last = rows.shape[1] - 1
            while self._position < last:
                p = self._position
                length = min(self._length(epoch, p), last - p)
                batch = self._window(rows, p, length)
                self._position = p + length
                yield batch
            self._epoch, self._position = epoch + 1, 0
