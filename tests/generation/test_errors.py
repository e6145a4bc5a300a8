"""Bad options and inputs give clear errors: the config's validation, empty prompts, prompts longer than the
context, k < t, top-p outside (0, 1], unknown models and options."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.generation import GenerationConfig, generate, length_penalty
from tests.generation.helpers import BOS, FakeRNNSeq2Seq, V, decoder, encoder_decoder, random_ids


@pytest.mark.parametrize(("options", "message"), [
    (dict(strategy="topk"), "strategy='topk' is not one of greedy, beam, sample"),
    (dict(max_new_tokens=0), "max_new_tokens=0 must be an integer >= 1"),
    (dict(strategy="beam", num_beams=2, num_return_sequences=3), "num_return_sequences=3 exceeds num_beams=2"),
    (dict(num_return_sequences=2), "greedy search finds one hypothesis"),
    (dict(strategy="sample", top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(strategy="sample", top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
    (dict(strategy="sample", temperature=0.0), "temperature=0.0 must be > 0"),
    (dict(strategy="sample", temperature=-1.0), "temperature=-1.0 must be > 0"),
    (dict(strategy="sample", top_k=-1), "top_k=-1 must be an integer >= 0"),
    (dict(repetition_penalty=0.0), "repetition_penalty=0.0 must be > 0"),
    (dict(no_repeat_ngram_size=-2), "no_repeat_ngram_size=-2 must be an integer >= 0"),
    (dict(strategy="beam", length_penalty="gnmt:x"), "ALPHA must be a number"),
    (dict(strategy="beam", length_penalty="linear"), "is not one of none, average, gnmt, gnmt:ALPHA"),
    (dict(strategy="beam", length_penalty="average:2"), "only gnmt takes a parameter"),
    (dict(top_k=5), "top_k=5 only apply to strategy 'sample'"),
    (dict(strategy="beam", temperature=0.5), "temperature=0.5 only apply to strategy 'sample'"),
    (dict(eos_id=-1), "eos_id=-1 must be a token id"),
    (dict(stop_ids=[3, -4]), r"stop_ids \[-4\] must be token ids"),
])
def test_config_validation(options, message):
    with pytest.raises(LmforgeError, match=message):
        GenerationConfig(**options)


def test_several_problems_are_reported_together():
    with pytest.raises(LmforgeError, match="top_p=2.*temperature=0|temperature=0.*top_p=2"):
        GenerationConfig(strategy="sample", temperature=0, top_p=2)


def test_length_penalty_names():
    assert length_penalty("none") == ("none", 0.0)
    assert length_penalty("average") == ("average", 0.0)
    assert length_penalty("gnmt") == ("gnmt", 0.6)
    assert length_penalty("gnmt:1.2") == ("gnmt", 1.2)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(LmforgeError, match="unknown generation option.*num_beam\\b.*valid options: strategy"):
        generate(decoder(), random_ids(0, 1, 3), num_beam=3)


def test_empty_prompt():
    model = decoder()
    ids = random_ids(0, 3, 4)
    mask = torch.ones_like(ids)
    mask[1] = 0
    with pytest.raises(LmforgeError, match="prompt 1 of the batch is empty"):
        generate(model, ids, mask)
    with pytest.raises(LmforgeError, match="source 1 of the batch is empty"):
        generate(encoder_decoder(), ids, mask, bos_id=BOS)
    with pytest.raises(LmforgeError, match="input_ids has no rows"):
        generate(model, ids[:0])
    with pytest.raises(LmforgeError, match="prompts 0, 1, 2 of the batch are empty"):
        generate(model, ids[:, :0])


def test_prompt_longer_than_the_context():
    model = decoder()  # max_seq_len 24
    with pytest.raises(LmforgeError, match="prompt 0 of the batch has 25 tokens, longer than the model's context "
                                           r"\(max_seq_len=24\)"):
        generate(model, random_ids(0, 1, 25))
    # Padding does not count: a padded row of 24 real tokens is fine.
    ids = random_ids(1, 2, 30)
    mask = torch.zeros_like(ids)
    mask[0, 6:] = 1
    mask[1, 20:] = 1
    out = generate(model, ids, mask, max_new_tokens=1)
    assert [len(s[0]) for s in out.sequences] == [1, 1]
    with pytest.raises(LmforgeError, match="source 0 of the batch has 25 tokens"):
        generate(encoder_decoder(), random_ids(0, 1, 25), bos_id=BOS)


def test_bad_shapes_and_types():
    model = decoder()
    with pytest.raises(LmforgeError, match="must be a \\(batch, length\\) tensor"):
        generate(model, [[1, 2, 3]])
    with pytest.raises(LmforgeError, match="must be a \\(batch, length\\) tensor"):
        generate(model, torch.tensor([1, 2, 3]))
    with pytest.raises(LmforgeError, match="integer token ids"):
        generate(model, torch.ones(1, 3))
    with pytest.raises(LmforgeError, match="attention_mask must have the shape of input_ids"):
        generate(model, random_ids(0, 2, 3), torch.ones(2, 4))
    with pytest.raises(LmforgeError, match="config must be a GenerationConfig"):
        generate(model, random_ids(0, 2, 3), config={"strategy": "beam"})


def test_token_ids_outside_the_vocabulary():
    with pytest.raises(LmforgeError, match=f"eos_id={V} outside the model's vocabulary \\(size {V}"):
        generate(decoder(), random_ids(0, 1, 3), eos_id=V)
    with pytest.raises(LmforgeError, match=f"stop_ids={V + 2} outside"):
        generate(decoder(), random_ids(0, 1, 3), strategy="beam", stop_ids=[V + 2])


def test_encoder_decoders_need_a_start_token_and_unknown_models_are_refused():
    with pytest.raises(LmforgeError, match="EncoderDecoder is an encoder-decoder.*pass bos_id"):
        generate(encoder_decoder(), random_ids(0, 1, 3))
    with pytest.raises(LmforgeError, match="FakeRNNSeq2Seq is an encoder-decoder.*pass bos_id"):
        generate(FakeRNNSeq2Seq(), random_ids(0, 1, 3))
    with pytest.raises(LmforgeError, match="cannot generate with a Linear"):
        generate(torch.nn.Linear(2, 2), random_ids(0, 1, 3))
