"""The pruning workflow: metrics, the progressive search, the smaller model, one JSON schema.

``headlab prune`` is a :class:`PruneRequest` (checked before the model loads), the model made
ready (:meth:`PruneRequest.ready`), and :meth:`PruneRequest.run`: :func:`run_pruning` (also
``headlab report --prune``'s), or :func:`~headlab.pruning.methods.compare_methods`. A result's
:meth:`PruneResult.to_json` is what ``headlab prune --json`` prints and what ``headlab report
--pruning FILE`` reads back (through :func:`read_pruning_json`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from headlab import distributed
from headlab.errors import InputError, OutputExistsError, PruningError
from headlab.models.dispatch import refuse_offloaded
from headlab.models.loading import LoadedModel
from headlab.outputs import check_files
from headlab.progress import NO_PROGRESS, Progress
from headlab.pruning import methods
from headlab.pruning.cost import count_parameters, folder_bytes, forward_flops, forward_ms
from headlab.pruning.figure import pruning_compare
from headlab.pruning.inputs import build_metrics, counts_after, perplexity_halves
from headlab.pruning.methods import recover_model
from headlab.pruning.metrics import Metric
from headlab.pruning.physical import PRUNED_KEY, head_ids, prune_model, save_pruned
from headlab.pruning.progressive import CurvePoint, PruneSearch, progressive_prune
from headlab.pruning.request import check_request, ready_model
from headlab.pruning.results import (
    CURVE_FRACTION,
    IMPORTANCES,
    L0_STEPS,
    L0_WEIGHT,
    METRICS,
    SCHEMA,
    PrunedModel,
    PruneOptions,
    PruneResult,
    read_pruning_json,
)

# the options and results live in headlab.pruning.results; importing them from here still works
__all__ = [
    "CURVE_FRACTION",
    "IMPORTANCES",
    "L0_STEPS",
    "L0_WEIGHT",
    "METRICS",
    "SCHEMA",
    "PruneOptions",
    "PruneResult",
    "PrunedModel",
    "build_metrics",
    "perplexity_halves",
    "read_pruning_json",
    "run_pruning",
]


def _native(lm: LoadedModel, heads: list[int], kv_heads: list[int]) -> bool:
    config = lm.model.config.to_dict()
    return lm.adapter.native_config(config, heads, kv_heads, lm.head_dim) is not None


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
        if data is None:  # training_data ran above for l0
            raise RuntimeError("L0 gates need training data")
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
        **(methods.kv_costs(lm, search) if lm.causal else {}),
    }
    if fraction is None:
        recovered = []
        if options.recover is not None:
            if data is None:  # training_data ran above for --recover
                raise RuntimeError("recovery needs training data")
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
        if _native(lm, *counts_after(lm, point)):
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


@dataclass(frozen=True, kw_only=True)
class MethodsCompared:
    """Curves of gradient, ablation and L0 importance on the same data
    (:func:`~headlab.pruning.methods.compare_methods`'s JSON, kept as it is)."""

    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.data


@dataclass(frozen=True, kw_only=True)
class PruneRequest:
    """What ``headlab prune`` is asked; checked on creation (:meth:`check`).

    Attributes:
        options: the pruning's options, named as the command's flags.
        model: the model's name or folder (``None``: the default), read to choose whether it
            loads with its language-model head (:meth:`ready`).
        curve: measure the curve only (no ``fraction``, no model written).
        figure: with ``options.compare``, where :meth:`run` writes the figure
            (:func:`~headlab.pruning.figure.pruning_compare`).
    """

    options: PruneOptions
    model: str | None = None
    curve: bool = False
    figure: str | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The options and the output places (the ``out`` folder, the ``figure``), before any
        model loads.

        Raises:
            InputError: options that do not go together, bad numbers or data files, a figure
                that is not a PNG or cannot be written there.
            OutputExistsError: an ``out`` folder that may not be replaced.
            OutputError: an ``out`` folder that cannot be written there.
        """
        check_request(self.options, curve=self.curve, figure=self.figure is not None)
        self.options.check()
        check_files([("--figure", self.figure, ".png")])

    def ready(self, load: Callable[[bool], LoadedModel]) -> LoadedModel:
        """The model to prune, loaded by ``load(with_lm_head)`` and made ready
        (:func:`~headlab.pruning.request.ready_model`)."""
        return ready_model(load, self.options, self.model)

    def run(
        self, lm: LoadedModel, progress: Progress = NO_PROGRESS
    ) -> PruneResult | MethodsCompared:
        """The curve (and with ``fraction`` the smaller model, written), or with
        ``options.compare`` the importance methods compared (their ``figure`` written). ``lm``
        is pruned in place when a model is written. Under torchrun, rank 0 alone writes."""
        if not self.options.compare:
            return run_pruning(lm, self.options, progress=progress)
        compared = MethodsCompared(
            data=methods.compare_methods(lm, self.options, progress=progress)
        )
        if self.figure is not None and distributed.writes():
            pruning_compare(compared.to_json(), self.figure)
        return compared
