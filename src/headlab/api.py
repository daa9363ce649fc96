"""The front door's functions, offered as ``headlab.measure_roles``, ``headlab.patch``... (see
:mod:`headlab`). Each is the library call its command makes: the command's request, built from
keyword arguments named as the command's flags (``--eval-prompts`` is ``eval_prompts``) and
checked before any model loads, then its run; the result's ``to_json()`` is the command's
``--json``.

``model`` is a loaded model (:func:`headlab.load`) or what ``--model`` takes: a name
(``"tiny-shakespeare"``, ``"smollm2"``), a folder, a ``.gguf`` file; a name is loaded on the CPU
in float32 (load it yourself for another device or dtype). Progress goes to ``progress``
(:class:`headlab.progress.Progress`; default: nothing shown, ``PlainProgress("roles",
sys.stderr)`` for lines).

Nothing here imports torch until a function that measures a model is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from headlab.layout.sheet import SpecOptions, spec_json
from headlab.models.names import named_config, resolve
from headlab.progress import NO_PROGRESS, Progress

if TYPE_CHECKING:
    from headlab.causal.dla import DLAResult
    from headlab.causal.paths import PathResult
    from headlab.causal.request import PromptsWritten
    from headlab.causal.result import PatchingResult
    from headlab.experiments.cards import Cards
    from headlab.experiments.circuit_request import CircuitRun
    from headlab.models.loading import LoadedModel
    from headlab.pruning.workflow import MethodsCompared, PruneResult
    from headlab.roles.results import RoleReport

#: what ``model`` may be
Model = Any  # LoadedModel | str | Path | None, kept light: LoadedModel's module imports torch


def _loaded(model: Model, name: str | None, *, with_lm_head: bool = False) -> LoadedModel:
    """``model`` itself when loaded, else ``name`` loaded (``None``: the default model)."""
    from headlab.models.loading import LoadedModel, load

    if isinstance(model, LoadedModel):
        return model
    return load(name, with_lm_head=with_lm_head)


def _name(model: Model) -> str | None:
    """What a request's ``model`` field gets: a name or folder as given; a loaded model's
    folder (the requests read its config.json, never load it again)."""
    if model is None or isinstance(model, str | Path):
        return None if model is None else str(model)
    return str(model.path)


def measure_roles(
    model: Model = None, *, progress: Progress = NO_PROGRESS, **options: Any
) -> RoleReport:
    """What every head of ``model`` specializes in, scored on gold data and bootstrapped, as
    ``headlab roles`` measures it (:class:`~headlab.roles.workflow.RolesRequest`).

    Args:
        model: default all-MiniLM-L6-v2.
        options: ``treebank``, ``gap``, ``no_gap``, ``frequencies``, ``limit``,
            ``reliability``, ``replicates`` (default 100), ``seed``, ``batch_tokens``,
            ``checkpoint``, ``checkpoint_every``; the gold data default to the bundled samples.

    Returns:
        The :class:`~headlab.roles.results.RoleReport`; unlike the command, the run is not
        kept for ``headlab serve`` (:func:`headlab.roles.workflow.keep_roles` keeps it).
    """
    from headlab.roles.workflow import RolesRequest

    request = RolesRequest(**options)
    report = request.run(_loaded(model, _name(model)), progress)
    request.finish()
    return report


def patch(
    model: Model = None, *, progress: Progress = NO_PROGRESS, **options: Any
) -> PatchingResult | DLAResult | PathResult | PromptsWritten:
    """Which heads carry a behaviour, as ``headlab patch`` measures it
    (:class:`~headlab.causal.request.PatchRequest`): activation patching by default,
    ``method="attribution"``, ``"ig"`` or ``"dla"``, or path patching with ``to``.

    Args:
        model: a causal language model (default SmolLM2-135M); loaded with its head.
        options: ``task`` (``"ioi"``, ``"induction"``) or ``prompts`` (a JSON Lines file),
            ``n``, ``seed``, ``method``, ``component``, ``position``, ``steps``, ``compare``,
            ``no_layers``, ``to``, ``path``; ``figure`` and ``csv_out`` are written;
            ``write`` (a ``.jsonl`` path): the built-in task's prompts written there instead
            of patching, a :class:`~headlab.causal.request.PromptsWritten` returned.
    """
    from headlab.causal.request import PatchRequest, patch_task, run_patch

    named = _name(model)
    request = PatchRequest(**options) if named is None else PatchRequest(model=named, **options)
    lm = _loaded(model, request.model, with_lm_head=True)
    result: PatchingResult | DLAResult | PathResult | PromptsWritten = run_patch(
        lm, patch_task(lm, request), request, progress=progress
    )
    return result


def circuit(model: Model = None, *, progress: Progress = NO_PROGRESS, **options: Any) -> CircuitRun:
    """A behaviour's circuit, found by EAP-IG (or EAP), cut to the smallest size reaching the
    target and measured on held-out prompts, its heads named from evidence, as ``headlab
    circuit`` finds it (:class:`~headlab.experiments.circuit_request.CircuitRequest`).

    Args:
        model: a causal language model (default SmolLM2-135M); loaded with its head.
        options: ``task`` or ``prompts`` and ``eval_prompts``, ``n``, ``eval_n``, ``seed``,
            ``method``, ``steps``, ``search``, ``sizes``, ``target``, ``no_classes``,
            ``roles``; ``html`` and ``figure`` are written.
    """
    from headlab.experiments.circuit_request import CircuitRequest

    named = _name(model)
    request = CircuitRequest(**options) if named is None else CircuitRequest(model=named, **options)
    return request.run(_loaded(model, request.model, with_lm_head=True), progress)


def cards(model: Model = None, *, progress: Progress = NO_PROGRESS, **options: Any) -> Cards:
    """One card per head of ``model``: its roles, composition senders, OV tokens, copying,
    DLA and patching on the built-in tasks, costs and importance, and a verdict, as ``headlab
    cards`` builds them (:class:`~headlab.experiments.cards.CardsRequest`).

    Args:
        model: any model headlab opens (default SmolLM2-135M); a causal language model loads
            with its head.
        options: ``roles``, ``limit``, ``tasks``, ``n``, ``seed``, ``position``, ``top``,
            ``no_roles``, ``no_patch``, ``no_dla``, ``no_compose``, ``no_importance``; the
            atlas ``html`` is written.
    """
    from headlab.experiments.cards import CardsRequest

    named = _name(model)
    request = CardsRequest(**options) if named is None else CardsRequest(model=named, **options)
    causal = bool(resolve(request.model).causal)
    return request.run(_loaded(model, request.model, with_lm_head=causal), progress)


#: the pruning options that are paths (the command's flags give ``Path``s)
_PATHS = ("out", "stsb", "importance_stsb", "text")


def prune(
    model: Model = None,
    *,
    progress: Progress = NO_PROGRESS,
    figure: str | None = None,
    **options: Any,
) -> PruneResult | MethodsCompared:
    """The pruning curve of ``model``, and with ``fraction`` and ``out`` the smaller model
    written there, as ``headlab prune`` makes them
    (:class:`~headlab.pruning.workflow.PruneRequest`). A loaded ``model`` is pruned in place
    when a model is written.

    Args:
        model: default all-MiniLM-L6-v2; a name loads with its language-model head where
            the metric reads logits (give a loaded causal model ``with_lm_head=True`` for
            perplexity or IOI).
        options: :class:`~headlab.pruning.results.PruneOptions`' fields: ``fraction``,
            ``out``, ``metric``, ``importance``, ``step``, ``max_loss``, ``uniform``,
            ``compare`` (the methods compared: :class:`MethodsCompared`)...; without
            ``fraction`` (and without ``importance="l0"`` with ``out``) the curve only.
        figure: with ``compare``, the PNG of the methods compared is written here.
    """
    from headlab.pruning.results import PruneOptions
    from headlab.pruning.workflow import PruneRequest

    given: dict[str, Any] = {
        k: Path(v) if k in _PATHS and v is not None else v for k, v in options.items()
    }
    pruning = PruneOptions(**given)
    gates_decide = pruning.importance == "l0" and pruning.out is not None
    curve = pruning.fraction is None and not gates_decide
    request = PruneRequest(options=pruning, model=_name(model), curve=curve, figure=figure)
    lm = request.ready(lambda head: _loaded(model, request.model, with_lm_head=head))
    return request.run(lm, progress)


def spec(model: str, *, context: int | None = None, dtype: str | None = None) -> dict[str, Any]:
    """A model's heads in numbers from its config alone (no torch): layout, KV cache per token
    and at ``context`` tokens (default 8192, or the model's limit when shorter), FLOPs; as
    ``headlab spec --json`` gives them (an encoder-decoder's three head sets).

    Args:
        model: a catalog name (``"Llama-3.1-8B"``), a config.json, a folder, a ``.gguf`` file.
        dtype: the KV cache's (default: the model's own).
    """
    return spec_json([model], SpecOptions(context=context, dtype=dtype), resolve=named_config)
