// ---------------------------------------------------------------- decoder heads
// Every decoder role of the roles result (headlab.report.decoder finds them; none are named
// here): its bar, its best heads by score, and a button that marks its heads in the grid.
const dec = data.decoder;
if (dec) {
  document.getElementById("decoder-section").hidden = false;
  const box = document.getElementById("decoder");
  if (!dec.roles.length) {
    box.appendChild(el("p", { class: "muted" }, "No decoder probe ran in this run."));
  }
  const extras = dec.extra_scores || [];
  dec.roles.forEach((r) => {
    const block = el("div", { class: "decoder-role", "data-role": r.role });
    const title = el("h3");
    const swatch = el("i", { class: "swatch" });
    swatch.style.background = COLOURS[r.role] || "#ccc";
    title.appendChild(swatch);
    title.appendChild(document.createTextNode(r.role + " heads"));
    block.appendChild(title);
    block.appendChild(el("p", {}, r.clearing + " of " + roles.heads.length + " heads clear the bar" +
      (r.bar === null || r.bar === undefined ? "" : " of " + fmt(r.bar, 2)) + "; " + r.dominant +
      (r.dominant === 1 ? " has it" : " have it") + " as primary role (" + LETTERS[r.role] +
      " in the grid)."));
    const t = table(["head", "score"].concat(extras, ["clears the bar", "primary role"]), []);
    r.top.forEach((h) => {
      const info = headInfo(h.layer, h.head);
      const row = el("tr", { "data-layer": h.layer, "data-head": h.head, class: "pick" });
      const link = el("td");
      const go = el("button", { class: "link", title: "open in the viewer" }, "layer " + h.layer + ", head " + h.head);
      go.addEventListener("click", () => selectHead(h.layer, h.head));
      link.appendChild(go);
      row.appendChild(link);
      row.appendChild(el("td", {}, fmt(h.score)));
      extras.forEach((k) => row.appendChild(el("td", {}, fmt(info ? info.scores[k] : null))));
      row.appendChild(el("td", {}, h.clears ? "yes" : "no"));
      row.appendChild(el("td", {}, info ? info.role : "\u2013"));
      t.appendChild(row);
    });
    block.appendChild(t);
    const mark = el("button", { class: "mark", "aria-pressed": "false" }, "mark in the grid");
    mark.addEventListener("click", () => {
      const on = mark.getAttribute("aria-pressed") !== "true";
      document.querySelectorAll("button.mark").forEach((b) => b.setAttribute("aria-pressed", "false"));
      document.querySelectorAll("#grid button.marked").forEach((b) => b.classList.remove("marked"));
      if (on) {
        mark.setAttribute("aria-pressed", "true");
        document.querySelectorAll("#grid button").forEach((b) => {
          if ((b.getAttribute("data-roles") || "").split(" ").includes(r.role)) b.classList.add("marked");
        });
      }
    });
    block.appendChild(mark);
    box.appendChild(block);
  });
}

// ---------------------------------------------------------------- the other model's page
const other = data.companion;
const comp = document.getElementById("companion");
if (other) {
  comp.appendChild(document.createTextNode("The " + other.kind + "'s page (" + other.model + "): "));
  comp.appendChild(el("a", { href: other.href, id: "companion-link" }, other.href));
  comp.appendChild(document.createTextNode(
    other.found ? " (rebuild it with " : " (not written when this page was; make it with "));
  comp.appendChild(el("code", {}, other.command));
  comp.appendChild(document.createTextNode(")."));
} else {
  comp.remove();
}

// ---------------------------------------------------------------- start on the lesson
state.word = data.focus.index;
state.layer = 0;
state.head = "all";
fillHeads();
renderViewer();
// an encoder opens on every head of layer 0 and a syntactic head's details; a decoder on the
// head whose attention from the focus word goes most to one earlier word, the sink and the word
// just before left aside (previous-token heads have their own list); on SmolLM2 layer 4, head 7,
// from the IOI prompt's last "to" to "the", the word after the earlier "to" (induction-like)
function focusHead(s, i) {
  let found = null;
  s.data.heads_in_layer.forEach((n, l) => {  // the sentence's own heads
    for (let h = 0; h < n; h++) {
      const p = s.pattern(l, h);
      for (let j = 0; j < i - 1; j++) {
        if (setApart(s.side, i, j)) continue;  // grid.js's one rule: special tokens and the sink
        if (found === null || p[i][j] > found[2]) found = [l, h, p[i][j]];
      }
    }
  });
  return found;
}
const opened = causal && data.focus.index > 0
  ? focusHead(sentences[data.focus.sentence], data.focus.index) : null;
if (opened) {
  selectHead(opened[0], opened[1]);
} else {
  const best = roles.heads.find((h) => h.role === "syntactic") || roles.heads[0];
  showDetails(best.layer, best.head);
}
document.body.setAttribute("data-ready", "1");
