"""How much each head matters to a metric.

- **gradient** (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?", eq. 2):
  put a gate ``xi_h = 1`` on every head's output and take ``I_h = E_x |dL/dxi_h|``, the mean
  over batches of the absolute gradient of the task loss; scores are then divided by their l2
  norm within each layer, as in the paper, so layers compare. One forward and backward pass.
- **ablation**: the metric's loss when the head alone is zero-ablated (one evaluation per head).

Heads already removed keep their gate at 0 (and score NaN): importance is recomputed for the
model as it is at each pruning step.

Under ``torchrun`` (:mod:`headlab.distributed`) the ranks share the work: the gradient's
batches, or the heads to ablate; the sums are added up over the ranks (in float64), so every
rank gets the scores of one process.
"""

from __future__ import annotations

import math

import torch

from headlab import distributed
from headlab.models.loading import LoadedModel
from headlab.pruning.metrics import HeadGates, Metric, Removed


def _grid(lm: LoadedModel) -> torch.Tensor:
    width = max(lm.layout.heads_per_layer)
    out = torch.full((lm.n_layers, width), float("nan"), dtype=torch.float64)
    for layer, n in enumerate(lm.layout.heads_per_layer):
        out[layer, :n] = 0.0
    return out


def gradient_importance(
    lm: LoadedModel, metric: Metric, removed: Removed | None = None
) -> torch.Tensor:
    """``(L, H)`` Michel et al. importance, l2-normalised per layer; NaN for absent heads."""
    scores = _grid(lm)
    gates = torch.ones(scores.shape, device=lm.device)
    for layer, heads in (removed or {}).items():
        gates[layer, list(heads)] = 0.0
    gates.requires_grad_(True)
    params = list(lm.model.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    total = torch.zeros(scores.shape, dtype=torch.float64)
    n = 0
    try:
        with (
            torch.enable_grad(),
            HeadGates(lm, gates),
            distributed.failures("importance scoring"),
        ):
            for loss in metric.loss_batches(lm, distributed.part()):
                (grad,) = torch.autograd.grad(loss, gates)
                total += grad.abs().double().cpu()
                n += 1
    finally:
        for p, flag in zip(params, flags, strict=True):
            # an offloaded layer's weights are rebuilt at each forward (accelerate): those made
            # under inference mode cannot take requires_grad again, and need not
            if p.requires_grad != flag and not p.is_inference():
                p.requires_grad_(flag)
    total = distributed.reduce_tensor(total)
    n = int(distributed.reduce_tensor(torch.tensor([float(n)]))[0])
    total /= max(n, 1)
    for layer, heads in (removed or {}).items():
        total[layer, list(heads)] = float("nan")
    for layer, count in enumerate(lm.layout.heads_per_layer):
        row = total[layer, :count]
        norm = math.sqrt(float(row.nan_to_num(0.0).pow(2).sum()))
        scores[layer, :count] = row / norm if norm > 0 else row
    return scores


def ablation_importance(
    lm: LoadedModel, metric: Metric, removed: Removed | None = None
) -> torch.Tensor:
    """``(L, H)``: how much worse the metric gets when each remaining head also goes."""
    scores = _grid(lm)
    current = {layer: list(heads) for layer, heads in (removed or {}).items()}
    sign = 1.0 if metric.higher_is_better else -1.0
    rank, world = distributed.part()
    mine = torch.zeros(scores.shape, dtype=torch.float64)  # this rank's heads; 0 elsewhere
    with distributed.failures("importance scoring"):
        base = metric.evaluate(lm, current)
        k = 0
        for layer, count in enumerate(lm.layout.heads_per_layer):
            for head in range(count):
                if head in current.get(layer, []):
                    continue
                k += 1
                if (k - 1) % world != rank:
                    continue
                trial = {**current, layer: [*current.get(layer, []), head]}
                mine[layer, head] = sign * (base - metric.evaluate(lm, trial))
    mine = distributed.reduce_tensor(mine)  # each head from one rank: x + 0, exact
    for layer, count in enumerate(lm.layout.heads_per_layer):
        for head in range(count):
            gone = head in current.get(layer, [])
            scores[layer, head] = float("nan") if gone else float(mine[layer, head])
    return scores
