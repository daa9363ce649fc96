// ---------------------------------------------------------------- patching and the circuit
// A patching result (data.patching: headlab.report.causal.patched_heads) and a circuit
// (data.circuit: circuit_heads) each have a section of their own, written with its figure by
// headlab.page.html.section. Here their heads become links to the grid and the viewer, and a
// head of the grid that appears in either links to its section (causalNotes, called by the
// panel of report.js: a function declaration, so it reads only `data`, never a name of this
// part that report.js would reach before it is set).

function signedEffect(v) { return (v > 0 ? "+" : "") + fmt(v, 2); }
function ordinal(n) {
  const tail = n % 100 >= 10 && n % 100 <= 20 ? "th" : ({ 1: "st", 2: "nd", 3: "rd" })[n % 10] || "th";
  return n + tail;
}
function findHead(list, layer, head) {
  return (list || []).find((x) => x.layer === layer && x.head === head) || null;
}

// what the causal sections say of one head: [{href, text}], none when it is in neither
function causalNotes(layer, head) {
  const notes = [];
  const p = data.patching, c = data.circuit;
  const patched = p ? findHead(p.heads, layer, head) : null;
  if (patched) {
    const kv = patched.kv_head === undefined ? "" : " (its KV head " + layer + "." + patched.kv_head + ")";
    notes.push({ href: "#patch-section", text: "Patching " + p.task + ": effect " +
      signedEffect(patched.effect) + kv + ", " + ordinal(patched.rank) + " of " + p.count + " by |effect|" });
  }
  if (c) {
    const kept = findHead(c.heads, layer, head), out = findHead(c.left_out, layer, head);
    if (kept) {
      notes.push({ href: "#circuit-section", text: "In the circuit of " + c.task +
        (kept.class ? " as " + kept.class : "") +
        (kept.dla === null || kept.dla === undefined ? "" : ", direct logit attribution " + signedEffect(kept.dla)) });
    } else if (out) {
      notes.push({ href: "#circuit-section", text: "Not in the circuit of " + c.task +
        (c.left_out_by === "edges" ? ": its effect estimated from its edges " : ", though patching gives it ") +
        signedEffect(out.effect) + " (" + ordinal(out.rank) + " by |effect|)" });
    }
  }
  return notes;
}

// the notes as links, for the head's panel
function causalLinks(layer, head) {
  const notes = causalNotes(layer, head);
  if (!notes.length) return [];
  const box = el("ul", { class: "causal-notes" });
  notes.forEach((n) => {
    const item = el("li");
    item.appendChild(el("a", { href: n.href }, n.text));
    box.appendChild(item);
  });
  return [box];
}

// a cell of the grid: what the sections say of its head, in its title
function causalTitle(button, layer, head) {
  const notes = causalNotes(layer, head);
  if (notes.length) {
    button.title += " \u2014 " + notes.map((n) => n.text).join("; ");
    button.classList.add("causal");
  }
}

// a head as a link that opens it in the grid's panel and the viewer
function headLink(layer, head, label) {
  const go = el("button", { class: "link", "data-layer": layer, "data-head": head,
    title: "show in the head grid and the viewer" }, label || layer + "." + head);
  go.addEventListener("click", () => {
    selectHead(layer, head);
    document.getElementById("head-grid").scrollIntoView();
  });
  return go;
}

// a button that outlines `heads` ([[layer, head]]) in the grid, as the decoder's roles do
function markButton(heads, label) {
  const mark = el("button", { class: "mark", "aria-pressed": "false" }, label);
  mark.addEventListener("click", () => {
    const on = mark.getAttribute("aria-pressed") !== "true";
    document.querySelectorAll("button.mark").forEach((b) => b.setAttribute("aria-pressed", "false"));
    document.querySelectorAll("#grid button.marked").forEach((b) => b.classList.remove("marked"));
    if (!on) return;
    mark.setAttribute("aria-pressed", "true");
    heads.forEach(([l, h]) => {
      const b = document.querySelector('#grid button[data-layer="' + l + '"][data-head="' + h + '"]');
      if (b) b.classList.add("marked");
    });
  });
  return mark;
}

function drawPatching(p) {
  const box = document.getElementById("patch-heads");
  const kv = p.unit === "kv_head";
  const group = (layer, kvHead) => p.heads.filter((x) => x.layer === layer && x.kv_head === kvHead).map((x) => x.head);
  const t = table([kv ? "KV head (its query heads)" : "head", "effect", "rank", "primary role",
    data.circuit ? "in the circuit" : null].filter((x) => x !== null), []);
  const marked = [];
  p.top.forEach((r) => {
    const heads = kv ? group(r.layer, r.kv_head) : [r.head];
    heads.forEach((h) => marked.push([r.layer, h]));
    const row = el("tr", { "data-layer": r.layer, "data-head": heads[0], class: "pick" });
    const cell = el("td");
    cell.appendChild(headLink(r.layer, heads[0], kv
      ? r.layer + "." + r.kv_head + " (" + heads.map((h) => r.layer + "." + h).join(", ") + ")"
      : r.layer + "." + r.head));
    row.appendChild(cell);
    row.appendChild(el("td", {}, signedEffect(r.effect)));
    row.appendChild(el("td", {}, r.rank));
    const info = headInfo(r.layer, heads[0]);
    row.appendChild(el("td", {}, info ? info.role : "\u2013"));
    if (data.circuit) {
      row.appendChild(el("td", {}, heads.some((h) => findHead(data.circuit.heads, r.layer, h)) ? "yes" : "no"));
    }
    t.appendChild(row);
  });
  box.appendChild(el("p", { class: "muted" }, "The " + p.top.length + " of " + p.count + " " +
    (kv ? "KV heads" : "heads") + " of largest |effect|; click one to see it in the head grid and the viewer " +
    "(a head's panel there links back here)."));
  box.appendChild(t);
  box.appendChild(markButton(marked, "mark them in the grid"));
}

function drawCircuit(c) {
  const box = document.getElementById("circuit-heads");
  box.appendChild(el("p", {}, c.edges + " of " + c.edges_total + " edges keep " +
    fmt(100 * c.faithfulness, 0) + "% of the logit difference on held-out prompts; " +
    c.heads.length + " of " + roles.heads.length + " heads send along them."));
  const byClass = {};
  c.heads.forEach((h) => { const k = h.class || "not named (--no-classes)"; (byClass[k] = byClass[k] || []).push(h); });
  const list = el("ul", { class: "circuit-classes" });
  Object.keys(byClass).forEach((k) => {
    const heads = byClass[k].slice().sort((a, b) => Math.abs(b.dla || 0) - Math.abs(a.dla || 0));
    const item = el("li", { "data-class": k });
    item.appendChild(el("b", {}, k + " (" + heads.length + "): "));
    heads.forEach((h, i) => {
      if (i) item.appendChild(document.createTextNode(", "));
      item.appendChild(headLink(h.layer, h.head));
    });
    const many = k === "unexplained" || k.startsWith("not named");
    if (many && heads.length > 12) {  // folded: the long list of heads no class explains
      const more = el("details");
      more.appendChild(el("summary", {}, k + ": " + heads.length + " heads"));
      more.appendChild(item);
      const wrap = el("li");
      wrap.appendChild(more);
      list.appendChild(wrap);
    } else {
      list.appendChild(item);
    }
  });
  box.appendChild(list);
  if (c.left_out.length) {
    const out = el("p", { id: "left-out" });
    out.appendChild(el("b", {}, c.left_out_by === "edges"
      ? "Not in the circuit (effects estimated from their edges, rank by |effect|): "
      : "Not in the circuit, though patching ranks them high: "));
    c.left_out.forEach((r, i) => {
      if (i) out.appendChild(document.createTextNode("; "));
      out.appendChild(headLink(r.layer, r.head));
      out.appendChild(document.createTextNode(" " + signedEffect(r.effect) + " (" + ordinal(r.rank) + ")"));
    });
    box.appendChild(out);
  }
  box.appendChild(markButton(c.heads.map((h) => [h.layer, h.head]), "mark the circuit's heads in the grid"));
}

if (data.patching) drawPatching(data.patching);
if (data.circuit) drawCircuit(data.circuit);
if (data.patching || data.circuit) {  // the grid says where its heads lead
  document.getElementById("grid-note").appendChild(document.createTextNode(" A head's panel " +
    "links to the sections of " + (data.patching && data.circuit ? "patching and the circuit"
      : data.patching ? "patching" : "the circuit") + " where the head appears in them."));
}
