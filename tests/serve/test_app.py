"""The served endpoints over loopback with real (toy) models: round trips, equality with the pipelines and with
``lmforge embed``, request validation, endpoint selection, batching under concurrency, and no pickle."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import torch

import lmforge
from lmforge.errors import InputFileError, LmforgeError
from lmforge.serve import create_app
from tests.serve import server_thread

TEXTS = ["alice great today", "the bob awful later with a", "carol superb", "today dave went to dreadful"]


def close(a, b, tol=1e-5) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


@pytest.fixture(scope="module")
def classifier(finetuned):
    """A toy sequence classifier (fine-tuned with max_length 32) behind small limits."""
    out, _, _ = finetuned("sequence")
    app = create_app(out, max_batch=8, max_texts=6, max_chars=300, max_length=48, max_wait_ms=20)
    with server_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client, app, out


@pytest.fixture(scope="module")
def mlm_dir(tiny_encoder_dir, tmp_path_factory):
    from lmforge.heads import TaskModel, build_head
    from lmforge.persistence import load_backbone, save_pretrained

    loaded = load_backbone(tiny_encoder_dir)
    torch.manual_seed(0)
    model = TaskModel(loaded.model, build_head({"type": "mlm"}, loaded.config, loaded.model))
    return save_pretrained(model, tmp_path_factory.mktemp("mlm") / "model", tokenizer=loaded.tokenizer)


# ---------------------------------------------------------------------------------------------- round trips
def test_classify_equals_the_pipeline_and_health_and_info(classifier):
    client, _, out = classifier
    r = client.post("/classify", json={"texts": TEXTS})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = lmforge.pipeline("text-classification", model=out)(TEXTS)
    assert [x["label"] for x in body["results"]] == [e["label"] for e in expected]
    assert all(close(x["score"], e["score"]) for x, e in zip(body["results"], expected, strict=True))
    assert body["warnings"] == []
    assert client.get("/health").json() == {"status": "ok"}
    info = client.get("/info").json()
    assert info["endpoints"] == ["/classify", "/embed"] and info["task"] == "sequence"
    assert info["labels"] == ["neg", "pos"] and info["max_length"] == 48
    assert info["model_window"] == {"/classify": 32, "/embed": 64}
    assert info["max_batch"] == 8 and info["batching"] is True


def test_openapi_schema_lists_the_endpoints_and_limits(classifier):
    client, _, _ = classifier
    schema = client.get("/openapi.json").json()
    assert {"/classify", "/embed", "/health", "/info"} <= set(schema["paths"])
    assert "/tag" not in schema["paths"]
    request = schema["components"]["schemas"]["ClassifyRequest"]
    assert request["additionalProperties"] is False
    assert request["properties"]["texts"]["maxItems"] == 6
    assert request["properties"]["texts"]["items"]["maxLength"] == 300


def test_tag_equals_the_pipeline(finetuned):
    out, _, _ = finetuned("token")
    text = "today  alice bob went to paris"
    with server_thread(create_app(out)) as url:
        r = httpx.post(f"{url}/tag", json={"texts": [text, "later carol met erin in rome"]}, timeout=60)
        wrong = httpx.post(f"{url}/classify", json={"texts": [text]}, timeout=60)
    assert r.status_code == 200, r.text
    entities = r.json()["results"]
    expected = lmforge.pipeline("token-classification", model=out)([text, "later carol met erin in rome"])
    assert [[(e["entity_group"], e["start"], e["end"], e["word"]) for e in ents] for ents in entities] == \
        [[(e["entity_group"], e["start"], e["end"], e["word"]) for e in ents] for ents in expected]
    assert all(text[e["start"]:e["end"]] == e["word"] for e in entities[0])
    assert wrong.status_code == 404
    assert "/classify is not served" in wrong.json()["error"] and "/tag" in wrong.json()["error"]


def test_answer_equals_the_pipeline(finetuned):
    out, _, _ = finetuned("qa")
    question = {"question": "where lives bob ?", "context": "alice lives in paris . bob lives in rome ."}
    with server_thread(create_app(out)) as url:
        r = httpx.post(f"{url}/answer", json=question, timeout=60)
        missing = httpx.post(f"{url}/answer", json={"question": "where?"}, timeout=60)
    assert r.status_code == 200, r.text
    expected = lmforge.pipeline("question-answering", model=out)(question)
    got = r.json()
    assert (got["answer"], got["start"], got["end"]) == (expected["answer"], expected["start"], expected["end"])
    assert close(got["score"], expected["score"]) and got["warnings"] == []
    assert missing.status_code == 422 and "context: required field missing" in missing.json()["error"]


def test_fill_mask_equals_the_pipeline(mlm_dir):
    texts = ["alice lives in [MASK] .", "[MASK] lives in [MASK] ."]
    with server_thread(create_app(mlm_dir)) as url:
        r = httpx.post(f"{url}/fill-mask", json={"texts": texts, "top_k": 3}, timeout=60)
        no_mask = httpx.post(f"{url}/fill-mask", json={"texts": ["alice", "bob"]}, timeout=60)
        info = httpx.get(f"{url}/info", timeout=60).json()
    assert r.status_code == 200, r.text
    one, two = r.json()["results"]
    expected = lmforge.pipeline("fill-mask", model=mlm_dir, top_k=3)(texts)
    assert [c["token"] for c in one] == [c["token"] for c in expected[0]] and len(one) == 3
    assert [c["sequence"] for c in one] == [c["sequence"] for c in expected[0]]
    assert len(two) == 2 and [[c["token_id"] for c in m] for m in two] == \
        [[c["token_id"] for c in m] for m in expected[1]]
    assert no_mask.status_code == 422 and "texts[0] has no [MASK]" in no_mask.json()["error"]
    assert info["endpoints"] == ["/fill-mask", "/embed"]


def _cli_embed(model_dir, texts, tmp_path, *options) -> np.ndarray | list[np.ndarray]:
    from lmforge.cli import main

    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    pooling_none = "none" in options
    out = tmp_path / ("out.npz" if pooling_none else "out.npy")
    assert main(["-q", "embed", "--model", str(model_dir), "--input", str(src), "--out", str(out), "--overwrite",
                 *options]) == 0
    if pooling_none:
        with np.load(out) as data:
            return [data[f"arr_{i}"] for i in range(len(texts))]
    return np.load(out)


@pytest.mark.parametrize("options", [{}, {"layers": [-2, -1], "combine": "concat", "pooling": "cls"},
                                     {"layers": [0, -1], "combine": "sum", "pooling": "none"}])
def test_embed_equals_lmforge_embed(classifier, tmp_path, options):
    client, _, out = classifier
    r = client.post("/embed", json={"texts": TEXTS, **options})
    assert r.status_code == 200, r.text
    flags = []
    if "layers" in options:
        flags += ["--layers", ",".join(map(str, options["layers"])), "--combine", options["combine"],
                  "--pooling", options["pooling"]]
    expected = _cli_embed(out, TEXTS, tmp_path, *flags)
    got = r.json()["embeddings"]
    if options.get("pooling") == "none":
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(np.array(g), e, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_allclose(np.array(got), expected, rtol=1e-5, atol=1e-5)


def test_embed_word_pooling_equals_embed_words(classifier):
    from lmforge.embeddings.contextual import embed_words
    from lmforge.persistence import load_backbone

    client, _, out = classifier
    r = client.post("/embed", json={"texts": TEXTS[:2], "word_pooling": "mean", "layers": [-1, -2]})
    assert r.status_code == 200, r.text
    loaded = load_backbone(out)
    expected = embed_words(loaded.model, loaded.tokenizer, TEXTS[:2], layers=[-1, -2], word_pooling="mean")
    body = r.json()
    assert body["words"] == [w.words for w in expected]
    assert body["spans"] == [[list(s) for s in w.spans] for w in expected]
    for got, want in zip(body["embeddings"], expected, strict=True):
        np.testing.assert_allclose(np.array(got), want.vectors, rtol=1e-5, atol=1e-5)
    both = client.post("/embed", json={"texts": ["a"], "word_pooling": "first", "pooling": "cls"})
    assert both.status_code == 422 and "exclude each other" in both.json()["error"]


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("body, status, message", [
    ({"texts": []}, 422, "texts: must not be empty"),
    ({"texts": ["a"], "temperature": 1}, 422, "unknown field 'temperature'; this endpoint accepts texts, text_pairs"),
    ({"texts": "alice"}, 422, "texts: Input should be a valid list"),
    ({"texts": ["alice", 3]}, 422, "texts[1]: Input should be a valid string"),
    ({"text": ["alice"]}, 422, "texts: required field missing; unknown field 'text'; this endpoint accepts texts, "
                               "text_pairs"),
    (["alice"], 422, "the body must be a JSON object with the fields texts, text_pairs"),
    ({"texts": ["a"] * 7}, 413, "texts: 7 items; at most 6 are accepted per request (server option --max-texts)"),
    ({"texts": ["a" * 301]}, 413, "texts[0]: 301 characters; at most 300 are accepted (server option --max-chars)"),
    ({"texts": ["alice " * 50]}, 413, "texts[0]: 52 tokens ([CLS]/[SEP] included); at most 48 are accepted "
                                      "(server option --max-length)"),
    ({"texts": ["a"], "text_pairs": ["b"]}, 422, "this model classifies single texts; drop text_pairs"),
])
def test_invalid_requests_get_4xx_with_a_message(classifier, body, status, message):
    client, _, _ = classifier
    r = client.post("/classify", json=body)
    assert r.status_code == status, r.text
    assert r.json() == {"error": message}


def test_malformed_json_and_other_bodies(classifier):
    client, _, _ = classifier
    r = client.post("/classify", content=b'{"texts": ["a",]}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("the body is not valid JSON (character 15")
    r = client.post("/classify", content=b"", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "the body is empty" in r.json()["error"]
    r = client.post("/classify", content=b'{"texts": ["a"]}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]
    r = client.post("/embed", json={"texts": ["a"], "pooling": "max", "layers": ["-1"]})
    assert r.status_code == 422
    assert r.json()["error"] == ("layers[0]: Input should be a valid integer; pooling: Input should be 'none', "
                                 "'mean' or 'cls'")
    r = client.post("/embed", json={"texts": ["a"], "layers": [7]})
    assert r.status_code == 422 and "valid indices are -3..2" in r.json()["error"]
    r = client.post("/classify", content=b'{"texts": ["' + b"a" * 120_000 + b'"]}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == ("the body has 120,015 bytes; at most 108,736 are accepted "
                                                          "(it follows from --max-texts and --max-chars)")
    r = client.get("/classify")
    assert r.status_code == 405 and r.json() == {"error": "GET is not allowed on /classify; use POST"}
    r = client.post("/summarize", json={"texts": ["a"]})
    assert r.status_code == 404 and r.json()["error"].startswith("no endpoint /summarize; this server answers "
                                                                 "/classify, /embed, /health, /info")


def test_texts_longer_than_the_model_window_are_cut_with_a_warning(classifier):
    client, _, out = classifier
    long_text = "alice great " + "the " * 36  # 40 tokens with [CLS]/[SEP]: over the window of 32, under 48
    r = client.post("/classify", json={"texts": ["bob awful", long_text]})
    assert r.status_code == 200, r.text
    assert r.json()["warnings"] == ["texts[1]: 40 tokens, more than the model's window of 32: truncated"]
    assert r.json()["results"][1]["label"] == lmforge.pipeline("text-classification", model=out)(long_text)["label"]


# ---------------------------------------------------------------------------------------------- batching
def test_concurrent_requests_are_batched_and_answer_as_one_at_a_time(classifier):
    client, app, _ = classifier
    texts = [" ".join(["alice"] + ["the"] * (i % 9) + ["great" if i % 2 else "awful"]) for i in range(24)]
    alone = [client.post("/classify", json={"texts": [t]}).json()["results"][0] for t in texts]
    batcher = app.state.batchers["/classify"]
    before = batcher.batches

    async def together():
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=60) as c:
            responses = await asyncio.gather(*(c.post("/classify", json={"texts": [t]}) for t in texts))
        return [r.json()["results"][0] for r in responses]

    batched = asyncio.run(together())
    assert batcher.batches - before < len(texts)  # several requests shared a forward pass
    assert [b["label"] for b in batched] == [a["label"] for a in alone]
    assert all(close(b["score"], a["score"]) for a, b in zip(alone, batched, strict=True))


def test_concurrent_embeddings_equal_one_at_a_time(classifier):
    client, app, _ = classifier
    texts = [" ".join(["bob"] + ["the"] * i) for i in range(12)]
    options = [{}, {"layers": [-2, -1], "combine": "sum"}]  # two keys: never mixed in one forward pass
    bodies = [{"texts": [t], **options[i % 2]} for i, t in enumerate(texts)]
    alone = [client.post("/embed", json=b).json()["embeddings"][0] for b in bodies]
    before = app.state.batchers["/embed"].batches

    async def together():
        async with httpx.AsyncClient(base_url=str(client.base_url), timeout=60) as c:
            responses = await asyncio.gather(*(c.post("/embed", json=b) for b in bodies))
        return [r.json()["embeddings"][0] for r in responses]

    batched = asyncio.run(together())
    assert app.state.batchers["/embed"].batches - before < len(bodies)
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------- loading
def test_pickle_weights_are_refused(tmp_path, tiny_encoder_dir):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_encoder_dir / "config.json").read_text())
    (folder / "vocab.txt").write_text((tiny_encoder_dir / "vocab.txt").read_text())
    torch.save({"weight": torch.zeros(2)}, folder / "pytorch_model.bin")
    with pytest.raises(InputFileError, match="pytorch_model.bin, which lmforge does not read .pickle"):
        create_app(folder)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    torch.save({"weight": torch.zeros(2)}, hf / "pytorch_model.bin")
    with pytest.raises(InputFileError, match="convert it to safetensors"):
        create_app(hf)


def test_a_folder_without_tokenizer_or_with_bad_limits_is_a_clear_error(tmp_path, tiny_encoder_dir):
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((tiny_encoder_dir / name).read_bytes())
    with pytest.raises(InputFileError, match="no tokenizer"):
        create_app(folder)
    with pytest.raises(LmforgeError, match="max_texts=0"):
        create_app(tiny_encoder_dir, max_texts=0)
    with pytest.raises(LmforgeError, match="--max-batch must be >= 1"):
        create_app(tiny_encoder_dir, max_batch=0)
