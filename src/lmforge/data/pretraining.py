"""The pretraining data the Trainer consumes: instances from a prepared corpus, masked, in micro-batches.

Batch format (a dict of torch tensors, int64 unless said otherwise; B = micro-batch size, T = the longest sequence in
the batch):

* masked-LM plans (``"nsp"``, ``"sop"``, ``"packed"``, ``"segments"``):
    - ``input_ids`` (B, T): corrupted ids, padded with the tokenizer's [PAD] id (0 for BERT vocabularies);
    - ``attention_mask`` (B, T): 1 = real token, 0 = padding;
    - ``token_type_ids`` (B, T): 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]`` (only NSP pairs have 1s), 0 at padding;
    - ``mlm_labels`` (B, T): original id at predicted positions, -100 elsewhere (padding included);
    - ``nsp_labels`` (B,): the pair plans only; ``"nsp"``: 0 = B follows A, 1 = B is random; ``"sop"``: 0 = the
      two segments in their order, 1 = swapped;
    - ``sbo_left``, ``sbo_right`` (B, T): span masking only; position of the token just before / after the
      span holding each predicted token (valid where ``mlm_labels != -100``; -1 elsewhere);
    - ``sbo_offset`` (B, T): span masking only; 0-based position of the token inside its span (0 elsewhere).
* plan ``"causal"``: ``input_ids`` (B, T), ``labels`` (B, T) = the next tokens (-100 at padding; blocks are
  full length so there is none, except with ``DataConfig.doc_aligned``, whose rows end with their document),
  ``attention_mask`` (B, T).
* plan ``"plm"`` (XLNet's permutation LM, ``lmforge.data.permutation``; N = the most prediction rows of an example
  in the batch, ``DataConfig.num_predict`` or ``ceil(seq_len / partial_k)`` when the sequences are full length):
    - ``input_ids`` (B, T): the text unchanged (XLNet does not corrupt its input), padded with [PAD];
    - ``attention_mask`` (B, T) and ``token_type_ids`` (B, T) (all 0): as the masked-LM plans;
    - ``perm_mask`` (B, T, T) bool, True = position i may NOT see position j: the QUERY stream's mask (what
      ``XLNet(perm_mask=...)`` takes; the model lets the content stream see itself). Padding: every padded column
      is True (nobody sees padding, on top of ``attention_mask``) and every padded row is all True (a padded
      position sees nothing but itself in the content stream, and is never a target, so its states are never read);
    - ``target_mapping`` (B, N, T) float32, one-hot rows at the predicted positions in increasing position order,
      zero rows after them; ``target_mask`` (B, N) bool, True on the real rows; ``labels`` (B, N) int64, the
      predicted token ids, -100 on the padding rows.

Plans (``PLANS``: how examples are cut from the corpus; each pretraining objective names its plan and masking in
``lmforge.objectives.registry``, so this module knows no objective by name):

* ``"nsp"`` — BERT: segment pairs with NSP labels (``instances.plan_nsp_document``).
* ``"sop"`` — ALBERT: consecutive segment pairs of one document, swapped half the time (``plan_sop_document``).
* ``"packed"`` — RoBERTa FULL-SENTENCES packing, no NSP, token types all 0.
* ``"segments"`` — SpanBERT: single contiguous segments of one document (the paper's single-sequence training).
* ``"causal"`` — GPT causal blocks of ``seq_len`` inputs (``seq_len + 1`` tokens with the shifted labels); no
  masking. ``DataConfig.doc_aligned``: the blocks are cut per document (``instances.DocAlignedBlocks``), at most
  ``seq_len`` inputs, each row starting at a document start.
* ``"plm"`` — XLNet: RoBERTa's ``"packed"`` instances (full sentences packed up to ``seq_len`` across documents,
  ``[CLS] ... [SEP] ... [SEP]``, so nearly every sequence is full length, as XLNet's own stream of text cut into
  blocks; no NSP, which XLNet dropped), each made into a permutation-LM example by ``plm_example``: spans of up to
  ``plm_max_span`` whole words, about ``1 / partial_k`` of the tokens, at most ``num_predict``; [CLS], [SEP] and
  the other special tokens are context, never targets. Its draws (targets, then the order) come from the masks'
  generator, so they are resumed exactly as the masks are.

Determinism without carried RNG state. Every random draw comes from a generator made from a key:

* the example order of epoch ``e``: ``default_rng([seed, e, 1, 0]).permutation(n)``;
* the segment pairs of document ``d`` in epoch ``e`` (NSP, SOP): ``default_rng([seed, e, 2, d])``;
* the masks of example ``i`` (its index in the epoch's plan, before shuffling): ``default_rng([seed, e, 3, i])``
  (plan ``"plm"``: its prediction targets and factorisation order).

(The constant third element keeps the three streams apart; keys all have four elements because NumPy's
SeedSequence treats ``[a, b]`` and ``[a, b, 0]`` as the same seed.) So a position — (epoch, number of examples
consumed) — is the whole iteration state: ``state_dict()`` returns it and ``load_state_dict`` resumes with
exactly the batches the uninterrupted run would have produced.

An epoch:

* dynamic mode (default), plan ``"nsp"``: one pass over the training documents producing their segment pairs
  (new pairs and new masks each epoch, as RoBERTa's dynamic masking; BERT's code made them once);
* dynamic mode, other plans: one pass over the fixed packed instances / segments / blocks (they depend
  on the corpus only), with new masks each epoch;
* static mode (``DataConfig.static``, BERT's original recipe): ``dupe_factor`` copies of the instances, each with
  its own pairs (NSP) and masks, the same every epoch. The masks are re-derived from their fixed keys when
  needed instead of being stored — the same examples, without holding them in memory.

In every epoch the examples are shuffled; rank ``r`` of ``world_size`` takes examples ``r, r + world_size, ...``
of the order, ``micro_batch_size`` at a time, so all ranks take the same number per step and together see every
example once. The tail of an epoch that cannot fill one micro-batch on every rank is dropped (the next epoch's
order differs, so no example is left out systematically).

The eval split: a fixed fraction of the documents (``DataConfig.eval_fraction``, at least one document when
the corpus has two or more; at least two for plan ``"nsp"`` when the corpus has four or more, so that random
next segments can be drawn inside the split), chosen by a permutation with a constant seed (``SPLIT_SEED``),
the same for every training seed, and never used for training. Its examples and masks come from the constant
``EVAL_SEED``, so every evaluation sees the same batches. One evaluation is one pass, in plan order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.config import DataConfig
from lmforge.data.instances import (
    PAIR_PLANS,
    PLANS,
    CausalBlocks,
    DocAlignedBlocks,
    NspSpec,
    materialize_nsp,
    materialize_pieces,
    nsp_error,
    plan_nsp_document,
    plan_packed,
    plan_segments,
    plan_sop_document,
)
from lmforge.data.masking import IGNORE_INDEX, continuation_mask, mask_tokens
from lmforge.data.permutation import default_num_predict, plm_example
from lmforge.data.shards import ShardedCorpus
from lmforge.errors import LmforgeError

__all__ = ["EVAL_SEED", "SPLIT_SEED", "PretrainingData", "collate_causal", "collate_masked", "collate_plm",
           "split_documents"]

SPLIT_SEED = 0
EVAL_SEED = 20190524  # any constant: evaluation must not depend on the training seed
_ORDER, _INSTANCES, _MASKS = 1, 2, 3
_UNMASKED_PLANS = ("causal", "plm")  # plans whose examples take no masking strategy

log = logging.getLogger("lmforge")
_warned_caps: set[tuple[int, int, float]] = set()  # (cap, seq_len, mask_prob) already warned about in this process


def _warn_low_cap(cap: int, seq_len: int, mask_prob: float) -> None:
    """Warn (once per process and setting) that ``max_predictions`` keeps the realised rate below ``mask_prob``."""
    wanted = round(mask_prob * seq_len)
    key = (cap, seq_len, float(mask_prob))
    if cap >= wanted or key in _warned_caps:
        return
    _warned_caps.add(key)
    log.warning("data.max_predictions=%d caps the masked-LM predictions below mask_prob=%g of seq_len=%d "
                "(%d tokens): only %.1f%% of a full sequence is predicted; unset max_predictions to follow "
                "the length", cap, mask_prob, seq_len, wanted, 100.0 * cap / seq_len)


def read_data_state(state: dict[str, Any], seed: int) -> tuple[int, int]:
    """(epoch, position) of a data iterator's saved ``state_dict``; a state saved with another seed is refused."""
    try:
        epoch, position = int(state["epoch"]), int(state["position"])
    except (KeyError, TypeError, ValueError) as err:
        raise LmforgeError(f"data state {state!r} lacks an integer epoch and position") from err
    if "seed" in state and int(state["seed"]) != seed:
        raise LmforgeError(f"the data state was saved with seed {state['seed']} but this run uses seed {seed}; "
                           "resume with the same seed")
    return epoch, position


def split_documents(num_documents: int, eval_fraction: float, *, min_eval: int = 1
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Training and eval document indices (each sorted), by a permutation seeded with ``SPLIT_SEED``.

    The eval split has ``round(eval_fraction * num_documents)`` documents, at least ``min_eval`` (when
    ``eval_fraction > 0`` and the corpus has two or more documents) and at most ``num_documents - 1``.
    """
    if eval_fraction <= 0 or num_documents < 2:
        return np.arange(num_documents), np.arange(0)
    n_eval = min(max(min_eval, round(eval_fraction * num_documents)), num_documents - 1)
    order = np.random.default_rng([SPLIT_SEED, num_documents, 0, 0]).permutation(num_documents)
    return np.sort(order[n_eval:]), np.sort(order[:n_eval])


def collate_masked(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad masked-LM examples to the longest one into the batch format of the module docstring."""
    B = len(examples)
    T = max(len(e["input_ids"]) for e in examples)
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    attention = np.zeros((B, T), dtype=np.int64)
    types = np.zeros((B, T), dtype=np.int64)
    labels = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
    has_sbo = examples[0].get("sbo_left") is not None
    if has_sbo:
        left = np.full((B, T), -1, dtype=np.int64)
        right = np.full((B, T), -1, dtype=np.int64)
        offset = np.zeros((B, T), dtype=np.int64)
    for b, e in enumerate(examples):
        n = len(e["input_ids"])
        input_ids[b, :n] = e["input_ids"]
        attention[b, :n] = 1
        types[b, :n] = e["token_type_ids"]
        labels[b, :n] = e["mlm_labels"]
        if has_sbo:
            left[b, :n], right[b, :n], offset[b, :n] = e["sbo_left"], e["sbo_right"], e["sbo_offset"]
    batch = {"input_ids": input_ids, "attention_mask": attention, "token_type_ids": types, "mlm_labels": labels}
    if "nsp_label" in examples[0]:
        batch["nsp_labels"] = np.array([e["nsp_label"] for e in examples], dtype=np.int64)
    if has_sbo:
        batch.update(sbo_left=left, sbo_right=right, sbo_offset=offset)
    return {k: torch.from_numpy(v) for k, v in batch.items()}


def collate_plm(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad permutation-LM examples (``plm_example``'s arrays) into the ``"plm"`` batch format of the module docstring:
    T = the longest sequence, N = the most prediction rows."""
    B = len(examples)
    T = max(len(e["input_ids"]) for e in examples)
    N = max(len(e["labels"]) for e in examples)
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    attention = np.zeros((B, T), dtype=np.int64)
    perm_mask = np.ones((B, T, T), dtype=bool)  # padded rows and columns: see nothing, seen by nobody
    target_mapping = np.zeros((B, N, T), dtype=np.float32)
    target_mask = np.zeros((B, N), dtype=bool)
    labels = np.full((B, N), IGNORE_INDEX, dtype=np.int64)
    for b, e in enumerate(examples):
        n, rows = len(e["input_ids"]), len(e["labels"])
        input_ids[b, :n] = e["input_ids"]
        attention[b, :n] = 1
        perm_mask[b, :n, :n] = e["query_perm_mask"]
        target_mapping[b, :rows, :n] = e["target_mapping"]
        target_mask[b, :rows] = e["target_mask"]
        labels[b, :rows] = e["labels"]
    batch = {"input_ids": input_ids, "attention_mask": attention, "token_type_ids": np.zeros((B, T), dtype=np.int64),
             "perm_mask": perm_mask, "target_mapping": target_mapping, "target_mask": target_mask, "labels": labels}
    return {k: torch.from_numpy(v) for k, v in batch.items()}


def collate_causal(blocks: Sequence[np.ndarray], pad_id: int) -> dict[str, torch.Tensor]:
    """Blocks of ``L + 1`` tokens -> ``input_ids`` = block[:-1], ``labels`` = block[1:], padded if needed."""
    B = len(blocks)
    T = max(len(b) for b in blocks) - 1
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    labels = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
    attention = np.zeros((B, T), dtype=np.int64)
    for i, block in enumerate(blocks):
        n = len(block) - 1
        input_ids[i, :n] = block[:-1]
        labels[i, :n] = block[1:]
        attention[i, :n] = 1
    return {"input_ids": torch.from_numpy(input_ids), "labels": torch.from_numpy(labels),
            "attention_mask": torch.from_numpy(attention)}


class PretrainingData:
    """Micro-batches of pretraining examples with exact resumption and per-rank sharding.

    BERT (Devlin et al., 2019), RoBERTa (Liu et al., 2019), SpanBERT (Joshi et al., 2020), GPT and XLNet (Yang et
    al., 2019) inputs from a ``ShardedCorpus``; see the module docstring for the batch format, the epochs and the
    determinism.

    Args:
        corpus: a ``ShardedCorpus``, the path of a prepared folder, or ``None`` for ``data_config.path``.
        data_config: lengths, masking options, static/dynamic, eval fraction.
        plan: how examples are cut (``PLANS``).
        masking: the masking strategy of the masked-LM plans (``None`` for ``"causal"`` and ``"plm"``).
        tokenizer: the ``WordPieceTokenizer`` the corpus was prepared with (checked by hash).
        split: ``"train"`` or ``"eval"``.
        seed: the training seed (>= 0); the eval split ignores it (constant ``EVAL_SEED``).
        rank, world_size: this process's place under data parallelism.

    Raises:
        TooFewDocumentsError: plan "nsp" with fewer than two documents in the split (an ``LmforgeError``;
            the recipe catches it to fall back to the objective's ``fallback``).
        LmforgeError: an empty split, a mismatched tokenizer.
    """

    def __init__(self, corpus: ShardedCorpus | str | Path | None, data_config: DataConfig, tokenizer, *, plan: str,
                 masking: str | None, split: str = "train", seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> None:
        if plan not in PLANS:
            raise LmforgeError(f"plan={plan!r} is not one of {', '.join(PLANS)}")
        if split not in ("train", "eval"):
            raise LmforgeError(f"split={split!r} is not one of 'train', 'eval'")
        if world_size < 1 or not 0 <= rank < world_size:
            raise LmforgeError(f"rank={rank} must be in [0, world_size={world_size})")
        if not isinstance(seed, int | np.integer) or seed < 0:
            raise LmforgeError(f"seed={seed!r} must be a non-negative integer")
        if corpus is None:
            if not data_config.path:
                raise LmforgeError("no prepared corpus: set data.path to the folder `lmforge data prepare` wrote")
            corpus = data_config.path
        if isinstance(corpus, ShardedCorpus):
            corpus.check_tokenizer(tokenizer)
        else:
            corpus = ShardedCorpus(corpus, tokenizer)
        self.corpus, self.config, self.tokenizer = corpus, data_config, tokenizer
        self.split, self.seed, self.rank, self.world_size = split, int(seed), rank, world_size
        self.plan, self.masking = plan, (None if plan in _UNMASKED_PLANS else masking)
        # the prediction budget follows the length unless the run caps it (BERT: 20 at 128 tokens, 76-80 at 512)
        self.max_predictions = (data_config.max_predictions if data_config.max_predictions is not None
                                else max(1, round(data_config.mask_prob * data_config.seq_len)))
        if self.masking is None and plan not in _UNMASKED_PLANS:
            raise LmforgeError(f"plan {plan!r} makes masked-LM examples: give a masking strategy")
        if self.masking is not None and rank == 0:
            _warn_low_cap(self.max_predictions, data_config.seq_len, data_config.mask_prob)
        # plan "plm": the prediction rows of a full-length sequence (DataConfig validated them against seq_len)
        self.num_predict = (data_config.num_predict if data_config.num_predict is not None
                            else default_num_predict(data_config.seq_len, data_config.partial_k))
        nsp = plan == "nsp"  # random next segments need other documents; SOP's pairs never leave their document
        n_docs = corpus.num_documents
        train_docs, eval_docs = split_documents(n_docs, data_config.eval_fraction,
                                                min_eval=2 if nsp and n_docs >= 4 else 1)
        self.documents = train_docs if split == "train" else eval_docs
        if split == "eval" and not len(eval_docs):
            if data_config.eval_fraction <= 0:
                raise LmforgeError(f"{corpus.path}: there is no eval split (eval_fraction="
                                   f"{data_config.eval_fraction}); set --data.eval_fraction above 0 to hold "
                                   "documents out")
            raise LmforgeError(f"{corpus.path}: there is no eval split: the corpus is {n_docs} document, and whole "
                               "documents are held out; if each line of the text is a text of its own (tweets, "
                               "questions, reviews), prepare it again with --format texts, else give more than one "
                               "document")
        if nsp and len(self.documents) < 2:
            detail = ""
            if len(self.documents) < n_docs:
                detail = (f" (the {split} split has {len(self.documents)} of the corpus's {n_docs} documents; "
                          f"eval_fraction={data_config.eval_fraction} holds some out)")
            raise nsp_error(len(self.documents), detail)
        self.static = data_config.static and split == "train" and plan != "causal"
        self._key_seed = self.seed if split == "train" else EVAL_SEED
        # token tables
        V = tokenizer.vocab_size
        self._is_special = np.zeros(V, dtype=bool)
        self._is_special[sorted(tokenizer.special_ids)] = True
        exists = np.array([t is not None for t in tokenizer.ids_to_tokens], dtype=bool)
        self._non_special = np.flatnonzero(exists & ~self._is_special)
        self._continuation = continuation_mask(tokenizer)
        self._tokens_of = corpus.document_tokens
        # plans that depend on the corpus only
        T = data_config.seq_len
        if plan in ("packed", "plm"):
            self._fixed = plan_packed(self.documents, corpus.sentence_offsets, T)
        elif plan == "segments":
            self._fixed = plan_segments(self.documents, corpus.sentence_offsets, T)
        elif plan == "causal":
            blocks = DocAlignedBlocks if data_config.doc_aligned else CausalBlocks
            self._fixed = blocks(corpus, T, eos_id=tokenizer.sep_id, documents=self.documents)
        else:  # "nsp": pairs drawn anew every epoch (or dupe_factor times when static)
            self._fixed = None
        self._plan_cache: tuple[int, Any] | None = None
        self._epoch = 0
        self._position = 0

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, int]:
        """The iteration position: epoch and examples consumed in it (over all ranks), and the seed."""
        return {"epoch": self._epoch, "position": self._position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a ``state_dict()``; call ``batches`` afterwards (a running iterator is not rewound)."""
        epoch, position = read_data_state(state, self.seed)
        if epoch < 0 or position < 0:
            raise LmforgeError(f"data state epoch={epoch}, position={position} must be >= 0")
        self._epoch, self._position = epoch, position

    @property
    def epoch(self) -> int:
        return self._epoch

    # ------------------------------------------------------------------ plans
    def _nsp_plan(self, epoch: int) -> list[NspSpec]:
        """The segment pairs of an epoch: BERT's NSP pairs, or ALBERT's sentence-order pairs (plan "sop")."""
        specs: list[NspSpec] = []
        cfg = self.config
        for doc in self.documents.tolist():
            rng = np.random.default_rng([self._key_seed, epoch, _INSTANCES, doc])
            if self.plan == "sop":
                specs.extend(plan_sop_document(doc, self.corpus.sentence_offsets(doc), rng, seq_len=cfg.seq_len,
                                               short_seq_prob=cfg.short_seq_prob, sop_prob=cfg.nsp_prob))
                continue
            specs.extend(plan_nsp_document(doc, self.corpus.sentence_offsets(doc), rng, seq_len=cfg.seq_len,
                                           short_seq_prob=cfg.short_seq_prob, nsp_prob=cfg.nsp_prob,
                                           pool=self.documents, offsets_of=self.corpus.sentence_offsets,
                                           balance=cfg.nsp_balance))
        return specs

    def _plan(self, epoch: int) -> Any:
        """The examples of an epoch as specs (anything with ``len`` and indexing)."""
        key = 0 if (self.static or self.split == "eval") else epoch
        if self._plan_cache is not None and self._plan_cache[0] == key:
            return self._plan_cache[1]
        if self._fixed is not None:
            plan = self._fixed if not self.static else _Repeated(self._fixed, self.config.dupe_factor)
        elif self.static:
            plan = [s for d in range(self.config.dupe_factor) for s in self._nsp_plan(d)]
        else:
            plan = self._nsp_plan(key)
        self._plan_cache = (key, plan)
        return plan

    def examples_per_epoch(self, epoch: int | None = None) -> int:
        """The number of examples (all ranks together) of an epoch; for dynamic NSP it varies a little."""
        return len(self._plan(self._epoch if epoch is None else epoch))

    # ------------------------------------------------------------------ examples
    def _example(self, plan: Any, i: int, epoch: int) -> Any:
        spec = plan[i]
        if self.plan == "causal":
            return spec
        if isinstance(spec, NspSpec):
            inst = materialize_nsp(spec, self._tokens_of, self.tokenizer.cls_id, self.tokenizer.sep_id)
        else:
            inst = materialize_pieces(spec, self._tokens_of, self.tokenizer.cls_id, self.tokenizer.sep_id)
        mask_epoch = 0 if (self.static or self.split == "eval") else epoch
        rng = np.random.default_rng([self._key_seed, mask_epoch, _MASKS, i])
        ids = inst.input_ids
        cfg = self.config
        if self.plan == "plm":
            return self._plm_example(ids, rng)
        word_starts = None if self.masking == "token" else ~self._continuation[ids]
        m = mask_tokens(ids, special_mask=self._is_special[ids], vocab_size=len(self._is_special),
                        non_special_ids=self._non_special, mask_id=self.tokenizer.mask_id, rng=rng,
                        mask_prob=cfg.mask_prob, max_predictions=self.max_predictions,
                        mask_token_ratio=cfg.mask_token_ratio, random_token_ratio=cfg.random_token_ratio,
                        strategy=self.masking, word_starts=word_starts, span_p=cfg.span_p,
                        max_span_len=cfg.max_span_len, max_ngram=cfg.max_ngram)
        example = {"input_ids": m.input_ids, "token_type_ids": inst.token_type_ids, "mlm_labels": m.labels,
                   "sbo_left": m.sbo_left, "sbo_right": m.sbo_right, "sbo_offset": m.sbo_offset}
        if self.plan in PAIR_PLANS:
            example["nsp_label"] = inst.nsp_label
        return example

    def _plm_example(self, ids: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """XLNet's permutation-LM example of one packed sequence: whole-word spans (the original code's intent),
        ``min(num_predict, len(ids))`` prediction rows (a short last sequence gets fewer; the batch pads them)."""
        cfg = self.config
        special = self._is_special[ids]
        rows = min(self.num_predict, len(ids))
        if not (~special).any():  # e.g. "[CLS] [UNK] [SEP]": nothing to predict, every position is context
            T = len(ids)
            return {"input_ids": ids, "query_perm_mask": np.eye(T, dtype=bool),
                    "target_mapping": np.zeros((rows, T), dtype=np.float32), "target_mask": np.zeros(rows, dtype=bool),
                    "labels": np.full(rows, IGNORE_INDEX, dtype=np.int64)}
        return plm_example(ids, rng=rng, special_mask=special, partial_k=cfg.partial_k, max_span=cfg.plm_max_span,
                           num_predict=rows, word_starts=~self._continuation[ids])

    def _collate(self, examples: list[Any]) -> dict[str, torch.Tensor]:
        if self.plan == "causal":
            return collate_causal(examples, self.tokenizer.pad_id)
        if self.plan == "plm":
            return collate_plm(examples, self.tokenizer.pad_id)
        return collate_masked(examples, self.tokenizer.pad_id)

    def _order(self, epoch: int, n: int) -> np.ndarray:
        return np.random.default_rng([self._key_seed, epoch, _ORDER, 0]).permutation(n)

    def _too_small(self, n: int, micro_batch_size: int) -> LmforgeError:
        step = micro_batch_size * self.world_size
        return LmforgeError(
            f"the {self.split} split of {self.corpus.path} yields {n} example(s) per epoch "
            f"({len(self.documents)} documents, plan {self.plan!r}, seq_len {self.config.seq_len}), "
            f"fewer than one micro-batch on every rank ({self.world_size} x {micro_batch_size} = {step}); add "
            "text to the corpus, or lower the micro-batch size, the number of processes or seq_len")

    # ------------------------------------------------------------------ iteration
    def batches(self, micro_batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Micro-batches for this rank.

        Training: endless, epoch after epoch, from the current state; the state advances as each batch is
        handed out, so ``state_dict()`` taken after receiving batch k resumes at batch k + 1.
        Eval: one pass over the eval split, the same batches every call (the last one may be smaller).

        Raises:
            LmforgeError: the split cannot fill one micro-batch on every rank.
        """
        if micro_batch_size < 1:
            raise LmforgeError(f"micro_batch_size={micro_batch_size} must be >= 1")
        n = len(self._plan(self._epoch))
        if self.split == "eval":
            if n < self.world_size:
                raise self._too_small(n, 1)
            return self._eval_batches(micro_batch_size)
        if n < micro_batch_size * self.world_size:
            raise self._too_small(n, micro_batch_size)
        return self._train_batches(micro_batch_size)

    def _eval_batches(self, B: int) -> Iterator[dict[str, torch.Tensor]]:
        plan = self._plan(0)
        n = len(plan)
        mine = np.arange(self.rank, n - n % self.world_size, self.world_size)
        for s in range(0, len(mine), B):
            yield self._collate([self._example(plan, int(i), 0) for i in mine[s:s + B]])

    def _train_batches(self, B: int) -> Iterator[dict[str, torch.Tensor]]:
        step = B * self.world_size
        while True:
            epoch = self._epoch
            plan = self._plan(epoch)
            n = len(plan)
            if n < step:
                raise self._too_small(n, B)
            order = self._order(epoch, n)
            while self._position + step <= n:
                p = self._position
                picked = order[p + self.rank:p + step:self.world_size]
                batch = self._collate([self._example(plan, int(i), epoch) for i in picked])
                self._position = p + step
                yield batch
            self._epoch, self._position = epoch + 1, 0


class _Repeated:
    """``times`` copies of a plan, indexable as one (static mode's dupe_factor)."""

    def __init__(self, plan: Any, times: int) -> None:
        self.plan, self.times = plan, times

    def __len__(self) -> int:
        return len(self.plan) * self.times

    def __getitem__(self, i: int) -> Any:
        return self.plan[i % len(self.plan)]
