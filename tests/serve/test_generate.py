"""/generate over loopback with a tiny decoder (GPT) and a tiny encoder-decoder: the answers of
``lmforge.generation.generate``, option validation, batching that changes nothing, the length caps."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from lmforge.serve import create_app
from tests.serve import server_thread
from tests.toy_tasks import vocab

PROMPTS = ["alice lives in", "the", "bob went to paris and later met carol in"]


def _save(arch: str, folder):
    from lmforge.config import ModelConfig
    from lmforge.models import ARCHITECTURES
    from lmforge.persistence import save_pretrained
    from lmforge.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(vocab())
    config = ModelConfig(arch=arch, vocab_size=tokenizer.vocab_size, d_model=12, n_heads=2, n_layers=2, d_ff=37,
                         max_seq_len=24, dropout=0.0, attention_dropout=0.0, norm_first=arch == "decoder")
    torch.manual_seed(0)
    return save_pretrained(ARCHITECTURES[arch](config), folder, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    folder = _save("decoder", tmp_path_factory.mktemp("gpt") / "model")
    app = create_app(folder, max_wait_ms=20, max_length=16, max_new_tokens=30)
    with server_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client, app, folder


def _direct(folder, prompts, *, seq2seq: bool = False, **options):
    from lmforge.generation import generate
    from lmforge.persistence import load_pretrained

    loaded = load_pretrained(folder)
    tok = loaded.tokenizer
    rows = [tok.encode_ids(p) if seq2seq else [tok.sep_id, *tok.encode_ids(p)] for p in prompts]
    ids = torch.full((len(rows), max(map(len, rows))), tok.pad_id)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
    return generate(loaded.model, ids, mask, eos_id=tok.sep_id, bos_id=tok.cls_id, pad_id=tok.pad_id, **options)


def test_greedy_and_beam_equal_generate(decoder):
    client, _, folder = decoder
    r = client.post("/generate", json={"texts": PROMPTS, "max_new_tokens": 6})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    expected = _direct(folder, PROMPTS, max_new_tokens=6)
    assert [res["token_ids"][0] for res in results] == expected.best
    assert all(len(res["texts"]) == 1 and isinstance(res["texts"][0], str) for res in results)
    from lmforge.generation.text import generated_text
    from lmforge.persistence import load_pretrained

    tok = load_pretrained(folder).tokenizer
    for prompt, res, seq in zip(PROMPTS, results, expected.best, strict=True):  # the prompt, then its continuation
        ids = [tok.sep_id, *tok.encode_ids(prompt)]
        assert res["texts"][0] == generated_text(tok, prompt, ids, seq) and res["texts"][0].startswith(prompt)
        assert "##" not in res["texts"][0]
    tails = client.post("/generate", json={"texts": PROMPTS, "max_new_tokens": 6, "return_full_text": False})
    assert tails.status_code == 200, tails.text
    for prompt, res, tail in zip(PROMPTS, results, tails.json()["results"], strict=True):
        assert tail["token_ids"] == res["token_ids"] and len(tail["texts"][0]) <= len(res["texts"][0]) - len(prompt)
        assert res["texts"][0].endswith(tail["texts"][0])
    r = client.post("/generate", json={"texts": PROMPTS[:2], "strategy": "beam", "num_beams": 3,
                                       "num_return_sequences": 2, "max_new_tokens": 5, "length_penalty": "gnmt"})
    assert r.status_code == 200, r.text
    expected = _direct(folder, PROMPTS[:2], strategy="beam", num_beams=3, num_return_sequences=2, max_new_tokens=5,
                       length_penalty="gnmt")
    assert [res["token_ids"] for res in r.json()["results"]] == expected.sequences
    assert [res["scores"] for res in r.json()["results"]] == [pytest.approx(s, rel=1e-5) for s in expected.scores]


def test_seeded_sampling_is_repeatable(decoder):
    client, _, _ = decoder
    body = {"texts": ["alice"], "strategy": "sample", "seed": 3, "top_k": 5, "max_new_tokens": 8,
            "num_return_sequences": 2}
    first, second = client.post("/generate", json=body), client.post("/generate", json=body)
    assert first.status_code == 200, first.text
    assert first.json() == second.json() and len(first.json()["results"][0]["texts"]) == 2


def test_concurrent_greedy_requests_answer_as_one_at_a_time(decoder):
    client, app, _ = decoder
    prompts = [" ".join(["alice"] + ["the"] * (i % 7)) for i in range(12)]
    alone = [client.post("/generate", json={"texts": [p], "max_new_tokens": 5}).json()["results"][0]
             for p in prompts]
    before = app.state.batchers["/generate"].batches

    async def together():
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=60) as c:
            rs = await asyncio.gather(*(c.post("/generate", json={"texts": [p], "max_new_tokens": 5})
                                        for p in prompts))
        return [r.json()["results"][0] for r in rs]

    batched = asyncio.run(together())
    assert app.state.batchers["/generate"].batches - before < len(prompts)
    assert [b["token_ids"] for b in batched] == [a["token_ids"] for a in alone]
    assert [b["scores"] for b in batched] == [pytest.approx(a["scores"], rel=1e-4, abs=1e-5) for a in alone]


@pytest.mark.parametrize("body, status, message", [
    ({"texts": ["a"], "temperature": 0.7}, 422, "temperature=0.7 only apply to strategy 'sample'"),
    ({"texts": ["a"], "strategy": "beam", "num_beams": 2, "num_return_sequences": 3}, 422,
     "num_return_sequences=3 exceeds num_beams=2"),
    ({"texts": ["a"], "strategy": "nucleus"}, 422, "strategy: Input should be 'greedy', 'beam' or 'sample'"),
    ({"texts": ["a"], "max_new_tokens": 31}, 422, "max_new_tokens: Input should be less than or equal to 30"),
    ({"texts": ["a"], "length_penalty": "gnmt:x"}, 422, "ALPHA must be a number"),
    ({"texts": ["alice " * 20]}, 413, "texts[0]: 20 tokens; at most 16 are accepted (server option --max-length)"),
    ({"prompt": "a"}, 422, "unknown field 'prompt'"),
])
def test_invalid_generation_requests(decoder, body, status, message):
    client, _, _ = decoder
    r = client.post("/generate", json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_new_tokens_are_capped_by_the_context_with_a_warning(decoder):
    client, _, _ = decoder
    prompt = "alice " * 14  # [SEP] + 14 tokens: 24 - 15 + 1 = 10 new tokens fit
    r = client.post("/generate", json={"texts": [prompt], "max_new_tokens": 30})
    assert r.status_code == 200, r.text
    assert r.json()["warnings"] == ["max_new_tokens=30 reduced to 10: the longest prompt has 15 tokens and the model "
                                    "reads 24 positions"]
    assert len(r.json()["results"][0]["token_ids"][0]) <= 10
    assert client.post("/embed", json={"texts": ["a"]}).status_code == 404
    assert client.get("/info").json()["endpoints"] == ["/generate"]


def test_encoder_decoder_generates_from_a_source(tmp_path):
    folder = _save("seq2seq", tmp_path / "t5ish")
    with server_thread(create_app(folder)) as url:
        r = httpx.post(f"{url}/generate", json={"texts": PROMPTS, "max_new_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    expected = _direct(folder, PROMPTS, seq2seq=True, max_new_tokens=4)
    assert [res["token_ids"][0] for res in r.json()["results"]] == expected.best


def test_texts_is_the_field_and_prompts_its_deprecated_spelling(decoder):
    client = decoder[0]
    new = client.post("/generate", json={"texts": ["alice"], "max_new_tokens": 4})
    old = client.post("/generate", json={"prompts": ["alice"], "max_new_tokens": 4})
    assert new.status_code == old.status_code == 200
    assert old.json()["results"] == new.json()["results"]
    assert any("prompts is deprecated" in w for w in old.json()["warnings"])
    assert not any("deprecated" in w for w in new.json()["warnings"])
    both = client.post("/generate", json={"texts": ["a"], "prompts": ["a"]})
    assert both.status_code == 422 and "give texts only" in both.json()["error"]
    neither = client.post("/generate", json={"max_new_tokens": 4})
    assert neither.status_code == 422 and "texts: required field missing" in neither.json()["error"]
