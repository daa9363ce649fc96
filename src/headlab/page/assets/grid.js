// One head on every page: its cell in the one grid of heads, its one evidence panel, what its
// pattern says about a word, and the one attention-sink rule. The report (report.js), the live
// explorer (heads.js, explorer.js) and the notebook view (heads.js) call these; none draws a
// grid or a panel of its own. A head's role is one head of `headlab roles --json`
// (RoleReport.to_json()["heads"]), on both pages the same keys (headlab.page.panel.PANEL_KEYS).

// ---------------------------------------------------------------- numbers
// a share in % with its 95% interval: "57.5 [55.3-59.7]"
function pct(v, interval) {
  if (v === null || v === undefined) return "\u2013";
  return fmt(100 * v, 1) + (interval && interval[0] !== null
    ? " [" + fmt(100 * interval[0], 1) + "\u2013" + fmt(100 * interval[1], 1) + "]" : "");
}
function sci(v) {
  return v === null || v === undefined ? "\u2013" : Number(v).toPrecision(2);
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

// ---------------------------------------------------------------- the attention sink
// A decoder's first word soaks up attention that has nowhere else to go (an "attention sink",
// Xiao et al. 2023; headlab.models.analysis.sink_index finds it, -1: none). Like a special token
// it is set apart: a link to it says little about the head. The sink's own row sees only
// itself, so there it is not set apart. `side`: {words, special, sink}.
function sinkOf(d) { return d.sink === undefined || d.sink === null ? -1 : d.sink; }
function setApart(side, i, j) {
  const sink = sinkOf(side);
  return !!side.special[j] || (j === sink && i !== sink);
}

// the key word query i attends to most among those not set apart (apart false), or among
// those set apart (apart true): [index, weight], [-1, 0] for none
function topKey(side, p, i, apart) {
  let best = -1;
  for (let j = 0; j < p[i].length; j++) {
    if (setApart(side, i, j) !== apart) continue;
    if (best < 0 || p[i][j] > p[i][best]) best = j;
  }
  return best < 0 ? [-1, 0] : [best, p[i][best]];
}
// one sentence for every view: "0.99 to [CLS] (set apart); among the words, most to ..."
function attendsText(side, row, i, k) {
  const words = side.words, sink = sinkOf(side);
  const p = [];
  p[i] = row;
  const others = row.map((w, j) => [w, j]).filter(([, j]) => !setApart(side, i, j))
    .sort((a, b) => b[0] - a[0]).slice(0, k);
  const apart = topKey(side, p, i, true);
  const most = others.map(([w, j]) => "\u201c" + words[j] + "\u201d " + fmt(w, 2)).join(", ");
  const what = apart[0] === sink && i !== sink ? " (the sink: a decoder's first word)" : "";
  if (apart[0] >= 0 && apart[1] > (others.length ? others[0][0] : 0)) {
    return "\u201c" + words[i] + "\u201d sends " + fmt(apart[1], 2) + " to \u201c" + words[apart[0]] +
      "\u201d" + what + (most ? "; among the other words, most to " + most : "") + ".";
  }
  return "\u201c" + words[i] + "\u201d attends most to " + most +
    (apart[0] >= 0 ? " (" + fmt(apart[1], 2) + " to \u201c" + words[apart[0]] + "\u201d" + what + ")" : "") + ".";
}
// a head's strongest word-to-word link in a sentence, rows of special tokens, a word to
// itself and keys set apart left out: [query, key, weight], or null
function strongestLink(side, p) {
  let best = null;
  for (let i = 0; i < p.length; i++) {
    if (side.special[i]) continue;
    for (let j = 0; j < p.length; j++) {
      if (i === j || setApart(side, i, j)) continue;
      if (best === null || p[i][j] > best[2]) best = [i, j, p[i][j]];
    }
  }
  return best;
}

// ---------------------------------------------------------------- the grid of heads
// the heads of a roles run by layer and head: of(layer, head) -> the head, or null
function roleLookup(heads) {
  const found = new Map();
  (heads || []).forEach((x) => found.set(x.layer + "." + x.head, x));
  return (layer, head) => found.get(layer + "." + head) || null;
}

// A head's role on its cell: its roles in data-roles (a role's heads can be marked), its role
// in the title; `fill`: the cell in the role's colour with its letter, fainter for a less stable
// role, hatched when the role did not replicate (the report); else a strip of the role's colour
// under the cell's own content (the explorer, whose cells name words).
function markRole(button, info, roleStyle, fill) {
  const style = roleStyle[info.role] || { colour: "#ccc", letter: "?" };
  const known = info.stability !== null && info.stability !== undefined;
  button.setAttribute("data-roles", (info.roles || []).join(" "));
  button.setAttribute("data-role", info.role);
  button.title += " \u2014 role: " + info.role + (known ? " (stability " + fmt(info.stability, 2) + ")" : "") +
    (info.stable === false ? ", unstable" : "");
  if (!fill) {
    button.style.boxShadow = "inset 0 -5px 0 " + style.colour;
    return;
  }
  button.textContent = style.letter;
  button.style.background = style.colour;
  // a less stable role: a fainter letter, the cell keeps its colour (a faded cell would look
  // unclassified, which is white)
  button.style.color = "rgba(0,0,0," + (known ? 0.35 + 0.65 * info.stability : 1) + ")";
  if (info.stable === false) button.classList.add("unstable");  // hatched, not faded into white
}

// The one grid of heads: layers down, heads across, one button per head (data-layer,
// data-head), a dash where a layer has fewer heads (pruned away). opts: cell(button, layer,
// head) fills a cell (text, shade, title); roles: {of, style, fill} marks each head's role
// (markRole); selected: [layer, head]; decorate(button, layer, head) adds a page's marks;
// onClick(layer, head, event) and onHover(layer, head).
function headGrid(headsInLayer, opts) {
  const most = Math.max(0, ...headsInLayer);
  const t = el("table", { class: "head-grid" });
  const top = el("tr");
  top.appendChild(el("th", {}, "layer \\ head"));
  for (let h = 0; h < most; h++) top.appendChild(el("th", {}, h));
  t.appendChild(top);
  headsInLayer.forEach((n, l) => {
    const tr = el("tr");
    tr.appendChild(el("th", {}, l));
    for (let h = 0; h < most; h++) {
      if (h >= n) {
        tr.appendChild(el("td", { class: "pruned", title: "layer " + l + ", head " + h + ": pruned away" }, "\u2013"));
        continue;
      }
      const b = el("button", { "data-layer": l, "data-head": h, title: "layer " + l + ", head " + h });
      if (opts.cell) opts.cell(b, l, h);
      const info = opts.roles ? opts.roles.of(l, h) : null;
      if (info) markRole(b, info, opts.roles.style, opts.roles.fill);
      if (opts.selected && opts.selected[0] === l && opts.selected[1] === h) b.classList.add("selected");
      if (opts.decorate) opts.decorate(b, l, h);
      if (opts.onClick) b.addEventListener("click", (e) => opts.onClick(l, h, e));
      if (opts.onHover) b.addEventListener("mouseenter", () => opts.onHover(l, h));
      const td = el("td");
      td.appendChild(b);
      tr.appendChild(td);
    }
    t.appendChild(tr);
  });
  return t;
}
// the chosen head outlined in a drawn grid, without drawing it again
function selectCell(root, layer, head) {
  root.querySelectorAll("button.selected").forEach((b) => b.classList.remove("selected"));
  const b = root.querySelector('button[data-layer="' + layer + '"][data-head="' + head + '"]');
  if (b) b.classList.add("selected");
}

// ---------------------------------------------------------------- the evidence panel
// The one panel of a head, in the report and the explorer alike: its title; with opts.word
// ({side, row, index}: a chosen word and its row of weights) where that word attends; with a
// roles run's head `info` its role, scores against the baseline with the margin, stability,
// the evidence that decided it (accuracies with 95% Wilson intervals over documents, exact
// McNemar p, Benjamini-Hochberg q), and every score; with opts.examples ([{side, p, text}])
// its strongest link in each. opts.none: what to say when there is no roles run.
// Returns the nodes, for the page to put in its box.
function headPanel(layer, head, info, opts) {
  const out = [el("h3", {}, "Layer " + layer + ", head " + head)];
  if (opts.word) out.push(el("p", { class: "attends" }, attendsText(opts.word.side, opts.word.row, opts.word.index, 3)));
  if (info) {
    out.push(el("p", { class: "role" }, "Measured role: " + info.role + (info.detail ? " (" + info.detail + ")" : "")));
    const known = info.stability !== null && info.stability !== undefined;
    out.push(el("p", { class: "scores" }, "score " + fmt(info.score) + " against a baseline of " +
      fmt(info.baseline) + " (margin " + fmt(info.margin) + ")" +
      (known ? ", stability " + fmt(info.stability, 2) : "") +
      (info.roles && info.roles.length > 1 ? "; also clears the bar for: " + info.roles.slice(1).join(", ") : "") + "."));
    const ev = info.evidence;
    if (ev && ev.interval) {
      out.push(el("p", { class: "evidence" }, "Decided by " + (ev.relation
        ? ev.relation + " " + String(ev.direction || "").replaceAll("_", " ") : "coreference (GAP)") + ": " +
        pct(ev.accuracy, ev.interval) + "% against the baseline's " +
        pct(ev.baseline, ev.baseline_interval) + "% on " + ev.count +
        (ev.relation ? " arcs" : " pronouns") + "; exact McNemar p = " + sci(ev.p) +
        ", Benjamini-Hochberg q = " + sci(ev.q) + " (95% Wilson intervals over documents)."));
    }
    if (info.stable === false) {
      out.push(el("p", { class: "muted" }, "Measured role on all the data: " +
        info.measured_role + "; not replicated in enough folds, so shown unclassified."));
    }
    const sink = info.scores ? info.scores.sink : null;
    if (sink !== null && sink !== undefined) {
      out.push(el("p", { class: "sink" }, "Attention to the sink ([CLS], [SEP], BOS or the first token, where a " +
        "head parks what it does not use): " + fmt(100 * sink, 1) + "% of its weight" +
        (info.role === "sink" ? ", and no other role's bar is cleared: a no-op head." : ".")));
    }
    if (info.scores) out.push(table(["score", "value"], Object.entries(info.scores).map(([k, v]) => [k, fmt(v)])));
  } else if (opts.none) {
    out.push(el("p", { class: "muted" }, opts.none));
  }
  const examples = opts.examples || [];
  const list = el("ul", { class: "examples" });
  examples.forEach((x) => {
    const link = strongestLink(x.side, x.p);
    if (!link) return;
    const item = el("li");
    item.appendChild(el("b", {}, x.side.words[link[0]] + " \u2192 " + x.side.words[link[1]]));
    item.appendChild(document.createTextNode(" " + fmt(link[2], 2) + " in \u201c" + x.text + "\u201d"));
    list.appendChild(item);
  });
  if (list.childNodes.length) {
    out.push(el("p", { class: "muted" }, "Strongest word-to-word link of this head in " +
      (examples.length > 1 ? "each example" : "the sentence") + " (special tokens and the sink set apart):"));
    out.push(list);
  }
  return out;
}
