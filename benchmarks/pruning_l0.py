"""How many MiniLM heads go for at most one point of STS-B Spearman: L0 gates (+ recovery)
against today's gradient importance and ablation, in one run (issue #26).

Everything is measured on the same STS-B dev pairs (evenly spaced through
``../shared/data/stsb/sts-dev.csv``); importance, gates and recovery see train data only:
gradient importance the labelled train pairs (as ``headlab prune --importance-stsb``), ablation a
smaller set of them (one evaluation per head per step), the L0 gates and recovery the train
sentences without labels (distillation to the unpruned model's embeddings). Recovery runs at the
last curve point at or below each ``--recover-at`` share, on a copy pruned physically.

    python benchmarks/pruning_l0.py [--dev-pairs 500] [--recover 150] [--out result.json]

Prints a Markdown table and writes the JSON (``headlab.prune-compare/1``) and the figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from headlab.datasets import read_stsb
from headlab.models import load
from headlab.progress import PlainProgress
from headlab.pruning.figure import pruning_compare
from headlab.pruning.methods import compare_methods, removed_within
from headlab.pruning.metrics import FidelityMetric, StsbMetric
from headlab.pruning.workflow import PruneOptions

ROOT = Path(__file__).resolve().parents[1]
STSB = ROOT.parent / "shared" / "data" / "stsb"


def spaced(items: list, n: int) -> list:
    """``n`` items evenly spaced through ``items``."""
    if n >= len(items):
        return list(items)
    stride = len(items) / n
    return [items[int(i * stride)] for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dev-pairs", type=int, default=500)
    parser.add_argument("--gradient-pairs", type=int, default=300)
    parser.add_argument("--ablation-pairs", type=int, default=20)
    parser.add_argument("--ablation-step", type=float, default=0.2)
    parser.add_argument("--train-pairs", type=int, default=1000, help="sentences for gates")
    parser.add_argument("--step", type=float, default=0.1)
    parser.add_argument("--fraction", type=float, default=0.8)
    parser.add_argument("--l0-weight", type=float, default=0.5)
    parser.add_argument("--l0-steps", type=int, default=200)
    parser.add_argument("--recover", type=int, default=150)
    parser.add_argument("--recover-at", type=str, default="0.7")
    parser.add_argument("--out", type=Path, default=Path("/tmp/pruning_l0.json"))
    parser.add_argument("--figure", type=Path, default=ROOT / "docs/figures/pruning_l0.png")
    args = parser.parse_args()
    start = time.perf_counter()
    lm = load()
    dev = spaced(read_stsb(STSB / "sts-dev.csv"), args.dev_pairs)
    train = read_stsb(STSB / "sts-train.csv")
    evaluation = StsbMetric(dev)
    gradient = StsbMetric(spaced(train, args.gradient_pairs))
    ablation = StsbMetric(spaced(train[1::2], args.ablation_pairs))
    texts = list(
        dict.fromkeys(s for p in spaced(train, args.train_pairs) for s in (p.first, p.second))
    )
    data = FidelityMetric.build(lm, texts)
    options = PruneOptions(
        step=args.step,
        l0_weight=args.l0_weight,
        l0_steps=args.l0_steps,
        recover=args.recover,
        recover_at=tuple(float(f) for f in args.recover_at.split(",")),
        compare=True,
    )
    every = {"fraction": args.fraction}

    result = compare_methods(
        lm,
        options,
        progress=PlainProgress("pruning_l0", sys.stdout),
        evaluation=evaluation,
        importance=gradient,
        importances={"ablation": ablation},
        settings={
            "gradient": every,
            "ablation": {**every, "step": args.ablation_step},
            "l0": every,
        },
        data=data,
    )
    result["benchmark"] = {
        "dev_pairs": len(dev),
        "gradient_pairs": args.gradient_pairs,
        "ablation_pairs": args.ablation_pairs,
        "train_sentences": len(texts),
        "seconds": round(time.perf_counter() - start, 1),
        "machine": f"{platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    pruning_compare(result, args.figure)
    total = result["heads_before"]
    print(
        f"\nmachine: {result['benchmark']['machine']} | MiniLM, STS-B dev {len(dev)} pairs, "
        f"unpruned Spearman x100 {result['metric_before']:.2f} | {result['benchmark']['seconds']} s"
    )
    print("\n| heads removed | " + " | ".join(m["importance"] for m in result["methods"]) + " |")
    print("|---|" + "---|" * len(result["methods"]))
    rows: dict[int, dict[str, float]] = {}
    for m in result["methods"]:
        for p in m["curve"]:
            rows.setdefault(p["heads_removed"], {})[m["importance"]] = p["metric"]
    for n in sorted(rows):
        cells = [
            f"{rows[n][m['importance']]:.2f}" if m["importance"] in rows[n] else ""
            for m in result["methods"]
        ]
        print(f"| {n} ({100 * n / total:.0f}%) | " + " | ".join(cells) + " |")
    print(
        "\n| method | most heads removed for <= 1 point | recovered point: before -> after (time) |"
    )
    print("|---|---|---|")
    for m in result["methods"]:
        best = removed_within(m["curve"], 1.0)
        recs = "; ".join(
            f"{r['heads_removed']} heads: {r['metric_before']:.2f} -> {r['metric_after']:.2f} "
            f"({r['seconds']:.0f} s)"
            for r in m.get("recovered", [])
        )
        best_rec = removed_within(m.get("recovered", []), 1.0)
        within = (
            "-"
            if best is None
            else f"{best['heads_removed']} ({100 * best['heads_removed'] / total:.0f}%)"
        )
        if best_rec is not None:
            within += f"; with recovery {best_rec['heads_removed']} ({100 * best_rec['heads_removed'] / total:.0f}%)"
        print(f"| {m['importance']} | {within} | {recs} |")
    gates = result["methods"][-1].get("l0", {})
    print(
        f"\nL0 gates: weight {gates.get('weight')}, {gates.get('steps')} steps, "
        f"{gates.get('seconds')} s, {gates.get('closed')} of {total} closed"
    )
    for note in result.get("notes", []):
        print(f"note: {note}")


if __name__ == "__main__":
    main()
