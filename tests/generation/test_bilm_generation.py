"""Generation from ELMo's biLM: its forward LM alone (``BiLM.forward_lm``) equals the forward half of ``forward``,
carries its state token by token, and drives greedy / beam / sampling through ``adapter_for`` and ``lmforge
generate`` on a ``pretrain --objective bilm`` folder."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.generation import adapter_for, generate
from lmforge.generation.adapters import RecurrentLMAdapter
from lmforge.generation.text import generated_text
from lmforge.models.elmo import BiLM, ELMoEncoder
from tests.generation.helpers import EOS, V, padded_batch, unpadded

D, DC = 6, 10
LENGTHS = [6, 2, 4]


def _bilm(seed: int = 0, token_encoder: str = "embedding", **overrides) -> BiLM:
    values = dict(arch="bilm", vocab_size=V, d_model=D, d_cell=DC, n_layers=3, dropout=0.0, pad_token_id=0,
                  token_encoder=token_encoder, d_char=4, char_filters=[[1, 4], [2, 4]], n_highway=1,
                  max_chars_per_token=6)
    values.update(overrides)
    torch.manual_seed(seed)
    model = BiLM(ModelConfig(**values)).double()
    if token_encoder == "chars":
        model.set_vocabulary([f"w{i}" for i in range(V)])
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # larger weights: peaked next-token distributions, no near-ties
        for name, p in model.named_parameters():
            if "embeddings" not in name or token_encoder == "embedding":
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.eval()


def _next_logits(model: BiLM, ids: torch.Tensor) -> torch.Tensor:
    """(1, V) the scores after the last token of ``ids`` (1, n), from one stateless pass."""
    return model.lm_logits(model.forward_lm(ids).last_hidden_state[:, -1])


# ------------------------------------------------------------------------------------------------ forward_lm
@pytest.mark.parametrize("token_encoder", ["embedding", "chars"])
@pytest.mark.parametrize("side", ["left", "right", "inside"])
def test_forward_lm_equals_the_forward_half_of_every_layer(token_encoder, side):
    model = _bilm(1, token_encoder, dropout=0.3)  # eval: dropout off in both
    ids, mask = padded_batch(3, LENGTHS, side="left" if side == "left" else "right")
    if side == "inside":
        mask[0, 2] = 0
    with torch.no_grad():
        full = model(ids, mask, output_hidden_states=True).hidden_states  # L + 1 x (B, T, 2D)
        out = model.forward_lm(ids, mask, output_hidden_states=True)
    assert len(out.hidden_states) == len(full) == 4
    for f, layer in zip(out.hidden_states, full, strict=True):
        torch.testing.assert_close(f, layer[..., :D])
    torch.testing.assert_close(out.last_hidden_state, full[-1][..., :D])
    assert [(tuple(h.shape), tuple(c.shape)) for h, c in out.state] == [((1, 3, D), (1, 3, DC))] * 3
    # each row's state is the one after its own last real token: the same as the row alone
    for row in range(3):
        alone = model.forward_lm(unpadded(ids, mask, row))
        for (h, c), (h1, c1) in zip(out.state, alone.state, strict=True):
            torch.testing.assert_close(h[:, row], h1[:, 0])
            torch.testing.assert_close(c[:, row], c1[:, 0])


def test_stepping_token_by_token_equals_one_pass():
    model = _bilm(2)
    ids, mask = padded_batch(5, [7, 7], side="right")
    whole = model.forward_lm(ids)
    state, steps = None, []
    for t in range(ids.shape[1]):
        out = model.forward_lm(ids[:, t:t + 1], state=state)
        steps.append(out.last_hidden_state)
        state = out.state
    torch.testing.assert_close(torch.cat(steps, 1), whole.last_hidden_state)
    for (h, c), (h1, c1) in zip(state, whole.state, strict=True):
        torch.testing.assert_close(h, h1)
        torch.testing.assert_close(c, c1)
    # chunks of different lengths per row (a row may have no token in a chunk: its state is kept)
    first = model.forward_lm(ids[:, :3], torch.tensor([[1, 1, 1], [1, 0, 0]]))
    second = model.forward_lm(torch.stack([ids[0, 3:6], torch.cat([ids[1, 1:3], ids[1, :1]])]),
                              torch.tensor([[0, 0, 0], [1, 1, 0]]), state=first.state)
    third = model.forward_lm(torch.stack([ids[0, 3:], ids[1, 3:]]), torch.tensor([[1] * 4, [1] * 4]),
                             state=second.state)
    for (h, c), (h1, c1) in zip(third.state, whole.state, strict=True):
        torch.testing.assert_close(h, h1)
        torch.testing.assert_close(c, c1)


def test_reorder_state_and_a_state_of_another_batch_is_refused():
    model = _bilm(3)
    ids, mask = padded_batch(7, LENGTHS, side="right")
    state = model.forward_lm(ids, mask).state
    index = torch.tensor([2, 0, 0])
    kept = BiLM.reorder_state(state, index)
    for (h, c), (h1, c1) in zip(kept, state, strict=True):
        assert torch.equal(h, h1[:, index]) and torch.equal(c, c1[:, index])
    with pytest.raises(LmforgeError, match="belongs to another batch size"):
        model.forward_lm(ids[:2], state=state)
    with pytest.raises(LmforgeError, match="list of 3 \\(h, c\\) pairs"):
        model.forward_lm(ids, state=state[:2])


# ------------------------------------------------------------------------------------------------ generation
def test_adapter_for_runs_the_forward_lm_and_refuses_the_fine_tuned_encoder():
    model = _bilm(4)
    adapter = adapter_for(model)
    assert isinstance(adapter, RecurrentLMAdapter) and adapter.run == model.forward_lm
    prompt, mask = padded_batch(8, LENGTHS, side="left")
    assert torch.equal(adapter.context(prompt, mask)[0], prompt)  # the prompt is the output's start
    encoder = ELMoEncoder.wrap(model.float(), elmo_rnn_layers=1, rnn_cell="lstm", bidirectional=True,
                               attention="dot", max_seq_len=16)
    with pytest.raises(LmforgeError, match="cannot generate with an ELMoEncoder.*use the biLM folder"):
        adapter_for(encoder)


@pytest.mark.parametrize("side", ["left", "right"])
def test_greedy_equals_a_manual_loop_over_forward_lm(side):
    model = _bilm(5)
    ids, mask = padded_batch(11, LENGTHS, side=side)
    out = generate(model, ids, mask, max_new_tokens=6, eos_id=EOS)
    with torch.no_grad():
        for row in range(len(LENGTHS)):
            seq, expected = unpadded(ids, mask, row), []
            for _ in range(6):
                token = int(_next_logits(model, seq).argmax(-1))
                if token == EOS:
                    break
                expected.append(token)
                seq = torch.cat([seq, torch.tensor([[token]])], 1)
            assert out.sequences[row][0] == expected


def test_beam_of_one_equals_greedy_and_beams_and_samples_run():
    model = _bilm(6)
    ids, mask = padded_batch(13, LENGTHS, side="left")
    options = dict(max_new_tokens=5, eos_id=EOS)
    greedy = generate(model, ids, mask, **options)
    assert generate(model, ids, mask, strategy="beam", num_beams=1, **options).sequences == greedy.sequences
    beam = generate(model, ids, mask, strategy="beam", num_beams=3, num_return_sequences=3, **options)
    assert all(len(hyps) == 3 for hyps in beam.sequences)
    assert all(b[0] >= g[0] - 1e-9 for b, g in zip(beam.scores, greedy.scores, strict=True))  # beam finds no worse
    samples = [generate(model, ids, mask, strategy="sample", seed=3, num_return_sequences=2, **options).sequences
               for _ in range(2)]
    assert samples[0] == samples[1] and all(len(s) == 2 for s in samples[0])


def test_a_tiny_bilm_learns_a_cycle_and_continues_it():
    pattern = torch.tensor([5, 9, 13, 17, 21, 25, 28])
    stream = pattern.repeat(12)
    model = _bilm(7).float().train()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.3)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    for step in range(60):
        p = step % 7
        batch = torch.stack([stream[p:p + 12], stream[p + 3:p + 15]])
        out = model(batch, lm_loss=True)
        loss = (out.forward_nll + out.backward_nll) / (2 * out.n_predictions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < 0.1
    prompt = pattern[:3][None]
    out = generate(model, prompt, torch.ones_like(prompt), max_new_tokens=8)
    assert out.sequences[0][0] == pattern.roll(-3).tolist() + [pattern[3].item()]


# ------------------------------------------------------------------------------------------------ command line
TINY = ["--model.n_layers=2", "--model.d_model=16", "--model.d_cell=24", "--model.n_highway=1",
        "--model.char_filters=[[1, 4], [2, 8]]", "--model.max_chars_per_token=8", "--model.dropout=0.0",
        "--train.log_every=1", "--train.eval_batches=1"]


@pytest.fixture(scope="module")
def bilm_run(tmp_path_factory):
    from lmforge.cli import main
    from tests.toy_tasks import CITIES, FILLER, NAMES

    root = tmp_path_factory.mktemp("bilm-gen")
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    for doc in range(6):
        sentences = [" ".join([rng.choice(NAMES), rng.choice(FILLER), "to", rng.choice(CITIES), "."])
                     for _ in range(40)]
        (corpus / f"{doc}.txt").write_text(" ".join(sentences) + "\n", encoding="utf-8")
    assert main(["-q", "tokenizer", "train", "--input", str(corpus), "--vocab-size", "120", "--out",
                 str(root / "tok"), "--algorithm", "words"]) == 0  # elmo-small reads whole words
    assert main(["-q", "data", "prepare", "--tokenizer", str(root / "tok"), "--input", str(corpus), "--out",
                 str(root / "data"), "--workers", "1"]) == 0
    out = root / "run"
    assert main(["-q", "pretrain", "--preset", "elmo-small", "--objective", "bilm", "--input", str(root / "data"),
                 "--out", str(out), "--max-steps", "2", "--batch-size", "4", "--seq-len", "16", *TINY]) == 0
    return out


def test_lmforge_generate_continues_prompts_with_a_pretrained_bilm(bilm_run, tmp_path, capsys):
    from lmforge.cli import main
    from lmforge.persistence import load_pretrained, save_pretrained

    capsys.readouterr()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("alice went to\nbob\n", encoding="utf-8")
    results = []
    for flags in ([], ["--strategy", "beam", "--num-beams", "3", "--num-return-sequences", "2"],
                  ["--strategy", "sample", "--top-k", "5", "--seed", "1"]):
        assert main(["-q", "generate", "--model", str(bilm_run), "--input", str(prompts), "--max-new-tokens", "5",
                     "--json", *flags]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
        assert [r["prompt"] for r in lines] == ["alice went to", "bob"]
        results.append(lines)
    assert any(g["text"] for r in results[0] for g in r["generations"])  # it wrote text
    assert [len(r["generations"]) for r in results[1]] == [2, 2]
    # the command's greedy text is the library's greedy continuation of [SEP] + the prompt's pieces
    loaded = load_pretrained(bilm_run)
    tok = loaded.tokenizer
    ids = torch.tensor([[tok.sep_id, *tok.encode_ids("alice went to")]])
    out = generate(loaded.model, ids, max_new_tokens=5, eos_id=tok.sep_id, pad_id=tok.pad_id)
    greedy = results[0][0]["generations"][0]
    assert greedy["continuation"] == generated_text(tok, "alice went to", ids[0].tolist(), out.sequences[0][0],
                                                    full_text=False)
    assert greedy["text"] == generated_text(tok, "alice went to", ids[0].tolist(), out.sequences[0][0])
    assert greedy["text"].startswith("alice went to") and greedy["text"].endswith(greedy["continuation"])
    # a fine-tuned ELMo task model does not generate
    elmo = tmp_path / "elmo"
    encoder = ELMoEncoder.wrap(loaded.model)
    save_pretrained(encoder, elmo, tokenizer=tok)
    assert main(["-q", "generate", "--model", str(elmo), "--prompt", "alice"]) != 0
    assert "fine-tuned 'elmo' model, which does not generate; generation needs the 'bilm' folder" in \
        capsys.readouterr().err
