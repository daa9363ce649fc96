// One sentence's heads (the JSON of headlab.explore.sentence.SentenceHeads.to_json): the
// layer x head grid for a chosen word, and the chosen head's pattern, for that word (lines
// between words) and token to token (a heatmap). Used by the live explorer and the notebook
// view; the drawing itself is draw.js's. Everything lives under `root`: no ids, so several
// views can share a page (a notebook's outputs).

// the key word a query word attends to most, special tokens and the sink left out (a
// decoder's first word, where heads park what they do not use; sink < 0: none): [index, weight]
function topKey(p, i, special, sink) {
  if (i === sink) sink = -1;  // the sink's own row sees only itself: nothing set apart
  let best = -1;
  for (let j = 0; j < p[i].length; j++) {
    if (special[j] || j === sink) continue;
    if (best < 0 || p[i][j] > p[i][best]) best = j;
  }
  return best < 0 ? [-1, 0] : [best, p[i][best]];
}
// where the weight set apart goes: the special token or sink with the most, [index, weight]
function apartKey(p, i, special, sink) {
  if (i === sink) sink = -1;
  let best = -1;
  for (let j = 0; j < p[i].length; j++) {
    if (!(special[j] || j === sink)) continue;
    if (best < 0 || p[i][j] > p[i][best]) best = j;
  }
  return best < 0 ? [-1, 0] : [best, p[i][best]];
}
// one sentence for every view: "0.99 to [CLS] (set apart); among the words, most to ..."
function attendsText(words, special, sink, row, i, k) {
  if (i === sink) sink = -1;
  const p = [];
  p[i] = row;
  const others = row.map((w, j) => [w, j]).filter(([, j]) => !special[j] && j !== sink)
    .sort((a, b) => b[0] - a[0]).slice(0, k);
  const apart = apartKey(p, i, special, sink);
  const most = others.map(([w, j]) => "\u201c" + words[j] + "\u201d " + fmt(w, 2)).join(", ");
  const what = apart[0] === sink ? " (the sink: a decoder's first word)" : "";
  if (apart[0] >= 0 && apart[1] > (others.length ? others[0][0] : 0)) {
    return "\u201c" + words[i] + "\u201d sends " + fmt(apart[1], 2) + " to \u201c" + words[apart[0]] +
      "\u201d" + what + (most ? "; among the other words, most to " + most : "") + ".";
  }
  return "\u201c" + words[i] + "\u201d attends most to " + most +
    (apart[0] >= 0 ? " (" + fmt(apart[1], 2) + " to \u201c" + words[apart[0]] + "\u201d" + what + ")" : "") + ".";
}
function shortWord(w) { return w.length > 7 ? w.slice(0, 6) + "\u2026" : w; }

// opts: onSelect(layer, head) after a head is chosen; decorate(button, layer, head) adds marks
// (a role's colour, a head switched off); onWord(index) after a word is chosen
function headsView(root, opts) {
  opts = opts || {};
  const view = { data: null, layer: 0, head: 0, word: -1, words: [], tokens: [], weighting: "attention", norms: null };
  const grid = el("div", { class: "hl-grid" });
  const note = el("p", { class: "hl-note" });
  const title = el("h3", { class: "hl-title" });
  const panels = el("div", { class: "hl-panels" });
  const lines = el("div", { class: "hl-lines" });
  const heat = el("div", { class: "hl-tokens" });
  const linesBox = el("div", { class: "hl-panel" });
  linesBox.appendChild(el("h4", {}, "For one word (click a word on the left)"));
  linesBox.appendChild(lines);
  const heatBox = el("div", { class: "hl-panel" });
  heatBox.appendChild(el("h4", {}, "Token to token (rows attend to columns)"));
  heatBox.appendChild(heat);
  panels.appendChild(linesBox);
  panels.appendChild(heatBox);
  // the raw weights, or weighted by the norm of what each token gives the head (Kobayashi et al. 2020)
  const weighting = el("select", { class: "hl-weighting", "aria-label": "weights" });
  weighting.appendChild(el("option", { value: "attention" }, "attention weights"));
  weighting.appendChild(el("option", { value: "norm" }, "weights \u00d7 value norm ||W\u2092v|| (Kobayashi et al. 2020)"));
  weighting.addEventListener("change", () => view.weigh(weighting.value));
  const weightingBox = el("p", { class: "hl-weighting-box" });
  weightingBox.appendChild(el("label", {}, "show "));
  weightingBox.appendChild(weighting);
  root.replaceChildren(grid, note, weightingBox, title, panels);

  function mat(layer, head, tokens) {
    const n = tokens ? view.data.tokens.length : view.data.words.length;
    const set = view.weighting === "norm" && view.norms ? view.norms : view;
    return headMatrix((tokens ? set.tokens : set.words)[layer], head, n);
  }
  view.pattern = (layer, head, tokens) => mat(layer, head, tokens);

  function drawGrid() {
    const d = view.data;
    const most = Math.max.apply(null, d.heads_in_layer);
    const t = el("table");
    const top = el("tr");
    top.appendChild(el("th", {}, "layer \\ head"));
    for (let h = 0; h < most; h++) top.appendChild(el("th", {}, h));
    t.appendChild(top);
    for (let l = 0; l < d.layers; l++) {
      const tr = el("tr");
      tr.appendChild(el("th", {}, l));
      for (let h = 0; h < most; h++) {
        const td = el("td");
        if (h >= d.heads_in_layer[l]) {
          td.textContent = "\u2013";
          td.className = "pruned";
          tr.appendChild(td);
          continue;
        }
        let label = "", tip = "layer " + l + ", head " + h, w = 0, apartShare = 0;
        if (view.word >= 0) {
          const p = mat(l, h, false), sink = sinkOf(d);
          const best = topKey(p, view.word, d.special, sink);
          const apart = apartKey(p, view.word, d.special, sink);
          if (best[0] >= 0) {
            w = best[1];
            label = shortWord(d.words[best[0]]);
            tip += ": " + attendsText(d.words, d.special, sink, p[view.word], view.word, 1);
          }
          if (apart[0] >= 0 && apart[1] > w) {  // most of the weight is set apart: marked
            apartShare = apart[1];
          }
        }
        const b = el("button", { "data-layer": l, "data-head": h, title: tip }, label);
        b.style.background = "rgba(31,95,191," + (0.08 + 0.92 * w) + ")";
        if (w > 0.5) b.classList.add("dark");
        if (apartShare > 0) {
          b.classList.add("apart");
          b.setAttribute("data-apart", fmt(apartShare, 2));
        }
        if (l === view.layer && h === view.head) b.classList.add("selected");
        if (opts.decorate) opts.decorate(b, l, h);
        b.addEventListener("click", (e) => (opts.onCell ? opts.onCell(l, h, e) : view.select(l, h)));
        td.appendChild(b);
        tr.appendChild(td);
      }
      t.appendChild(tr);
    }
    grid.replaceChildren(t);
    grid.setAttribute("data-word", view.word);
  }

  function drawHead() {
    const d = view.data;
    title.textContent = "Layer " + view.layer + ", head " + view.head +
      (view.word >= 0 ? ": where \u201c" + d.words[view.word] + "\u201d attends" : "");
    const side = { words: d.words, special: d.special };
    lines.replaceChildren(drawLines(side, [{ p: mat(view.layer, view.head, false), colour: "#1f5fbf" }], {
      word: view.word, causal: d.causal, onWord: (i) => view.choose(i),
    }));
    const tokens = { words: d.tokens, special: d.token_special };
    heat.replaceChildren(drawHeatmap(tokens, [{ p: mat(view.layer, view.head, true) }], { word: -1, causal: d.causal }));
    root.setAttribute("data-weighting", view.weighting);
    root.setAttribute("data-layer", view.layer);
    root.setAttribute("data-head", view.head);
  }

  function drawNote() {
    const d = view.data, cut = d.truncated;
    note.textContent = (cut ? "Long input: showing the first " + d.words.length + " of " + cut.words +
      " words and " + d.tokens.length + " of " + cut.tokens + " tokens. " : "") +
      (view.word >= 0 ? "Each cell is one head, showing the word \u201c" + d.words[view.word] +
        "\u201d attends to most, darker for more weight; special tokens" +
        (sinkOf(d) >= 0 ? " and the sink \u201c" + d.words[sinkOf(d)] + "\u201d (a decoder's first word, where heads park what they do not use)" : "") +
        " are set apart, and a cell with a dot sends them more than any word (hover for the share). " : "") +
      "Click a cell for that head's pattern, a word of the pattern to follow it." +
      (d.causal ? " A decoder's words see only themselves and earlier words." : "");
  }

  view.render = function () {
    if (!view.data) return;
    drawGrid();
    drawNote();
    drawHead();
  };
  view.show = function (data) {
    view.data = data;
    view.words = data.patterns.map(decodeLayer);
    view.tokens = data.token_patterns.map(decodeLayer);
    view.norms = data.norm_patterns && data.norm_token_patterns
      ? { words: data.norm_patterns.map(decodeLayer), tokens: data.norm_token_patterns.map(decodeLayer) } : null;
    if (!view.norms) view.weighting = "attention";
    weighting.value = view.weighting;
    weightingBox.hidden = !view.norms;
    view.word = data.focus;
    if (view.layer >= data.layers) view.layer = 0;
    if (view.head >= data.heads_in_layer[view.layer]) view.head = 0;
    view.render();
  };
  // nothing shown: after an error, no grid of the sentence before stays under the new text
  view.clear = function () {
    view.data = null;
    view.word = -1;
    [grid, note, title, lines, heat].forEach((part) => part.replaceChildren());
    weightingBox.hidden = true;
    root.removeAttribute("data-layer");
    root.removeAttribute("data-head");
  };
  view.select = function (layer, head) {
    view.layer = layer;
    view.head = head;
    view.render();
    if (opts.onSelect) opts.onSelect(layer, head);
  };
  view.weigh = function (kind) {
    view.weighting = kind === "norm" && view.norms ? "norm" : "attention";
    weighting.value = view.weighting;
    view.render();
    if (opts.onWeighting) opts.onWeighting(view.weighting);
  };
  view.choose = function (index) {
    view.word = index;
    view.render();
    if (opts.onWord) opts.onWord(index);
  };
  return view;
}
