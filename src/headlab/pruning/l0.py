"""Learned head gates: one hard-concrete gate per head, trained with an expected-L0 penalty.

Louizos, Welling & Kingma 2018 ("Learning Sparse Neural Networks through L0 Regularization"), as
Voita et al. 2019 ("Analyzing Multi-Head Self-Attention") use it on attention heads: each pruning
unit (a head; a KV group with its query heads under GQA, so the layout stays valid) gets a gate

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log_alpha) / beta),
    z = clamp(s * (r - l) + l, 0, 1)                        beta = 2/3, (l, r) = (-0.1, 1.1)

multiplied into the head's output before the output projection (the same hook as gradient
importance, :class:`headlab.pruning.metrics.HeadGates`). The stretch puts mass on exactly 0 and
exactly 1, and the probability that a gate is not 0 is differentiable:

    P(z != 0) = sigmoid(log_alpha - beta * log(-l / r))

The gates are trained with ``task loss + weight * mean_units P(z != 0)`` while the model's own
weights stay frozen; the weight sets the sparsity (it is the task loss the whole set of heads is
worth). The task loss is the caller's :class:`~headlab.pruning.metrics.Metric` loss: distillation
to the unpruned model's sentence embeddings (``1 - cosine``, :class:`FidelityMetric`) for sentence
encoders, the language-model loss (:class:`PerplexityMetric`) for causal models. Everything random
(gate noise, batch order) comes from one seeded generator, so a run is reproducible.

After training, ``P(z != 0)`` ranks the units, and the deterministic gate
``clamp(sigmoid(log_alpha) * (r - l) + l, 0, 1)`` decides which are closed (exactly 0).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from headlab.errors import InputError
from headlab.models.gates import deterministic_gates, expected_l0, sample_gates
from headlab.models.loading import LoadedModel
from headlab.pruning.metrics import FidelityMetric, HeadGates, Metric, PerplexityMetric
from headlab.pruning.progressive import units_of as units

logger = logging.getLogger(__name__)

#: initial ``log_alpha``: every gate open with probability ~0.99
INIT_LOG_ALPHA = 3.0


@dataclass(frozen=True, kw_only=True)
class L0Config:
    """How the gates are trained.

    Attributes:
        weight: the L0 penalty's weight (task-loss units for the whole set of heads).
        steps: optimiser steps (one batch each).
        lr: Adam learning rate of ``log_alpha``.
        seed: seeds the gate noise and the batch order.
    """

    weight: float = 0.5
    steps: int = 300
    lr: float = 0.1
    seed: int = 0

    def check(self) -> None:
        if not self.weight > 0 or not math.isfinite(self.weight):
            raise InputError(f"--l0-weight must be a positive number, got {self.weight}")
        if self.steps < 1:
            raise InputError(f"--l0-steps must be at least 1, got {self.steps}")
        if not self.lr > 0:
            raise InputError(f"the L0 learning rate must be positive, got {self.lr}")


@dataclass(frozen=True, kw_only=True)
class GateResult:
    """Trained gates. ``units``: ``(layer, [heads])`` per gate, as the progressive search has
    them; ``log_alpha``/``p_open``/``gate``: one value per unit."""

    config: L0Config
    units: list[tuple[int, list[int]]]
    log_alpha: list[float]
    p_open: list[float]
    gate: list[float]
    task_loss: list[float]  # per step
    seconds: float

    def closed_units(self) -> list[int]:
        """Units whose deterministic gate is exactly 0."""
        return [u for u, g in enumerate(self.gate) if g <= 0.0]

    def kept_set(self, n_layers: int) -> tuple[dict[int, list[int]], list[str]]:
        """Heads the gates remove ``{layer: [heads]}``, and a note for each layer whose gates all
        closed (that layer keeps its most open unit: headlab never removes a whole layer)."""
        closed = set(self.closed_units())
        notes = []
        for layer in range(n_layers):
            mine = [u for u, (lay, _) in enumerate(self.units) if lay == layer]
            if mine and all(u in closed for u in mine):
                best = max(mine, key=lambda u: self.log_alpha[u])
                closed.discard(best)
                notes.append(
                    f"layer {layer}: L0 weight {self.config.weight:g} closes every gate; "
                    f"keeping head{'s' if len(self.units[best][1]) > 1 else ''} "
                    f"{', '.join(map(str, self.units[best][1]))} (the most open) in that layer"
                )
        removed: dict[int, list[int]] = {}
        for u in sorted(closed):
            layer, heads = self.units[u]
            removed.setdefault(layer, []).extend(heads)
        return {k: sorted(v) for k, v in sorted(removed.items())}, notes

    def scores(self, lm: LoadedModel) -> torch.Tensor:
        """``(L, H)`` grid of ``P(z != 0)`` (each head gets its unit's value; NaN where absent)."""
        width = max(lm.layout.heads_per_layer)
        out = torch.full((lm.n_layers, width), float("nan"), dtype=torch.float64)
        for (layer, heads), p in zip(self.units, self.p_open, strict=True):
            out[layer, heads] = p
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "weight": self.config.weight,
            "steps": self.config.steps,
            "lr": self.config.lr,
            "seed": self.config.seed,
            "seconds": round(self.seconds, 2),
            "units": [{"layer": layer, "heads": heads} for layer, heads in self.units],
            "p_open": [round(p, 4) for p in self.p_open],
            "gate": [round(g, 4) for g in self.gate],
            "closed": len(self.closed_units()),
            "task_loss_first": round(self.task_loss[0], 6),
            "task_loss_last": round(self.task_loss[-1], 6),
        }


def shuffled(metric: Metric, generator: torch.Generator) -> Metric:
    """The same data in a random order, cut to whole batches (texts with their reference
    embeddings; language-model windows)."""
    n = batch_count(metric) * metric.batch  # type: ignore[attr-defined]
    if isinstance(metric, FidelityMetric):
        order = torch.randperm(len(metric.texts), generator=generator)[:n]
        return replace(
            metric, texts=[metric.texts[i] for i in order], reference=metric.reference[order]
        )
    if isinstance(metric, PerplexityMetric):
        order = torch.randperm(metric.windows.shape[0], generator=generator)[:n]
        return replace(metric, windows=metric.windows[order])
    raise InputError(
        f"training needs unlabeled text (fidelity or perplexity data), got {metric.name}"
    )


def batch_count(metric: Metric) -> int:
    """Whole batches ``metric``'s data holds."""
    if isinstance(metric, FidelityMetric):
        return len(metric.texts) // metric.batch
    if isinstance(metric, PerplexityMetric):
        return int(metric.windows.shape[0]) // metric.batch
    raise InputError(
        f"training needs unlabeled text (fidelity or perplexity data), got {metric.name}"
    )


def check_batches(metric: Metric, what: str) -> None:
    """A one-line error when ``metric``'s text is too short for one batch."""
    if batch_count(metric) >= 1:
        return
    if isinstance(metric, PerplexityMetric):
        have = f"{metric.windows.shape[0]} windows of {metric.windows.shape[1]} tokens"
    else:
        have = f"{len(metric.texts)} sentences"  # type: ignore[attr-defined]
    raise InputError(
        f"{what} needs text for at least one batch of {metric.batch}; got {have}"  # type: ignore[attr-defined]
    )


def batches(lm: LoadedModel, metric: Metric, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Losses of whole batches, epoch after epoch, each epoch in a new random order. Each
    batch's forward runs when it is asked for (after the caller has set its gates)."""
    while True:
        yield from shuffled(metric, generator).loss_batches(lm)


@contextmanager
def training_only(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Gradients for ``params`` alone while the block runs (the model's other weights frozen),
    under ``torch.enable_grad``; every ``requires_grad`` flag as it was afterwards, errors
    included, and the trained parameters' gradients dropped."""
    everything = list(model.parameters())
    flags = [p.requires_grad for p in everything]
    keep = {id(p) for p in params}
    for p in everything:
        p.requires_grad_(id(p) in keep)
    try:
        with torch.enable_grad():
            yield
    finally:
        for p, flag in zip(everything, flags, strict=True):
            p.requires_grad_(flag)
        for p in params:
            p.grad = None


def units_of(lm: LoadedModel) -> list[tuple[int, list[int]]]:
    """Gate units: single heads under MHA, whole KV groups (with their query heads) under GQA."""

    return units(lm)


def train_gates(
    lm: LoadedModel,
    data: Metric,
    config: L0Config,
    *,
    on_step: Callable[[int, float, float], None] | None = None,
) -> GateResult:
    """Train one hard-concrete gate per unit of ``lm`` on ``data``'s loss + the L0 penalty.

    ``lm``'s weights stay frozen (and unchanged).

    Raises:
        InputError: bad ``config``, or ``data`` too short for one batch.
    """

    config.check()
    check_batches(data, "L0 gate training")
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    units = units_of(lm)
    device = lm.device
    log_alpha = torch.full(
        (len(units),), INIT_LOG_ALPHA, dtype=torch.float32, device=device, requires_grad=True
    )
    rows = torch.tensor([layer for layer, heads in units for _ in heads], device=device)
    cols = torch.tensor([h for _, heads in units for h in heads], device=device)
    which = torch.tensor([u for u, (_, heads) in enumerate(units) for _ in heads], device=device)
    width = max(lm.layout.heads_per_layer)
    current = {"gates": torch.ones(lm.n_layers, width, device=device)}
    optimiser = torch.optim.Adam([log_alpha], lr=config.lr)
    losses: list[float] = []
    # the model's weights frozen: only the gates learn
    with HeadGates(lm, lambda: current["gates"]), training_only(lm.model, []):
        stream = batches(lm, data, generator)
        for step in range(1, config.steps + 1):
            z = sample_gates(log_alpha, generator)  # (U,)
            grid = torch.ones(lm.n_layers, width, device=device, dtype=z.dtype)
            current["gates"] = grid.index_put((rows, cols), z[which])  # (L, H)
            task = next(stream)  # the forward runs here, with these gates
            penalty = expected_l0(log_alpha).mean()
            optimiser.zero_grad()
            (task + config.weight * penalty).backward()
            optimiser.step()
            losses.append(float(task.detach()))
            if on_step:
                on_step(step, float(task.detach()), float(penalty.detach()))
    alpha = log_alpha.detach().double().cpu()
    logger.info(
        "L0 gates: %d of %d units closed", int((deterministic_gates(alpha) <= 0).sum()), len(units)
    )
    return GateResult(
        config=config,
        units=units,
        log_alpha=[float(a) for a in alpha],
        p_open=[float(p) for p in expected_l0(alpha)],
        gate=[float(g) for g in deterministic_gates(alpha)],
        task_loss=losses,
        seconds=time.perf_counter() - start,
    )
