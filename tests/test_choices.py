"""Every closed choice has one list of names (lmforge.choices): the implementations' tables have exactly those keys,
and the command line offers exactly those names."""

from __future__ import annotations

import pytest

from lmforge import choices
from lmforge.cli import build_parser


def test_implementation_tables_have_exactly_the_names():
    from lmforge.data.masking import STRATEGIES
    from lmforge.data.schemes import SCHEMES
    from lmforge.embeddings.contextual import POOLINGS
    from lmforge.models import ARCHITECTURES
    from lmforge.nn.attention import KERNELS, SCORES
    from lmforge.nn.feedforward import ACTIVATIONS
    from lmforge.nn.rnn import CELLS
    from lmforge.tasks import _TASKS
    from lmforge.viz.html import PRECISIONS

    assert list(ARCHITECTURES) == list(choices.ARCHITECTURES)
    assert list(ACTIVATIONS) == list(choices.ACTIVATIONS)
    assert list(KERNELS) == list(choices.KERNELS)
    assert list(SCORES) == list(choices.ATTENTION_SCORES)
    assert list(CELLS) == list(choices.RNN_CELLS)
    assert list(_TASKS) == list(choices.TASKS)
    assert STRATEGIES == choices.MASKINGS and SCHEMES == choices.TAG_SCHEMES
    assert POOLINGS == choices.TEXT_POOLINGS and PRECISIONS == choices.VIEWER_PRECISIONS


@pytest.mark.parametrize("name", choices.SCHEDULES)
def test_every_schedule_is_implemented(name):
    from lmforge.config import TrainConfig
    from lmforge.training.optim import lr_multiplier

    assert lr_multiplier(1, TrainConfig(schedule=name, max_steps=10, warmup_steps=2)) > 0


def options(command: str) -> dict[str, list[str]]:
    parser = build_parser()
    node = parser
    for word in command.split():
        node = next(a for a in node._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices[word]
    return {s: list(a.choices) for a in node._actions if a.choices and not isinstance(a.choices, dict)
            for s in a.option_strings}


def test_the_command_line_offers_exactly_the_names():
    assert options("finetune")["--task"] == list(choices.TASKS)
    assert options("finetune")["--long-text"] == list(choices.LONG_TEXT)
    assert options("finetune")["--scheme"] == ["auto", *choices.TAG_SCHEMES]
    assert options("pretrain")["--precision"] == list(choices.PRECISIONS)
    assert options("pretrain")["--masking"] == list(choices.MASKINGS)
    assert options("embed")["--pooling"] == list(choices.TEXT_POOLINGS)
    assert options("embed")["--word-pooling"] == list(choices.WORD_POOLINGS)
    assert options("viz attention")["--precision"] == list(choices.VIEWER_PRECISIONS)


def test_recurrent_families_are_the_registry_s_and_are_validated_as_rnns():
    from lmforge.config import ModelConfig, family_class
    from lmforge.errors import LmforgeError
    from lmforge.models import architectures_with

    recurrent = architectures_with("recurrent")
    assert recurrent == ["rnn", "rnn_seq2seq", "elmo"]
    # every recurrent family is configured as a non-Transformer (and so are ELMo's biLM and the AWD-LSTM)
    assert [a for a in choices.ARCHITECTURES if not family_class(a).transformer] == [
        "rnn", "rnn_seq2seq", "bilm", "elmo", "awd_lstm"]
    for arch in recurrent:  # the Transformer fields do not apply: no n_heads to please
        ModelConfig(arch=arch, vocab_size=99, d_model=12, n_heads=7, d_ff=0, max_seq_len=16)
    with pytest.raises(LmforgeError, match="d_model=12 is not divisible by n_heads=7"):
        ModelConfig(arch="encoder", vocab_size=99, d_model=12, n_heads=7, max_seq_len=16)
