"""The Trainer's evaluator and best-model selection (fine-tuning keeps the best dev checkpoint)."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.persistence import load_pretrained
from lmforge.training import RunOutput, Trainer
from tests.training.helpers import LMObjective, ToyData, decoder_config, tiny_decoder, train_config


class ScriptedEvaluator:
    """Returns the next score of a script and remembers the model's weights at each call."""

    def __init__(self, scores: list[float]) -> None:
        self.scores, self.seen = list(scores), []

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        assert not model.training and not torch.is_grad_enabled()
        self.seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return {"f1": self.scores[len(self.seen) - 1], "other": 1.0}


def _fit(tmp_path, evaluator, select, **overrides):
    config = train_config(max_steps=6, eval_every=2, save_every=2, **overrides)
    trainer = Trainer(tiny_decoder(), LMObjective(), ToyData(), config,
                      RunOutput(tmp_path, model_config=decoder_config(), progress=False), evaluator=evaluator,
                      select=select)
    trainer.fit()
    return trainer


def test_the_final_model_is_the_best_evaluation(tmp_path):
    evaluator = ScriptedEvaluator([0.2, 0.9, 0.5])  # evaluations at steps 2, 4, 6
    trainer = _fit(tmp_path, evaluator, "f1")
    assert trainer.best["step"] == 4
    final = load_pretrained(tmp_path).model.state_dict()
    for name, tensor in evaluator.seen[1].items():
        assert torch.equal(final[name], tensor), name
    assert not torch.equal(final["token_embedding.weight"], evaluator.seen[2]["token_embedding.weight"])
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results == {"step": 4, "f1": 0.9, "other": 1.0, "best_step": 4, "last_step": 6}
    evals = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"f1"' in line]
    assert [r["f1"] for r in evals] == [0.2, 0.9, 0.5]
    assert not (tmp_path / "best").exists()


def test_minimising_and_ties_keep_the_first(tmp_path):
    evaluator = ScriptedEvaluator([0.5, 0.3, 0.3])
    trainer = _fit(tmp_path, evaluator, "-f1")
    assert trainer.best["step"] == 4  # lower is better; the tie at step 6 does not replace it


def test_unknown_selection_metric_names_the_reported_ones(tmp_path):
    with pytest.raises(LmforgeError, match="cannot select the best model by 'accuracy'.*f1, other"):
        _fit(tmp_path, ScriptedEvaluator([0.1, 0.2, 0.3]), "accuracy")


def test_best_survives_a_resume(tmp_path):
    evaluator = ScriptedEvaluator([0.9, 0.1, 0.1])
    config = train_config(max_steps=4, eval_every=2, save_every=2)
    Trainer(tiny_decoder(), LMObjective(), ToyData(), config,
            RunOutput(tmp_path, model_config=decoder_config(), progress=False), evaluator=evaluator,
            select="f1").fit()
    # continue the same run to 6 steps: the best (step 2) must still win over the later, worse evaluation
    longer = train_config(max_steps=6, eval_every=2, save_every=2)
    resumed = Trainer(tiny_decoder(), LMObjective(), ToyData(), longer,
                      RunOutput(tmp_path, model_config=decoder_config(), progress=False, resume="auto"),
                      evaluator=ScriptedEvaluator([0.5]), select="f1")
    resumed.fit()
    assert resumed.best["step"] == 2 and resumed.best["record"]["f1"] == 0.9
    final = load_pretrained(tmp_path).model.state_dict()
    assert all(torch.equal(final[k], v) for k, v in evaluator.seen[0].items())
    assert json.loads((tmp_path / "eval_results.json").read_text())["best_step"] == 2
