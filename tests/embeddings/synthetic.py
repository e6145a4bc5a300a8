"""A tiny synthetic corpus with planted synonyms, shared by the word2vec and GloVe tests.

Each topic has its own context words and one planted pair of interchangeable words ("car"/"automobile"...):
a sentence picks a topic, one word of its pair and a few of its context words, so the two words of a pair
occur in identical contexts and never together. Two "noise" words from any topic's context words join each
sentence, so that words of different topics co-occur a little too (GloVe fits only non-zero co-occurrences: with
none between topics it would leave their relative position free). Random pairs take their two words from
different topics.
"""

from __future__ import annotations

import itertools

import numpy as np

TOPICS = {
    ("car", "automobile"): "drove road garage parked tires engine fuel highway driver wheel".split(),
    ("film", "movie"): "watched cinema actor director screen scene ticket premiere studio cast".split(),
    ("doctor", "physician"): "hospital patient clinic nurse medicine treated surgery diagnosis ward illness".split(),
    ("song", "tune"): "sang singer guitar chorus melody album lyrics band concert radio".split(),
    ("money", "cash"): "bank paid wallet spend price loan account savings coins pocket".split(),
}
FUNCTION_WORDS = "the a of and to in".split()
PLANTED = list(TOPICS)


def planted_corpus(n_sentences: int = 1500, seed: int = 0, noise: int = 2) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    pairs = list(TOPICS)
    everything = [w for context in TOPICS.values() for w in context]
    sentences = []
    for _ in range(n_sentences):
        pair = pairs[rng.integers(len(pairs))]
        context = TOPICS[pair]
        words = [pair[rng.integers(2)]]
        words += [context[i] for i in rng.choice(len(context), size=4, replace=False)]
        words += [FUNCTION_WORDS[i] for i in rng.integers(len(FUNCTION_WORDS), size=2)]
        words += [everything[i] for i in rng.integers(len(everything), size=noise)]
        rng.shuffle(words)
        sentences.append(words)
    return sentences


def random_pairs() -> list[tuple[str, str]]:
    """Every pair of planted words from two different topics."""
    out = []
    for p, q in itertools.combinations(PLANTED, 2):
        out += [(a, b) for a in p for b in q]
    return out


def planted_ranks_above_random(similarity) -> tuple[float, float]:
    """(lowest planted-pair similarity, highest random-pair similarity)."""
    planted = min(similarity(a, b) for a, b in PLANTED)
    random = max(similarity(a, b) for a, b in random_pairs())
    return planted, random
