"""metrics.jsonl records each logged interval's predicted tokens when the objective names the term counting them."""

from __future__ import annotations

from lmforge.objectives import MaskedLMObjective
from lmforge.training import RunOutput, Trainer
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_lm, train_config


class PredictingLM(LMObjective):
    predicted_tokens_term = "lm"  # the "lm" term's items are the predicted tokens


class RecordingData(ToyData):
    """ToyData that remembers the predicted (labelled) tokens of every micro-batch it hands out."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.predicted: list[int] = []

    def batches(self, micro_batch_size: int):
        for batch in super().batches(micro_batch_size):
            self.predicted.append(int((batch["labels"] != -100).sum()))
            yield batch


def test_predicted_tokens_of_each_interval_are_logged_next_to_tokens(tmp_path):
    data = RecordingData(n=32, seed=3)
    config = train_config(max_steps=6, batch_size=8, micro_batch_size=4, log_every=2, save_every=0)
    Trainer(tiny_lm(), PredictingLM(two_terms=True), data, config, RunOutput(tmp_path, progress=False)).fit()
    train = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in train] == [2, 4, 6]
    per_step = [sum(data.predicted[i:i + 2]) for i in range(0, 12, 2)]  # 2 micro-batches per step
    assert [r["predicted_tokens"] for r in train] == [per_step[0] + per_step[1], per_step[2] + per_step[3],
                                                      per_step[4] + per_step[5]]
    assert all(0 < r["predicted_tokens"] and "tokens" in r for r in train)


def test_no_predicted_tokens_without_the_declaration(tmp_path):
    config = train_config(max_steps=2, log_every=1, save_every=0)
    Trainer(tiny_lm(), LMObjective(two_terms=True), ToyData(n=16), config, RunOutput(tmp_path, progress=False)).fit()
    assert all("predicted_tokens" not in r for r in read_jsonl(tmp_path / "metrics.jsonl"))


def test_masked_lm_objectives_declare_their_masked_tokens():
    for flags in ({}, {"nsp": True}, {"sbo": True}):
        assert MaskedLMObjective(**flags).predicted_tokens_term == "mlm"
