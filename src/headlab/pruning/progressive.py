"""Progressive pruning: remove the least important heads in steps, re-measuring as it goes.

At each step importance is recomputed for the model as it now is, the least important units go
(one head each under MHA; one KV group with its query heads under GQA, so the layout stays
valid), and the metric is evaluated on held-out data. Every layer keeps at least one unit. With
``max_loss`` the search stops before the first step that loses more than that, and the last
step within it is chosen.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.progress import NO_PROGRESS, Progress
from headlab.pruning.importance import ablation_importance, gradient_importance
from headlab.pruning.metrics import Metric

logger = logging.getLogger(__name__)

#: importance of the heads ``(L, H)`` (NaN where absent) for a model with ``removed`` heads gone
Scorer = Callable[[LoadedModel, Metric, "dict[int, list[int]] | None"], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class CurvePoint:
    """The model after one step. ``removed``: ``{layer: [head, ...]}`` (current indices)."""

    step: int
    heads_removed: int
    fraction: float
    metric: float
    loss: float
    removed: dict[int, list[int]]


@dataclass(frozen=True, kw_only=True)
class PruneSearch:
    """The pruning curve and the chosen point."""

    metric: str
    unit: str
    higher_is_better: bool
    total_heads: int
    unit_kind: str
    points: list[CurvePoint]
    chosen: CurvePoint
    stopped_by_max_loss: bool


def units_of(lm: LoadedModel) -> list[tuple[int, list[int]]]:
    """Pruning units: single heads under MHA, whole KV groups under GQA/MQA."""
    units = []
    for layer, (n, kv) in enumerate(
        zip(lm.layout.heads_per_layer, lm.layout.kv_heads_per_layer, strict=True)
    ):
        group = n // kv
        if kv == n:
            units += [(layer, [h]) for h in range(n)]
        else:
            units += [(layer, list(range(g * group, (g + 1) * group))) for g in range(kv)]
    return units


def progressive_prune(
    lm: LoadedModel,
    metric: Metric,
    importance_metric: Metric,
    *,
    fraction: float,
    step: float = 0.1,
    max_loss: float | None = None,
    method: str = "gradient",
    uniform: bool = False,
    on_step: Callable[[CurvePoint], None] | None = None,
    scorer: Scorer | None = None,
    base: float | None = None,
    progress: Progress | None = None,
) -> PruneSearch:
    """Prune up to ``fraction`` of the heads in steps of ``step``; see the module docstring.

    ``uniform``: take the same number of units from every layer at each step (each layer's
    least important), so that every layer ends with the same head count, which the Llama
    family's own config can express. ``on_step`` gets each point as it is measured;
    ``progress`` counts the search as one stage of steps (step 0: the unpruned model).
    ``scorer`` replaces ``method``'s importance (the trained L0 gates' scores,
    :meth:`headlab.pruning.l0.GateResult.scores`); ``base``: the unpruned model's metric when
    already measured.
    """
    if not 0.0 < fraction < 1.0:
        raise InputError(f"the fraction of heads to prune must be in (0, 1), got {fraction}")
    if not 0.0 < step <= 1.0:
        raise InputError(f"the step must be in (0, 1], got {step}")
    if scorer is None and method not in ("gradient", "ablation"):
        raise InputError(f"importance must be 'gradient' or 'ablation', got {method!r}")
    score = scorer or (gradient_importance if method == "gradient" else ablation_importance)
    units = units_of(lm)
    total = sum(lm.layout.heads_per_layer)
    target = round(fraction * total)
    # a step removes at least one unit (a KV group of a small GQA model may exceed step * total)
    per_step = max(min(len(heads) for _, heads in units), round(step * total))
    # every layer keeps one unit: the steps the search can take at most, for the progress
    sizes = {layer: len(heads) for layer, heads in units}
    reachable = min(target, total - sum(sizes.values()))
    report = NO_PROGRESS if progress is None else progress
    report.start("pruning search", 1 + math.ceil(reachable / per_step), "steps")
    base = metric.evaluate(lm) if base is None else base
    report.advance(note=f"{metric.name} {base:.3f} unpruned")
    points = [CurvePoint(step=0, heads_removed=0, fraction=0.0, metric=base, loss=0.0, removed={})]
    if on_step:
        on_step(points[0])
    gone: set[int] = set()  # unit indices
    chosen, stopped = points[0], False
    while True:
        removed_now = sum(len(units[u][1]) for u in gone)
        if removed_now >= target:
            break
        removed = _removed(units, gone)
        imp = score(lm, importance_metric, removed)
        left_per_layer = [0] * lm.n_layers
        for u, (layer, _) in enumerate(units):
            if u not in gone:
                left_per_layer[layer] += 1
        ranked = sorted(
            (u for u in range(len(units)) if u not in gone),
            key=lambda u: float(torch.nansum(imp[units[u][0], units[u][1]])),
        )
        budget = min(per_step, target - removed_now)
        picked: list[int] = []
        if uniform:
            picked = _uniform_pick(units, ranked, left_per_layer, budget, lm.n_layers)
        for u in [] if uniform else ranked:
            layer, heads = units[u]
            if left_per_layer[layer] <= 1 or len(heads) > budget:
                continue
            picked.append(u)
            left_per_layer[layer] -= 1
            budget -= len(heads)
            if budget <= 0:
                break
        if not picked:
            break  # every layer is down to one unit, or the last unit is larger than the rest
        gone |= set(picked)
        removed = _removed(units, gone)
        value = metric.evaluate(lm, removed)
        loss = (base - value) if metric.higher_is_better else (value - base)
        n_removed = sum(len(units[u][1]) for u in gone)
        point = CurvePoint(
            step=len(points),
            heads_removed=n_removed,
            fraction=n_removed / total,
            metric=value,
            loss=loss,
            removed=removed,
        )
        points.append(point)
        if on_step:
            on_step(point)
        logger.info("step %d: %d heads removed, %s %.3f", point.step, n_removed, metric.name, value)
        report.advance(note=f"{n_removed} heads removed, {metric.name} {value:.3f}")
        if max_loss is not None and loss > max_loss:
            stopped = True
            break
        chosen = point
    if max_loss is None:
        chosen = points[-1]
    report.end()
    return PruneSearch(
        metric=metric.name,
        unit=metric.unit,
        higher_is_better=metric.higher_is_better,
        total_heads=total,
        unit_kind="heads" if all(len(h) == 1 for _, h in units) else "KV groups",
        points=points,
        chosen=chosen,
        stopped_by_max_loss=stopped,
    )


def _uniform_pick(
    units: list[tuple[int, list[int]]],
    ranked: list[int],
    left_per_layer: list[int],
    budget: int,
    n_layers: int,
) -> list[int]:
    """The same number of units from every layer, each layer's least important first."""
    size = len(units[0][1])
    per_layer = max(1, budget // (size * n_layers))
    per_layer = min(per_layer, min(left_per_layer) - 1)
    if per_layer < 1:
        return []
    picked: list[int] = []
    taken = [0] * n_layers
    for u in ranked:
        layer = units[u][0]
        if taken[layer] < per_layer:
            picked.append(u)
            taken[layer] += 1
    return picked


def _removed(units: list[tuple[int, list[int]]], gone: set[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for u in sorted(gone):
        layer, heads = units[u]
        out.setdefault(layer, []).extend(heads)
    return {layer: sorted(h) for layer, h in sorted(out.items())}
