"""Static word vectors: look-up, nearest neighbours, 3CosAdd analogies and the two standard evaluations.

``KeyedVectors`` mirrors the part of gensim's class of the same name that evaluation needs: ``vectors``
(N, D), ``words`` (row order), ``index`` (word -> row), ``most_similar``, ``similarity``, ``analogy``,
``evaluate_pairs`` (Spearman's rho against human scores, e.g. WordSim-353 or SimLex-999) and
``evaluate_analogies`` (accuracy on the Google analogy questions, ``: section`` lines then ``a b c d``).
Similarities are cosines. Look-ups in the evaluations are case-insensitive by default, as in gensim: a test
word matches the most frequent (first) vocabulary word with the same lower-cased form.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmforge.data.text import decode_utf8
from lmforge.errors import InputFileError, LmforgeError


def rank_average(values: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their average rank (as for Spearman's rho)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_vals = values[order]
    # group equal values: each group gets the mean of the positions it spans
    starts = np.flatnonzero(np.r_[True, sorted_vals[1:] != sorted_vals[:-1]])
    ends = np.r_[starts[1:], len(values)]
    for s, e in zip(starts, ends, strict=True):
        ranks[order[s:e]] = (s + e + 1) / 2.0
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the tie-averaged ranks (NaN for fewer than 2 points or no
    variation)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
    if len(x) < 2:
        return math.nan
    rx, ry = rank_average(x), rank_average(y)
    rx -= rx.mean()
    ry -= ry.mean()
    denom = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return float((rx * ry).sum() / denom) if denom > 0 else math.nan


@dataclass
class PairsResult:
    """Word-pair similarity evaluation: Spearman's rho on the pairs whose two words are known."""

    spearman: float
    pairs: int  # pairs scored
    oov_pairs: int  # pairs skipped because a word is not in the vocabulary
    total: int

    @property
    def oov_ratio(self) -> float:
        return self.oov_pairs / self.total if self.total else 0.0


@dataclass
class AnalogyResult:
    """Analogy accuracy overall and per ``: section``; questions with an unknown word are skipped."""

    accuracy: float
    correct: int
    questions: int  # questions answered (all four words known)
    oov_questions: int
    sections: dict[str, tuple[int, int]] = field(default_factory=dict)  # section -> (correct, answered)


class KeyedVectors:
    """Word vectors with cosine look-ups.

    Args:
        words: the word of each row (unique).
        vectors: (N, D) float array.
    """

    def __init__(self, words: Sequence[str], vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(words):
            raise LmforgeError(f"vectors of shape {vectors.shape} do not match {len(words)} words; need (N, D)")
        self.words = list(words)
        self.vectors = vectors
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise LmforgeError("words must be unique")
        self._unit: np.ndarray | None = None
        self._lower: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def __getitem__(self, word: str) -> np.ndarray:
        return self.vectors[self._row(word)]

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def _row(self, word: str) -> int:
        try:
            return self.index[word]
        except KeyError:
            raise KeyError(f"{word!r} is not in the vocabulary ({len(self):,} words)") from None

    def non_finite_words(self) -> list[str]:
        """The words whose vector holds a NaN or an infinity (what a diverged training writes)."""
        bad = ~np.isfinite(self.vectors).all(axis=1)
        return [self.words[i] for i in np.flatnonzero(bad)]

    def require_finite(self, source: str | Path = "the vectors") -> None:
        """Refuse vectors with NaN or infinite entries: every cosine with them is NaN, and a score computed from
        them (Spearman's rho, an analogy accuracy) would look like a result while meaning nothing.

        Raises:
            LmforgeError: naming ``source``, how many words are affected, the first of them, and the fix.
        """
        bad = self.non_finite_words()
        if bad:
            shown = ", ".join(repr(w) for w in bad[:5]) + (", ..." if len(bad) > 5 else "")
            raise LmforgeError(f"{source}: {len(bad):,} of {len(self):,} vectors hold NaN or infinite values "
                               f"({shown}); the training that wrote them diverged. Train them again (a lower "
                               "learning rate: --lr)")

    def unit_vectors(self) -> np.ndarray:
        """(N, D) rows scaled to unit length (zero rows stay zero); cached."""
        if self._unit is None:
            norms = np.linalg.norm(self.vectors, axis=1, keepdims=True)
            self._unit = (self.vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)
        return self._unit

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of two words."""
        unit = self.unit_vectors()
        return float(unit[self._row(a)] @ unit[self._row(b)])

    def most_similar(self, query: str | np.ndarray, topn: int = 10,
                     exclude: Iterable[str] = ()) -> list[tuple[str, float]]:
        """The ``topn`` words of highest cosine with a word (itself excluded) or a vector."""
        unit = self.unit_vectors()
        skip = {self.index[w] for w in exclude if w in self.index}
        if isinstance(query, str):
            skip.add(self._row(query))
            q = unit[self.index[query]]
        else:
            q = np.asarray(query, dtype=np.float32)
            norm = np.linalg.norm(q)
            q = q / norm if norm > 0 else q
        sims = unit @ q
        if skip:
            sims[list(skip)] = -np.inf
        k = min(topn, len(self) - len(skip))
        if k <= 0:
            return []
        top = np.argpartition(-sims, k - 1)[:k]
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(self.words[i], float(sims[i])) for i in top]

    def analogy(self, a: str, b: str, c: str, topn: int = 1) -> list[tuple[str, float]]:
        """3CosAdd (Mikolov et al., 2013c): the words d maximising cos(d, b - a + c) over unit vectors, the three
        query words excluded ("a is to b as c is to d")."""
        unit = self.unit_vectors()
        target = unit[self._row(b)] - unit[self._row(a)] + unit[self._row(c)]
        return self.most_similar(target, topn=topn, exclude=(a, b, c))

    def _lookup(self, word: str, case_insensitive: bool) -> int | None:
        if word in self.index:
            return self.index[word]
        if not case_insensitive:
            return None
        if self._lower is None:
            self._lower = {}
            for i, w in enumerate(self.words):
                self._lower.setdefault(w.lower(), i)
        return self._lower.get(word.lower())

    def evaluate_pairs(self, path: str | Path, case_insensitive: bool = True) -> PairsResult:
        """Spearman's rho between cosine similarities and human scores of word pairs.

        The file holds one pair per line, ``word1 word2 score`` separated by tabs or spaces; blank lines and lines
        starting with ``#`` are skipped (the WordSim-353 and SimLex-999 files that gensim ships read as they are,
        including SimLex's header line). Pairs with an unknown word are left out and counted in ``oov_pairs``.

        Raises:
            InputFileError: the file is missing, a line is malformed (its number is named), or it holds no pairs.
            LmforgeError: some vectors are NaN or infinite (``require_finite``).
        """
        self.require_finite()
        lines = _read_lines(path)
        human: list[float] = []
        model: list[float] = []
        total = oov = 0
        unit = self.unit_vectors()
        for no, line in lines:
            parts = line.split()
            if len(parts) < 3:
                raise InputFileError(f"{path}, line {no}: expected 'word1 word2 score', got {line!r}")
            try:
                score = float(parts[2])
            except ValueError:
                if total == 0:  # a header line such as SimLex-999's "word1 word2 POS SimLex999 ..."
                    continue
                raise InputFileError(f"{path}, line {no}: the score {parts[2]!r} is not a number") from None
            total += 1
            i, j = self._lookup(parts[0], case_insensitive), self._lookup(parts[1], case_insensitive)
            if i is None or j is None:
                oov += 1
                continue
            human.append(score)
            model.append(float(unit[i] @ unit[j]))
        if total == 0:
            raise InputFileError(f"{path}: holds no 'word1 word2 score' lines")
        return PairsResult(spearman=spearman(model, human), pairs=len(human), oov_pairs=oov, total=total)

    def evaluate_analogies(self, path: str | Path, case_insensitive: bool = True,
                           batch_size: int = 512) -> AnalogyResult:
        """Accuracy of 3CosAdd on analogy questions in the Google format (Mikolov et al., 2013a).

        ``: section`` lines start a section; every other non-blank line is ``a b c d`` (a is to b as c is to d).
        A question counts as correct when d is the best word, the three query words excluded. Questions with an
        unknown word are skipped and counted in ``oov_questions``.

        Raises:
            InputFileError: the file is missing, a line does not hold four words (its number is named), or it
                holds no questions.
            LmforgeError: some vectors are NaN or infinite (``require_finite``).
        """
        self.require_finite()
        section = "(no section)"
        questions: list[tuple[str, int, int, int, int]] = []
        sections: dict[str, list[int]] = {}
        oov = 0
        for no, line in _read_lines(path, comment=None):
            if line.startswith(":"):
                section = line[1:].strip() or "(unnamed)"
                sections.setdefault(section, [0, 0])
                continue
            parts = line.split()
            if len(parts) != 4:
                raise InputFileError(f"{path}, line {no}: expected four words 'a b c d' or a ': section' line, "
                                     f"got {line!r}")
            rows = [self._lookup(w, case_insensitive) for w in parts]
            sections.setdefault(section, [0, 0])
            if any(r is None for r in rows):
                oov += 1
                continue
            questions.append((section, *rows))  # type: ignore[arg-type]
        if not questions and not oov:
            raise InputFileError(f"{path}: holds no analogy questions ('a b c d' lines)")
        unit = self.unit_vectors()
        correct = 0
        for start in range(0, len(questions), batch_size):
            part = questions[start:start + batch_size]
            abcd = np.array([q[1:] for q in part], dtype=np.int64)  # (Q, 4)
            target = unit[abcd[:, 1]] - unit[abcd[:, 0]] + unit[abcd[:, 2]]  # (Q, D)
            sims = target @ unit.T  # (Q, N); the norm of target does not change the argmax
            rows = np.arange(len(part))
            for col in range(3):
                sims[rows, abcd[:, col]] = -np.inf
            hit = sims.argmax(axis=1) == abcd[:, 3]
            for (sec, *_), h in zip(part, hit, strict=True):
                sections[sec][1] += 1
                sections[sec][0] += int(h)
            correct += int(hit.sum())
        n = len(questions)
        return AnalogyResult(accuracy=correct / n if n else math.nan, correct=correct, questions=n,
                             oov_questions=oov, sections={k: (v[0], v[1]) for k, v in sections.items()})


def _read_lines(path: str | Path, comment: str | None = "#") -> list[tuple[int, str]]:
    """Non-blank lines (with their 1-based numbers) of a UTF-8 text file, comment lines skipped."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: no such file; check the path")
    text, _ = decode_utf8(path.read_bytes())
    out = []
    for no, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or (comment is not None and line.startswith(comment)):
            continue
        out.append((no, line))
    return out
