"""``Encoder(read_rows=...)``: a masked-LM training step computes the last layer at the positions its head reads
alone (the masked ones, [CLS] for NSP / SOP, the span boundaries for SBO), with the same loss and gradients as the
full pass: padded and unpadded, post-LN and pre-LN, learned and rotary positions, ALBERT's shared layers."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel
from lmforge.heads.pretraining import BertPreTrainingHeads, MaskedLMHeads, SpanBertHeads, read_positions
from lmforge.models.encoder import Encoder
from lmforge.nn.kernels.packing import ReadRows
from lmforge.objectives.masked_lm import IGNORE, MaskedLMObjective


def _config(**overrides) -> ModelConfig:
    values = dict(vocab_size=97, d_model=32, n_heads=4, n_layers=3, d_ff=64, max_seq_len=16, dropout=0.0,
                  attention_dropout=0.0, init_std=0.1)
    return ModelConfig(**{**values, **overrides})


def _batch(padded: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 97, (4, 12), generator=g)
    mask = torch.ones(4, 12, dtype=torch.long)
    if padded:
        mask[1, 9:] = 0
        mask[2, 3:] = 0  # heavily padded: the batch is unpadded (packing) before the last layer
    labels = torch.full((4, 12), IGNORE)
    for b, positions in enumerate(([1, 4, 5, 10], [2, 3, 8], [1], [0, 6, 7, 11])):  # [CLS] masked in row 3
        labels[b, positions] = ids[b, positions]
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "mlm_labels": labels, "nsp_labels": torch.tensor([0, 1, 1, 0])}


def _step(model: TaskModel, objective: MaskedLMObjective, batch: dict[str, torch.Tensor]):
    model.zero_grad()
    out = objective(model, batch)
    loss = sum(total / count for total, count in out.losses.values())
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {k: v[0].detach() for k, v in out.losses.items()}, grads, out.metrics


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"positional": "rotary"},
                                       {"share_layers": "all", "embedding_size": 16}, {"pooler": False},
                                       {"norm_first": True, "positional": "rotary", "ffn": "gated"}])
def test_mlm_nsp_loss_and_gradients_equal_the_full_pass(overrides, padded):
    torch.manual_seed(0)
    config = _config(**overrides)
    encoder = Encoder(config)
    model = TaskModel(encoder, BertPreTrainingHeads(config, encoder.get_input_embeddings().weight)).train()
    batch = _batch(padded)
    short = _step(model, MaskedLMObjective(nsp=True), batch)
    full = _step(model, MaskedLMObjective(nsp=True, rows_only=False), batch)
    assert "token_cosine" not in short[2] and "token_cosine" in full[2]
    for term, value in full[0].items():
        torch.testing.assert_close(short[0][term], value, rtol=1e-5, atol=1e-6, msg=term)
    assert short[1].keys() == full[1].keys()
    for name, grad in full[1].items():
        torch.testing.assert_close(short[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("head", ["mlm", "span"])
def test_mlm_only_and_span_heads_equal_the_full_pass(head):
    torch.manual_seed(0)
    config = _config()
    encoder = Encoder(config)
    weight = encoder.get_input_embeddings().weight
    batch = _batch()
    if head == "span":
        heads = SpanBertHeads(config, weight, max_span_len=4)
        selected = batch["mlm_labels"] != IGNORE
        left, right = torch.full((4, 12), -1), torch.zeros(4, 12, dtype=torch.long)
        left[selected], right[selected] = 0, 2  # any real boundaries
        left[0, 10] = -1  # a masked token without an SBO target
        batch.update(sbo_left=left, sbo_right=right, sbo_offset=torch.zeros(4, 12, dtype=torch.long))
        objective, reference = MaskedLMObjective(sbo=True), MaskedLMObjective(sbo=True, rows_only=False)
    else:
        heads = MaskedLMHeads(config, weight)
        objective, reference = MaskedLMObjective(), MaskedLMObjective(rows_only=False)
    model = TaskModel(encoder, heads).train()
    short, full = _step(model, objective, batch), _step(model, reference, batch)
    for term, value in full[0].items():
        torch.testing.assert_close(short[0][term], value, rtol=1e-5, atol=1e-6, msg=term)
    for name, grad in full[1].items():
        torch.testing.assert_close(short[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_encoder_returns_the_rows_and_the_pooled_output():
    torch.manual_seed(0)
    encoder = Encoder(_config()).eval()
    batch = _batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows = batch["mlm_labels"] != IGNORE
    full = encoder(ids, mask)
    out = encoder(ids, mask, read_rows=rows)
    assert out.read_rows is rows and out.last_hidden_state.shape == (int(rows.sum()), 32)
    assert out.pooled_output is None  # not every row reads [CLS]
    torch.testing.assert_close(out.last_hidden_state, full.last_hidden_state[rows], rtol=1e-5, atol=1e-6)
    with_cls = rows.clone()
    with_cls[:, 0] = True
    out = encoder(ids, mask, read_rows=with_cls)
    torch.testing.assert_close(out.pooled_output, full.pooled_output, rtol=1e-5, atol=1e-6)
    pairs = torch.tensor([[3, 11], [0, 4], [2, 1]])
    torch.testing.assert_close(read_positions(out, pairs), full.last_hidden_state[pairs[:, 0], pairs[:, 1]])
    with pytest.raises(LmforgeError, match="not among the rows"):
        read_positions(out, torch.tensor([[0, 2]]))
    # hidden states or attention weights: every position is computed, the rows picked from it
    for options in ({"output_hidden_states": True}, {"output_attentions": True}):
        out = encoder(ids, mask, read_rows=with_cls, **options)
        torch.testing.assert_close(out.last_hidden_state, full.last_hidden_state[with_cls], rtol=1e-5, atol=1e-6)
    padded_row = torch.zeros_like(rows)
    padded_row[2, 5] = True
    with pytest.raises(LmforgeError, match="padded position"):
        encoder(ids, mask, read_rows=padded_row)


def test_read_rows_slots_round_trip():
    mask = torch.tensor([[True, False, True], [False, False, False], [False, True, False]])
    rows = ReadRows.build(mask)
    assert rows.width == 2 and rows.rows == 3
    assert rows.positions.tolist() == [0, 2, 1] and rows.slots.tolist() == [0, 1, 4]
    x = torch.arange(3.0)[:, None]
    assert torch.equal(rows.from_slots(rows.to_slots(x)), x)


def test_eval_mode_keeps_every_position():
    torch.manual_seed(0)
    config = _config()
    encoder = Encoder(config)
    model = TaskModel(encoder, BertPreTrainingHeads(config, encoder.get_input_embeddings().weight)).eval()
    with torch.no_grad():
        out = MaskedLMObjective(nsp=True)(model, _batch())
    assert "token_cosine" in out.metrics


def test_electra_generator_computes_the_masked_positions_alone():
    from lmforge.heads.electra import build_electra_head

    torch.manual_seed(0)
    config = _config()
    encoder = Encoder(config)
    head = build_electra_head(config, encoder).train()
    batch = _batch()
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["mlm_labels"]
    out = head(encoder, ids, mask, mlm_labels=labels)
    full = head.generator(ids, attention_mask=mask).last_hidden_state  # (B, T, D_g)
    torch.testing.assert_close(out.mlm_logits, head.mlm(full[labels != IGNORE]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
def test_a_training_step_with_dropout_runs_on_the_rows(kernel):
    torch.manual_seed(0)
    config = _config(dropout=0.1, attention_dropout=0.1, kernel=kernel)
    encoder = Encoder(config)
    model = TaskModel(encoder, BertPreTrainingHeads(config, encoder.get_input_embeddings().weight)).train()
    losses, grads, metrics = _step(model, MaskedLMObjective(nsp=True), _batch())
    assert "token_cosine" not in metrics and all(torch.isfinite(v) for v in losses.values())
    assert all(torch.isfinite(g).all() for g in grads.values())
