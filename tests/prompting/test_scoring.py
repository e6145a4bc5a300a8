"""Scoring: the label log-likelihood against a plain forward pass, padding invariance, mean / unconditional by
formula, contextual calibration by formula, models that cannot be scored."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models.awd_lstm import AWDLSTM
from lmforge.models.encoder import Encoder
from lmforge.prompting import (
    FewShotConfig,
    PromptBuilder,
    PromptTemplate,
    calibrate,
    causal_lm_for,
    content_free_inputs,
    draw_demonstrations,
    fewshot_evaluate,
    label_probabilities,
    score_candidates,
    score_continuations,
)
from tests.prompting.helpers import (
    SPECIAL,
    TEMPLATE,
    TEST,
    TRAIN,
    VERBALIZER,
    WORDS,
    decoder,
    log_likelihood,
    tokenizer,
)


def _pairs(seed: int, n: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    vocab = len(SPECIAL) + len(WORDS)
    return [([3] + [rng.randrange(5, vocab) for _ in range(rng.randint(0, 9))],
             [rng.randrange(5, vocab) for _ in range(rng.randint(1, 3))]) for _ in range(n)]


def test_a_label_scores_the_sum_of_its_token_log_probs_from_one_forward_pass():
    model = decoder()
    pairs = _pairs(0, 7)
    got = score_continuations(model, pairs, batch_size=3)
    want = [log_likelihood(model, c, a) for c, a in pairs]
    assert got == pytest.approx(want, rel=1e-10, abs=1e-10)


def test_left_padded_batches_equal_one_by_one():
    model = decoder(seed=1)
    pairs = _pairs(1, 9)
    assert score_continuations(model, pairs, batch_size=9) == pytest.approx(
        score_continuations(model, pairs, batch_size=1), rel=1e-10, abs=1e-10)


def test_score_candidates_is_prompts_by_candidates():
    model = decoder()
    prompts, cands = [[3, 10, 11], [3, 12]], [[20], [21, 22]]
    out = score_candidates(model, tokenizer(), prompts, cands, batch_size=2)
    assert out.log_probs.shape == (2, 2) and out.n_tokens.tolist() == [1, 2]
    for p in range(2):
        for c in range(2):
            assert float(out.log_probs[p, c]) == pytest.approx(log_likelihood(model, prompts[p], cands[c]))
    assert torch.allclose(out.mean(), out.log_probs / torch.tensor([1.0, 2.0], dtype=torch.float64))


def test_the_model_is_scored_in_eval_mode_and_its_mode_restored():
    model = decoder().train()
    score_continuations(model, _pairs(2, 2))
    assert model.training


def _k0_scores(scoring: str, template: str = TEMPLATE) -> tuple[list[dict], PromptBuilder, torch.nn.Module]:
    model = decoder()
    report = fewshot_evaluate(model, tokenizer(), TRAIN, TEST, FewShotConfig(template=template,
                              verbalizer={"pos": "very good", "neg": "bad"}, shots=(0,), scoring=scoring))
    builder = PromptBuilder(tokenizer(), PromptTemplate.parse(template), {"pos": "very good", "neg": "bad"}, "\n\n",
                            TRAIN, 96)
    return report.predictions[0], builder, model


@pytest.mark.parametrize("scoring", ["sum", "mean", "unconditional"])
def test_sum_mean_and_unconditional_scores_by_formula(scoring):
    records, builder, model = _k0_scores(scoring)
    context = builder.context_ids()
    assert tokenizer().convert_ids_to_tokens(context) == ["[SEP]", "sentiment", ":"]
    for ex, record in zip(TEST, records, strict=True):
        prompt = builder.build([], ex.text).ids
        for label, cand in zip(builder.labels, builder.candidates, strict=True):
            lp = log_likelihood(model, prompt, cand)
            want = {"sum": lp, "mean": lp / len(cand),
                    "unconditional": lp - log_likelihood(model, context, cand)}[scoring]
            assert record["scores"][label] == pytest.approx(want, abs=2e-6)
        best = max(record["scores"], key=record["scores"].get)
        assert record["prediction"] == best and record["correct"] == (best == ex.label)


def test_calibration_on_hand_made_numbers():
    probs = torch.tensor([[0.7, 0.3], [0.4, 0.6], [0.5, 0.5]], dtype=torch.float64)
    p_cf = torch.tensor([0.8, 0.2], dtype=torch.float64)
    # W = diag(p_cf)^-1: [0.7/0.8, 0.3/0.2] = [0.875, 1.5] -> normalised [0.368421, 0.631579]
    out = calibrate(probs, p_cf)
    assert out[0].tolist() == pytest.approx([0.875 / 2.375, 1.5 / 2.375])
    assert out.argmax(-1).tolist() == [1, 1, 1]  # the bias towards label 0 is divided out
    assert out.sum(-1).tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert torch.allclose(calibrate(probs, torch.tensor([0.5, 0.5])), probs)  # uniform p_cf: no change
    want = torch.tensor([[0.5, 0.5], [1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))]], dtype=torch.float64)
    assert torch.allclose(label_probabilities(torch.tensor([[0.0, 0.0], [2.0, 0.0]])), want)


def test_calibrated_predictions_follow_zhao_et_al():
    model, tok = decoder(), tokenizer()
    config = FewShotConfig(template=TEMPLATE, verbalizer=VERBALIZER, shots=(2,), draws=1, calibrate=True, seed=5)
    report = fewshot_evaluate(model, tok, TRAIN, TEST, config)
    assert content_free_inputs(tok) == ["N/A", "", "[MASK]"]
    builder = PromptBuilder(tok, PromptTemplate.parse(TEMPLATE), VERBALIZER, "\n\n", TRAIN, 96)
    demos = draw_demonstrations(len(TRAIN), 2, len(TEST), random.Random(5), per_example=False,
                                excluded=[frozenset()] * len(TEST))[0]

    def probs(text):
        scores = [log_likelihood(model, builder.build(demos, text).ids, c) for c in builder.candidates]
        return torch.softmax(torch.tensor(scores, dtype=torch.float64), -1)

    p_cf = torch.stack([probs(t) for t in ("N/A", "", "[MASK]")]).mean(0)
    for ex, record in zip(TEST, report.predictions[2], strict=True):
        q = probs(ex.text) / p_cf
        q = q / q.sum()
        assert [record["probs"][label] for label in builder.labels] == pytest.approx(q.tolist(), abs=1e-5)
        assert record["prediction"] == builder.labels[int(q.argmax())]


def test_recurrent_language_models_are_scored_with_right_padding():
    torch.manual_seed(0)
    model = AWDLSTM(ModelConfig(arch="awd_lstm", vocab_size=len(SPECIAL) + len(WORDS), d_model=12, d_hidden=19,
                                n_layers=2, max_seq_len=1 << 16, embed_p=0.0, input_p=0.0,
                                hidden_p=0.0, weight_p=0.0, output_p=0.0)).double().eval()
    pairs = _pairs(3, 6)
    want = []
    for context, answer in pairs:
        with torch.no_grad():
            h = model(torch.tensor([context + answer])).last_hidden_state
            logp = torch.log_softmax(model.lm_logits(h)[0], -1)
        want.append(sum(float(logp[len(context) + j - 1, t]) for j, t in enumerate(answer)))
    assert score_continuations(model, pairs, batch_size=4) == pytest.approx(want, rel=1e-9, abs=1e-9)
    reverse = AWDLSTM(ModelConfig(arch="awd_lstm", vocab_size=40, d_model=12, d_hidden=19, n_layers=1,
                                  reverse=True))
    with pytest.raises(LmforgeError, match="backward AWD-LSTM"):
        causal_lm_for(reverse)


def test_an_encoder_is_refused_with_a_clear_error():
    model = Encoder(ModelConfig(vocab_size=40, d_model=12, n_heads=3, n_layers=1, d_ff=20, max_seq_len=16))
    with pytest.raises(LmforgeError, match="fewshot scores text left to right with a causal language model; "
                                           "runs/bert is a bidirectional encoder"):
        causal_lm_for(model, "runs/bert")
    with pytest.raises(LmforgeError, match="bidirectional encoder"):
        fewshot_evaluate(model, tokenizer(), TRAIN, TEST, FewShotConfig(shots=(0,)))
    with pytest.raises(LmforgeError, match="not a causal language model"):
        causal_lm_for(torch.nn.Linear(2, 2))


def test_a_hugging_face_gpt2_prompt_starts_with_endoftext_and_scores_as_transformers(tmp_path):
    pytest.importorskip("lmforge.tokenizers.bytebpe", reason="the byte-level BPE tokenizer is not in lmforge yet")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from lmforge.persistence import load_pretrained

    folder = tmp_path / "hf"
    folder.mkdir()
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["Review: great movie\nSentiment: positive negative dull plot"] * 20, vocab_size=300,
                            min_frequency=1, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(folder))
    config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=16, n_layer=2,
                                     n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(str(folder), safe_serialization=True)
    loaded = load_pretrained(folder, with_head=False)
    tok = loaded.tokenizer
    builder = PromptBuilder(tok, PromptTemplate.parse(TEMPLATE), VERBALIZER, "\n\n", TRAIN, loaded.config.max_seq_len)
    prompt = builder.build([0, 1], "great movie")
    assert prompt.ids[0] == tok.bos_id and tok.convert_ids_to_tokens(prompt.ids[-3:]) == \
        tok.convert_ids_to_tokens(tok.encode_ids("\nSentiment:"))
    assert [tok.convert_ids_to_tokens(c) for c in builder.candidates] == [["Ġpositive"], ["Ġnegative"]]
    # parts encoding gives the ids of the whole text: the answer is scored as a demonstration holds it
    assert prompt.ids + builder.candidates[0] == [tok.bos_id, *tok.encode_ids(prompt.text + " positive")]
    got = score_continuations(loaded.model, [(prompt.ids, c) for c in builder.candidates])
    with torch.no_grad():
        logp = reference(torch.tensor([prompt.ids + builder.candidates[0]])).logits[0].double().log_softmax(-1)
    assert got[0] == pytest.approx(float(logp[len(prompt.ids) - 1, builder.candidates[0][0]]), abs=1e-5)
