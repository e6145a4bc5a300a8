"""A single self-contained HTML file to explore attention weights: no network, no CDN, inline CSS and JS.

File layout::

    <style> VIEWER_CSS </style>
    <script type="application/json" id="lmforge-data"> {payload} </script>
    <script> VIEWER_JS </script>

Payload (JSON)::

    {"format": "lmforge-attention", "version": 1, "title": str,
     "maps": [{"name", "rows", "cols", "rowSeg", "colSeg", "layers", "heads", "precision",
               "chunks": [[base64 per kept head] per kept layer]}]}

Each chunk is one (R, C) matrix, zlib-compressed (the browser inflates it with ``DecompressionStream``) and
base64-encoded, so the page decodes only the layer/head on screen (lazily, cached). Chunk bytes, little-endian:

* ``float32``: R * C float32, the exact weights;
* ``uint16`` / ``uint8``: R float32 row scales s_r (the row maxima), then R * C unsigned integers
  q = round(w / s_r * Q) with Q = 65535 / 255; w ~ q * s_r / Q, off by at most s_r / (2 Q).

``precision="auto"`` keeps exact float32 while all maps together hold at most ``EXACT_LIMIT`` weights (about
2 million: a 170-token input to a 6-layer, 12-head model) and switches to per-row ``uint8`` above; a 512-token input
to MiniLM (6 layers x 12 heads, 18.9 million weights) then makes a file of about 11 MB (float32 would take 93 MB).
"""

from __future__ import annotations

import base64
import html
import json
import re
import zlib
from pathlib import Path

import numpy as np

from lmforge.choices import VIEWER_PRECISIONS
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.io import atomic_write_text
from lmforge.viz.assets import VIEWER_CSS, VIEWER_JS
from lmforge.viz.attention import AttentionMap, AttentionSet

__all__ = ["EXACT_LIMIT", "PRECISIONS", "attention_html", "choose_precision", "decode_matrix", "encode_matrix",
           "read_attention_html", "write_attention_html"]

PRECISIONS = VIEWER_PRECISIONS
EXACT_LIMIT = 2**21
_LEVELS = {"uint16": 65535, "uint8": 255}
_DTYPES = {"uint16": "<u2", "uint8": "u1"}
_ZLIB_LEVEL = 1  # measured on MiniLM x 512 tokens: level 6 takes 3x longer for a file only 10% smaller
_DATA_ID = "lmforge-data"
_FORMAT = "lmforge-attention"


def choose_precision(attn: AttentionSet, precision: str = "auto") -> str:
    """The precision to store: ``precision`` itself, or for "auto" float32 up to EXACT_LIMIT weights, else uint8."""
    if precision not in PRECISIONS:
        raise LmforgeError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    total = sum(m.weights.size for m in attn.maps)
    return "float32" if total <= EXACT_LIMIT else "uint8"


def encode_matrix(w: np.ndarray, precision: str) -> bytes:
    """One (R, C) weight matrix -> the compressed chunk bytes (see the module docstring)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if precision == "float32":
        raw = w.astype("<f4").tobytes()
    else:
        levels = _LEVELS[precision]
        scale = w.max(axis=1).astype(np.float32)  # (R,)
        safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
        q = np.rint(np.clip(w / safe[:, None], 0.0, 1.0) * levels).astype(_DTYPES[precision])
        raw = scale.astype("<f4").tobytes() + q.tobytes()
    return zlib.compress(raw, _ZLIB_LEVEL)


def decode_matrix(chunk: bytes, R: int, C: int, precision: str) -> np.ndarray:
    """Inverse of ``encode_matrix``: (R, C) float32 (quantised precisions give the dequantised weights)."""
    raw = zlib.decompress(chunk)
    if precision == "float32":
        return np.frombuffer(raw, dtype="<f4", count=R * C).reshape(R, C).astype(np.float32)
    scale = np.frombuffer(raw, dtype="<f4", count=R)
    q = np.frombuffer(raw, dtype=_DTYPES[precision], count=R * C, offset=4 * R).reshape(R, C)
    return (q.astype(np.float32) * (scale[:, None] / np.float32(_LEVELS[precision]))).astype(np.float32)


def _map_payload(m: AttentionMap, precision: str) -> dict:
    chunks = [[base64.b64encode(encode_matrix(m.weights[li, hi], precision)).decode("ascii")
               for hi in range(len(m.heads))] for li in range(len(m.layers))]
    return {"name": m.name, "rows": m.rows, "cols": m.cols, "rowSeg": [int(s) for s in m.row_segments],
            "colSeg": [int(s) for s in m.col_segments], "layers": [int(i) for i in m.layers],
            "heads": [int(i) for i in m.heads], "precision": precision, "chunks": chunks}


def attention_html(attn: AttentionSet, *, precision: str = "auto") -> str:
    """The viewer page for ``attn`` as a string (see the module docstring for the layout).

    Args:
        attn: what ``collect_attention`` returned.
        precision: "auto", "float32" (exact), "uint16" or "uint8" (per-row quantised, for long inputs).

    Returns:
        The HTML text; it references no URL.
    """
    if not attn.maps:
        raise LmforgeError("no attention maps to show")
    chosen = choose_precision(attn, precision)
    payload = {"format": _FORMAT, "version": 1, "title": attn.title,
               "maps": [_map_payload(m, chosen) for m in attn.maps]}
    # "<" escaped inside the JSON so that no token text can close the <script> element.
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    title = html.escape(f"attention - {attn.title}")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n'
            f"<style>{VIEWER_CSS}</style>\n</head>\n<body>\n"
            f'<script type="application/json" id="{_DATA_ID}">{data}</script>\n'
            f"<script>{VIEWER_JS}</script>\n</body>\n</html>\n")


def write_attention_html(attn: AttentionSet, path: str | Path, *, precision: str = "auto") -> Path:
    """Write the viewer page to ``path`` (atomically); returns the path."""
    path = Path(path)
    atomic_write_text(path, attention_html(attn, precision=precision))
    return path


def read_attention_html(source: str | Path) -> AttentionSet:
    """Decode the weights embedded in a viewer page (a path, or the HTML text itself) back into an AttentionSet.

    Raises:
        InputFileError: the file is missing or holds no lmforge attention payload.
    """
    text = str(source)
    where = "the HTML text"
    if not text.lstrip().startswith("<"):
        path = Path(source)
        if not path.is_file():
            raise InputFileError(f"{path}: no such file")
        text, where = path.read_text(encoding="utf-8"), str(path)
    found = re.search(rf'<script type="application/json" id="{_DATA_ID}">(.*?)</script>', text, re.S)
    if found is None:
        raise InputFileError(f"{where}: no lmforge attention data (not written by `lmforge viz attention`?)")
    payload = json.loads(found.group(1))
    if payload.get("format") != _FORMAT:
        raise InputFileError(f"{where}: unknown payload format {payload.get('format')!r}")
    maps = []
    for m in payload["maps"]:
        R, C = len(m["rows"]), len(m["cols"])
        weights = np.stack([np.stack([decode_matrix(base64.b64decode(chunk), R, C, m["precision"])
                                      for chunk in layer]) for layer in m["chunks"]])  # (L, H, R, C)
        maps.append(AttentionMap(m["name"], m["rows"], m["cols"], m["layers"], m["heads"], weights,
                                 m["rowSeg"], m["colSeg"]))
    return AttentionSet(payload["title"], maps)
