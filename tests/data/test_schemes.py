"""Tagging schemes: decoding (incl. conlleval's lenient rules), encoding, conversion, detection, validation, and
CRF transition masks checked against brute-force enumeration."""

import itertools

import pytest

from lmforge.data.schemes import (
    allowed_transitions,
    check_scheme,
    close_labels,
    convert_tags,
    detect_scheme,
    entity_types,
    label_of,
    normalize_scheme,
    parse_tag,
    spans_to_tags,
    tags_to_spans,
)
from lmforge.errors import LmforgeError

# One sentence's entities in each scheme: [PER Ann Lee] met [PER Bob] [PER Cy] in [LOC Rome]
SPANS = [(0, 2, "PER"), (3, 4, "PER"), (4, 5, "PER"), (6, 7, "LOC")]
LENGTH = 7
ENCODED = {
    "BIO": ["B-PER", "I-PER", "O", "B-PER", "B-PER", "O", "B-LOC"],
    "IOB1": ["I-PER", "I-PER", "O", "I-PER", "B-PER", "O", "I-LOC"],
    "BIOES": ["B-PER", "E-PER", "O", "S-PER", "S-PER", "O", "S-LOC"],
}


def test_parse_tag_and_helpers():
    assert parse_tag("B-geo-loc") == ("B", "geo-loc")
    assert parse_tag("O") == ("O", None)
    assert parse_tag("L-PER") == ("E", "PER") and parse_tag("U-PER") == ("S", "PER")
    assert label_of("I-PER") == "PER" and label_of("O") is None
    assert entity_types(["O", "B-PER", "I-LOC", "S-PER"]) == ["LOC", "PER"]
    for bad in ("X", "B-", "B", "Q-PER", "o", ""):
        with pytest.raises(LmforgeError, match="malformed tag"):
            parse_tag(bad)
    assert normalize_scheme("iob2") == "BIO" and normalize_scheme("bilou") == "BIOES"
    with pytest.raises(LmforgeError, match="choose one of BIO, IOB1, BIOES"):
        normalize_scheme("IO")


@pytest.mark.parametrize("scheme", ["BIO", "IOB1", "BIOES"])
def test_encode_and_decode_each_scheme(scheme):
    assert spans_to_tags(SPANS, LENGTH, scheme) == ENCODED[scheme]
    assert tags_to_spans(ENCODED[scheme], scheme) == SPANS
    check_scheme([ENCODED[scheme]], scheme)


@pytest.mark.parametrize("source, target", list(itertools.permutations(["BIO", "IOB1", "BIOES"], 2)))
def test_convert_round_trips(source, target):
    converted = convert_tags(ENCODED[source], source, target)
    assert converted == ENCODED[target]
    assert convert_tags(converted, target, source) == ENCODED[source]


def test_bilou_aliases_decode_like_bioes():
    assert tags_to_spans(["B-X", "L-X", "U-Y"], "BILOU") == [(0, 2, "X"), (2, 3, "Y")]


@pytest.mark.parametrize("tags, expected", [
    # conlleval: an I- after O, at the start or after another type starts a new entity
    (["I-PER", "I-PER", "O"], [(0, 2, "PER")]),
    (["O", "I-PER"], [(1, 2, "PER")]),
    (["B-PER", "I-LOC", "I-LOC"], [(0, 1, "PER"), (1, 3, "LOC")]),
    (["B-PER", "B-PER", "I-PER"], [(0, 1, "PER"), (1, 3, "PER")]),
    (["B-PER", "I-PER"], [(0, 2, "PER")]),  # an entity open at the end of the sentence is closed there
    ([], []),
    (["O", "O"], []),
])
def test_bio_lenient_decoding(tags, expected):
    assert tags_to_spans(tags, "BIO") == expected
    assert tags_to_spans(tags, "IOB1") == expected  # BIO and IOB1 decode identically


@pytest.mark.parametrize("tags, expected", [
    (["B-X", "I-X", "E-X", "S-X"], [(0, 3, "X"), (3, 4, "X")]),
    (["B-X", "B-X", "E-X"], [(0, 1, "X"), (1, 3, "X")]),  # the unfinished entity ends before the next B
    (["I-X", "E-X"], [(0, 2, "X")]),                       # an entity opened by I
    (["E-X", "O", "I-X"], [(0, 1, "X"), (2, 3, "X")]),
    (["B-X", "E-Y"], [(0, 1, "X"), (1, 2, "Y")]),
    (["B-X", "I-X"], [(0, 2, "X")]),
])
def test_bioes_lenient_decoding(tags, expected):
    assert tags_to_spans(tags, "BIOES") == expected


def test_scheme_mismatch_and_bad_spans():
    with pytest.raises(LmforgeError, match="does not belong to the BIO scheme.*BIOES"):
        tags_to_spans(["S-PER"], "BIO")
    with pytest.raises(LmforgeError, match="overlap"):
        spans_to_tags([(0, 2, "A"), (1, 3, "B")], 4, "BIO")
    with pytest.raises(LmforgeError, match="out of range for 2 tokens"):
        spans_to_tags([(1, 3, "A")], 2, "BIO")
    with pytest.raises(LmforgeError, match="out of range"):
        spans_to_tags([(1, 1, "A")], 2, "BIO")


def test_detect_scheme():
    assert detect_scheme([ENCODED["BIO"], ["O"]]) == "BIO"
    assert detect_scheme([ENCODED["IOB1"]]) == "IOB1"
    assert detect_scheme([["O"], ENCODED["BIOES"]]) == "BIOES"
    assert detect_scheme([["U-PER", "O"]]) == "BIOES"
    assert detect_scheme([["O", "O"], []]) == "BIO"                 # no entities
    assert detect_scheme([["I-PER", "I-PER"]]) == "IOB1"
    assert detect_scheme([["I-PER", "B-PER"]]) == "IOB1"            # B only between adjacent entities
    assert detect_scheme([["B-PER", "I-PER"], ["O", "I-LOC"]]) == "BIO"  # ill-formed BIO, not IOB1
    assert detect_scheme([["I-PER", "B-LOC"]]) == "BIO"             # a B that opens an entity of another type


def test_check_scheme_names_the_first_violation():
    good = ["B-PER", "O"]
    with pytest.raises(LmforgeError, match=r"sentence 1: token 2: 'I-LOC' cannot follow 'O' under the BIO"):
        check_scheme([good, ["B-PER", "O", "I-LOC"]], "BIO")
    with pytest.raises(LmforgeError, match=r"ner\.txt:12: sentence 1: token 0: 'I-PER' cannot start"):
        check_scheme([good, ["I-PER"]], "BIO", lines=[3, 12], source="ner.txt")
    with pytest.raises(LmforgeError, match=r"line 5 \(sentence 0\): token 1: 'B-PER' cannot end"):
        check_scheme([["O", "B-PER"]], "BIOES", lines=[5])
    with pytest.raises(LmforgeError, match=r"token 0: 'B-PER' cannot start"):
        check_scheme([["B-PER"]], "IOB1")
    check_scheme([["I-PER", "B-PER", "I-LOC"]], "IOB1")


LABEL_SETS = {
    "BIO": ["O", "B-A", "I-A", "B-B", "I-B"],
    "IOB1": ["O", "B-A", "I-A", "B-B", "I-B"],
    "BIOES": ["O", "B-A", "I-A", "E-A", "S-A", "B-B", "I-B", "E-B", "S-B"],
}


@pytest.mark.parametrize("scheme", ["BIO", "IOB1", "BIOES"])
def test_allowed_transitions_match_brute_force_round_trips(scheme):
    labels = LABEL_SETS[scheme]
    start, transitions, end = allowed_transitions(labels, scheme)
    assert len(start) == len(end) == len(transitions) == len(labels)
    assert all(len(row) == len(labels) for row in transitions)
    n_valid = 0
    for length in range(1, 5):
        for seq in itertools.product(range(len(labels)), repeat=length):
            tags = [labels[i] for i in seq]
            allowed = (start[seq[0]] and end[seq[-1]]
                       and all(transitions[a][b] for a, b in itertools.pairwise(seq)))
            round_trip = spans_to_tags(tags_to_spans(tags, scheme), length, scheme) == tags
            assert allowed == round_trip, (scheme, tags)
            n_valid += allowed
            # check_scheme applies the same rules
            try:
                check_scheme([tags], scheme)
                checked = True
            except LmforgeError:
                checked = False
            assert checked == allowed, (scheme, tags)
    assert n_valid > 50  # the enumeration is not vacuous


def test_allowed_transitions_spot_checks():
    labels = ["O", "B-A", "I-A", "E-A", "S-A"]
    start, transitions, end = allowed_transitions(labels, "BIOES")
    assert start == [True, True, False, False, True]
    assert end == [True, False, False, True, True]
    assert transitions[1] == [False, False, True, True, False]  # after B-A: only I-A or E-A
    start, transitions, end = allowed_transitions(["O", "B-A", "I-A"], "BIO")
    assert start == [True, True, False] and end == [True, True, True]
    assert [row[2] for row in transitions] == [False, True, True]  # I-A only after B-A / I-A
    with pytest.raises(LmforgeError, match="does not belong to the BIO scheme"):
        allowed_transitions(["O", "E-A"], "BIO")


# ----------------------------------------------------------------------------------------------- closed label sets


def test_close_labels_adds_the_inside_tag_of_a_type_seen_only_at_a_start():
    # issue 23: the Twitter data has B-sportsteam in training but the test file's I-sportsteam was unknown
    assert close_labels(["O", "B-sportsteam", "B-person", "I-person"], "BIO") == \
        ["O", "B-person", "I-person", "B-sportsteam", "I-sportsteam"]


def test_close_labels_under_bioes_brings_all_four_prefixes():
    assert close_labels(["S-PER", "O"], "BIOES") == ["O", "B-PER", "I-PER", "E-PER", "S-PER"]
    assert close_labels(["U-LOC", "L-PER"], "BILOU") == close_labels(["S-LOC", "E-PER"], "BIOES")


def test_close_labels_always_has_o_and_is_closed():
    labels = close_labels(["I-geo-loc"], "IOB1")
    assert labels == ["O", "B-geo-loc", "I-geo-loc"]
    assert close_labels(labels, "BIO") == labels  # closing twice changes nothing


def test_close_labels_refuses_a_tag_outside_the_scheme():
    with pytest.raises(LmforgeError, match="does not belong to the BIO scheme"):
        close_labels(["S-PER"], "BIO")
    with pytest.raises(LmforgeError, match="malformed tag"):
        close_labels(["PER"], "BIO")
