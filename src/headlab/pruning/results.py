"""Options, results and the one JSON schema of a pruning run (``headlab.prune/1``).

:class:`PruneOptions` is what :func:`~headlab.pruning.workflow.run_pruning` is asked to do;
:meth:`PruneResult.to_json` is what ``headlab prune --json`` prints and what ``headlab report
--pruning FILE`` reads back through :func:`read_pruning_json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headlab.errors import DataFormatError, InputError
from headlab.outputs import check_output
from headlab.pruning.l0 import L0Config
from headlab.pruning.physical import KIND
from headlab.pruning.progressive import CurvePoint, PruneSearch

#: the ``schema`` value of a pruning result's JSON
SCHEMA = "headlab.prune/1"
#: how far the curve goes when no model is written
CURVE_FRACTION = 0.9
METRICS = ("stsb", "fidelity", "perplexity", "ioi")
IMPORTANCES = ("gradient", "ablation", "l0")
#: default L0 penalty weight and gate-training steps (benchmarks/pruning_l0.py)
L0_WEIGHT = 0.5
L0_STEPS = 300


@dataclass(frozen=True, kw_only=True)
class PruneOptions:
    """What to prune and how; the defaults are ``headlab prune --curve``'s.

    Attributes:
        fraction: share of heads to remove, in (0, 1); ``None`` measures the curve only (up to
            ``CURVE_FRACTION``) and writes no model.
        out: folder for the pruned model (needed with ``fraction``).
        overwrite: replace an ``out`` folder that headlab wrote.
        metric: ``stsb``, ``fidelity``, ``perplexity`` or ``ioi`` (causal models: the logit
            difference of indirect object identification, :mod:`headlab.pruning.tasks`);
            ``None``: perplexity for causal models, stsb for encoders.
        importance: ``gradient``, ``ablation`` or ``l0`` (learned hard-concrete gates,
            :mod:`headlab.pruning.l0`); with ``l0``, ``out`` and no ``fraction`` the gates
            themselves decide which heads go.
        step: share of heads removed per step.
        max_loss: stop before losing more than this (metric units).
        uniform: the same number of heads from every layer.
        transformers_compatible: refuse results that only headlab can load (implies uniform).
        stsb: STS-B file for the metric (``None``: the bundled sample).
        importance_stsb: STS-B file for importance (``None``: every third pair of ``stsb``).
        importance_pairs: score importance on this many pairs, evenly spaced.
        text: text file for perplexity: importance on its first half, the metric on the
            second (``None``: the bundled TinyShakespeare sample).
        limit: use at most this many STS-B pairs.
        l0_weight: the L0 penalty's weight (task-loss units for the whole set of heads).
        l0_steps: optimiser steps of the gates.
        seed: seeds the gates' noise and every batch order (gates and recovery).
        recover: distill the pruned model to the unpruned one for this many steps
            (:mod:`headlab.pruning.recovery`); on a curve, at the points of ``recover_at``.
        recover_at: shares of heads removed where a curve is recovered (the last point at or
            below each).
        compare: curves of gradient, ablation and L0 importance on the same data, in one run.
        x_axis: ``heads`` or ``kv-bytes`` (KV-cache bytes per token, causal models) for figures.
    """

    fraction: float | None = None
    out: Path | None = None
    overwrite: bool = False
    metric: str | None = None
    importance: str = "gradient"
    step: float = 0.1
    max_loss: float | None = None
    uniform: bool = False
    transformers_compatible: bool = False
    stsb: Path | None = None
    importance_stsb: Path | None = None
    importance_pairs: int | None = None
    text: Path | None = None
    limit: int | None = None
    l0_weight: float = L0_WEIGHT
    l0_steps: int = L0_STEPS
    seed: int = 0
    recover: int | None = None
    recover_at: tuple[float, ...] = (0.5, 0.7)
    compare: bool = False
    x_axis: str = "heads"

    @property
    def l0_config(self) -> Any:
        """The :class:`~headlab.pruning.l0.L0Config` of these options."""

        return L0Config(weight=self.l0_weight, steps=self.l0_steps, seed=self.seed)

    @property
    def needs_lm_head(self) -> bool:
        """Whether the model must be loaded with its language-model head (perplexity, IOI).
        With no ``metric`` it depends on the model: causal models are scored by perplexity."""
        return self.metric in ("perplexity", "ioi") or self.text is not None

    def check(self) -> None:
        """Check the options and the output location before any work.

        Raises:
            InputError: an option out of range or a missing companion option.
            OutputExistsError, OutputError: ``out`` cannot be written.
        """

        if self.fraction is not None and not 0.0 < self.fraction < 1.0:
            raise InputError(f"--fraction must be in (0, 1), got {self.fraction}")
        if self.fraction is not None and self.out is None:
            raise InputError("--fraction needs --out DIR for the pruned model")
        if self.fraction is None and self.out is not None and self.importance != "l0":
            raise InputError(
                f"--out {self.out} is for the pruned model of --fraction (or of the L0 gates, "
                "--importance l0); --curve writes none (use --json > FILE for the curve)"
            )
        if self.compare and (self.fraction is not None or self.out is not None):
            raise InputError("--compare draws curves only: drop --fraction and --out")
        if self.recover is not None and self.recover < 1:
            raise InputError(f"--recover must be at least 1 step, got {self.recover}")
        for f in self.recover_at:
            if not 0.0 < f < 1.0:
                raise InputError(f"--recover-at shares must be in (0, 1), got {f}")
        if self.x_axis not in ("heads", "kv-bytes"):
            raise InputError(f"--x must be heads or kv-bytes, got {self.x_axis!r}")
        if self.seed < 0:
            raise InputError(f"--seed must be a non-negative integer, got {self.seed}")
        if self.importance == "l0" or self.compare:
            self.l0_config.check()
        if not 0.0 < self.step <= 1.0:
            raise InputError(f"--step must be in (0, 1], got {self.step}")
        if self.metric is not None and self.metric not in METRICS:
            raise InputError(f"--metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if self.importance not in IMPORTANCES:
            raise InputError(
                f"--importance must be gradient, ablation or l0, got {self.importance!r}"
            )
        if self.max_loss is not None and not self.max_loss == self.max_loss:
            raise InputError("--max-loss must be a number, got nan")
        if self.importance_pairs is not None and self.importance_pairs < 2:
            raise InputError(f"--importance-pairs must be at least 2, got {self.importance_pairs}")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"--limit must be at least 1, got {self.limit}")
        if self.out is not None:
            check_output(self.out, overwrite=self.overwrite, kind=KIND)


@dataclass(frozen=True, kw_only=True)
class PrunedModel:
    """The physically smaller model a run wrote, and what it costs against the original."""

    out: Path
    heads_after: int
    heads_per_layer: list[int]
    removed: dict[int, list[int]]  # {layer: [original head ids]}
    params_before: int
    params_after: int
    metric_masked: float
    metric_after: float
    time_before_ms: float
    time_after_ms: float
    timed_batch: tuple[int, int]  # (B, T)
    flops_removed_share: float
    loads_with: list[str]
    bytes_before: int
    bytes_after: int
    recovery: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class PruneResult:
    """A pruning run: the curve of the search and, when a model was written, the model."""

    model: str
    importance: str
    search: PruneSearch
    pruned: PrunedModel | None = None
    notes: list[str] = field(default_factory=list)
    gates: dict[str, Any] | None = None  # the trained L0 gates (GateResult.to_json)
    recovered: list[dict[str, Any]] = field(default_factory=list)  # recovery at curve points
    kv_bytes: list[int] | None = None  # KV-cache bytes per token at each curve point
    kv_context: int | None = None  # the model's context, in tokens
    kv_context_bytes: list[int] | None = None  # KV-cache bytes of one sequence of kv_context

    def to_json(self) -> dict[str, Any]:
        """The one JSON schema of a pruning result (``schema``: ``headlab.prune/1``)."""
        s = self.search
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "model": self.model,
            "metric": s.metric,
            "unit": s.unit,
            "higher_is_better": s.higher_is_better,
            "importance": self.importance,
            "units": s.unit_kind,
            "heads_before": s.total_heads,
            "curve": [_point_json(p) for p in s.points],
            "chosen_step": s.chosen.step,
            "stopped_by_max_loss": s.stopped_by_max_loss,
            "metric_before": round(s.points[0].metric, 4),
        }
        if self.notes:
            data["notes"] = list(self.notes)
        if self.kv_bytes is not None:
            for point, kv in zip(data["curve"], self.kv_bytes, strict=True):
                point["kv_bytes_per_token"] = kv
        if self.kv_context is not None and self.kv_context_bytes is not None:
            data["kv_context"] = self.kv_context
            for point, kv in zip(data["curve"], self.kv_context_bytes, strict=True):
                point["kv_bytes_at_context"] = kv
        if self.gates is not None:
            data["l0"] = self.gates
        if self.recovered:
            data["recovered"] = list(self.recovered)
        p = self.pruned
        if p is None:
            return data
        data.update(
            {
                "heads_after": p.heads_after,
                "heads_per_layer": list(p.heads_per_layer),
                "removed": {str(layer): heads for layer, heads in p.removed.items()},
                "params_before": p.params_before,
                "params_after": p.params_after,
                "metric_masked": round(p.metric_masked, 4),
                "metric_after": round(p.metric_after, 4),
                "time_before_ms": round(p.time_before_ms, 3),
                "time_after_ms": round(p.time_after_ms, 3),
                "timed_batch": list(p.timed_batch),
                "flops_removed_share": round(p.flops_removed_share, 4),
                "loads_with": list(p.loads_with),
                "out": str(p.out),
                "bytes_before": p.bytes_before,
                "bytes_after": p.bytes_after,
            }
        )
        if p.recovery is not None:
            data["recovery"] = p.recovery
        return data


def _point_json(p: CurvePoint) -> dict[str, Any]:
    return {
        "step": p.step,
        "heads_removed": p.heads_removed,
        "fraction": round(p.fraction, 4),
        "metric": round(p.metric, 4),
        "loss": round(p.loss, 4),
    }


def read_pruning_json(data: Any, source: str) -> dict[str, Any]:
    """Check a pruning result read from JSON (``headlab prune --json``, or older versions') and
    return it in the current schema.

    Raises:
        DataFormatError: one line naming the first field that is missing or of the wrong type.
    """

    def bad(what: str) -> DataFormatError:
        return DataFormatError(f"{source}: expected the JSON of headlab prune; {what}")

    if not isinstance(data, Mapping):
        raise bad(f"got a JSON {type(data).__name__} instead of an object")
    if data.get("schema") == "headlab.prune-compare/1":  # headlab prune --curve --compare
        methods = data.get("methods")
        if not isinstance(methods, list) or not methods:
            raise bad("'methods' must be a non-empty list")
        for key in ("metric", "unit", "model"):
            if not isinstance(data.get(key), str):
                raise bad(f"'{key}' must be a string, got {data.get(key)!r}"[:200])
        if not isinstance(data.get("metric_before"), int | float):
            raise bad("'metric_before' must be a number")
        checked = [read_pruning_json(m, f"{source}: methods[{i}]") for i, m in enumerate(methods)]
        return {**data, "methods": checked}
    for key in ("model", "metric", "unit", "importance"):
        if not isinstance(data.get(key), str):
            raise bad(f"'{key}' must be a string, got {data.get(key)!r}"[:200])
    curve = data.get("curve")
    if not isinstance(curve, list) or not curve:
        raise bad("'curve' must be a non-empty list")
    points = []
    for i, point in enumerate(curve):
        if not isinstance(point, Mapping):
            raise bad(f"curve[{i}] must be an object")
        for key in ("heads_removed", "fraction", "metric", "loss"):
            value = point.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise bad(f"curve[{i}].{key} must be a number, got {value!r}"[:200])
        points.append({"step": point.get("step", i), **point})
    return {**data, "schema": data.get("schema", SCHEMA), "curve": points}
