"""The data side of permutation language modeling (PLM), XLNet (Yang et al., 2019), over numpy arrays with a
passed-in generator.

One sequence of T tokens becomes one example in three steps, every random choice drawn from the caller's
``np.random.Generator`` (the same seed gives the same example, so a data stream can be resumed):

1. ``sample_prediction_targets`` chooses the tokens to predict with XLNet's span-based prediction (paper,
   section 3.1 and appendix A.2; zihangdai/xlnet ``data_utils.py``, ``_sample_mask``): walk the sequence left to
   right in blocks; for each block draw a span length ``L`` in ``1..max_span``, the block is ``K * L`` tokens
   long and holds one span of ``L`` consecutive target tokens at a uniformly random offset, the rest of the
   block is context. So about ``1/K`` of the walked tokens are targets.
2. ``factorization_order`` draws the factorisation order (the original code's ``_local_perm``): the non-target
   tokens come first (they are the context and nothing is predicted from them), the targets follow in a
   uniformly random order (``order="identity"``: in position order). The targets are thus the last part of the
   order, about its last ``1/K``: XLNet's partial prediction.
3. ``permutation_masks`` turns the order into the two attention masks of two-stream attention, and
   ``target_arrays`` into the fixed-size prediction rows. ``plm_example`` runs the three steps.

Conventions:

* Masks are bool (T, T) and ``mask[i, j] = True`` means position i may NOT attend to position j (XLNet's and
  Hugging Face's ``perm_mask`` convention: 1 = cannot see). Rows and columns are sequence positions, not ranks.
* Content stream (``perm_mask``): position i sees itself and every position earlier than it in the order.
  Query stream (``query_perm_mask``): the same without itself, i.e. ``query = content | eye``; the query stream
  of a target must not see the token it predicts. Hugging Face's ``XLNetModel(perm_mask=...)`` expects the
  query-stream mask (it lets the content stream see itself by clearing the diagonal), so pass it
  ``query_perm_mask``, never ``perm_mask``.
* The non-targets form one block at the front of the order whose members all see one another (content stream)
  and none of the targets, as in the original code (it gives them all the same rank); with ``order="identity"``
  and every token a target there is no such block and the masks are exactly the causal ones: content
  ``triu(ones, 1)`` (cannot see the future), query ``triu(ones, 0)`` (nor itself).
* A query-stream row can be all True (the first target of an order with no context, e.g. position 0 of the
  identity order): the model's masked softmax must handle a fully masked row (a finite fill value, not -inf).
* Special tokens (``special_mask``: [CLS], [SEP], padding, ...) are never targets and are context like any
  non-target (Hugging Face's collator does the same). Deviation: the original code puts [SEP] and [CLS] among
  the permuted tokens (without loss), so the text context cannot see them. Padding is not handled here: the
  model's usual padding (attention) mask must still hide it.
* ``target_mapping`` (N, T) float32 has one one-hot row per predicted position, in increasing position order,
  then zero rows up to ``N = num_predict``; ``target_mask`` (N,) bool is True on the real rows; ``labels`` (N,)
  int64 holds the target token ids, ``-100`` on padding rows. ``input_ids`` is the sequence unchanged (XLNet
  does not corrupt its input; the query stream starts from a learned mask vector instead).

K, num_predict and the number of targets: the sampler aims at ``n_T / K`` targets (n_T: the tokens walked; the
special tokens among them are skipped, so with many special tokens there are fewer targets) and never returns
more than ``num_predict``; the last span is shortened to fit (in whole words when ``word_starts`` is given).
``num_predict`` is also N, the fixed number of prediction rows. Default ``ceil(T / K)`` (86 at T = 512, K = 6;
the original code used 85). Each block of ``K * L`` tokens holds exactly ``L`` targets, so the count varies by
only a token or so around ``n_T / K`` (only the last, cut-off block is random); the default cap trims at most a
token or two, and a larger ``num_predict`` only adds padding rows. ``partial_k = 1`` with ``num_predict = T``
predicts every non-special token.

Span details and deviations from the original code:

* Span length ``L`` in ``1..max_span`` with ``p(L)`` proportional to ``1/L`` (5: 0.44, 0.22, 0.15, 0.11, 0.09;
  mean 2.19), as in ``_sample_mask``; the paper only says ``L`` is drawn from ``[1, ..., 5]``, and Hugging
  Face's collator draws it uniformly.
* Block size ``K * L`` (rounded), as in the paper ("a context of KL tokens"). Deviation: the original code uses
  a context of ``L * mask_alpha / mask_beta`` tokens *besides* the span (alpha 6, beta 1: blocks of 7L, about
  1/7 of the tokens), and then tops the count up to exactly ``num_predict`` with single random tokens; here the
  share is 1/K and nothing is topped up (the unused rows are padding with ``target_mask`` False).
* A span never contains a special token: its start moves right past special tokens (and, with
  ``word_starts``, to the next word start), and it ends early at a special token or at the end of the sequence.
  Spans may touch one another (as in the original code), so a run of targets can be longer than ``max_span``.
* With ``word_starts``, ``L`` counts whole words, as the original code intends; its word-end loop tests the
  span's first piece instead of the current one, so its spans are ``L`` tokens in practice.
* If the walk places no target (a short sequence and a large K), one random non-special word (token) is
  predicted, so every example has at least one target.
* ``perm_size`` (the original's local permutation, ``_local_perm``): the positions are cut into chunks of
  ``perm_size``; the chunks keep their left-to-right order and ONE random permutation of the offsets 0..perm_size-1
  orders the positions inside every chunk (the original shuffles the rows of the (perm_size, T / perm_size) index
  matrix). Without it (``None``) the targets are in one uniformly random order over the whole sequence; XLNet's
  pretraining sets ``perm_size = reuse_len = seq_len / 2``, which is that for each of the two parts below.
* Segment recurrence (``plm_memory_example``, XLNet section 2.4 and its ``reuse_len``): the sequence is two parts,
  the first ``reuse_len`` tokens (whose states become the memory of the next sequence of the stream) and the rest.
  Each part gets its own targets (the prediction rows shared in proportion to the parts' lengths; the original
  halves ``num_predict`` with reuse_len = seq_len / 2) and its own factorisation order; the reused part sees
  nothing of the rest (its states, cached, must not depend on tokens the next sequence predicts) and the rest sees
  the whole reused part: the order is "the reused part's order, then the rest's", the original's block masks.
* Not implemented: the reversed sampling of the original's bidirectional data pipeline (spans here are walked left
  to right in reading order also on reversed rows), and the ``leak_ratio`` of the later TF2 port
  (tensorflow/models), which lets some targets see themselves.
"""

from __future__ import annotations

import math

import numpy as np

from lmforge.data.masking import IGNORE_INDEX, ngram_length_pmf
from lmforge.errors import LmforgeError

__all__ = [
    "ORDERS", "default_num_predict", "factorization_order", "permutation_masks", "plm_example", "plm_memory_example",
    "plm_span_length_pmf", "sample_prediction_spans", "sample_prediction_targets", "target_arrays",
]

ORDERS = ("random", "identity")


def plm_span_length_pmf(max_span: int) -> np.ndarray:
    """P(L = 1..max_span) of XLNet's span lengths: proportional to 1/L (the original ``_sample_mask``)."""
    if isinstance(max_span, bool) or not isinstance(max_span, int | np.integer) or max_span < 1:
        raise LmforgeError(f"max_span={max_span!r} must be an integer >= 1 (XLNet uses 5)")
    return ngram_length_pmf(max_span)


def default_num_predict(seq_len: int, partial_k: float) -> int:
    """``ceil(seq_len / partial_k)``: the default number of prediction rows (and cap on targets)."""
    _check_k(partial_k)
    return max(1, math.ceil(seq_len / partial_k))


def _check_k(partial_k: float) -> None:
    if not partial_k >= 1:
        raise LmforgeError(f"partial_k={partial_k} must be >= 1: about 1/partial_k of the tokens are predicted "
                           f"(XLNet uses 6; 1 predicts every token)")


def _check_sequence(ids, special_mask, word_starts) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    ids = np.asarray(ids, dtype=np.int64)
    special_mask = np.asarray(special_mask, dtype=bool)
    if ids.ndim != 1 or special_mask.shape != ids.shape:
        raise LmforgeError(f"PLM examples take one sequence: ids {ids.shape} and special_mask {special_mask.shape} "
                           f"must be the same 1-D shape")
    if word_starts is not None:
        word_starts = np.asarray(word_starts, dtype=bool)
        if word_starts.shape != ids.shape:
            raise LmforgeError(f"word_starts {word_starts.shape} must have the shape of ids {ids.shape}")
    if not (~special_mask).any():
        raise LmforgeError(f"the sequence (length {len(ids)}) has no predictable token: every position is special "
                           f"or padding; drop such sequences before building PLM examples")
    return ids, special_mask, word_starts


def _check_num_predict(num_predict: int, seq_len: int) -> int:
    if isinstance(num_predict, bool) or not isinstance(num_predict, int | np.integer):
        raise LmforgeError(f"num_predict={num_predict!r} must be an integer")
    if num_predict < 1 or num_predict > seq_len:
        raise LmforgeError(f"num_predict={num_predict} must be in 1..{seq_len} (the sequence length); use at most "
                           f"the sequence length, or leave it unset for ceil(T / partial_k)")
    return int(num_predict)


def sample_prediction_spans(ids: np.ndarray, *, rng: np.random.Generator, special_mask: np.ndarray,
                            num_predict: int, word_starts: np.ndarray | None = None, partial_k: float = 6,
                            max_span: int = 5) -> np.ndarray:
    """XLNet's span-based choice of prediction targets (see the module docstring), as spans.

    Args:
        ids: (T,) token ids of one sequence.
        rng: the generator every random choice draws from.
        special_mask: (T,) bool, True at special and padding tokens (never targets).
        num_predict: most target tokens (the last span is shortened to fit), 1..T.
        word_starts: (T,) bool, True where a token starts a word; spans are then ``L`` whole words (``None``:
            ``L`` tokens).
        partial_k: K; each span of ``L`` lies in a block of ``K * L`` tokens (XLNet 6).
        max_span: the longest span, in tokens or words (XLNet 5).

    Returns:
        (n_spans, 2) int64 token ranges ``[start, end)``, in increasing position order, disjoint, no special
        token inside, at most ``num_predict`` tokens in all and at least one.
    """
    ids, special, word_starts = _check_sequence(ids, special_mask, word_starts)
    _check_k(partial_k)
    seq_len = len(ids)
    cap = _check_num_predict(num_predict, seq_len)
    pmf = plm_span_length_pmf(max_span)
    # a word starts at a word start, at position 0 and after a special token
    starts = np.ones(seq_len, dtype=bool) if word_starts is None else word_starts.copy()
    starts[0] = True
    starts[1:] |= special[:-1]
    starts &= ~special
    lengths = np.arange(1, max_span + 1)

    spans: list[tuple[int, int]] = []
    covered, cur = 0, 0
    while cur < seq_len and covered < cap:
        length = min(int(rng.choice(lengths, p=pmf)), cap - covered)
        block = max(length, int(round(partial_k * length)))
        left = int(rng.integers(block - length + 1))
        beg = cur + left
        while beg < seq_len and not starts[beg]:
            beg += 1
        if beg >= seq_len:
            break
        end = _span_end(beg, length, starts, special)
        if end - beg > cap - covered:  # a long word: keep the whole words that fit
            end = beg + cap - covered
            while end > beg and not starts[end]:
                end -= 1
            if end == beg:
                break
        spans.append((beg, end))
        covered += end - beg
        cur = end + (block - length - left)
    if not spans:  # nothing landed in the sequence: predict one random word (token)
        beg = int(rng.choice(np.flatnonzero(starts)))
        spans.append((beg, min(_span_end(beg, 1, starts, special), beg + cap)))
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def _span_end(beg: int, n_words: int, starts: np.ndarray, special: np.ndarray) -> int:
    """One past the last token of the ``n_words`` words from ``beg``, stopping at a special token."""
    end, words = beg + 1, 1
    while end < len(starts) and not special[end]:
        if starts[end]:
            if words == n_words:
                break
            words += 1
        end += 1
    return end


def sample_prediction_targets(ids: np.ndarray, *, rng: np.random.Generator, special_mask: np.ndarray,
                              num_predict: int, word_starts: np.ndarray | None = None, partial_k: float = 6,
                              max_span: int = 5) -> np.ndarray:
    """(T,) bool "is a target" mask of ``sample_prediction_spans`` (same arguments and draws)."""
    spans = sample_prediction_spans(ids, rng=rng, special_mask=special_mask, num_predict=num_predict,
                                    word_starts=word_starts, partial_k=partial_k, max_span=max_span)
    targets = np.zeros(len(np.asarray(ids)), dtype=bool)
    for start, end in spans:
        targets[start:end] = True
    return targets


def _check_targets(targets: np.ndarray, seq_len: int) -> np.ndarray:
    targets = np.asarray(targets)
    if targets.dtype != bool or targets.shape != (seq_len,):
        raise LmforgeError(f"targets must be a ({seq_len},) bool mask of the predicted positions; got "
                           f"{targets.dtype} {targets.shape}")
    return targets


def factorization_order(seq_len: int, *, rng: np.random.Generator, targets: np.ndarray,
                        order: str = "random", perm_size: int | None = None) -> np.ndarray:
    """A factorisation order: (T,) int64, a permutation of the positions, ``order[r]`` = the position at rank r.

    The non-targets come first, in position order (they form one context block whose inner order does not
    matter, see ``permutation_masks``); the targets follow in a uniformly random order (``"random"``), or in
    position order (``"identity"``: with every token a target this is the left-to-right order of a causal LM).
    With ``perm_size`` (``"random"`` only) the targets follow XLNet's local permutation instead: chunk by chunk of
    ``perm_size`` positions, left to right, and inside every chunk the order of one random permutation of the
    offsets (the module docstring). Only ``"random"`` draws from ``rng``.
    """
    if order not in ORDERS:
        raise LmforgeError(f"order={order!r} is not one of {', '.join(ORDERS)}")
    if seq_len < 1:
        raise LmforgeError(f"seq_len={seq_len} must be >= 1")
    targets = _check_targets(targets, seq_len)
    target_positions = np.flatnonzero(targets)
    if order == "random" and perm_size is None:
        target_positions = rng.permutation(target_positions)
    elif order == "random":
        check_perm_size(perm_size, seq_len)
        offset_rank = rng.permutation(perm_size)  # the offset at each rank, as the original's shuffled index rows
        rank_of = np.empty(perm_size, dtype=np.int64)
        rank_of[offset_rank] = np.arange(perm_size)
        key = (target_positions // perm_size) * perm_size + rank_of[target_positions % perm_size]
        target_positions = target_positions[np.argsort(key, kind="stable")]
    return np.concatenate([np.flatnonzero(~targets), target_positions]).astype(np.int64)


def check_perm_size(perm_size: int, seq_len: int) -> int:
    """``perm_size`` must be a positive integer dividing the length it permutes (the original reshapes by it)."""
    if isinstance(perm_size, bool) or not isinstance(perm_size, int | np.integer) or perm_size < 1 \
            or seq_len % perm_size:
        raise LmforgeError(f"perm_size={perm_size!r} must be an integer >= 1 that divides the permuted length "
                           f"{seq_len} (XLNet: perm_size = reuse_len = seq_len / 2); unset it to permute the whole "
                           "sequence")
    return int(perm_size)


def permutation_masks(order: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The content- and query-stream masks of a factorisation order; True = may NOT attend.

    With r(i) the rank of position i in ``order`` and C the number of non-targets (the first C ranks), position
    i sees position j in the content stream iff ``j == i``, or j is a non-target, or ``r(j) < r(i)``; except
    that a non-target sees no target (a non-target's "earlier" is the whole context block, whose members share
    one rank as in the original code). The query stream is the content stream without ``j == i``.

    Args:
        order: (T,) a permutation of ``range(T)`` with the non-targets at the first C ranks
            (``factorization_order``).
        targets: (T,) bool, the predicted positions.

    Returns:
        ``(perm_mask, query_perm_mask)``, both (T, T) bool; ``query_perm_mask = perm_mask | eye(T)``.
    """
    order = np.asarray(order)
    seq_len = len(order)
    targets = _check_targets(targets, seq_len)
    if order.ndim != 1 or not np.array_equal(np.sort(order), np.arange(seq_len)):
        raise LmforgeError(f"order must be a permutation of range({seq_len}), as from factorization_order")
    n_context = int((~targets).sum())
    if targets[order[:n_context]].any():
        raise LmforgeError("order must put every non-target before every target (use factorization_order)")
    rank = np.empty(seq_len, dtype=np.int64)
    rank[order] = np.arange(seq_len)
    # i sees j when j's rank is below i's, where every context rank counts as "below" for a context i
    threshold = np.maximum(rank, n_context)
    can_see = rank[None, :] < threshold[:, None]
    eye = np.eye(seq_len, dtype=bool)
    perm_mask = ~(can_see | eye)
    return perm_mask, perm_mask | eye


def target_arrays(ids: np.ndarray, targets: np.ndarray, num_predict: int) -> dict[str, np.ndarray]:
    """The fixed-size prediction rows of the targets, in increasing position order.

    Returns:
        ``target_mapping`` (N, T) float32 one-hot rows (zero rows after the targets), ``target_mask`` (N,) bool,
        ``labels`` (N,) int64 (``-100`` on padding rows), with ``N = num_predict``.
    """
    ids = np.asarray(ids, dtype=np.int64)
    seq_len = len(ids)
    targets = _check_targets(targets, seq_len)
    n_rows = _check_num_predict(num_predict, seq_len)
    positions = np.flatnonzero(targets)
    if len(positions) > n_rows:
        raise LmforgeError(f"{len(positions)} targets do not fit in num_predict={n_rows} rows; raise num_predict "
                           f"or sample the targets with the same num_predict")
    rows = np.arange(len(positions))
    target_mapping = np.zeros((n_rows, seq_len), dtype=np.float32)
    target_mapping[rows, positions] = 1.0
    target_mask = np.zeros(n_rows, dtype=bool)
    target_mask[rows] = True
    labels = np.full(n_rows, IGNORE_INDEX, dtype=np.int64)
    labels[rows] = ids[positions]
    return {"target_mapping": target_mapping, "target_mask": target_mask, "labels": labels}


def plm_example(ids: np.ndarray, *, rng: np.random.Generator, special_mask: np.ndarray, partial_k: float = 6,
                max_span: int = 5, num_predict: int | None = None, word_starts: np.ndarray | None = None,
                order: str = "random", perm_size: int | None = None) -> dict[str, np.ndarray]:
    """One PLM example: targets, then the factorisation order, then the masks (in that order of draws).

    Args:
        ids: (T,) token ids of one sequence.
        rng: the generator every random choice draws from.
        special_mask: (T,) bool, True at special and padding tokens.
        partial_k: K, about 1/K of the tokens are predicted (XLNet 6).
        max_span: the longest span in tokens (words with ``word_starts``) (XLNet 5).
        num_predict: N, the prediction rows and the cap on targets (``None``: ``ceil(T / K)``).
        word_starts: optional (T,) bool word starts for whole-word spans.
        order: ``"random"`` or ``"identity"`` (see ``factorization_order``).
        perm_size: XLNet's local permutation (see ``factorization_order``); None: the whole sequence.

    Returns:
        A dict of numpy arrays: ``input_ids`` (T,) int64 (unchanged), ``perm_mask`` (T, T) bool (content stream),
        ``query_perm_mask`` (T, T) bool (query stream), ``target_mapping`` (N, T) float32, ``target_mask`` (N,)
        bool, ``labels`` (N,) int64, and ``is_target`` (T,) bool and ``order`` (T,) int64 for inspection.
    """
    ids, special_mask, word_starts = _check_sequence(ids, special_mask, word_starts)
    seq_len = len(ids)
    n_rows = default_num_predict(seq_len, partial_k) if num_predict is None else num_predict
    targets = sample_prediction_targets(ids, rng=rng, special_mask=special_mask, num_predict=n_rows,
                                        word_starts=word_starts, partial_k=partial_k, max_span=max_span)
    factor_order = factorization_order(seq_len, rng=rng, targets=targets, order=order, perm_size=perm_size)
    perm_mask, query_perm_mask = permutation_masks(factor_order, targets)
    return {"input_ids": ids.copy(), "perm_mask": perm_mask, "query_perm_mask": query_perm_mask,
            **target_arrays(ids, targets, n_rows), "is_target": targets, "order": factor_order}


def plm_memory_example(ids: np.ndarray, *, reuse_len: int, rng: np.random.Generator, special_mask: np.ndarray,
                       partial_k: float = 6, max_span: int = 5, num_predict: int | None = None,
                       word_starts: np.ndarray | None = None, perm_size: int | None = None) -> dict[str, np.ndarray]:
    """One PLM example of a sequence read with segment recurrence: the reused part ``ids[:reuse_len]`` and the rest,
    each with its own targets and order (module docstring), joined by the original's block masks.

    Args:
        ids: (T,) token ids; the first ``reuse_len`` continue the previous sequence of the stream.
        reuse_len: R, 1..T-1: the positions whose states the next sequence reuses as memory.
        rng, special_mask, partial_k, max_span, word_starts: as ``plm_example``.
        num_predict: N, the prediction rows of the whole sequence (``None``: ``ceil(T / K)``), shared by the parts
            in proportion to their lengths (each part at least one row).
        perm_size: XLNet's local permutation inside each part (it must divide R and T - R); None: each part
            permuted as a whole.

    Returns:
        ``plm_example``'s arrays for the whole sequence: the masks (T, T) with the reused part unable to see the rest
        and the rest seeing all of the reused part; the prediction rows of the reused part first, then the rest's
        (so still in increasing position order); ``order`` is the reused part's order, then the rest's.
    """
    ids, special_mask, word_starts = _check_sequence(ids, special_mask, word_starts)
    seq_len = len(ids)
    if isinstance(reuse_len, bool) or not isinstance(reuse_len, int | np.integer) or not 1 <= reuse_len < seq_len:
        raise LmforgeError(f"reuse_len={reuse_len!r} must be an integer in 1..{seq_len - 1} (fewer than the sequence's "
                           f"{seq_len} tokens: the rest is what the sequence adds); XLNet uses seq_len / 2")
    n_rows = default_num_predict(seq_len, partial_k) if num_predict is None else _check_num_predict(num_predict,
                                                                                                      seq_len)
    if n_rows < 2:
        raise LmforgeError(f"num_predict={n_rows} must be >= 2 with reuse_len: each part of the sequence predicts")
    bounds = ((0, reuse_len), (reuse_len, seq_len))
    rows0 = min(max(1, round(n_rows * reuse_len / seq_len)), n_rows - 1, reuse_len)
    shares = (rows0, min(n_rows - rows0, seq_len - reuse_len))
    targets = np.zeros(seq_len, dtype=bool)
    orders, masks = [], []
    for (beg, end), rows in zip(bounds, shares, strict=True):
        part_special = special_mask[beg:end]
        part_targets = np.zeros(end - beg, dtype=bool)
        if (~part_special).any():
            part_targets = sample_prediction_targets(
                ids[beg:end], rng=rng, special_mask=part_special, num_predict=rows,
                word_starts=None if word_starts is None else word_starts[beg:end], partial_k=partial_k,
                max_span=max_span)
        if perm_size is not None:
            check_perm_size(perm_size, end - beg)
        part_order = factorization_order(end - beg, rng=rng, targets=part_targets, perm_size=perm_size)
        targets[beg:end] = part_targets
        orders.append(part_order + beg)
        masks.append(permutation_masks(part_order, part_targets)[0])
    perm_mask = np.ones((seq_len, seq_len), dtype=bool)  # the reused part sees nothing of the rest
    perm_mask[:reuse_len, :reuse_len] = masks[0]
    perm_mask[reuse_len:, :reuse_len] = False  # the rest sees the whole reused part
    perm_mask[reuse_len:, reuse_len:] = masks[1]
    eye = np.eye(seq_len, dtype=bool)
    return {"input_ids": ids.copy(), "perm_mask": perm_mask, "query_perm_mask": perm_mask | eye,
            **target_arrays(ids, targets, n_rows), "is_target": targets, "order": np.concatenate(orders)}
