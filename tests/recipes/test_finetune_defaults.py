"""Fine-tuning defaults that used to fail quietly: the learning rate by backbone, the zero-metric hint."""

from __future__ import annotations

import logging

import pytest

from lmforge.config import TaskConfig, TrainConfig, model_config_from_preset
from lmforge.recipes.finetune import DEFAULT_LR, FinetuneRun, _ZeroMetricHint, default_lr
from lmforge.tasks import make_task


@pytest.mark.parametrize("preset, kind", [("bert-tiny", "random transformer"), ("rnn-attn", "recurrent"),
                                          ("awd-lstm-small", "recurrent")])
def test_default_lr_of_a_preset(preset, kind):
    config = model_config_from_preset(preset, vocab_size=99, pad_token_id=0)
    assert default_lr(preset, config) == (DEFAULT_LR[kind], kind)


def test_default_lr_of_a_pretrained_transformer_folder(tmp_path):
    config = model_config_from_preset("bert-tiny", vocab_size=99, pad_token_id=0)
    assert default_lr(str(tmp_path), config) == (5e-5, "pretrained transformer")  # BERT's (Devlin et al.)


def _hint(eval_every: int | None) -> _ZeroMetricHint:
    run = FinetuneRun(task=TaskConfig(task="token"), train=TrainConfig(lr=5e-5, max_steps=30, eval_every=eval_every))
    return _ZeroMetricHint(run, make_task(run.task), per_epoch=10)


@pytest.fixture
def logs(caplog, monkeypatch):
    """The lmforge logger's records (the CLI's setup_logging stops propagation to caplog's root handler)."""
    monkeypatch.setattr(logging.getLogger("lmforge"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        yield caplog


def test_a_dev_metric_still_zero_after_an_epoch_names_the_options(logs):
    hint = _hint(eval_every=5)
    hint({"f1": 0.0})  # half an epoch: too early to say
    assert not logs.records
    hint({"f1": 0.0})
    hint({"f1": 0.0})  # said once only
    [record] = logs.records
    assert "dev f1 is still 0" in record.getMessage() and "--head-lr" in record.getMessage()
    assert "--lr" in record.getMessage() and "--epochs" in record.getMessage()


def test_no_hint_when_the_model_learns(logs):
    _hint(eval_every=10)({"f1": 0.25})
    assert not logs.records


def test_a_classifier_predicting_one_class_is_named_whatever_the_metric(logs):
    run = FinetuneRun(task=TaskConfig(task="sequence"), train=TrainConfig(lr=5e-5, max_steps=96, batch_size=32))
    hint = _ZeroMetricHint(run, make_task(run.task), per_epoch=32)
    hint({"accuracy": 0.509, "f1": 0.337, "mcc": 0.0})  # SST-2 with every sentence called "1": accuracy looks fine
    hint({"accuracy": 0.509, "f1": 0.337, "mcc": 0.0})
    [record] = logs.records
    message = record.getMessage()
    assert "dev MCC is 0 (accuracy 0.509)" in message and "one class for every example" in message
    assert "--batch-size" in message and "--epochs" in message and "--lr" in message


def test_no_collapse_hint_for_a_classifier_that_learns(logs):
    run = FinetuneRun(task=TaskConfig(task="sequence"), train=TrainConfig(lr=5e-5, max_steps=96))
    _ZeroMetricHint(run, make_task(run.task), per_epoch=32)({"accuracy": 0.62, "f1": 0.6, "mcc": 0.21})
    assert not logs.records


@pytest.mark.parametrize(("n_train", "batch", "epochs"), [
    (1000, 16, 10.0),     # 63 batches an epoch: 10 epochs for 600 updates (the defaults: 96)
    (100, 16, 20.0),      # 7 an epoch: capped at 20 epochs
    (5000, 16, 3.0),      # 469 updates by default: batch 16 already makes 939 in 3 epochs
    (6400, 32, 3.0),      # 600 updates by default: unchanged
])
def test_a_small_training_set_gets_enough_updates(tmp_path, n_train, batch, epochs):
    from lmforge.recipes.finetune import MIN_UPDATES, _default_schedule

    config = model_config_from_preset("bert-tiny", vocab_size=99, pad_token_id=0)
    run = FinetuneRun(model=str(tmp_path), task=TaskConfig(task="sequence"), train=TrainConfig(batch_size=32))
    _default_schedule(run, default_lr(run.model, config)[1], n_train)
    assert (run.train.batch_size, run.task.epochs) == (batch, epochs)
    updates = -(-n_train // batch) * epochs
    assert updates >= MIN_UPDATES or epochs == 20.0


@pytest.mark.parametrize(("micro", "batch"), [(8, 16), (12, 12), (32, 32)])
def test_the_small_data_batch_is_whole_micro_batches(tmp_path, micro, batch):
    """A user's --train.micro_batch_size: the rule's batch is a multiple of it and never smaller than one."""
    from lmforge.recipes.finetune import _default_schedule

    config = model_config_from_preset("bert-tiny", vocab_size=99, pad_token_id=0)
    run = FinetuneRun(model=str(tmp_path), task=TaskConfig(task="sequence"),
                      train=TrainConfig(batch_size=96, micro_batch_size=micro))
    _default_schedule(run, default_lr(run.model, config)[1], 1000)
    assert run.train.batch_size == batch and run.train.batch_size % micro == 0 and run.task.epochs > 3.0


def test_the_schedule_is_left_alone_for_random_weights_or_given_steps(tmp_path):
    from lmforge.recipes.finetune import _default_schedule

    config = model_config_from_preset("bert-tiny", vocab_size=99, pad_token_id=0)
    preset = FinetuneRun(model="bert-tiny", task=TaskConfig(task="sequence"), train=TrainConfig(batch_size=32))
    _default_schedule(preset, default_lr(preset.model, config)[1], 1000)  # a preset: random weights
    steps = FinetuneRun(model=str(tmp_path), task=TaskConfig(task="sequence"),
                        train=TrainConfig(batch_size=32, max_steps=50))
    _default_schedule(steps, default_lr(steps.model, config)[1], 1000)
    for run in (preset, steps):
        assert (run.train.batch_size, run.task.epochs) == (32, 3.0)


def test_the_command_line_knows_when_the_schedule_was_given():
    import argparse

    from lmforge.commands.finetune import schedule_given

    def args(**kw):
        base = dict(epochs=None, batch_size=None, max_steps=None, overrides=[], config=None)
        return argparse.Namespace(**{**base, **kw})

    assert not schedule_given(args())
    assert schedule_given(args(epochs=3.0)) and schedule_given(args(batch_size=32))
    assert schedule_given(args(overrides=["--train.max_steps=10"]))
    assert schedule_given(args(recorded_schedule=True))
