"use strict";
// headlab report: everything below builds DOM nodes with textContent, never innerHTML, so any
// text from the model, the data or the user shows as text.
(function () {
  const data = JSON.parse(document.getElementById("headlab-data").textContent);
  const COLOURS = {
    positional: "#4e79a7", delimiter: "#bab0ac", "rare-token": "#edc948", syntactic: "#59a14f",
    coreference: "#e15759", broad: "#f28e2b", induction: "#b07aa1", unclassified: "#ffffff",
  };
  const LETTERS = {
    positional: "P", delimiter: "D", "rare-token": "R", syntactic: "S", coreference: "C",
    broad: "B", induction: "I", unclassified: "\u00b7",
  };
  const roles = data.roles;
  const state = { sentence: data.focus.sentence, layer: 0, head: 0, mode: "lines", word: -1 };

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
  function fmt(v, digits) {
    return v === null || v === undefined ? "\u2013" : Number(v).toFixed(digits === undefined ? 3 : digits);
  }
  // a share in % with its 95% interval: "57.5 [55.3-59.7]"
  function pct(v, interval) {
    if (v === null || v === undefined) return "\u2013";
    return fmt(100 * v, 1) + (interval && interval[0] !== null
      ? " [" + fmt(100 * interval[0], 1) + "\u2013" + fmt(100 * interval[1], 1) + "]" : "");
  }
  function sci(v) {
    return v === null || v === undefined ? "\u2013" : Number(v).toPrecision(2);
  }
  // heads of each layer: fewer in some layers of a model pruned layer by layer
  const layerHeads = roles.heads_in_layer || Array(roles.layers).fill(roles.heads_per_layer);
  const firstHead = layerHeads.map((n, l) => layerHeads.slice(0, l).reduce((a, b) => a + b, 0));
  function headInfo(layer, head) {
    return head < layerHeads[layer] ? roles.heads[firstHead[layer] + head] : null;
  }
  function table(headers, rows) {
    const t = el("table", { class: "data" });
    const tr = el("tr");
    headers.forEach((h) => tr.appendChild(el("th", {}, h)));
    t.appendChild(tr);
    rows.forEach((r) => {
      const row = el("tr");
      r.forEach((c) => row.appendChild(el("td", {}, c)));
      t.appendChild(row);
    });
    return t;
  }

  // ---------------------------------------------------------------- header
  document.getElementById("model").textContent = data.model;
  const counts = Object.entries(roles.role_counts).filter(([, n]) => n > 0)
    .map(([r, n]) => r + " " + n).join(", ");
  document.getElementById("summary").textContent =
    data.layers + " layers \u00d7 " + (roles.heads_in_layer && new Set(layerHeads).size > 1
      ? "[" + layerHeads.join(", ") + "] heads (pruned layer by layer)" : data.heads + " heads") +
    ". Heads per dominant role: " + counts +
    (roles.folds
      ? ". Stability is the share of " + roles.folds + " folds of documents that give a head " +
        "its role; " + (roles.unstable || 0) + " heads below " +
        fmt(100 * roles.thresholds.stable, 0) + "% are shown unclassified."
      : ". Roles are tendencies: stability is the share of " + roles.replicates +
        " bootstrap resamples that give a head the same role.");

  // ---------------------------------------------------------------- grid
  const legend = document.getElementById("legend");
  Object.keys(COLOURS).forEach((r) => {
    const s = el("span");
    const swatch = el("i");
    swatch.style.background = COLOURS[r];
    s.appendChild(swatch);
    s.appendChild(document.createTextNode(LETTERS[r] + " " + r));
    legend.appendChild(s);
  });
  const grid = el("table");
  const top = el("tr");
  top.appendChild(el("th", {}, "layer \\ head"));
  for (let h = 0; h < roles.heads_per_layer; h++) top.appendChild(el("th", {}, h));
  grid.appendChild(top);
  for (let l = 0; l < roles.layers; l++) {
    const tr = el("tr");
    tr.appendChild(el("th", {}, l));
    for (let h = 0; h < roles.heads_per_layer; h++) {
      const info = headInfo(l, h);
      if (info === null) {
        tr.appendChild(el("td", { class: "pruned", title: "layer " + l + ", head " + h + ": pruned away" }, "\u2013"));
        continue;
      }
      const b = el("button", {
        "data-layer": l, "data-head": h,
        title: "layer " + l + ", head " + h + ": " + info.role +
          (info.stability === null ? "" : " (stability " + fmt(info.stability, 2) + ")"),
      }, LETTERS[info.role]);
      b.style.background = COLOURS[info.role];
      b.style.opacity = info.stability === null ? 1 : 0.35 + 0.65 * info.stability;
      b.addEventListener("mouseenter", () => showDetails(l, h));
      b.addEventListener("click", () => selectHead(l, h));
      const td = el("td");
      td.appendChild(b);
      tr.appendChild(td);
    }
    grid.appendChild(tr);
  }
  document.getElementById("grid").appendChild(grid);

  function strongestLink(sentence, layer, head) {
    const p = sentence.patterns[layer][head];
    let best = null;
    for (let i = 0; i < p.length; i++) {
      if (sentence.special[i]) continue;
      for (let j = 0; j < p.length; j++) {
        if (i === j || sentence.special[j]) continue;
        if (best === null || p[i][j] > best[2]) best = [i, j, p[i][j]];
      }
    }
    return best;
  }

  function showDetails(layer, head) {
    const info = headInfo(layer, head);
    const box = document.getElementById("details");
    box.replaceChildren();
    box.appendChild(el("h3", {}, "Layer " + layer + ", head " + head + ": " + info.role +
      (info.detail ? " (" + info.detail + ")" : "")));
    box.appendChild(el("p", {}, "score " + fmt(info.score) + ", baseline " + fmt(info.baseline) +
      ", margin " + fmt(info.margin) + ", stability " + fmt(info.stability, 2) +
      (info.roles.length > 1 ? "; also clears the bar for: " + info.roles.slice(1).join(", ") : "")));
    const ev = info.evidence;
    if (ev && ev.interval) {
      box.appendChild(el("p", {}, "Decided by " + (ev.relation
        ? ev.relation + " " + ev.direction.replaceAll("_", " ") : "coreference (GAP)") + ": " +
        pct(ev.accuracy, ev.interval) + "% against the baseline's " +
        pct(ev.baseline, ev.baseline_interval) + "% on " + ev.count +
        (ev.relation ? " arcs" : " pronouns") + "; exact McNemar p = " + sci(ev.p) +
        ", Benjamini-Hochberg q = " + sci(ev.q) + " (95% Wilson intervals over documents)."));
    }
    if (info.stable === false) {
      box.appendChild(el("p", { class: "muted" }, "Measured role on all the data: " +
        info.measured_role + "; not replicated in enough folds, so shown unclassified."));
    }
    const rows = Object.entries(info.scores).map(([k, v]) => [k, fmt(v)]);
    box.appendChild(table(["score", "value"], rows));
    box.appendChild(el("p", { class: "muted" }, "Strongest word-to-word link of this head in each example:"));
    const list = el("ul", { class: "examples" });
    data.sentences.forEach((s) => {
      const link = strongestLink(s, layer, head);
      if (!link) return;
      const item = el("li");
      item.appendChild(el("b", {}, s.words[link[0]] + " \u2192 " + s.words[link[1]]));
      item.appendChild(document.createTextNode(" " + fmt(link[2], 2) + " in \u201c" + s.text + "\u201d"));
      list.appendChild(item);
    });
    box.appendChild(list);
  }

  function selectHead(layer, head) {
    state.layer = layer;
    state.head = head;
    document.querySelectorAll("#grid button.selected").forEach((b) => b.classList.remove("selected"));
    const b = document.querySelector('#grid button[data-layer="' + layer + '"][data-head="' + head + '"]');
    if (b) b.classList.add("selected");
    showDetails(layer, head);
    document.getElementById("layer").value = String(layer);
    fillHeads();
    document.getElementById("head").value = String(head);
    renderViewer();
  }

  // ---------------------------------------------------------------- viewer
  const sentenceSel = document.getElementById("sentence");
  data.sentences.forEach((s, i) => sentenceSel.appendChild(el("option", { value: i }, s.text)));
  const layerSel = document.getElementById("layer");
  for (let l = 0; l < data.layers; l++) layerSel.appendChild(el("option", { value: l }, l));
  const headSel = document.getElementById("head");
  function fillHeads() {  // the chosen layer's heads
    headSel.replaceChildren(el("option", { value: "all" }, "all heads"));
    for (let h = 0; h < layerHeads[state.layer]; h++) headSel.appendChild(el("option", { value: h }, h));
    if (state.head !== "all" && state.head >= layerHeads[state.layer]) state.head = "all";
  }
  fillHeads();
  const modeSel = document.getElementById("mode");
  sentenceSel.addEventListener("change", () => { state.sentence = +sentenceSel.value; state.word = -1; renderViewer(); });
  layerSel.addEventListener("change", () => { state.layer = +layerSel.value; fillHeads(); renderViewer(); });
  headSel.addEventListener("change", () => {
    state.head = headSel.value === "all" ? "all" : +headSel.value;
    if (state.head !== "all") showDetails(state.layer, state.head);
    renderViewer();
  });
  modeSel.addEventListener("change", () => { state.mode = modeSel.value; renderViewer(); });

  function headColour(h) { return "hsl(" + Math.round((360 * h) / data.heads) + ",70%,45%)"; }

  function renderLines(s, heads) {
    const n = s.words.length;
    const rowH = 22, width = 560, left = 150, right = width - 150;
    const svg = svgEl("svg", { width: width, height: n * rowH + 20, role: "img" });
    const picked = state.word;
    for (const h of heads) {
      const p = s.patterns[state.layer][h];
      for (let i = 0; i < n; i++) {
        if (picked >= 0 && i !== picked) continue;
        for (let j = 0; j < n; j++) {
          const w = p[i][j];
          if (w < 0.02) continue;
          svg.appendChild(svgEl("line", {
            x1: left + 5, y1: 16 + i * rowH - 4, x2: right - 5, y2: 16 + j * rowH - 4,
            stroke: heads.length > 1 ? headColour(h) : "#1f5fbf",
            "stroke-width": (picked >= 0 ? 6 : 3) * w,
            "stroke-opacity": picked >= 0 ? Math.min(1, 0.25 + w) : 0.6 * w,
            class: "link",
          }));
        }
      }
    }
    for (let i = 0; i < n; i++) {
      const cls = (s.special[i] ? "special " : "") + (i === picked ? "chosen" : "");
      const a = svgEl("text", { x: left, y: 16 + i * rowH, "text-anchor": "end", class: cls, "data-word": i }, s.words[i]);
      a.addEventListener("click", () => { state.word = state.word === i ? -1 : i; renderViewer(); });
      svg.appendChild(a);
      svg.appendChild(svgEl("text", { x: right, y: 16 + i * rowH, class: s.special[i] ? "special" : "" }, s.words[i]));
    }
    return svg;
  }

  function cell(w) {
    const td = el("td", { title: fmt(w, 3) });
    td.style.background = "rgba(31,95,191," + w + ")";
    return td;
  }

  function renderHeatmap(s, heads) {
    const t = el("table", { class: "heat" });
    const head = el("thead");
    const hr = el("tr");
    hr.appendChild(el("th"));
    s.words.forEach((w) => hr.appendChild(el("th", {}, w)));
    head.appendChild(hr);
    t.appendChild(head);
    const body = el("tbody");
    if (heads.length === 1) {
      const p = s.patterns[state.layer][heads[0]];
      s.words.forEach((w, i) => {
        const tr = el("tr");
        tr.appendChild(el("th", {}, w));
        p[i].forEach((x) => tr.appendChild(cell(x)));
        body.appendChild(tr);
      });
    } else {
      const i = state.word >= 0 ? state.word : 0;
      heads.forEach((h) => {
        const tr = el("tr");
        tr.appendChild(el("th", {}, "head " + h + " (" + s.words[i] + ")"));
        s.patterns[state.layer][h][i].forEach((x) => tr.appendChild(cell(x)));
        body.appendChild(tr);
      });
    }
    t.appendChild(body);
    return t;
  }

  function renderViewer() {
    const s = data.sentences[state.sentence];
    sentenceSel.value = String(state.sentence);
    layerSel.value = String(state.layer);
    headSel.value = String(state.head);
    const heads = state.head === "all" ? [...Array(layerHeads[state.layer]).keys()] : [state.head];
    const view = document.getElementById("viewer");
    view.replaceChildren(state.mode === "lines" ? renderLines(s, heads) : renderHeatmap(s, heads));
    if (state.mode === "lines" && heads.length > 1) {
      const key = el("p", { class: "muted" }, "colours: ");
      heads.forEach((h) => {
        const tag = el("span", {}, "head " + h + " ");
        tag.style.color = headColour(h);
        key.appendChild(tag);
      });
      view.appendChild(key);
    }
    view.setAttribute("data-layer", state.layer);
    view.setAttribute("data-head", state.head);
    document.getElementById("notice").textContent = s.truncated
      ? "Long input: showing the first " + s.words.length + " of " + s.total_words + " words."
      : "";
    const w = state.word >= 0 ? s.words[state.word] : null;
    document.getElementById("focus-note").textContent = w
      ? "Lines show where \u201c" + w + "\u201d sends its attention in layer " + state.layer +
        (state.head === "all" ? ", every head in its own colour." : ", head " + state.head + ".") +
        " Click another word to follow it, or the same word to show all."
      : "Click a word on the left to follow its attention.";
  }

  // ---------------------------------------------------------------- tables
  // the a-priori relation set first, in its order; the others (marked *) after, when frequent
  const set = roles.relation_set || [];
  const minArcs = roles.thresholds.min_relation_count || 0;
  const rank = (r) => (set.includes(r.relation) ? set.indexOf(r.relation) : set.length);
  const rel = roles.relations.filter((r) => r.in_set !== false || r.count >= minArcs)
    .sort((a, b) => rank(a) - rank(b) || a.relation.localeCompare(b.relation));
  document.getElementById("relations").appendChild(table(
    ["relation", "direction", "best head", "accuracy % [95% CI]", "fixed-offset baseline %",
      "arcs", "q (BH)"],
    rel.map((r) => [r.relation + (r.in_set === false ? " *" : ""), r.direction.replaceAll("_", " "),
      r.layer + "." + r.head, pct(r.accuracy, r.interval),
      pct(r.baseline, r.baseline_interval) + " (" + (r.baseline_offset > 0 ? "+" : "") + r.baseline_offset + ")",
      r.count, sci(r.q)])));
  const c = roles.coreference;
  document.getElementById("coref").textContent = c
    ? "Best head " + c.layer + "." + c.head + ": " + pct(c.accuracy, c.interval) + "% of " + c.count +
      " GAP pronouns attend more to the right name; baselines " +
      Object.entries(c.baselines).map(([k, v]) => k + " " + fmt(100 * v, 1) + "%").join(", ") +
      (c.q === null || c.q === undefined ? "." : "; against " + c.baseline + ", q = " + sci(c.q) + ".")
    : "No coreference data in this run.";
  const sp = data.spec;
  document.getElementById("spec").appendChild(table(["quantity", "value"], [
    ["layers \u00d7 heads", sp.n_layers + " \u00d7 " + sp.n_heads],
    ["KV heads", sp.n_kv_heads + " (" + sp.kind + ")"],
    ["head width", sp.head_dim], ["model width", sp.d_model],
    ["attention patterns per forward", sp.attention_patterns],
    ["attention parameters", sp.attention_params],
    ["KV cache per token (fp32)", sp.kv_cache_bytes_per_token + " bytes"],
  ]));
  const pr = document.getElementById("pruning");
  if (data.pruning) {
    const p = data.pruning;
    pr.appendChild(el("p", {}, p.metric + " (" + p.unit + ") as heads are removed, " + p.importance + " importance:"));
    pr.appendChild(table(["heads removed", "share", p.metric, "loss"],
      p.curve.map((q) => [q.heads_removed, fmt(100 * q.fraction, 0) + "%", fmt(q.metric, 2), fmt(q.loss, 2)])));
  } else {
    pr.appendChild(el("p", { class: "muted" }, "Not measured in this run (headlab report --prune adds it)."));
  }
  const ex = document.getElementById("experiment");
  const exps = (data.experiments || (data.experiment ? [data.experiment] : [])).filter((e) => e && e.summary);
  if (exps.length) {
    const rows = [];
    exps.forEach((e) => e.summary.forEach((r) => rows.push([e.setting || "small", r.task, r.n_heads,
      r.metric, fmt(r.mean, 3), fmt(r.std, 3), r.seeds])));
    ex.appendChild(table(["setting", "task", "heads", "metric", "mean", "spread (sd)", "seeds"], rows));
  } else {
    ex.appendChild(el("p", { class: "muted" }, "Not measured in this run (headlab report --experiment FILE.json adds it)."));
  }

  const co = document.getElementById("cost");
  if (data.cost && data.cost.rows) {
    co.appendChild(el("p", {}, "Width " + data.cost.options.width + ", on " + data.cost.device +
      "; times are medians of alternating blocks (" + data.cost.timing_method + ")."));
    co.appendChild(table(["tokens", "heads \u00d7 width", "parameters", "FLOPs (spec)", "fused forward ms",
      "loop over heads / fused", "H\u00d7T\u00d7T weights bytes", "max |loop \u2212 fused|"],
      data.cost.rows.map((r) => [r.length, r.heads + " \u00d7 " + r.head_dim, r.params.headlab, r.spec_flops,
        fmt(1000 * r.forward_s.fused, 2), fmt(r.ratios.loop_vs_fused, 2) + "\u00d7", r.weights_bytes,
        r.loop_max_abs_diff == null ? "\u2013" : r.loop_max_abs_diff.toExponential(1)])));
  } else {
    co.appendChild(el("p", { class: "muted" }, "Not measured in this run (headlab report --full, or --cost FILE.json)."));
  }

  // ---------------------------------------------------------------- the ledger
  const ledger = document.getElementById("ledger");
  const lt = el("table", { class: "data ledger" });
  const head = el("tr");
  ["claim", "measured", "verdict", "details"].forEach((h) => head.appendChild(el("th", {}, h)));
  lt.appendChild(head);
  (data.ledger || []).forEach((r) => {
    const tr = el("tr");
    tr.appendChild(el("td", {}, r.claim));
    tr.appendChild(el("td", {}, r.figure || "\u2013"));
    const v = el("td", { class: "verdict", title: "rule: " + r.rule }, r.verdict);
    v.setAttribute("data-verdict", r.verdict);
    tr.appendChild(v);
    const link = el("td");
    link.appendChild(el("a", { href: "#" + r.section }, "details"));
    tr.appendChild(link);
    lt.appendChild(tr);
  });
  ledger.appendChild(lt);

  // ---------------------------------------------------------------- start on the lesson
  state.word = data.focus.index;
  state.layer = 0;
  state.head = "all";
  fillHeads();
  renderViewer();
  const best = roles.heads.find((h) => h.role === "syntactic") || roles.heads[0];
  showDetails(best.layer, best.head);
  document.body.setAttribute("data-ready", "1");
})();
