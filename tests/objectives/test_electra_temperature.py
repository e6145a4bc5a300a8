"""ELECTRA's sampling-temperature curriculum (``ElectraLoss.temperature``): the schedule by formula (to 1 or to
``temperature_end``), the draw at a temperature, the Trainer handing the run's progress to the objective, evaluation
at temperature 1, a compiled model that does not recompile as tau changes, and a resumed run equal to an
uninterrupted one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.heads import electra as electra_heads
from lmforge.heads.electra import sample_replacements
from lmforge.objectives.electra import ElectraObjective
from lmforge.objectives.options import ElectraLoss
from lmforge.training import RunOutput, Trainer
from lmforge.training.budget import RunLimit
from lmforge.training.state import Progress
from tests.objectives.test_electra import TINY_RUN, masked_batch, prepared, tiny  # noqa: F401  (prepared: fixture)
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_decoder, train_config, without_timing


@pytest.mark.parametrize(("fraction", "until"), [(0.0, 1.0), (0.25, 1.0), (0.5, 1.0), (0.9, 1.0), (0.2, 0.5),
                                                 (0.49, 0.5), (0.5, 0.5), (0.8, 0.5), (1.0, 1.0)])
def test_the_temperature_descends_geometrically_to_one(fraction, until):
    options = ElectraLoss(temperature=4.0, temperature_until=until)
    expected = 4.0 ** (1 - fraction / until) if fraction < until else 1.0
    assert options.temperature_at(fraction) == pytest.approx(expected, rel=1e-12)
    assert 1.0 <= options.temperature_at(fraction) <= 4.0


@pytest.mark.parametrize(("fraction", "until"), [(0.0, 1.0), (0.5, 1.0), (0.9, 1.0), (0.25, 0.5), (0.5, 0.5),
                                                 (0.8, 0.5), (1.0, 1.0)])
def test_the_temperature_descends_geometrically_to_its_end_and_stays(fraction, until):
    options = ElectraLoss(temperature=16.0, temperature_end=4.0, temperature_until=until)
    expected = 16.0 * 0.25 ** (fraction / until) if fraction < until else 4.0  # log-linear from 16 to 4
    assert options.temperature_at(fraction) == pytest.approx(expected, rel=1e-12)
    assert options.scheduled
    # a constant temperature: start = end
    assert ElectraLoss(temperature=4.0, temperature_end=4.0).temperature_at(fraction) == pytest.approx(4.0)
    # an end alone (start 1) is a schedule too: it rises from 1
    assert ElectraLoss(temperature_end=2.0).temperature_at(0.5) == pytest.approx(math.sqrt(2.0))


def test_the_default_is_the_papers_sampling_throughout():
    assert all(ElectraLoss().temperature_at(p) == 1.0 for p in (0.0, 0.3, 1.0))
    assert ElectraLoss(temperature=0.5).temperature_at(0.0) == 0.5  # below 1 sharpens, and also returns to 1
    assert ElectraLoss(temperature=0.5).temperature_at(0.5) == pytest.approx(math.sqrt(0.5))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("temperature", 0.0, "temperature=0.0 must be a finite number > 0"),
    ("temperature", float("inf"), "temperature=inf must be a finite number > 0"),
    ("temperature", True, "temperature=True must be a finite number > 0"),
    ("temperature_until", 0.0, r"temperature_until=0.0 must be in \(0, 1\]"),
    ("temperature_until", 1.5, r"temperature_until=1.5 must be in \(0, 1\]"),
    ("temperature_end", 0.0, "temperature_end=0.0 must be a finite number > 0"),
    ("temperature_end", float("nan"), "temperature_end=nan must be a finite number > 0"),
])
def test_bad_temperatures_are_clear_errors(field, value, message):
    with pytest.raises(LmforgeError, match=message):
        ElectraLoss(**{field: value})


def test_a_draw_at_a_temperature_is_softmax_of_the_scaled_logits():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(3)) * 4
    torch.manual_seed(7)
    drawn = sample_replacements(logits, 2.5)
    torch.manual_seed(7)
    assert torch.equal(drawn, torch.multinomial(F.softmax(logits / 2.5, dim=-1), 1).squeeze(-1))
    # frequencies: p = softmax(log([0.1, 0.9]) / 2), the flattened distribution
    torch.manual_seed(0)
    draws = sample_replacements(torch.log(torch.tensor([[0.1, 0.9]])).expand(6000, 2), 2.0)
    p = 0.9 ** 0.5 / (0.9 ** 0.5 + 0.1 ** 0.5)  # 0.75
    assert abs(draws.float().mean().item() - p) < 0.02
    # tau as a 0-d tensor (what the objective passes) draws the same tokens as the same float
    torch.manual_seed(7)
    assert torch.equal(sample_replacements(logits, torch.tensor(2.5)), drawn)


def test_a_compiled_model_does_not_recompile_as_the_temperature_changes():
    """tau changes every update: it reaches the model as a tensor, so dynamo compiles nothing after the first update
    (a float would cost a recompile at the first change of value, as dynamo makes it dynamic, or one per value where
    floats are specialised)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    objective = ElectraObjective(options=ElectraLoss(temperature=8.0, temperature_end=2.0))
    compiled = torch.compile(tiny().train(), backend="eager")
    batch = masked_batch()

    def update(fraction: float) -> None:
        objective.set_progress(fraction)
        loss, items = objective(compiled, batch).losses["rtd"]
        assert torch.isfinite(loss) and items > 0

    update(0.0)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0  # it did compile
    for fraction in (0.1, 0.3, 0.7, 1.0):  # four more values of tau
        update(fraction)
    assert counters["stats"]["unique_graphs"] == graphs
    torch._dynamo.reset()


def _recording(monkeypatch) -> list[float]:
    seen: list[float] = []
    original = electra_heads.sample_replacements

    def record(logits, temperature=1.0):
        seen.append(float(temperature))
        return original(logits, temperature)

    monkeypatch.setattr(electra_heads, "sample_replacements", record)
    return seen


def test_training_samples_at_the_scheduled_temperature_and_evaluation_at_one(monkeypatch):
    seen = _recording(monkeypatch)
    objective = ElectraObjective(options=ElectraLoss(temperature=3.0))
    batch = masked_batch()
    model = tiny()
    objective.set_progress(0.5)
    objective(model.train(), batch)
    objective(model.eval(), batch)
    assert seen == [pytest.approx(math.sqrt(3.0)), 1.0]
    assert ElectraObjective(ElectraLoss(rtd_weight=9.0)).rtd_weight == 9.0


def test_the_run_limit_reports_the_share_of_steps_or_of_the_budget():
    assert RunLimit(train_config(max_steps=8), Progress(step=2)).fraction() == 0.25
    budget = train_config(max_steps=None, budget="1000tok", warmup_steps=None)
    assert RunLimit(budget, Progress(budget_fraction=0.4)).fraction() == 0.4
    assert RunLimit(budget, Progress(budget_fraction=1.3)).fraction() == 1.0  # the last update overshoots


class _Following(LMObjective):
    """The toy LM objective, recording the progress the Trainer reports before each update."""

    def __init__(self) -> None:
        super().__init__()
        self.reported: list[float] = []

    def set_progress(self, fraction: float) -> None:
        self.reported.append(fraction)


def test_the_trainer_reports_its_progress_before_each_update(tmp_path):
    objective = _Following()
    Trainer(tiny_decoder(0), objective, ToyData(n=32, seed=1), train_config(max_steps=4),
            RunOutput(tmp_path / "run", resume="never", progress=False)).fit()
    assert objective.reported == [0.0, 0.25, 0.5, 0.75]


def test_a_tempered_run_resumes_exactly(prepared, tmp_path, capsys, monkeypatch):  # noqa: F811
    """In the middle of a token budget (the schedule follows its fraction): the same samples, losses and weights."""
    run = [*TINY_RUN, "--input", str(prepared / "data"), "--loss.temperature=3", "--budget", "256tok"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["-q", "pretrain", *run, "--out", str(whole)]) == 0, capsys.readouterr().err
    assert main(["-q", "pretrain", *run, "--out", str(part), "--max-steps", "2"]) == 0, capsys.readouterr().err
    assert main(["-q", "pretrain", *run, "--out", str(part), "--resume", "auto"]) == 0, capsys.readouterr().err
    a = [r for r in read_jsonl(whole / "metrics.jsonl") if "loss" in r]
    b = [r for r in read_jsonl(part / "metrics.jsonl") if "loss" in r]
    assert len(a) >= 4 and without_timing(a) == without_timing(b)
    wa, wb = load_file(str(whole / "model.safetensors")), load_file(str(part / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # the CLI's option reaches the draws: each update samples at 3 ** (1 - fraction before it), evaluation at 1
    seen = _recording(monkeypatch)
    again = tmp_path / "again"
    assert main(["-q", "pretrain", *run, "--out", str(again)]) == 0, capsys.readouterr().err
    fractions = [0.0] + [r["budget_fraction"] for r in a[:-1]]
    assert seen == [pytest.approx(3.0 ** (1 - f)) for f in fractions]
