"""Each task owns its options: a setting another task reads is an error, and training-only settings are not saved
with the model."""

from __future__ import annotations

import json

import pytest

from lmforge.cli import main
from lmforge.config import TaskConfig
from lmforge.errors import LmforgeError
from lmforge.tasks import make_task
from lmforge.tasks.base import COMMON_OPTIONS, TRAINING_OPTIONS


@pytest.mark.parametrize(("settings", "words"), [
    ({"task": "qa", "crf": True}, "crf=True: not an option of task 'qa'; its options are doc_stride"),
    ({"task": "sequence", "doc_stride": 64}, "doc_stride=64: not an option of task 'sequence'"),
    ({"task": "token", "long_text": "chunks", "max_span_width": 3}, "long_text='chunks', max_span_width=3"),
])
def test_an_option_of_another_task_is_refused(settings, words):
    with pytest.raises(LmforgeError, match=words):
        make_task(TaskConfig(**settings)).check_options()


@pytest.mark.parametrize("settings", [{"task": "qa", "doc_stride": 64, "epochs": 2.0, "freeze": "embeddings"},
                                      {"task": "token", "crf": True, "scheme": "BIO", "dropout": 0.2},
                                      {"task": "pair", "text_pair_column": "b", "head_lr": 1e-3},
                                      {"task": "span", "max_span_width": 3}])
def test_own_common_and_training_options_are_accepted(settings):
    make_task(TaskConfig(**settings)).check_options()


def test_the_saved_task_settings_hold_no_training_options():
    task = make_task(TaskConfig(task="token", crf=True, epochs=7.0, init_embeddings="vectors.txt", head_lr=1e-3))
    saved = task.head_spec()["task"]
    assert saved["crf"] is True and saved["task"] == "token"
    assert not set(saved) & set(TRAINING_OPTIONS)
    assert set(saved) == {*COMMON_OPTIONS, *type(task).options}


def test_finetune_refuses_crf_on_a_sequence_task(tiny_encoder_dir, tmp_path, capsys):
    from tests.toy_tasks import write_task_data

    train, _ = write_task_data(tmp_path, "sequence", n_train=8, n_dev=4)
    code = main(["finetune", "--task", "sequence", "--model", str(tiny_encoder_dir), "--train", str(train),
                 "--out", str(tmp_path / "run"), "--crf", "--epochs", "1"])
    assert code == 2 and "crf=True: not an option of task 'sequence'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_fine_tuned_folder_saves_only_inference_settings(finetuned):
    run, _, _ = finetuned("token")
    saved = json.loads((run / "config.json").read_text())["head"]["task"]
    assert saved["crf"] is True and not set(saved) & set(TRAINING_OPTIONS)
