"""Extractive QA data: sliding windows, max-context, training labels, batching and n-best span decoding."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from lmforge.data.qa_features import collate_qa, decode_qa, featurize_qa, window_spans
from lmforge.errors import LmforgeError
from lmforge.tokenizers import WordPieceTokenizer

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass(frozen=True)
class Example:
    """A local stand-in with the fields of ``lmforge.data.readers.QAExample``."""

    id: str
    title: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False


@pytest.fixture(scope="module")
def tok() -> WordPieceTokenizer:
    # Every syllable word tokenizes into one piece per syllable, so words span several tokens.
    return WordPieceTokenizer([*SPECIALS, *SYLLABLES, *("##" + s for s in SYLLABLES), ".", ",", "?"])


def random_word(rng: np.random.Generator) -> str:
    word = "".join(rng.choice(SYLLABLES, size=rng.integers(1, 4)))
    return word.capitalize() if rng.random() < 0.2 else word


def random_example(rng: np.random.Generator, i: int, n_words: int, impossible: bool = False) -> Example:
    """A context of random syllable words with irregular spacing and punctuation; the answer is 1-4 words of it."""
    parts, starts, ends = [], [], []
    pos = 0
    for w in range(n_words):
        word = random_word(rng)
        starts.append(pos)
        ends.append(pos + len(word))
        sep = str(rng.choice([" ", " ", "  ", "\n", ", ", ". "])) if w < n_words - 1 else "."
        parts.append(word + sep)
        pos += len(word) + len(sep)
    context = "".join(parts)
    first = int(rng.integers(0, n_words))
    last = min(n_words - 1, first + int(rng.integers(0, 4)))
    text = context[starts[first]:ends[last]]
    question = " ".join(random_word(rng) for _ in range(rng.integers(1, 6))) + "?"
    return Example(f"q{i}", "t", question, context, () if impossible else ((text, starts[first]),), impossible)


def random_examples(seed: int, n: int, words: tuple[int, int] = (1, 60)) -> list[Example]:
    rng = np.random.default_rng(seed)
    return [random_example(rng, i, int(rng.integers(*words)), impossible=rng.random() < 0.15) for i in range(n)]


def context_token_count(tok: WordPieceTokenizer, example: Example) -> int:
    return len(tok.encode_text(example.context)[0])


def windows_of(features: list[dict], index: int) -> list[dict]:
    return [f for f in features if f["example_index"] == index]


def context_positions(feature: dict) -> list[int]:
    return [p for p, o in enumerate(feature["offsets"]) if o is not None]


# ------------------------------------------------------------------------------------------------ windows
def test_window_spans_cover_the_context_with_exact_stride() -> None:
    for n in range(0, 40):
        for capacity in range(1, 12):
            for stride in range(1, 14):
                spans = window_spans(n, capacity, stride)
                covered = [i for s, length in spans for i in range(s, s + length)]
                assert set(covered) == set(range(n))
                assert spans[0][0] == 0 and spans[-1][0] + spans[-1][1] == n
                assert all(length <= capacity for _, length in spans)
                step = min(stride, capacity)  # Google caps the step at the window so no token is skipped
                assert [b[0] - a[0] for a, b in zip(spans, spans[1:], strict=False)] == [step] * (len(spans) - 1)
                assert all(length == capacity for _, length in spans[:-1])  # only the last window is short
    assert window_spans(0, 5, 2) == [(0, 0)]


@pytest.mark.parametrize("max_length,doc_stride", [(24, 3), (30, 7), (40, 16), (64, 128)])
def test_features_layout_windows_and_max_context(tok, max_length, doc_stride) -> None:
    examples = random_examples(seed=max_length, n=25)
    features = featurize_qa(examples, tok, max_length=max_length, doc_stride=doc_stride, max_query_length=9,
                            training=False)
    for index, example in enumerate(examples):
        ids, offsets, _ = tok.encode_text(example.context)
        question = tok.encode_ids(example.question)[:9]
        windows = windows_of(features, index)
        assert windows and all(f["example_id"] == example.id for f in windows)
        capacity = max_length - len(question) - 3
        seen = [[] for _ in ids]  # windows holding each context token
        max_windows = [[] for _ in ids]
        for w, f in enumerate(windows):
            n_ctx = len(f["input_ids"]) - len(question) - 3
            assert len(f["input_ids"]) <= max_length and 0 <= n_ctx <= capacity
            c0, s = f["context_start"], f["window_start"]
            assert c0 == len(question) + 2
            assert f["input_ids"] == [tok.cls_id, *question, tok.sep_id, *ids[s:s + n_ctx], tok.sep_id]
            assert f["token_type_ids"] == [0] * c0 + [1] * (n_ctx + 1)
            assert f["context_mask"] == [1] + [0] * (c0 - 1) + [1] * n_ctx + [0]
            assert f["offsets"] == [None] * c0 + offsets[s:s + n_ctx] + [None]
            assert not any(f["token_is_max_context"][:c0]) and not f["token_is_max_context"][-1]
            if w:
                assert s - windows[w - 1]["window_start"] == min(doc_stride, capacity)
            for j in range(n_ctx):
                seen[s + j].append((w, j, n_ctx))
                if f["token_is_max_context"][c0 + j]:
                    max_windows[s + j].append(w)
        assert all(seen), "every context token is in some window"
        assert all(len(m) == 1 for m in max_windows), "every token has exactly one max-context window"
        for token, holders in enumerate(seen):  # Google's rule, recomputed: min(left, right) + 0.01 * length
            scores = [min(j, n - 1 - j) + 0.01 * n for _, j, n in holders]
            assert max_windows[token][0] == holders[int(np.argmax(scores))][0]


def test_question_is_cut_to_max_query_length(tok) -> None:
    example = Example("q", "t", " ".join(["kalomi"] * 30), "su ta ri.", (("ta", 3),))
    (feature,) = featurize_qa([example], tok, max_length=64, max_query_length=5, training=True)
    pieces = tok.encode_ids(example.question)
    assert len(pieces) == 90 and feature["input_ids"][:7] == [tok.cls_id, *pieces[:5], tok.sep_id]
    assert feature["context_start"] == 7
    assert feature["input_ids"][feature["start_position"]] == tok.vocab["ta"]


# ------------------------------------------------------------------------------------------------ labels
@pytest.mark.parametrize("max_length,doc_stride", [(24, 4), (40, 9), (128, 128)])
def test_training_labels_cover_the_answer(tok, max_length, doc_stride) -> None:
    examples = random_examples(seed=100 + max_length, n=40)
    features = featurize_qa(examples, tok, max_length=max_length, doc_stride=doc_stride, max_query_length=9,
                            training=True)
    for index, example in enumerate(examples):
        ids, offsets, _ = tok.encode_text(example.context)
        labelled = 0
        for f in windows_of(features, index):
            s, e = f["start_position"], f["end_position"]
            if (s, e) == (0, 0):
                if not example.is_impossible:  # the window must not hold the whole answer
                    text, a = example.answers[0]
                    inside = [o for o in f["offsets"] if o is not None and o[1] > a and o[0] < a + len(text)]
                    tokens = [o for o in offsets if o[1] > a and o[0] < a + len(text)]
                    assert len(inside) < len(tokens)
                continue
            assert not example.is_impossible
            assert f["context_mask"][s] and f["context_mask"][e] and s <= e
            span = example.context[f["offsets"][s][0]:f["offsets"][e][1]]
            assert span == example.answers[0][0]  # answers are whole words here, so the cover is exact
            labelled += 1
        if not example.is_impossible:
            n_answer_tokens = len(tok.encode_ids(example.answers[0][0]))
            capacity = max_length - len(tok.encode_ids(example.question)[:9]) - 3
            if n_answer_tokens <= min(capacity - doc_stride + 1, capacity) or len(ids) <= capacity:
                assert labelled >= 1, "an answer that fits a window's overlap is labelled in some window"


def test_answer_inside_a_word_is_covered_by_whole_tokens(tok) -> None:
    context = "kalomi sutaripo vedu."
    example = Example("q", "t", "ka?", context, (("tari", 9),))
    (f,) = featurize_qa([example], tok, max_length=32, training=True)
    s, e = f["start_position"], f["end_position"]
    assert context[f["offsets"][s][0]:f["offsets"][e][1]] == "tari"
    example = Example("q", "t", "ka?", context, (("ari", 10),))  # starts inside the piece "ta"
    (f,) = featurize_qa([example], tok, max_length=32, training=True)
    s, e = f["start_position"], f["end_position"]
    assert context[f["offsets"][s][0]:f["offsets"][e][1]] == "tari"


def test_answer_in_the_overlap_is_labelled_in_both_windows_and_decoded_once(tok) -> None:
    # 12 one-piece words; question "ka?" is 2 tokens, so max_length 13 leaves 8 context tokens per window and
    # windows start at 0 and 4: tokens 4..7 are in both.
    words = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du", "ka", "lo"]
    context = " ".join(words)
    answer_start = context.index("ri")
    example = Example("q", "t", "ka?", context, (("ri po", answer_start),))
    features = featurize_qa([example], tok, max_length=13, doc_stride=4, training=True)
    assert [f["window_start"] for f in features] == [0, 4]
    labels = [(f["start_position"], f["end_position"]) for f in features]
    assert all(s > 0 for s, _ in labels), "both windows hold the answer (tokens 6 and 7)"
    # Token 6 has min(6, 1) tokens of context on its short side in window 0 and min(2, 5) in window 1.
    assert features[0]["token_is_max_context"][labels[0][0]] is False
    assert features[1]["token_is_max_context"][labels[1][0]] is True
    starts = [np.zeros(len(f["input_ids"])) for f in features]
    ends = [np.zeros(len(f["input_ids"])) for f in features]
    for f, row_s, row_e in zip(features, starts, ends, strict=True):  # a perfect model: high at the answer
        row_s[f["start_position"]], row_e[f["end_position"]] = 10.0, 10.0
    prediction = decode_qa([example], features, starts, ends)["q"]
    assert (prediction["text"], prediction["start"]) == ("ri po", answer_start)
    assert prediction["score"] == pytest.approx(20.0)
    assert [e["text"] for e in prediction["n_best"]].count("ri po") == 1, "a span is scored in one window only"
    # Logits that point at the answer only in its non-max-context window: that start is not considered there.
    starts[1][:], ends[1][:] = 0.0, 0.0
    prediction = decode_qa([example], features, starts, ends)["q"]
    assert prediction["text"] != "ri po"


def test_long_context_answer_in_the_last_window(tok) -> None:
    rng = np.random.default_rng(5)
    words = [str(rng.choice(SYLLABLES)) for _ in range(300)]
    words[-2:] = ["vedu", "pomi"]  # the answer: the last two words, four tokens
    context = " ".join(words) + "."
    example = Example("q", "t", "kalo ne?", context, (("vedu pomi", context.index("vedu pomi")),))
    features = featurize_qa([example], tok, max_length=64, doc_stride=30, training=True)
    assert len(tok.encode_text(context)[0]) > 64 and len(features) > 5
    labelled = [i for i, f in enumerate(features) if f["start_position"]]
    assert labelled and labelled[-1] == len(features) - 1 and 0 not in labelled
    last = features[-1]
    s, e = last["start_position"], last["end_position"]
    assert context[last["offsets"][s][0]:last["offsets"][e][1]] == "vedu pomi"
    rng_logits = np.random.default_rng(0)
    starts = [rng_logits.normal(size=len(f["input_ids"])) for f in features]
    ends = [rng_logits.normal(size=len(f["input_ids"])) for f in features]
    starts[-1][s] += 20.0
    ends[-1][e] += 20.0
    assert decode_qa([example], features, starts, ends)["q"]["text"] == "vedu pomi"


@dataclass(frozen=True)
class _SharedData:
    examples: list[Example]
    tokenizer: WordPieceTokenizer


def shared_data_dir() -> Path:
    default = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    return Path(os.environ.get("LMFORGE_SHARED_DATA", default))


@pytest.fixture(scope="module")
def xquad() -> _SharedData:
    path = shared_data_dir() / "xquad.en.json"
    if not path.is_file():
        pytest.skip(f"xquad.en.json not found under {path.parent} (set LMFORGE_SHARED_DATA)")
    from lmforge.data.corpora import minilm_dir

    try:
        tokenizer = WordPieceTokenizer.from_pretrained(minilm_dir())
    except LmforgeError as err:
        pytest.skip(f"the MiniLM tokenizer is not installed: {err}")
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    examples = [Example(q["id"], article["title"], q["question"], paragraph["context"],
                        tuple((a["text"], a["answer_start"]) for a in q["answers"]))
                for article in data for paragraph in article["paragraphs"] for q in paragraph["qas"]]
    return _SharedData(examples, tokenizer)


@pytest.mark.parametrize("max_length,doc_stride", [(384, 128), (96, 24)])
def test_xquad_labels_recover_every_answer(xquad, max_length, doc_stride) -> None:
    started = time.perf_counter()
    features = featurize_qa(xquad.examples, xquad.tokenizer, max_length=max_length, doc_stride=doc_stride,
                            training=True)
    elapsed = time.perf_counter() - started
    assert len(xquad.examples) == 1190
    found, exact = set(), 0
    for f in features:
        s, e = f["start_position"], f["end_position"]
        if (s, e) != (0, 0):
            example = xquad.examples[f["example_index"]]
            span, answer = example.context[f["offsets"][s][0]:f["offsets"][e][1]], example.answers[0][0]
            # Whole tokens cover the answer; they add characters only where an answer ends inside a word
            # (XQuAD has one: "... (2,70" of "(2,700").
            assert answer in span and len(span) - len(answer) <= 4, (span, answer)
            exact += span == answer
            found.add(f["example_index"])
    assert found == set(range(len(xquad.examples))), "every question has a window with its answer"
    labelled = sum(f["start_position"] > 0 for f in features)
    assert exact >= labelled - 5
    assert elapsed < 20, f"featurizing XQuAD took {elapsed:.1f} s"


def test_xquad_windows_match_hugging_face_overflow(xquad) -> None:
    """Hugging Face's overflowing windows with ``stride = capacity - doc_stride`` (its overlap) are ours."""
    transformers = pytest.importorskip("transformers")
    from lmforge.data.corpora import minilm_dir

    reference = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir()))
    max_length, doc_stride = 80, 20
    examples = xquad.examples[::40]
    features = featurize_qa(examples, xquad.tokenizer, max_length=max_length, doc_stride=doc_stride,
                            training=False)
    for index, example in enumerate(examples):
        capacity = max_length - len(xquad.tokenizer.encode_ids(example.question)) - 3
        enc = reference(example.question, example.context, truncation="only_second", max_length=max_length,
                        stride=capacity - doc_stride, return_overflowing_tokens=True)
        ours = [f["input_ids"] for f in windows_of(features, index)]
        assert ours == enc["input_ids"], example.id


# ------------------------------------------------------------------------------------------------ batching
def test_collate_pads_and_keeps_labels(tok) -> None:
    examples = random_examples(seed=3, n=3, words=(5, 30))
    features = featurize_qa(examples, tok, max_length=37, doc_stride=11, training=True)
    batch = collate_qa(features, tok.pad_id)
    B, T = len(features), max(len(f["input_ids"]) for f in features)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "context_mask", "start_positions",
                          "end_positions"}
    assert batch["input_ids"].shape == (B, T) and batch["context_mask"].dtype == torch.bool
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == f["input_ids"]
        assert (batch["input_ids"][i, n:] == tok.pad_id).all() and batch["attention_mask"][i].sum() == n
        assert batch["context_mask"][i].tolist() == [bool(m) for m in f["context_mask"]] + [False] * (T - n)
        assert batch["start_positions"][i] == f["start_position"]
    unlabelled = featurize_qa(examples, tok, max_length=37, doc_stride=11, training=False)
    assert "start_positions" not in collate_qa(unlabelled, tok.pad_id)
    with pytest.raises(LmforgeError, match="features have labels"):
        collate_qa([features[0], unlabelled[0]], tok.pad_id)
    with pytest.raises(LmforgeError, match="no features"):
        collate_qa([], tok.pad_id)


# ------------------------------------------------------------------------------------------------ decoding
def brute_force_spans(example, features, indices, starts, ends, max_answer_length):
    """Every valid span of an example: {(char_start, char_end): score}, by enumeration."""
    spans = {}
    for i in indices:
        f = features[i]
        positions = context_positions(f)
        for p in positions:
            if not f["token_is_max_context"][p]:
                continue
            for q in positions:
                if p <= q < p + max_answer_length:
                    key = (f["offsets"][p][0], f["offsets"][q][1])
                    assert key not in spans, "a char span comes from one (window, start, end) only"
                    spans[key] = starts[i][p] + ends[i][q]
    return spans


@pytest.mark.parametrize("seed", range(6))
def test_decoding_returns_valid_best_spans_for_random_logits(tok, seed) -> None:
    rng = np.random.default_rng(seed)
    examples = random_examples(seed=seed, n=8, words=(1, 45))
    max_length, doc_stride = int(rng.integers(14, 48)), int(rng.integers(1, 20))
    n_best, max_answer_length = int(rng.integers(1, 25)), int(rng.integers(1, 12))
    features = featurize_qa(examples, tok, max_length=max_length, doc_stride=doc_stride, max_query_length=6,
                            training=False)
    T = max(len(f["input_ids"]) for f in features) + 3
    # Padded rows, with the largest logits on question, [SEP] and padding positions (they must never be chosen).
    starts = rng.normal(size=(len(features), T)) * 3
    ends = rng.normal(size=(len(features), T)) * 3
    for i, f in enumerate(features):
        outside = [p for p in range(T) if p >= len(f["offsets"]) or (f["offsets"][p] is None and p)]
        starts[i, outside] += 50
        ends[i, outside] += 50
    predictions = decode_qa(examples, features, starts, ends, n_best=n_best, max_answer_length=max_answer_length)
    assert set(predictions) == {e.id for e in examples}
    for index, example in enumerate(examples):
        prediction = predictions[example.id]
        indices = [i for i, f in enumerate(features) if f["example_index"] == index]
        oracle = brute_force_spans(example, features, indices, starts, ends, max_answer_length)
        assert oracle, "every non-empty context has a valid span"
        best = sorted(oracle.values(), reverse=True)[:n_best]
        got = prediction["n_best"]
        assert [e["score"] for e in got] == pytest.approx(best)
        assert prediction["score"] == pytest.approx(best[0]) and prediction["text"] != ""
        for e in got:
            assert 0 <= e["start"] < e["end"] <= len(example.context)
            assert (e["start"], e["end"]) in oracle and oracle[(e["start"], e["end"])] == pytest.approx(e["score"])
            assert e["text"] == example.context[e["start"]:e["end"]]
            assert e["score"] == pytest.approx(e["start_logit"] + e["end_logit"])
        assert sum(e["probability"] for e in got) == pytest.approx(1.0)


def test_decoding_accepts_tensors_and_feature_subsets(tok) -> None:
    examples = random_examples(seed=11, n=4, words=(5, 30))
    features = featurize_qa(examples, tok, max_length=30, doc_stride=8, training=False)
    g = torch.Generator().manual_seed(0)
    starts = torch.randn(len(features), 40, generator=g, requires_grad=True)
    ends = torch.randn(len(features), 40, generator=g)
    from_tensors = decode_qa(examples, features, starts, ends)
    from_arrays = decode_qa(examples, features, list(starts.detach().numpy()), ends.numpy().tolist())
    assert from_tensors == from_arrays
    reordered = decode_qa(examples, features[::-1], starts.flip(0), ends.flip(0))
    assert {k: v["text"] for k, v in reordered.items()} == {k: v["text"] for k, v in from_tensors.items()}


def test_version_2_null_answer_by_hand(tok) -> None:
    words = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du", "ka", "lo"]
    example = Example("q", "t", "ka?", " ".join(words), (), is_impossible=True)
    features = featurize_qa([example], tok, max_length=13, doc_stride=4, training=True)
    assert len(features) == 2 and all(f["start_position"] == f["end_position"] == 0 for f in features)
    starts = [np.zeros(len(f["input_ids"])) for f in features]
    ends = [np.zeros(len(f["input_ids"])) for f in features]
    c0 = features[0]["context_start"]
    starts[0][c0], ends[0][c0 + 1] = 3.0, 2.0  # best span "ka lo", score 5.0, in window 0
    starts[0][0], ends[0][0] = 4.0, 4.0  # null 8.0 in window 0
    starts[1][0], ends[1][0] = 3.0, 3.5  # null 6.5 in window 1: the null score is the minimum, 6.5
    pred = decode_qa([example], features, starts, ends, version_2=True)["q"]
    assert pred["null_score"] == pytest.approx(6.5)
    assert (pred["text"], pred["start"], pred["end"], pred["score"]) == ("", 0, 0, pytest.approx(6.5))
    assert [e["text"] for e in pred["n_best"][:2]] == ["", "ka lo"]
    # 6.5 - 5.0 = 1.5: a threshold of 1.5 or more keeps the span (strictly greater is needed for the null).
    assert decode_qa([example], features, starts, ends, version_2=True, null_threshold=1.5)["q"]["text"] == "ka lo"
    assert decode_qa([example], features, starts, ends, version_2=True, null_threshold=1.49)["q"]["text"] == ""
    # v1.1 never answers "" while a valid span exists, however strong the null.
    v1 = decode_qa([example], features, starts, ends)["q"]
    assert v1["text"] == "ka lo" and "null_score" not in v1 and all(e["text"] for e in v1["n_best"])
    starts[1][0] = -10.0  # null now -6.5: the span wins
    assert decode_qa([example], features, starts, ends, version_2=True)["q"]["text"] == "ka lo"


def test_empty_context_gives_an_empty_answer(tok) -> None:
    example = Example("q", "t", "ka?", "", (), is_impossible=True)
    (feature,) = featurize_qa([example], tok, training=True)
    assert feature["context_mask"] == [1, 0, 0, 0, 0] and (feature["start_position"], feature["end_position"]) == (0, 0)
    logits = [np.array([1.0, 2.0, 3.0, 4.0, 5.0])]
    assert decode_qa([example], [feature], logits, logits)["q"] == {"text": "", "start": 0, "end": 0, "score": None,
                                                                    "n_best": []}
    v2 = decode_qa([example], [feature], logits, logits, version_2=True)["q"]
    assert v2["text"] == "" and v2["null_score"] == 2.0


def test_max_answer_length_limits_the_span(tok) -> None:
    example = Example("q", "t", "ka?", "ka lo mi ne su ta.", (("lo", 3),))
    features = featurize_qa([example], tok, max_length=32, training=False)
    c0 = features[0]["context_start"]
    starts = [np.zeros(len(features[0]["input_ids"]))]
    ends = [np.zeros(len(features[0]["input_ids"]))]
    starts[0][c0], ends[0][c0 + 4] = 10.0, 10.0  # "ka ... su" is 5 tokens
    assert decode_qa([example], features, starts, ends, max_answer_length=5)["q"]["text"] == "ka lo mi ne su"
    short = decode_qa([example], features, starts, ends, max_answer_length=4)["q"]
    assert short["text"] != "ka lo mi ne su" and len(tok.encode_ids(short["text"])) <= 4


def test_answer_text_comes_from_the_original_context(tok) -> None:
    context = "Kalo  MI,ne."
    example = Example("q", "t", "ka?", context, (("MI,ne", 6),))
    (f,) = featurize_qa([example], tok, max_length=32, training=True)
    starts, ends = np.zeros(len(f["input_ids"])), np.zeros(len(f["input_ids"]))
    starts[f["start_position"]], ends[f["end_position"]] = 5.0, 5.0
    assert decode_qa([example], [f], [starts], [ends])["q"]["text"] == "MI,ne"


# ------------------------------------------------------------------------------------------------ errors
def test_user_errors_name_the_problem(tok) -> None:
    good = Example("q", "t", "ka lo?", "mi ne su.", (("ne", 3),))
    with pytest.raises(LmforgeError, match="does not match the context"):
        featurize_qa([Example("q", "t", "ka?", "mi ne su.", (("ne", 4),))], tok, training=True)
    with pytest.raises(LmforgeError, match="is_impossible"):
        featurize_qa([Example("q", "t", "ka?", "mi ne su.", ())], tok, training=True)
    with pytest.raises(LmforgeError, match="covers no token"):
        featurize_qa([Example("q", "t", "ka?", "mi  ne", ((" ", 2),))], tok, training=True)
    with pytest.raises(LmforgeError, match="no room for the context"):
        featurize_qa([good], tok, max_length=5, training=False)
    with pytest.raises(LmforgeError, match="doc_stride"):
        featurize_qa([good], tok, doc_stride=0, training=False)
    features = featurize_qa([good], tok, training=False)
    row = [np.zeros(len(features[0]["input_ids"]))]
    with pytest.raises(LmforgeError, match="one row per feature"):
        decode_qa([good], features, row * 2, row)
    with pytest.raises(LmforgeError, match="at least"):
        decode_qa([good], features, [row[0][:3]], row)
    with pytest.raises(LmforgeError, match="NaN"):
        decode_qa([good], features, [row[0] + np.nan], row)
    with pytest.raises(LmforgeError, match="was made for question"):
        decode_qa([Example("other", "t", "ka?", "mi.", ())], features, row, row)
    with pytest.raises(LmforgeError, match="only 0 examples"):
        decode_qa([], features, row, row)
    with pytest.raises(LmforgeError, match="n_best"):
        decode_qa([good], features, row, row, n_best=0)
    # Without training=True no answer is read, so unanswerable data without answers featurizes fine.
    assert featurize_qa([Example("q", "t", "ka?", "mi.", ())], tok, training=False)
