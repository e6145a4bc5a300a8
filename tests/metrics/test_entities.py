"""conlleval-style entity scores on hand-computed examples."""

import pytest

from lmforge.errors import LmforgeError
from lmforge.metrics import entity_scores, span_scores


def test_exact_boundaries_and_type_are_required():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-PER"]]
    pred = [["B-PER", "O", "O", "B-LOC"],     # PER too short (wrong), LOC right
            ["B-LOC", "O", "B-PER"]]          # ORG typed as LOC (wrong), PER right
    scores = entity_scores(gold, pred)
    # gold 4 entities, predicted 4, correct 2
    assert scores["precision"] == pytest.approx(0.5)
    assert scores["recall"] == pytest.approx(0.5)
    assert scores["f1"] == pytest.approx(0.5)
    assert scores["per_type"] == {
        "LOC": {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3), "support": 1},
        "ORG": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        "PER": {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2},
    }


def test_i_after_o_is_a_new_entity_as_in_conlleval():
    gold = [["O", "B-PER", "I-PER", "O"]]
    # "I-PER" after O starts an entity (1, 3): conlleval counts it as a correct PER
    assert entity_scores(gold, [["O", "I-PER", "I-PER", "O"]])["f1"] == 1.0
    # "I-LOC" after B-PER starts a LOC entity: two predictions, none correct
    scores = entity_scores(gold, [["O", "B-PER", "I-LOC", "O"]])
    assert (scores["precision"], scores["recall"], scores["f1"]) == (0.0, 0.0, 0.0)
    assert scores["per_type"]["LOC"]["support"] == 0


def test_micro_average_differs_from_macro():
    gold = [["B-A", "O", "B-A", "O", "B-A", "O", "B-B"]]
    pred = [["B-A", "O", "B-A", "O", "B-A", "O", "O"]]
    scores = entity_scores(gold, pred)
    assert scores["precision"] == 1.0 and scores["recall"] == pytest.approx(0.75)
    assert scores["f1"] == pytest.approx(2 * 0.75 / 1.75)
    assert scores["per_type"]["B"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}


def test_bioes_scheme_and_no_entities():
    gold = [["B-X", "E-X", "S-Y"]]
    assert entity_scores(gold, [["B-X", "E-X", "S-Y"]], scheme="BIOES")["f1"] == 1.0
    assert entity_scores(gold, [["S-X", "S-X", "S-Y"]], scheme="BIOES")["precision"] == pytest.approx(1 / 3)
    empty = entity_scores([["O", "O"]], [["O", "O"]])
    assert empty == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "per_type": {}}


def test_span_scores_use_sets_per_sentence():
    gold = [[(0, 2, "PER")], [(1, 2, "LOC"), (0, 3, "ORG")]]  # nested spans are fine here
    pred = [[(0, 2, "PER"), (0, 2, "PER")], [(0, 3, "ORG"), (2, 3, "LOC")]]
    scores = span_scores(gold, pred)
    assert scores["precision"] == pytest.approx(2 / 3) and scores["recall"] == pytest.approx(2 / 3)
    assert scores["per_type"]["LOC"]["precision"] == 0.0
    # the same span in another sentence does not count
    assert span_scores([[(0, 1, "A")], []], [[], [(0, 1, "A")]])["f1"] == 0.0


def test_shape_errors():
    with pytest.raises(LmforgeError, match="sentence 1: 2 gold tags but 1 predicted"):
        entity_scores([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(LmforgeError, match="number of sentences"):
        entity_scores([["O"]], [])
    with pytest.raises(LmforgeError, match="empty"):
        span_scores([], [])
