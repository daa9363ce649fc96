// headlab report: everything below builds DOM nodes with textContent, never innerHTML, so any
// text from the model, the data or the user shows as text. draw.js, grid.js, this file,
// tables.js and decoder.js are parts of one function (headlab.page.html joins them): they share
// its names.
const data = JSON.parse(document.getElementById("headlab-data").textContent);
// each sentence is the explorer's (headlab.sentence/1), read by draw.js's one reader: its words
// (and sink), each head's weights p[query][key] and the notice of a long input
const sentences = data.sentences.map(readSentence);
// each role's colour and letter come with the data, so a role headlab adds shows up here too
const COLOURS = {}, LETTERS = {};
Object.entries(data.role_style).forEach(([r, s]) => { COLOURS[r] = s.colour; LETTERS[r] = s.letter; });
const roles = data.roles;
const causal = !!data.causal;
const state = { sentence: data.focus.sentence, layer: 0, head: 0, mode: "lines", word: -1 };

// heads of each layer: fewer in some layers of a model pruned layer by layer
const layerHeads = roles.heads_in_layer || Array(roles.layers).fill(roles.heads_per_layer);
const headInfo = roleLookup(roles.heads);  // grid.js: a head of the roles run, or null

// ---------------------------------------------------------------- header
document.getElementById("model").textContent = data.model;
const counts = Object.entries(roles.role_counts).filter(([, n]) => n > 0)
  .map(([r, n]) => r + " " + n).join(", ");
const sp0 = data.spec;
document.getElementById("summary").textContent =
  (causal ? "A causal decoder: each token attends only to itself and earlier tokens. " : "") +
  data.layers + " layers \u00d7 " + (roles.heads_in_layer && new Set(layerHeads).size > 1
    ? "[" + layerHeads.join(", ") + "] heads (pruned layer by layer)" : data.heads + " heads") +
  (causal && sp0.n_kv_heads < sp0.n_heads ? " sharing " + sp0.n_kv_heads + " KV heads (" +
    sp0.kind + ": " + sp0.group_size + " query heads per KV head)" : "") +
  ". Heads per primary role: " + counts +
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
if (roles.heads.some((h) => h.stable === false)) {
  const s = el("span");
  s.appendChild(el("i", { class: "unstable" }));
  s.appendChild(document.createTextNode("hatched: unstable (its role did not replicate)"));
  legend.appendChild(s);
}
// grid.js's grid of heads: each cell in its role's colour and letter
const gridBox = document.getElementById("grid");
gridBox.appendChild(headGrid(layerHeads, {
  roles: { of: headInfo, style: data.role_style, fill: true },
  decorate: causalTitle,  // causal.js: what patching and the circuit say of the head
  onClick: (l, h) => selectHead(l, h),
  onHover: (l, h) => showDetails(l, h),
}));

// grid.js's evidence panel of a head, with where the viewer's word attends in its sentence
// and the head's strongest link in each sentence of the page; links to the sections of
// patching and the circuit where the head appears in them (causal.js)
function showDetails(layer, head) {
  const s = sentences[state.sentence];
  const word = state.word >= 0 && state.word < s.side.words.length
    ? { side: s.side, row: s.pattern(layer, head)[state.word], index: state.word } : null;
  const panel = headPanel(layer, head, headInfo(layer, head), {
    word: word,
    examples: sentences.map((x) => ({ side: x.side, p: x.pattern(layer, head), text: x.data.text })),
  });
  panel.splice(1, 0, ...causalLinks(layer, head));
  document.getElementById("details").replaceChildren(...panel);
}

function selectHead(layer, head) {
  state.layer = layer;
  state.head = head;
  selectCell(gridBox, layer, head);
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

function headColour(h) { return hueColour(h, data.heads); }

// the viewer's drawings come from draw.js, with the viewer's state
function renderLines(s, heads) {
  const mats = heads.map((h) => ({
    p: s.pattern(state.layer, h), colour: heads.length > 1 ? headColour(h) : "#1f5fbf",
  }));
  return drawLines(s.side, mats, {
    word: state.word, causal: causal,
    onWord: (i) => { state.word = state.word === i ? -1 : i; renderViewer(); },
  });
}

function renderHeatmap(s, heads) {
  const mats = heads.map((h) => ({ p: s.pattern(state.layer, h), label: "head " + h }));
  return drawHeatmap(s.side, mats, { word: state.word, causal: causal });
}

function renderViewer() {
  const s = sentences[state.sentence];
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
  document.getElementById("notice").textContent = s.notice;
  const w = state.word >= 0 ? s.side.words[state.word] : null;
  document.getElementById("focus-note").textContent = state.mode !== "lines"
    ? (state.head === "all"
      ? "Each row is one head of layer " + state.layer + ": where \u201c" + (w || s.side.words[0]) +
        "\u201d sends its attention, one column per word"
      : "Each row is an attending word, each column a word it attends to, in layer " +
        state.layer + ", head " + state.head) +
      "; darker is more weight (the scale below runs from 0 to 1)." +
      (causal ? " Hatched cells are later words: a decoder's query cannot see them." : "")
    : w
    ? "Lines show where \u201c" + w + "\u201d sends its attention in layer " + state.layer +
      (state.head === "all" ? ", every head in its own colour." : ", head " + state.head + ".") +
      " Click another word to follow it, or the same word to show all." +
      (causal ? " Greyed words come later: a decoder's query cannot see them." : "")
    : "Click a word on the left to follow its attention." +
      (causal ? " A decoder's lines only go to the same or an earlier word." : "");
}

