"""Circuits: every edge of a model's graph scored by how much of a behaviour it carries, the
graph cut to its best edges, and the cut measured by running it.

- :func:`edge_scores`: edge attribution patching (EAP, Syed et al. 2023): for an edge
  ``s -> r``, ``(corrupt_s - clean_s) . d metric / d input_r``, summed over positions and
  averaged over prompts; or EAP-IG (Hanna et al. 2024), the gradient averaged over ``steps``
  points from the corrupted to the clean embeddings. One forward and backward pass per batch
  (per step) scores every edge at once: the gradients at the receivers
  (:func:`~headlab.causal.edges.receiver_gradients`) against the senders' differences, one
  matrix product.
- :func:`circuit_logit_differences`: the metric with every edge outside a circuit carrying its
  corrupted value (:class:`~headlab.causal.edges.EdgeRun`), one forward per circuit and batch:
  measured, not estimated.

The metric is the logit difference at the last position (:mod:`headlab.causal.metric`).

Shape vocabulary: ``S`` senders, ``R`` receivers, ``B`` prompts, ``T`` tokens, ``E`` width.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from headlab.causal.attribution import _interpolated_embeddings
from headlab.causal.cut import curve_sizes, first_edges, greedy_order, reaching_logits, top_edges
from headlab.causal.edges import EdgeRun, check_sum, receiver_gradients
from headlab.causal.graph import Graph, build_graph
from headlab.causal.metric import IG_STEPS, check_task, last_logits, logit_difference
from headlab.causal.tasks import Batch, Task
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.progress import NO_PROGRESS, Progress, stage

EdgeMethod = Literal["eap", "eap-ig"]
EDGE_METHODS = ("eap", "eap-ig")
#: largest relative gap allowed between the final residual and the sum of the senders
SUM_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-3}
#: the same for post-norm blocks: the heads' writes through the attention's output norm add up
#: to its output only to its precision, and Gemma's norms compute in float32 inside (a float64
#: tiny Gemma 3's gap is 7e-8)
POST_NORM_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True, eq=False)
class EdgeScores:
    """Every edge's score for one task.

    Attributes:
        scores: ``(S, R)`` float64, the estimated change of the mean logit difference when the
            edge alone carries its corrupted value (0 where there is no edge).
        clean, corrupt: mean logit difference of the clean and the corrupted prompts.
    """

    model: str
    task: str
    method: str
    steps: int | None
    n_prompts: int
    graph: Graph
    scores: torch.Tensor
    clean: float
    corrupt: float
    seconds: float


def check_differs(task: Task) -> None:
    """A one-line error for prompts whose corruption changes no token: every score would be 0
    and faithfulness undefined."""
    if all(torch.equal(b.clean, b.corrupt) for b in task.batches):
        raise InputError(
            f"{task.name}: every corrupted prompt equals its clean one; a circuit needs "
            "corrupted prompts that change what the model predicts"
        )


def _same_score(task: Task, clean: float, corrupt: float) -> None:
    if abs(clean - corrupt) < 1e-9:
        raise InputError(
            f"{task.name}: the clean and corrupted prompts score the same on average (logit "
            f"difference {clean:.4g}): faithfulness is undefined"
        )


def _record(
    lm: LoadedModel, graph: Graph, batch: Batch, ids: torch.Tensor
) -> tuple[EdgeRun, torch.Tensor]:
    with torch.inference_mode(), EdgeRun(lm, graph) as run:
        ld = logit_difference(last_logits(lm, ids), batch.answer, batch.distractor)
    return run, ld


def _check_sum(lm: LoadedModel, graph: Graph, run: EdgeRun) -> None:
    gap = check_sum(lm, graph, run)
    dtype = run.values.dtype if run.values is not None else torch.float32
    tolerance = SUM_TOLERANCE.get(dtype, 5e-2)
    if any(b.attention_out is not None for b in graph.blocks):
        tolerance = max(tolerance, POST_NORM_SUM_TOLERANCE)
    if gap > tolerance:
        raise InputError(
            f"{lm.name}: its residual stream is not the sum of its heads', MLPs' and "
            f"embeddings' outputs (relative gap {gap:.2g}): circuits need a pre-norm decoder "
            "or one with norms on the sublayers' outputs"
        )


def _gradients(lm: LoadedModel, graph: Graph, batch: Batch, steps: int | None) -> torch.Tensor:
    """``(R, B, T, E)``: at the clean run, or averaged over ``steps`` points from the
    corrupted to the clean embeddings."""

    def metric() -> torch.Tensor:
        return logit_difference(last_logits(lm, batch.clean), batch.answer, batch.distractor).sum()

    if steps is None:
        return receiver_gradients(lm, graph, metric)
    embed = lm.model.get_input_embeddings()
    with torch.no_grad():
        clean_e, corrupt_e = embed(batch.clean), embed(batch.corrupt)
    total: torch.Tensor | None = None
    for k in range(1, steps + 1):
        alpha = torch.tensor([k / steps], dtype=torch.float64)
        with _interpolated_embeddings(lm, clean_e, corrupt_e, alpha):
            g = receiver_gradients(lm, graph, metric)
        total = g if total is None else total + g
    assert total is not None
    return total / steps


def edge_scores(
    lm: LoadedModel,
    task: Task,
    *,
    method: EdgeMethod = "eap",
    steps: int = IG_STEPS,
    graph: Graph | None = None,
    progress: Progress | None = None,
) -> EdgeScores:
    """Score every edge of ``lm``'s graph on ``task`` by EAP or EAP-IG (``steps`` points).

    Raises:
        InputError: an unknown method, fewer than 1 step, a model that is not a pre-norm or
            post-norm decoder with its language-model head, a task without prompts.
    """
    if method not in EDGE_METHODS:
        raise InputError(f"method must be one of {', '.join(EDGE_METHODS)}, got {method!r}")
    if method == "eap-ig" and steps < 1:
        raise InputError(f"EAP-IG needs at least 1 step, got {steps}")
    check_task(lm, task)
    check_differs(task)
    graph = graph or build_graph(lm)
    start = time.perf_counter()
    scores = torch.zeros(graph.edges.shape, dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    with stage(progress or NO_PROGRESS, f"{method} over prompts", task.n_prompts, "prompts") as bar:
        for i, batch in enumerate(task.batches):
            batch = batch.to(lm.device)
            clean_run, clean_ld = _record(lm, graph, batch, batch.clean)
            if i == 0:
                _check_sum(lm, graph, clean_run)
            corrupt_run, corrupt_ld = _record(lm, graph, batch, batch.corrupt)
            assert clean_run.values is not None and corrupt_run.values is not None
            delta = (corrupt_run.values - clean_run.values).flatten(1)  # (S, B*T*E)
            del clean_run, corrupt_run
            grads = _gradients(lm, graph, batch, None if method == "eap" else steps)
            scores += (delta @ grads.flatten(1).to(delta).t()).double().cpu()  # (S, R)
            clean_sum += float(clean_ld.sum())
            corrupt_sum += float(corrupt_ld.sum())
            bar.advance(batch.clean.shape[0])
    n = task.n_prompts
    _same_score(task, clean_sum / n, corrupt_sum / n)
    return EdgeScores(
        model=lm.name,
        task=task.name,
        method=method,
        steps=steps if method == "eap-ig" else None,
        n_prompts=n,
        graph=graph,
        scores=scores.masked_fill(~graph.edges, 0.0) / n,
        clean=clean_sum / n,
        corrupt=corrupt_sum / n,
        seconds=time.perf_counter() - start,
    )


def circuit_logit_differences(
    lm: LoadedModel,
    graph: Graph,
    task: Task,
    circuits: Sequence[torch.Tensor],
    *,
    progress: Progress | None = None,
) -> tuple[list[float], float, float]:
    """The mean logit difference of ``task`` with each circuit (bool ``(S, R)``: the edges it
    keeps) run on the clean prompts, every other edge carrying its corrupted value; and the
    clean and corrupted runs' own."""
    check_task(lm, task)
    sums = [0.0] * len(circuits)
    clean_sum = corrupt_sum = 0.0
    with stage(progress or NO_PROGRESS, "circuits over prompts", task.n_prompts, "prompts") as bar:
        for batch in task.batches:
            batch = batch.to(lm.device)
            corrupt_run, corrupt_ld = _record(lm, graph, batch, batch.corrupt)
            with torch.inference_mode():
                clean_ld = logit_difference(
                    last_logits(lm, batch.clean), batch.answer, batch.distractor
                )
            for i, keep in enumerate(circuits):
                left_out = (graph.edges & ~keep.to(torch.bool)).to(corrupt_run.values)
                with (
                    torch.inference_mode(),
                    EdgeRun(lm, graph, corrupt=corrupt_run.values, left_out=left_out),
                ):
                    ld = logit_difference(
                        last_logits(lm, batch.clean), batch.answer, batch.distractor
                    )
                sums[i] += float(ld.sum())
            clean_sum += float(clean_ld.sum())
            corrupt_sum += float(corrupt_ld.sum())
            bar.advance(batch.clean.shape[0])
    n = task.n_prompts
    return [s / n for s in sums], clean_sum / n, corrupt_sum / n


Search = Literal["greedy", "top", "learned"]
SEARCHES = ("greedy", "top", "learned")
#: the shares of the logit difference whose smallest circuits a curve names
TARGETS = (0.8, 0.9)


@dataclass(frozen=True, eq=False)
class Curve:
    """Faithfulness against circuit size, measured on held-out prompts.

    Attributes:
        edges: each circuit's number of edges (after dropping those that lead nowhere).
        faithfulness: ``(LD_circuit - LD_corrupt) / (LD_clean - LD_corrupt)`` of each.
        circuits: bool ``(S, R)`` of each.
        clean, corrupt: the held-out prompts' mean logit difference, clean and corrupted.
        smallest: per target share (0.8, 0.9), the index in the curve of the smallest circuit
            that reaches it, or ``None``.
    """

    search: str
    edges: list[int]
    faithfulness: list[float]
    circuits: list[torch.Tensor]
    clean: float
    corrupt: float
    smallest: dict[float, int | None]
    seconds: float


def cut(
    graph: Graph,
    scores: torch.Tensor,
    sizes: Sequence[int],
    search: Search,
    order: Sequence[tuple[int, int]] | None = None,
) -> list[torch.Tensor]:
    """The circuits of ``sizes`` edges cut from ``scores`` by ``search``; ``learned``: the
    first edges of ``order`` (:func:`headlab.causal.learned.learned_order`), less those that
    lead nowhere."""
    if search not in SEARCHES:
        raise InputError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if search == "top":
        return [top_edges(graph, scores, n) for n in sizes]
    if search == "learned":
        if order is None:
            raise InputError("the learned search needs the order its masks give")
        return [reaching_logits(graph, first_edges(graph, list(order), n)) for n in sizes]
    greedy = greedy_order(graph, scores)
    return [first_edges(graph, greedy, n) for n in sizes]


def faithfulness_curve(
    lm: LoadedModel,
    scores: EdgeScores,
    task: Task,
    *,
    sizes: Sequence[int] | None = None,
    search: Search = "greedy",
    order: Sequence[tuple[int, int]] | None = None,
    progress: Progress | None = None,
) -> Curve:
    """Cut ``scores`` to circuits of ``sizes`` edges (default :func:`curve_sizes`; with the
    ``learned`` search, the first edges of ``order``) and run each on ``task`` (prompts not
    used to find them), every edge outside it corrupted.

    Raises:
        InputError: the held-out prompts' clean and corrupted runs score the same.
    """
    start = time.perf_counter()
    graph = scores.graph
    check_task(lm, task)
    check_differs(task)
    sizes = list(curve_sizes(graph.n_edges) if sizes is None else sizes)
    circuits = cut(graph, scores.scores, sizes, search, order)
    lds, clean, corrupt = circuit_logit_differences(lm, graph, task, circuits, progress=progress)
    _same_score(task, clean, corrupt)
    faith = [(ld - corrupt) / (clean - corrupt) for ld in lds]
    counts = [int(c.sum()) for c in circuits]
    smallest: dict[float, int | None] = {}
    for target in TARGETS:
        reached = [i for i, f in enumerate(faith) if f >= target]
        smallest[target] = min(reached, key=lambda i: counts[i]) if reached else None
    return Curve(
        search=search,
        edges=counts,
        faithfulness=faith,
        circuits=circuits,
        clean=clean,
        corrupt=corrupt,
        smallest=smallest,
        seconds=time.perf_counter() - start,
    )
