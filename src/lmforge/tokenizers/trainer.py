"""Learning a WordPiece vocabulary with the likelihood score (Schuster & Nakajima, 2012).

Start from the special tokens and the alphabet: every character that begins a word, and ``##c`` for every
character ``c`` seen inside a word. Split each distinct word of the corpus into those units
(``hugs`` -> ``h ##u ##g ##s``), then repeatedly merge the adjacent pair of units with the highest score

    score(a, b) = freq(ab) / (freq(a) * freq(b))

where ``freq(ab)`` counts the pair's occurrences in the current segmentation of the corpus and ``freq(a)``
the unit's. The score is the gain in corpus log-likelihood of a unigram language model over units when
``a b`` becomes one unit, up to a monotone transform: it prefers pairs whose parts rarely occur apart, not
merely frequent pairs. The merged unit keeps ``##`` only when its left part had it
(``h`` + ``##u`` -> ``hu``; ``##g`` + ``##s`` -> ``##gs``). Training stops at ``vocab_size`` tokens.

``algorithm="bpe-count"`` scores a pair by its count alone (what Hugging Face tokenizers' WordPieceTrainer
does), on the same machinery, so that the two can be compared.

``algorithm="words"`` learns no pieces: a word-level vocabulary, the special tokens then the words seen at least
``min_frequency`` times, most frequent first (ties by the word), up to ``vocab_size`` tokens. With no ``##`` entry
in it, the WordPiece encoder keeps every word it knows whole and makes every other word ``[UNK]`` (the greedy
split of an unknown word finds no continuation piece): a word tokenizer (ELMo's biLM reads whole words, Peters et
al. 2018), with BERT's word splitting and lower-casing and the same folder format.

Efficiency: words are counted once; each merge rewrites only the words that contain the pair and updates
pair counts incrementally. Because a merge lowers ``freq(a)`` and ``freq(b)``, it *raises* the score of
every pair that contains ``a`` or ``b``; those pairs are re-scored and pushed again on a lazy max-heap
whose stale entries are recognised (their score or count no longer matches) and dropped when popped.
Ties break deterministically: higher score, then higher pair count, then the pair's strings in order.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from lmforge.errors import LmforgeError
from lmforge.tokenizers.basic import BasicTokenizer
from lmforge.tokenizers.wordpiece import DEFAULT_SPECIAL_TOKENS, WordPieceTokenizer

log = logging.getLogger("lmforge")

ALGORITHMS = ("wordpiece", "bpe-count", "words")
_SHIFT = 1 << 24  # pair key = left * _SHIFT + right (unit ids stay far below 16M)


@dataclass(frozen=True)
class Merge:
    """One step of training: ``left`` + ``right`` became ``merged``, chosen with this score and count."""

    left: str
    right: str
    merged: str
    score: float
    count: int


def merge_units(left: str, right: str) -> str:
    """Join two units; ``##`` survives only as the left part's prefix."""
    return left + (right[2:] if right.startswith("##") else right)


class WordPieceTrainer:
    """Learn a WordPiece vocabulary from text.

    Args:
        vocab_size: the number of tokens to reach (special tokens and alphabet included).
        algorithm: ``"wordpiece"`` (likelihood score), ``"bpe-count"`` (pair count) or ``"words"`` (whole words
            only, see the module docstring).
        min_frequency: pairs seen fewer times are never merged (the likelihood score favours rare pairs:
            a pair of two units that each occur once scores 1.0, the maximum; 2 keeps such hapax merges out);
            ``"words"``: words seen fewer times are left out (they become ``[UNK]``).
        limit_alphabet: keep only this many most frequent characters; words with other characters are left
            out of training (the encoder makes them ``[UNK]``, as BERT does). ``None`` keeps all.
        lowercase: lower-case (and strip accents) before counting, as for an uncased BERT.
        special_tokens: the first tokens of the vocabulary, in order.
        max_input_chars_per_word: longer words are left out (the encoder makes them ``[UNK]``).
        show_progress: show tqdm progress bars.
        newline_token: a special token for line breaks (``WordPieceTokenizer``'s ``newline_token``), added after
            ``special_tokens``; None: line breaks are spaces, as BERT's.
    """

    def __init__(self, vocab_size: int = 30_000, *, algorithm: str = "wordpiece", min_frequency: int = 2,
                 limit_alphabet: int | None = None, lowercase: bool = True,
                 special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS, max_input_chars_per_word: int = 100,
                 show_progress: bool = False, newline_token: str | None = None) -> None:
        if algorithm not in ALGORITHMS:
            raise LmforgeError(f"algorithm={algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        if vocab_size < 1:
            raise LmforgeError(f"vocab_size must be positive, got {vocab_size}")
        if min_frequency < 1:
            raise LmforgeError(f"min_frequency must be >= 1, got {min_frequency}")
        if limit_alphabet is not None and limit_alphabet < 1:
            raise LmforgeError(f"limit_alphabet must be >= 1 (or None for no limit), got {limit_alphabet}")
        if len(set(special_tokens)) != len(special_tokens):
            raise LmforgeError(f"special_tokens lists a token twice: {list(special_tokens)}")
        missing = [t for t in DEFAULT_SPECIAL_TOKENS if t not in special_tokens]
        if missing:
            raise LmforgeError(f"special_tokens must include {', '.join(missing)} (BERT's roles); add them "
                               "to the list, in any order")
        self.vocab_size = vocab_size
        self.algorithm = algorithm
        self.min_frequency = min_frequency
        self.limit_alphabet = limit_alphabet
        self.lowercase = lowercase
        self.special_tokens = list(special_tokens)
        self.newline_token = newline_token
        if newline_token is not None and newline_token not in self.special_tokens:
            self.special_tokens.append(newline_token)
        self.max_input_chars_per_word = max_input_chars_per_word
        self.show_progress = show_progress
        self.basic = BasicTokenizer(lowercase=lowercase)
        self.merges: list[Merge] = []
        self.report: dict[str, int | str] = {}

    # ------------------------------------------------------------------ counting
    def count_words(self, texts: Iterable[str], counts: Counter[str] | None = None) -> Counter[str]:
        """Count the normalised words of the texts (each distinct raw word is normalised once)."""
        raw_counts: Counter[str] = Counter()
        for text in texts:
            raw_counts.update(self.basic.pattern.findall(text))
        counts = Counter() if counts is None else counts
        for raw, n in raw_counts.items():
            for word, _ in self.basic.analyze(raw):
                counts[word] += n
        return counts

    def train(self, texts: Iterable[str]) -> WordPieceTokenizer:
        """Count the words of ``texts`` once, then learn the vocabulary."""
        return self.train_from_word_counts(self.count_words(texts))

    # ------------------------------------------------------------------ learning
    def train_from_word_counts(self, counts: Mapping[str, int]) -> WordPieceTokenizer:
        """Learn the vocabulary from ``{normalised word: count}``; ``self.merges`` records each step."""
        if not counts or not any(n > 0 for n in counts.values()):
            raise LmforgeError("the corpus holds no words; give text files with some content")
        if self.algorithm == "words":
            return self._word_vocabulary(counts)
        alphabet = self._alphabet(counts)
        kept = sorted(w for w, n in counts.items()
                      if n > 0 and len(w) <= self.max_input_chars_per_word and all(c in alphabet for c in w))
        initial = sorted({w[0] for w in kept})
        internal = sorted({"##" + c for w in kept for c in w[1:]})
        units: list[str] = initial + internal
        unit_id = {u: i for i, u in enumerate(units)}
        specials = set(self.special_tokens)
        base = len(self.special_tokens) + sum(1 for u in units if u not in specials)
        if self.vocab_size < base:
            raise LmforgeError(
                f"vocab_size={self.vocab_size} is below the special tokens plus the alphabet ({base} tokens: "
                f"{len(self.special_tokens)} special, {len(initial)} word-initial and {len(internal)} "
                f"word-internal characters); raise vocab_size to at least {base} or set limit_alphabet")
        words = [[unit_id[w[0]], *(unit_id["##" + c] for c in w[1:])] for w in kept]
        wcount = [counts[w] for w in kept]
        self.report = {"distinct_words": len(counts), "words_used": len(kept),
                       "alphabet": len(units), "skipped_words": len(counts) - len(kept)}
        vocab = list(self.special_tokens) + [u for u in units if u not in specials]
        self.merges = []
        self._learn(words, wcount, units, unit_id, vocab, specials)
        return WordPieceTokenizer(vocab, lowercase=self.lowercase, special_tokens=self.special_tokens,
                                  max_input_chars_per_word=self.max_input_chars_per_word,
                                  newline_token=self.newline_token)

    def _word_vocabulary(self, counts: Mapping[str, int]) -> WordPieceTokenizer:
        """``algorithm="words"``: the special tokens, then the most frequent words (see the module docstring)."""
        specials = set(self.special_tokens)
        if self.vocab_size <= len(specials):
            raise LmforgeError(f"vocab_size={self.vocab_size} leaves no room for a word after the "
                               f"{len(specials)} special tokens; raise vocab_size")
        eligible = [(w, n) for w, n in counts.items() if n >= self.min_frequency and w not in specials
                    and len(w) <= self.max_input_chars_per_word]
        eligible.sort(key=lambda wn: (-wn[1], wn[0]))
        words = [w for w, _ in eligible[:self.vocab_size - len(self.special_tokens)]]
        total = sum(n for n in counts.values() if n > 0)
        covered = sum(counts[w] for w in words)
        self.report = {"distinct_words": len(counts), "words_used": len(words),
                       "skipped_words": len(counts) - len(words),
                       "unknown_token_rate": round(1 - covered / total, 6) if total else 0.0}
        self.merges = []
        return WordPieceTokenizer(list(self.special_tokens) + words, lowercase=self.lowercase,
                                  special_tokens=self.special_tokens,
                                  max_input_chars_per_word=self.max_input_chars_per_word,
                                  newline_token=self.newline_token)

    def _alphabet(self, counts: Mapping[str, int]) -> set[str]:
        freq: Counter[str] = Counter()
        for w, n in counts.items():
            for c in w:
                freq[c] += n
        if self.limit_alphabet is None or len(freq) <= self.limit_alphabet:
            return set(freq)
        ranked = sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))
        dropped = len(ranked) - self.limit_alphabet
        log.info("limit_alphabet=%d drops %d rare characters", self.limit_alphabet, dropped)
        return {c for c, _ in ranked[: self.limit_alphabet]}

    def _learn(self, words: list[list[int]], wcount: list[int], units: list[str], unit_id: dict[str, int],
               vocab: list[str], specials: set[str]) -> None:
        likelihood = self.algorithm == "wordpiece"
        unit_freq = [0] * len(units)
        pair_count: dict[int, int] = {}
        pair_where: dict[int, set[int]] = {}
        for wi, syms in enumerate(words):
            c = wcount[wi]
            for u in syms:
                unit_freq[u] += c
            for x, y in zip(syms, syms[1:], strict=False):
                k = x * _SHIFT + y
                pair_count[k] = pair_count.get(k, 0) + c
                pair_where.setdefault(k, set()).add(wi)
        unit_pairs: list[set[int]] = [set() for _ in units]
        for k in pair_count:
            a, b = divmod(k, _SHIFT)
            unit_pairs[a].add(k)
            unit_pairs[b].add(k)

        def entry(k: int) -> tuple:
            a, b = divmod(k, _SHIFT)
            n = pair_count[k]
            score = n / (unit_freq[a] * unit_freq[b]) if likelihood else float(n)
            return (-score, -n, units[a], units[b], k)

        heap = [entry(k) for k in pair_count]
        heapq.heapify(heap)
        target = self.vocab_size
        bar = tqdm(total=max(0, target - len(vocab)), desc=f"merging ({self.algorithm})", unit="token",
                   disable=not self.show_progress)
        stop_reason = "vocab_size reached"
        while len(vocab) < target:
            if not heap:
                stop_reason = "no pair left to merge"
                break
            neg_score, neg_n, left, right, k = heapq.heappop(heap)
            n = pair_count.get(k, 0)
            if n != -neg_n or n < self.min_frequency:
                continue  # stale, or too rare (pair counts never grow, so it will not qualify later)
            a, b = divmod(k, _SHIFT)
            score = n / (unit_freq[a] * unit_freq[b]) if likelihood else float(n)
            if score != -neg_score:
                continue  # stale: a fresher entry for this pair is in the heap
            merged = merge_units(left, right)
            new = unit_id.get(merged)
            if new is None:
                new = unit_id[merged] = len(units)
                units.append(merged)
                unit_freq.append(0)
                unit_pairs.append(set())
                if merged not in specials:
                    vocab.append(merged)
                    bar.update(1)
            self.merges.append(Merge(left, right, merged, score, n))
            changed = self._apply_merge(k, a, b, new, words, wcount, unit_freq, pair_count, pair_where,
                                        unit_pairs)
            rescore = changed | unit_pairs[a] | unit_pairs[b] | unit_pairs[new] if likelihood else changed
            for kk in rescore:
                if kk in pair_count:
                    heapq.heappush(heap, entry(kk))
            if len(heap) > 4 * len(pair_count) + 1000:  # drop stale entries now and then
                heap = [entry(kk) for kk in pair_count]
                heapq.heapify(heap)
        bar.close()
        self.report.update(merges=len(self.merges), vocab_size=len(vocab), stopped=stop_reason)
        if len(vocab) < target:
            log.warning("the corpus supports only %d tokens (asked for %d): %s; the vocabulary is smaller",
                        len(vocab), target, "every word is already a single unit" if not pair_count
                        else f"remaining pairs occur fewer than min_frequency={self.min_frequency} times")

    @staticmethod
    def _apply_merge(k, a, b, new, words, wcount, unit_freq, pair_count, pair_where, unit_pairs) -> set[int]:
        """Rewrite the words holding pair ``k`` = (a, b); update counts. Returns the pairs whose count moved."""
        delta: dict[int, int] = {}
        for wi in pair_where.pop(k, ()):
            syms = words[wi]
            out: list[int] = []
            i, n_sym, hits = 0, len(syms), 0
            while i < n_sym:
                if i + 1 < n_sym and syms[i] == a and syms[i + 1] == b:
                    out.append(new)
                    i += 2
                    hits += 1
                else:
                    out.append(syms[i])
                    i += 1
            if not hits:
                continue  # the word lost this pair in an earlier merge (sets are cleaned lazily)
            c = wcount[wi]
            unit_freq[a] -= c * hits
            unit_freq[b] -= c * hits
            unit_freq[new] += c * hits
            for x, y in zip(syms, syms[1:], strict=False):
                kk = x * _SHIFT + y
                delta[kk] = delta.get(kk, 0) - c
            for x, y in zip(out, out[1:], strict=False):
                kk = x * _SHIFT + y
                delta[kk] = delta.get(kk, 0) + c
                if x == new or y == new:
                    pair_where.setdefault(kk, set()).add(wi)
            words[wi] = out
        changed = set()
        for kk, d in delta.items():
            if d == 0:
                continue
            changed.add(kk)
            before = pair_count.get(kk, 0)
            after = before + d
            x, y = divmod(kk, _SHIFT)
            if after <= 0:
                pair_count.pop(kk, None)
                unit_pairs[x].discard(kk)
                unit_pairs[y].discard(kk)
            else:
                pair_count[kk] = after
                if before == 0:
                    unit_pairs[x].add(kk)
                    unit_pairs[y].add(kk)
        return changed


def train_wordpiece(texts: Iterable[str], vocab_size: int = 30_000, **options) -> WordPieceTokenizer:
    """Learn a WordPiece vocabulary from texts; see ``WordPieceTrainer`` for the options."""
    return WordPieceTrainer(vocab_size, **options).train(texts)
