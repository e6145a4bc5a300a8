"""Pretraining instances from a prepared corpus: BERT segment pairs, RoBERTa full-sentence packing, SpanBERT
single segments and GPT causal blocks.

Each recipe is split in two: a *plan* that works on sentence lengths only and returns small specs (which
tokens of which documents go where), and materialising a spec into token ids. Planning a whole epoch is then
cheap (no token is read) and a spec is turned into ids only when its batch is built.

* ``make_nsp_instances`` — BERT's ``create_instances_from_document`` (google-research/bert,
  ``create_pretraining_data.py``), per document:

  - target length ``max_num_tokens = seq_len - 3``; with probability ``short_seq_prob`` a shorter target
    drawn uniformly from ``[2, max_num_tokens]`` (once per document, as in BERT's code);
  - sentences are accumulated into a chunk until the target is reached or the document ends;
  - segment A is the chunk's first ``a_end`` sentences, ``a_end`` uniform in ``[1, len(chunk) - 1]``
    (1 for a one-sentence chunk);
  - with probability ``nsp_prob``, or (``balance="bert"``) always when the chunk has one sentence, segment B is
    "random next":
    sentences of a random *other* document, from a random start sentence, until B reaches the remaining
    target; the chunk's unused sentences are put back and start the next chunk. Otherwise B is the rest of
    the chunk (the real continuation);
  - ``balance``: ``"bert"`` is google-research/bert's draw above: a one-sentence chunk always gets a random B,
    which gives about 56% random pairs on typical text. ``"exact"`` (the default of ``DataConfig.nsp_balance``)
    draws the label first, random with probability ``nsp_prob`` whatever the chunk, so every pair's label is an
    independent Bernoulli(nsp_prob) draw and the share of random pairs is ``nsp_prob`` in expectation (Wald: the
    number of pairs may depend on earlier labels, never the label on the chunk). When "next" is drawn for a
    one-sentence chunk, B is still real text that follows A in the same document: the following sentence is
    borrowed (the next chunk starts after it); for the document's last sentence, the sentence is cut at a
    uniformly random token into A and B; a one-token last sentence takes the sentence before it as A. A document
    of a single one-token sentence has no continuation at all and makes no pair in exact mode (decided before
    any label is drawn, so it does not bias the labels);
  - the pair is truncated to ``max_num_tokens`` by removing tokens from the longer segment (B on a tie) one
    at a time, each from the front or the back with probability 1/2. The coin flips of one segment are drawn
    as one binomial count, which has the same distribution as BERT's token-by-token loop;
  - output ``[CLS] A [SEP] B [SEP]``, token types 0 for ``[CLS] A [SEP]`` and 1 for ``B [SEP]``, NSP label
    0 = B is the real continuation, 1 = B is random (Hugging Face's and BERT's convention).

* ``plan_sop_document`` — ALBERT's sentence-order prediction (Lan et al. 2020, section 3.1): BERT's chunks and
  A/B split as in exact mode with ``nsp_prob = 0`` (so B is always the real text that follows A in the same
  document, a one-sentence chunk borrowing or cutting as above), then with probability ``sop_prob`` (0.5) the two
  segments are swapped: label 0 = in order, 1 = swapped (Hugging Face's ``sentence_order_label``). Deviation from
  google-research/albert's code, which gives a one-sentence chunk a random other document's text as B (an NSP
  negative inside SOP): here every pair is two consecutive segments of one document, and the label is an
  independent Bernoulli(``sop_prob``) draw.

* ``make_packed_instances`` — RoBERTa's FULL-SENTENCES (Liu et al., 2019, section 4.2): whole sentences packed
  contiguously, crossing document boundaries, with an extra ``[SEP]`` between documents:
  ``[CLS] s s s [SEP] s s [SEP]`` up to ``seq_len`` tokens, token types all 0. A sentence longer than the
  budget is cut into budget-sized pieces (no text is lost).

* ``make_segment_instances`` — SpanBERT's single-sequence training (Joshi et al., 2020, section 3.3: "sample a
  single contiguous segment of up to n = 512 tokens, rather than two half-segments"). Following SpanBERT's
  released code (``BlockDataset`` with ``break_mode="doc"``), a segment is whole consecutive sentences of ONE
  document, up to ``seq_len - 2`` tokens, ``[CLS] segment [SEP]``. Deviation: the released code skips a
  sentence longer than the budget; here it is cut into budget-sized pieces.

* ``make_causal_blocks`` — GPT: the documents concatenated, each followed by an end-of-text id (``[SEP]``
  unless ``eos_id`` is given), cut into consecutive blocks of ``block_len + 1`` tokens that overlap by one
  (inputs are ``block[:-1]``, next-token labels ``block[1:]``, so every token is a target exactly once).
  The last partial block is dropped.
* ``DocAlignedBlocks`` — the same blocks cut per document (``DataConfig.doc_aligned``): every block starts at a
  document start (``[SEP]`` + its tokens + ``[SEP]``), none holds two documents, a document's last block is
  shorter (padded by the collate function).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from lmforge.errors import LmforgeError

__all__ = [
    "CausalBlocks", "DocAlignedBlocks", "Instance", "NspSpec", "TooFewDocumentsError", "make_causal_blocks",
    "make_nsp_instances", "make_packed_instances", "make_segment_instances", "materialize_nsp", "materialize_pieces",
    "nsp_error", "plan_nsp_document", "plan_packed", "plan_segments", "plan_sop_document",
]

Piece = tuple[int, int, int]  # (document, token start, token end) within the document


class Instance(NamedTuple):
    """One model input before masking.

    Attributes:
        input_ids: (T,) int64, special tokens included.
        token_type_ids: (T,) int64 segment ids.
        nsp_label: 0 = B follows A, 1 = B is random; -1 when the instance is not a pair.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    nsp_label: int = -1


class NspSpec(NamedTuple):
    """A planned segment pair: A = tokens [a_start, a_end) of document a_doc, B likewise; label as in
    ``Instance``."""

    a_doc: int
    a_start: int
    a_end: int
    b_doc: int
    b_start: int
    b_end: int
    label: int


def _check_seq_len(seq_len: int, minimum: int) -> None:
    if seq_len < minimum:
        raise LmforgeError(f"seq_len={seq_len} is too short; use at least {minimum}")


# How pretraining examples are cut from a corpus (``lmforge.data.pretraining``): segment pairs with NSP labels
# (BERT), packed full sentences (RoBERTa), single contiguous segments (SpanBERT), causal blocks (GPT); "stream":
# consecutive BPTT windows of one contiguous stream for a stateful LSTM LM (``lmforge.data.lm_stream``, AWD-LSTM);
# "sop": segment pairs of one document, in order or swapped (ALBERT's sentence-order prediction); "plm": RoBERTa's
# packed full sentences made into permutation-LM examples (XLNet, ``lmforge.data.permutation``).
PLANS = ("nsp", "packed", "segments", "causal", "stream", "sop", "plm", "denoise")
# the plans that make segment pairs with a binary label (``Instance.nsp_label``; batches carry ``nsp_labels``)
PAIR_PLANS = ("nsp", "sop")
# "denoise": SpanBERT's single segments made into (corrupted text, text) pairs for BART's denoising autoencoder
# (``lmforge.data.corruption.DenoisingData``: text infilling, sentence permutation, ... of DataConfig's rates).


class TooFewDocumentsError(LmforgeError):
    """NSP needs at least two documents; callers may catch this to fall back to objective "mlm"."""


def nsp_error(n_documents: int, detail: str = "") -> TooFewDocumentsError:
    """The error for a corpus (or split) that cannot make random-next pairs."""
    return TooFewDocumentsError(
        f"NSP needs at least two documents to draw random next segments from, but only {n_documents} "
        "document(s) are available; add documents (blank lines separate documents in the lines format; each "
        f"file is one document in the documents format) or use objective \"mlm\" (RoBERTa-style, no NSP){detail}")


def _truncate_pair(la: int, lb: int, max_tokens: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """BERT's ``truncate_seq_pair`` on lengths: tokens to drop from the (front, back) of A and of B."""
    excess = la + lb - max_tokens
    if excess <= 0:
        return 0, 0, 0, 0
    longer_a = la > lb
    first = min(excess, abs(la - lb))  # from the longer one until they are equal
    rest = excess - first
    # then alternately, B first on a tie (BERT picks B unless A is strictly longer)
    ra = (first if longer_a else 0) + rest // 2
    rb = (0 if longer_a else first) + rest - rest // 2
    fa = int(rng.binomial(ra, 0.5)) if ra else 0
    fb = int(rng.binomial(rb, 0.5)) if rb else 0
    return fa, ra - fa, fb, rb - fb


def plan_nsp_document(doc: int, offsets: np.ndarray, rng: np.random.Generator, *, seq_len: int,
                      short_seq_prob: float, nsp_prob: float, pool: np.ndarray,
                      offsets_of: Callable[[int], np.ndarray], balance: str = "exact") -> list[NspSpec]:
    """Plan BERT's segment pairs for one document from its sentence offsets (see the module docstring).

    Args:
        doc: the document's index.
        offsets: (n_sentences + 1,) token offsets of its sentences (``ShardedCorpus.sentence_offsets``).
        rng: draws every random choice.
        seq_len: the model's sequence length (max_seq_length).
        short_seq_prob, nsp_prob: BERT's probabilities (0.1, 0.5).
        pool: documents random next segments are drawn from (at least two distinct ones, ``doc`` may be one).
        offsets_of: sentence offsets of another document.
        balance: ``"bert"`` (google-research/bert: a one-sentence chunk always gets a random B, about 56/44 on
            typical text) or ``"exact"`` (the label is drawn first with ``nsp_prob``, see the module docstring).
    """
    if balance not in ("exact", "bert"):
        raise LmforgeError(f"balance={balance!r} is not one of exact, bert")
    exact = balance == "exact"
    max_tokens = seq_len - 3
    target = max_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_tokens + 1))
    offs = offsets.tolist()  # Python ints: this loop runs once per sentence of the corpus every epoch
    n = len(offs) - 1
    specs: list[NspSpec] = []
    if exact and n == 1 and offs[1] - offs[0] < 2:
        return specs  # one one-token sentence: no real "next" exists, so it makes no pair (of either label)
    chunk_start = 0
    i = 0
    while i < n:
        if i == n - 1 or offs[i + 1] - offs[chunk_start] >= target:
            k = i - chunk_start + 1  # sentences in the chunk
            is_random = rng.random() < nsp_prob if exact else None  # exact: the label first, whatever the chunk
            if exact and not is_random and k == 1:
                # "next" for a one-sentence chunk: a real continuation from the document itself
                if i + 1 < n:  # borrow the following sentence as B (it would have started the next chunk)
                    a0, a1, b0, b1 = offs[i], offs[i + 1], offs[i + 1], offs[i + 2]
                    i += 1
                elif offs[i + 1] - offs[i] >= 2:  # the document's last sentence: cut it at a random token
                    cut = offs[i] + int(rng.integers(1, offs[i + 1] - offs[i]))
                    a0, a1, b0, b1 = offs[i], cut, cut, offs[i + 1]
                else:  # a one-token last sentence: A is the sentence before it (read twice)
                    a0, a1, b0, b1 = offs[i - 1], offs[i], offs[i], offs[i + 1]
                fa, ba, fb, bb = _truncate_pair(a1 - a0, b1 - b0, max_tokens, rng)
                specs.append(NspSpec(doc, a0 + fa, a1 - ba, doc, b0 + fb, b1 - bb, 0))
                chunk_start = i + 1
                i += 1
                continue
            a_end = int(rng.integers(1, k)) if k >= 2 else 1
            a0, a1 = offs[chunk_start], offs[chunk_start + a_end]
            if is_random if exact else (k == 1 or rng.random() < nsp_prob):
                label = 1
                other = doc
                while other == doc:
                    other = int(pool[rng.integers(len(pool))])
                other_offs = offsets_of(other).tolist()
                first = int(rng.integers(len(other_offs) - 1))
                # take sentences from `first` until B reaches the rest of the target (at least one sentence)
                need = max(target - (a1 - a0), 1)
                last = bisect_left(other_offs, other_offs[first] + need)
                last = min(max(last, first + 1), len(other_offs) - 1)
                b_doc, b0, b1 = other, other_offs[first], other_offs[last]
                i -= k - a_end  # put the unused sentences back
            else:
                label = 0
                b_doc, b0, b1 = doc, a1, offs[i + 1]
            fa, ba, fb, bb = _truncate_pair(a1 - a0, b1 - b0, max_tokens, rng)
            specs.append(NspSpec(doc, a0 + fa, a1 - ba, b_doc, b0 + fb, b1 - bb, label))
            chunk_start = i + 1
        i += 1
    return specs


def plan_sop_document(doc: int, offsets: np.ndarray, rng: np.random.Generator, *, seq_len: int,
                      short_seq_prob: float, sop_prob: float = 0.5) -> list[NspSpec]:
    """Plan ALBERT's sentence-order pairs for one document (see the module docstring).

    Args:
        doc: the document's index.
        offsets: (n_sentences + 1,) token offsets of its sentences.
        rng: draws every random choice (the chunking's draws first, then one swap draw per pair, in order).
        seq_len: the model's sequence length.
        short_seq_prob: BERT's probability of a shorter target length (0.1).
        sop_prob: probability that a pair is swapped (label 1).

    Returns:
        Specs whose A and B both come from ``doc``: label 0 = B follows A, 1 = A follows B (swapped).
    """
    pairs = plan_nsp_document(doc, offsets, rng, seq_len=seq_len, short_seq_prob=short_seq_prob, nsp_prob=0.0,
                              pool=np.array([doc]), offsets_of=lambda other: offsets, balance="exact")
    swaps = rng.random(len(pairs)) < sop_prob
    return [NspSpec(p.b_doc, p.b_start, p.b_end, p.a_doc, p.a_start, p.a_end, 1) if swap else p
            for p, swap in zip(pairs, swaps.tolist(), strict=True)]


def materialize_nsp(spec: NspSpec, tokens_of: Callable[[int], np.ndarray], cls_id: int,
                    sep_id: int) -> Instance:
    """``[CLS] A [SEP] B [SEP]`` with token types and the NSP label of a planned pair."""
    a = tokens_of(spec.a_doc)[spec.a_start:spec.a_end]
    b = tokens_of(spec.b_doc)[spec.b_start:spec.b_end]
    n_a, n_b = len(a), len(b)
    ids = np.empty(n_a + n_b + 3, dtype=np.int64)
    ids[0] = cls_id
    ids[1:n_a + 1] = a
    ids[n_a + 1] = sep_id
    ids[n_a + 2:-1] = b
    ids[-1] = sep_id
    types = np.zeros(len(ids), dtype=np.int64)
    types[n_a + 2:] = 1
    return Instance(ids, types, spec.label)


def make_nsp_instances(corpus, doc_index: int, rng: np.random.Generator, *, seq_len: int,
                       short_seq_prob: float = 0.1, nsp_prob: float = 0.5, cls_id: int, sep_id: int,
                       documents: Sequence[int] | None = None, balance: str = "exact") -> list[Instance]:
    """BERT's segment pairs with NSP labels from one document (see the module docstring).

    Args:
        corpus: a ``ShardedCorpus`` (or anything with ``num_documents``, ``sentence_offsets(i)`` and
            ``document_tokens(i)``).
        doc_index: the document to build pairs from.
        rng: the generator every random choice draws from.
        seq_len: the model's maximum sequence length; every instance has at most this many tokens.
        short_seq_prob: probability of a shorter target length.
        nsp_prob: probability that B is a random segment from another document.
        cls_id, sep_id: the special ids.
        documents: the documents random B segments come from (default: all; pass the training split).
        balance: ``"exact"`` (50/50 by construction with nsp_prob 0.5) or ``"bert"`` (see the module docstring).

    Returns:
        The instances, in document order.

    Raises:
        LmforgeError: fewer than two documents to draw from (suggests objective "mlm").
    """
    _check_seq_len(seq_len, 8)
    pool = np.arange(corpus.num_documents) if documents is None else np.asarray(documents, dtype=np.int64)
    distinct = len(np.unique(pool))
    if distinct < 2:
        raise nsp_error(distinct)
    specs = plan_nsp_document(doc_index, corpus.sentence_offsets(doc_index), rng, seq_len=seq_len,
                              short_seq_prob=short_seq_prob, nsp_prob=nsp_prob, pool=pool,
                              offsets_of=corpus.sentence_offsets, balance=balance)
    return [materialize_nsp(s, corpus.document_tokens, cls_id, sep_id) for s in specs]


# ---------------------------------------------------------------------------------------------------- packing
def _sentence_pieces(doc: int, offsets: np.ndarray, budget: int) -> list[Piece]:
    """The document's sentences as (doc, start, end), sentences longer than ``budget`` cut into pieces."""
    pieces = []
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        for s in range(a, b, budget):
            pieces.append((doc, s, min(s + budget, b)))
    return pieces


def plan_packed(documents: Sequence[int], offsets_of: Callable[[int], np.ndarray], seq_len: int
                ) -> list[tuple[Piece, ...]]:
    """RoBERTa FULL-SENTENCES: each instance is a tuple of contiguous pieces, one per document it touches;
    ``[CLS]``, a ``[SEP]`` after each piece, total at most ``seq_len``."""
    _check_seq_len(seq_len, 3)
    budget = seq_len - 2  # [CLS] and the final [SEP]
    instances: list[tuple[Piece, ...]] = []
    current: list[list[int]] = []  # mutable [doc, start, end]
    used = 0  # text tokens plus the separators between documents
    for doc in documents:
        for d, s, e in _sentence_pieces(int(doc), offsets_of(int(doc)), budget):
            same_doc = bool(current) and current[-1][0] == d and current[-1][2] == s
            cost = (e - s) + (0 if same_doc or not current else 1)
            if current and used + cost > budget:
                instances.append(tuple(map(tuple, current)))
                current, used, same_doc, cost = [], 0, False, e - s
            if same_doc:
                current[-1][2] = e
            else:
                current.append([d, s, e])
            used += cost
    if current:
        instances.append(tuple(map(tuple, current)))
    return instances  # type: ignore[return-value]


def plan_segments(documents: Sequence[int], offsets_of: Callable[[int], np.ndarray], seq_len: int
                  ) -> list[tuple[Piece, ...]]:
    """SpanBERT single segments: whole consecutive sentences of one document, up to ``seq_len - 2`` tokens."""
    _check_seq_len(seq_len, 3)
    budget = seq_len - 2
    instances: list[tuple[Piece, ...]] = []
    for doc in documents:
        start = end = None
        for d, s, e in _sentence_pieces(int(doc), offsets_of(int(doc)), budget):
            if start is not None and e - start > budget:
                instances.append(((d, start, end),))
                start = None
            if start is None:
                start = s
            end = e
        if start is not None:
            instances.append(((int(doc), start, end),))
    return instances


def materialize_pieces(pieces: Sequence[Piece], tokens_of: Callable[[int], np.ndarray], cls_id: int,
                       sep_id: int) -> Instance:
    """``[CLS] piece [SEP] piece [SEP] ...``, token types all 0."""
    parts: list[np.ndarray] = [np.array([cls_id], dtype=np.int64)]
    sep = np.array([sep_id], dtype=np.int64)
    for doc, s, e in pieces:
        parts.append(np.asarray(tokens_of(doc)[s:e], dtype=np.int64))
        parts.append(sep)
    ids = np.concatenate(parts)
    return Instance(ids, np.zeros(len(ids), dtype=np.int64), -1)


def make_packed_instances(corpus, *, seq_len: int, cls_id: int, sep_id: int,
                          documents: Sequence[int] | None = None) -> list[Instance]:
    """RoBERTa FULL-SENTENCES instances over ``documents`` (default: all, in corpus order)."""
    docs = range(corpus.num_documents) if documents is None else documents
    plan = plan_packed(docs, corpus.sentence_offsets, seq_len)
    return [materialize_pieces(p, corpus.document_tokens, cls_id, sep_id) for p in plan]


def make_segment_instances(corpus, *, seq_len: int, cls_id: int, sep_id: int,
                           documents: Sequence[int] | None = None) -> list[Instance]:
    """SpanBERT single-segment instances over ``documents`` (default: all, in corpus order)."""
    docs = range(corpus.num_documents) if documents is None else documents
    plan = plan_segments(docs, corpus.sentence_offsets, seq_len)
    return [materialize_pieces(p, corpus.document_tokens, cls_id, sep_id) for p in plan]


# ---------------------------------------------------------------------------------------------------- causal
class CausalBlocks:
    """Blocks of ``block_len + 1`` consecutive tokens of the concatenated documents (see module docstring).

    ``blocks[i]`` is stream[i * block_len : (i + 1) * block_len + 1], an int64 array, read on demand.
    """

    def __init__(self, corpus, block_len: int, *, eos_id: int, documents: Sequence[int] | None = None) -> None:
        if block_len < 1:
            raise LmforgeError(f"block_len={block_len} must be >= 1")
        self.corpus = corpus
        self.block_len = block_len
        self.eos_id = int(eos_id)
        docs = np.arange(corpus.num_documents) if documents is None else np.asarray(documents, dtype=np.int64)
        self.documents = docs
        self._lengths = np.asarray(corpus.document_lengths)[docs]
        self._ends = np.cumsum(self._lengths + 1)  # stream offset just past each document's end-of-text id
        total = int(self._ends[-1]) if len(docs) else 0
        self.num_stream_tokens = total
        self._len = max((total - 1) // block_len, 0)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self._len:
            raise IndexError(f"block {i} is out of range ({self._len} blocks)")
        start, stop = i * self.block_len, (i + 1) * self.block_len + 1
        out = np.empty(stop - start, dtype=np.int64)
        k = int(np.searchsorted(self._ends, start, side="right"))  # first document overlapping start
        pos = start
        while pos < stop:
            doc_end = int(self._ends[k])  # eos sits at doc_end - 1
            doc_start = doc_end - int(self._lengths[k]) - 1
            take = min(stop, doc_end - 1) - pos
            if take > 0:
                tokens = self.corpus.document_tokens(int(self.documents[k]))
                out[pos - start:pos - start + take] = tokens[pos - doc_start:pos - doc_start + take]
                pos += take
            if pos < stop and pos == doc_end - 1:
                out[pos - start] = self.eos_id
                pos += 1
            k += 1
        return out


class DocAlignedBlocks:
    """Causal blocks that each start at a document start (``DataConfig.doc_aligned``), the interface of
    ``CausalBlocks``.

    Every document becomes its own sequence ``[eos] + tokens + [eos]`` (``eos_id``, the corpus's [SEP]: the same
    separator the packed stream puts between documents, so the first token is predicted from it and the last one
    predicts it). That sequence is cut into windows of at most ``block_len + 1`` tokens overlapping by one, window j
    = seq[j * block_len : (j + 1) * block_len + 1], so every token after the leading ``[eos]`` is a target exactly
    once and no window holds two documents. A document's last window is shorter unless its sequence fits evenly;
    ``collate_causal`` pads it (labels -100). Windows are numbered document by document, window by window, so the
    order, the splits and the sharding of ``PretrainingData`` apply unchanged.
    """

    def __init__(self, corpus, block_len: int, *, eos_id: int, documents: Sequence[int] | None = None) -> None:
        if block_len < 1:
            raise LmforgeError(f"block_len={block_len} must be >= 1")
        self.corpus = corpus
        self.block_len = block_len
        self.eos_id = int(eos_id)
        docs = np.arange(corpus.num_documents) if documents is None else np.asarray(documents, dtype=np.int64)
        self.documents = docs
        self._lengths = np.asarray(corpus.document_lengths, dtype=np.int64)[docs]
        # a document's sequence has length + 2 tokens, so length + 1 targets: ceil((length + 1) / block_len) windows
        self._ends = np.cumsum(-(-(self._lengths + 1) // block_len))  # window index past each document
        self._len = int(self._ends[-1]) if len(docs) else 0
        self.num_stream_tokens = int((self._lengths + 2).sum())  # every token of every sequence, once

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self._len:
            raise IndexError(f"block {i} is out of range ({self._len} blocks)")
        k = int(np.searchsorted(self._ends, i, side="right"))  # the document holding window i
        j = i - (int(self._ends[k - 1]) if k else 0)  # its window number within the document
        n = int(self._lengths[k]) + 2
        start, stop = j * self.block_len, min((j + 1) * self.block_len + 1, n)
        tokens = np.asarray(self.corpus.document_tokens(int(self.documents[k])), dtype=np.int64)
        out = np.empty(stop - start, dtype=np.int64)
        # sequence position p holds eos at 0 and n - 1, tokens[p - 1] between
        lo, hi = max(start, 1), min(stop, n - 1)
        if hi > lo:
            out[lo - start:hi - start] = tokens[lo - 1:hi - 1]
        if start == 0:
            out[0] = self.eos_id
        if stop == n:
            out[-1] = self.eos_id
        return out


def make_causal_blocks(corpus, block_len: int, *, eos_id: int | None = None,
                       documents: Sequence[int] | None = None) -> CausalBlocks:
    """GPT blocks of ``block_len + 1`` tokens over the concatenated documents, separated by ``eos_id``
    (default: the corpus's [SEP] id)."""
    if eos_id is None:
        eos_id = corpus.special_ids["sep"]
    return CausalBlocks(corpus, block_len, eos_id=eos_id, documents=documents)
