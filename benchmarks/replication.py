"""Do head roles replicate on other sentences? (issue 23)

Roles are assigned with the same model and rules on UD EWT dev + GAP development (run A, also
the 3-minute timing target), and on three other pairings that change one data set or both:
UD EWT train + GAP development (C: the treebank changes), UD EWT dev + GAP validation (D: GAP
changes), UD EWT train + GAP validation (B: both). Figures, for each of C, D and B against A:

- of the heads that A's fold agreement calls stable, the share whose role the other run's data
  gives too (and the same the other way); beside it, the same share for the heads the
  bootstrap calls stable (at least 0.8 of the resamples);
- for relation x direction rows with at least 300 arcs in both EWT splits, the share whose best
  head's dev accuracy lies inside the train run's 95% interval of its best head (the issue's
  check), with headlab's Wilson interval over documents and with the plain Wilson interval over
  arcs, and the share whose two best accuracies differ by an amount consistent with 0 (a
  two-sample 95% interval of the difference, Newcombe's, from either pair of intervals);
- the coreference head and its accuracy in both runs;
- run A's wall time (target: under 3 minutes), and, in the same process, the cost of the folds
  and tests: the same 500 dev sentences with and without ``--reliability 5``.

Train is capped (``--train-sentences``, default 4000 of 12,544) to keep the run short on a shared
2-core machine, in whole documents spread evenly over the file (every k-th document: the file is
ordered by genre); thresholds are the library's defaults, not tuned to either split.

    python benchmarks/replication.py [--train-sentences N] [--out replication.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
Z95 = 1.959963984540054


def run(lm: Any, treebank: Path, gap: Path, limit: int | None, folds: int) -> tuple[Any, float]:
    from headlab.datasets import read_frequencies, read_gap, read_treebank, sample_path
    from headlab.roles import RoleOptions, measure_roles

    t0 = time.perf_counter()
    data = read_treebank(treebank)
    if limit is not None and len(data.sentences) > limit:
        data = replace(data, sentences=spread(data.sentences, limit))
    report = measure_roles(
        lm,
        data,
        gap=read_gap(gap),
        frequencies=read_frequencies(sample_path("frequencies")),
        options=RoleOptions(replicates=100, reliability=folds),
    )
    return report, time.perf_counter() - t0


def spread(sentences: list[Any], limit: int) -> list[Any]:
    """About ``limit`` sentences in whole documents taken evenly across the file: EWT train is
    ordered by genre (its first 4,000 sentences are all email and weblog), so its head is not a
    sample of it."""
    docs: dict[str, list[Any]] = {}
    for s in sentences:
        docs.setdefault(s.doc_id, []).append(s)
    step = math.ceil(len(sentences) / limit)
    return [s for i, group in enumerate(docs.values()) if i % step == 0 for s in group]


def keep(a: Any, b: Any, which: str) -> dict[str, Any]:
    """Heads ``a`` calls stable (``which``: folds or bootstrap) whose role ``b``'s data gives."""
    stable = [
        h
        for h in a.heads
        if (h.stable if which == "folds" else (h.bootstrap_stability or 0.0) >= 0.8)
    ]
    same = [h for h in stable if b.head(h.layer, h.head).measured_role == h.measured_role]
    changed = [
        f"{h.layer}.{h.head} {h.measured_role} -> {b.head(h.layer, h.head).measured_role}"
        for h in stable
        if h not in same
    ]
    return {
        "stable": len(stable),
        "kept": len(same),
        "share": len(same) / max(1, len(stable)),
        "changed": changed,
    }


def plain_wilson(accuracy: float, count: int) -> list[float]:
    """The Wilson interval over arcs taken as independent (the first version's)."""
    from headlab.roles.stats import wilson

    low, high = wilson(accuracy * count, count)
    return [float(low), float(high)]


def relation_check(dev: Any, train: Any, min_arcs: int = 300) -> dict[str, Any]:
    rows_t = {(r.relation, r.direction): r for r in train.relations}
    rows, kept = [], []
    for r in dev.relations:
        t = rows_t.get((r.relation, r.direction))
        if t is None or min(r.count, t.count) < min_arcs:
            continue
        low, high = t.interval
        kept.append(r)
        r_plain, t_plain = plain_wilson(r.accuracy, r.count), plain_wilson(t.accuracy, t.count)
        rows.append(
            {
                "relation": r.relation,
                "direction": r.direction,
                "dev_head": f"{r.layer}.{r.head}",
                "dev_accuracy": r.accuracy,
                "dev_design_effect": r.design_effect,
                "train_head": f"{t.layer}.{t.head}",
                "train_accuracy": t.accuracy,
                "train_design_effect": t.design_effect,
                "train_interval": [low, high],
                "inside": low <= r.accuracy <= high,
                "inside_plain": t_plain[0] <= r.accuracy <= t_plain[1],
                "train_inside_dev_interval": r.interval[0] <= t.accuracy <= r.interval[1],
                "difference_interval": (diff := newcombe(r, t)),
                "consistent": diff[0] <= 0.0 <= diff[1],
                "consistent_plain": ((d := newcombe(r, t, r_plain, t_plain))[0] <= 0.0 <= d[1]),
            }
        )
    n = max(1, len(rows))
    out: dict[str, Any] = {"rows": rows, "count": len(rows)}
    # what "inside" would give with no shift at all: dev's estimate varies too, so it falls in
    # train's 95% interval with probability P(|Z| <= 1.96 s_train / sqrt(s_dev^2 + s_train^2))
    expected = 0.0
    for x, r in zip(rows, kept, strict=True):
        s_dev = (r.interval[1] - r.interval[0]) / (2 * Z95)
        s_train = (x["train_interval"][1] - x["train_interval"][0]) / (2 * Z95)
        expected += math.erf(Z95 * s_train / math.hypot(s_dev, s_train) / math.sqrt(2))
    out["inside_expected_without_shift"] = expected / n
    for key in ("inside", "inside_plain", "consistent", "consistent_plain"):
        out[key] = sum(x[key] for x in rows)
        out[f"{key}_share"] = out[key] / n
    return out


def newcombe(
    a: Any, b: Any, ia: list[float] | None = None, ib: list[float] | None = None
) -> list[float]:
    """95% interval of ``a.accuracy - b.accuracy`` for two independent samples (Newcombe 1998,
    method 10: the hybrid score interval built from each side's Wilson interval). A difference
    whose interval holds 0 is what two splits drawn from the same text give 95% of the time;
    "one point estimate inside the other's interval" holds only about 74% of the time with
    equal sizes and no shift, as both estimates vary."""
    (la, ua), (lb, ub) = ia or a.interval, ib or b.interval
    d = a.accuracy - b.accuracy
    low = d - math.sqrt((a.accuracy - la) ** 2 + (ub - b.accuracy) ** 2)
    high = d + math.sqrt((ua - a.accuracy) ** 2 + (b.accuracy - lb) ** 2)
    return [low, high]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-sentences", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=Path("replication.json"))
    args = parser.parse_args()
    import torch

    from headlab.models import load

    torch.set_num_threads(os.cpu_count() or 1)
    lm = load()
    ud, gap = DATA / "ud-ewt", DATA / "gap"
    small_plain = run(lm, ud / "en_ewt-ud-dev.conllu", gap / "gap-development.tsv", 500, 0)[1]
    small_folds = run(lm, ud / "en_ewt-ud-dev.conllu", gap / "gap-development.tsv", 500, 5)[1]
    dev, train = ud / "en_ewt-ud-dev.conllu", ud / "en_ewt-ud-train.conllu"
    development, validation = gap / "gap-development.tsv", gap / "gap-validation.tsv"
    cap = args.train_sentences
    a, seconds_a = run(lm, dev, development, None, 5)
    c, seconds_c = run(lm, train, development, cap, 5)
    d, seconds_d = run(lm, dev, validation, None, 5)
    b, seconds_b = run(lm, train, validation, cap, 5)
    runs = {"A": a, "C": c, "D": d, "B": b}
    out = {
        "load_average": os.getloadavg(),
        "seconds": {
            "A: dev + GAP development, 5 folds": round(seconds_a, 1),
            "C: train + GAP development, 5 folds": round(seconds_c, 1),
            "D: dev + GAP validation, 5 folds": round(seconds_d, 1),
            "B: train + GAP validation, 5 folds": round(seconds_b, 1),
            "500 dev + GAP development, no folds": round(small_plain, 1),
            "500 dev + GAP development, 5 folds": round(small_folds, 1),
        },
        "data": {name: r.data for name, r in runs.items()},
        "role_counts": {name: r.role_counts() for name, r in runs.items()},
        "measured_role_counts": {
            name: {
                role: sum(1 for h in r.heads if h.measured_role == role) for role in a.role_counts()
            }
            for name, r in runs.items()
        },
        "stable_keep_role": {
            f"{x}<->{y}: {what}": {
                f"{x}->{y} folds": keep(runs[x], runs[y], "folds"),
                f"{y}->{x} folds": keep(runs[y], runs[x], "folds"),
                f"{x}->{y} bootstrap": keep(runs[x], runs[y], "bootstrap"),
                f"{y}->{x} bootstrap": keep(runs[y], runs[x], "bootstrap"),
            }
            for x, y, what in (
                ("A", "C", "EWT dev vs train (GAP development in both)"),
                ("A", "D", "GAP development vs validation (EWT dev in both)"),
                ("A", "B", "both changed"),
            )
        },
        "relations_300": relation_check(a, c),
        "coreference": {
            name: None if r.coreference is None else vars(r.coreference) for name, r in runs.items()
        },
        "heads": {
            name: [
                {
                    "head": f"{h.layer}.{h.head}",
                    "measured_role": h.measured_role,
                    "stable": h.stable,
                    "fold_agreement": h.fold_agreement,
                    "bootstrap_stability": h.bootstrap_stability,
                    "detail": h.detail,
                }
                for h in r.heads
            ]
            for name, r in runs.items()
        },
        "named": {
            name: [
                {"head": f"{h.layer}.{h.head}", "role": h.role, "detail": h.detail}
                for h in r.heads
                if h.role in ("syntactic", "coreference")
            ]
            for name, r in runs.items()
        },
    }
    args.out.write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({k: v for k, v in out.items() if k not in ("data",)}, indent=1, default=str))


if __name__ == "__main__":
    main()
