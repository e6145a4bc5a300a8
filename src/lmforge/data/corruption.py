"""Text corruptions for denoising pretraining (BART, Lewis et al. 2020, section 2.2 and Figure 2), over numpy arrays
with a passed-in generator, and the data stream of ``lmforge pretrain --objective denoise``.

Every function takes one sequence ``ids`` (T,) and a ``candidates`` (T,) bool mask of the tokens it may touch
(never special tokens: [CLS], [SEP], [MASK], padding); all their random choices are drawn from the caller's
``np.random.Generator``, so the same generator state gives the same output (a data stream keyed per example is
resumed exactly, see ``DenoisingData``).

* ``substitute_tokens`` — token substitution, generic: ``round(rate * n)`` of the ``n`` candidate positions, chosen
  uniformly without replacement, get new ids from a ``replacement(positions, rng)`` callable. A ``UnigramSampler``
  draws them from the corpus's unigram distribution; a constant [MASK] gives BERT-style token masking (BART's "token
  masking"); ELECTRA passes its generator's samples.
* ``delete_tokens`` — token deletion: ``round(rate * n)`` candidates, chosen uniformly, are removed (the model must
  find where text is missing).
* ``infill_spans`` — text infilling: span lengths are drawn from Poisson(lambda = 3) until they cover
  ``round(rate * n)`` tokens (the last length trimmed to the budget), each span is replaced by ONE [MASK] (the model
  must also predict how many tokens are missing), and a zero-length span inserts a [MASK]. BART masks 30% of the
  tokens this way.
* ``permute_sentences`` — sentence permutation: whole sentences are shuffled (``share`` of them, 1 = all, BART).
* ``rotate_document`` — document rotation: a candidate token chosen uniformly becomes the start of the text; the
  special tokens around the text ([CLS] before, [SEP] after) stay in place.
* ``Corruption`` — a mix of the above with a rate each, applied in a fixed order (see its docstring).

Span details of text infilling, where the paper is silent:

* Spans never overlap and never cross a non-candidate token (a [SEP] between documents); they may touch (two
  adjacent [MASK]s). They are placed longest first, each at a uniformly random start among those where it fits; a
  length that no longer fits anywhere is lowered to the longest that does (rare at a 30% budget), then zero-length
  spans are placed at uniformly random gaps: before an unmasked candidate, or just after the last candidate of a
  stretch, at most one insertion per gap.
* ``max_length``: only insertions make a sequence longer; when the corrupted sequence would exceed ``max_length``,
  the insertions drawn last are dropped until it fits (the model's position table bounds the source).
* Tokens, not whole words, are the unit (BART's paper speaks of tokens; fairseq's code can also mask whole words).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from lmforge.config import DataConfig
from lmforge.data.pretraining import PretrainingData
from lmforge.data.seq2seq import collate_pairs
from lmforge.errors import LmforgeError

__all__ = [
    "Corruption", "DenoisingData", "Infilled", "UnigramSampler", "choose_positions", "corruption_budget",
    "delete_tokens", "infill_spans", "permute_sentences", "rotate_document", "substitute_tokens", "unigram_counts",
]

# replacement(positions (k,), rng) -> new ids (k,): where substituted tokens come from
Replacement = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def corruption_budget(n_candidates: int, rate: float) -> int:
    """Tokens a corruption of ``rate`` touches among ``n_candidates``: ``round(rate * n)`` (0 when rate is 0)."""
    if not 0.0 <= rate <= 1.0:
        raise LmforgeError(f"a corruption rate must be in [0, 1]; got {rate}")
    return int(round(rate * n_candidates))


def _check(ids: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(ids, dtype=np.int64)
    candidates = np.asarray(candidates, dtype=bool)
    if ids.ndim != 1 or candidates.shape != ids.shape:
        raise LmforgeError(f"a corruption takes one sequence: ids {ids.shape} and candidates {candidates.shape} must "
                           "be the same 1-D shape")
    return ids, candidates


def choose_positions(candidates: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    """(k,) sorted positions: ``round(rate * n)`` of the candidates, uniformly without replacement."""
    positions = np.flatnonzero(candidates)
    k = corruption_budget(len(positions), rate)
    return np.sort(rng.choice(positions, size=k, replace=False)) if k else positions[:0]


# ---------------------------------------------------------------------------------------------------- substitution
class UnigramSampler:
    """Draws token ids with probability proportional to ``counts`` (the corpus's unigram distribution).

    Callable as a ``Replacement``: ``sampler(positions, rng)`` returns ``len(positions)`` independent draws (the
    positions themselves do not matter). Ids whose count is 0 (special tokens: pass them as ``exclude``) are never
    drawn. One uniform draw per token, inverted through the cumulative counts.

    Args:
        counts: (V,) non-negative token counts.
        exclude: ids never drawn, whatever their count (e.g. the special ids).
    """

    def __init__(self, counts: np.ndarray, exclude: np.ndarray | list[int] | None = None) -> None:
        counts = np.asarray(counts, dtype=np.float64).copy()
        if counts.ndim != 1 or (counts < 0).any() or not np.isfinite(counts).all():
            raise LmforgeError("unigram counts must be a 1-D array of finite non-negative numbers")
        if exclude is not None:
            counts[np.asarray(exclude, dtype=np.int64)] = 0.0
        if counts.sum() <= 0:
            raise LmforgeError("the unigram table has no token to draw (every count is 0); the corpus has no text")
        self.cdf = np.cumsum(counts)  # (V,)

    @property
    def probabilities(self) -> np.ndarray:
        """(V,) the distribution drawn from."""
        return np.diff(self.cdf, prepend=0.0) / self.cdf[-1]

    def __call__(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        u = rng.random(len(positions)) * self.cdf[-1]
        return np.minimum(np.searchsorted(self.cdf, u, side="right"), len(self.cdf) - 1).astype(np.int64)


def unigram_counts(corpus: Any, vocab_size: int, documents: Any = None) -> np.ndarray:
    """(V,) int64 token counts of a ``ShardedCorpus``'s documents (default: all)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for doc in range(corpus.num_documents) if documents is None else documents:
        counts += np.bincount(np.asarray(corpus.document_tokens(int(doc)), dtype=np.int64), minlength=vocab_size)
    return counts


def substitute_tokens(ids: np.ndarray, *, candidates: np.ndarray, rate: float, rng: np.random.Generator,
                      replacement: Replacement) -> tuple[np.ndarray, np.ndarray]:
    """Token substitution: replace ``round(rate * n)`` candidate tokens (see the module docstring).

    Args:
        ids: (T,) token ids.
        candidates: (T,) bool, True where a token may be replaced.
        rate: share of the candidates replaced.
        rng: draws the positions, then whatever ``replacement`` draws.
        replacement: ``(positions (k,), rng) -> ids (k,)``: a ``UnigramSampler``, a constant [MASK], a generator's
            samples (ELECTRA). A drawn id may equal the original one (ELECTRA then labels the token "original").

    Returns:
        (corrupted ids (T,), the replaced positions (k,), sorted).
    """
    ids, candidates = _check(ids, candidates)
    positions = choose_positions(candidates, rate, rng)
    out = ids.copy()
    if len(positions):
        new = np.asarray(replacement(positions, rng), dtype=np.int64)
        if new.shape != positions.shape:
            raise LmforgeError(f"the replacement gave {new.shape} ids for {len(positions)} positions")
        out[positions] = new
    return out, positions


def delete_tokens(ids: np.ndarray, *, candidates: np.ndarray, rate: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Token deletion: remove ``round(rate * n)`` candidate tokens chosen uniformly.

    Returns:
        (the shorter ids (T - k,), the deleted positions (k,) of the input, sorted).
    """
    ids, candidates = _check(ids, candidates)
    positions = choose_positions(candidates, rate, rng)
    keep = np.ones(len(ids), dtype=bool)
    keep[positions] = False
    return ids[keep], positions


# ---------------------------------------------------------------------------------------------------- infilling
class Infilled(NamedTuple):
    """What ``infill_spans`` returns.

    Attributes:
        input_ids: (T',) the corrupted sequence, one [MASK] per span.
        spans: (k, 2) ``[start, end)`` of every span in the input, in drawing order; ``start == end`` is an
            insertion (a [MASK] put before position ``start``).
    """

    input_ids: np.ndarray
    spans: np.ndarray


def poisson_span_lengths(budget: int, poisson_lambda: float, rng: np.random.Generator) -> list[int]:
    """Poisson(lambda) lengths drawn until they sum to at least ``budget``, the last one trimmed to it exactly."""
    if not poisson_lambda > 0:
        raise LmforgeError(f"poisson_lambda={poisson_lambda} must be > 0 (BART 3)")
    lengths: list[int] = []
    covered = 0
    while covered < budget:
        length = int(rng.poisson(poisson_lambda))
        length = min(length, budget - covered)
        lengths.append(length)
        covered += length
    return lengths


def infill_spans(ids: np.ndarray, *, candidates: np.ndarray, rate: float, rng: np.random.Generator, mask_id: int,
                 poisson_lambda: float = 3.0, max_length: int | None = None) -> Infilled:
    """Text infilling (BART): Poisson-length spans covering ``round(rate * n)`` candidates, each replaced by one
    [MASK]; zero-length spans insert a [MASK] (see the module docstring for the placement).

    Args:
        ids: (T,) token ids.
        candidates: (T,) bool, True where a token may be masked.
        rate: share of the candidates masked (BART 0.3).
        rng: draws the lengths, then the placements.
        mask_id: the id of [MASK].
        poisson_lambda: the mean span length (BART 3).
        max_length: the longest corrupted sequence allowed (None: no bound); insertions are dropped to fit.

    Returns:
        ``Infilled(input_ids, spans)``.
    """
    ids, candidates = _check(ids, candidates)
    T = len(ids)
    lengths = poisson_span_lengths(corruption_budget(int(candidates.sum()), rate), poisson_lambda, rng)
    spans = np.zeros((len(lengths), 2), dtype=np.int64)
    taken = np.zeros(T, dtype=bool)
    for k in sorted(range(len(lengths)), key=lambda j: -lengths[j]):  # longest first: they are the hardest to fit
        length = lengths[k]
        if length == 0:
            break  # the rest are insertions, placed below
        free = np.concatenate([[0], np.cumsum(candidates & ~taken)])  # (T + 1,)
        good = np.zeros(0, dtype=np.int64)
        while length >= 1:
            starts = np.arange(T - length + 1)
            good = np.flatnonzero(free[starts + length] - free[starts] == length)
            if len(good):
                break
            length -= 1
        if not len(good):  # no candidate left unmasked: this span and the shorter ones become nothing
            spans[k] = (T, T)
            lengths[k] = -1
            continue
        start = int(good[rng.integers(len(good))])
        taken[start:start + length] = True
        lengths[k] = length
        spans[k] = (start, start + length)
    inserts = [k for k, length in enumerate(lengths) if length == 0]
    if inserts:
        free = candidates & ~taken
        gaps = np.zeros(T + 1, dtype=bool)  # gaps[g]: a [MASK] may go before position g
        gaps[:T] = free
        gaps[1:] |= free & np.append(~candidates[1:], True)  # just after the last candidate of a stretch
        chosen = rng.permutation(np.flatnonzero(gaps))[:len(inserts)]
        for k, g in zip(inserts, chosen.tolist(), strict=False):
            spans[k] = (g, g)
        for k in inserts[len(chosen):]:  # more insertions than gaps (a tiny text): those are not made
            lengths[k] = -1
    made = [k for k, length in enumerate(lengths) if length >= 0]
    if max_length is not None:
        growth = T - sum(lengths[k] for k in made) + len(made) - max_length
        for k in reversed([k for k in made if lengths[k] == 0]):
            if growth <= 0:
                break
            lengths[k], growth = -1, growth - 1
        made = [k for k in made if lengths[k] >= 0]
    spans = spans[made]
    # one [MASK] per span, in position order; an insertion at g goes before a span starting at g
    pieces: list[np.ndarray] = []
    at = 0
    mask = np.array([mask_id], dtype=np.int64)
    for start, end in sorted(spans.tolist(), key=lambda s: (s[0], s[1] > s[0])):
        pieces += [ids[at:start], mask]
        at = max(at, end)
    pieces.append(ids[at:])
    return Infilled(np.concatenate(pieces), spans)


# ---------------------------------------------------------------------------------------------------- reordering
def permute_sentences(ids: np.ndarray, sentence_bounds: np.ndarray, rng: np.random.Generator,
                      share: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Sentence permutation: shuffle whole sentences.

    ``round(share * n)`` of the n sentences, chosen uniformly, are shuffled among their own slots (share 1: a
    uniformly random permutation of all of them, BART); tokens before the first and after the last bound (e.g.
    [CLS] and [SEP]) stay in place.

    Args:
        ids: (T,) token ids.
        sentence_bounds: (n + 1,) increasing positions: sentence j is ``ids[bounds[j]:bounds[j + 1]]``.
        rng: draws the chosen sentences and their order.
        share: share of the sentences that move.

    Returns:
        (the permuted ids (T,), order (n,): the output's j-th sentence is the input's ``order[j]``).
    """
    ids = np.asarray(ids, dtype=np.int64)
    bounds = np.asarray(sentence_bounds, dtype=np.int64)
    n = len(bounds) - 1
    if bounds.ndim != 1 or n < 0 or (np.diff(bounds) < 0).any() or bounds[0] < 0 or bounds[-1] > len(ids):
        raise LmforgeError(f"sentence_bounds {bounds.tolist()} must be increasing positions within the {len(ids)} "
                           "tokens")
    order = np.arange(n)
    chosen = np.sort(rng.choice(n, size=corruption_budget(n, share), replace=False)) if n else order
    order[chosen] = chosen[rng.permutation(len(chosen))]
    parts = [ids[:bounds[0]], *(ids[bounds[j]:bounds[j + 1]] for j in order.tolist()), ids[bounds[-1]:]]
    return np.concatenate(parts), order


def rotate_document(ids: np.ndarray, *, candidates: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Document rotation: a candidate token chosen uniformly becomes the first token of the text.

    The text is the stretch from the first to the last candidate (inner special tokens included, e.g. a [SEP]
    between packed documents); the tokens outside it ([CLS], the final [SEP]) stay.

    Returns:
        (the rotated ids (T,), the input position that now starts the text; -1 when there is no candidate).
    """
    ids, candidates = _check(ids, candidates)
    positions = np.flatnonzero(candidates)
    if not len(positions):
        return ids.copy(), -1
    lo, hi = int(positions[0]), int(positions[-1]) + 1
    start = int(positions[rng.integers(len(positions))])
    out = ids.copy()
    out[lo:hi] = np.concatenate([ids[start:hi], ids[lo:start]])
    return out, start


# ---------------------------------------------------------------------------------------------------- the mix
@dataclass(frozen=True)
class Corruption:
    """A mix of BART's noising functions (Lewis et al. 2020, section 2.2), applied to one sequence in this order:

    1. sentence permutation of ``permute_sentences`` of the sentences (needs their bounds);
    2. document rotation, with probability ``rotate_prob``;
    3. text infilling of ``infill_rate`` of the tokens, Poisson(``poisson_lambda``) spans;
    4. token masking: ``token_mask_rate`` of the tokens left become [MASK];
    5. token substitution: ``substitute_rate`` of the tokens left get ids drawn from the unigram distribution;
    6. token deletion of ``delete_rate`` of the tokens left.

    Each rate is a share of the non-special tokens at its step ([MASK] is special, so later steps never touch an
    earlier mask); a rate of 0 skips its step and draws nothing. BART's final models: infilling 0.3 + sentence
    permutation 1.0 (the defaults of ``DataConfig``).
    """

    permute_sentences: float = 0.0
    rotate_prob: float = 0.0
    infill_rate: float = 0.0
    poisson_lambda: float = 3.0
    token_mask_rate: float = 0.0
    substitute_rate: float = 0.0
    delete_rate: float = 0.0

    RATES = ("permute_sentences", "rotate_prob", "infill_rate", "token_mask_rate", "substitute_rate", "delete_rate")

    def __post_init__(self) -> None:
        bad = [f"{name}={getattr(self, name)}" for name in self.RATES if not 0.0 <= getattr(self, name) <= 1.0]
        if bad:
            raise LmforgeError(f"corruption rates must be in [0, 1]: {', '.join(bad)}")
        if not 0.0 < self.poisson_lambda <= 64.0:
            raise LmforgeError(f"poisson_lambda={self.poisson_lambda} must be in (0, 64] (BART 3)")

    @classmethod
    def from_data(cls, data: DataConfig) -> Corruption:
        """The mix a ``DataConfig`` asks for (its fields of the same names)."""
        return cls(**{name: getattr(data, name) for name in (*cls.RATES, "poisson_lambda")})

    @property
    def is_identity(self) -> bool:
        """True when every rate is 0: the corrupted text is the text."""
        return all(getattr(self, name) == 0 for name in self.RATES)

    def apply(self, ids: np.ndarray, *, rng: np.random.Generator, is_special: np.ndarray, mask_id: int,
              sentence_bounds: np.ndarray | None = None, replacement: Replacement | None = None,
              max_length: int | None = None) -> np.ndarray:
        """Corrupt one sequence.

        Args:
            ids: (T,) token ids.
            rng: draws every random choice, step after step.
            is_special: (V,) bool, True at the special ids (never corrupted; [MASK] must be one).
            mask_id: the id of [MASK].
            sentence_bounds: (n + 1,) sentence bounds in ``ids`` (``permute_sentences``); needed when
                ``permute_sentences > 0``.
            replacement: where substituted tokens come from (a ``UnigramSampler``); needed when
                ``substitute_rate > 0``.
            max_length: the longest output allowed (infilling's insertions are dropped to fit).

        Returns:
            (T',) the corrupted ids.
        """
        out = np.asarray(ids, dtype=np.int64)
        if self.permute_sentences > 0:
            if sentence_bounds is None:
                raise LmforgeError("permute_sentences > 0 needs the sentence bounds of the sequence")
            out, _ = permute_sentences(out, sentence_bounds, rng, self.permute_sentences)
        if self.rotate_prob > 0 and rng.random() < self.rotate_prob:
            out, _ = rotate_document(out, candidates=~is_special[out], rng=rng)
        if self.infill_rate > 0:
            out = infill_spans(out, candidates=~is_special[out], rate=self.infill_rate, rng=rng, mask_id=mask_id,
                               poisson_lambda=self.poisson_lambda, max_length=max_length).input_ids
        if self.token_mask_rate > 0:
            out, _ = substitute_tokens(out, candidates=~is_special[out], rate=self.token_mask_rate, rng=rng,
                                       replacement=lambda positions, _: np.full(len(positions), mask_id))
        if self.substitute_rate > 0:
            if replacement is None:
                raise LmforgeError("substitute_rate > 0 needs a replacement (a UnigramSampler of the corpus)")
            out, _ = substitute_tokens(out, candidates=~is_special[out], rate=self.substitute_rate, rng=rng,
                                       replacement=replacement)
        if self.delete_rate > 0:
            out, _ = delete_tokens(out, candidates=~is_special[out], rate=self.delete_rate, rng=rng)
        return out


# ---------------------------------------------------------------------------------------------------- the data
class DenoisingData(PretrainingData):
    """Plan ``"denoise"``: BART's (corrupted text, text) pairs from a prepared corpus, with exact resumption.

    Examples are SpanBERT's single segments (``instances.plan_segments``: whole consecutive sentences of one
    document, ``[CLS] sentences [SEP]``, at most ``seq_len`` tokens; a sentence longer than that is cut into
    pieces, each piece a sentence for the permutation), so sentence permutation shuffles the sentences of one
    document as in BART. The target is the segment, the source its ``Corruption.from_data(data_config)``. Every
    random draw of example ``i`` of epoch ``e`` comes from ``default_rng([seed, e, 3, i])``, the masks' key of
    ``PretrainingData``, so the position (epoch, examples consumed) is the whole iteration state, as there; the
    order, the splits, the sharding over ranks and static mode are ``PretrainingData``'s.

    Batches are ``lmforge.data.seq2seq.collate_pairs``'s: ``src_ids`` / ``src_mask`` (B, S) the corrupted text,
    ``tgt_ids`` (B, T) = the segment without its last token (starts with [CLS], the decoder's start token),
    ``tgt_mask`` (B, T) and ``labels`` (B, T) = the segment without [CLS] (ends with [SEP]; -100 at padding), as
    ``lmforge train-seq2seq`` feeds the decoder. Substitution draws from the unigram distribution of the whole
    corpus (special tokens excluded), the same for every split.

    Args: as ``PretrainingData`` (``plan`` must be ``"denoise"``; ``masking`` is ignored).

    Raises:
        LmforgeError: a mix that corrupts nothing (the model would learn to copy), or ``PretrainingData``'s errors.
    """

    def __init__(self, corpus: Any, data_config: DataConfig, tokenizer: Any, *, plan: str = "denoise",
                 masking: str | None = None, split: str = "train", seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> None:
        if plan != "denoise":
            raise LmforgeError(f"DenoisingData makes plan 'denoise', not {plan!r}")
        self.corruption = Corruption.from_data(data_config)
        if self.corruption.is_identity:
            raise LmforgeError("objective denoise with no corruption would only teach the model to copy: set "
                               "data.infill_rate (BART 0.3), data.permute_sentences, data.rotate_prob, "
                               "data.token_mask_rate, data.substitute_rate or data.delete_rate above 0")
        # the segments plan and its fixed examples; the masking strategy is unused (the corruption replaces it)
        super().__init__(corpus, data_config, tokenizer, plan="segments", masking="token", split=split, seed=seed,
                         rank=rank, world_size=world_size)
        self.plan, self.masking = "denoise", None
        self._replacement: UnigramSampler | None = None
        if self.corruption.substitute_rate > 0:
            self._replacement = UnigramSampler(unigram_counts(self.corpus, len(self._is_special)),
                                               exclude=np.flatnonzero(self._is_special))

    def _sentence_bounds(self, doc: int, start: int, end: int) -> np.ndarray:
        """Bounds of the sentences of document tokens [start, end) in ``[CLS] tokens [SEP]`` (shifted by one)."""
        offsets = np.asarray(self.corpus.sentence_offsets(doc), dtype=np.int64)
        inner = offsets[(offsets > start) & (offsets < end)]
        return np.concatenate([[start], inner, [end]]) - start + 1

    def _example(self, plan: Any, i: int, epoch: int) -> dict[str, np.ndarray]:
        ((doc, start, end),) = plan[i]
        original = np.concatenate([[self.tokenizer.cls_id], self._tokens_of(doc)[start:end],
                                   [self.tokenizer.sep_id]]).astype(np.int64)
        key_epoch = 0 if (self.static or self.split == "eval") else epoch
        rng = np.random.default_rng([self._key_seed, key_epoch, 3, i])  # PretrainingData's key of example i
        source = self.corruption.apply(original, rng=rng, is_special=self._is_special, mask_id=self.tokenizer.mask_id,
                                       sentence_bounds=self._sentence_bounds(doc, start, end),
                                       replacement=self._replacement, max_length=self.config.seq_len)
        if not len(source):
            source = np.array([self.tokenizer.unk_id], dtype=np.int64)
        return {"src_ids": source, "tgt_ids": original}

    def _collate(self, examples: list[Any]) -> dict[str, Any]:
        return collate_pairs(examples, self.tokenizer.pad_id)
