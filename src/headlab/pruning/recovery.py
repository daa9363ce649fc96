"""Recovery: a short distillation of a physically pruned model to the unpruned one.

The pruned model's weights (every layer's; the token embeddings stay frozen) are trained for a
few hundred steps on the loss the L0 gates use: ``1 - cosine`` between its mean-pooled sentence
embeddings and the unpruned model's on unlabeled text (:class:`FidelityMetric`, the reference
embeddings computed once by the unpruned model) for sentence encoders, the language-model loss
on the training text (:class:`PerplexityMetric`) for causal models. AdamW, a linear warm-up over
the first tenth of the steps, batches in an order drawn from ``seed``; the model stays in eval
mode (no dropout), so a run is reproducible.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.pruning.l0 import batches, check_batches, training_only
from headlab.pruning.metrics import Metric


@dataclass(frozen=True, kw_only=True)
class RecoveryConfig:
    """``steps`` optimiser steps of AdamW at ``lr``; ``seed`` orders the batches."""

    steps: int
    lr: float = 5e-5
    seed: int = 0

    def check(self) -> None:
        if self.steps < 1:
            raise InputError(f"--recover must be at least 1 step, got {self.steps}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise InputError(f"the recovery learning rate must be positive, got {self.lr}")


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """What recovery did: the training loss of the first and last steps, and the time."""

    steps: int
    seconds: float
    loss_first: float
    loss_last: float

    def to_json(self) -> dict[str, float | int]:
        return {
            "steps": self.steps,
            "seconds": round(self.seconds, 2),
            "loss_first": round(self.loss_first, 6),
            "loss_last": round(self.loss_last, 6),
        }


def trainable(lm: LoadedModel) -> list[torch.nn.Parameter]:
    """The parameters recovery trains: all but the input embeddings."""
    emb = lm.model.get_input_embeddings() if hasattr(lm.model, "get_input_embeddings") else None
    frozen = {id(p) for p in emb.parameters()} if emb is not None else set()
    return [p for p in lm.model.parameters() if id(p) not in frozen]


def recover(lm: LoadedModel, data: Metric, config: RecoveryConfig) -> Recovery:
    """Train ``lm`` (in place) on ``data``'s loss for ``config.steps`` steps.

    Raises:
        InputError: bad ``config``, or ``data`` too short for one batch.
    """
    config.check()
    check_batches(data, "recovery")
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    params = trainable(lm)
    optimiser = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    warmup = max(1, config.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: min(1.0, (step + 1) / warmup)
    )
    losses: list[float] = []
    with training_only(lm.model, params):
        stream = batches(lm, data, generator)
        for _ in range(config.steps):
            loss = next(stream)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            losses.append(float(loss.detach()))
    return Recovery(
        steps=config.steps,
        seconds=time.perf_counter() - start,
        loss_first=losses[0],
        loss_last=losses[-1],
    )


@torch.no_grad()
def mean_loss(lm: LoadedModel, data: Metric) -> float:
    """``data``'s loss averaged over its batches (no training)."""
    values = [float(loss) for loss in data.loss_batches(lm)]
    return sum(values) / len(values)
