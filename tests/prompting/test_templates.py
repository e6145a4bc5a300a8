"""Prompt building: templates, verbalizers, demonstrations (ids token by token), seeds, no label leak, length."""

from __future__ import annotations

import logging
import random

import pytest

from lmforge.errors import LmforgeError
from lmforge.prompting import (
    Example,
    PromptBuilder,
    PromptTemplate,
    document_end_id,
    document_start_ids,
    draw_demonstrations,
    resolve_verbalizer,
)
from tests.prompting.helpers import TEMPLATE, TEST, TRAIN, VERBALIZER, tokenizer


def _builder(max_len=None, template=TEMPLATE, verbalizer=VERBALIZER, separator="\n\n", train=TRAIN, room=None):
    return PromptBuilder(tokenizer(), PromptTemplate.parse(template), verbalizer, separator, train, max_len, room)


def _tokens(ids):
    return tokenizer().convert_ids_to_tokens(ids)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_prompt_text_and_ids_token_by_token(k):
    b = _builder()
    prompt = b.build(list(range(k)), "the plot was dull")
    demos = [["review", ":", "great", "movie", "sentiment", ":", "positive"],
             ["review", ":", "dull", "plot", "sentiment", ":", "negative"]][:k]
    expected = ["[SEP]"] + [t for d in demos for t in d] + ["review", ":", "the", "plot", "was", "dull", "sentiment",
                                                            ":"]
    assert _tokens(prompt.ids) == expected
    texts = ["Review: great movie\nSentiment: positive", "Review: dull plot\nSentiment: negative"][:k]
    assert prompt.text == "\n\n".join([*texts, "Review: the plot was dull\nSentiment:"])
    assert prompt.demos == list(range(k)) and prompt.dropped == 0 and prompt.cut == 0
    assert [_tokens(c) for c in b.candidates] == [["positive"], ["negative"]]


def test_the_space_before_the_label_moves_to_the_answer_and_the_suffix_closes_demonstrations():
    t = PromptTemplate.parse("Q: {text} A: {label}.")
    assert t.query("x") == "Q: x A:" and t.answer("yes") == " yes" and t.suffix("x") == "."
    assert t.answer_context() == "A:"
    assert PromptTemplate.parse("{text}\nAnswer:  {label}").answer_context() == "Answer:"
    assert PromptTemplate.parse("{{x}} {text} {label}").query("a") == "{x} a"
    b = _builder(template="Review: {text} Sentiment: {label} .")
    assert _tokens(b.build([0], "bad").ids)[:9] == ["[SEP]", "review", ":", "great", "movie", "sentiment", ":",
                                                    "positive", "."]


def test_text_pair_placeholder():
    b = _builder(template="{text} / {text_pair} answer: {label}",
                 train=[Example("good", "fine", "pos"), Example("bad", "dull", "neg")])
    assert _tokens(b.build([1], "a", "the").ids) == ["[SEP]", "bad", "/", "dull", "answer", ":", "negative", "a", "/",
                                                     "the", "answer", ":"]
    with pytest.raises(LmforgeError, match="no text_pair"):
        b.build([], "a", None)


def test_document_start_is_sep_for_wordpiece_and_bos_for_byte_bpe():
    class BPE:
        bos_id, eos_id = 50256, 50256

    assert document_start_ids(tokenizer()) == [tokenizer().sep_id]
    assert document_start_ids(BPE()) == [50256] and document_end_id(BPE()) == 50256
    assert document_end_id(tokenizer()) == tokenizer().sep_id
    with pytest.raises(LmforgeError, match="neither sep_id nor bos_id"):
        document_start_ids(object())


@pytest.mark.parametrize("template, words", [
    ("Review: {label}", "no {text}"),
    ("Review: {text}", "no {label}"),
    ("{text} {label} {label}", "more than once"),
    ("{text} {foo} {label}", "unknown placeholder {foo}"),
    ("{text} {} {label}", "unknown placeholder"),
    ("{text!r} {label}", "no conversion or format"),
    ("{text {label}", "literal brace"),
])
def test_bad_templates_are_refused(template, words):
    with pytest.raises(LmforgeError) as err:
        PromptTemplate.parse(template)
    assert words in str(err.value)


def test_verbalizer_checks(caplog):
    with pytest.raises(LmforgeError, match="no words for label 'neg'"):
        resolve_verbalizer({"pos": "positive"}, TRAIN, TEST)
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        out = resolve_verbalizer({**VERBALIZER, "neu": "neutral"}, TRAIN, TEST)
    assert list(out) == ["pos", "neg", "neu"] and "'neu'" in caplog.text
    assert resolve_verbalizer(None, TRAIN, TEST) == {"neg": "neg", "pos": "pos"}
    with pytest.raises(LmforgeError, match="labels 'pos' and 'neg' have the same verbalisation"):
        _builder(verbalizer={"pos": "Positive", "neg": "positive"})  # the tokenizer lowercases
    with pytest.raises(LmforgeError, match="tokenize to nothing"):
        _builder(verbalizer={"pos": "\u200b", "neg": "negative"})
    with pytest.raises(LmforgeError, match="has no words"):
        resolve_verbalizer({"pos": " ", "neg": "negative"}, TRAIN, TEST)
    # without a verbalizer the candidates are the training labels: a test label outside them is named
    odd = [Example("a new text", label="joy", line=7)]
    with pytest.raises(LmforgeError, match=r"test label 'joy' \(line 7\) never appears in the training data"):
        resolve_verbalizer(None, TRAIN, odd)
    assert resolve_verbalizer(None, [], TEST) == {"neg": "neg", "pos": "pos"}  # zero-shot without a training file


def test_same_seed_same_demonstrations_other_seed_other():
    def draw(seed, per_example):
        return draw_demonstrations(len(TRAIN), 3, len(TEST), random.Random(seed), per_example=per_example,
                                   excluded=[frozenset()] * len(TEST))

    assert draw(0, False) == draw(0, False) and draw(0, True) == draw(0, True)
    assert draw(0, False) != draw(1, False)
    fixed, fresh = draw(0, False), draw(0, True)
    assert all(d == fixed[0] for d in fixed)  # fixed: the same K for every test example
    assert len({tuple(d) for d in fresh}) > 1  # per-example: drawn afresh
    assert all(len(set(d)) == 3 for d in fresh)


def test_a_test_example_is_never_its_own_demonstration():
    train = [*TRAIN, TEST[0]]
    excluded = [frozenset({len(train) - 1}), *[frozenset()] * (len(TEST) - 1)]
    for per_example in (False, True):
        for seed in range(20):
            demos = draw_demonstrations(len(train), len(train) - 1, len(TEST), random.Random(seed),
                                        per_example=per_example, excluded=excluded)
            assert len(train) - 1 not in demos[0] and len(demos[0]) == len(train) - 1
    with pytest.raises(LmforgeError, match="only 8 training examples differ"):
        draw_demonstrations(len(train), len(train), len(TEST), random.Random(0), per_example=False,
                            excluded=excluded)


def test_the_test_label_never_leaks_into_the_prompt():
    test = Example("the movie was great", None, "zzunique")
    verbalizer = resolve_verbalizer({**VERBALIZER, "zzunique": "zzunique"}, TRAIN, [test])
    b = _builder(verbalizer=verbalizer)
    zz = tokenizer().vocab["zzunique"]
    for k in range(len(TRAIN) + 1):
        for seed in range(3):
            demos = draw_demonstrations(len(TRAIN), k, 1, random.Random(seed), per_example=False,
                                        excluded=[frozenset()])
            prompt = b.build(demos[0], test.text)
            assert "zzunique" not in prompt.text and zz not in prompt.ids
    assert [zz] in b.candidates  # the label is still a candidate answer


def test_too_long_prompts_drop_the_oldest_demonstrations_with_a_count():
    full = _builder().build([0, 1, 2, 3], "the plot was dull")
    assert len(full.ids) == 1 + 4 * 7 + 8
    b = _builder(max_len=1 + 2 * 7 + 8 + 1)  # room for two demonstrations and the one-token answer
    prompt = b.build([0, 1, 2, 3], "the plot was dull")
    assert prompt.dropped == 2 and prompt.demos == [2, 3] and prompt.cut == 0
    assert prompt.ids == [full.ids[0], *full.ids[1 + 2 * 7:]]
    assert "great movie" not in prompt.text and "good acting" in prompt.text


def test_a_query_too_long_alone_is_cut_from_the_left():
    b = _builder(max_len=6)
    prompt = b.build([0], "the plot was dull")
    assert prompt.dropped == 1 and prompt.cut == 4  # 1 + 8 tokens into 6 - 1 (answer) positions
    assert _tokens(prompt.ids) == ["[SEP]", "was", "dull", "sentiment", ":"]
    with pytest.raises(LmforgeError, match="leaves no room"):
        _builder(max_len=2)
