// The circuit's page: headlab circuit's JSON (headlab.circuit/1) drawn as a graph, layers
// bottom to top, each head a node coloured by its class, each edge as wide as its |score|.
const data = JSON.parse(document.getElementById("data").textContent);
const CLASS_COLOURS = data.class_colours;  // one palette, shared with the PNG figure
const MLP_COLOUR = "#bdbdbd", END_COLOUR = "#333", UNNAMED_COLOUR = "#6baed6";
// heads are named when classes were measured (headlab circuit without --no-classes)
const NAMED = data.nodes.some((n) => n.kind === "head" && n.class) || Object.keys(data.classes).length > 0;
// the heads drawn with their name (headlab.causal.figure.labelled_heads, as in the PNG): all of
// them in a small circuit, else those of largest |effect| and those a class names
const LABELLED = new Set(data.labelled);
// each head's evidence (headlab circuit --json "heads"), for its node's hover
const EVIDENCE = {};
(data.heads || []).forEach((h) => { EVIDENCE[h.layer + "." + h.head] = h; });
// the evidence's numbers, in the words of the class rules
const EVIDENCE_NAMES = [
  ["dla", "direct logit attribution"], ["copying", "copies the indirect object"],
  ["end_to_io", "attention from the end to the indirect object"],
  ["end_to_s", "attention from the end to the subject"],
  ["s2_to_s1", "attention from the subject's second occurrence to its first"],
  ["s2_to_after_s1", "attention from the subject's second occurrence to the token after its first"],
  ["previous", "attention to the previous token"],
  ["path_to_name_movers", "path into the name movers' queries"],
];

function nodeColour(n) {
  if (n.kind === "head") return n.class ? CLASS_COLOURS[n.class] || CLASS_COLOURS.unexplained : UNNAMED_COLOUR;
  return n.kind === "mlp" ? MLP_COLOUR : END_COLOUR;
}

// a number with ``digits`` decimals, or two significant digits where those would read 0
function num(v, digits) {
  if (v !== 0 && Math.abs(v) < Math.pow(10, -digits)) return Number(v).toPrecision(2);
  return fmt(v, digits);
}

// the figure's layout (data.layout: head columns and layer rows) in pixels
function layout() {
  const xy = Object.values(data.layout);
  const top = Math.max(0, ...xy.map((p) => p[1])) - 1;  // the logits sit one row above
  const width = Math.max(1, ...xy.map((p) => p[0] + 1));
  const dx = 46, dy = 26, left = 60, rows = top + 3;  // embed, layers, logits
  const H = rows * dy + 50;
  const pos = {};
  Object.entries(data.layout).forEach(([name, p]) => {
    pos[name] = { x: left + p[0] * dx, y: H - 36 - (p[1] + 1) * dy };
  });
  return { pos: pos, W: left + (width + 1) * dx, H: H, top: top, dy: dy };
}

// what hovering a node shows: its name, class, estimated effect and the evidence measured
function nodeTitle(n) {
  const lines = [n.name + (n.class ? " \u2014 " + n.class : "")];
  if (n.effect !== null && n.effect !== undefined) {
    lines.push("effect " + (n.effect > 0 ? "+" : "") + num(n.effect, 3) + " of the logit difference (" +
      data.method.toUpperCase() + " estimate of corrupting its output)");
  }
  const ev = EVIDENCE[n.name];
  if (ev) {
    EVIDENCE_NAMES.forEach(([key, words]) => {
      if (ev[key] !== null && ev[key] !== undefined) lines.push(words + ": " + num(ev[key], 3));
    });
    if (ev.role) lines.push("headlab roles: " + ev.role);
  }
  return lines.join("\n");
}

// the nodes an edge's receiver belongs to: q:L.H its head; k:L.G and v:L.G the heads of the
// KV group in the circuit; mlp L its MLP; logits the logits
function receiverNodes(name, pos) {
  if (name === "logits" || name.startsWith("mlp ")) return [name];
  const kind = name[0], rest = name.slice(2).split("."), layer = +rest[0], index = +rest[1];
  if (kind === "q") return [layer + "." + index];
  const size = data.group_size[layer];
  const out = [];
  for (let h = index * size; h < (index + 1) * size; h++) if (pos[layer + "." + h]) out.push(layer + "." + h);
  return out;
}

function drawGraph() {
  const L = layout(), pos = L.pos;
  const svg = svgEl("svg", { viewBox: "0 0 " + L.W + " " + L.H, role: "img", "aria-label": "the circuit as a graph" });
  for (let l = 0; l <= L.top; l++) {
    svg.appendChild(svgEl("text", { x: 4, y: L.H - 36 - (l + 1) * L.dy + 4, class: "layer", "font-size": 10, fill: "#888" }, "layer " + l));
  }
  const most = Math.max.apply(null, data.edges.map((e) => Math.abs(e.score)).concat([1e-12]));
  const edgeLayer = svgEl("g", { id: "edge-lines" });
  data.edges.forEach((e) => {
    const a = pos[e.sender];
    receiverNodes(e.receiver, pos).forEach((to) => {
      const b = pos[to];
      if (!a || !b) return;
      const line = svgEl("line", {
        x1: a.x, y1: a.y, x2: b.x, y2: b.y, "stroke-width": (0.4 + 4 * Math.abs(e.score) / most).toFixed(2),
        stroke: e.score < 0 ? "#e6550d" : "#3182bd", "stroke-opacity": 0.55,
        "data-edge": e.sender + ">" + e.receiver, "data-score": e.score,
      });
      line.appendChild(svgEl("title", {}, e.sender + " \u2192 " + e.receiver + ": " + fmt(e.score, 4)));
      edgeLayer.appendChild(line);
    });
  });
  svg.appendChild(edgeLayer);
  const nodeLayer = svgEl("g", { id: "node-marks" });
  data.nodes.forEach((n) => {
    const p = pos[n.name];
    const attrs = { "data-node": n.name, "data-class": n.class || n.kind, fill: nodeColour(n), stroke: "#fff" };
    const mark = n.kind === "mlp"
      ? svgEl("rect", Object.assign({ x: p.x - 6, y: p.y - 6, width: 12, height: 12 }, attrs))
      : svgEl("circle", Object.assign({ cx: p.x, cy: p.y, r: n.kind === "head" ? 8 : 10 }, attrs));
    mark.appendChild(svgEl("title", {}, nodeTitle(n)));
    nodeLayer.appendChild(mark);
    // names on the ends and on the heads labelled; every node shows its numbers on hover
    if (n.kind !== "mlp" && (n.kind !== "head" || LABELLED.has(n.name))) {
      const below = n.kind === "embed";
      nodeLayer.appendChild(svgEl("text", { x: p.x + (n.kind === "head" ? 10 : 0), y: below ? p.y + 22 : p.y + (n.kind === "head" ? 3 : -13),
        "text-anchor": n.kind === "head" ? "start" : "middle", "font-size": 9, fill: "#222", class: "node-name" }, n.name));
    }
  });
  svg.appendChild(nodeLayer);
  document.getElementById("graph").appendChild(svg);
  drawListed();
  const shown = data.edges.length, all = data.edges_in_circuit;
  document.getElementById("graph-note").textContent = "Bottom: the embeddings; top: the logits. " +
    "Each circle a head, coloured by its class; squares the MLPs, each in the half row above its layer's heads. " +
    (data.listed.length ? "Named: the " + data.labelled.length + " heads of largest |effect| and those a class names; the other " +
      data.listed.length + " are listed under the graph. " : "") +
    "Hover a node for its numbers. " +
    (shown < all ? "The " + shown + " strongest of the circuit's " + all + " edges are drawn. " : "All " + all + " edges are drawn. ") +
    "Orange: corrupting the edge lowers the logit difference (it carries the behaviour); blue: raises it; width: |score|.";
}

// the heads of the circuit drawn without their name, and the heads it leaves out
function drawListed() {
  const box = document.getElementById("listed");
  if (data.listed.length) {
    const more = el("details", { id: "unlabelled" });
    more.appendChild(el("summary", {}, "Also in the circuit, unlabelled: " + data.listed.length + " heads, by |effect|"));
    more.appendChild(el("p", { class: "muted" }, data.listed.join(", ")));
    box.appendChild(more);
  }
  const out = data.left_out || [];
  if (out.length) {
    box.appendChild(el("p", { id: "left-out" }, "Not in the circuit: " + out.map((h) =>
      h.layer + "." + h.head + " (effect " + (h.effect > 0 ? "+" : "") + num(h.effect, 2) + ", " + h.rank +
      (h.rank % 100 >= 10 && h.rank % 100 <= 20 ? "th" : ({ 1: "st", 2: "nd", 3: "rd" })[h.rank % 10] || "th") +
      " of " + h.of + " heads by |effect|)").join("; ") + "."));
  }
}

function drawLegend() {
  const box = document.getElementById("legend");
  [["#e6550d", "edge whose corruption lowers the logit difference"], ["#3182bd", "raises it"]].forEach((pair) => {
    const item = el("span", { class: "edge-key" });
    const bar = el("b");
    bar.style.background = pair[0];
    item.appendChild(bar);
    item.appendChild(document.createTextNode(pair[1]));
    box.appendChild(item);
  });
  if (data.nodes.some((n) => n.kind === "mlp")) {
    const item = el("span", { class: "mlp-key" });
    const square = el("i");
    square.style.background = MLP_COLOUR;
    item.appendChild(square);
    item.appendChild(document.createTextNode("MLP, above its layer's heads"));
    box.appendChild(item);
  }
  const present = new Set(data.nodes.filter((n) => n.kind === "head").map((n) => n.class));
  Object.keys(CLASS_COLOURS).filter((c) => present.has(c)).forEach((c) => {
    const item = el("span", { "data-class": c });
    const dot = el("i");
    dot.style.background = CLASS_COLOURS[c];
    item.appendChild(dot);
    item.appendChild(document.createTextNode(c));
    box.appendChild(item);
  });
}

function drawCurve() {
  const W = 400, H = 220, m = { l: 44, r: 10, t: 10, b: 34 };
  const pts = data.curve.filter((p) => p.edges > 0);
  const svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "faithfulness against edges" });
  const lx = (e) => m.l + (W - m.l - m.r) * Math.log10(e) / Math.log10(Math.max(10, data.edges_total));
  const lo = Math.min(0, Math.min.apply(null, pts.map((p) => p.faithfulness)));
  const hi = Math.max(1.05, Math.max.apply(null, pts.map((p) => p.faithfulness)));
  const ly = (f) => H - m.b - (H - m.t - m.b) * (f - lo) / (hi - lo);
  [0.8, 0.9].forEach((t) => svg.appendChild(svgEl("line", { x1: m.l, x2: W - m.r, y1: ly(t), y2: ly(t), stroke: "#ccc", "stroke-dasharray": "3 3" })));
  svg.appendChild(svgEl("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b, stroke: "#999" }));
  svg.appendChild(svgEl("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, stroke: "#999" }));
  svg.appendChild(svgEl("polyline", { points: pts.map((p) => lx(p.edges) + "," + ly(p.faithfulness)).join(" "), fill: "none", stroke: "#3182bd", "stroke-width": 2 }));
  pts.forEach((p) => {
    const chosen = data.circuit && p.edges === data.circuit.edges;
    const c = svgEl("circle", { cx: lx(p.edges), cy: ly(p.faithfulness), r: chosen ? 5 : 2.5, fill: chosen ? "#d62728" : "#3182bd", "data-edges": p.edges });
    c.appendChild(svgEl("title", {}, p.edges + " edges: " + fmt(p.faithfulness, 3)));
    svg.appendChild(c);
  });
  svg.appendChild(svgEl("text", { x: (W + m.l) / 2, y: H - 6, "text-anchor": "middle", "font-size": 11 }, "edges kept (log scale)"));
  svg.appendChild(svgEl("text", { x: 12, y: (H - m.b) / 2, "font-size": 11, transform: "rotate(-90 12 " + (H - m.b) / 2 + ")", "text-anchor": "middle" }, "faithfulness"));
  [0, 0.5, 1].forEach((f) => svg.appendChild(svgEl("text", { x: m.l - 4, y: ly(f) + 4, "font-size": 10, "text-anchor": "end" }, f)));
  [0.8, 0.9].forEach((t) => svg.appendChild(svgEl("text", { x: W - m.r, y: ly(t) - 2, "font-size": 9, fill: "#777", "text-anchor": "end", class: "target" }, (100 * t) + "%")));
  for (let e = 1; e <= Math.max(10, data.edges_total); e *= 10) {  // a tick at each power of ten
    svg.appendChild(svgEl("line", { x1: lx(e), x2: lx(e), y1: H - m.b, y2: H - m.b + 4, stroke: "#999" }));
    svg.appendChild(svgEl("text", { x: lx(e), y: H - m.b + 14, "font-size": 9, "text-anchor": "middle", class: "tick" },
      e >= 1000 ? e / 1000 + "k" : String(e)));
  }
  document.getElementById("curve").appendChild(svg);
  // the curve's key: the red dot is the circuit kept
  const key = el("p", { id: "curve-key", class: "muted" });
  [["#3182bd", "a circuit measured"], ["#d62728", "the circuit kept: " + (data.circuit ? data.circuit.edges +
    " edges, " + num(100 * data.circuit.faithfulness, 1) + "%" : "none")]].forEach(([colour, words], i) => {
    const item = el("span", { class: i ? "kept" : "point" });
    const dot = el("i");
    dot.style.background = colour;
    item.appendChild(dot);
    item.appendChild(document.createTextNode(words));
    key.appendChild(item);
  });
  key.appendChild(el("span", {}, "dashed: 80% and 90% of the logit difference"));
  document.getElementById("curve").appendChild(key);
}

function table(head, rows) {
  const t = el("table");
  const tr = el("tr");
  head.forEach((h) => tr.appendChild(el("th", {}, h)));
  t.appendChild(tr);
  rows.forEach((r) => {
    const row = el("tr");
    r.forEach((c, i) => row.appendChild(el("td", i > 0 && typeof c === "number" ? { class: "num" } : {}, c)));
    t.appendChild(row);
  });
  return t;
}

function drawTables() {
  const classes = document.getElementById("classes");
  if (!NAMED) {
    classes.appendChild(el("p", { class: "muted" }, "Heads not named: run headlab circuit without --no-classes to measure their classes."));
  }
  const named = (c) => data.classes[c].map((h) => h[0] + "." + h[1]).join(", ");
  const rows = Object.keys(data.classes).filter((c) => c !== "unexplained").map((c) => [c, named(c)]);
  const none = (data.classes.unexplained || []).length;
  if (NAMED) classes.appendChild(rows.length ? table(["class", "heads"], rows) : el("p", { class: "muted" }, "No head of the circuit is named by a class."));
  if (none) {
    const more = el("details", { id: "unexplained" });
    more.appendChild(el("summary", {}, none + " heads of the circuit unexplained"));
    more.appendChild(el("p", { class: "muted" }, named("unexplained")));
    classes.appendChild(more);
  }
  const rules = data.class_rules || {};
  if (Object.keys(rules).length) {
    const list = el("ul", { class: "muted" });
    Object.keys(rules).forEach((c) => list.appendChild(el("li", {}, c + ": " + rules[c])));
    classes.appendChild(list);
  } else if (NAMED) {
    classes.appendChild(el("p", { class: "muted" }, "The prompts are not IOI-shaped: heads are not named by the IOI paper's classes."));
  }
  document.getElementById("edges").appendChild(table(["sender", "receiver", "score"],
    data.edges.slice(0, 20).map((e) => [e.sender, e.receiver, fmt(e.score, 4)])));
}

const c = data.circuit;
document.getElementById("summary").textContent = data.method.toUpperCase() + (data.steps ? " (" + data.steps + " steps)" : "") +
  " edge scores on " + data.n_prompts + " prompts (logit difference " + num(data.clean, 2) + " clean, " + num(data.corrupt, 2) +
  " corrupted); measured on " + data.n_eval_prompts + " held-out prompts (" + data.eval_task + "): the circuit kept has " +
  c.edges + " of " + data.edges_total + " edges and keeps " + num(100 * c.faithfulness, 1) + "% of the logit difference" +
  (data.reached === false ? ": no circuit measured reached " + Math.round(100 * data.target) + "%, so the most faithful is kept." : ".");
drawGraph();
drawLegend();
drawCurve();
drawTables();
document.body.setAttribute("data-ready", "1");
