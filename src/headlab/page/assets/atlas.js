// The atlas of head cards: headlab cards' JSON (headlab.cards/1) as a grid of heads, each a
// permalink (#L.H) to its card, filtered by role, by patching effect and by what the head
// promotes. Nodes are built with textContent (draw.js's el), never innerHTML: tokens and
// verdicts show as text.
const data = JSON.parse(document.getElementById("data").textContent);
const STYLES = data.styles;
const cards = data.cards;
const byId = {};
cards.forEach((c) => { byId[c.id] = c; });
// the built-in tasks patched: those whose prompts this tokenizer could draw
const tasksDone = data.settings.tasks.filter((t) => !(("task " + t) in data.skipped));
const patched = !("patch" in data.skipped) && tasksDone.length > 0;

function roleOf(c) { return c.looks ? c.looks.role : null; }
function num(v, digits) {
  if (v === null || v === undefined) return "\u2013";
  if (v !== 0 && Math.abs(v) < Math.pow(10, -digits)) return Number(v).toPrecision(2);
  return fmt(v, digits);
}
function pctOf(v) { return v === null || v === undefined ? "\u2013" : fmt(100 * v, 2) + "%"; }
function headLink(id) { return el("a", { href: "#" + id }, id); }
function cmd(key) {
  const text = data.commands[key];
  return text ? el("div", { class: "cmd" }, "$ " + text) : el("span");
}
function rowsTable(headers, rows, numeric) {
  const t = el("table", { class: "data" });
  const tr = el("tr");
  headers.forEach((h) => tr.appendChild(el("th", {}, h)));
  t.appendChild(tr);
  rows.forEach((r) => {
    const row = el("tr");
    r.forEach((c, i) => {
      const td = el("td", numeric && numeric.indexOf(i) >= 0 ? { class: "num" } : {});
      if (c instanceof Node) td.appendChild(c); else td.textContent = String(c);
      row.appendChild(td);
    });
    t.appendChild(row);
  });
  return t;
}

// ---------------------------------------------------------------- the filters
const fRole = document.getElementById("f-role"), fTask = document.getElementById("f-task");
const fEffect = document.getElementById("f-effect"), fToken = document.getElementById("f-token");
const fVerdict = document.getElementById("f-verdict");
function matches(c) {
  const role = fRole.value;
  if (role && (roleOf(c) || "no roles run") !== role) return false;
  const bar = parseFloat(fEffect.value);
  if (patched && !isNaN(bar)) {
    const e = c.does.patching[fTask.value];
    if (e === null || e === undefined || e < bar) return false;
  }
  const token = fToken.value.trim().toLowerCase();
  if (token) {
    const written = c.writes.promoted || [];
    if (!written.some((t) => t.token.trim().toLowerCase().indexOf(token) >= 0)) return false;
  }
  const words = fVerdict.value.trim().toLowerCase();
  return !words || c.verdict.toLowerCase().indexOf(words) >= 0;
}
function refresh() {
  const shown = cards.filter(matches);
  const ids = new Set(shown.map((c) => c.id));
  cards.forEach((c) => {
    document.getElementById("cell-" + c.id).classList.toggle("dim", !ids.has(c.id));
  });
  document.getElementById("f-count").textContent = shown.length + " of " + cards.length + " heads";
  const list = document.getElementById("list");
  list.replaceChildren(rowsTable(["head", "role", "verdict"],
    shown.map((c) => [headLink(c.id), roleOf(c) || "\u2013", c.verdict])));
}
function setUpFilters() {
  const present = [];
  cards.forEach((c) => {
    const r = roleOf(c) || "no roles run";
    if (present.indexOf(r) < 0) present.push(r);
  });
  present.forEach((r) => fRole.appendChild(el("option", { value: r }, r)));
  tasksDone.forEach((t) => fTask.appendChild(el("option", { value: t }, t)));
  if (!patched) { fEffect.disabled = true; fTask.disabled = true; }
  [fRole, fTask, fEffect, fToken, fVerdict].forEach((f) => f.addEventListener("input", refresh));
  document.getElementById("f-clear").addEventListener("click", () => {
    fRole.value = ""; fEffect.value = ""; fToken.value = ""; fVerdict.value = "";
    refresh();
  });
}

// ---------------------------------------------------------------- the grid
// grid.js's grid of heads, each cell in its role's colour and letter; a click opens the card
// at its permalink (#L.H)
function atlasGrid() {
  const t = headGrid(data.heads_in_layer, {
    cell: (b, l, h) => {
      const c = byId[l + "." + h];
      b.id = "cell-" + c.id;
      b.title = c.id + ": " + c.verdict;
      b.textContent = "\u00b7";
    },
    roles: { of: (l, h) => (roleOf(byId[l + "." + h]) ? byId[l + "." + h].looks : null), style: STYLES, fill: true },
    onClick: (l, h) => { location.hash = "#" + l + "." + h; },
  });
  document.getElementById("grid").replaceChildren(t);
  const legend = document.getElementById("legend");
  Object.keys(STYLES).forEach((r) => {
    if (!cards.some((c) => roleOf(c) === r)) return;
    const i = el("i");
    i.style.background = STYLES[r].colour;
    const span = el("span");
    span.append(i, STYLES[r].letter + " " + r);
    legend.appendChild(span);
  });
}

// ---------------------------------------------------------------- one card
function examplesPart(examples) {
  const box = el("div", { class: "examples" });
  if (!examples.length) {
    box.appendChild(el("p", { class: "muted" }, "no attention off the sink and special tokens"));
    return box;
  }
  examples.forEach((ex) => {
    const words = data.sample[ex.sentence] || [];
    const line = el("p", { class: "example" });
    line.appendChild(el("span", { class: "weight" }, fmt(ex.weight, 2)));
    words.forEach((w, i) => {
      const cls = i === ex.query && i === ex.key ? "q k" : i === ex.query ? "q" : i === ex.key ? "k" : "";
      line.append(" ", el("span", cls ? { class: cls } : {}, w));
    });
    box.appendChild(line);
  });
  return box;
}
function looksPart(c) {
  const box = el("div");
  box.appendChild(el("h3", {}, "Where it looks"));
  const lk = c.looks || {};
  if (!lk.role) {
    box.appendChild(el("p", { class: "muted" }, "no roles run (" + (data.skipped.roles || "none") + ")"));
  } else {
    box.appendChild(rowsTable(["role", "roles", "score", "bar", "folds agree", "resamples agree", "detail"],
      [[lk.role, (lk.roles || []).join(", ") || "\u2013", num(lk.score, 3), num(lk.baseline, 3),
        lk.fold_agreement === null || lk.fold_agreement === undefined ? "\u2013" : pctOf(lk.fold_agreement),
        lk.bootstrap_stability === null || lk.bootstrap_stability === undefined ? "\u2013" : pctOf(lk.bootstrap_stability),
        lk.detail || ""]], [2, 3]));
    const scores = Object.entries(lk.scores || {}).filter(([, v]) => v !== null);
    const chips = el("p", { class: "scores" });
    scores.forEach(([k, v]) => chips.append(el("span", {}, k + " " + num(v, 3)), " "));
    box.appendChild(chips);
    box.appendChild(cmd("looks.roles"));
  }
  if (lk.examples) {
    box.appendChild(el("p", { class: "muted" }, "Top examples: the query word underlined, the key it attends to most (sink and special tokens aside) highlighted"));
    box.appendChild(examplesPart(lk.examples));
    box.appendChild(cmd("looks.examples"));
  }
  return box;
}
function readsPart(c) {
  const box = el("div");
  box.appendChild(el("h3", {}, "What it reads"));
  if (!c.reads) {
    box.appendChild(el("p", { class: "muted" }, "not measured (" + (data.skipped.compose || "") + ")"));
    return box;
  }
  if (c.layer === 0) {
    box.appendChild(el("p", { class: "muted" }, "the first layer reads no earlier head"));
    return box;
  }
  const rows = [];
  ["q", "k", "v"].forEach((kind) => {
    (c.reads[kind] || []).forEach((s) => rows.push([kind.toUpperCase(), headLink(s.head),
      roleOf(byId[s.head]) || "\u2013", num(s.score, 3), num(s.x_baseline, 2) + "\u00d7"]));
  });
  box.appendChild(rowsTable(["composition", "sender", "its role", "score", "\u00d7 baseline"], rows, [3, 4]));
  box.appendChild(cmd("reads.k"));
  return box;
}
function tokens(list) {
  const span = el("span");
  (list || []).forEach((t) => {
    span.append(el("span", { class: "token", title: "id " + t.id + ", logit " + num(t.logit, 3) }, t.token), " ");
  });
  return span;
}
function writesPart(c) {
  const box = el("div"), w = c.writes;
  box.appendChild(el("h3", {}, "What it writes"));
  if (!w.promoted) {
    box.appendChild(el("p", { class: "muted" }, data.skipped.writes || "no unembedding"));
  } else {
    box.appendChild(rowsTable(["", "tokens (through the " + w.unembedding + ")"],
      [["promotes", tokens(w.promoted)], ["suppresses", tokens(w.suppressed)]]));
    box.appendChild(cmd("writes.promoted"));
  }
  const rows = [["copying score", num(w.copying, 3)]];
  Object.entries(w.dla || {}).forEach(([t, v]) => rows.push(["direct logit attribution, " + t, num(v, 3)]));
  box.appendChild(rowsTable(["", "value"], rows, [1]));
  return box;
}
function doesPart(c) {
  const box = el("div");
  box.appendChild(el("h3", {}, "What it does"));
  const entries = Object.entries(c.does.patching || {});
  if (!entries.length) {
    box.appendChild(el("p", { class: "muted" }, "not patched (" + (data.skipped.patch || "") + ")"));
    return box;
  }
  box.appendChild(rowsTable(["task", "activation-patching effect (" + data.settings.position + " position)"],
    entries.map(([t, v]) => [t, pctOf(v)]), [1]));
  box.appendChild(cmd("does.patching." + entries[0][0]));
  const named = c.does.ioi_class;
  if (named) {
    box.appendChild(rowsTable(["IOI class (as headlab circuit names heads)", "attends end \u2192 IO", "end \u2192 S", "copies the IO"],
      [[named.class, num(named.end_to_io, 3), num(named.end_to_s, 3), num(named.copying, 2)]], [1, 2, 3]));
    box.appendChild(cmd("does.ioi_class"));
  }
  return box;
}
function costsPart(c) {
  const box = el("div"), k = c.costs;
  box.appendChild(el("h3", {}, "What it costs"));
  box.appendChild(rowsTable(["attention FLOPs", "KV cache", "pruning importance", "rank"],
    [[pctOf(k.flops_share), k.kv_share === null ? "none (an encoder)" : pctOf(k.kv_share),
      num(k.importance, 4), k.importance_rank === null ? "\u2013" : k.importance_rank + " of " + cards.length]],
    [0, 1, 2]));
  box.appendChild(cmd("costs.importance"));
  return box;
}
function show(id) {
  const c = byId[id], box = document.getElementById("card");
  document.querySelectorAll("#grid button.chosen").forEach((b) => b.classList.remove("chosen"));
  if (!c) {
    box.replaceChildren(el("p", { class: "muted" }, id ? "No head " + id + " in this model." : "Choose a head in the grid."));
    return;
  }
  document.getElementById("cell-" + id).classList.add("chosen");
  box.replaceChildren(el("h2", { id: "card-title" }, "Head " + c.id + " (layer " + c.layer + ", head " + c.head + ")"),
    el("p", { class: "verdict" }, c.verdict), looksPart(c), readsPart(c), writesPart(c), doesPart(c), costsPart(c));
}

// ---------------------------------------------------------------- start
document.getElementById("summary").textContent = data.model + ": " + cards.length + " heads in " +
  data.layers + " layers; roles from " + (data.roles_from || "none") +
  (patched ? "; patched on " + tasksDone.join(", ") + " (" + data.settings.n + " prompts, seed " + data.settings.seed + ")" : "");
const gone = Object.entries(data.skipped);
document.getElementById("skipped").textContent = gone.length
  ? "Left out: " + gone.map(([k, v]) => k + " (" + v + ")").join("; ") : "";
data.rules.forEach((r) => document.getElementById("rule-list").appendChild(el("li", {}, r)));
atlasGrid();
setUpFilters();
refresh();
window.addEventListener("hashchange", () => show(decodeURIComponent(location.hash.slice(1))));
show(decodeURIComponent(location.hash.slice(1)));
document.body.setAttribute("data-ready", "1");
