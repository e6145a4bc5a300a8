"""The inline CSS and JavaScript of the attention viewer (``lmforge.viz.html``), kept as Python strings so they ship
inside the wheel with no package-data configuration. Nothing here loads anything from the network.

The page reads the JSON payload from ``<script id="lmforge-data">``, builds its controls (``#map``, ``#layer``,
``#head`` with an "all heads (mean)" option, ``#view``, ``#scale``, ``#topk``), inflates only the selected
layer/head chunk(s) (``DecompressionStream``, cached) and draws:

* the matrix: an HTML table (one ``td.cell`` per weight with ``data-row``, ``data-col``, ``data-w``) while rows
  and columns both number at most 64, else a ``<canvas id="matrix">`` (one pixel block per weight);
* the lines: an SVG (``#lines``) with the query tokens on the left, the key tokens on the right and one ``line``
  per weight (``data-row``, ``data-col``, ``data-w``, opacity = weight over the colour scale). With more than 64
  keys only the ``#topk`` strongest keys per query are drawn (default 5; 0 = all); weights of 0 (causal masking)
  are never drawn.

The colour scale (``#scale``) maps 0 to white and, by default, the selection's largest weight to dark blue; inputs
with more than 64 keys default to each row's own maximum (over hundreds of keys a few large weights, e.g. on [CLS],
would wash out the rest). Hovering a cell, a line or the canvas shows ``#tooltip`` with both tokens and the weight
(7 significant digits for float32 data, 4 and "~" for quantised data); hovering a token in the lines view shows
only its lines. ``window.lmforgeViewer`` exposes the state for scripts and tests: ``current()`` -> {map, name,
layer, head, view, scale, precision, rows, cols, weights (the selected matrix as rows of numbers; the lines view
draws its top-k part), lines (number drawn), topk, renderMs}, ``busy()``, ``renders()``,
``select({map, layer, head, view, scale, topk})`` (a Promise of ``current()``), ``loadMs`` and ``error``.
"""

from __future__ import annotations

__all__ = ["VIEWER_CSS", "VIEWER_JS"]

VIEWER_CSS = r"""
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1b1b1b; }
header { position: sticky; top: 0; background: #f7f7f9; border-bottom: 1px solid #ddd; padding: 8px 14px; z-index: 2; }
h1 { font-size: 16px; margin: 0 0 6px; font-weight: 600; }
.controls { display: flex; flex-wrap: wrap; gap: 6px 16px; align-items: center; }
.controls label { display: inline-flex; gap: 6px; align-items: center; }
.controls input[type=number] { width: 4.5em; }
#legend, #status { color: #555; font-size: 12px; margin-top: 4px; }
#status.error { color: #b00020; font-weight: 600; }
#area { padding: 12px 14px; overflow: auto; }
.seg1 { color: #c2410c; fill: #c2410c; }
table.grid { border-collapse: collapse; font-size: 12px; }
table.grid td.cell { width: 16px; height: 16px; min-width: 16px; padding: 0; border: 1px solid #fff; }
table.grid td.cell:hover { outline: 2px solid #e11d48; }
table.grid th { font-weight: normal; white-space: nowrap; padding: 0 4px; }
table.grid th.row { text-align: right; }
table.grid th.col { vertical-align: bottom; height: 1px; }
table.grid th.col span { writing-mode: vertical-rl; transform: rotate(180deg); display: inline-block; padding: 2px 0; }
.canvas-wrap { display: inline-block; }
.canvas-wrap p { margin: 0 0 4px; color: #555; font-size: 12px; }
#matrix { image-rendering: pixelated; border: 1px solid #ccc; cursor: crosshair; }
#lines { font-size: 12px; }
#lines line { stroke: #08306b; stroke-width: 1.5; pointer-events: stroke; }
#lines line:hover { stroke: #e11d48; }
#lines.focus line { visibility: hidden; }
#lines.focus line.hi { visibility: visible; }
#lines text.tok { cursor: default; }
#lines text.tok:hover { font-weight: 700; }
#lines text.caption { fill: #555; font-size: 11px; }
#tooltip { position: fixed; pointer-events: none; background: #111; color: #fff; font-size: 12px; padding: 3px 7px;
           border-radius: 3px; white-space: nowrap; z-index: 5; }
"""

VIEWER_JS = r"""
(() => {
  "use strict";
  const GRID_LIMIT = 64;       // matrix as an HTML table up to this many rows and columns; a canvas above
  const LINES_ALL_LIMIT = 64;  // lines view: every key up to this many keys; top-k per query above
  const DEFAULT_TOPK = 5;
  const CACHE_SIZE = 48;       // decoded matrices kept (each R * C float32)
  const data = JSON.parse(document.getElementById("lmforge-data").textContent);
  const esc = (s) => String(s).replace(/[&<>"']/g,
    (ch) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;"}[ch]));

  document.body.insertAdjacentHTML("afterbegin", `
    <header>
      <h1 id="title"></h1>
      <div class="controls">
        <label>attention <select id="map"></select></label>
        <label>layer <select id="layer"></select></label>
        <label>head <select id="head"></select></label>
        <label>view <select id="view">
          <option value="matrix">matrix</option><option value="lines">token-to-token lines</option></select></label>
        <label>colour scale <select id="scale">
          <option value="max">max of the selection</option><option value="row">max of each row</option>
          <option value="abs">absolute (0 to 1)</option></select></label>
        <label title="lines view: strongest keys drawn per query (0 = all)">lines per query
          <input id="topk" type="number" min="0" step="1" value="0"></label>
      </div>
      <div id="legend"></div>
      <div id="status">loading...</div>
    </header>
    <main id="area"></main>
    <div id="tooltip" hidden></div>`);
  const ui = {};
  for (const id of ["title", "map", "layer", "head", "view", "scale", "topk", "legend", "status", "area", "tooltip"]) {
    ui[id] = document.getElementById(id);
  }
  ui.title.textContent = data.title;

  function fillSelect(select, items) {
    select.textContent = "";
    for (const [value, label] of items) {
      const option = document.createElement("option");
      option.value = String(value);
      option.textContent = label;
      select.appendChild(option);
    }
  }

  let shownLong = null;  // whether the previous map was a long one (its defaults are kept while that holds)

  function fillLayersHeads() {
    const m = data.maps[+ui.map.value];
    fillSelect(ui.layer, m.layers.map((l) => [l, `layer ${l}`]));
    const heads = m.heads.map((h) => [h, `head ${h}`]);
    if (m.heads.length > 1) heads.push(["mean", "all heads (mean)"]);
    fillSelect(ui.head, heads);
    const long = m.cols.length > LINES_ALL_LIMIT;
    if (long !== shownLong) {
      ui.topk.value = long ? DEFAULT_TOPK : 0;
      ui.scale.value = long ? "row" : "max";  // over hundreds of keys a few large weights would wash out the rest
      shownLong = long;
    }
    const cross = m.name.includes("cross");
    ui.legend.textContent = `rows: ${m.rows.length} ${cross ? "target" : "query"} tokens; columns: ` +
      `${m.cols.length} ${cross ? "source" : "key"} tokens; weights stored as ${m.precision}` +
      (m.rowSeg.includes(1) || m.colSeg.includes(1) ? "; second segment in orange" : "");
  }
  fillSelect(ui.map, data.maps.map((m, i) => [i, m.name]));

  // ------------------------------------------------------------------ decoding (lazy, cached)
  const cache = new Map();

  function base64Bytes(text) {
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  async function inflate(bytes) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream; open the file in a current Chromium, " +
                      "Firefox (113+) or Safari (16.4+)");
    }
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  async function headMatrix(mi, li, hi) {
    const key = `${mi}/${li}/${hi}`;
    if (cache.has(key)) {
      const hit = cache.get(key);
      cache.delete(key);  // re-insert: most recently used last
      cache.set(key, hit);
      return hit;
    }
    const m = data.maps[mi], R = m.rows.length, C = m.cols.length;
    const raw = await inflate(base64Bytes(m.chunks[li][hi]));
    const buffer = raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength);
    let w;
    if (m.precision === "float32") {
      w = new Float32Array(buffer, 0, R * C);
    } else {
      const levels = m.precision === "uint16" ? 65535 : 255;
      const scale = new Float32Array(buffer, 0, R);
      const q = m.precision === "uint16" ? new Uint16Array(buffer, 4 * R, R * C) : new Uint8Array(buffer, 4 * R, R * C);
      w = new Float32Array(R * C);
      for (let r = 0; r < R; r++) {
        const f = scale[r] / levels;
        for (let c = 0, o = r * C; c < C; c++) w[o + c] = q[o + c] * f;
      }
    }
    cache.set(key, w);
    if (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value);
    return w;
  }

  async function meanMatrix(mi, li) {
    const m = data.maps[mi], n = m.rows.length * m.cols.length, out = new Float64Array(n);
    for (let hi = 0; hi < m.heads.length; hi++) {
      const w = await headMatrix(mi, li, hi);
      for (let i = 0; i < n; i++) out[i] += w[i];
    }
    for (let i = 0; i < n; i++) out[i] /= m.heads.length;
    return out;
  }

  // ------------------------------------------------------------------ drawing
  function selection() {
    const mi = +ui.map.value, m = data.maps[mi];
    const layer = +ui.layer.value, head = ui.head.value === "mean" ? "mean" : +ui.head.value;
    return {mi, m, layer, li: m.layers.indexOf(layer), head, hi: head === "mean" ? -1 : m.heads.indexOf(head),
            view: ui.view.value, scale: ui.scale.value, topk: Math.max(0, Math.floor(+ui.topk.value || 0))};
  }

  function rowNorms(w, R, C, mode) {
    const norm = new Float64Array(R).fill(1);
    if (mode === "abs") return norm;
    let all = 0;
    for (let r = 0; r < R; r++) {
      let top = 0;
      for (let c = 0, o = r * C; c < C; c++) if (w[o + c] > top) top = w[o + c];
      norm[r] = top;
      if (top > all) all = top;
    }
    if (mode === "max") norm.fill(all);
    for (let r = 0; r < R; r++) if (!(norm[r] > 0)) norm[r] = 1;
    return norm;
  }

  // white -> dark blue (#08306b)
  function rgb(t) {
    t = Math.min(1, Math.max(0, t));
    return [Math.round(255 - 247 * t), Math.round(255 - 207 * t), Math.round(255 - 148 * t)];
  }

  function drawGrid(s, w, norm) {
    const m = s.m, R = m.rows.length, C = m.cols.length;
    const parts = ['<table class="grid" id="grid"><thead><tr><th></th>'];
    for (let c = 0; c < C; c++) {
      parts.push(`<th class="col seg${m.colSeg[c]}" data-col="${c}"><span>${esc(m.cols[c])}</span></th>`);
    }
    parts.push("</tr></thead><tbody>");
    for (let r = 0; r < R; r++) {
      parts.push(`<tr><th class="row seg${m.rowSeg[r]}" data-row="${r}">${esc(m.rows[r])}</th>`);
      for (let c = 0; c < C; c++) {
        const v = w[r * C + c], [red, green, blue] = rgb(v / norm[r]);
        parts.push(`<td class="cell" data-row="${r}" data-col="${c}" data-w="${v}" ` +
                   `style="background:rgb(${red},${green},${blue})"></td>`);
      }
      parts.push("</tr>");
    }
    parts.push("</tbody></table>");
    ui.area.innerHTML = parts.join("");
    return {cells: R * C};
  }

  function drawCanvas(s, w, norm) {
    const m = s.m, R = m.rows.length, C = m.cols.length;
    const px = Math.max(1, Math.min(16, Math.floor(1024 / Math.max(R, C))));
    const canvas = document.createElement("canvas");
    canvas.id = "matrix";
    canvas.width = C * px;
    canvas.height = R * px;
    canvas.dataset.rows = R;
    canvas.dataset.cols = C;
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(C * px, R * px), d = image.data, width = C * px;
    for (let r = 0; r < R; r++) {
      for (let c = 0; c < C; c++) {
        const [red, green, blue] = rgb(w[r * C + c] / norm[r]);
        for (let dy = 0; dy < px; dy++) {
          let o = ((r * px + dy) * width + c * px) * 4;
          for (let dx = 0; dx < px; dx++, o += 4) {
            d[o] = red; d[o + 1] = green; d[o + 2] = blue; d[o + 3] = 255;
          }
        }
      }
    }
    ctx.putImageData(image, 0, 0);
    const wrap = document.createElement("div");
    wrap.className = "canvas-wrap";
    const caption = document.createElement("p");
    caption.textContent = `${R} rows x ${C} columns (too many for labels: hover to read tokens and weights)`;
    wrap.append(caption, canvas);
    ui.area.replaceChildren(wrap);
    return {cells: R * C};
  }

  function topKeys(w, r, C, k) {
    const idx = Array.from({length: C}, (_, c) => c);
    if (k >= C) return idx;
    const o = r * C;
    idx.sort((a, b) => w[o + b] - w[o + a]);
    return idx.slice(0, k);
  }

  function drawLines(s, w, norm) {
    const m = s.m, R = m.rows.length, C = m.cols.length, k = s.topk > 0 ? Math.min(s.topk, C) : C;
    const step = 18, top = 30, xl = 170, xr = 430;
    const height = top + Math.max(R, C) * step + 10, width = xr + 180;
    const yr = (r) => top + r * step, yc = (c) => top + c * step;
    const parts = [`<svg id="lines" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">`,
                   `<text class="caption" x="${xl}" y="14" text-anchor="end">queries (rows)</text>`,
                   `<text class="caption" x="${xr}" y="14">keys (columns)</text><g>`];
    let count = 0;
    for (let r = 0; r < R; r++) {
      for (const c of topKeys(w, r, C, k)) {
        const v = w[r * C + c];
        if (!(v > 0)) continue;  // masked (causal) weights are not lines
        const opacity = Math.min(1, v / norm[r]);
        parts.push(`<line x1="${xl}" y1="${yr(r)}" x2="${xr}" y2="${yc(c)}" stroke-opacity="${opacity.toFixed(4)}" ` +
                   `data-row="${r}" data-col="${c}" data-w="${v}"></line>`);
        count++;
      }
    }
    parts.push("</g>");
    for (let r = 0; r < R; r++) {
      parts.push(`<text class="tok q seg${m.rowSeg[r]}" x="${xl - 6}" y="${yr(r) + 4}" text-anchor="end" ` +
                 `data-row="${r}">${esc(m.rows[r])}</text>`);
    }
    for (let c = 0; c < C; c++) {
      parts.push(`<text class="tok k seg${m.colSeg[c]}" x="${xr + 6}" y="${yc(c) + 4}" data-col="${c}">` +
                 `${esc(m.cols[c])}</text>`);
    }
    parts.push("</svg>");
    ui.area.innerHTML = parts.join("");
    return {lines: count, k};
  }

  // ------------------------------------------------------------------ render loop
  let drawn = null, busy = false, pending = false, renders = 0;
  const viewer = {loadMs: null, error: null};

  async function render() {
    if (busy) {
      pending = true;
      return;
    }
    busy = true;
    try {
      do {
        pending = false;
        const t0 = performance.now();
        const s = selection();
        const w = s.head === "mean" ? await meanMatrix(s.mi, s.li) : await headMatrix(s.mi, s.li, s.hi);
        const R = s.m.rows.length, C = s.m.cols.length, norm = rowNorms(w, R, C, s.scale);
        let info;
        if (s.view === "lines") info = drawLines(s, w, norm);
        else if (R <= GRID_LIMIT && C <= GRID_LIMIT) info = drawGrid(s, w, norm);
        else info = drawCanvas(s, w, norm);
        const ms = performance.now() - t0;
        drawn = {s, w, info, ms};
        renders++;
        const headText = s.head === "mean" ? "mean of heads" : `head ${s.head}`;
        const linesText = info.lines === undefined ? "" :
          `; ${info.lines} lines (${info.k >= C ? "all keys" : `top ${info.k} keys`} per query)`;
        ui.status.className = "";
        ui.status.textContent = `${s.m.name}, layer ${s.layer}, ${headText}: ${R} x ${C}${linesText}; ` +
                                `drawn in ${ms.toFixed(1)} ms`;
      } while (pending);
    } catch (err) {
      viewer.error = String(err && err.message || err);
      ui.status.className = "error";
      ui.status.textContent = `cannot draw: ${viewer.error}`;
      console.error("lmforge viewer:", err);
    } finally {
      busy = false;
      document.body.dataset.renders = String(renders);
    }
  }

  // ------------------------------------------------------------------ tooltip and highlighting
  function format(v, m) {
    return m.precision === "float32" ? v.toPrecision(7) : `~${v.toPrecision(4)} (${m.precision}, quantised per row)`;
  }

  function showTip(e, r, c, v) {
    const m = drawn.s.m;
    ui.tooltip.textContent = `${m.rows[r]} \u2192 ${m.cols[c]}: ${format(v, m)}`;
    ui.tooltip.style.left = `${e.clientX + 14}px`;
    ui.tooltip.style.top = `${e.clientY + 14}px`;
    ui.tooltip.hidden = false;
  }

  ui.area.addEventListener("mousemove", (e) => {
    if (!drawn) return;
    const t = e.target;
    if (t.dataset && t.dataset.w !== undefined) {
      showTip(e, +t.dataset.row, +t.dataset.col, +t.dataset.w);
    } else if (t.id === "matrix") {
      const box = t.getBoundingClientRect(), R = drawn.s.m.rows.length, C = drawn.s.m.cols.length;
      const r = Math.min(R - 1, Math.floor((e.clientY - box.top) / box.height * R));
      const c = Math.min(C - 1, Math.floor((e.clientX - box.left) / box.width * C));
      showTip(e, r, c, drawn.w[r * C + c]);
    } else {
      ui.tooltip.hidden = true;
    }
  });
  ui.area.addEventListener("mouseleave", () => { ui.tooltip.hidden = true; });

  function highlight(e, on) {
    const t = e.target, svg = document.getElementById("lines");
    if (!svg || !t.classList || !t.classList.contains("tok")) return;
    const attr = t.classList.contains("q") ? "data-row" : "data-col";
    const value = t.getAttribute(attr);
    svg.classList.toggle("focus", on);
    for (const line of svg.querySelectorAll(`line[${attr}="${value}"]`)) line.classList.toggle("hi", on);
  }
  ui.area.addEventListener("mouseover", (e) => highlight(e, true));
  ui.area.addEventListener("mouseout", (e) => highlight(e, false));

  // ------------------------------------------------------------------ controls and the scripting API
  ui.map.addEventListener("change", () => { fillLayersHeads(); render(); });
  for (const id of ["layer", "head", "view", "scale", "topk"]) ui[id].addEventListener("change", render);

  viewer.busy = () => busy || pending;
  viewer.renders = () => renders;
  viewer.current = () => {
    if (!drawn) return null;
    const {s, w, info, ms} = drawn, R = s.m.rows.length, C = s.m.cols.length, weights = [];
    for (let r = 0; r < R; r++) weights.push(Array.from(w.subarray(r * C, (r + 1) * C)));
    return {map: s.mi, name: s.m.name, layer: s.layer, head: s.head, view: s.view, scale: s.scale,
            precision: s.m.precision, rows: s.m.rows, cols: s.m.cols, weights, lines: info.lines ?? null,
            topk: info.k ?? null, renderMs: ms};
  };
  viewer.select = async (options) => {
    const o = options || {};
    if (o.map !== undefined) { ui.map.value = String(o.map); fillLayersHeads(); }
    for (const id of ["layer", "head", "view", "scale", "topk"]) if (o[id] !== undefined) ui[id].value = String(o[id]);
    await render();
    while (busy || pending) await new Promise((done) => setTimeout(done, 5));
    return viewer.current();
  };
  window.lmforgeViewer = viewer;

  fillLayersHeads();
  render().then(() => { viewer.loadMs = performance.now(); });
})();
"""
