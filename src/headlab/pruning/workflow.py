"""The pruning workflow: metrics, the progressive search, the smaller model, one JSON schema.

``headlab prune`` and ``headlab report --prune`` both call :func:`run_pruning`; a result's
:meth:`PruneResult.to_json` is what ``headlab prune --json`` prints and what ``headlab report
--pruning FILE`` reads back (through :func:`read_pruning_json`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from headlab import distributed
from headlab.errors import DataFormatError, InputError, OutputExistsError, PruningError
from headlab.models.loading import LoadedModel
from headlab.progress import Progress
from headlab.pruning.metrics import Metric
from headlab.pruning.progressive import CurvePoint, PruneSearch

#: the ``schema`` value of a pruning result's JSON
SCHEMA = "headlab.prune/1"
#: how far the curve goes when no model is written
CURVE_FRACTION = 0.9
METRICS = ("stsb", "fidelity", "perplexity")
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
        metric: ``stsb``, ``fidelity`` or ``perplexity``; ``None``: perplexity for causal
            models, stsb for encoders.
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
        text: held-out text file for perplexity.
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
        from headlab.pruning.l0 import L0Config

        return L0Config(weight=self.l0_weight, steps=self.l0_steps, seed=self.seed)

    @property
    def needs_lm_head(self) -> bool:
        """Whether the model must be loaded with its language-model head (perplexity)."""
        return self.metric == "perplexity" or self.text is not None

    def check(self) -> None:
        """Check the options and the output location before any work.

        Raises:
            InputError: an option out of range or a missing companion option.
            OutputExistsError, OutputError: ``out`` cannot be written.
        """
        from headlab.outputs import check_output
        from headlab.pruning.physical import KIND

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


def build_metrics(lm: LoadedModel, options: PruneOptions) -> tuple[Metric, Metric, Any]:
    """The evaluation metric, the importance metric, and a batch to time forwards on."""
    from headlab.datasets import read_stsb, sample_path
    from headlab.models import encode
    from headlab.pruning.metrics import FidelityMetric, PerplexityMetric, StsbMetric

    metric = options.metric or ("perplexity" if lm.causal else "stsb")
    if metric == "perplexity":
        if options.text is None:
            raise InputError("--metric perplexity needs --text FILE (held-out text)")
        try:
            text = Path(options.text).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read --text {options.text}: {exc}") from None
        half = len(text) // 2
        evaluation = PerplexityMetric.from_text(lm, text[half:])
        importance = PerplexityMetric.from_text(lm, text[:half])
        return evaluation, importance, {"input_ids": evaluation.windows[:8].to(lm.device)}
    if lm.causal:
        raise InputError(f"--metric {metric} needs an encoder; {lm.name} is a causal model")
    pairs = read_stsb(options.stsb or sample_path("stsb"), limit=options.limit)
    if options.importance_stsb:
        imp_pairs = read_stsb(options.importance_stsb, limit=options.limit)
        eval_pairs = pairs
    else:
        imp_pairs = [p for i, p in enumerate(pairs) if i % 3 == 0]
        eval_pairs = [p for i, p in enumerate(pairs) if i % 3 != 0]
    if options.importance_pairs is not None:
        stride = max(1, len(imp_pairs) // options.importance_pairs)
        imp_pairs = imp_pairs[::stride][: options.importance_pairs]
    probe = encode(lm, [p.first for p in eval_pairs[:64]])
    if metric == "stsb":
        return StsbMetric(eval_pairs), StsbMetric(imp_pairs), probe
    eval_texts = [p.first for p in eval_pairs] + [p.second for p in eval_pairs]
    imp_texts = [p.first for p in imp_pairs] + [p.second for p in imp_pairs]
    return FidelityMetric.build(lm, eval_texts), FidelityMetric.build(lm, imp_texts), probe


def _native(lm: LoadedModel, heads: list[int], kv_heads: list[int]) -> bool:
    config = lm.model.config.to_dict()
    return lm.adapter.native_config(config, heads, kv_heads, lm.head_dim) is not None


def _counts_after(lm: LoadedModel, point: CurvePoint) -> tuple[list[int], list[int]]:
    heads, kv = list(lm.layout.heads_per_layer), list(lm.layout.kv_heads_per_layer)
    for layer, removed in point.removed.items():
        group = heads[layer] // kv[layer]
        heads[layer] -= len(removed)
        if kv[layer] != lm.layout.heads_per_layer[layer]:
            kv[layer] -= len(removed) // group
        else:
            kv[layer] = heads[layer]
    return heads, kv


def _check_compatible(lm: LoadedModel, options: PruneOptions) -> None:
    """Refuse, before the search, a request no transformers config can express."""
    if not _native(lm, [1] * lm.n_layers, [1] * lm.n_layers):
        raise PruningError(
            f"a pruned {lm.adapter.family} model cannot load in transformers: its config ties "
            "the head width to hidden_size / num_attention_heads and transformers 5 dropped "
            "pruned_heads; drop --transformers-compatible and load it with headlab.models.load "
            "(docs/models.md's coverage table lists the model types whose pruned folders load in both)"
        )
    n, kv = lm.layout.heads_per_layer[0], lm.layout.kv_heads_per_layer[0]
    group = n // kv if kv != n else 1
    units = kv if kv != n else n
    fraction = options.fraction or CURVE_FRACTION
    reachable = [n - k * group for k in range(1, units) if k * group <= fraction * n + 1e-9]
    fits = [c for c in reachable if _native(lm, [c] * lm.n_layers, [c // group or 1] * lm.n_layers)]
    if reachable and not fits:
        width = lm.model.config.to_dict().get("hidden_size")
        raise PruningError(
            f"--transformers-compatible: no uniform head count within --fraction {fraction} "
            f"({', '.join(map(str, reachable))} per layer) divides hidden_size {width}, which "
            "transformers requires; raise --fraction or drop --transformers-compatible"
        )


def run_pruning(
    lm: LoadedModel,
    options: PruneOptions,
    *,
    on_step: Callable[[CurvePoint], None] | None = None,
    progress: Progress | None = None,
) -> PruneResult:
    """Search the pruning curve of ``lm``; with ``options.fraction`` also prune and save.
    ``on_step`` gets each point of the curve; ``progress`` is told of the search's steps.

    ``lm`` is pruned in place when a model is written (load it again to use the original).

    Raises:
        InputError: bad options or data.
        PruningError: a request the model's layout or transformers cannot carry out.
        OutputExistsError, OutputError: ``options.out`` cannot be written (checked first).
    """
    from headlab.models.dispatch import refuse_offloaded
    from headlab.pruning import methods
    from headlab.pruning.progressive import progressive_prune

    options.check()
    if options.out is not None and lm.path.resolve() == Path(options.out).resolve():
        raise OutputExistsError("--out must differ from the model folder")
    if options.fraction is not None:  # before any work: offloaded weights cannot be rewritten
        refuse_offloaded(lm.device_map, "headlab prune --fraction (physical pruning)")
    if options.transformers_compatible:
        _check_compatible(lm, options)
    evaluation, importance, probe = build_metrics(lm, options)
    data = None
    if options.importance == "l0" or options.recover is not None:
        data = methods.training_data(lm, options, importance)  # too short: an error, now
    notes: list[str] = []
    gates = None
    scorer = None
    fraction, step = options.fraction, options.step
    if options.importance == "l0":
        assert data is not None
        gates = methods.train_l0(lm, data, options, progress=progress)
        scorer = methods.gate_scorer(gates)
        removed, layer_notes = gates.kept_set(lm.n_layers)
        notes += layer_notes
        closed = sum(len(v) for v in removed.values())
        notes.append(
            f"the L0 gates (weight {options.l0_weight:g}) close {closed} of "
            f"{sum(lm.layout.heads_per_layer)} heads"
        )
        if options.out is not None and fraction is None:  # the gates decide
            if closed == 0:
                raise PruningError(
                    f"the L0 gates close no head at --l0-weight {options.l0_weight:g}; raise it "
                    "or give --fraction"
                )
            fraction, step = closed / sum(lm.layout.heads_per_layer), 1.0
    search = progressive_prune(
        lm,
        evaluation,
        importance,
        fraction=CURVE_FRACTION if fraction is None else fraction,
        step=step,
        max_loss=options.max_loss,
        method=options.importance,
        uniform=options.uniform or options.transformers_compatible,
        on_step=on_step,
        scorer=scorer,
        progress=progress,
    )
    extra: dict[str, Any] = {
        "gates": None if gates is None else gates.to_json(),
        "kv_bytes": methods.kv_bytes(lm, search) if lm.causal else None,
    }
    if fraction is None:
        recovered = []
        if options.recover is not None:
            assert data is not None
            recovered = methods.recover_points(
                lm, search, evaluation, data, options, progress=progress
            )
        return PruneResult(
            model=lm.name,
            importance=options.importance,
            search=search,
            notes=notes,
            recovered=recovered,
            **extra,
        )
    if options.transformers_compatible:
        search, note = _compatible_choice(lm, search)
        notes += [note] if note else []
    pruned = _prune_and_save(lm, options, search, evaluation, probe, data)
    return PruneResult(
        model=lm.name,
        importance=options.importance,
        search=search,
        pruned=pruned,
        notes=notes,
        **extra,
    )


def _compatible_choice(lm: LoadedModel, search: PruneSearch) -> tuple[PruneSearch, str | None]:
    """The last point up to the chosen one that transformers can load (or a PruningError)."""
    candidates = [p for p in search.points if p.step <= search.chosen.step and p.step > 0]
    for point in reversed(candidates):
        if _native(lm, *_counts_after(lm, point)):
            if point is search.chosen:
                return search, None
            note = (
                f"step {search.chosen.step} leaves a head count transformers refuses; "
                f"chose step {point.step} instead"
            )
            return replace(search, chosen=point), note
    raise PruningError(
        "--transformers-compatible: no step of the search leaves a head count that divides "
        "hidden_size (transformers requires it); raise --fraction or drop the option"
    )


def _prune_and_save(
    lm: LoadedModel,
    options: PruneOptions,
    search: PruneSearch,
    evaluation: Metric,
    probe: Any,
    data: Metric | None,
) -> PrunedModel:
    from headlab.pruning.cost import count_parameters, folder_bytes, forward_flops, forward_ms
    from headlab.pruning.physical import PRUNED_KEY, head_ids, prune_model, save_pruned

    if options.out is None:
        raise InputError("--fraction needs --out DIR for the pruned model")
    n_tokens = int(probe["input_ids"].shape[1])
    params_before = count_parameters(lm.model)
    flops_before = forward_flops(lm, n_tokens)
    time_before = forward_ms(lm, probe)
    original_ids = head_ids(lm)
    removed = search.chosen.removed
    bytes_before = folder_bytes(lm.path)
    small = prune_model(lm, removed)
    time_after = forward_ms(small, probe)
    metric_after = evaluation.evaluate(small)
    recovery = None
    if options.recover is not None and data is not None:
        from headlab.pruning.methods import recover_model

        recovery = recover_model(small, data, options, metric=evaluation, before=metric_after)
    native = bool(getattr(small.model.config, PRUNED_KEY, {}).get("native"))
    pruned = PrunedModel(
        out=Path(options.out),
        heads_after=sum(small.layout.heads_per_layer),
        heads_per_layer=list(small.layout.heads_per_layer),
        removed={
            layer: [original_ids[layer][h] for h in heads] for layer, heads in removed.items()
        },
        params_before=params_before,
        params_after=count_parameters(small.model),
        metric_masked=search.chosen.metric,
        metric_after=metric_after,
        time_before_ms=time_before,
        time_after_ms=time_after,
        timed_batch=(int(probe["input_ids"].shape[0]), n_tokens),
        flops_removed_share=1 - forward_flops(small, n_tokens) / flops_before,
        loads_with=["headlab", "transformers"] if native else ["headlab"],
        bytes_before=bytes_before,
        bytes_after=0,
        recovery=recovery,
    )
    info = PruneResult(model=lm.name, importance=options.importance, search=search, pruned=pruned)
    if not distributed.writes():  # under torchrun, rank 0 alone writes the folder
        return pruned
    record = info.to_json()
    for key in ("out", "bytes_before", "bytes_after"):
        record.pop(key)
    out = save_pruned(small, Path(options.out), overwrite=options.overwrite, info=record)
    return replace(pruned, bytes_after=folder_bytes(out))


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
