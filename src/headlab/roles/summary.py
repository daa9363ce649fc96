"""What ``headlab roles`` shows a person of a :class:`~headlab.roles.results.RoleReport`: the
grid of roles, how stable they are, the evidence of the named heads, the relation and
coreference tables, and the data used.

Example:
    >>> from headlab.roles.summary import roles_text
    >>> parts = roles_text(report)  # tables and lines; headlab.cli._output.show prints them
"""

from __future__ import annotations

from typing import Any

from headlab.roles.classify import LETTERS
from headlab.roles.probes.syntactic import RELATION_SET
from headlab.roles.results import RoleReport, fmt_p
from headlab.text import Part, table

#: the directions of a relation's arcs, as the relation table names them
DIRECTIONS = {"dependent_to_head": "dep -> head", "head_to_dependent": "head -> dep"}


def pct(v: float | None, interval: Any = None) -> str:
    """``57.5 [55.3-59.7]``: a share and its 95% interval, in %."""
    if v is None:
        return ""
    if not interval or interval[0] is None:
        return f"{100 * v:.1f}"
    return f"{100 * v:.1f} [{100 * interval[0]:.1f}-{100 * interval[1]:.1f}]"


def roles_text(report: RoleReport) -> list[Part]:
    """What ``headlab roles`` prints: the grid of each head's primary role, the heads per
    role, how stable the roles are, the evidence of syntactic and coreference heads, the best
    head per syntactic relation against the best fixed offset, the coreference head, and the
    sentences and rows each data set gave."""
    rows = report.grid()
    legend = [f"{v} {k}" for k, v in LETTERS.items()]
    if any("-" in row for row in rows):
        legend.append("- pruned away")
    stability = (
        f"stability over {report.folds} folds of documents"
        if report.folds
        else "stability over bootstrap resamples"
    )
    out: list[Part] = [
        table(  # one letter under each head's number: left-justified is centred, up to 99 heads
            ("layer", *map(str, range(report.n_heads))),
            [(layer, *row) for layer, row in enumerate(rows)],
            title=f"{report.model}: primary role of each head ({stability} in the JSON/CSV)",
            caption="  ".join(legend),
            right=(0,),
        ),
        "heads per role: " + ", ".join(f"{k} {v}" for k, v in report.role_counts().items() if v),
    ]
    n = len(report.heads)
    sinking = [h for h in report.heads if "sink" in h.roles]
    if sinking:
        named = sum(1 for h in sinking if h.role not in ("sink", "unclassified"))
        out.append(
            f"{len(sinking)} of {n} heads put more than {report.thresholds.sink:.0%} of their "
            "attention on the sink ([CLS], [SEP], BOS, the first token): a sink head where that "
            f"is all they do, named by their other role where they clear another bar ({named})."
        )
    if report.folds:
        unstable = sum(1 for h in report.heads if h.stable is False)
        out.append(
            f"{unstable} of {n} heads get their role in fewer than "
            f"{report.thresholds.stable:.0%} of {report.folds} folds of documents: reported "
            "unclassified (measured_role in the JSON/CSV)."
        )
    elif report.replicates:
        unstable = sum(1 for h in report.heads if h.stability is not None and h.stability < 0.8)
        out.append(
            f"{unstable} of {n} heads keep their role in fewer than 80% of "
            f"{report.replicates} bootstrap resamples: roles are tendencies, not assignments."
        )
    out += _evidence(report)
    out.append(_relations(report))
    c = report.coreference
    if c is not None:
        bases = ", ".join(f"{k} {100 * v:.1f}" for k, v in c.baselines.items())
        out.append(
            f"coreference (GAP, {c.count} pronouns): best head {c.layer}.{c.head} "
            f"{pct(c.accuracy, c.interval)}% vs baselines {bases} "
            f"(q = {fmt_p(c.q)} against {c.baseline})"
        )
    for name, info in report.data.items():
        if not isinstance(info, dict) or "used" not in info:  # device, dtype
            continue
        skipped = ", ".join(f"{v} {k}" for k, v in info.get("skipped", {}).items() if v)
        out.append(f"{name}: {info['used']} used" + (f"; skipped: {skipped}" if skipped else ""))
    return out


def _evidence(report: RoleReport) -> list[Part]:
    """The evidence table of the syntactic and coreference heads (none: no table)."""
    named = [h for h in report.heads if h.role in ("syntactic", "coreference") and h.evidence]
    if not named:
        return []
    rows = []
    for h in named:
        ev = h.evidence or {}
        rows.append(
            (
                *(f"{h.layer}.{h.head}", h.role, h.detail or "GAP"),
                pct(ev.get("accuracy"), ev.get("interval")),
                pct(ev.get("baseline"), ev.get("baseline_interval")),
                *(ev.get("count", ""), fmt_p(ev.get("q"))),
            )
        )
    return [
        table(
            ("head", "role", "decided by", "accuracy %", "baseline %", "arcs", "q"),
            rows,
            title="evidence: syntactic and coreference heads (accuracy, 95% Wilson interval "
            "over documents; exact McNemar vs the baseline on the same arcs, BH-corrected q)",
        )
    ]


def _relations(report: RoleReport) -> Part:
    """The best head of each relation and direction against the best fixed offset: the
    a-priori set first, then relations outside it with enough arcs."""
    least = report.thresholds.min_relation_count
    by_key = {(r.relation, r.direction): r for r in report.relations}
    outside = sorted({r.relation for r in report.relations if not r.in_set})
    rows = []
    for name in [*RELATION_SET, *outside]:
        for direction, arrow in DIRECTIONS.items():
            r = by_key.get((name, direction))
            if r is None or (not r.in_set and r.count < least):
                continue
            rows.append(
                (
                    *(name if r.in_set else f"{name} *", arrow, f"{r.layer}.{r.head}"),
                    pct(r.accuracy, r.interval),
                    f"{pct(r.baseline, r.baseline_interval)} ({r.baseline_offset:+d})",
                    *(r.count, fmt_p(r.q)),
                )
            )
    return table(
        ("relation", "direction", "head (L.H)", "accuracy", "baseline (offset)", "arcs", "q"),
        rows,
        title="syntactic relations: best head vs best fixed offset (Clark et al. 2019); "
        "accuracy % [95% Wilson interval over documents]; * outside the a-priori set "
        "(never decides a role); q blank: not tested (outside the set, or under "
        f"{least} arcs{' in some fold' if report.folds else ''})",
    )
