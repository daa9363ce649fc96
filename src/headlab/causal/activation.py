"""Activation patching, exact and batched: each head (or KV head, or whole layer component)
taken from the corrupted run into the clean one. The heads of a layer are copies on the batch
axis, run from that layer's clean residual stream upward; at the last position only the last
token runs above the layer, over the clean run's keys and values. See :mod:`headlab.causal.patching`.

Shape vocabulary: ``N`` copies, ``B`` prompts, ``T`` tokens, ``H`` heads, ``D`` head width,
``E`` model width."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headlab.attention.memory import MEMORY_SHARE, available_bytes
from headlab.causal.methods import SOURCES
from headlab.causal.metric import (
    MAX_ROWS,
    _check_layers,
    _empty,
    _normalize,
    _positions,
    batched,
    check_task,
    last_logits,
    logit_difference,
)
from headlab.causal.result import LAYER_PARTS, LayerTable, PatchingResult
from headlab.causal.tasks import Batch, Task
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.models.patching import (
    ColumnSwap,
    HeadOutputs,
    HeadPatch,
    OutputPatch,
    OutputRecord,
    Residuals,
    Swap,
    block_mlp,
    can_start_later,
    kv_columns,
    starting_at,
)
from headlab.progress import NO_PROGRESS, Progress, stage
from headlab.text import human_bytes


@dataclass
class _Runs:
    """One batch's clean and corrupted runs: metrics, head outputs, residual stream, and the
    corrupted run's outputs of the modules a patch reads (key/value projections, MLPs)."""

    clean_ld: torch.Tensor  # (B,)
    corrupt_ld: torch.Tensor  # (B,)
    clean_heads: dict[int, torch.Tensor]  # layer -> (B, T, H, D)
    corrupt_heads: dict[int, torch.Tensor]
    residuals: dict[int, torch.Tensor]  # layer -> (B, T, E), what block l reads (clean)
    corrupt_residuals: dict[int, torch.Tensor]
    corrupt_outputs: dict[nn.Module, torch.Tensor]  # module -> (B, T, C)


def _runs(lm: LoadedModel, batch: Batch, modules: Sequence[nn.Module] = ()) -> _Runs:
    with HeadOutputs(lm, detach=True) as clean, Residuals(lm) as resid:
        clean_ld = logit_difference(last_logits(lm, batch.clean), batch.answer, batch.distractor)
    with (
        HeadOutputs(lm, detach=True) as corrupt,
        Residuals(lm) as corrupt_resid,
        OutputRecord(modules) as outputs,
    ):
        corrupt_ld = logit_difference(
            last_logits(lm, batch.corrupt), batch.answer, batch.distractor
        )
    return _Runs(
        clean_ld,
        corrupt_ld,
        clean.outputs,
        corrupt.outputs,
        resid.inputs,
        corrupt_resid.inputs,
        outputs.outputs,
    )


COMPONENTS = ("z", "k", "v")


def _units(lm: LoadedModel, layer: int, component: str) -> int:
    """What one layer's patches are: query heads (``z``) or KV heads (``k``, ``v``)."""
    if component == "z":
        return lm.layout.heads_per_layer[layer]
    return lm.layout.kv_heads_per_layer[layer]


def _unit_patch(
    lm: LoadedModel,
    layer: int,
    component: str,
    chosen: list[int],
    runs: _Runs,
    where: Any,
    *,
    last_only: bool = False,
    replacement: torch.Tensor | None = None,
) -> AbstractContextManager[Any]:
    """The hooks that patch units ``chosen`` of ``layer``, one a copy (``last_only``: in a
    pass over the last token alone, from the corrupted run's last position), from the corrupted
    run or, for query heads, from ``replacement`` (a :class:`Swap`'s source: ``(B, T, H, D)``
    or ``(H, D)``)."""
    if component == "z":
        n_heads = lm.layout.heads_per_layer[layer]
        select = torch.zeros(len(chosen), n_heads, dtype=torch.bool)
        select[torch.arange(len(chosen)), chosen] = True
        heads = runs.corrupt_heads[layer] if replacement is None else replacement
        if last_only and heads.dim() == 4:
            heads = heads[:, -1:]
        swap = Swap(source=heads, select=select, positions=where)
        return HeadPatch(lm, {layer: [swap]})
    module, columns = kv_columns(lm, layer, component)
    source = runs.corrupt_outputs[module]
    if last_only:
        source = source[:, -1:]
    mask = torch.zeros(len(chosen), source.shape[-1], dtype=torch.bool)
    for copy, unit in enumerate(chosen):
        mask[copy, columns[unit]] = True
    return OutputPatch({module: ColumnSwap(source=source, columns=mask, positions=where)})


def _kv_modules(lm: LoadedModel, layers: Sequence[int], component: str) -> list[nn.Module]:
    if component == "z":
        return []
    out = []
    for layer in layers:
        try:
            out.append(kv_columns(lm, layer, component)[0])
        except ValueError as exc:
            raise InputError(f"--component {component}: {exc}") from None
    return out


def activation_patching(
    lm: LoadedModel,
    task: Task,
    *,
    position: int | None = None,
    layers: Sequence[int] | None = None,
    component: str = "z",
    source: str = "corrupt",
    max_rows: int = MAX_ROWS,
    progress: Progress | None = None,
) -> PatchingResult:
    """Patch every head from the corrupted run into the clean run, exactly, batched over heads.

    Args:
        position: patch only this position (negative: from the end; ``-1`` the last token);
            ``None``: every position.
        layers: patch only the heads of these layers (the others' effects are NaN);
            ``None``: every layer.
        component: ``"z"`` each query head's output; ``"k"``/``"v"`` each KV head's keys or
            values (under GQA a KV head feeds a group of query heads).
        source: what replaces a query head's output: ``"corrupt"`` the corrupted prompt's
            run; ``"mean"`` the head's mean output over every position of the task's clean
            prompts (mean ablation); ``"resample"`` another prompt's clean run (resample
            ablation, Chan et al. 2022): at one ``position`` the previous prompt's (in the
            task's order) at that position of its own, at every position the previous prompt
            of the same length in the batch.
            The effect is normalized by the clean-corrupt gap all the same.
        max_rows: rows (heads x prompts) of one forward pass, bounding its memory.
    """
    if component not in COMPONENTS:
        raise InputError(f"component must be one of {', '.join(COMPONENTS)}, got {component!r}")
    if source not in SOURCES:
        raise InputError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source != "corrupt" and component != "z":
        raise InputError(f"source {source!r} replaces query heads' outputs: component 'z' only")
    check_task(lm, task)
    chosen_layers = _check_layers(lm, layers)
    modules = _kv_modules(lm, chosen_layers, component)
    progress = progress or NO_PROGRESS
    start = time.perf_counter()
    device = lm.device
    patched_sum = _empty(lm).nan_to_num(0.0)
    clean_sum = corrupt_sum = 0.0
    units = sum(_units(lm, layer, component) for layer in chosen_layers)
    unit = "heads" if component == "z" else "KV heads"
    label, total, counted = batched(f"patching {unit}", units, len(task.batches), unit)
    if source == "resample" and position is not None:
        check_resample_memory(lm, task.n_prompts)  # before the sources are computed
    with torch.inference_mode():
        means = _mean_heads(lm, task) if source == "mean" else None
        others = _previous_at(lm, task, position) if source == "resample" else None
    with torch.inference_mode(), stage(progress, label, total, counted) as bar:
        for batch in task.batches:
            batch = batch.to(device)
            n_prompts, length = batch.clean.shape
            where = _positions(position, length)
            runs = _runs(lm, batch, modules)
            replacements = _replacements(runs, source, means, others, batch)
            clean_sum += float(runs.clean_ld.sum())
            corrupt_sum += float(runs.corrupt_ld.sum())
            # patching the last token alone leaves every earlier position as in the clean run:
            # run the last token only, over the clean run's keys and values of the others
            prefix = _prefix_cache(lm, batch) if position in (-1, length - 1) else None
            for layer in chosen_layers:
                n_units = _units(lm, layer, component)
                per_pass = max(1, max_rows // n_prompts)
                for lo in range(0, n_units, per_pass):
                    chosen = list(range(lo, min(n_units, lo + per_pass)))
                    last = prefix is not None
                    patch = _unit_patch(
                        lm,
                        layer,
                        component,
                        chosen,
                        runs,
                        None if last else where,
                        last_only=last,
                        replacement=replacements.get(layer),
                    )
                    if prefix is not None:
                        ld = _last_token_ld(lm, batch, layer, runs, prefix, patch, len(chosen))
                    else:
                        hidden = runs.residuals.get(layer)
                        ld = _patched_ld(lm, batch, layer, hidden, patch, len(chosen))
                    patched_sum[layer, chosen] += ld.sum(dim=1).cpu()
                    bar.advance(len(chosen))
    n = task.n_prompts
    clean, corrupt = clean_sum / n, corrupt_sum / n
    patched = patched_sum / n
    missing = _empty(lm)
    for layer in chosen_layers:
        missing[layer, : _units(lm, layer, component)] = 0.0
    patched = patched + missing  # NaN where a layer has fewer heads, or was not patched
    return PatchingResult(
        model=lm.name,
        task=task.name,
        method="activation",
        position=position,
        n_prompts=n,
        clean=clean,
        corrupt=corrupt,
        effects=_normalize(clean, corrupt, patched, task.name),
        patched=patched,
        seconds=time.perf_counter() - start,
        component=component,
        source=source,
    )


def _mean_heads(lm: LoadedModel, task: Task) -> dict[int, torch.Tensor]:
    """Each layer's mean head outputs ``(H, D)`` over every position of the task's clean
    prompts, in float64 (mean ablation's source)."""
    sums: dict[int, torch.Tensor] = {}
    count = 0
    for batch in task.batches:
        with HeadOutputs(lm, detach=True) as run:
            last_logits(lm, batch.clean.to(lm.device))
        for layer, z in run.outputs.items():  # (B, T, H, D)
            total = z.double().sum(dim=(0, 1))  # (H, D)
            sums[layer] = total if layer not in sums else sums[layer] + total
        count += batch.clean.numel()
    return {layer: total / count for layer, total in sums.items()}


#: bytes a kept tensor costs beside its data (the Python object, its TensorImpl and storage,
#: a dict entry), counted generously in :func:`resample_bytes`
TENSOR_OVERHEAD = 1024


def resample_bytes(lm: LoadedModel, n_prompts: int) -> int:
    """The bytes :func:`_previous_at` keeps for ``n_prompts`` prompts: each prompt's head
    outputs ``(H, D)`` at one position, per layer, in the model's dtype, each a tensor of its
    own (:data:`TENSOR_OVERHEAD` beside its data)."""
    size = torch.empty((), dtype=lm.dtype).element_size()
    layout = lm.layout
    width = layout.mla.v_head_dim if layout.mla is not None else layout.head_dim
    per_prompt = sum(h * width * size + TENSOR_OVERHEAD for h in layout.heads_per_layer)
    return n_prompts * per_prompt


def check_resample_memory(lm: LoadedModel, n_prompts: int) -> None:
    """Refuse, before any source is computed, ``--source resample`` at one position for more
    prompts than fit :data:`~headlab.attention.memory.MEMORY_SHARE` of the memory ``lm``'s
    device has available (:func:`resample_bytes`).

    Raises:
        InputError: one line naming ``--n``, the planned bytes, the memory available and the
            most prompts that fit.
    """
    available = available_bytes(torch.device(lm.device))
    planned = resample_bytes(lm, n_prompts)
    if available is None or planned <= MEMORY_SHARE * available:
        return
    fits = int(MEMORY_SHARE * available // resample_bytes(lm, 1))
    raise InputError(
        f"--n/--prompts: --source resample at one position keeps each of the {n_prompts:,} "
        f"prompts' head outputs there ({lm.n_layers} layers x their heads x their width), about "
        f"{human_bytes(planned)}, more than {MEMORY_SHARE:.0%} of the {human_bytes(available)} "
        f"available here; at most {fits:,} prompts fit"
    )


def _previous_at(
    lm: LoadedModel, task: Task, position: int | None
) -> dict[int, dict[int, torch.Tensor]] | None:
    """For a patch at one ``position``: each prompt's source under resampling, the previous
    prompt's (in the task's order, the first taking the last's) clean head outputs ``(H, D)``
    at that position of its own, per layer; ``None`` for every position (then the source is a
    prompt of the same length, :func:`_replacements`)."""
    if position is None:
        return None
    if task.n_prompts < 2:
        raise InputError("--source resample takes a head's output from another prompt: give two")
    at: dict[int, dict[int, torch.Tensor]] = {}
    for batch in task.batches:
        _positions(position, batch.clean.shape[1])  # in range, or a one-line error
        with HeadOutputs(lm, detach=True) as run:
            last_logits(lm, batch.clean.to(lm.device))
        for row, prompt in enumerate(batch.index):  # a copy: a view keeps (B, T, H, D) alive
            at[prompt] = {layer: z[row, position].clone() for layer, z in run.outputs.items()}
    order = sorted(at)
    return {prompt: at[order[i - 1]] for i, prompt in enumerate(order)}


def _replacements(
    runs: _Runs,
    source: str,
    means: dict[int, torch.Tensor] | None,
    others: dict[int, dict[int, torch.Tensor]] | None,
    batch: Batch,
) -> dict[int, torch.Tensor]:
    """What replaces each layer's head outputs in this batch: nothing here for ``"corrupt"``
    (the corrupted run's, :func:`_unit_patch`), the task's means ``(H, D)`` (``"mean"``), or
    another prompt's clean outputs ``(B, T, H, D)`` (``"resample"``): at one position the
    previous prompt's there (:func:`_previous_at`, the same at every position of the row),
    at every position the previous prompt of the same length in the batch."""
    if source == "mean" and means is not None:
        return means
    if source != "resample":
        return {}
    n_prompts, length = batch.clean.shape
    if others is not None:
        return {
            layer: torch.stack([others[i][layer] for i in batch.index])[:, None].expand(
                n_prompts, length, *others[batch.index[0]][layer].shape
            )  # (B, T, H, D)
            for layer in others[batch.index[0]]
        }
    if n_prompts < 2:
        raise InputError(
            f"--source resample at every position takes a head's output from another prompt of "
            f"the same length: prompt {batch.index[0] + 1} is the only one of {length} tokens "
            "(--position last resamples across lengths)"
        )
    return {layer: z.roll(1, dims=0) for layer, z in runs.clean_heads.items()}


def _patched_ld(
    lm: LoadedModel,
    batch: Batch,
    layer: int,
    hidden: torch.Tensor | None,
    patch: AbstractContextManager[Any],
    copies: int,
    *,
    must_feed: bool = False,
) -> torch.Tensor:
    """``(N, B)`` logit differences of ``copies`` patched copies of ``batch``, the forward
    starting at ``layer`` from ``hidden`` ``(B, T, E)`` or ``(N*B, T, E)`` (the residual stream
    block ``layer`` reads; every patch is at ``layer`` or above)."""
    ids = batch.clean.repeat(copies, 1)  # (N*B, T)
    if hidden is not None and hidden.shape[0] != ids.shape[0]:
        hidden = hidden.repeat(copies, 1, 1)  # (N*B, T, E)
    with starting_at(lm, layer, hidden, must_feed=must_feed), patch:
        logits = last_logits(lm, ids)  # (N*B, V)
    ld = logit_difference(logits, batch.answer.repeat(copies), batch.distractor.repeat(copies))
    return ld.view(copies, -1)


def _cache_argument(lm: LoadedModel) -> str | None:
    """The name under which the model's forward takes a KV cache (``cache`` in transformers
    5.25, ``past_key_values`` before), or ``None``."""
    parameters = inspect.signature(lm.model.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def _prefix_cache(lm: LoadedModel, batch: Batch) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Every layer's keys and values ``(B, Hkv, T-1, D)`` of the clean prompts but their last
    token, or ``None`` where the model cannot start later or keeps no plain per-layer cache
    (then the patched passes run every position)."""
    from transformers import DynamicCache

    name = _cache_argument(lm)
    if name is None or batch.clean.shape[1] < 2 or not can_start_later(lm):
        return None
    cache: Any = DynamicCache()
    try:
        lm.model(input_ids=batch.clean[:, :-1], use_cache=True, **{name: cache}, logits_to_keep=1)
        layers = [(getattr(c, "keys", None), getattr(c, "values", None)) for c in cache.layers]
    except (AttributeError, TypeError, ValueError):
        return None
    out = [(k, v) for k, v in layers if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)]
    if len(out) != lm.n_layers or any(k.dim() != 4 for k, _ in out):
        return None
    return out


def _last_token_ld(
    lm: LoadedModel,
    batch: Batch,
    layer: int,
    runs: _Runs,
    prefix: list[tuple[torch.Tensor, torch.Tensor]],
    patch: AbstractContextManager[Any],
    copies: int,
) -> torch.Tensor:
    """``(N, B)`` logit differences of ``copies`` copies patched at the last token only: the
    last token alone runs blocks ``layer..L-1``, reading every earlier position's keys and
    values from the clean run (which a patch at the last token does not change)."""
    from transformers import DynamicCache

    cache = DynamicCache(
        ddp_cache_data=[(k.repeat(copies, 1, 1, 1), v.repeat(copies, 1, 1, 1)) for k, v in prefix]
    )
    ids = batch.clean[:, -1:].repeat(copies, 1)  # (N*B, 1)
    hidden = runs.residuals[layer][:, -1:].repeat(copies, 1, 1)  # (N*B, 1, E)
    name = _cache_argument(lm) or "cache"
    with starting_at(lm, layer, hidden, must_feed=True), patch:
        out = lm.model(input_ids=ids, use_cache=True, **{name: cache}, logits_to_keep=1)
    logits = out.logits[:, -1]  # (N*B, V)
    ld = logit_difference(logits, batch.answer.repeat(copies), batch.distractor.repeat(copies))
    return ld.view(copies, -1)


def layer_patching(
    lm: LoadedModel, task: Task, *, position: int | None = None, progress: Progress | None = None
) -> LayerTable:
    """Patch each layer's residual stream, attention output and MLP output from the corrupted
    run: one pass a layer over three copies of the prompts, from that layer upward."""
    check_task(lm, task)
    progress = progress or NO_PROGRESS
    mlps = [block_mlp(lm, layer) for layer in range(lm.n_layers)]
    recorded = [m for m in mlps if m is not None]
    sums = torch.zeros(len(LAYER_PARTS), lm.n_layers, dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    label, total, unit = batched("patching layers", lm.n_layers, len(task.batches), "layers")
    with torch.inference_mode(), stage(progress, label, total, unit) as bar:
        for batch in task.batches:
            batch = batch.to(lm.device)
            where = _positions(position, batch.clean.shape[1])
            runs = _runs(lm, batch, recorded)
            clean_sum += float(runs.clean_ld.sum())
            corrupt_sum += float(runs.corrupt_ld.sum())
            for layer in range(lm.n_layers):
                clean_in = runs.residuals.get(layer)
                corrupt_in = runs.corrupt_residuals.get(layer)
                if clean_in is None or corrupt_in is None:
                    raise InputError(f"{lm.name}: its blocks' residual stream cannot be read")
                mixed = corrupt_in
                if where is not None:
                    mixed = torch.where(
                        where.to(clean_in.device)[None, :, None], corrupt_in, clean_in
                    )
                hidden = torch.cat([mixed, clean_in, clean_in])  # (3*B, T, E)
                n_heads = lm.layout.heads_per_layer[layer]
                select = torch.zeros(3, n_heads, dtype=torch.bool)
                select[1] = True
                heads = HeadPatch(
                    lm,
                    {
                        layer: [
                            Swap(source=runs.corrupt_heads[layer], select=select, positions=where)
                        ]
                    },
                )
                mlp = mlps[layer]
                patches: list[AbstractContextManager[Any]] = [heads]
                if mlp is not None:
                    source = runs.corrupt_outputs[mlp]
                    columns = torch.zeros(3, source.shape[-1], dtype=torch.bool)
                    columns[2] = True
                    swap = ColumnSwap(source=source, columns=columns, positions=where)
                    patches.append(OutputPatch({mlp: swap}))
                try:
                    ld = _patched_ld(lm, batch, layer, hidden, _all(patches), 3, must_feed=True)
                except ValueError as exc:
                    raise InputError(f"patching layers: {exc}") from None
                sums[:, layer] += ld.sum(dim=1).cpu()
                if mlp is None:
                    sums[2, layer] = float("nan")
                bar.advance(1)
    n = task.n_prompts
    clean, corrupt = clean_sum / n, corrupt_sum / n
    effects = _normalize(clean, corrupt, sums / n, task.name)
    return LayerTable(resid=effects[0], attn=effects[1], mlp=effects[2])


@contextmanager
def _all(managers: Sequence[AbstractContextManager[Any]]) -> Iterator[None]:
    """Every manager entered for the block."""
    with ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield
