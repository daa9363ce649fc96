"""The pieces :func:`~headlab.pruning.workflow.run_pruning` adds for learned gates and recovery,
and the side-by-side comparison of the importance methods (``headlab prune --curve --compare``).

Training text: for sentence encoders, the sentences of the importance pairs, without their
labels (``--importance-stsb``, default a third of the bundled sample), with the unpruned model's
embeddings as the distillation target; for causal models, the first half of ``--text`` or of
the bundled TinyShakespeare sample (the half that scores perplexity importance; the metric is
measured on the other), with ``--metric ioi`` too.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from typing import Any

import torch

from headlab.errors import InputError
from headlab.layout.attention import MAX_POSITIONS
from headlab.layout.costs import compute_spec
from headlab.models.loading import LoadedModel, wrap
from headlab.progress import Prefixed, Progress, stage
from headlab.pruning.inputs import build_metrics, counts_after, perplexity_halves
from headlab.pruning.l0 import GateResult, check_batches, train_gates
from headlab.pruning.metrics import FidelityMetric, Metric, PerplexityMetric, StsbMetric
from headlab.pruning.physical import prune_model
from headlab.pruning.progressive import CurvePoint, PruneSearch, Scorer, progressive_prune
from headlab.pruning.recovery import RecoveryConfig, recover
from headlab.pruning.results import CURVE_FRACTION, PruneOptions, PruneResult
from headlab.pruning.tasks import IoiMetric

logger = logging.getLogger(__name__)

#: the ``schema`` value of ``headlab prune --curve --compare``'s JSON
COMPARE_SCHEMA = "headlab.prune-compare/1"
COMPARED = ("gradient", "ablation", "l0")
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def training_data(lm: LoadedModel, options: PruneOptions, importance: Metric) -> Metric:
    """The unlabeled training text of the L0 gates and of recovery, checked to hold at least one
    batch (a one-line error before any training or search)."""

    if isinstance(importance, PerplexityMetric):
        data: Metric = importance
    elif isinstance(importance, IoiMetric):  # its prompts are few and alike: the LM loss
        data = perplexity_halves(lm, options)[1]
    else:
        if options.text is not None:
            raise InputError(
                "--text is the training text of causal models; a sentence encoder trains on the "
                "sentences of --importance-stsb (their labels unused)"
            )
        if isinstance(importance, StsbMetric):
            texts = list(dict.fromkeys(s for p in importance.pairs for s in (p.first, p.second)))
            data = FidelityMetric(texts=texts, reference=torch.empty(0, 0))
            check_batches(data, "L0 gates and recovery")
            data = FidelityMetric.build(lm, texts)
        elif isinstance(importance, FidelityMetric):
            data = importance
        else:  # pragma: no cover - every metric is one of the three
            raise InputError(f"no training text for the {importance.name} metric")
    check_batches(data, "L0 gates and recovery")
    return data


def train_l0(
    lm: LoadedModel,
    data: Metric,
    options: PruneOptions,
    *,
    progress: Progress | None = None,
) -> GateResult:
    """Train the L0 gates of ``options`` on ``data``: one stage ``L0 gates`` of ``progress``,
    in steps, with the task loss and the expected share of open gates."""
    with stage(progress, "L0 gates", options.l0_steps, "steps") as report:

        def on_step(step: int, task: float, penalty: float) -> None:
            report.advance(note=f"task loss {task:.5f}, expected open share {penalty:.3f}")

        return train_gates(lm, data, options.l0_config, on_step=on_step)


def gate_scorer(gates: GateResult) -> Scorer:
    """Importance from trained gates: each unit's ``P(z != 0)``, NaN for heads already gone."""

    def score(lm: LoadedModel, metric: Metric, removed: Any = None) -> torch.Tensor:
        out = gates.scores(lm)
        for layer, heads in (removed or {}).items():
            out[layer, list(heads)] = float("nan")
        return out

    return score


def kv_bytes(lm: LoadedModel, search: PruneSearch) -> list[int]:
    """KV-cache bytes per token (all layers, the model's dtype) at each point of ``search``,
    from the spec code (:func:`headlab.layout.costs.compute_spec`)."""
    return kv_costs(lm, search)["kv_bytes"]


def kv_costs(lm: LoadedModel, search: PruneSearch) -> dict[str, Any]:
    """The KV-cache fields of a :class:`~headlab.pruning.results.PruneResult` at each point of
    ``search``: bytes per token, and bytes of one sequence at the model's context (its
    ``max_position_embeddings``, or 8,192 tokens when it states none; sliding-window layers
    keep only their window), in the model's dtype."""

    dtype = _DTYPE_NAMES.get(next(lm.model.parameters()).dtype, "fp32")
    context = min(lm.max_positions or 8192, MAX_POSITIONS)
    per_token, at_context = [], []
    for point in search.points:
        heads, kv = counts_after(lm, point)
        layout = replace(lm.layout, heads_per_layer=tuple(heads), kv_heads_per_layer=tuple(kv))
        spec = compute_spec(layout, context=context, dtype=dtype)
        per_token.append(spec.kv_cache_bytes_per_token)
        at_context.append(spec.kv_cache_bytes)
    return {"kv_bytes": per_token, "kv_context": context, "kv_context_bytes": at_context}


def recovery_config(options: PruneOptions) -> RecoveryConfig:
    if options.recover is None:
        raise InputError("recovery needs --recover STEPS")
    return RecoveryConfig(steps=options.recover, seed=options.seed)


def recover_model(
    small: LoadedModel, data: Metric, options: PruneOptions, *, metric: Metric, before: float
) -> dict[str, Any]:
    """Recover ``small`` in place; the metric before and after, the time, the training loss."""
    done = recover(small, data, recovery_config(options))
    after = metric.evaluate(small)
    return {
        **done.to_json(),
        "lr": recovery_config(options).lr,
        "metric_before": round(before, 4),
        "metric_after": round(after, 4),
    }


def _loss(metric: Metric, base: float, value: float) -> float:
    return base - value if metric.higher_is_better else value - base


def recover_points(
    lm: LoadedModel,
    search: PruneSearch,
    evaluation: Metric,
    data: Metric,
    options: PruneOptions,
    *,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Prune a copy of ``lm`` at the last curve point at or below each share of
    ``options.recover_at``, recover it, and measure it again; ``lm`` is left as it was. One
    stage ``recovery`` of ``progress``, in pruned models."""

    base = search.points[0].metric
    chosen: list[CurvePoint] = []
    for share in options.recover_at:
        below = [p for p in search.points if p.step > 0 and p.fraction <= share + 1e-9]
        if below and below[-1] not in chosen:
            chosen.append(below[-1])
    out = []
    with stage(progress, f"recovery ({options.recover} steps each)", len(chosen), "models") as r:
        for point in chosen:
            twin = wrap(copy.deepcopy(lm.model), lm.tokenizer, name=lm.name, path=lm.path)
            small = prune_model(twin, point.removed)
            record = recover_model(small, data, options, metric=evaluation, before=point.metric)
            out.append(
                {
                    "step": point.step,
                    "heads_removed": point.heads_removed,
                    "fraction": round(point.fraction, 4),
                    **record,
                    "loss_before": round(point.loss, 4),
                    "loss_after": round(_loss(evaluation, base, record["metric_after"]), 4),
                }
            )
            del twin, small
            r.advance(
                note=f"{point.heads_removed} heads removed: {evaluation.name} "
                f"{record['metric_before']:.2f} -> {record['metric_after']:.2f}"
            )
    return out


def compare_methods(
    lm: LoadedModel,
    options: PruneOptions,
    *,
    progress: Progress | None = None,
    evaluation: Metric | None = None,
    importance: Metric | None = None,
    settings: dict[str, dict[str, Any]] | None = None,
    importances: dict[str, Metric] | None = None,
    data: Metric | None = None,
) -> dict[str, Any]:
    """Curves of gradient, ablation and L0 importance (and each with recovery when
    ``options.recover``) on the same evaluation data, in one run: the JSON of
    ``headlab prune --curve --compare`` (``schema``: ``headlab.prune-compare/1``).

    ``evaluation``/``importance`` replace the metrics :func:`build_metrics` would build;
    ``settings`` overrides options per method (``{"ablation": {"step": 0.1}}``) and
    ``importances`` the importance data per method, e.g. to keep ablation's one evaluation per
    head affordable; ``data`` replaces the training text of the gates and of recovery.
    ``progress`` is told of each method's stages, named after the method.
    """

    options.check()
    if evaluation is None or importance is None:
        evaluation, importance, _ = build_metrics(lm, options)
    if data is None:
        data = training_data(lm, options, importance)
    with stage(progress, "unpruned model", 1, "evaluations") as report:
        base = evaluation.evaluate(lm)
        report.advance(note=f"{evaluation.name} {base:.2f}")
    methods = []
    notes: list[str] = []
    for method in COMPARED:
        mine = replace(options, importance=method, **(settings or {}).get(method, {}))
        gates = None
        scorer = None
        told = Prefixed(progress, f"{method} importance")
        if method == "l0":
            gates = train_l0(lm, data, mine, progress=told)
            scorer = gate_scorer(gates)
            notes += gates.kept_set(lm.n_layers)[1]
        search = progressive_prune(
            lm,
            evaluation,
            (importances or {}).get(method, importance),
            fraction=CURVE_FRACTION if mine.fraction is None else mine.fraction,
            step=mine.step,
            method=method,
            uniform=mine.uniform,
            scorer=scorer,
            base=base,
            progress=told,
        )
        recovered = (
            recover_points(lm, search, evaluation, data, mine, progress=told)
            if mine.recover is not None
            else []
        )
        result = PruneResult(
            model=lm.name,
            importance=method,
            search=search,
            gates=None if gates is None else gates.to_json(),
            recovered=recovered,
            **(kv_costs(lm, search) if lm.causal else {}),
        )
        methods.append(result.to_json())
    return {
        "schema": COMPARE_SCHEMA,
        "model": lm.name,
        "metric": evaluation.name,
        "unit": evaluation.unit,
        "higher_is_better": evaluation.higher_is_better,
        "metric_before": round(base, 4),
        "x": options.x_axis,
        "heads_before": sum(lm.layout.heads_per_layer),
        "methods": methods,
        "notes": notes,
    }


def removed_within(curve: list[dict[str, Any]], max_loss: float) -> dict[str, Any] | None:
    """The point with the most heads removed whose loss is at most ``max_loss`` (any point of a
    curve, or of its recovered points), or ``None``."""
    key = "loss_after" if curve and "loss_after" in curve[0] else "loss"
    within = [p for p in curve if p["heads_removed"] > 0 and p[key] <= max_loss]
    return max(within, key=lambda p: p["heads_removed"]) if within else None
