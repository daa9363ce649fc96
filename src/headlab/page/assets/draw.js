// headlab's drawing of one head's pattern, shared by the report (report.js), the live explorer
// and the notebook view (heads.js); the grid of heads and a head's panel are grid.js's. Nodes
// are built with textContent, never innerHTML, so text from the model or the user shows as
// text. A "side" is {words, special, sink}: the rows and columns of a pattern; a "mat" is
// {p, colour, label}: one head's weights p[query][key] in [0, 1].

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}
function svgEl(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = String(text);
  return node;
}
// a layer's patterns arrive as base64 of round(255 * w) bytes, heads x rows x columns, in the
// report, the explorer and the notebook alike (headlab.models.analysis.pattern_bytes)
function decodeLayer(b64) {
  const text = atob(b64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}
function headMatrix(bytes, head, n) {
  const rows = [];
  for (let i = 0; i < n; i++) {
    const start = (head * n + i) * n;
    rows.push(Array.from(bytes.subarray(start, start + n), (v) => v / 255));
  }
  return rows;
}
// The one reader of a sentence (headlab.sentence/1, headlab.models.sentence_view.sentence_json)
// for the report, the explorer and the notebook: `side` its words ({words, special, sink}: the
// sink by grid.js's rule), `tokenSide` its tokens (null where they were left out, as in the
// report), `pattern(layer, head, tokens, norm)` one head's weights p[query][key] (decoded once,
// kept), `hasNorms` whether weights x value norm came too, and `notice` the one notice of a long
// input ("" for none).
function readSentence(d) {
  const sets = {
    words: d.patterns.map(decodeLayer),
    tokens: d.token_patterns ? d.token_patterns.map(decodeLayer) : null,
    normWords: d.norm_patterns ? d.norm_patterns.map(decodeLayer) : null,
    normTokens: d.norm_token_patterns ? d.norm_token_patterns.map(decodeLayer) : null,
  };
  const hasNorms = !!(sets.normWords && sets.normTokens);
  const kept = new Map();
  function pattern(layer, head, tokens, norm) {
    const key = [layer, head, !!tokens, !!(norm && hasNorms)].join(",");
    if (!kept.has(key)) {
      const set = norm && hasNorms ? (tokens ? sets.normTokens : sets.normWords)
        : (tokens ? sets.tokens : sets.words);
      kept.set(key, headMatrix(set[layer], head, tokens ? d.tokens.length : d.words.length));
    }
    return kept.get(key);
  }
  const cut = d.truncated;
  return {
    data: d,
    side: { words: d.words, special: d.special, sink: sinkOf(d) },
    tokenSide: d.tokens ? { words: d.tokens, special: d.token_special } : null,
    hasNorms: hasNorms,
    pattern: pattern,
    // words without [CLS]/[SEP] ("shown"; a page of an earlier version has only the total)
    notice: cut ? "Long input: showing the first " +
      (cut.shown === undefined ? d.words.length : cut.shown) + " of " + cut.words + " words" +
      (d.tokens ? " and " + d.tokens.length + " of " + cut.tokens + " tokens" : "") + "." : "",
  };
}
function fmt(v, digits) {
  return v === null || v === undefined ? "\u2013" : Number(v).toFixed(digits === undefined ? 3 : digits);
}
// head i of n in its own hue, for several heads drawn at once
function hueColour(i, n) { return "hsl(" + Math.round((360 * i) / n) + ",70%,45%)"; }

// Lines from each query word (left) to the key words (right), as thick as the weight; with
// opts.word >= 0 only that word's lines. opts.causal: a query's lines go only to itself and
// earlier words, and the words after the chosen one are greyed. opts.onWord(i): a word clicked.
function drawLines(side, mats, opts) {
  const n = side.words.length;
  const rowH = 22, width = 560, left = 150, right = width - 150;
  const svg = svgEl("svg", { width: width, height: n * rowH + 20, role: "img" });
  const picked = opts.word;
  for (const m of mats) {
    const p = m.p;
    for (let i = 0; i < n; i++) {
      if (picked >= 0 && i !== picked) continue;
      for (let j = 0; j < (opts.causal ? i + 1 : n); j++) {  // causal: keys up to the query
        const w = p[i][j];
        if (w < 0.02) continue;
        svg.appendChild(svgEl("line", {
          x1: left + 5, y1: 16 + i * rowH - 4, x2: right - 5, y2: 16 + j * rowH - 4,
          stroke: m.colour,
          "stroke-width": (picked >= 0 ? 6 : 3) * w,
          "stroke-opacity": picked >= 0 ? Math.min(1, 0.25 + w) : 0.6 * w,
          class: "link",
        }));
      }
    }
  }
  for (let i = 0; i < n; i++) {
    const cls = (side.special[i] ? "special " : "") + (i === picked ? "chosen" : "");
    const a = svgEl("text", { x: left, y: 16 + i * rowH, "text-anchor": "end", class: cls, "data-word": i }, side.words[i]);
    a.addEventListener("click", () => opts.onWord(i));
    svg.appendChild(a);
    const unseen = opts.causal && picked >= 0 && i > picked;  // later than the query: masked
    svg.appendChild(svgEl("text", {
      x: right, y: 16 + i * rowH, class: (side.special[i] ? "special" : "") + (unseen ? " future" : ""),
    }, side.words[i]));
  }
  return svg;
}

function heatCell(w, masked) {  // masked: a key after the query in a causal model
  if (masked) return el("td", { class: "masked", title: "masked: a later token" });
  const td = el("td", { title: fmt(w, 3) });
  td.style.background = "rgba(31,95,191," + w + ")";
  return td;
}

// One head: its whole matrix, queries down, keys across. Several heads: one row each, the
// chosen word's (opts.word, else the first). opts.causal hatches the masked upper triangle.
function drawHeatmap(side, mats, opts) {
  const t = el("table", { class: "heat" });
  const head = el("thead");
  const hr = el("tr");
  hr.appendChild(el("th"));
  side.words.forEach((w) => hr.appendChild(el("th", {}, w)));
  head.appendChild(hr);
  t.appendChild(head);
  const body = el("tbody");
  if (mats.length === 1) {
    const p = mats[0].p;
    side.words.forEach((w, i) => {
      const tr = el("tr");
      tr.appendChild(el("th", {}, w));
      p[i].forEach((x, j) => tr.appendChild(heatCell(x, opts.causal && j > i)));
      body.appendChild(tr);
    });
  } else {
    const i = opts.word >= 0 ? opts.word : 0;
    mats.forEach((m) => {
      const tr = el("tr");
      tr.appendChild(el("th", {}, m.label + " (" + side.words[i] + ")"));
      m.p[i].forEach((x, j) => tr.appendChild(heatCell(x, opts.causal && j > i)));
      body.appendChild(tr);
    });
  }
  t.appendChild(body);
  const wrap = el("div", { class: "heat-wrap" });
  wrap.appendChild(t);
  wrap.appendChild(heatScale());
  return wrap;
}

// the colour scale of every heatmap: attention weight from 0 to 1
function heatScale() {
  const scale = el("div", { class: "heat-scale", "aria-label": "colour scale: weight 0 to 1" });
  scale.appendChild(el("span", {}, "weight 0 "));
  [0, 0.25, 0.5, 0.75, 1].forEach((w) => {
    const swatch = el("i", { title: fmt(w, 2) });
    swatch.style.background = "rgba(31,95,191," + w + ")";
    scale.appendChild(swatch);
  });
  scale.appendChild(el("span", {}, " 1"));
  return scale;
}
