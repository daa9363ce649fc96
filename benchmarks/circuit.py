"""Edge scores of every edge of SmolLM2's graph against patching edges one at a time (issue 44).

- ``eap`` and ``eap-ig``: :func:`headlab.causal.circuit.edge_scores` on 24 IOI prompts, every
  edge at once (one forward and backward per batch, per step for EAP-IG).
- ``loop``: the definition, one patched forward per edge: the edge alone carries its corrupted
  value (:class:`headlab.causal.edges.EdgeRun` with one edge left out), on the same prompts.
  All 70,651 edges would take hours on 2 cores, so it runs ``--edges`` of them (half the
  largest by |EAP-IG|, half drawn at random), and its time for all edges is the time per edge
  times their number (marked as extrapolated). The same edges give the estimates' Pearson and
  Spearman correlation with the exact effect.

Usage::

    python benchmarks/circuit.py                    # SmolLM2, 24 IOI prompts, 100 edges
    python benchmarks/circuit.py --edges 40 --out circuit.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch

from headlab.causal.circuit import _record, edge_scores
from headlab.causal.edges import EdgeRun
from headlab.causal.metric import last_logits, logit_difference
from headlab.causal.patching import as_task
from headlab.causal.table import spearman
from headlab.models import load


def exact_effects(lm, task, graph, edges: list[tuple[int, int]]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Mean change of the logit difference with each edge alone corrupted."""
    sums = torch.zeros(len(edges), dtype=torch.float64)
    for batch in task.batches:
        corrupt, _ = _record(lm, graph, batch, batch.corrupt)
        with torch.inference_mode():
            clean = logit_difference(last_logits(lm, batch.clean), batch.answer, batch.distractor)
        for i, (s, r) in enumerate(edges):
            left_out = torch.zeros(graph.edges.shape)
            left_out[s, r] = 1.0
            with (
                torch.inference_mode(),
                EdgeRun(lm, graph, corrupt=corrupt.values, left_out=left_out),
            ):
                ld = logit_difference(last_logits(lm, batch.clean), batch.answer, batch.distractor)
            sums[i] += float((ld - clean).sum())
    return sums / task.n_prompts


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--edges", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = load(args.model, with_lm_head=True)
    task = as_task(lm, "ioi", n=args.n, seed=0)
    row: dict = {"model": lm.name, "prompts": task.n_prompts, "threads": torch.get_num_threads(),
                 "cpus": os.cpu_count()}  # fmt: skip
    results = {}
    for method in ("eap", "eap-ig"):
        start = time.perf_counter()
        results[method] = edge_scores(lm, task, method=method)
        row[f"{method}_s"] = round(time.perf_counter() - start, 2)
    graph = results["eap"].graph
    row["edges_total"] = graph.n_edges
    ig = results["eap-ig"].scores
    valid = graph.edges.nonzero().tolist()
    top = ig.abs().masked_fill(~graph.edges, -1).flatten().topk(args.edges // 2).indices.tolist()
    width = graph.edges.shape[1]
    chosen = [(i // width, i % width) for i in top]
    rest = [tuple(e) for e in valid if tuple(e) not in set(chosen)]
    pick = torch.randperm(len(rest))[: args.edges - len(chosen)].tolist()
    chosen += [rest[i] for i in pick]
    start = time.perf_counter()
    exact = exact_effects(lm, task, graph, chosen)
    per_edge = (time.perf_counter() - start) / len(chosen)
    row["loop_edges_run"] = len(chosen)
    row["loop_s_per_edge"] = round(per_edge, 3)
    row["loop_all_edges_s_extrapolated"] = round(per_edge * graph.n_edges)
    row["x_eap"] = round(per_edge * graph.n_edges / row["eap_s"])
    row["x_eap_ig"] = round(per_edge * graph.n_edges / row["eap-ig_s"])
    for method, result in results.items():
        est = torch.tensor([float(result.scores[s, r]) for s, r in chosen], dtype=torch.float64)
        row[f"{method}_pearson"] = round(pearson(est, exact), 3)
        row[f"{method}_spearman"] = round(float(spearman(est, exact)), 3)
    row["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
    text = json.dumps(row)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
