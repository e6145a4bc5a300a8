"""The key-value corpus and few-shot task of lmforge.data.synthetic: format, tokens, determinism, errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lmforge.data.readers import read_classification
from lmforge.data.shards import ShardedCorpus, prepare_corpus
from lmforge.data.synthetic import (
    SEPARATOR,
    TEMPLATE,
    key_value_corpus,
    key_value_document,
    key_value_task,
    key_value_tokenizer,
    key_value_vocabulary,
    repeated_tokens_document,
)
from lmforge.errors import LmforgeError

PAIR = re.compile(r"^k(\d+) = v(\d+)$")


def pairs_of(document: str) -> list[tuple[int, int]]:
    out = []
    for part in document.split(SEPARATOR):
        m = PAIR.match(part)
        assert m, f"malformed pair {part!r}"
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def test_vocabulary_makes_every_word_one_token():
    tok = key_value_tokenizer(13, 7)
    assert key_value_vocabulary(13, 7)[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.vocab_size == 5 + 2 + 13 + 7
    text = " ; ".join(f"k{i} = v{i % 7}" for i in range(13))
    tokens = tok.tokenize(text)
    assert tokens == text.split()  # one token per word: nothing split into ## pieces, nothing [UNK]
    assert tok.unk_id not in tok.encode_ids(text)


def test_document_keeps_one_mapping_and_uses_every_chosen_key():
    rng = np.random.default_rng(3)
    doc = key_value_document(rng, n_pairs=30, n_distinct=9, n_keys=50, n_values=11)
    pairs = pairs_of(doc)
    assert len(pairs) == 30
    mapping: dict[int, int] = {}
    for k, v in pairs:
        assert mapping.setdefault(k, v) == v  # a key keeps its value inside the document
        assert 0 <= k < 50 and 0 <= v < 11
    assert len(mapping) == 9


def test_corpus_lines_format_counts_and_determinism(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    info = key_value_corpus(a, n_sequences=40, pairs_per_sequence=(3, 12), n_keys=30, n_values=8, seed=5,
                            keys_per_sequence=(2, 6))
    key_value_corpus(b, n_sequences=40, pairs_per_sequence=(3, 12), n_keys=30, n_values=8, seed=5,
                     keys_per_sequence=(2, 6))
    assert a.read_bytes() == b.read_bytes()
    blocks = a.read_text(encoding="utf-8").strip("\n").split("\n\n")
    assert len(blocks) == info["documents"] == 40
    lengths = [len(pairs_of(block)) for block in blocks]
    assert all("\n" not in block for block in blocks)  # one document per line, a blank line between
    assert min(lengths) >= 3 and max(lengths) <= 12 and len(set(lengths)) > 3
    assert sum(lengths) == info["pairs"]
    assert 0.0 < info["repeated_share"] < 1.0
    values = {v for block in blocks for _, v in pairs_of(block)}
    assert len(values) == 8  # values drawn afresh per document cover the pool


def test_corpus_prepares_one_document_per_line(tmp_path):
    path = tmp_path / "kv.txt"
    info = key_value_corpus(path, n_sequences=25, pairs_per_sequence=(2, 6), n_keys=20, n_values=5, seed=0)
    tok = key_value_tokenizer(20, 5)
    tok.save_pretrained(tmp_path / "tok")
    prepare_corpus(tmp_path / "tok", [path], tmp_path / "shards", input_format="lines", workers=1)
    corpus = ShardedCorpus(tmp_path / "shards", tok)
    assert corpus.num_documents == 25
    assert sum(corpus.document_lengths) == info["tokens"]
    first = path.read_text(encoding="utf-8").split("\n\n")[0]
    assert list(corpus.document_tokens(0)) == tok.encode_ids(first)


@pytest.mark.parametrize(("template", "separator", "query_tokens"), [(TEMPLATE, SEPARATOR, ["=", 4]),
                                                                      ("{text} {label}", " ", [None, 2])])
def test_few_shot_prompt_tokenizes_like_a_training_document(tmp_path, template, separator, query_tokens):
    """The template and separator give exactly the tokens of a training document's prefix, query included."""
    assign, per_pair = query_tokens
    key_value_task(tmp_path / "train.jsonl", tmp_path / "test.jsonl", n_pairs=6, seed=1, n_keys=40, n_values=9)
    train = read_classification(tmp_path / "train.jsonl").examples
    test = read_classification(tmp_path / "test.jsonl").examples
    tok = key_value_tokenizer(40, 9)
    # the generator writes documents in this format: k v (k v ...) in the template and separator, nothing else
    corpus = tmp_path / "corpus.txt"
    key_value_corpus(corpus, n_sequences=3, pairs_per_sequence=4, n_keys=40, n_values=9, seed=0, template=template,
                     separator=separator)
    doc_tokens = tok.tokenize(corpus.read_text(encoding="utf-8").split("\n\n")[0])
    keys, values = [t for t in doc_tokens if t[0] == "k"], [t for t in doc_tokens if t[0] == "v"]
    assert len(keys) == len(values) == 4
    rebuilt = separator.join(template.format(text=k, label=v) for k, v in zip(keys, values, strict=True))
    assert tok.tokenize(rebuilt) == doc_tokens
    # the few-shot prompt: demonstrations through the template, joined, then the template up to the label slot
    demos = [template.format(text=e.text, label=e.label) for e in train[:3]]
    query = template[:template.index("{label}")].format(text=test[0].text)
    prompt = separator.join([*demos, query])
    full = tok.tokenize(separator.join(template.format(text=e.text, label=e.label) for e in [*train[:3], test[0]]))
    want = full[:-1]  # a document of the same four pairs without the query's value
    assert tok.tokenize(prompt) == want
    assert tok.tokenize(prompt.rstrip()) == want
    assert len(want) == 3 * per_pair + per_pair // 2
    assert want[-1] == (assign or test[0].text) and test[0].text in want[-2:]
    assert full[-1] == test[0].label  # the label is one token, the one the model must predict next


@pytest.mark.parametrize(("template", "separator"), [("{label} {text}", " "), ("{text}", " "), (TEMPLATE, ""),
                                                     (TEMPLATE, " ;\n")])
def test_format_errors(tmp_path, template, separator):
    with pytest.raises(LmforgeError, match="template|separator"):
        key_value_corpus(tmp_path / "c.txt", n_sequences=2, pairs_per_sequence=3, n_keys=5, n_values=2, seed=0,
                         template=template, separator=separator)


def test_task_files_hold_one_mapping(tmp_path):
    mapping = key_value_task(tmp_path / "tr.jsonl", tmp_path / "te.jsonl", n_pairs=10, seed=2, n_keys=30,
                             n_values=4, n_queries=7)
    train = [json.loads(line) for line in (tmp_path / "tr.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (tmp_path / "te.jsonl").read_text().splitlines()]
    assert len(mapping) == 10 and len(train) == 10 and len(test) == 7
    assert {r["text"]: r["label"] for r in train} == mapping
    assert len({r["text"] for r in test}) == 7
    assert all(mapping[r["text"]] == r["label"] for r in test)
    other = key_value_task(tmp_path / "a.jsonl", tmp_path / "b.jsonl", n_pairs=10, seed=3, n_keys=30, n_values=4)
    assert other != mapping  # another seed, another mapping


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"n_pairs": 0}, "n_pairs"),
    ({"n_pairs": 31}, "n_pairs"),
    ({"n_pairs": 5, "n_queries": 6}, "n_queries"),
    ({"n_pairs": 5, "n_values": 0}, "n_values"),
])
def test_task_errors(tmp_path, kwargs, match):
    args = {"n_keys": 30, "n_values": 4, "seed": 0, **kwargs}
    with pytest.raises(LmforgeError, match=match):
        key_value_task(tmp_path / "a.jsonl", tmp_path / "b.jsonl", **args)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pairs_per_sequence": (5, 2)}, "pairs_per_sequence"),
    ({"pairs_per_sequence": 0}, "pairs_per_sequence"),
    ({"keys_per_sequence": (0, 3)}, "keys_per_sequence"),
    ({"n_sequences": 0}, "n_sequences"),
    ({"n_keys": True}, "n_keys"),
])
def test_corpus_errors(tmp_path, kwargs, match):
    args = {"n_sequences": 3, "pairs_per_sequence": 4, "n_keys": 10, "n_values": 3, "seed": 0, **kwargs}
    with pytest.raises(LmforgeError, match=match):
        key_value_corpus(tmp_path / "c.txt", **args)


def test_replayed_document_repeats_its_first_half_in_order():
    rng = np.random.default_rng(4)
    for n_pairs in (9, 10):
        pairs = pairs_of(key_value_document(rng, n_pairs=n_pairs, n_distinct=3, n_keys=20, n_values=5, repeats=2))
        first = -(-n_pairs // 2)
        assert len(pairs) == n_pairs
        assert pairs[first:] == pairs[:n_pairs - first]
        assert len({k for k, _ in pairs}) == 3
    bare = key_value_document(rng, n_pairs=6, n_distinct=6, n_keys=20, n_values=5, template="{text} {label}",
                              separator=" ", repeats=2).split()
    assert bare[6:] == bare[:6] and len(bare) == 12


def test_replay_share(tmp_path):
    path = tmp_path / "r.txt"
    key_value_corpus(path, n_sequences=200, pairs_per_sequence=(6, 12), n_keys=40, n_values=30, seed=1,
                     replay_share=0.5, keys_per_sequence=(6, 6))
    docs = [pairs_of(d) for d in path.read_text(encoding="utf-8").strip().split("\n\n")]
    replayed = sum(d[-(-len(d) // 2):] == d[:len(d) // 2] for d in docs)
    assert 60 < replayed < 140
    with pytest.raises(LmforgeError, match="replay_share"):
        key_value_corpus(path, n_sequences=2, pairs_per_sequence=3, n_keys=5, n_values=2, seed=0, replay_share=1.5)


def test_several_repeats_cycle_the_first_block():
    rng = np.random.default_rng(7)
    pairs = pairs_of(key_value_document(rng, n_pairs=11, n_distinct=4, n_keys=20, n_values=5, repeats=3))
    block = pairs[:4]  # ceil(11 / 3) = 4 pairs, then again and again, cut at 11
    assert pairs == (block * 3)[:11]
    with pytest.raises(LmforgeError, match="repeats=0"):
        key_value_document(rng, n_pairs=4, n_distinct=2, n_keys=20, n_values=5, repeats=0)


def test_repeats_drawn_per_document_from_a_range(tmp_path):
    path = tmp_path / "r.txt"
    key_value_corpus(path, n_sequences=120, pairs_per_sequence=12, n_keys=40, n_values=30, seed=2,
                     replay_share=1.0, keys_per_sequence=(12, 12), repeats=(2, 4))
    docs = [pairs_of(d) for d in path.read_text(encoding="utf-8").strip().split("\n\n")]
    periods = []
    for d in docs:  # each document cycles its first ceil(12 / r) pairs for one r in 2..4
        fits = [r for r in (2, 3, 4) if d == (d[:-(-12 // r)] * r)[:12] and len(set(d[:-(-12 // r)])) == -(-12 // r)]
        assert fits, d
        periods.append(fits[0])
    assert set(periods) == {2, 3, 4}


def test_repeated_random_tokens_documents(tmp_path):
    rng = np.random.default_rng(3)
    words = repeated_tokens_document(rng, n_tokens=9, n_keys=6, n_values=4).split()
    assert len(words) == 18 and words[:9] == words[9:]
    assert set(words) <= set(key_value_vocabulary(6, 4)[7:])  # keys and values only, no symbol or special token
    path = tmp_path / "mix.txt"
    info = key_value_corpus(path, n_sequences=300, pairs_per_sequence=(4, 8), n_keys=20, n_values=6, seed=4,
                            template="{text} {label}", separator=" ", random_share=0.5, random_tokens=(5, 10))
    docs = [d.split() for d in path.read_text(encoding="utf-8").strip().split("\n\n")]
    random_docs = [d for d in docs if len(d) % 2 == 0 and d[:len(d) // 2] == d[len(d) // 2:]
                   and 10 <= len(d) <= 20]
    assert 100 < info["random_documents"] < 200
    assert len(random_docs) >= info["random_documents"]  # a pair document can look like a repeat, never the reverse
    assert info["tokens"] == sum(map(len, docs))
    with pytest.raises(LmforgeError, match="random_share"):
        key_value_corpus(path, n_sequences=2, pairs_per_sequence=3, n_keys=5, n_values=2, seed=0, random_share=2.0)


def test_repeated_random_tokens_distinct_never_repeat_a_word_in_the_first_half(tmp_path):
    rng = np.random.default_rng(0)
    halves = []
    for _ in range(50):
        words = repeated_tokens_document(rng, n_tokens=10, n_keys=6, n_values=4, distinct=True).split()
        assert words[:10] == words[10:] and len(set(words[:10])) == 10  # all 10 words of the pool, each once
        halves.append(tuple(words[:10]))
    assert len(set(halves)) > 40  # shuffled afresh per document
    # with replacement, 10 draws from 10 words repeat one almost always (1 - 10!/10^10)
    plain = [repeated_tokens_document(rng, n_tokens=10, n_keys=6, n_values=4).split()[:10] for _ in range(50)]
    assert sum(len(set(h)) < 10 for h in plain) > 45
    with pytest.raises(LmforgeError, match="distinct"):
        repeated_tokens_document(rng, n_tokens=11, n_keys=6, n_values=4, distinct=True)
    path = tmp_path / "distinct.txt"
    key_value_corpus(path, n_sequences=40, pairs_per_sequence=4, n_keys=8, n_values=4, seed=1, random_share=1.0,
                     random_tokens=(3, 12), random_distinct=True, template="{text} {label}", separator=" ")
    for doc in path.read_text(encoding="utf-8").strip().split("\n\n"):
        first = doc.split()[:len(doc.split()) // 2]
        assert len(set(first)) == len(first)
    with pytest.raises(LmforgeError, match="random_tokens up to 13"):
        key_value_corpus(path, n_sequences=4, pairs_per_sequence=4, n_keys=8, n_values=4, seed=1, random_share=1.0,
                         random_tokens=(3, 13), random_distinct=True)
