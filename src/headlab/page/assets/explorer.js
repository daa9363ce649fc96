// The live explorer (headlab serve): one's own sentence through any bundled model, the heads
// view of heads.js, the chosen head's measured role, and heads switched off. Everything comes
// from the server's JSON API on the same origin (/api/...); nothing else is fetched.

const $ = (id) => document.getElementById(id);
const app = { models: [], limits: null, model: null, text: "", ablated: new Map(), roles: null, sentence: null, asked: 0 };

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}
function status(text, isError) {
  const s = $("status");
  s.textContent = text;
  s.className = isError ? "error" : "muted";
}
function offKey(l, h) { return l + "." + h; }

const view = headsView($("heads"), {
  roles: () => (app.roles && app.roles.source ? { of: roleOf, style: app.roles.role_style } : null),
  decorate: (button, l, h) => {
    if (app.ablated.has(offKey(l, h))) {
      button.classList.add("off");
      button.title += " (switched off)";
    }
  },
  onCell: (l, h, event) => (event.shiftKey ? toggle(l, h) : view.select(l, h)),
  onSelect: () => { showHead(); remember(); markThumb(); },
  onWord: () => { showHead(); remember(); drawThumbs(); },
  onWeighting: () => { remember(); drawThumbs(); },
});

// ---------------------------------------------------------------- the address bar
// #model=..&text=..&word=..&layer=..&head=..: a permalink to a sentence, a word and a head
function remember() {
  if (!app.text) return;
  const state = new URLSearchParams({
    model: app.model, text: app.text, word: String(view.word), layer: String(view.layer), head: String(view.head),
  });
  if (view.weighting !== "attention") state.set("weights", view.weighting);
  history.replaceState(null, "", "#" + state.toString());
}
function recalled() {
  const state = new URLSearchParams(location.hash.slice(1));
  return state.has("text") ? state : null;
}

// ---------------------------------------------------------------- the model view
function drawThumbs() {
  const box = $("thumbs");
  const d = view.data;
  box.replaceChildren();
  if (!d || !$("model-view").open) return;
  const most = Math.max.apply(null, d.heads_in_layer);
  box.style.gridTemplateColumns = "repeat(" + most + ", minmax(24px, 1fr))";
  const n = d.words.length;
  for (let l = 0; l < d.layers; l++) {
    for (let h = 0; h < most; h++) {
      if (h >= d.heads_in_layer[l]) { box.appendChild(el("span")); continue; }
      const c = el("canvas", { width: n, height: n, "data-layer": l, "data-head": h, title: "layer " + l + ", head " + h });
      const ctx = c.getContext("2d");
      const p = view.pattern(l, h, false);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < n; j++) {
          ctx.fillStyle = "rgba(31,95,191," + p[i][j] + ")";
          ctx.fillRect(j, i, 1, 1);
        }
      }
      c.addEventListener("click", () => view.select(l, h));
      box.appendChild(c);
    }
  }
  markThumb();
}
function markThumb() {
  document.querySelectorAll("#thumbs canvas.selected").forEach((c) => c.classList.remove("selected"));
  const c = document.querySelector('#thumbs canvas[data-layer="' + view.layer + '"][data-head="' + view.head + '"]');
  if (c) c.classList.add("selected");
}

// ---------------------------------------------------------------- export
function download(name, href) {
  const a = el("a", { href: href, download: name });
  document.body.appendChild(a);
  a.click();
  a.remove();
}
function exportName(ext) {
  return "headlab-" + (app.model || "model") + "-L" + view.layer + "H" + view.head + "." + ext;
}
function exportJson() {
  const d = view.data;
  if (!d) return;
  const out = {
    schema: "headlab.view/1", model: d.model, text: d.text, words: d.words, special: d.special,
    sink: d.sink, word: view.word >= 0 ? d.words[view.word] : null, layer: view.layer, head: view.head,
    weighting: view.weighting, pattern: view.pattern(view.layer, view.head, false), switched_off: [...app.ablated.values()],
  };
  download(exportName("json"), "data:application/json;charset=utf-8," + encodeURIComponent(JSON.stringify(out)));
}
function svgText() {
  const svg = document.querySelector("#heads .hl-lines svg");
  if (!svg) return null;
  const copy = svg.cloneNode(true);
  copy.setAttribute("xmlns", "http://www.w3.org/2000/svg");
  return new XMLSerializer().serializeToString(copy);
}
function exportSvg() {
  const text = svgText();
  if (text) download(exportName("svg"), "data:image/svg+xml;charset=utf-8," + encodeURIComponent(text));
}
function exportPng() {
  const text = svgText();
  if (!text) return;
  const svg = document.querySelector("#heads .hl-lines svg");
  const box = svg.getBoundingClientRect();
  const image = new Image();
  image.onload = () => {
    const c = el("canvas", { width: Math.ceil(2 * box.width), height: Math.ceil(2 * box.height) });
    const ctx = c.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, c.width, c.height);
    ctx.drawImage(image, 0, 0, c.width, c.height);
    download(exportName("png"), c.toDataURL("image/png"));
  };
  image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(text);
}

// ---------------------------------------------------------------- roles of a roles run
// a head of the model's roles run (grid.js's lookup, built once per run), or null
function roleOf(l, h) {
  return app.roles && app.roles.lookup ? app.roles.lookup(l, h) : null;
}
async function loadRoles() {
  try {
    app.roles = await api("/api/roles?model=" + encodeURIComponent(app.model));
  } catch (e) {
    app.roles = { source: null, note: String(e.message) };
  }
  app.roles.lookup = roleLookup(app.roles.heads);
  const note = $("roles-note");
  note.textContent = app.roles.source
    ? "Roles from " + app.roles.source + ", as a strip under each cell: "
    : app.roles.note;
  if (!app.roles.source) return;
  const present = new Set(app.roles.heads.map((x) => x.role));
  Object.entries(app.roles.role_style).filter(([r]) => present.has(r)).forEach(([r, style]) => {
    const swatch = el("i", { class: "swatch" });
    swatch.style.background = style.colour;
    note.appendChild(swatch);
    note.appendChild(document.createTextNode(r + " "));
  });
}

// ---------------------------------------------------------------- the chosen head
// grid.js's evidence panel, as the report shows it: where the chosen word attends, the head's
// measured role and its evidence, its strongest link in the sentence
function showHead() {
  const box = $("head-info");
  box.replaceChildren();
  const d = view.data;
  if (!d) return;
  const l = view.layer, h = view.head;
  const p = view.pattern(l, h, false);
  box.replaceChildren(...headPanel(l, h, roleOf(l, h), {
    word: view.word >= 0 ? { side: d, row: p[view.word], index: view.word } : null,
    examples: [{ side: d, p: p, text: d.text }],
    none: app.roles && !app.roles.source ? "No roles run for this model (see above)." : null,
  }));
  const off = app.ablated.has(offKey(l, h));
  const button = el("button", { id: "toggle", "aria-pressed": String(off) }, off ? "switch this head back on" : "switch this head off");
  button.addEventListener("click", () => toggle(l, h));
  box.appendChild(button);
}

// ---------------------------------------------------------------- heads switched off
function toggle(l, h) {
  const key = offKey(l, h);
  if (app.ablated.has(key)) app.ablated.delete(key);
  else app.ablated.set(key, [l, h]);
  view.render();
  showHead();
  ablate();
}
async function ablate() {
  const list = $("off-list");
  const pairs = [...app.ablated.values()].sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  list.textContent = pairs.length ? pairs.map(([l, h]) => l + "." + h).join(", ") : "none";
  if (!app.text) return;  // no sentence shown (the last one failed)
  const other = $("other").value.trim();
  const asked = ++app.asked;
  const box = $("effect");
  try {
    const effect = await api("/api/ablate", {
      model: app.model, text: app.text, ablate: pairs, other: other && !app.sentence.causal ? other : null,
      mode: $("mode").value,
    });
    if (asked !== app.asked) return;  // a later request is on its way
    box.replaceChildren(drawEffect(effect, pairs.length));
    box.setAttribute("data-off", pairs.length);
    box.setAttribute("data-mode", effect.mode);
  } catch (e) {
    if (asked === app.asked) status(e.message, true);
  }
}
function drawEffect(effect, n) {
  const wrap = el("div");
  if (effect.kind === "next-token") {
    // tokens quoted, so that a leading space or a newline shows
    const rows = effect.before.map((b, i) => [JSON.stringify(b.token), fmt(b.probability, 3),
      JSON.stringify(effect.after[i].token), fmt(effect.after[i].probability, 3)]);
    const t = el("table", { class: "data next-token" });
    const head = el("tr");
    ["next token", "p, all heads", "next token", "p, " + n + " off"].forEach((x) => head.appendChild(el("th", {}, x)));
    t.appendChild(head);
    rows.forEach((r) => {
      const tr = el("tr");
      r.forEach((c) => tr.appendChild(el("td", {}, c)));
      t.appendChild(tr);
    });
    wrap.appendChild(t);
  } else {
    wrap.appendChild(el("p", { class: "similarity" }, "Cosine of the sentence's embedding (mean-pooled) with all heads and with " +
      n + " off: " + fmt(effect.self_similarity, 4)));
    if (effect.other !== null) {
      wrap.appendChild(el("p", { class: "other-similarity" }, "Cosine with the second sentence: " +
        fmt(effect.other_before, 4) + " with all heads, " + fmt(effect.other_after, 4) + " with " + n + " off."));
    }
  }
  if (effect.resampled_from) {  // user-visible text of the reference sentence, as text
    wrap.appendChild(el("p", { class: "resampled muted" }, "The heads switched off say what they said, position by position, on \u201c" +
      effect.resampled_from + "\u201d (UD EWT)."));
  }
  return wrap;
}

// ---------------------------------------------------------------- a sentence
// a sentence refused: the old sentence's grid, head and effect would read as the new text's
function refused(message) {
  view.clear();
  $("head-info").replaceChildren();
  $("effect").replaceChildren();
  app.text = null;
  document.body.removeAttribute("data-sentence");
  status(message, true);
}
async function run() {
  const text = $("text").value;
  const limit = app.limits.characters;
  if (text.length > limit) {
    refused("Too long: " + text.length + " characters; the limit is " + limit + ".");
    return;
  }
  status("running\u2026");
  document.body.setAttribute("data-busy", "1");
  try {
    const started = performance.now();
    const data = await api("/api/sentence", { model: $("model").value, text: text });
    const modelChanged = data.key !== app.model;
    app.model = data.key;
    app.text = text;
    app.sentence = data;
    if (modelChanged) { app.ablated.clear(); await loadRoles(); }
    $("other-box").hidden = data.causal;
    view.show(data);
    if (app.pending) {  // a permalink: its word and head, once its sentence is shown
      const w = Number(app.pending.get("word")), l = Number(app.pending.get("layer")), h = Number(app.pending.get("head"));
      const weights = app.pending.get("weights") || "attention";
      app.pending = null;
      if (w >= 0 && w < data.words.length) view.word = w;
      if (l >= 0 && l < data.layers && h >= 0 && h < data.heads_in_layer[l]) { view.layer = l; view.head = h; }
      view.weigh(weights);
    }
    showHead();
    drawThumbs();
    remember();
    await ablate();
    status(data.model + ": " + data.words.length + " words, " + data.tokens.length + " tokens, " +
      Math.round(performance.now() - started) + " ms");
    document.body.setAttribute("data-sentence", text);
  } catch (e) {
    refused(e.message);
  } finally {
    document.body.removeAttribute("data-busy");
  }
}

async function start() {
  const answer = await api("/api/models");
  app.limits = answer.limits;
  const picker = $("model");
  answer.models.forEach((m) => {
    const option = el("option", { value: m.key }, m.label + (m.causal ? " (decoder)" : "") + (m.installed ? "" : " \u2014 " + m.note));
    if (!m.installed) option.disabled = true;
    if (m.default) option.selected = true;
    picker.appendChild(option);
  });
  $("text").value = answer.sentence;
  const asked = recalled();
  if (asked) {  // opened from a permalink
    $("text").value = asked.get("text");
    if ([...picker.options].some((o) => o.value === asked.get("model") && !o.disabled)) picker.value = asked.get("model");
    app.pending = asked;
  }
  $("model-view").addEventListener("toggle", drawThumbs);
  $("export-json").addEventListener("click", exportJson);
  $("mode").addEventListener("change", ablate);
  $("export-svg").addEventListener("click", exportSvg);
  $("export-png").addEventListener("click", exportPng);
  $("text").addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); run(); } });
  $("run").addEventListener("click", run);
  picker.addEventListener("change", run);
  $("clear").addEventListener("click", () => { app.ablated.clear(); view.render(); showHead(); ablate(); });
  $("other").addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); ablate(); } });
  await run();
  document.body.setAttribute("data-ready", "1");
}
start().catch((e) => status(e.message, true));
