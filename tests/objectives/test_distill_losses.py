"""The distillation losses by formula: DistilBERT's soft targets and cosine, MiniLM's attention and value relations."""

import math

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.models.encoder import Encoder
from lmforge.objectives.distill import (
    DistillationObjective,
    DistillationStudent,
    attention_kl,
    hidden_cosine_loss,
    layer_projections,
    layer_values,
    self_attention_relation,
    soft_target_loss,
    value_relation,
)
from lmforge.recipes.distill import student_from_teacher


def test_soft_targets_are_t_squared_kl_of_softened_distributions():
    torch.manual_seed(0)
    s, t = torch.randn(5, 11), torch.randn(5, 11)
    for T in (1.0, 2.0, 4.0):
        p_t = (t / T).softmax(-1)
        expected = T * T * sum(float((p_t[i] * (p_t[i].log() - (s[i] / T).log_softmax(-1))).sum()) for i in range(5))
        assert float(soft_target_loss(s, t, T)) == pytest.approx(expected, rel=1e-5)
        # torch's KLDivLoss with a sum reduction is the same quantity
        ref = F.kl_div((s / T).log_softmax(-1), p_t, reduction="sum") * T * T
        assert float(soft_target_loss(s, t, T)) == pytest.approx(float(ref), rel=1e-5)
    assert float(soft_target_loss(t, t, 2.0)) == pytest.approx(0.0, abs=1e-6)


def test_soft_target_gradient_scale_does_not_shrink_with_temperature():
    # The T^2 factor: for large T the gradient tends to (s - t) / V per logit, whatever T (Hinton et al. 2015).
    torch.manual_seed(1)
    t = torch.randn(1, 7) * 0.1
    grads = []
    for T in (5.0, 20.0):
        s = (torch.randn(1, 7) * 0.1).requires_grad_()
        soft_target_loss(s, t, T).backward()
        expected = (((s - s.mean()) - (t - t.mean())) / 7).detach()  # T cancels: T^2 times a 1/T^2 gradient
        grads.append(float((s.grad - expected).abs().max() / expected.abs().max()))
    assert max(grads) < 0.1


def test_cosine_loss_reads_real_tokens_only():
    torch.manual_seed(2)
    s, t = torch.randn(2, 4, 8), torch.randn(2, 4, 8)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    value, count = hidden_cosine_loss(s, t, mask)
    expected = sum(1 - float(F.cosine_similarity(s[b, i], t[b, i], dim=0)) for b in range(2) for i in range(4)
                   if mask[b, i])
    assert count == 5 and float(value) == pytest.approx(expected, rel=1e-5)
    s2 = s.clone()
    s2[~mask] = 100.0  # padding changes nothing
    assert float(hidden_cosine_loss(s2, t, mask)[0]) == pytest.approx(float(value), rel=1e-6)
    assert float(hidden_cosine_loss(3.0 * t, t, mask)[0]) == pytest.approx(0.0, abs=1e-5)  # scale-free


def test_attention_kl_over_heads_and_real_queries():
    torch.manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    scores_t, scores_s = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    key_mask = ~mask[:, None, None, :]
    t = scores_t.masked_fill(key_mask, -math.inf).softmax(-1)
    s = scores_s.masked_fill(key_mask, -math.inf).softmax(-1)
    value, count = attention_kl(t, s, mask)
    expected = 0.0
    for b in range(2):
        for h in range(3):
            for q in range(4):
                if mask[b, q]:
                    keys = mask[b]
                    expected += float((t[b, h, q, keys] * (t[b, h, q, keys] / s[b, h, q, keys]).log()).sum())
    assert count == 3 * 7 and float(value) == pytest.approx(expected, rel=1e-5)
    assert math.isfinite(float(value))
    assert float(attention_kl(t, t, mask)[0]) == pytest.approx(0.0, abs=1e-6)


def test_value_relation_is_a_scaled_softmax_of_value_products():
    torch.manual_seed(4)
    v = torch.randn(1, 2, 3, 4)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    vr = value_relation(v, mask)
    assert torch.all(vr[..., 2] == 0)
    torch.testing.assert_close(vr.sum(-1), torch.ones(1, 2, 3))
    manual = (v[0, 1, 0] @ v[0, 1, :2].T / 2.0).softmax(-1)  # sqrt(d_head = 4) = 2
    torch.testing.assert_close(vr[0, 1, 0, :2], manual)


def tiny_config(**overrides) -> ModelConfig:
    values = dict(arch="encoder", vocab_size=40, d_model=16, n_heads=2, n_layers=4, d_ff=32, max_seq_len=12,
                  dropout=0.0, attention_dropout=0.0)
    return ModelConfig(**{**values, **overrides})


def test_layer_values_are_the_attention_values():
    enc = Encoder(tiny_config()).eval()
    x = torch.randn(2, 5, 16)
    v = layer_values(enc.layers[1], x)
    manual = enc.layers[1].self_attn.v_proj(x).view(2, 5, 2, 8).transpose(1, 2)
    torch.testing.assert_close(v, manual)


def test_student_from_teacher_equals_the_chosen_layers():
    torch.manual_seed(5)
    teacher = Encoder(tiny_config()).eval()
    student, config, _ = student_from_teacher(teacher, teacher.config, [0, 2])
    assert config.n_layers == 2 and config.type_vocab_size == 0 and not config.pooler
    student.eval()
    ids = torch.randint(0, 40, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    t = teacher(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    s = student(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    torch.testing.assert_close(s[0], t[0], rtol=0, atol=1e-6)  # embeddings (segment A folded into the positions)
    for j, i in enumerate([0, 2]):
        for (name, p_s), (_, p_t) in zip(student.layers[j].named_parameters(), teacher.layers[i].named_parameters(),
                                         strict=True):
            assert torch.equal(p_s, p_t), name
        out = student.layers[j](t[i], attention_mask=mask.bool()).hidden  # the teacher's layer i, on its own input
        real = mask.bool()  # (the teacher ran unpadded: its padded positions are zeros, not a layer's output)
        torch.testing.assert_close(out[real], t[i + 1][real], rtol=0, atol=1e-6)
    with pytest.raises(LmforgeError, match="student_layers=\\[0, 9\\]"):
        student_from_teacher(teacher, teacher.config, [0, 9])


def batch(masked: bool = True):
    torch.manual_seed(6)
    ids = torch.randint(5, 40, (3, 8))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, 6:] = 0
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 3], labels[2, 5] = 7, 8, 9
    if masked:
        ids = ids.clone()
        ids[labels != -100] = 4  # the [MASK] id of this toy vocabulary
    return {"input_ids": ids, "attention_mask": mask, "mlm_labels": labels,
            "token_type_ids": torch.zeros_like(ids)}


def test_objective_weights_terms_and_counts():
    torch.manual_seed(7)
    t_enc = Encoder(tiny_config())
    teacher = TaskModel(t_enc, build_head({"type": "mlm"}, t_enc.config, t_enc))
    s_enc, cfg, head_state = student_from_teacher(t_enc, t_enc.config, [1, 3], teacher.head)
    head = build_head({"type": "mlm"}, cfg, s_enc)
    head.load_state_dict(head_state)
    student = DistillationStudent(s_enc, head)
    objective = DistillationObjective(teacher, n_heads=2, alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0,
                                      alpha_att=0.5, alpha_val=0.25)
    b = batch()
    out = objective(student, b)
    assert objective.counts(b) == {"ce": 3, "mlm": 3, "cos": 22, "att": 44, "val": 44}
    for term, weight in objective.weights.items():
        loss, count = out.losses[term]
        raw, raw_count = out.metrics[f"distill_{term}"]
        assert count == raw_count == objective.counts(b)[term]
        assert float(loss.detach()) == pytest.approx(weight * float(raw), rel=1e-6)
    sum(loss for loss, _ in out.losses.values()).backward()
    assert s_enc.layers[0].self_attn.v_proj.weight.grad is not None  # the value relation reaches the student
    assert all(p.grad is None for p in teacher.parameters())  # the teacher is frozen
    # a student equal to the teacher has zero soft-target, attention and value-relation loss
    same = DistillationObjective(teacher, n_heads=2, alpha_ce=1.0, alpha_mlm=0.0, alpha_cos=1.0, alpha_att=1.0,
                                 alpha_val=1.0)
    clone = DistillationStudent(t_enc, teacher.head)
    zero = same(clone, b)
    for term in ("ce", "cos", "att", "val"):
        assert float(zero.metrics[f"distill_{term}"][0]) == pytest.approx(0.0, abs=1e-4), term


def test_objective_without_teacher_mlm_reads_unmasked_text_and_refuses_soft_targets():
    t_enc = Encoder(tiny_config())
    with pytest.raises(LmforgeError, match="needs a teacher with an MLM head"):
        DistillationObjective(t_enc, n_heads=2, alpha_ce=5.0)
    objective = DistillationObjective(t_enc, n_heads=2, alpha_ce=0.0, alpha_mlm=0.0, alpha_att=1.0, alpha_val=1.0,
                                      masked_inputs=False)
    student, _, _ = student_from_teacher(t_enc, t_enc.config, [0, 2])
    masked, plain = batch(True), batch(False)
    a, b = objective(student, masked), objective(student, plain)
    for term in ("cos", "att", "val"):  # the masked ids are put back: both batches are the same text
        assert float(a.losses[term][0]) == pytest.approx(float(b.losses[term][0]), rel=1e-6)
    with pytest.raises(LmforgeError, match="every distillation weight is 0"):
        DistillationObjective(t_enc, n_heads=2, alpha_ce=0, alpha_mlm=0, alpha_cos=0)
    wide = Encoder(tiny_config(n_heads=4))
    with pytest.raises(LmforgeError, match="teacher has 2 heads and the student 4"):
        objective(wide, plain)


def _naive_relation(x: torch.Tensor, heads: int, n_real: int) -> torch.Tensor:
    """One row's relation by loops: (heads, n_real, n_real), softmax over the real keys."""
    width = x.shape[-1] // heads
    out = torch.zeros(heads, n_real, n_real)
    for a in range(heads):
        part = x[:n_real, a * width:(a + 1) * width]
        for i in range(n_real):
            scores = torch.tensor([float(part[i] @ part[j]) / math.sqrt(width) for j in range(n_real)])
            out[a, i] = scores.softmax(-1)
    return out


def test_minilm_v2_relations_by_formula_against_a_naive_computation():
    # MiniLMv2 (Wang et al. 2021): Q-Q, K-K and V-V relations over relation heads that need not be the model's
    torch.manual_seed(11)
    x = torch.randn(2, 5, 12)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    rel = self_attention_relation(x, 3, mask)  # 3 relation heads of width 4
    assert rel.shape == (2, 3, 5, 5) and torch.all(rel[1, :, :, 3:] == 0)
    for row, n_real in ((0, 5), (1, 3)):
        torch.testing.assert_close(rel[row, :, :n_real, :n_real], _naive_relation(x[row], 3, n_real))
    enc = Encoder(tiny_config()).eval()
    h = torch.randn(2, 5, 16)
    q, k, v = layer_projections(enc.layers[2], h)
    attn = enc.layers[2].self_attn
    for got, proj in ((q, attn.q_proj), (k, attn.k_proj), (v, attn.v_proj)):
        torch.testing.assert_close(got, proj(h))


def test_minilm_v2_objective_with_other_heads_and_widths():
    torch.manual_seed(12)
    teacher = Encoder(tiny_config(n_heads=4, d_model=16))  # 4 heads of 4
    student = Encoder(tiny_config(n_heads=2, d_model=8, n_layers=2, d_ff=16))  # 2 heads of 4, half as wide
    objective = DistillationObjective(teacher, n_heads=2, alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0, alpha_rel=1.0,
                                      relation_heads=4, teacher_layer=2, masked_inputs=False)
    b = batch(False)
    out = objective(student, b)
    loss, count = out.losses["rel"]
    assert count == objective.counts(b)["rel"] == 22 * 4
    # by formula: the three KLs of the teacher's layer 2 against the student's last layer, summed
    mask = b["attention_mask"].bool()
    ids = torch.where(b["mlm_labels"] != -100, b["mlm_labels"], b["input_ids"])  # the original text
    with torch.no_grad():
        t_out = teacher(ids, attention_mask=b["attention_mask"], output_hidden_states=True)
        s_out = student(ids, attention_mask=b["attention_mask"], output_hidden_states=True)
        t_qkv = layer_projections(teacher.layers[2], t_out.hidden_states[2])
        s_qkv = layer_projections(student.layers[-1], s_out.hidden_states[-2])
    expected = 0.0
    for t_x, s_x in zip(t_qkv, s_qkv, strict=True):
        t_r, s_r = self_attention_relation(t_x, 4, mask), self_attention_relation(s_x, 4, mask)
        for row in range(mask.shape[0]):
            n = int(mask[row].sum())
            p, q = t_r[row, :, :n, :n], s_r[row, :, :n, :n]
            expected += float((p * (p.log() - q.log())).sum())
    assert float(loss.detach()) == pytest.approx(expected, rel=2e-3)  # float32 sums of small KLs
    loss.backward()
    assert student.layers[-1].self_attn.k_proj.weight.grad is not None
    assert all(p.grad is None for p in teacher.parameters())
    # a student that is the teacher has zero relation loss at the same layer
    same = DistillationObjective(teacher, n_heads=4, alpha_cos=0.0, alpha_ce=0.0, alpha_mlm=0.0, alpha_rel=1.0,
                                 masked_inputs=False)
    assert float(same(teacher, b).metrics["distill_rel"][0]) == pytest.approx(0.0, abs=1e-4)
    with pytest.raises(LmforgeError, match="must divide the teacher's d_model 16"):
        DistillationObjective(teacher, n_heads=2, alpha_rel=1.0, alpha_ce=0.0, relation_heads=5)
    with pytest.raises(LmforgeError, match="the teacher has 4 layers"):
        DistillationObjective(teacher, n_heads=2, alpha_rel=1.0, alpha_ce=0.0, teacher_layer=4)
    odd = DistillationObjective(teacher, n_heads=2, alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0, alpha_rel=1.0,
                                relation_heads=16, masked_inputs=False)
    with pytest.raises(LmforgeError, match="divide the student's d_model 8"):
        odd(student, b)
