"""Circuits by learned edge masks: edge pruning (Bhaskar et al. 2024).

EAP and EAP-IG score each edge alone, to first order, and a cut keeps the best of them; on a
behaviour spread over many small edges (induction in a 30-layer model) the edges that matter
together are missed. Edge pruning asks the question a circuit answers directly: which edges,
kept clean with every other edge corrupted, give back the clean behaviour? Each edge gets a
mask ``m`` in ``[0, 1]`` (a hard-concrete gate, Louizos et al. 2018), the circuit's run patches
each edge by ``1 - m`` (:class:`~headlab.causal.edges.EdgeRun`, differentiable), and the gates'
logits are trained by gradient descent to keep the clean logit difference with as few edges as
asked: loss = ``((LD_masked - LD_clean) / (LD_clean - LD_corrupt))^2`` averaged over prompts,
plus ``MU * ((kept - target_t) / edges)^2``, ``kept`` the expected number of gates open and
``target_t`` a target lowered linearly from every edge to the one asked over the first
``WARMUP`` of the steps (edge pruning's schedule), then held.

The gates' final logits order every edge; a circuit of ``n`` edges keeps the first ``n`` (less
those that lead nowhere), and is measured as any other: binary, on held-out prompts.

Shape vocabulary: ``S`` senders, ``R`` receivers, ``B`` prompts, ``T`` tokens, ``E`` width.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from headlab.attention.memory import MEMORY_SHARE, available_bytes
from headlab.causal.edges import EdgeRun
from headlab.causal.graph import Graph
from headlab.causal.metric import check_task, last_logits, logit_difference
from headlab.causal.tasks import Task
from headlab.errors import InputError
from headlab.models.gates import expected_l0, sample_gates
from headlab.models.loading import LoadedModel
from headlab.progress import NO_PROGRESS, Progress, stage
from headlab.text import human_bytes

#: the weight of keeping to the target number of edges, and the share of the steps over which
#: the target comes down from every edge
MU, WARMUP = 100.0, 0.7


@dataclass(frozen=True, kw_only=True)
class MaskOptions:
    """How the masks are learned.

    Attributes:
        target: the number of edges the masks are pushed towards.
        steps: optimiser steps, one batch of prompts each (batches taken in turn).
        lr: Adam's learning rate on the gates' logits.
        seed: the gates' noise.
    """

    target: int
    steps: int = 200
    lr: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.target < 1:
            raise InputError(f"a learned circuit's target is at least 1 edge, got {self.target}")
        if self.steps < 1:
            raise InputError(f"learning edge masks takes at least 1 step, got {self.steps}")
        if not self.lr > 0:
            raise InputError(f"the learning rate must be positive, got {self.lr}")


@dataclass(frozen=True, eq=False)
class LearnedMasks:
    """The gates' logits after training.

    Attributes:
        logits: ``(S, R)`` float32, ``-inf`` where there is no edge; larger is kept first.
        target: the number of edges the masks were pushed towards.
        kept: the expected number of edges kept at the end.
        loss: the faithfulness part of the loss at each step.
    """

    logits: torch.Tensor
    target: int
    kept: float
    loss: list[float]
    seconds: float


def kept_bytes(lm: LoadedModel, graph: Graph, task: Task) -> int:
    """The bytes :func:`learn_masks` keeps for the whole search: every sender's output
    ``(S, B, T, E)`` of every corrupted prompt, in the model's dtype."""
    size = torch.empty((), dtype=lm.dtype).element_size()
    tokens = sum(b.corrupt.numel() for b in task.batches)  # B T summed over batches
    return len(graph.senders) * tokens * lm.layout.d_model * size


def check_kept_memory(lm: LoadedModel, graph: Graph, task: Task) -> None:
    """Refuse, before any run, a task whose corrupted runs (:func:`kept_bytes`) would not fit
    :data:`MEMORY_SHARE` of the memory ``lm``'s device has available.

    Raises:
        InputError: one line with the prompts, the planned bytes, the memory available and the
            most prompts that fit.
    """
    available = available_bytes(torch.device(lm.device))
    kept = kept_bytes(lm, graph, task)
    if available is None or kept <= MEMORY_SHARE * available:
        return
    n = task.n_prompts
    fits = int(MEMORY_SHARE * available // max(1, kept // n))
    raise InputError(
        f"--n/--prompts: the learned search keeps every sender's output of each of the {n:,} "
        f"corrupted prompts ({len(graph.senders)} senders x their tokens x width "
        f"{lm.layout.d_model}), about {human_bytes(kept)}, more than {MEMORY_SHARE:.0%} of the "
        f"{human_bytes(available)} available here; at most about {fits:,} prompts fit"
    )


def learn_masks(
    lm: LoadedModel,
    graph: Graph,
    task: Task,
    options: MaskOptions,
    *,
    progress: Progress | None = None,
) -> LearnedMasks:
    """Learn a gate per edge of ``graph`` on ``task`` (:mod:`this module <headlab.causal.learned>`).

    Raises:
        InputError: a target above the graph's edges, a task the model cannot run.
    """
    if options.target > graph.n_edges:
        raise InputError(
            f"a learned circuit's target is at most the graph's {graph.n_edges} edges, got "
            f"{options.target}"
        )
    check_task(lm, task)
    check_kept_memory(lm, graph, task)
    start = time.perf_counter()
    batches = [b.to(lm.device) for b in task.batches]
    corrupt, clean_ld, span = [], [], []
    with torch.no_grad():
        for batch in batches:
            with EdgeRun(lm, graph) as run:
                ld_corrupt = logit_difference(
                    last_logits(lm, batch.corrupt), batch.answer, batch.distractor
                )
            assert run.values is not None
            corrupt.append(run.values)
            ld = logit_difference(last_logits(lm, batch.clean), batch.answer, batch.distractor)
            clean_ld.append(ld)
            span.append(float((ld - ld_corrupt).mean()))
    scale = sum(span) / len(span)
    if abs(scale) < 1e-9:
        raise InputError(f"{task.name}: the clean and corrupted prompts score the same")
    edges = graph.edges
    n_edges = float(graph.n_edges)
    logits = torch.full(edges.shape, 3.0, dtype=torch.float32, requires_grad=True)
    optimiser = torch.optim.Adam([logits], lr=options.lr)
    generator = torch.Generator().manual_seed(options.seed)
    losses: list[float] = []
    parameters = [p for p in lm.model.parameters() if p.requires_grad]
    for p in parameters:
        p.requires_grad_(False)
    try:
        with stage(progress or NO_PROGRESS, "learning edge masks", options.steps, "steps") as bar:
            for step in range(options.steps):
                i = step % len(batches)
                batch = batches[i]
                gates = sample_gates(logits, generator)  # hard-concrete, as head pruning's
                left_out = (1.0 - gates).to(corrupt[i].dtype) * edges
                with EdgeRun(lm, graph, corrupt=corrupt[i], left_out=left_out, differentiable=True):
                    ld = logit_difference(
                        last_logits(lm, batch.clean), batch.answer, batch.distractor
                    )
                faith = (((ld - clean_ld[i]) / scale) ** 2).mean()
                share = min(1.0, step / max(1.0, WARMUP * options.steps))
                target = n_edges - (n_edges - options.target) * share
                kept = expected_l0(logits)[edges].sum()
                loss = faith + MU * ((kept - target) / n_edges) ** 2
                optimiser.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                optimiser.step()
                losses.append(float(faith.detach()))
                bar.advance(1)
    finally:
        for p in parameters:
            p.requires_grad_(True)
    final = logits.detach().masked_fill(~edges, -torch.inf)
    return LearnedMasks(
        logits=final,
        target=options.target,
        kept=float(expected_l0(logits.detach())[edges].sum()),
        loss=losses,
        seconds=time.perf_counter() - start,
    )


def learned_order(graph: Graph, masks: LearnedMasks) -> list[tuple[int, int]]:
    """Every edge ``(sender, receiver)``, the gate kept most first."""
    flat = masks.logits.flatten()
    order = flat.argsort(descending=True, stable=True)
    n_receivers = graph.edges.shape[1]
    return [(int(k) // n_receivers, int(k) % n_receivers) for k in order[: graph.n_edges]]
