"""ELMo's biLM and the frozen-ELMo task encoder: causality of each direction (exact), padding, LSTMP shapes and
residuals, the one shared softmax, the loss, learning a toy corpus, save/load, freezing."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import architecture
from lmforge.models.elmo import BiLM, ELMoEncoder
from lmforge.persistence import load_pretrained, save_pretrained

V = 99
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(V - 5)]


def tiny(token_encoder: str = "chars", **overrides) -> ModelConfig:
    values = dict(arch="bilm", vocab_size=V, d_model=12, d_cell=20, n_layers=2, dropout=0.0, rnn_cell="lstm",
                  max_seq_len=64, token_encoder=token_encoder, d_char=4, char_filters=[[1, 4], [2, 6], [3, 5]],
                  n_highway=1, max_chars_per_token=8)
    return ModelConfig(**{**values, **overrides})


def bilm(token_encoder: str = "chars", seed: int = 0, **overrides) -> BiLM:
    torch.manual_seed(seed)
    model = BiLM(tiny(token_encoder, **overrides))
    model.set_vocabulary(TOKENS)
    return model.eval()


def halves(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return h[..., :12], h[..., 12:]  # [forward; backward]


@pytest.mark.parametrize("token_encoder", ["chars", "embedding"])
def test_each_direction_sees_only_its_side(token_encoder):
    model = bilm(token_encoder)
    ids = torch.randint(5, V, (3, 9))
    i = 4
    changed = ids.clone()
    changed[:, i] = (ids[:, i] - 5 + 7) % (V - 5) + 5
    with torch.no_grad():
        a = model(ids, output_hidden_states=True).hidden_states
        b = model(changed, output_hidden_states=True).hidden_states
    for j in range(1, 3):
        (fa, ba), (fb, bb) = halves(a[j]), halves(b[j])
        assert torch.equal(fa[:, :i], fb[:, :i])  # forward state at t reads tokens <= t
        assert torch.equal(ba[:, i + 1:], bb[:, i + 1:])  # backward state at t reads tokens >= t
        assert not torch.allclose(fa[:, i:], fb[:, i:]) and not torch.allclose(ba[:, :i + 1], bb[:, :i + 1])


def test_layer_zero_is_the_token_layer_twice_and_layers_are_2d_wide():
    model = bilm()
    ids = torch.randint(5, V, (3, 7))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        x = model.token_representation(ids)
    assert len(out.hidden_states) == 3 and all(h.shape == (3, 7, 24) for h in out.hidden_states)
    torch.testing.assert_close(out.hidden_states[0], torch.cat([x, x], -1))
    assert torch.equal(out.last_hidden_state, out.hidden_states[-1]) and out.pooled_output is None


def test_lstmp_shapes_and_residual_from_layer_two():
    model = bilm()
    first = model.layers[0]["forward_lstm"]
    assert first.hidden_size == 20 and first.proj_size == 12
    assert tuple(first.weight_hh_l0.shape) == (4 * 20, 12) and tuple(first.weight_hr_l0.shape) == (12, 20)
    ids = torch.randint(5, V, (2, 6))
    with torch.no_grad():
        h = model(ids, output_hidden_states=True).hidden_states
        f1, f2 = h[1][..., :12], h[2][..., :12]
        x = model.token_representation(ids)
        torch.testing.assert_close(f1, model.layers[0]["forward_lstm"](x)[0])  # no residual on layer 1
        torch.testing.assert_close(f2, model.layers[1]["forward_lstm"](f1)[0] + f1)  # residual on layer 2


def test_padding_gives_the_rows_run_alone():
    model = bilm()
    rows = [torch.randint(5, V, (n,)) for n in (7, 4, 1)]
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = row
        mask[r, :len(row)] = 1
    with torch.no_grad():
        batch = model(ids, mask, output_hidden_states=True).hidden_states
        for r, row in enumerate(rows):
            alone = model(row.unsqueeze(0), output_hidden_states=True).hidden_states
            for j in range(3):
                torch.testing.assert_close(batch[j][r, :len(row)], alone[j][0], rtol=1e-5, atol=1e-6)
                assert torch.all(batch[j][r, len(row):] == 0)


def test_one_softmax_and_one_token_layer_serve_both_directions():
    model = bilm().train()
    names = [n for n, _ in model.named_parameters()]
    assert [n for n in names if n.startswith("softmax.")] == ["softmax.weight", "softmax.bias"]
    assert not any("backward" in n for n in names if n.startswith(("softmax", "embeddings")))
    ids = torch.randint(5, V, (2, 6))
    for direction in ("forward_nll", "backward_nll"):
        model.zero_grad()
        getattr(model(ids, lm_loss=True), direction).backward()
        assert model.softmax.weight.grad.abs().sum() > 0
        assert model.embeddings.projection.weight.grad.abs().sum() > 0
        other = "backward_lstm" if direction == "forward_nll" else "forward_lstm"
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.layers[0][other].parameters())


def test_loss_is_the_sum_of_next_and_previous_token_nll():
    model = bilm()
    ids = torch.randint(5, V, (2, 6))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, lm_loss=True)
        f, b = halves(out.last_hidden_state)
        logp_f = model.softmax(f).log_softmax(-1)
        logp_b = model.softmax(b).log_softmax(-1)
    expected_f = -logp_f[:, :-1].gather(-1, ids[:, 1:, None]).sum()
    expected_b = -logp_b[:, 1:].gather(-1, ids[:, :-1, None]).sum()
    torch.testing.assert_close(out.forward_nll, expected_f)
    torch.testing.assert_close(out.backward_nll, expected_b)
    assert int(out.n_predictions) == 2 * 5


def test_sampled_softmax_trains_and_evaluation_uses_the_full_one():
    model = bilm(softmax_samples=8).train()
    ids = torch.randint(5, V, (2, 6))
    torch.manual_seed(1)
    sampled = model(ids, lm_loss=True)
    assert torch.isfinite(sampled.forward_nll) and sampled.forward_nll < model.eval()(ids, lm_loss=True).forward_nll
    sampled.forward_nll.backward()
    full = bilm(softmax_samples=0)(ids, lm_loss=True)
    torch.testing.assert_close(model.eval()(ids, lm_loss=True).forward_nll, full.forward_nll)


def test_a_tiny_bilm_learns_a_toy_corpus():
    from lmforge.objectives.bilm import BiLMObjective

    torch.manual_seed(0)
    model = BiLM(tiny("chars", d_model=16, d_cell=32)).train()
    model.set_vocabulary(TOKENS)
    objective = BiLMObjective()
    pattern = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])
    blocks = torch.stack([pattern.roll(-s) for s in range(8)])  # (8, 12) shifted copies of one cycle
    batch = {"input_ids": blocks[:, :-1], "labels": blocks[:, 1:], "attention_mask": torch.ones(8, 11)}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        out = objective(model, batch)
        loss_sum, n = out.losses["lm"]
        (loss_sum / n).backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss_sum.detach()) / int(n))
    assert losses[0] > 4.0 and losses[-1] < 0.5 * losses[0]
    assert objective.counts(batch) == {"lm": 8 * 11} and int(n) == 8 * 11


def test_save_and_load_round_trip(tmp_path):
    model = bilm()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    assert loaded.config.arch == "bilm" and isinstance(loaded.model, BiLM)
    assert torch.equal(loaded.model.token_chars, model.token_chars)
    ids = torch.randint(5, V, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).last_hidden_state, model(ids).last_hidden_state)


def test_elmo_encoder_freezes_the_bilm_and_trains_the_mix(tmp_path):
    encoder = ELMoEncoder.wrap(bilm(), elmo_layer_norm=True, elmo_token_dim=0).train()
    assert encoder.config.arch == "elmo" and encoder.config.elmo_layer_norm
    assert not encoder.bilm.training and not any(p.requires_grad for p in encoder.bilm.parameters())
    ids = torch.randint(5, V, (3, 7))
    mask = torch.ones(3, 7)
    mask[1, 4:] = 0
    out = encoder(ids, mask, output_hidden_states=True)
    assert out.last_hidden_state.shape == (3, 7, 12) and out.pooled_output.shape == (3, 12)
    assert out.hidden_states[0].shape == (3, 7, 24)  # ELMo_k
    out.pooled_output.sum().backward()
    assert all(p.grad is None for p in encoder.bilm.parameters())
    assert encoder.mix.weights.grad is not None and encoder.mix.gamma.grad is not None
    # rebuilt from its own config (a fine-tuned folder), the biLM comes back with its weights
    save_pretrained(encoder, tmp_path / "e")
    loaded = load_pretrained(tmp_path / "e").model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask).pooled_output, encoder.eval()(ids, mask).pooled_output)


def test_the_task_token_vector_beside_elmo_trains_and_the_bilm_does_not():
    encoder = ELMoEncoder.wrap(bilm(), elmo_token_dim=5).train()
    ids = torch.randint(5, V, (2, 6))
    out = encoder(ids, output_hidden_states=True)
    assert out.hidden_states[0].shape == (2, 6, 5 + 24)  # [x_k; ELMo_k]
    with torch.no_grad():  # the first E columns are the token table's rows, the rest ELMo_k as without it
        torch.testing.assert_close(out.hidden_states[0][..., :5], encoder.token_embeddings(ids))
    out.pooled_output.sum().backward()
    assert encoder.token_embeddings.weight.grad is not None
    assert all(p.grad is None for p in encoder.bilm.parameters())
    # a new encoder's default: the paper's [x_k; ELMo_k], x_k as wide as the biLM's token layer (d_model = 12)
    assert ELMoEncoder.wrap(bilm()).token_embeddings.weight.shape == (V, 12)
    assert ELMoEncoder.wrap(bilm(), elmo_token_dim=0).token_embeddings is None  # ELMo_k alone
    with pytest.raises(LmforgeError, match="elmo_token_dim=-1"):
        ELMoEncoder.wrap(bilm(), elmo_token_dim=-1)


def test_registry_and_config_checks():
    assert architecture("bilm").finetune_as == "elmo" and architecture("bilm").reads_characters
    assert architecture("elmo").has_pooled_output and architecture("elmo").encodes_text
    with pytest.raises(LmforgeError, match="token_encoder='bytes'"):
        tiny(token_encoder="bytes")
    with pytest.raises(LmforgeError, match="max_chars_per_token=2"):
        tiny(max_chars_per_token=2)
    with pytest.raises(LmforgeError, match="d_cell=8 is narrower"):
        BiLM(tiny(d_cell=8))


def test_presets_and_the_objective_entry():
    from lmforge.config import model_config_from_preset
    from lmforge.objectives.registry import get_objective

    original = model_config_from_preset("elmo-original", vocab_size=V)
    assert (original.n_layers, original.d_cell, original.d_model, original.n_highway) == (2, 4096, 512, 2)
    assert sum(n for _, n in original.char_filters) == 2048 and original.max_chars_per_token == 50
    assert (original.input_unit, original.cell_clip, original.proj_clip) == ("word", 3.0, 3.0)  # bilm-tf's
    small = model_config_from_preset("elmo-small", vocab_size=V)
    assert (small.input_unit, small.cell_clip, small.proj_clip) == ("word", 3.0, 3.0)
    objective = get_objective("bilm")
    assert objective.arch == "bilm" and objective.plan == "stream" and objective.head is None
    assert objective.build_loss(None, {"carry_states": False}).carry_states is False


# ------------------------------------------------------------------------------------------ the log-uniform sampler
def test_log_uniform_ranks_follow_the_zipfian_formula():
    # bilm-tf's proposal: rank r with probability log((r + 2) / (r + 1)) / log(V + 1)
    import math

    from lmforge.models.elmo import log_uniform_log_q, log_uniform_ranks

    n, vocab = 400_000, 1000
    ranks = log_uniform_ranks(n, vocab, generator=torch.Generator().manual_seed(0))
    assert int(ranks.min()) >= 0 and int(ranks.max()) <= vocab - 1
    q = log_uniform_log_q(torch.arange(vocab), vocab).double().exp()
    assert float(q.sum()) == pytest.approx(1.0, abs=1e-6)
    assert float(q[0]) == pytest.approx(math.log(2) / math.log(vocab + 1), rel=1e-6)
    counts = torch.bincount(ranks, minlength=vocab).double()
    for lo, hi in ((0, 1), (1, 2), (2, 5), (5, 50), (50, 1000)):
        p = float(q[lo:hi].sum())
        observed = float(counts[lo:hi].sum()) / n
        assert abs(observed - p) < 4 * math.sqrt(p * (1 - p) / n), (lo, hi, observed, p)


def test_sampled_softmax_nll_by_formula_with_the_log_q_correction():
    from lmforge.models.elmo import sampled_softmax_nll

    torch.manual_seed(3)
    h, W, b = torch.randn(3, 4), torch.randn(10, 4), torch.randn(10)
    targets, negatives = torch.tensor([1, 4, 7]), torch.tensor([0, 4, 9, 2])
    log_t, log_s = torch.tensor([-0.5, -1.0, -2.0]), torch.tensor([-0.1, -1.0, -3.0, -0.7])
    got = sampled_softmax_nll(h, W, b, targets, negatives, log_t, log_s)
    expected = 0.0
    for n in range(3):
        true = float(h[n] @ W[targets[n]] + b[targets[n]]) - float(log_t[n])
        others = [float(h[n] @ W[c] + b[c]) - float(log_s[j]) for j, c in enumerate(negatives) if c != targets[n]]
        logits = torch.tensor([true, *others], dtype=torch.float64)
        expected -= float(torch.log_softmax(logits, 0)[0])
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_token_counts_rank_the_vocabulary_and_the_sampler_reads_them():
    model = bilm(softmax_samples=8, token_encoder="embedding")
    counts = torch.zeros(V)
    counts[[50, 7, 30]] = torch.tensor([100.0, 50.0, 50.0])  # 50 first, then 7 and 30 (a tie: by id)
    model.set_token_counts(counts)
    assert model.frequency_order[:3].tolist() == [50, 7, 30]
    assert int(model.frequency_rank[50]) == 0 and int(model.frequency_rank[30]) == 2
    assert model.frequency_order[model.frequency_rank].tolist() == list(range(V))
    model.train()
    out = model(torch.randint(5, V, (2, 6)), lm_loss=True)
    assert torch.isfinite(out.forward_nll)
    assert "frequency_order" not in model.state_dict()  # rebuilt from the corpus, never saved
    with pytest.raises(LmforgeError, match="softmax_sampler='zipf'"):
        tiny(softmax_sampler="zipf")


# ------------------------------------------------------------------------------------- clipping (bilm-tf: 3 and 3)
def test_clipped_bilm_keeps_the_keys_and_without_effective_clipping_equals_nn_lstm():
    from lmforge.nn.lstmp import ClippedLSTMP

    plain, clipped = bilm(), bilm(cell_clip=1e6, proj_clip=1e6)
    assert isinstance(clipped.layers[0]["forward_lstm"], ClippedLSTMP)
    assert isinstance(plain.layers[0]["forward_lstm"], torch.nn.LSTM)
    clipped.load_state_dict(plain.state_dict())  # the same keys: a folder loads either way
    ids = torch.randint(5, V, (3, 7))
    mask = torch.ones(3, 7)
    mask[1, 4:] = 0
    mask[2, :2] = 0  # padding first: the rows are compacted
    with torch.no_grad():
        torch.testing.assert_close(clipped(ids, mask).last_hidden_state, plain(ids, mask).last_hidden_state,
                                   atol=1e-5, rtol=0)
        a, b = clipped.forward_lm(ids, mask), plain.forward_lm(ids, mask)
        torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, atol=1e-5, rtol=0)
        for (h1, c1), (h2, c2) in zip(a.state, b.state, strict=True):
            torch.testing.assert_close(h1, h2, atol=1e-5, rtol=0)
            torch.testing.assert_close(c1, c2, atol=1e-5, rtol=0)


def test_clipping_bounds_every_layer_output_and_the_padding_rows_run_alone():
    model = bilm(cell_clip=0.05, proj_clip=0.02)
    ids = torch.randint(5, V, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        out = model(ids, mask, output_hidden_states=True)
        layer1 = out.hidden_states[1]  # [f_1; b_1]: projected outputs, clipped (no residual below layer 2)
        assert layer1.abs().max() <= 0.02 + 1e-7
        alone = model(ids[1:, :3]).last_hidden_state
    torch.testing.assert_close(out.last_hidden_state[1, :3], alone[0])


# ------------------------------------------------------------------------------ states carried across stream windows
def stream_windows(x: torch.Tensor, T: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive windows of rows x (B, N*T + 1) as LMStreamData(bidirectional) gives them: forward left to right,
    backward from the rows' ends to their starts (each in text order, labels = the previous tokens)."""
    n = (x.shape[1] - 1) // T
    flipped = x.flip(1)
    return [{"input_ids": x[:, k * T:(k + 1) * T], "labels": x[:, k * T + 1:(k + 1) * T + 1],
             "backward_input_ids": flipped[:, k * T:(k + 1) * T].flip(1),
             "backward_labels": flipped[:, k * T + 1:(k + 1) * T + 1].flip(1),
             "reset": torch.full((x.shape[0],), int(k == 0))} for k in range(n)]


@pytest.mark.parametrize("clip", [None, 0.5])
def test_carried_states_make_consecutive_windows_one_long_window(clip):
    model = bilm(cell_clip=clip, proj_clip=clip)
    torch.manual_seed(3)
    x = torch.randint(5, V, (2, 3 * 4 + 1))
    state, f_sum, b_sum = None, 0.0, 0.0
    with torch.no_grad():
        for w in stream_windows(x, 4):
            out = model(w["input_ids"], stream={**{k: w[k] for k in ("labels", "backward_input_ids",
                                                                     "backward_labels")}, "state": state})
            state, f_sum, b_sum = out.state, f_sum + out.forward_nll, b_sum + out.backward_nll
        whole = model(x, lm_loss=True)  # one block of 13 tokens: 12 predictions per direction, from zero states
    torch.testing.assert_close(f_sum, whole.forward_nll, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(b_sum, whole.backward_nll, atol=1e-4, rtol=1e-5)
    assert int(out.n_predictions) == 2 * 4


def test_the_objective_carries_resets_keeps_train_and_eval_apart_and_checkpoints_its_state():
    from lmforge.objectives.bilm import BiLMObjective

    model = bilm(cell_clip=3.0, proj_clip=3.0)
    torch.manual_seed(4)
    x = torch.randint(5, V, (2, 3 * 4 + 1))
    windows = stream_windows(x, 4)
    objective = BiLMObjective()
    with torch.no_grad():
        losses = [objective(model, w).losses["lm"][0] for w in windows]
        whole = model(x, lm_loss=True)
    torch.testing.assert_close(sum(losses), (whole.forward_nll + whole.backward_nll) / 2, atol=1e-4, rtol=1e-5)
    assert objective.state(False) is not None and objective.state(True) is None  # eval state only (model.eval())
    # a checkpoint of the training state restores it exactly: the resumed objective's next window is the same
    model.train()
    first = BiLMObjective()
    first(model, windows[0])
    saved = first.state_dict()
    assert saved["train_state"]["forward"][0][0].shape == (1, 2, 12)
    resumed = BiLMObjective()
    resumed.load_state_dict(saved)
    with torch.no_grad():
        torch.testing.assert_close(resumed(model, windows[1]).losses["lm"][0],
                                   first(model, windows[1]).losses["lm"][0])
        # reset, or another number of rows, starts from zeros; so does carry_states=False
        fresh = BiLMObjective(carry_states=False)
        again = fresh(model, windows[1]).losses["lm"][0]
        assert not torch.allclose(again, first(model, windows[1]).losses["lm"][0])
        torch.testing.assert_close(first(model, {**windows[1], "reset": torch.ones(2)}).losses["lm"][0], again)
        one_row = {k: v[:1] for k, v in windows[1].items()}
        torch.testing.assert_close(first(model, {**one_row, "reset": torch.zeros(1)}).losses["lm"][0],
                                   BiLMObjective(carry_states=False)(model, one_row).losses["lm"][0])
    assert fresh.state(True) is None and fresh.state_dict() == {"train_state": None}


# ------------------------------------------------------------------------------------------------- word-level input
def test_a_word_level_bilm_refuses_a_piece_vocabulary():
    model = BiLM(tiny(input_unit="word"))
    model.set_vocabulary(TOKENS)  # whole words: fine
    with pytest.raises(LmforgeError, match=r"input_unit='word'.*--algorithm words.*input_unit=piece"):
        model.set_vocabulary(TOKENS[:-1] + ["##s"])
    BiLM(tiny()).set_vocabulary(TOKENS[:-1] + ["##s"])  # a folder without the key reads pieces, as before
    with pytest.raises(LmforgeError, match="input_unit='letters'"):
        tiny(input_unit="letters")
    with pytest.raises(LmforgeError, match="cell_clip=-1"):
        tiny(cell_clip=-1)
    assert isinstance(BiLM(tiny(cell_clip=0, proj_clip=0)).layers[0]["forward_lstm"], torch.nn.LSTM)  # 0: off
