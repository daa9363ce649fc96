"""The ledger: each claim of the lesson, the figure measured for it, and a verdict by rule.

Verdicts are computed from the numbers, never written by hand. The words are fixed:
``holds``, ``holds in part``, ``not at this scale`` and ``not measured in this run``. The rules
(each claim's ``rule`` field repeats its own in words):

* **one head averages competing needs** (one-vs-many, binding task, attention-only): *holds* when
  several heads beat one on it (the comparison rule below) and the one-head model's last layer
  puts at least 0.2 of the query's attention on each of the two answers in some seed (it
  averages); *holds in part* when several heads beat one but the single head commits to one
  answer instead; *not at this scale* when several heads do not beat one.
* **heads specialize** (roles): the families syntax, coreference, position, delimiters and rare
  tokens; a family is found when at least one head clears its bar (``roles`` lists every role a
  head clears). All five: *holds*; one to four: *holds in part*; none: *not at this scale*.
* **roles are tendencies, many heads not interpretable** (roles): *holds* when at least 25% of
  the heads are unclassified and even the best head of the median relation (among relations with
  enough arcs) is right on under 90% of its arcs; one of the two: *holds in part*.
* **outputs are concatenated and mixed by a projection** (cost): the heads computed one at a
  time, each through its own slice of the output projection, summed, against the fused module;
  *holds* when the largest difference is at most 1e-4 (float32), *holds in part* otherwise.
* **many heads are redundant** (pruning curve): the largest share of heads removed while the
  metric loses at most 5% of its unpruned value; at least 30%: *holds*; more than 0:
  *holds in part*; none: *not at this scale*.
* **several heads beat one at equal width** (one-vs-many, every task given): per task, the best
  several-head mean against the one-head mean; it is better when the gap exceeds twice the larger
  seed standard deviation and a floor (5 points of accuracy; 1% of perplexity). Every task
  better: *holds*; some: *holds in part*; none: *not at this scale*.
* **multi-head costs about the same** (cost): parameters equal and the matrix products' FLOPs
  equal across head counts, and the fused forward's slowest head count at most 1.5x the fastest
  at the longest length: *holds*; parameters and FLOPs equal but the time not: *holds in part*.
* **heads run in parallel** (cost): the Python loop over heads against the fused module, at the
  most heads and the longest length; at least 2x slower: *holds*; over 1.2x: *holds in part*;
  otherwise *not at this scale*.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

HOLDS = "holds"
PART = "holds in part"
SCALE = "not at this scale"
MISSING = "not measured in this run"

#: the report section each claim links to (ids in the page's template)
SECTIONS = {
    "roles": "head-grid",
    "relations": "relations-section",
    "pruning": "pruning-section",
    "experiment": "experiment-section",
    "cost": "cost-section",
}

FAMILIES = {
    "syntax": "syntactic",
    "coreference": "coreference",
    "position": "positional",
    "delimiters": "delimiter",
    "rare tokens": "rare-token",
}


def _row(claim: str, section: str, command: str, rule: str) -> dict[str, Any]:
    return {
        "claim": claim,
        "figure": "",
        "verdict": MISSING,
        "rule": rule,
        "section": SECTIONS[section],
        "command": command,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _cells(experiments: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (setting, task) of the experiments with its one-head and best several-head cell."""
    out = []
    for ex in experiments:
        setting = ex.get("setting", "small")
        by_task: dict[str, list[dict[str, Any]]] = {}
        for cell in ex.get("summary", []):
            if not isinstance(cell, dict) or not {"task", "n_heads", "metric", "mean"} <= set(cell):
                continue  # a summary row of another shape: not evidence the ledger can read
            by_task.setdefault(cell["task"], []).append(cell)
        for task, cells in by_task.items():
            one = next((c for c in cells if c["n_heads"] == 1), None)
            many = [c for c in cells if c["n_heads"] > 1]
            if one is None or not many:
                continue
            lower = cells[0]["metric"] == "perplexity"
            best = (
                min(many, key=lambda c: c["mean"]) if lower else max(many, key=lambda c: c["mean"])
            )
            out.append(_compare(ex, setting, task, one, best, lower))
    return out


def _compare(
    ex: dict[str, Any],
    setting: str,
    task: str,
    one: dict[str, Any],
    best: dict[str, Any],
    lower: bool,
) -> dict[str, Any]:
    gap = (one["mean"] - best["mean"]) if lower else (best["mean"] - one["mean"])
    sds = [c["std"] for c in (one, best) if c.get("std") is not None]
    noise = 2 * max(sds) if sds else 0.0
    floor = 0.01 * one["mean"] if lower else 0.05
    better = gap > max(noise, floor)
    if lower:
        text = (
            f"{task} ({setting}): perplexity {one['mean']:.2f} with 1 head, "
            f"{best['mean']:.2f} with {best['n_heads']}"
        )
    else:
        text = (
            f"{task} ({setting}): {_pct(one['mean'])} with 1 head, {_pct(best['mean'])} "
            f"with {best['n_heads']}"
        )
    scale = 1.0 if lower else 100.0  # accuracies in points
    spread = [f"{scale * c['std']:.2f}" for c in (one, best) if c.get("std") is not None]
    if spread:
        seeds = f", {one['seeds']} seeds" if one.get("seeds") else ""
        text += f" (seed sd {' / '.join(spread)}{seeds})"
    else:
        text += " (one seed)"
    return {"task": task, "setting": setting, "better": better, "gap": gap, "text": text, "ex": ex}


def _averaging(ex: dict[str, Any]) -> tuple[bool, str]:
    """Whether a one-head binding model splits its attention between the two answers."""
    split = []
    for run in ex.get("runs", []):
        if run.get("task") != "binding" or run.get("n_heads") != 1 or "diagnostic" not in run:
            continue
        head = run["diagnostic"]["heads"][0]
        split.append((head["mass_on_subject"], head["mass_on_object"], run["seed"]))
    if not split:
        return False, ""
    averaging = any(min(s, o) >= 0.2 for s, o, _ in split)
    shown = ", ".join(f"{s:.2f}/{o:.2f}" for s, o, _ in split)
    return averaging, f"; the single head's attention on subject/object: {shown}"


def build_ledger(
    *,
    roles: dict[str, Any] | None,
    pruning: dict[str, Any] | None = None,
    cost: dict[str, Any] | None = None,
    experiments: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The ledger's rows, in the lesson's order: ``claim``, ``figure`` (the measured numbers in
    words), ``verdict``, ``rule``, ``section`` (the report's anchor) and ``command`` (what
    produces the numbers)."""
    cells = _cells(experiments)
    return [
        _averaging_row(cells),
        *_roles_rows(roles),
        _concatenation_row(cost),
        _pruning_row(pruning),
        _several_row(cells),
        *_cost_rows(cost),
    ]


#: the commands behind the experiments' and the cost's numbers
OVM = "headlab experiment one-vs-many --quick --json"
COST = "headlab experiment cost --quick --json"


def _averaging_row(cells: list[dict[str, Any]]) -> dict[str, Any]:
    binding = [c for c in cells if c["task"] == "binding"]
    r = _row(
        "One head averages competing needs",
        "experiment",
        OVM,
        "several heads beat one on the binding task and the single head splits >= 0.2 / 0.2",
    )
    if binding:
        c = binding[0]
        averaging, split = _averaging(c["ex"])
        r["figure"] = c["text"] + split
        r["verdict"] = (HOLDS if averaging else PART) if c["better"] else SCALE
    return r


def _roles_rows(roles: dict[str, Any] | None) -> list[dict[str, Any]]:
    r = _row(
        "Heads specialize: syntax, coreference, position, delimiters, rare tokens",
        "roles",
        "headlab roles --json",
        "all five families found: holds; one to four: in part",
    )
    r2 = _row(
        "Roles are tendencies; many heads are not interpretable",
        "relations",
        "headlab roles --json",
        ">= 25% unclassified and the median relation's best head < 90% right",
    )
    if roles:
        heads = roles["heads"]
        # each head counts for its reported role only: the one the folds tested (a head whose
        # role did not replicate is reported unclassified); other bars it clears do not count
        found = {
            name: sum(1 for h in heads if h["role"] == role) for name, role in FAMILIES.items()
        }
        n_found = sum(1 for v in found.values() if v)
        folds = roles.get("folds") or 0
        checked = (
            f"roles that replicate in {folds} folds"
            if folds
            else "no folds: not checked for replication"
        )
        r["figure"] = f"heads of {len(heads)} per role ({checked}): " + ", ".join(
            f"{name} {n}" for name, n in found.items()
        )
        r["verdict"] = HOLDS if n_found == len(FAMILIES) else PART if n_found else SCALE
        unclassified = sum(1 for h in heads if h["role"] == "unclassified") / len(heads)
        enough = roles.get("thresholds", {}).get("min_relation_count", 100)
        accs = [x["accuracy"] for x in roles.get("relations", []) if x["count"] >= enough]
        median = statistics.median(accs) if accs else None
        r2["figure"] = f"{_pct(unclassified)} of heads unclassified" + (
            f"; the median relation's best head is right on {_pct(median)} of its arcs"
            if median is not None
            else ""
        )
        hits = (unclassified >= 0.25) + (median is not None and median < 0.9)
        r2["verdict"] = HOLDS if hits == 2 else PART if hits == 1 else SCALE
    return [r, r2]


def _concatenation_row(cost: dict[str, Any] | None) -> dict[str, Any]:
    r = _row(
        "Outputs are concatenated and mixed by a projection",
        "cost",
        COST,
        "heads one at a time through their slices of W_O, summed = the module, within 1e-4",
    )
    diffs = [
        row["loop_max_abs_diff"]
        for row in (cost or {}).get("rows", [])
        if row.get("loop_max_abs_diff") is not None
    ]
    if diffs:
        worst = max(diffs)
        r["figure"] = (
            f"each head alone, through its slice of the output projection, summed: at most "
            f"{worst:.1e} from the fused module ({len(diffs)} head counts x lengths)"
        )
        r["verdict"] = HOLDS if worst <= 1e-4 else PART
    return r


def _pruning_row(pruning: dict[str, Any] | None) -> dict[str, Any]:
    r = _row(
        "Many heads are redundant and can be pruned",
        "pruning",
        "headlab prune --curve --json",
        "share removable within 5% of the unpruned metric: >= 30% holds, > 0 in part",
    )
    if pruning:
        before = pruning["curve"][0]["metric"]
        ok = [p for p in pruning["curve"] if abs(p["loss"]) <= 0.05 * abs(before) or p["loss"] <= 0]
        share = max((p["fraction"] for p in ok), default=0.0)
        removed = max((p["heads_removed"] for p in ok if p["fraction"] == share), default=0)
        r["figure"] = (
            f"{removed} heads ({_pct(share)}) removed with {pruning['metric']} within 5% of "
            f"{before:.2f} ({pruning['unit']})"
        )
        r["verdict"] = HOLDS if share >= 0.3 else PART if share > 0 else SCALE
    return r


def _several_row(cells: list[dict[str, Any]]) -> dict[str, Any]:
    r = _row(
        "Several heads beat one at equal width",
        "experiment",
        OVM + "; headlab experiment one-vs-many --setting large [--quick] --json",
        "per task: gap > 2 x seed sd and > 5 points / 1%; all tasks holds, some in part",
    )
    if cells:
        n_better = sum(c["better"] for c in cells)
        r["figure"] = "; ".join(c["text"] for c in cells)
        r["verdict"] = HOLDS if n_better == len(cells) else PART if n_better else SCALE
    return r


def _cost_rows(cost: dict[str, Any] | None) -> list[dict[str, Any]]:
    r = _row(
        "Multi-head costs about the same",
        "cost",
        COST,
        "equal parameters and FLOPs; slowest head count <= 1.5x fastest (fused forward)",
    )
    r2 = _row(
        "Heads run in parallel",
        "cost",
        COST,
        "Python loop over heads vs fused, most heads, longest length: >= 2x holds, > 1.2x in part",
    )
    if cost and cost.get("rows"):
        crow = cost["rows"]
        longest = max(x["length"] for x in crow)
        at = sorted((x for x in crow if x["length"] == longest), key=lambda x: x["heads"])
        params_equal = len({x["params"]["headlab"] for x in crow}) == 1 and all(
            x["params"]["headlab"] == x["params"]["torch"] for x in crow
        )
        flops_equal = all(
            len({x["spec_flops"] for x in crow if x["length"] == t}) == 1
            for t in {x["length"] for x in crow}
        )
        times = [x["forward_s"]["fused"] for x in at]
        spread = max(times) / min(times)
        r["figure"] = (
            f"parameters {'equal' if params_equal else 'differ'} ({at[0]['params']['headlab']:,}),"
            f" FLOPs {'equal' if flops_equal else 'differ'}; fused forward at {longest} tokens "
            f"{1000 * min(times):.1f} to {1000 * max(times):.1f} ms over "
            f"{at[0]['heads']}..{at[-1]['heads']} heads ({spread:.2f}x), on {cost['device']}"
        )
        r["verdict"] = (HOLDS if spread <= 1.5 else PART) if params_equal and flops_equal else SCALE
        loop = at[-1]["ratios"].get("loop_vs_fused")
        if loop is not None:
            r2["figure"] = (
                f"{at[-1]['heads']} heads one after another: {loop:.1f}x the time of all at "
                f"once ({longest} tokens, {cost['device']})"
            )
            r2["verdict"] = HOLDS if loop >= 2 else PART if loop > 1.2 else SCALE
    return [r, r2]


def ledger_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The ledger as a Markdown table (for a README): claim, measured, verdict, command."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| claim | measured | verdict | command |", "|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {cell(r['claim'])} | {cell(r['figure'] or '-')} | **{r['verdict']}** | "
            f"`{cell(r['command'])}` |"
        )
    return "\n".join(lines) + "\n"
