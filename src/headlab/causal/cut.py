"""Cutting a scored graph to a circuit: the best edges, kept only where they lead to the logits.

- :func:`top_edges`: the ``n`` edges of largest ``|score|``, then :func:`reaching_logits`.
- :func:`greedy_order`: from the logits down (Hanna et al. 2024's greedy search): at each step
  the edge of largest ``|score|`` whose receiver is already in the circuit; its sender joins
  (a head through its queries, keys and values, an MLP through its input). The first ``n``
  edges of the order are the circuit of ``n`` edges; every one of them reaches the logits.
- :func:`reaching_logits`: the edges whose receiver's node still has a path to the logits.

A node is a sender (the embeddings, a head, an MLP) or the logits. A receiver belongs to the
node it feeds: ``q:L.H`` to head ``L.H``, ``k:L.G`` and ``v:L.G`` to every query head of KV
group ``G``, ``mlp L`` to MLP ``L``.

Shape vocabulary: ``S`` senders, ``R`` receivers.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from headlab.causal.graph import Graph
from headlab.errors import InputError


def owners(graph: Graph) -> torch.Tensor:
    """bool ``(R, S)``: receiver ``r`` feeds sender ``s``'s node (the logits feed none)."""
    out = torch.zeros(len(graph.receivers), len(graph.senders), dtype=torch.bool)
    for layer in range(len(graph.blocks)):
        heads = graph.head_senders(layer)
        n_heads = len(heads)
        for kind in ("q", "k", "v"):
            receivers = graph.receiver_range(layer, kind)
            group = n_heads // len(receivers)
            for g, r in enumerate(receivers):
                for h in range(g * group, (g + 1) * group) if kind != "q" else (g,):
                    out[r, heads.start + h] = True
        out[graph.receiver_range(layer, "mlp").start, graph.mlp_sender(layer)] = True
    return out


def reaching_logits(graph: Graph, keep: torch.Tensor) -> torch.Tensor:
    """bool ``(S, R)``: the edges of ``keep`` whose receiver's node has a path to the logits
    through kept edges (a head kept for nothing it feeds is dropped with its edges)."""
    feeds = owners(graph)
    keep = keep & graph.edges
    is_logits = torch.zeros(len(graph.receivers), dtype=torch.bool)
    is_logits[-1] = True
    alive = torch.zeros(len(graph.senders), dtype=torch.bool)
    while True:
        live_receivers = (feeds & alive[None, :]).any(dim=1) | is_logits  # (R,)
        now = (keep & live_receivers[None, :]).any(dim=1)  # (S,)
        if torch.equal(now, alive):
            return keep & live_receivers[None, :]
        alive = now


def top_edges(graph: Graph, scores: torch.Tensor, n: int) -> torch.Tensor:
    """bool ``(S, R)``: the ``n`` edges of largest ``|score|``, less those that lead nowhere."""
    _check_size(graph, n)
    flat = scores.abs().masked_fill(~graph.edges, -1.0).flatten()
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[flat.topk(n).indices] = True
    return reaching_logits(graph, keep.view(graph.edges.shape))


def greedy_order(graph: Graph, scores: torch.Tensor) -> list[tuple[int, int]]:
    """Every edge ``(sender, receiver)`` in the order the greedy search from the logits adds
    them; edges it never reaches (their receiver's node feeds nothing kept) come last, by
    ``|score|``."""
    feeds = owners(graph)
    fed_by = [feeds[:, s].nonzero().flatten().tolist() for s in range(len(graph.senders))]
    weight = scores.abs()
    heap: list[tuple[float, int, int]] = []
    entered: set[int] = set()

    def enter(r: int) -> None:
        if r in entered:
            return
        entered.add(r)
        for s in graph.edges[:, r].nonzero().flatten().tolist():
            heapq.heappush(heap, (-float(weight[s, r]), s, r))

    enter(len(graph.receivers) - 1)
    order: list[tuple[int, int]] = []
    joined: set[int] = set()
    while heap:
        _, s, r = heapq.heappop(heap)
        order.append((s, r))
        if s not in joined:
            joined.add(s)
            for receiver in fed_by[s]:
                enter(receiver)
    seen = set(order)
    rest = [tuple(e) for e in graph.edges.nonzero().tolist() if tuple(e) not in seen]
    rest.sort(key=lambda e: -float(weight[e[0], e[1]]))
    return order + [(int(s), int(r)) for s, r in rest]


def first_edges(graph: Graph, order: list[tuple[int, int]], n: int) -> torch.Tensor:
    """bool ``(S, R)``: the first ``n`` edges of ``order``."""
    _check_size(graph, n)
    keep = torch.zeros_like(graph.edges)
    if n:
        index = torch.tensor(order[:n])
        keep[index[:, 0], index[:, 1]] = True
    return keep


def _check_size(graph: Graph, n: int) -> None:
    if not 0 <= n <= graph.n_edges:
        raise InputError(f"a circuit has 0..{graph.n_edges} edges in this model, got {n}")


def check_sizes(graph: Graph, sizes: Sequence[int]) -> None:
    """A one-line error for a circuit size outside ``0..graph.n_edges``: before any scoring."""
    bad = [n for n in sizes if not 0 <= n <= graph.n_edges]
    if bad:
        raise InputError(
            f"--sizes {','.join(map(str, bad))}: a circuit has 0..{graph.n_edges} edges in this "
            "model"
        )


def curve_sizes(total: int) -> list[int]:
    """Circuit sizes to measure: 1, 2, 3, 5, 7 times each power of ten, up to ``total``, and
    ``total`` itself."""
    sizes, scale = [], 1
    while scale <= total:
        sizes += [m * scale for m in (1, 2, 3, 5, 7) if m * scale <= total]
        scale *= 10
    return sorted(set(sizes) | {total})
