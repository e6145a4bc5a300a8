"""``/docs`` works without internet (issue 23): Swagger UI's files come from the app itself, or, without the
``swagger-ui-bundle`` package, a self-contained page is written from the OpenAPI schema. Reproduction: FastAPI's
default page loaded Swagger UI from cdn.jsdelivr.net and rendered blank offline."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from lmforge.serve import create_app
from lmforge.serve import docs as serve_docs
from tests.serve import server_thread


def _references(page: str) -> list[str]:
    """Every URL the page makes a browser fetch or link to (src=, href=, url: in the script, CSS url())."""
    found = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page)
    found += re.findall(r"""["']url["']\s*:\s*["']([^"']+)["']""", page)
    found += re.findall(r"""url\(\s*["']?([^"')]+)""", page)
    return found


def _assert_offline(page: str) -> None:
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", page, flags=re.I), "the page names another host"
    for ref in _references(page):
        assert ref.startswith("/") and not ref.startswith("//"), f"{ref} is not served by the app itself"


@pytest.fixture(scope="module")
def embed_app(tiny_encoder_dir):
    return create_app(tiny_encoder_dir, max_batch=4, max_texts=4, max_chars=100, max_length=32)


def test_docs_serve_swagger_ui_from_the_app_itself(embed_app):
    assert serve_docs.swagger_assets() is not None, "swagger-ui-bundle comes with lmforge[serve]"
    with server_thread(embed_app) as url, httpx.Client(base_url=url, timeout=60) as client:
        r = client.get("/docs")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        _assert_offline(r.text)
        refs = _references(r.text)
        assert f"{serve_docs.ASSETS_PATH}/swagger-ui-bundle.js" in refs and serve_docs.OPENAPI_30_PATH in refs
        # Swagger UI 4 reads OpenAPI 3.0: the page gets the same schema in that dialect, /openapi.json stays 3.1
        schema, schema_30 = client.get("/openapi.json").json(), client.get(serve_docs.OPENAPI_30_PATH).json()
        assert schema["openapi"].startswith("3.1") and schema_30["openapi"] == "3.0.3"
        assert schema_30["paths"].keys() == schema["paths"].keys() and "\"null\"" not in json.dumps(schema_30)
        for ref in refs:  # everything the page loads is answered by this server
            got = client.get(ref)
            assert got.status_code == 200 and got.content, ref
        assert '"validatorUrl": null' in r.text  # Swagger UI's online validator badge is off
        assert client.get("/redoc").status_code == 404  # ReDoc is a CDN page: not served
        assert "/docs" not in client.get("/openapi.json").json()["paths"]


def test_without_swagger_ui_docs_is_a_self_contained_page_of_every_endpoint(tiny_encoder_dir, monkeypatch):
    monkeypatch.setattr("lmforge.serve.app.swagger_assets", lambda: None)
    app = create_app(tiny_encoder_dir, max_batch=4, max_texts=4, max_chars=100, max_length=32)
    with server_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        page = client.get("/docs").text
        schema = client.get("/openapi.json").json()
        assert client.get(f"{serve_docs.ASSETS_PATH}/swagger-ui-bundle.js").status_code == 404
    _assert_offline(page)
    assert "<script" not in page
    for path in schema["paths"]:
        assert f"<code>{path}</code>" in page
    for field in ("texts", "layers", "combine", "pooling", "word_pooling", "embeddings", "warnings"):
        assert f"<code>{field}</code>" in page
    assert "at most 4 items" in page and "at most 100 characters" in page  # the server's limits are shown
