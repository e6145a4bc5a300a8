"""The rule-based sentence splitter on hand-made examples."""

import pytest

from lmforge.data.sentences import ends_sentence, split_paragraphs, split_sentences


@pytest.mark.parametrize("text, expected", [
    ("The cat sat. The dog ran.", ["The cat sat.", "The dog ran."]),
    ("Is it? Yes! Good.", ["Is it?", "Yes!", "Good."]),
    ("Wait... Then it came.", ["Wait...", "Then it came."]),
    ("Wait\u2026 Then it came.", ["Wait\u2026", "Then it came."]),
    ("Really?! No way.", ["Really?!", "No way."]),
    # closing quotes and brackets stay with their sentence
    ('He said "Go home." Then he left.', ['He said "Go home."', "Then he left."]),
    ("It rose (by a lot.) Then it fell.", ["It rose (by a lot.)", "Then it fell."]),
    ("She wrote \u201cthe end.\u201d The book sold.", ["She wrote \u201cthe end.\u201d", "The book sold."]),
    # next sentence starting with a digit or an opening quote
    ("Sales fell. 2004 was worse.", ["Sales fell.", "2004 was worse."]),
    ('He paused. "Why?" she asked.', ["He paused.", '"Why?" she asked.']),
    # no split before a lower-case word
    ("He said no. and left.", ["He said no. and left."]),
    ('"Stop!" he cried.', ['"Stop!" he cried.']),
    # abbreviations, initials, dotted abbreviations
    ("Mr. Smith met Dr. Jones at St. Paul's.", ["Mr. Smith met Dr. Jones at St. Paul's."]),
    ("Mrs. Brown and Prof. White came.", ["Mrs. Brown and Prof. White came."]),
    ("J. K. Rowling wrote it. It sold.", ["J. K. Rowling wrote it.", "It sold."]),
    ("The U.S. Senate voted. It passed.", ["The U.S. Senate voted.", "It passed."]),
    ("Fruit, e.g. Apples, i.e. Red ones.", ["Fruit, e.g. Apples, i.e. Red ones."]),
    ("Pens, paper etc. Were bought.", ["Pens, paper etc. Were bought."]),
    ("See No. 10 and pp. 4 for more.", ["See No. 10 and pp. 4 for more."]),
    ("The answer was no. The end.", ["The answer was no.", "The end."]),
    # decimal numbers and dotted words never split
    ("Profits rose 3.5% to $1.13bn. Shares fell 2.1 points.", ["Profits rose 3.5% to $1.13bn.",
                                                               "Shares fell 2.1 points."]),
    ("Visit google.com today. It works.", ["Visit google.com today.", "It works."]),
    # a plain number ending a sentence does split
    ("The score was 5. The crowd cheered.", ["The score was 5.", "The crowd cheered."]),
    # white space and line breaks inside a paragraph
    ("  One line\nwrapped here.   Two.  ", ["One line wrapped here.", "Two."]),
    ("No final punctuation", ["No final punctuation"]),
    ("", []),
    ("   ", []),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_split_paragraphs():
    text = "Title line\n\nFirst para.\nStill first.\n \t\nSecond para.\r\n\r\nThird.\n\n\n"
    assert split_paragraphs(text) == ["Title line", "First para.\nStill first.", "Second para.", "Third."]


def test_ends_sentence():
    assert ends_sentence("It rained.") and ends_sentence('He said "no!"  ') and ends_sentence("Why (really?)")
    assert not ends_sentence("A title") and not ends_sentence("") and not ends_sentence("3.5")
