"""``lmforge.nn.inputs``: the boundary checks every model family shares (ids, id ranges, layer selections, flags)."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn import check_flag, check_id_range, check_input_ids, check_integer_tensor, select_layers


def test_check_input_ids_returns_the_shape_of_good_ids() -> None:
    assert check_input_ids(torch.tensor([[0, 4, 9]]), vocab_size=10) == (1, 3)
    assert check_input_ids(torch.zeros(2, 5, dtype=torch.int32), vocab_size=1, name="src_ids") == (2, 5)


@pytest.mark.parametrize("ids, pattern", [
    ([[1, 2]], r"^tgt_ids must be a torch tensor of integer token ids; got list$"),
    (torch.ones(2, 3), r"^tgt_ids must hold integer token ids .*got dtype torch.float32$"),
    (torch.ones(2, 3, dtype=torch.bool), r"torch.bool$"),
    (torch.ones(2, 3, dtype=torch.complex64), r"torch.complex64$"),
    (torch.ones(3, dtype=torch.long), r"got shape \(3,\) \(add a batch dimension: tgt_ids.unsqueeze\(0\)\)$"),
    (torch.ones(1, 2, 3, dtype=torch.long), r"^tgt_ids must be a \(batch, length\) tensor of token ids; got shape "
                                            r"\(1, 2, 3\)$"),
    (torch.ones(0, 3, dtype=torch.long), r"^tgt_ids is empty \(batch size 0, length 3\)"),
    (torch.ones(2, 0, dtype=torch.long), r"^tgt_ids is empty \(batch size 2, length 0\)"),
    (torch.tensor([[1, 2], [3, 10]]), r"^tgt_ids: token id 10 at \(batch 1, position 1\) is outside the vocabulary "
                                      r"of size 10 \(valid ids are 0 \.\. 9\)$"),
    (torch.tensor([[1, -2], [3, 10]]), r"token id -2 at \(batch 0, position 1\)"),  # the first offender, in order
])
def test_check_input_ids_refuses_with_a_clear_message(ids: object, pattern: str) -> None:
    with pytest.raises(LmforgeError, match=pattern):
        check_input_ids(ids, vocab_size=10, name="tgt_ids")


def test_check_integer_tensor_takes_any_shape_and_names_what_the_ids_are() -> None:
    ids = torch.arange(4)
    assert check_integer_tensor(ids, "position_ids") is ids
    with pytest.raises(LmforgeError, match=r"^position_ids must hold integer ids .*torch.float64$"):
        check_integer_tensor(ids.double(), "position_ids")
    with pytest.raises(LmforgeError, match=r"^segments must be a torch tensor of integer segment ids; got tuple$"):
        check_integer_tensor((0, 1), "segments", what="segment ids")


def test_check_id_range_names_the_first_offender_and_its_place() -> None:
    check_id_range(torch.tensor([0, 2]), 3, name="position_ids", what="position id", limit="max_seq_len=3")
    with pytest.raises(LmforgeError, match=r"^position_ids: position id 5 at position 1 is outside max_seq_len=3 "
                                           r"\(valid ids are 0 \.\. 2\)$"):
        check_id_range(torch.tensor([0, 5, 7]), 3, name="position_ids", what="position id", limit="max_seq_len=3")


def test_select_layers() -> None:
    assert select_layers(True, 3) == {0, 1, 2}
    assert select_layers(False, 3) == frozenset()
    assert select_layers([0, -1], 3) == {0, 2}
    assert select_layers((2, -1), 3) == {2}  # the same layer twice is one layer
    assert select_layers(range(2), 3) == {0, 1}


@pytest.mark.parametrize("requested", [[True], [False], [0, True], [3], [-4], [1.0], ["0"]])
def test_select_layers_refuses_bools_and_indices_out_of_range(requested: list) -> None:
    with pytest.raises(LmforgeError, match=r"^output_attentions: layer index .* does not exist in a 3-layer model"):
        select_layers(requested, 3)


@pytest.mark.parametrize("requested", [1, "01", None])
def test_select_layers_refuses_what_is_neither_a_bool_nor_indices(requested: object) -> None:
    with pytest.raises(LmforgeError, match=r"^layers must be True, False or a sequence of layer indices"):
        select_layers(requested, 3, name="layers")  # type: ignore[arg-type]


def test_check_flag() -> None:
    assert check_flag(True, "output_attentions") is True
    assert check_flag(False, "output_attentions") is False
    for value in ([0], [True], 1, None):
        with pytest.raises(LmforgeError, match=r"^output_attentions must be True or False here"):
            check_flag(value, "output_attentions")
