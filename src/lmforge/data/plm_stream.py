"""XLNet's pretraining data with segment recurrence (Yang et al. 2019, sections 2.4-2.5 and appendix A.2;
zihangdai/xlnet ``data_utils.py``): plan ``"plm"`` when ``DataConfig.reuse_len`` is set.

The split's documents, each followed by [SEP], are one stream (as the AWD-LSTM's, ``lmforge.data.lm_stream``); the
stream is cut into rows ("batchify") and rank r reads rows r, r + world_size, ... Row b of every batch continues row
b of the previous batch: the sequence at stream position p is

    ids = row[p : p + T - 1] + [SEP]          T = data.seq_len,   R = data.reuse_len,   next p = p + R

so its first R tokens are the R tokens that followed the previous sequence's reused part. Their states are what the
objective (``lmforge.objectives.plm``) keeps as the next sequence's memory, per layer the last ``mem_len``
(``ModelConfig.mem_len``) of [memory; the reused part's states], detached: after a few batches the memory holds the
reused parts of the previous sequences, the text right before this one (the original's ``cache_mem`` with
``reuse_len``). Each sequence becomes a permutation-LM example by ``plm_memory_example``: the two parts get their
own targets and factorisation orders (``data.perm_size``: XLNet's local permutation), and the reused part never
sees the rest (so the memory never holds a token that a later sequence predicts).

``data.bi_data`` (XLNet's bidirectional data pipeline): half of each micro-batch's rows read the stream forward,
the other half read the reversed stream (the stream's tokens in reverse order, cut into rows the same way); the
batch's ``reversed_rows`` (B,) marks them and the model negates the relative distances of those rows (the original
``bi_data`` positional encodings), so a reversed row's distances count in text order. The micro-batch size must
then be even.

Batch format: plan ``"plm"``'s (``lmforge.data.pretraining``: ``input_ids``, ``attention_mask``, ``token_type_ids``
all 0, ``perm_mask``, ``target_mapping``, ``target_mask``, ``labels``), and ``reset`` (B,) 1 on the first sequence
of a pass over the stream (the memory starts empty), ``reversed_rows`` (B,) with bi_data. Every sequence is full
length (no padding).

Determinism: the state is (epoch, position) as ``LMStreamData``'s; the draws of the sequence of global row g at
stream position p in epoch e come from ``default_rng([seed, e, 3, p, g])``, so a resumed run reads the same
examples. The eval split reads its stream once in corpus order, from position 0 with an empty memory.

Departures from the original pipeline, named: the original fills the rest of the sequence with two segments A and B
(B a random text half the time, a next-sentence label the loss never reads) and ends with [SEP] [CLS]; here the
rest is the stream's continuation ending with one [SEP], one segment (as this library's non-memory plan "plm",
RoBERTa's full sentences without NSP). Spans are drawn left to right in reading order also on reversed rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from lmforge.config import DataConfig
from lmforge.data.lm_stream import LMStreamData
from lmforge.data.masking import continuation_mask
from lmforge.data.permutation import default_num_predict, plm_memory_example
from lmforge.data.pretraining import collate_plm
from lmforge.data.shards import ShardedCorpus
from lmforge.errors import LmforgeError

__all__ = ["PLMStreamData"]

_DRAWS = 3


class PLMStreamData(LMStreamData):
    """Consecutive PLM sequences of a contiguous token stream, for XLNet with memory (see the module docstring).

    The constructor has ``PretrainingData``'s signature (``plan`` must be ``"plm"``, ``masking`` None, and
    ``data_config.reuse_len`` set).

    Raises:
        LmforgeError: an empty split, bad settings; ``batches`` also when the split is too short for one sequence per
            row, or an odd micro-batch with bi_data.
    """

    def __init__(self, corpus: ShardedCorpus | str | Path | None, data_config: DataConfig, tokenizer, *,
                 plan: str = "plm", masking: str | None = None, split: str = "train", seed: int = 0,
                 rank: int = 0, world_size: int = 1) -> None:
        if plan != "plm" or masking is not None:
            raise LmforgeError(f"PLMStreamData reads plan 'plm' without masking, not plan={plan!r}, "
                               f"masking={masking!r}")
        if data_config.reuse_len is None:
            raise LmforgeError("PLMStreamData needs data.reuse_len (the tokens whose states the next sequence reuses)")
        super().__init__(corpus, data_config, tokenizer, plan="stream", split=split, seed=seed, rank=rank,
                         world_size=world_size)
        self.plan = "plm"
        self.seq_len, self.reuse_len = data_config.seq_len, data_config.reuse_len
        self.bi_data, self.perm_size = bool(data_config.bi_data), data_config.perm_size
        self.num_predict = (data_config.num_predict if data_config.num_predict is not None
                            else default_num_predict(self.seq_len, data_config.partial_k))
        self.pad_id = int(tokenizer.pad_id)
        V = tokenizer.vocab_size
        self._is_special = np.zeros(V, dtype=bool)
        self._is_special[sorted(tokenizer.special_ids)] = True
        self._continuation = continuation_mask(tokenizer)

    # ------------------------------------------------------------------ rows
    def _directions(self) -> int:
        return 2 if self.bi_data else 1

    def _check_size(self, n_rows: int, micro_batch_size: int) -> int:
        width = self.num_tokens // n_rows
        if width < self.seq_len - 1:
            raise LmforgeError(
                f"the {self.split} split of {self.corpus.path} has {self.num_tokens:,} tokens: cut into {n_rows} rows "
                f"(micro-batch {micro_batch_size} x {self.world_size} process(es)"
                + (", half of them reversed for bi_data" if self.bi_data else "")
                + f") each row has {width} tokens, fewer than one sequence of data.seq_len={self.seq_len} - 1; add "
                "text, or lower --seq-len or --micro-batch-size")
        return width

    def _my_rows(self, per_direction: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows (B, width) and their global indices: the forward rows, then the reversed stream's."""
        n = per_direction * self.world_size
        forward = self.rows(n, epoch)
        parts, index = [forward[self.rank::self.world_size]], [np.arange(self.rank, n, self.world_size)]
        if self.bi_data:
            stream = self._stream(epoch)[::-1]
            width = len(stream) // n
            backward = stream[:n * width].reshape(n, width)
            parts.append(backward[self.rank::self.world_size])
            index.append(n + np.arange(self.rank, n, self.world_size))
        return np.concatenate(parts), np.concatenate(index)

    def check_micro_batch(self, micro_batch_size: int) -> None:
        """Refuse an odd micro-batch under bi_data (half its rows are reversed), before a run starts."""
        if self.bi_data and micro_batch_size % 2:
            raise LmforgeError(f"data.bi_data=true reads half of each micro-batch's rows reversed: the micro-batch "
                               f"size must be even, got {micro_batch_size}; give an even --batch-size (or "
                               "--train.micro_batch_size)")

    # ------------------------------------------------------------------ iteration
    def batches(self, micro_batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Training: endless sequences, epoch after epoch, from the current state. Eval: one pass (fewer rows than
        ``micro_batch_size`` when the split is short, at least one per direction)."""
        if micro_batch_size < 1:
            raise LmforgeError(f"micro_batch_size={micro_batch_size} must be >= 1")
        self.check_micro_batch(micro_batch_size)
        d = self._directions()
        per_direction = micro_batch_size // d
        if self.split == "eval":
            while per_direction > 1 and self.num_tokens // (per_direction * self.world_size) < self.seq_len - 1:
                per_direction -= 1
            self._check_size(per_direction * self.world_size, per_direction * d)
            return self._eval_batches(per_direction)
        self._check_size(per_direction * self.world_size, micro_batch_size)
        return self._train_batches(per_direction)

    def _sequences(self, rows: np.ndarray, index: np.ndarray, p: int, epoch: int) -> dict[str, torch.Tensor]:
        B = rows.shape[0]
        sep = np.array([self.eos_id], dtype=np.int64)
        key_epoch = epoch if self.split == "train" else 0
        examples = []
        for b in range(B):
            ids = np.concatenate([rows[b, p:p + self.seq_len - 1], sep])
            special = self._is_special[ids]
            cont = self._continuation[ids]
            word_starts = ~cont
            if self.bi_data and b >= B // 2:  # reversed text: a word starts after its original first piece
                word_starts = np.concatenate([[True], ~cont[:-1]])
            rng = np.random.default_rng([self._key_seed, key_epoch, _DRAWS, p, int(index[b])])
            examples.append(plm_memory_example(ids, reuse_len=self.reuse_len, rng=rng, special_mask=special,
                                               partial_k=self.config.partial_k, max_span=self.config.plm_max_span,
                                               num_predict=self.num_predict, word_starts=word_starts,
                                               perm_size=self.perm_size))
        batch = collate_plm(examples, self.pad_id)
        batch["reset"] = torch.full((B,), int(p == 0), dtype=torch.long)
        if self.bi_data:
            batch["reversed_rows"] = torch.arange(B) >= B // 2
        return batch

    def _positions(self, width: int) -> range:
        """The stream positions of a pass: every R tokens while a whole sequence (T - 1 tokens + [SEP]) fits."""
        return range(0, width - (self.seq_len - 1) + 1, self.reuse_len)

    def _eval_batches(self, per_direction: int) -> Iterator[dict[str, torch.Tensor]]:
        rows, index = self._my_rows(per_direction, 0)
        for p in self._positions(rows.shape[1]):
            yield self._sequences(rows, index, p, 0)

    def _train_batches(self, per_direction: int) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            epoch = self._epoch
            rows, index = self._my_rows(per_direction, epoch)
            positions = self._positions(rows.shape[1])
            while self._position in positions:
                p = self._position
                batch = self._sequences(rows, index, p, epoch)
                self._position = p + self.reuse_len
                yield batch
            self._epoch, self._position = epoch + 1, 0
