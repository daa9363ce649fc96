"""Circuits cut from EAP-IG scores against circuits by learned edge masks, on SmolLM2 (#59).

For a task (induction or IOI, 24 discovery prompts, 24 held out), the faithfulness of circuits
of ``--sizes`` edges on the held-out prompts: cut greedily from EAP-IG scores (the default of
``headlab circuit``), cut by |score| (``top``), and the first edges of the order learned edge
masks give (:mod:`headlab.causal.learned`, trained on the discovery prompts towards
``--target`` edges). Partial results are written to ``--out`` after each stage.

Usage::

    python benchmarks/circuit_learned.py --task induction --target 3500 --steps 300
    python benchmarks/circuit_learned.py --task ioi --out ioi.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch

from headlab.causal.circuit import circuit_logit_differences, cut, edge_scores
from headlab.causal.cut import first_edges, reaching_logits
from headlab.causal.generators import builtin_prompts
from headlab.causal.learned import MaskOptions, learn_masks, learned_order
from headlab.causal.patching import as_task
from headlab.causal.tasks import encode_task
from headlab.models import load


def faithfulness(lm, graph, held, circuits) -> list[float]:  # type: ignore[no-untyped-def]
    lds, clean, corrupt = circuit_logit_differences(lm, graph, held, circuits)
    return [round((ld - corrupt) / (clean - corrupt), 4) for ld in lds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--task", default="induction", choices=("induction", "ioi"))
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--batch", type=int, default=8, help="prompts per learning step")
    parser.add_argument("--target", type=int, default=3500)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--sizes", default="500,1000,2000,3500,5000,10000,20000")
    parser.add_argument("--out", default="circuit_learned.json")
    args = parser.parse_args()
    out: dict = {"model": args.model, "task": args.task, "n": args.n, "args": vars(args)}

    def save() -> None:
        tmp = Path(args.out + ".tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        os.replace(tmp, args.out)

    lm = load(args.model, with_lm_head=True)
    task = as_task(lm, args.task, n=args.n, seed=0)
    held = encode_task(
        lm.tokenizer,
        builtin_prompts(args.task, lm.tokenizer, args.n, seed=0, part="held-out"),
        name=f"{args.task} held-out",
    )
    sizes = [int(s) for s in args.sizes.split(",")]
    start = time.perf_counter()
    scores = edge_scores(lm, task, method="eap-ig")
    graph = scores.graph
    out["edges"] = graph.n_edges
    out["eap_ig_seconds"] = round(time.perf_counter() - start, 1)
    for search in ("greedy", "top"):
        circuits = cut(graph, scores.scores, sizes, search)  # type: ignore[arg-type]
        out[search] = {
            "edges": [int(c.sum()) for c in circuits],
            "faithfulness": faithfulness(lm, graph, held, circuits),
        }
        save()
    small = encode_task(lm.tokenizer, task.prompts, name=task.name, batch=args.batch)
    masks = learn_masks(
        lm, graph, small, MaskOptions(target=args.target, steps=args.steps, lr=args.lr)
    )
    order = learned_order(graph, masks)
    circuits = [reaching_logits(graph, first_edges(graph, order, n)) for n in sizes]
    out["learned"] = {
        "edges": [int(c.sum()) for c in circuits],
        "faithfulness": faithfulness(lm, graph, held, circuits),
        "seconds": round(masks.seconds, 1),
        "seconds_per_step": round(masks.seconds / args.steps, 2),
        "expected_kept": round(masks.kept, 1),
        "loss_every_10": [round(x, 4) for x in masks.loss[::10]],
    }
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    torch.save(masks.logits, Path(args.out).with_suffix(".logits.pt"))
    save()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
