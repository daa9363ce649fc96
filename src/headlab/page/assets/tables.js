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
if (rel.some((r) => r.q === null || r.q === undefined)) {  // say what a blank q means
  document.getElementById("relations").appendChild(el("p", { class: "muted", id: "untested" },
    "q \u2013: not tested, because the relation is outside the a-priori set or has fewer than " +
    minArcs + " arcs" + (roles.folds ? " in some of the " + roles.folds + " folds" : "") +
    " (too few to judge a head on it); its accuracy is shown, it decides no role."));
}
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
].concat(data.decoder ? decoderSpecRows(sp, data.decoder.spec) : [])));
// a decoder keeps its keys and values while it generates: what GQA saves there
function decoderSpecRows(sp, dec) {
  const mib = (b) => fmt(b / 2 ** 20, 1) + " MiB";
  const rows = [["query heads per KV head (GQA group)", sp.group_size]];
  if (dec.dtype !== "fp32") {  // the table's own row is fp32's
    rows.push(["KV cache per token (" + dec.dtype + ", the model's dtype)", dec.kv_cache_bytes_per_token + " bytes"]);
  }
  rows.push(["KV cache at " + dec.context + " tokens (" + dec.dtype + ")", mib(dec.kv_cache_bytes)]);
  rows.push(["the same with one KV head per query head (MHA)", dec.mha_kv_cache_bytes_per_token +
    " bytes per token (" + fmt(dec.mha_kv_cache_bytes_per_token / dec.kv_cache_bytes_per_token, 1) + "\u00d7)"]);
  return rows;
}
const pr = document.getElementById("pruning");
if (data.pruning) {
  const p = data.pruning;
  pr.appendChild(el("p", {}, p.metric + " (" + p.unit + ") as heads are removed, " + p.importance + " importance:"));
  // a decoder's curve may carry the KV cache each point leaves: per token, and at the context
  const kv = p.curve.every((q) => typeof q.kv_bytes_per_token === "number");
  const atContext = p.curve.every((q) => typeof q.kv_bytes_at_context === "number") && p.kv_context;
  const headers = ["heads removed", "share", p.metric, "loss"].concat(kv ? ["KV cache bytes per token"] : [],
    atContext ? ["KV cache at " + p.kv_context + " tokens"] : []);
  pr.appendChild(table(headers, p.curve.map((q) => [q.heads_removed, fmt(100 * q.fraction, 0) + "%",
    fmt(q.metric, 2), fmt(q.loss, 2)].concat(kv ? [q.kv_bytes_per_token] : [],
    atContext ? [fmt(q.kv_bytes_at_context / 2 ** 20, 1) + " MiB"] : []))));
} else {
  pr.appendChild(el("p", { class: "muted" }, "Not measured in this run (headlab report --prune adds it" +
    (causal ? ", as perplexity; or --pruning FILE.json from headlab prune --curve --json)." : ").")));
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

