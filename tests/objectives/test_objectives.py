import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.heads import TaskModel, build_head
from lmforge.models.decoder import Decoder
from lmforge.models.encoder import Encoder
from lmforge.objectives import CausalLMObjective, MaskedLMObjective

CFG = dict(vocab_size=99, d_model=12, n_heads=3, n_layers=2, d_ff=37, max_seq_len=16, dropout=0.0,
           attention_dropout=0.0)


def bert(head: dict) -> TaskModel:
    torch.manual_seed(0)
    config = ModelConfig(**CFG)
    backbone = Encoder(config)
    return TaskModel(backbone, build_head(head, config, backbone)).eval()


def batch(with_spans: bool = False) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[2, 5:] = 0
    labels = torch.full((3, 7), -100)
    labels[0, 2], labels[1, 3], labels[1, 4], labels[2, 1] = 10, 20, 30, 40
    out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
           "mlm_labels": labels, "nsp_labels": torch.tensor([0, 1, 0])}
    if with_spans:  # spans: (0: 2..2), (1: 3..4), (2: 1..1)
        left, right, offset = torch.zeros_like(ids), torch.zeros_like(ids), torch.zeros_like(ids)
        for (b, p), (s, e) in {(0, 2): (2, 2), (1, 3): (3, 4), (1, 4): (3, 4), (2, 1): (1, 1)}.items():
            left[b, p], right[b, p], offset[b, p] = s - 1, e + 1, p - s
        out.update(sbo_left=left, sbo_right=right, sbo_offset=offset)
    return out


def test_mlm_nsp_loss_equals_full_logits_reference():
    model, b = bert({"type": "pretraining"}), batch()
    objective = MaskedLMObjective(nsp=True)
    out = objective(model, b)
    assert objective.counts(b) == {"mlm": 4, "nsp": 3}
    with torch.no_grad():
        full = model(b["input_ids"], attention_mask=b["attention_mask"], token_type_ids=b["token_type_ids"])
    ref_mlm = F.cross_entropy(full.mlm_logits.reshape(-1, 99), b["mlm_labels"].reshape(-1), reduction="sum")
    ref_nsp = F.cross_entropy(full.nsp_logits, b["nsp_labels"], reduction="sum")
    torch.testing.assert_close(out.losses["mlm"][0].detach(), ref_mlm)
    torch.testing.assert_close(out.losses["nsp"][0].detach(), ref_nsp)
    assert out.losses["mlm"][1] == 4 and out.losses["nsp"][1] == 3
    assert 0 <= int(out.metrics["mlm_accuracy"][0]) <= 4
    out.losses["mlm"][0].backward()
    assert model.backbone.get_input_embeddings().weight.grad is not None


def test_roberta_style_mlm_only():
    model, b = bert({"type": "mlm"}), batch()
    out = MaskedLMObjective()(model, b)
    assert set(out.losses) == {"mlm"} and out.losses["mlm"][0].item() > 0


def test_span_boundary_objective_matches_its_formula():
    model, b = bert({"type": "span", "max_span_len": 4}), batch(with_spans=True)
    objective = MaskedLMObjective(sbo=True)
    out = objective(model, b)
    assert objective.counts(b) == {"mlm": 4, "sbo": 4}
    sbo = model.head.sbo
    with torch.no_grad():
        h = model.backbone(b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
        ref = 0.0
        for (bi, p) in [(0, 2), (1, 3), (1, 4), (2, 1)]:
            x = torch.cat([h[bi, b["sbo_left"][bi, p]], h[bi, b["sbo_right"][bi, p]],
                           sbo.position.weight[b["sbo_offset"][bi, p]]])
            y = sbo.norm2(F.gelu(sbo.fc2(sbo.norm1(F.gelu(sbo.fc1(x))))))
            logits = y @ model.backbone.get_input_embeddings().weight.T + sbo.bias
            ref += F.cross_entropy(logits[None], b["mlm_labels"][bi, p][None], reduction="sum")
    torch.testing.assert_close(out.losses["sbo"][0].detach(), ref)
    out.losses["sbo"][0].backward()
    assert sbo.fc1.weight.grad is not None and sbo.position.weight.grad.abs().sum() > 0
    assert "sbo.weight" not in model.head.state_dict() and "sbo.fc1.weight" in model.head.state_dict()


def test_causal_lm_loss():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(arch="decoder", norm_first=True, **CFG)).eval()
    ids = torch.randint(0, 99, (2, 8))
    b = {"input_ids": ids[:, :-1], "labels": ids[:, 1:].clone(), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    b["labels"][1, -2:] = -100
    objective = CausalLMObjective()
    out = objective(model, b)
    with torch.no_grad():
        logits = model(b["input_ids"]).logits
    ref = F.cross_entropy(logits.reshape(-1, 99), b["labels"].reshape(-1), reduction="sum")
    torch.testing.assert_close(out.losses["lm"][0].detach(), ref)
    assert objective.counts(b) == {"lm": 12} == {"lm": out.losses["lm"][1]}


def test_span_head_rejects_offsets_past_its_table():
    model, b = bert({"type": "span", "max_span_len": 1}), batch(with_spans=True)
    with pytest.raises(ValueError, match="exceeds max_span_len=1"):
        MaskedLMObjective(sbo=True)(model, b)
