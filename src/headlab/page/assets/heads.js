// One sentence's heads (headlab.sentence/1: headlab.models.sentence_view.sentence_json, read by
// draw.js's readSentence, as the report reads it): the layer x head grid for a chosen word, and
// the chosen head's pattern, for that word (lines between words) and token to token (a
// heatmap). Used by the live explorer and the notebook view; the drawing itself is draw.js's,
// the grid of heads grid.js's (the report's grid too). Everything lives under
// `root`: no ids, so several views can share a page (a notebook's outputs).

function shortWord(w) { return w.length > 7 ? w.slice(0, 6) + "\u2026" : w; }

// opts: onSelect(layer, head) after a head is chosen; roles() the heads' roles, if any
// ({of, style}: a strip of each head's role colour under its cell, grid.js's markRole);
// decorate(button, layer, head) adds marks (a head switched off); onCell(layer, head, event)
// instead of selecting the head clicked; onWord(index) after a word is chosen
function headsView(root, opts) {
  opts = opts || {};
  const view = { data: null, sentence: null, layer: 0, head: 0, word: -1, weighting: "attention" };
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

  // draw.js's reader of the sentence: the raw weights, or weighted by value norms
  function mat(layer, head, tokens) {
    return view.sentence.pattern(layer, head, tokens, view.weighting === "norm");
  }
  view.pattern = (layer, head, tokens) => mat(layer, head, tokens);

  // grid.js's grid: each cell names the word the chosen word attends to most in that head
  function fillCell(b, l, h) {
    const d = view.data;
    b.style.background = "rgba(31,95,191,0.08)";
    if (view.word < 0) return;
    const p = mat(l, h, false), side = view.sentence.side;
    const best = topKey(side, p, view.word, false);
    const apart = topKey(side, p, view.word, true);
    const w = best[0] >= 0 ? best[1] : 0;
    if (best[0] >= 0) {
      b.textContent = shortWord(d.words[best[0]]);
      b.title += ": " + attendsText(side, p[view.word], view.word, 1);
    }
    b.style.background = "rgba(31,95,191," + (0.08 + 0.92 * w) + ")";
    if (w > 0.5) b.classList.add("dark");
    if (apart[0] >= 0 && apart[1] > w) {  // most of the weight is set apart: marked
      b.classList.add("apart");
      b.setAttribute("data-apart", fmt(apart[1], 2));
    }
  }

  // the grid's colour key: a cell's shade is the weight on the word it names (fillCell's)
  function gridKey() {
    const key = el("p", { class: "hl-grid-key", "aria-label": "colour key of the grid" });
    key.appendChild(el("span", {}, "layers down, heads across; shade: the weight on the word a cell names, 0 "));
    [0, 0.25, 0.5, 0.75, 1].forEach((w) => {
      const swatch = el("i", { title: fmt(w, 2) });
      swatch.style.background = "rgba(31,95,191," + (0.08 + 0.92 * w) + ")";
      key.appendChild(swatch);
    });
    key.appendChild(el("span", {}, " 1"));
    return key;
  }

  function showGrid() {
    const roles = opts.roles ? opts.roles() : null;
    const table = headGrid(view.data.heads_in_layer, {
      cell: fillCell,
      roles: roles ? { of: roles.of, style: roles.style, fill: false } : null,
      selected: [view.layer, view.head],
      decorate: opts.decorate,
      onClick: (l, h, e) => (opts.onCell ? opts.onCell(l, h, e) : view.select(l, h)),
    });
    const axis = el("caption", { class: "hl-axis" }, "head \u2192");  // the heads' axis, above their numbers
    table.insertBefore(axis, table.firstChild);
    grid.replaceChildren(table, gridKey());
    grid.setAttribute("data-word", view.word);
  }

  function drawHead() {
    const d = view.data;
    title.textContent = "Layer " + view.layer + ", head " + view.head +
      (view.word >= 0 ? ": where \u201c" + d.words[view.word] + "\u201d attends" : "");
    lines.replaceChildren(drawLines(view.sentence.side, [{ p: mat(view.layer, view.head, false), colour: "#1f5fbf" }], {
      word: view.word, causal: d.causal, onWord: (i) => view.choose(i),
    }));
    heat.replaceChildren(drawHeatmap(view.sentence.tokenSide, [{ p: mat(view.layer, view.head, true) }], { word: -1, causal: d.causal }));
    root.setAttribute("data-weighting", view.weighting);
    root.setAttribute("data-layer", view.layer);
    root.setAttribute("data-head", view.head);
  }

  function drawNote() {
    const d = view.data, cut = view.sentence.notice;
    note.textContent = (cut ? cut + " " : "") +
      (view.word >= 0 ? "Each cell is one head, showing the word \u201c" + d.words[view.word] +
        "\u201d attends to most, darker for more weight; special tokens" +
        (sinkOf(d) >= 0 ? " and the sink \u201c" + d.words[sinkOf(d)] + "\u201d (a decoder's first word, where heads park what they do not use)" : "") +
        " are set apart, and a cell with a dot sends them more than any word (hover for the share). " : "") +
      "Click a cell for that head's pattern, a word of the pattern to follow it." +
      (d.causal ? " A decoder's words see only themselves and earlier words." : "");
  }

  view.render = function () {
    if (!view.data) return;
    showGrid();
    drawNote();
    drawHead();
  };
  view.show = function (data) {
    view.data = data;
    view.sentence = readSentence(data);
    if (!view.sentence.hasNorms) view.weighting = "attention";
    weighting.value = view.weighting;
    weightingBox.hidden = !view.sentence.hasNorms;
    view.word = data.focus;
    if (view.layer >= data.layers) view.layer = 0;
    if (view.head >= data.heads_in_layer[view.layer]) view.head = 0;
    view.render();
  };
  // nothing shown: after an error, no grid of the sentence before stays under the new text
  view.clear = function () {
    view.data = null;
    view.sentence = null;
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
    view.weighting = kind === "norm" && view.sentence && view.sentence.hasNorms ? "norm" : "attention";
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
