"""An untagged token-task input is running text or CoNLL columns (lmforge.data.readers): sentences of equal
lengths are text, not a one-sentence CoNLL file (issue 38's list of things noticed)."""

from __future__ import annotations

from lmforge.data.readers import _is_running_text


def test_sentences_of_equal_length_are_running_text():
    assert _is_running_text("the market rose today\nshares fell in Paris\n")
    assert _is_running_text("Good morning\nSee you\n")  # two words each, neither looks like a tag


def test_conll_columns_stay_conll():
    assert not _is_running_text("Paris B-LOC\nrose O\n")  # one sentence, tagged columns
    assert not _is_running_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n")  # CoNLL-2003's four columns
    assert not _is_running_text("Paris\nrose\ntoday\n")  # one word per line: one untagged sentence
    assert not _is_running_text("Paris B-LOC\n\nrose O\n")  # blank lines separate sentences
    assert _is_running_text("the market rose\nshares fell\n")  # unequal widths: text, as before
