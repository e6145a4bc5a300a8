from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmforge.errors import LmforgeError
from lmforge.tokenizers import WordPieceTrainer
from lmforge.tokenizers.trainer import merge_units

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The small corpus of the lecture notes (word: count).
CORPUS = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}


def naive_train(counts, vocab_size, algorithm="wordpiece", min_frequency=1):
    """Reference trainer: recount every unit and pair from scratch before each merge."""
    segs = {w: [w[0], *("##" + c for c in w[1:])] for w in counts}
    alphabet = sorted({s[0] for s in segs.values()}) + sorted({u for s in segs.values() for u in s[1:]})
    vocab = SPECIALS + alphabet
    merges = []
    while len(vocab) < vocab_size:
        units, pairs = Counter(), Counter()
        for w, seg in segs.items():
            for u in seg:
                units[u] += counts[w]
            for a, b in zip(seg, seg[1:], strict=False):
                pairs[a, b] += counts[w]
        candidates = [(p, n) for p, n in pairs.items() if n >= min_frequency]
        if not candidates:
            break

        def key(item, units=units):
            (a, b), n = item
            score = n / (units[a] * units[b]) if algorithm == "wordpiece" else float(n)
            return (-score, -n, a, b)

        (a, b), n = min(candidates, key=key)
        merged = merge_units(a, b)
        merges.append((a, b, merged))
        if merged not in vocab:
            vocab.append(merged)
        for w, seg in segs.items():
            out, i = [], 0
            while i < len(seg):
                if i + 1 < len(seg) and seg[i] == a and seg[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(seg[i])
                    i += 1
            segs[w] = out
    return vocab, merges


def test_initial_alphabet_and_merged_unit_names():
    trainer = WordPieceTrainer(12, min_frequency=1)
    tok = trainer.train_from_word_counts(CORPUS)
    assert tok.ids_to_tokens[:12] == [*SPECIALS, "b", "h", "p", "##g", "##n", "##s", "##u"]
    assert merge_units("h", "##u") == "hu" and merge_units("##g", "##s") == "##gs"
    assert merge_units("##u", "##gs") == "##ugs"


def test_likelihood_and_count_pick_different_merges_step_by_step():
    # Unit counts: h 15, p 17, b 4, ##u 36, ##g 20, ##n 16, ##s 5.
    # Step 1. Pair counts: h##u 15, ##u##g 20, p##u 17, ##u##n 16, b##u 4, ##g##s 5.
    #   likelihood: ##g##s = 5/(20*5) = 1/20 beats every other pair (each = 1/36)   -> "##gs"
    #   count:      ##u##g = 20 is the most frequent pair                              -> "##ug"
    # Step 2 (likelihood). ##g is now 15, ##s 0. h##u 15/(15*36), ##u##g 15/(36*15), p##u 17/(17*36),
    #   ##u##n 16/(36*16), b##u 4/(4*36), ##u##gs 5/(36*5): all 1/36; the tie goes to the larger count,
    #   p##u (17)                                                                      -> "pu"
    # Step 3. ##u is now 19, p 0. h##u 15/(15*19) = 1/19, b##u 4/(4*19) = 1/19, ##u##gs 5/(19*5) = 1/19,
    #   pu##n 12/(17*16) = 0.044, ##u##g 10/(19*15) = 0.035: three ties at 1/19, h##u has the largest count
    #                                                                                  -> "hu"
    # Step 4. h 0, ##u 4 (only in "bun"): b##u 4/(4*4) = 1/4                          -> "bu"
    likelihood = WordPieceTrainer(16, min_frequency=1)
    likelihood.train_from_word_counts(CORPUS)
    assert [(m.left, m.right, m.merged) for m in likelihood.merges] == [
        ("##g", "##s", "##gs"), ("p", "##u", "pu"), ("h", "##u", "hu"), ("b", "##u", "bu")]
    assert [m.score for m in likelihood.merges] == pytest.approx([1 / 20, 1 / 36, 1 / 19, 1 / 4])

    # Count: ##u##g 20 -> "##ug"; then ##u##n 16 -> "##un"; then h##ug 15 -> "hug"; then p##un 12 -> "pun"
    count = WordPieceTrainer(16, algorithm="bpe-count", min_frequency=1)
    count.train_from_word_counts(CORPUS)
    assert [m.merged for m in count.merges] == ["##ug", "##un", "hug", "pun"]
    assert [m.count for m in count.merges] == [20, 16, 15, 12]


@pytest.mark.parametrize("algorithm", ["wordpiece", "bpe-count"])
def test_incremental_updates_equal_recounting(algorithm):
    counts = {"lower": 5, "lowest": 2, "newer": 6, "wider": 3, "new": 2, "low": 7, "slow": 1, "wow": 4,
              "ooo": 3, "ooooo": 2}
    trainer = WordPieceTrainer(60, algorithm=algorithm, min_frequency=1)
    tok = trainer.train_from_word_counts(counts)
    vocab, merges = naive_train(counts, 60, algorithm)
    assert [(m.left, m.right, m.merged) for m in trainer.merges] == merges
    assert tok.ids_to_tokens == vocab


words = st.text(alphabet="abcde", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(words, st.integers(1, 9), min_size=1, max_size=15), st.integers(0, 30),
       st.sampled_from(["wordpiece", "bpe-count"]), st.integers(1, 3))
def test_incremental_equals_recounting_on_random_corpora(counts, extra, algorithm, min_frequency):
    base = len(SPECIALS) + len({w[0] for w in counts}) + len({c for w in counts for c in w[1:]})
    trainer = WordPieceTrainer(base + extra, algorithm=algorithm, min_frequency=min_frequency)
    tok = trainer.train_from_word_counts(counts)
    vocab, merges = naive_train(counts, base + extra, algorithm, min_frequency)
    assert tok.ids_to_tokens == vocab
    assert [(m.left, m.right, m.merged) for m in trainer.merges] == merges


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abcdefgh ,.", min_size=1, max_size=40), min_size=1, max_size=12),
       st.integers(0, 40))
def test_every_training_word_encodes_without_unk(texts, extra):
    trainer = WordPieceTrainer(10_000, min_frequency=1)
    counts = trainer.count_words(texts)
    if not counts:
        return
    trainer.vocab_size = 5 + 2 * len(set("".join(counts))) + extra
    tok = trainer.train_from_word_counts(counts)
    for word in counts:
        assert tok.unk_id not in tok.encode_ids(word), word
    for text in texts:  # and decoding gives back the normalised text
        assert tok.decode(tok(text)["input_ids"]) == tok.basic.normalize(text)


def test_training_is_deterministic(bbc_texts):
    a = WordPieceTrainer(1200).train(bbc_texts[:200])
    b = WordPieceTrainer(1200).train(list(reversed(bbc_texts[:200])))
    assert a.ids_to_tokens == b.ids_to_tokens


def test_bbc_vocabulary_reaches_its_size(bbc_texts):
    for algorithm in ("wordpiece", "bpe-count"):
        trainer = WordPieceTrainer(3000, algorithm=algorithm)
        tok = trainer.train(bbc_texts)
        assert tok.vocab_size == 3000
        assert trainer.report["stopped"] == "vocab_size reached"


def test_limit_alphabet_leaves_rare_characters_out():
    trainer = WordPieceTrainer(40, limit_alphabet=2, min_frequency=1)
    tok = trainer.train_from_word_counts({"aab": 5, "bba": 5, "abz": 1})
    assert "z" not in tok.vocab and "##z" not in tok.vocab
    assert trainer.report["skipped_words"] == 1
    assert tok.tokenize("abz") == ["[UNK]"]


def test_min_frequency_blocks_rare_merges(caplog):
    trainer = WordPieceTrainer(100, min_frequency=3)
    with caplog.at_level("WARNING", logger="lmforge"):
        tok = trainer.train_from_word_counts({"ab": 2, "cd": 3})
    assert [m.merged for m in trainer.merges] == ["cd"]
    assert tok.vocab_size == 5 + 4 + 1
    assert "supports only" in caplog.text


def test_bad_training_options():
    with pytest.raises(LmforgeError, match="vocab_size=8 is below"):
        WordPieceTrainer(8).train_from_word_counts(CORPUS)
    with pytest.raises(LmforgeError, match="no words"):
        WordPieceTrainer(100).train([" \n ", ""])
    with pytest.raises(LmforgeError, match="algorithm"):
        WordPieceTrainer(100, algorithm="unigram")
    with pytest.raises(LmforgeError, match="must include"):
        WordPieceTrainer(100, special_tokens=["[PAD]"])


def test_the_words_algorithm_keeps_the_most_frequent_whole_words_and_makes_the_rest_unk():
    texts = ["The cat sat; the cat ran.", "A dog sat, the dog ran!", "zebra"]
    trainer = WordPieceTrainer(5 + 4, algorithm="words", min_frequency=2)
    tok = trainer.train(texts)
    # seen twice or more: the (3), cat, dog, ran, sat (2 each); 4 places: by count, then by the word
    assert tok.ids_to_tokens[5:] == ["the", "cat", "dog", "ran"]
    # BERT's basic splitting and lower-casing; a known word stays whole, any other is one [UNK]
    assert tok.tokenize("The CAT ran, zebras sat") == ["the", "cat", "ran", "[UNK]", "[UNK]", "[UNK]"]
    assert trainer.report["words_used"] == 4 and trainer.report["unknown_token_rate"] == round(1 - 9 / 17, 6)
    with pytest.raises(LmforgeError, match="vocab_size=5 leaves no room"):
        WordPieceTrainer(5, algorithm="words").train(texts)
