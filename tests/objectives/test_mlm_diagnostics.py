"""Whether a masked LM has left its plateau: the best constant guess beside its accuracy, the anisotropy of its
token states, and the warning a finished run gives while it is still there (issue 36, item 4)."""

import itertools

import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.heads import TaskModel, build_head
from lmforge.models import ARCHITECTURES
from lmforge.objectives.masked_lm import MaskedLMObjective, constant_guess_hits, token_cosine
from lmforge.recipes.pretrain import PLATEAU_MARGIN, plateau_warning


def test_the_best_constant_guess_counts_the_most_frequent_target():
    assert int(constant_guess_hits(torch.tensor([3, 3, 5, 7, 3, 5]))) == 3
    assert int(constant_guess_hits(torch.tensor([], dtype=torch.long))) == 0


def test_token_cosine_is_the_mean_over_pairs_of_distinct_real_tokens():
    torch.manual_seed(0)
    states = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    total, count = token_cosine(states, mask)
    real = states[mask.bool()]
    pairs = [float(F.cosine_similarity(real[i], real[j], dim=0))
             for i, j in itertools.permutations(range(len(real)), 2)]
    assert count == len(pairs) == 7 * 6
    assert abs(float(total) / count - sum(pairs) / len(pairs)) < 1e-5
    same = torch.ones(1, 4, 3) * torch.tensor([1.0, 2.0, 3.0])  # one vector everywhere: a collapsed encoder
    assert abs(float(token_cosine(same, None)[0]) / token_cosine(same, None)[1] - 1.0) < 1e-6
    orthogonal = torch.eye(4).reshape(1, 4, 4)
    assert float(token_cosine(orthogonal, None)[0]) == 0.0
    assert token_cosine(states[:1, :1], None)[1] == 0  # one token has no pair


def test_the_mlm_objective_reports_both_beside_its_accuracy():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=24, max_seq_len=16)
    backbone = ARCHITECTURES["encoder"](config)
    model = TaskModel(backbone, build_head({"type": "mlm"}, config, backbone)).eval()
    ids = torch.randint(5, 40, (2, 8))
    labels = torch.full_like(ids, -100)
    labels[:, 2] = 7
    labels[0, 5] = 9
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mlm_labels": labels}
    metrics = MaskedLMObjective()(model, batch).metrics
    assert [int(x) for x in metrics["mlm_constant_accuracy"]] == [2, 3]  # token 7 twice of the 3 targets
    total, count = metrics["token_cosine"]
    assert count == 16 * 15 and -1.0 <= float(total) / count <= 1.0


def test_a_run_still_on_the_plateau_gets_a_warning():
    stuck = {"eval_mlm_accuracy": 0.048, "eval_mlm_constant_accuracy": 0.048, "eval_token_cosine": 0.93}
    warning = plateau_warning(stuck)
    assert warning is not None and "has not left the plateau" in warning and "0.93" in warning
    assert plateau_warning({**stuck, "eval_mlm_accuracy": 0.048 + PLATEAU_MARGIN + 0.001}) is None
    assert plateau_warning({"eval_loss": 3.0}) is None  # not a masked LM, or no evaluation


def test_electra_and_xlnet_report_their_plateau_too():
    from lmforge.objectives.electra import ElectraObjective
    from tests.objectives.test_electra import masked_batch, tiny

    warning = plateau_warning({"eval_plm_accuracy": 0.05, "eval_plm_constant_accuracy": 0.06})
    assert warning is not None and "PLM has not left the plateau" in warning
    metrics = ElectraObjective()(tiny().eval(), masked_batch()).metrics  # the generator's MLM beside its plateau
    hits, n = metrics["mlm_constant_accuracy"]
    assert 0 < int(hits) <= int(n) == int(metrics["mlm_accuracy"][1])
