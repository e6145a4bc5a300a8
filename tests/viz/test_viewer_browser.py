"""The HTML viewer in headless Chromium: switching layer, head, attention and view draws the model's weights.

Needs selenium (dev extra) and the Debian packages chromium and chromium-driver (``make test`` installs them when
missing); skipped with the reason otherwise. Screenshots go to $LMFORGE_TEST_ARTIFACTS (default: the test's
tmp_path); their paths are printed.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.viz import PAIR, TEXT, save_tiny_model

BROWSER_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--window-size=1280,1000")


def _find(name: str, default: str) -> str | None:
    return default if Path(default).is_file() else shutil.which(name)


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium; it is part of the dev extra)")
    binary, driver_path = _find("chromium", "/usr/bin/chromium"), _find("chromedriver", "/usr/bin/chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("headless Chromium not found (chromium and chromedriver); `make test` installs the Debian "
                    "packages chromium and chromium-driver, or run: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    for arg in BROWSER_ARGS:
        options.add_argument(arg)
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Explicit binary and driver paths: Selenium does not try to download anything.
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def artifacts(tmp_path) -> Path:
    folder = Path(os.environ.get("LMFORGE_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _wait(driver, script: str, *args, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script, *args)
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for: {script}")
        time.sleep(0.02)


def _open(driver, path: Path) -> float:
    """Load the page; returns the seconds until the first selection was drawn."""
    driver.get_log("browser")  # drop messages of earlier pages
    start = time.perf_counter()
    driver.get(path.as_uri())
    _wait(driver, "return window.lmforgeViewer && window.lmforgeViewer.renders() > 0 && "
                  "!window.lmforgeViewer.busy()")
    return time.perf_counter() - start


def _choose(driver, **values) -> dict:
    """Pick values in the page's <select> elements as a user would (change events), wait, return current()."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    for control, value in values.items():
        Select(driver.find_element(By.ID, control)).select_by_value(str(value))
    checks = " && ".join(f"String(c.{k}) === {str(v)!r}" for k, v in values.items())
    return _wait(driver, f"const v = window.lmforgeViewer, c = v.current(); return !v.busy() && c && "
                         f"({checks or 'true'}) ? c : null")


def _drawn_cells(driver, selector: str, R: int, C: int) -> tuple[np.ndarray, int]:
    """The weights written on the drawn elements (data-row, data-col, data-w) as an (R, C) matrix (NaN = none)."""
    triples = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), "
        "e => [+e.dataset.row, +e.dataset.col, +e.dataset.w])", selector)
    out = np.full((R, C), np.nan)
    for r, c, w in triples:
        out[int(r), int(c)] = w
    return out, len(triples)


def _no_severe_errors(driver) -> None:
    try:
        logs = driver.get_log("browser")
    except Exception:  # noqa: BLE001 - some drivers do not support the log endpoint
        return
    severe = [entry for entry in logs if entry.get("level") == "SEVERE"]
    assert not severe, severe


def _screenshot(driver, folder: Path, name: str, record_property) -> Path:
    path = folder / name
    assert driver.save_screenshot(str(path))
    assert path.stat().st_size > 1000
    print(f"screenshot: {path}")
    record_property(name, str(path))
    return path


def test_encoder_viewer_draws_the_model_weights(browser, tmp_path, artifacts, record_property):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from lmforge.persistence import load_backbone
    from tests.viz.test_plots import run

    model_dir = save_tiny_model(tmp_path / "enc", "encoder")
    page = tmp_path / "encoder.html"
    assert run("attention", "--model", str(model_dir), "--text", TEXT, "--pair", PAIR, "--out", str(page)) == 0
    loaded = load_backbone(model_dir)
    enc = loaded.tokenizer(TEXT, PAIR)
    with torch.no_grad():
        out = loaded.model(torch.tensor([enc["input_ids"]]), token_type_ids=torch.tensor([enc["token_type_ids"]]),
                           output_attentions=True)
    expected = torch.stack([a[0] for a in out.attentions]).numpy()  # (L, H, T, T)
    T = expected.shape[-1]

    _open(browser, page)
    first = browser.execute_script("return window.lmforgeViewer.current()")
    assert (first["layer"], first["head"], first["view"]) == (0, 0, "matrix")
    np.testing.assert_allclose(first["weights"], expected[0, 0], atol=1e-6)

    current = _choose(browser, layer=1, head=1)
    np.testing.assert_allclose(current["weights"], expected[1, 1], atol=1e-6)
    cells, n = _drawn_cells(browser, "td.cell", T, T)
    assert n == T * T
    np.testing.assert_allclose(cells, expected[1, 1], atol=1e-6)
    rows = browser.execute_script("return Array.from(document.querySelectorAll('th.row'), e => e.textContent)")
    assert rows == loaded.tokenizer.convert_ids_to_tokens(enc["input_ids"])
    segment_b = browser.execute_script("return document.querySelectorAll('th.row.seg1').length")
    assert segment_b == sum(enc["token_type_ids"])

    # Hovering a cell shows its tokens and weight.
    cell = browser.find_element(By.CSS_SELECTOR, 'td.cell[data-row="2"][data-col="3"]')
    ActionChains(browser).move_to_element(cell).perform()
    tip = _wait(browser, "const t = document.getElementById('tooltip'); return t.hidden ? null : t.textContent")
    assert tip.startswith(f"{rows[2]} \u2192 {rows[3]}: ")
    assert abs(float(tip.rsplit(": ", 1)[1]) - expected[1, 1, 2, 3]) < 1e-6

    current = _choose(browser, head="mean")
    np.testing.assert_allclose(current["weights"], expected[1].mean(0), atol=1e-6)

    current = _choose(browser, layer=0, head=1, view="lines")
    lines, n = _drawn_cells(browser, "#lines line", T, T)
    assert n == T * T == current["lines"]  # every weight of a short input is a line
    np.testing.assert_allclose(lines, expected[0, 1], atol=1e-6)
    _screenshot(browser, artifacts, "viz-attention-encoder-lines.png", record_property)
    _no_severe_errors(browser)


def test_encoder_decoder_viewer_cross_and_causal_attention(browser, tmp_path, artifacts, record_property):
    from lmforge.persistence import load_backbone
    from tests.viz.test_plots import run

    model_dir = save_tiny_model(tmp_path / "s2s", "seq2seq")
    page = tmp_path / "seq2seq.html"
    assert run("attention", "--model", str(model_dir), "--text", TEXT, "--pair", PAIR, "--out", str(page)) == 0
    loaded = load_backbone(model_dir)
    tok = loaded.tokenizer
    src, tgt = tok.encode_ids(TEXT), [tok.cls_id, *tok.encode_ids(PAIR)]
    with torch.no_grad():
        out = loaded.model(torch.tensor([src]), torch.tensor([tgt]), output_attentions=True)

    _open(browser, page)
    current = _choose(browser, map=2, layer=2, head=0)
    assert current["name"] == "cross-attention"
    assert current["rows"] == tok.convert_ids_to_tokens(tgt) and current["cols"] == tok.convert_ids_to_tokens(src)
    np.testing.assert_allclose(current["weights"], out.cross_attentions[2][0, 0].numpy(), atol=1e-6)
    _screenshot(browser, artifacts, "viz-attention-cross.png", record_property)

    current = _choose(browser, map=1, layer=1, head=1, view="lines")
    causal = out.self_attentions[1][0, 1].numpy()
    assert current["name"] == "decoder causal self-attention"
    lines, n = _drawn_cells(browser, "#lines line", len(tgt), len(tgt))
    assert n == len(tgt) * (len(tgt) + 1) // 2  # masked (future) weights are not drawn
    drawn = ~np.isnan(lines)
    assert np.array_equal(drawn, np.tril(np.ones_like(drawn)))
    np.testing.assert_allclose(lines[drawn], causal[drawn], atol=1e-6)
    _no_severe_errors(browser)


@pytest.mark.slow
def test_minilm_512_tokens(browser, tmp_path, artifacts, minilm_dir, record_property):
    from lmforge.persistence import load_backbone
    from lmforge.viz.attention import collect_attention
    from lmforge.viz.html import write_attention_html

    loaded = load_backbone(minilm_dir)
    sentence = ("the quarterly profits of the media giant jumped as advertising sales recovered, while its "
                "internet unit lost subscribers to cheaper rivals. ")
    text = sentence * 40
    attn = collect_attention(loaded.model, loaded.tokenizer, text)  # cut to the model's 512 positions
    (m,) = attn.maps
    assert m.weights.shape == (6, 12, 512, 512)
    page = write_attention_html(attn, tmp_path / "minilm.html")  # auto precision: uint8 at this size
    size_mb = page.stat().st_size / 1e6
    assert size_mb < 30

    load_s = _open(browser, page)
    timings = {}
    for layer, head in ((5, 11), (3, "mean")):
        _choose(browser, layer=layer, head=head)
        timings[f"layer {layer} head {head}"] = browser.execute_script("return window.lmforgeViewer.current().renderMs")
    rows = browser.execute_script("return window.lmforgeViewer.current().weights.slice(0, 4)")
    expected = m.weights[3].mean(0)[:4]
    assert np.all(np.abs(np.array(rows) - expected) <= m.weights[3].max(-1).max(0)[:4, None] / 510 + 1e-6)
    assert browser.execute_script("return document.getElementById('matrix').width") >= 512
    _choose(browser, layer=5, head=11, view="lines")
    current = browser.execute_script("const c = window.lmforgeViewer.current(); return [c.lines, c.topk, c.renderMs]")
    assert current[:2] == [512 * 5, 5]  # top 5 keys per query for long inputs
    timings["lines, top 5"] = current[2]
    _screenshot(browser, artifacts, "viz-attention-minilm-512.png", record_property)
    _no_severe_errors(browser)
    report = ", ".join(f"{k} {v:.0f} ms" for k, v in timings.items())
    print(f"MiniLM 512 tokens: {size_mb:.1f} MB HTML; page load to first drawing {load_s:.2f} s; {report}")
    record_property("minilm_512_html_mb", round(size_mb, 2))
    record_property("minilm_512_render_ms", timings)
