"""Why no small circuit carries SmolLM2's induction (#59): circuits built around the head
patching ranks first, and circuits cut when left-out edges carry a mean instead of a prompt.

Part ``around`` (about 3 minutes on 2 idle cores): on the 24 held-out induction prompts, the
faithfulness of circuits built by hand around 16.0 (the head whose corrupted output removes 76%
of the logit difference): every edge but 16.0's (necessity: one minus it is 16.0's patching
effect); 16.0 with every edge upstream of layer 16 and its edge to the logits; the same for the
four heads patching ranks first; 16.0 with its inputs and every edge from layer 17 on; and that
with the embeddings' and then MLP 0's edges to every receiver.

Part ``mean``: EAP-IG scores (5 steps, 24 discovery prompts) and the greedy and top cuts when a
left-out edge carries the mean of its sender's corrupted output at that position (over the
task's corrupted prompts), instead of the same prompt's corrupted output; measured with that
mean on the held-out prompts. Partial results are written to ``--out`` after each stage.

Usage::

    python benchmarks/circuit_induction.py --part around --out around.json
    python benchmarks/circuit_induction.py --part mean --out mean.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from headlab.causal.circuit import _gradients, _record, circuit_logit_differences, cut
from headlab.causal.edges import EdgeRun
from headlab.causal.generators import builtin_prompts
from headlab.causal.graph import Graph, build_graph
from headlab.causal.metric import last_logits, logit_difference
from headlab.causal.patching import as_task
from headlab.causal.tasks import Task, encode_task
from headlab.models import load
from headlab.models.loading import LoadedModel


def around(graph: Graph) -> dict[str, torch.Tensor]:
    """Circuits built by hand around 16.0 and the four heads patching ranks first."""
    edges = graph.edges
    receiver = {n: i for i, n in enumerate(graph.receivers)}
    sender = {n: i for i, n in enumerate(graph.senders)}

    def with_inputs(heads: list[tuple[int, int]]) -> torch.Tensor:
        keep = torch.zeros_like(edges)
        below = graph.receiver_layer < min(layer for layer, _ in heads)
        keep[:, below] = edges[:, below]  # everything upstream of the first head
        for layer, head in heads:
            block = graph.blocks[layer].projections
            group = head // (len(block["q"][1]) // len(block["k"][1]))
            for name in (f"q:{layer}.{head}", f"k:{layer}.{group}", f"v:{layer}.{group}"):
                keep[:, receiver[name]] = edges[:, receiver[name]]
            keep[sender[f"{layer}.{head}"], receiver["logits"]] = True
        return keep & edges

    def without(heads: list[tuple[int, int]]) -> torch.Tensor:
        keep = edges.clone()
        for layer, head in heads:
            keep[sender[f"{layer}.{head}"]] = False
        return keep

    top4 = [(16, 0), (18, 6), (17, 8), (17, 3)]
    later = with_inputs([(16, 0)])
    later[sender["16.0"]] = edges[sender["16.0"]]
    later[graph.sender_layer > 16] = edges[graph.sender_layer > 16]
    embed = later.clone()
    embed[sender["embed"]] = edges[sender["embed"]]
    mlp0 = embed.clone()
    mlp0[sender["mlp 0"]] = edges[sender["mlp 0"]]
    return {
        "all but 16.0": without([(16, 0)]),
        "16.0 with its inputs": with_inputs([(16, 0)]),
        "all but the top 4": without(top4),
        "the top 4 with their inputs": with_inputs(top4),
        "16.0 with its inputs and all from layer 17": later,
        "... and the embeddings' edges": embed,
        "... and MLP 0's edges": mlp0,
    }


def position_mean(lm: LoadedModel, graph: Graph, task: Task) -> torch.Tensor:
    """``(S, T, E)``: each sender's corrupted output averaged over the prompts at each
    position (the prompts that reach it)."""
    total: torch.Tensor | None = None
    count = torch.zeros(0)
    for batch in task.batches:
        run, _ = _record(lm, graph, batch, batch.corrupt)
        assert run.values is not None
        values = run.values.sum(1)  # (S, T, E)
        t = values.shape[1]
        if total is None or total.shape[1] < t:
            grown = torch.zeros(values.shape[0], t, values.shape[2])
            more = torch.zeros(t)
            if total is not None:
                grown[:, : total.shape[1]], more[: count.shape[0]] = total, count
            total, count = grown, more
        total[:, :t] += values
        count[:t] += batch.corrupt.shape[0]
    assert total is not None
    return total / count[None, :, None]


def mean_scores(lm: LoadedModel, graph: Graph, task: Task, mean: torch.Tensor) -> torch.Tensor:
    """EAP-IG edge scores with each left-out edge at its sender's position mean."""
    scores = torch.zeros(graph.edges.shape, dtype=torch.float64)
    for batch in task.batches:
        clean, _ = _record(lm, graph, batch, batch.clean)
        assert clean.values is not None
        t = batch.clean.shape[1]
        grads = _gradients(lm, graph, batch, 5).flatten(1)  # (R, B*T*E)
        delta = (mean[:, None, :t].expand_as(clean.values) - clean.values).flatten(1)
        scores += (delta @ grads.to(delta).t()).double()
    return scores.masked_fill(~graph.edges, 0.0) / task.n_prompts


def mean_faithfulness(
    lm: LoadedModel, graph: Graph, held: Task, mean: torch.Tensor, circuits: list[torch.Tensor]
) -> list[float]:
    """Faithfulness on ``held`` with every left-out edge at its sender's position mean; the
    corrupted end is every edge left out."""
    runs = [graph.edges, torch.zeros_like(graph.edges), *circuits]
    sums = [0.0] * len(runs)
    for batch in held.batches:
        b, t = batch.clean.shape
        values = mean[:, None, :t].expand(-1, b, -1, -1).contiguous()
        for i, keep in enumerate(runs):
            left_out = (graph.edges & ~keep).float()
            with torch.inference_mode(), EdgeRun(lm, graph, corrupt=values, left_out=left_out):
                ld = logit_difference(last_logits(lm, batch.clean), batch.answer, batch.distractor)
            sums[i] += float(ld.sum())
    clean, corrupt, *lds = (s / held.n_prompts for s in sums)
    return [round((ld - corrupt) / (clean - corrupt), 3) for ld in lds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=("around", "mean"), default="around")
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--sizes", default="100,300,1000,2000,3500,5000,10000,20000")
    parser.add_argument("--out", default="circuit_induction.json")
    args = parser.parse_args()
    out: dict = {"model": "smollm2", "task": "induction", "args": vars(args)}

    def save() -> None:
        tmp = Path(args.out + ".tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        os.replace(tmp, args.out)

    lm = load("smollm2", with_lm_head=True)
    tokenizer = lm.tokenizer
    held = encode_task(
        tokenizer, builtin_prompts("induction", tokenizer, args.n, seed=0, part="held-out"),
        name="induction held-out",
    )  # fmt: skip
    graph = build_graph(lm)
    total = graph.n_edges
    out["edges"] = total
    start = time.perf_counter()
    if args.part == "around":
        named = around(graph)
        lds, clean, corrupt = circuit_logit_differences(lm, graph, held, list(named.values()))
        out["circuits"] = {
            name: {
                "edges": int(keep.sum()),
                "share": round(int(keep.sum()) / total, 3),
                "faithfulness": round((ld - corrupt) / (clean - corrupt), 3),
            }
            for (name, keep), ld in zip(named.items(), lds, strict=True)
        }
    else:
        task = as_task(lm, "induction", n=args.n, seed=0)
        scores = mean_scores(lm, graph, task, position_mean(lm, graph, task))
        held_mean = position_mean(lm, graph, held)
        sizes = [int(s) for s in args.sizes.split(",")]
        for search in ("greedy", "top"):
            circuits = cut(graph, scores, sizes, search)  # type: ignore[arg-type]
            out[search] = {
                "edges": [int(c.sum()) for c in circuits],
                "faithfulness": mean_faithfulness(lm, graph, held, held_mean, circuits),
            }
            save()
    out["seconds"] = round(time.perf_counter() - start, 1)
    save()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
