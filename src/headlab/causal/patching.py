"""Which heads carry a behaviour: activation patching and its gradient estimates, per head.

**Activation patching** (Meng et al. 2022; Wang et al. 2022; Heimersheim and Nanda 2024, "How to
use and interpret activation patching"): run the clean prompt, but with one head's output (its
slice of the output projection's input) taken from the corrupted prompt's run, at every position
or at one. The head's effect is how much of the clean-corrupt gap in the metric that one swap
closes::

    effect = (LD_clean - LD_patched) / (LD_clean - LD_corrupt)

1 when the swap alone turns clean into corrupt, 0 when the head does not matter, negative when
the corrupted output helps the behaviour. LDs are means over the task's prompts. Every head is
patched exactly (no approximation), but not one forward pass per head: the heads of a layer are
stacked as copies of the batch (a head axis), and each copy starts at the patched layer from the
clean run's residual stream there (the layers below are the clean run's, unchanged).

**Attribution patching** (Nanda 2023; Syed et al. 2023, EAP): the first-order estimate of the
same quantity from one clean forward, one corrupted forward and one backward pass:
``LD_clean - LD_patched ~ (z_clean - z_corrupt) . dLD/dz`` at the clean run, per head ``z``.
**Integrated gradients** (``method="ig"``; Hanna et al. 2024, EAP-IG) average that gradient over
``steps`` points on the straight line from the corrupted to the clean input embeddings, which
follows the metric where it is not linear in the head. Both report their Pearson correlation
with activation patching when that was measured in the same run.

Shape vocabulary: ``L`` layers, ``H`` heads, ``N`` copies, ``B`` prompts, ``T`` tokens, ``D``
head width, ``V`` vocabulary.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from headlab.causal import table
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
    kv_columns,
    starting_at,
)
from headlab.progress import NO_PROGRESS, Progress, stage

Method = Literal["activation", "attribution", "ig"]
METHODS: tuple[str, ...] = ("activation", "attribution", "ig")
#: EAP-IG's points on the path from the corrupted to the clean embeddings (Hanna et al. use 5)
IG_STEPS = 5
#: rows of one patched forward pass (copies x prompts), bounding its memory
MAX_ROWS = 256


def last_logits(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``(R, V)`` at the last position of ``ids`` ``(R, T)``."""
    from headlab.pruning.tasks import last_logits as logits_at_end

    return logits_at_end(lm, ids)


def logit_difference(
    logits: torch.Tensor, answer: torch.Tensor, distractor: torch.Tensor
) -> torch.Tensor:
    """``(R,)``: ``logit(answer) - logit(distractor)`` of each row of ``logits`` ``(R, V)``."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    answer, distractor = answer.to(logits.device), distractor.to(logits.device)
    return logits[rows, answer].double() - logits[rows, distractor].double()


@dataclass(frozen=True, kw_only=True)
class PatchingResult:
    """Every head's patching effect on one task.

    Shape:
        effects: ``(L, H)`` float64, normalized as the module says (NaN: no such head).
        patched: ``(L, H)`` mean metric with the head patched (activation patching only).
    """

    model: str
    task: str
    method: str
    position: int | None  # None: every position
    n_prompts: int
    clean: float  # mean logit difference of the clean prompts
    corrupt: float  # ... of the corrupted prompts
    effects: torch.Tensor
    patched: torch.Tensor | None = None
    #: against activation patching in the same run: ``{"pearson", "spearman"}``
    correlation: dict[str, float] | None = None
    reference: PatchingResult | None = None  # that activation patching
    steps: int | None = None  # integrated gradients' points
    seconds: float = 0.0
    #: what was patched: ``"z"`` query heads' outputs, ``"k"``/``"v"`` KV heads' keys/values
    component: str = "z"
    #: per layer: residual stream, attention output, MLP output (activation patching)
    layers: LayerTable | None = None

    @property
    def unit(self) -> str:
        """What one row of :attr:`effects` counts: query heads, or KV heads."""
        return "head" if self.component == "z" else "kv_head"

    def ranked(self) -> list[tuple[int, int, float]]:
        """``(layer, head, value)`` by decreasing absolute value, signed."""
        return table.ranked(self.effects)

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` heads of largest absolute value, ``(layer, head, value)``, signed."""
        return table.top(self.effects, k)

    def to_json(self) -> dict[str, Any]:
        heads = []
        for layer, row in enumerate(self.effects.tolist()):
            for head, value in enumerate(row):
                if value != value:
                    continue
                item = {"layer": layer, self.unit: head, "effect": value}
                if self.patched is not None:
                    item["patched"] = float(self.patched[layer, head])
                heads.append(item)
        out: dict[str, Any] = {
            "model": self.model,
            "task": self.task,
            "method": self.method,
            "component": self.component,
            "position": "all" if self.position is None else _position_name(self.position),
            "n_prompts": self.n_prompts,
            "metric": {"clean": self.clean, "corrupt": self.corrupt, "unit": "logit difference"},
        }
        if self.steps is not None:
            out["steps"] = self.steps
        if self.correlation is not None and self.reference is not None:
            out["compare"] = {
                "method": self.reference.method,
                **self.correlation,
                "top": {
                    self.method: _top_json(self.top(5)),
                    self.reference.method: _top_json(self.reference.top(5)),
                },
            }
        out["seconds"] = round(self.seconds, 3)
        if self.layers is not None:
            out["layers"] = self.layers.to_json()
        key = "heads" if self.component == "z" else "kv_heads"
        out[key] = heads
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "patching result") -> PatchingResult:
        """The result again from :meth:`to_json`'s output (the JSON of ``headlab patch``).

        Raises:
            InputError: naming ``where`` and what is missing.
        """
        try:
            rows = data.get("heads") or data.get("kv_heads")
            if not isinstance(rows, list) or not rows:
                raise KeyError("heads")
            unit = "head" if "heads" in data else "kv_head"
            n_layers = 1 + max(int(r["layer"]) for r in rows)
            width = 1 + max(int(r[unit]) for r in rows)
            effects = torch.full((n_layers, width), float("nan"), dtype=torch.float64)
            for r in rows:
                effects[int(r["layer"]), int(r[unit])] = float(r["effect"])
            position = data.get("position", "all")
            return cls(
                model=str(data["model"]),
                task=str(data["task"]),
                method=str(data.get("method", "activation")),
                position=None if position == "all" else parse_position(position),
                n_prompts=int(data.get("n_prompts", 0)),
                clean=float(data["metric"]["clean"]),
                corrupt=float(data["metric"]["corrupt"]),
                effects=effects,
                component=str(data.get("component", "z")),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"{where}: expected the JSON of headlab patch --json (missing or bad {exc})"
            ) from None

    def to_csv(self) -> str:
        """One row a head: ``layer,head,effect`` (``kv_head`` for keys and values)."""
        lines = [f"layer,{self.unit},effect"]
        lines += [f"{layer},{head},{value:.6g}" for layer, head, value in table.cells(self.effects)]
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        """A layers x heads heatmap for notebooks: red carries the behaviour, blue works
        against it, each cell's effect in its tooltip."""
        import html

        scale = max((abs(v) for _, _, v in table.cells(self.effects)), default=1.0) or 1.0
        rows = []
        for layer, row in enumerate(self.effects.tolist()):
            cells = []
            for head, v in enumerate(row):
                if v != v:
                    cells.append("<td></td>")
                    continue
                a = min(1.0, abs(v) / scale)
                color = f"rgba(200,30,30,{a:.2f})" if v > 0 else f"rgba(30,80,200,{a:.2f})"
                title = html.escape(f"{layer}.{head}: {v:+.3f}")
                cells.append(
                    f'<td title="{title}" style="background:{color};width:18px;height:14px"></td>'
                )
            rows.append(f"<tr><th style='font-weight:normal'>{layer}</th>{''.join(cells)}</tr>")
        top = ", ".join(f"{la}.{h} {v:+.2f}" for la, h, v in self.top(5))
        caption = html.escape(
            f"{self.method} patching of {self.model} on {self.task} ({self.n_prompts} prompts): "
            f"logit difference {self.clean:.2f} clean, {self.corrupt:.2f} corrupt; top {top}"
        )
        return (
            f"<table style='border-collapse:collapse'><caption>{caption}</caption>"
            f"{''.join(rows)}</table>"
        )


def _top_json(rows: list[tuple[int, int, float]]) -> list[dict[str, Any]]:
    return [{"layer": layer, "head": head, "effect": value} for layer, head, value in rows]


def _position_name(position: int) -> Any:
    return "last" if position == -1 else position


def _positions(position: int | None, length: int) -> torch.Tensor | None:
    """bool ``(T,)`` of the one patched position (negative: from the end), or ``None``."""
    if position is None:
        return None
    if not -length <= position < length:
        raise InputError(
            f"position {position} is outside a prompt of {length} tokens "
            f"(expected -{length}..{length - 1}; -1 is the last token)"
        )
    mask = torch.zeros(length, dtype=torch.bool)
    mask[position] = True
    return mask


def check_task(lm: LoadedModel, task: Task) -> None:
    """A one-line error unless ``lm`` is a language model with its head (the metric reads
    next-token logits) and ``task`` has prompts."""
    if lm.model.get_output_embeddings() is None:
        raise InputError(
            f"patching reads next-token logits: load {lm.name} with its language-model head "
            "(load(..., with_lm_head=True))"
        )
    if not task.batches:
        raise InputError(f"task {task.name!r} has no prompts")


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


def _check_layers(lm: LoadedModel, layers: Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(lm.n_layers))
    chosen = sorted({int(layer) for layer in layers})
    bad = [layer for layer in chosen if not 0 <= layer < lm.n_layers]
    if bad or not chosen:
        raise InputError(
            f"layers must be in 0..{lm.n_layers - 1} for {lm.name}, got "
            f"{', '.join(map(str, bad)) or 'none'}"
        )
    return chosen


def _normalize(clean: float, corrupt: float, patched: torch.Tensor, task: str) -> torch.Tensor:
    gap = clean - corrupt
    if abs(gap) < 1e-9:
        raise InputError(
            f"{task}: the clean and corrupted prompts score the same on average (logit "
            f"difference {clean:.4g}): the normalized effect is undefined; "
            "there is no gap for a head to explain; corrupt what the answer depends on"
        )
    return (clean - patched) / gap


def _empty(lm: LoadedModel) -> torch.Tensor:
    return torch.full(
        (lm.n_layers, max(lm.layout.heads_per_layer)), float("nan"), dtype=torch.float64
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
) -> AbstractContextManager[Any]:
    """The hooks that patch units ``chosen`` of ``layer``, one a copy (``last_only``: in a
    pass over the last token alone, from the corrupted run's last position)."""
    if component == "z":
        n_heads = lm.layout.heads_per_layer[layer]
        select = torch.zeros(len(chosen), n_heads, dtype=torch.bool)
        select[torch.arange(len(chosen)), chosen] = True
        heads = runs.corrupt_heads[layer]
        swap = Swap(source=heads[:, -1:] if last_only else heads, select=select, positions=where)
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
        max_rows: rows (heads x prompts) of one forward pass, bounding its memory.
    """
    if component not in COMPONENTS:
        raise InputError(f"component must be one of {', '.join(COMPONENTS)}, got {component!r}")
    check_task(lm, task)
    chosen_layers = _check_layers(lm, layers)
    modules = _kv_modules(lm, chosen_layers, component)
    progress = progress or NO_PROGRESS
    start = time.perf_counter()
    device = lm.device
    patched_sum = _empty(lm).nan_to_num(0.0)
    clean_sum = corrupt_sum = 0.0
    total = sum(_units(lm, layer, component) for layer in chosen_layers) * len(task.batches)
    unit = "heads" if component == "z" else "KV heads"
    with torch.inference_mode(), stage(progress, f"patching {unit}", total, unit) as bar:
        for batch in task.batches:
            batch = batch.to(device)
            n_prompts, length = batch.clean.shape
            where = _positions(position, length)
            runs = _runs(lm, batch, modules)
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
                    if prefix is not None:
                        patch = _unit_patch(
                            lm, layer, component, chosen, runs, None, last_only=True
                        )
                        ld = _last_token_ld(lm, batch, layer, runs, prefix, patch, len(chosen))
                    else:
                        patch = _unit_patch(lm, layer, component, chosen, runs, where)
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
    )


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

    from headlab.models.patching import can_start_later

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


LAYER_PARTS = ("resid", "attn", "mlp")


@dataclass(frozen=True, kw_only=True)
class LayerTable:
    """Each layer's effect when its whole input residual stream (``resid``, what the block
    reads), its attention output (``attn``, every head at once) or its MLP output (``mlp``) is
    taken from the corrupted run: TransformerLens' patching tables, normalized as per head.

    Shape:
        resid, attn, mlp: ``(L,)`` float64 (NaN: a block without a recognisable MLP).
    """

    resid: torch.Tensor
    attn: torch.Tensor
    mlp: torch.Tensor

    def to_json(self) -> list[dict[str, Any]]:
        rows = []
        for layer in range(len(self.resid)):
            row: dict[str, Any] = {"layer": layer}
            for part in LAYER_PARTS:
                value = float(getattr(self, part)[layer])
                row[part] = None if value != value else value
            rows.append(row)
        return rows


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
    total = lm.n_layers * len(task.batches)
    with torch.inference_mode(), stage(progress, "patching layers", total, "layers") as bar:
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


@contextmanager
def _interpolated_embeddings(
    lm: LoadedModel, clean: torch.Tensor, corrupt: torch.Tensor, alphas: torch.Tensor
) -> Iterator[None]:
    """The embedding layer's output of ``N x B`` rows replaced by ``corrupt + a_n (clean -
    corrupt)`` (copy ``n``), ``clean``/``corrupt`` ``(B, T, E)`` the two prompts' embeddings."""
    module = lm.model.get_input_embeddings()

    def hook(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        a = alphas.to(out)[:, None, None, None]  # (N, 1, 1, 1)
        mixed = corrupt[None] + a * (clean - corrupt)[None]  # (N, B, T, E)
        return mixed.reshape(out.shape)

    remove = module.register_forward_hook(hook).remove
    try:
        yield
    finally:
        remove()


def _gradients(
    lm: LoadedModel, batch: Batch, *, steps: int | None
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], torch.Tensor]:
    """Mean gradient of the summed metric with respect to every head output ``(B, T, H, D)``:
    at the clean run (``steps=None``), or averaged over ``steps`` points from the corrupted to
    the clean embeddings (integrated gradients). Also the clean run's head outputs and metric
    ``(B,)`` (the last point of the path is the clean input)."""
    with torch.enable_grad():
        if steps is None:
            ids, alphas = batch.clean, None
        else:
            ids = batch.clean.repeat(steps, 1)
            alphas = torch.arange(1, steps + 1, dtype=torch.float64) / steps  # right Riemann sum
        embed = lm.model.get_input_embeddings()
        context: Any = _no_context()
        if alphas is not None:
            with torch.no_grad():
                clean_e, corrupt_e = embed(batch.clean), embed(batch.corrupt)
            context = _interpolated_embeddings(lm, clean_e, corrupt_e, alphas)
        with context, HeadOutputs(lm) as outs:
            logits = last_logits(lm, ids)
        copies = 1 if steps is None else steps
        ld = logit_difference(
            logits, batch.answer.repeat(copies), batch.distractor.repeat(copies)
        )  # (N*B,)
        layers = sorted(outs.outputs)
        grads = torch.autograd.grad(ld.sum(), [outs.outputs[layer] for layer in layers])
    n_prompts = batch.clean.shape[0]
    out = {
        layer: g.detach().view(copies, n_prompts, *g.shape[1:]).mean(dim=0)  # (B, T, H, D)
        for layer, g in zip(layers, grads, strict=True)
    }
    heads = {
        layer: outs.outputs[layer].detach().view(copies, n_prompts, *grads[0].shape[1:])[-1]
        for layer in layers
    }
    clean_ld = ld.detach().view(copies, n_prompts)[-1]
    return out, heads, clean_ld


@contextmanager
def _no_context() -> Iterator[None]:
    yield


def attribution_patching(
    lm: LoadedModel,
    task: Task,
    *,
    method: Method = "attribution",
    steps: int = IG_STEPS,
    position: int | None = None,
    compare: PatchingResult | None = None,
    progress: Progress | None = None,
) -> PatchingResult:
    """Every head's estimated patching effect from gradients (``method="attribution"``: one
    backward pass at the clean run; ``"ig"``: integrated gradients over ``steps`` points).

    ``compare``: an activation-patching result of the same task and position, whose Pearson
    correlation with the estimate goes into the result.
    """
    if method not in ("attribution", "ig"):
        raise InputError(f"method must be 'attribution' or 'ig', got {method!r}")
    if method == "ig" and steps < 1:
        raise InputError(f"integrated gradients need at least 1 step, got {steps}")
    check_task(lm, task)
    progress = progress or NO_PROGRESS
    start = time.perf_counter()
    device = lm.device
    scores = _empty(lm).nan_to_num(0.0)
    clean_sum = corrupt_sum = 0.0
    with stage(progress, f"{method} over prompts", task.n_prompts, "prompts") as bar:
        for batch in task.batches:
            batch = batch.to(device)
            where = _positions(position, batch.clean.shape[1])
            with torch.inference_mode(), HeadOutputs(lm, detach=True) as corrupt_run:
                corrupt_ld = logit_difference(
                    last_logits(lm, batch.corrupt), batch.answer, batch.distractor
                )
            ig_steps = None if method == "attribution" else steps
            grads, clean_heads, clean_ld = _gradients(lm, batch, steps=ig_steps)
            for layer, grad in grads.items():
                delta = clean_heads[layer] - corrupt_run.outputs[layer]  # (B, T, H, D)
                terms = (delta.double() * grad.double()).sum(dim=-1)  # (B, T, H)
                if where is not None:
                    terms = terms[:, where.to(terms.device)]
                n_heads = terms.shape[-1]
                scores[layer, :n_heads] += terms.sum(dim=(0, 1)).cpu()
            clean_sum += float(clean_ld.sum())
            corrupt_sum += float(corrupt_ld.sum())
            bar.advance(batch.clean.shape[0])
    n = task.n_prompts
    clean, corrupt = clean_sum / n, corrupt_sum / n
    missing = _empty(lm)
    for layer, count in enumerate(lm.layout.heads_per_layer):
        missing[layer, :count] = 0.0
    effects = _normalize(clean, corrupt, clean - scores / n, task.name) + missing
    return PatchingResult(
        model=lm.name,
        task=task.name,
        method=method,
        position=position,
        n_prompts=n,
        clean=clean,
        corrupt=corrupt,
        effects=effects,
        correlation=None if compare is None else correlations(effects, compare.effects),
        reference=compare,
        steps=steps if method == "ig" else None,
        seconds=time.perf_counter() - start,
    )


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two ``(L, H)`` effect tables over the heads both have."""
    x, y = a.flatten().double(), b.flatten().double()
    keep = ~(x.isnan() | y.isnan())
    x, y = x[keep] - x[keep].mean(), y[keep] - y[keep].mean()
    denominator = float(x.norm() * y.norm())
    return float((x * y).sum()) / denominator if denominator > 0 else float("nan")


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share the mean of their ranks), as Spearman's rho uses them."""
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    for value in torch.unique(x):
        same = x == value
        if int(same.sum()) > 1:
            ranks[same] = ranks[same].mean()
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two ``(L, H)`` effect tables over the heads both have."""
    x, y = a.flatten().double(), b.flatten().double()
    keep = ~(x.isnan() | y.isnan())
    return pearson(_ranks(x[keep]), _ranks(y[keep]))


def correlations(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """``{"pearson", "spearman"}`` of two effect tables."""
    return {"pearson": pearson(a, b), "spearman": spearman(a, b)}


POSITIONS = ("all", "last")


def parse_position(position: str | int | None) -> int | None:
    """``"all"``/``None`` -> ``None`` (every position); ``"last"`` -> ``-1``; an int as is."""
    if position is None or position == "all":
        return None
    if position == "last":
        return -1
    if isinstance(position, int) and not isinstance(position, bool):
        return position
    raise InputError(f"position must be 'all', 'last' or a token index, got {position!r}")


def run_patching(
    lm: LoadedModel,
    task: Task,
    *,
    method: Method = "activation",
    position: int | None = None,
    component: str = "z",
    steps: int = IG_STEPS,
    compare: bool = False,
    layer_table: bool = False,
    layers: Sequence[int] | None = None,
    max_rows: int = MAX_ROWS,
    progress: Progress | None = None,
) -> PatchingResult:
    """Activation patching, or a gradient estimate with (when ``compare``) activation patching
    run first, for the correlations and top heads of both; ``layer_table``: also each layer's
    residual stream, attention and MLP output (activation patching, in the result's
    ``layers``)."""
    import dataclasses

    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if component != "z" and method != "activation":
        raise InputError(f"component {component!r} is patched by activation patching only")

    def activation() -> PatchingResult:
        return activation_patching(
            lm,
            task,
            position=position,
            layers=layers,
            component=component,
            max_rows=max_rows,
            progress=progress,
        )

    reference = activation() if method == "activation" or compare else None
    if method == "activation":
        result = reference
    else:
        result = attribution_patching(
            lm,
            task,
            method=method,
            steps=steps,
            position=position,
            compare=reference,
            progress=progress,
        )
    if result is None:  # pragma: no cover - activation always gives one
        raise RuntimeError("no patching result")
    if layer_table:
        table = layer_patching(lm, task, position=position, progress=progress)
        result = dataclasses.replace(result, layers=table)
    return result


def patch_heads(
    model: Any,
    tokenizer: Any = None,
    prompts: Any = "ioi",
    *,
    method: Method = "activation",
    position: str | int | None = "all",
    component: str = "z",
    steps: int = IG_STEPS,
    compare: bool = False,
    layer_table: bool = False,
    n: int = 24,
    seed: int = 0,
    layers: Sequence[int] | None = None,
    max_rows: int = MAX_ROWS,
    progress: Progress | None = None,
) -> PatchingResult:
    """Which heads carry a behaviour: patch each head's output from the corrupted run into the
    clean run, batched, on a model you hold.

    Args:
        model: a transformers causal LM (``AutoModelForCausalLM``), or a headlab
            :class:`~headlab.models.LoadedModel` loaded ``with_lm_head=True``.
        tokenizer: the model's tokenizer (not needed with a ``LoadedModel``).
        prompts: a built-in task name (``"ioi"``, ``"induction"``: ``n`` prompts drawn with
            ``seed``), a JSON Lines file, a list of :class:`Prompt` or of dicts with
            ``clean``, ``corrupt``, ``answer``, ``distractor``, or an encoded :class:`Task`.
        method: ``"activation"`` (exact), ``"attribution"`` or ``"ig"`` (gradient estimates).
        position: ``"all"`` (default), ``"last"``, or a token index.
        component: ``"z"`` query heads' outputs, or ``"k"``/``"v"`` per KV head.
        compare: with a gradient method, also run activation patching and correlate.
        layer_table: also patch each layer's residual stream, attention and MLP output.

    Example:
        >>> from transformers import AutoModelForCausalLM, AutoTokenizer  # doctest: +SKIP
        >>> result = patch_heads(model, tokenizer, "ioi", n=8)  # doctest: +SKIP
        >>> result.top(3)  # doctest: +SKIP
        [(23, 3, 0.41), ...]
    """
    from headlab.models.loading import LoadedModel as Loaded

    lm = model if isinstance(model, Loaded) else _wrap(model, tokenizer)
    task = as_task(lm, prompts, n=n, seed=seed)
    return run_patching(
        lm,
        task,
        method=method,
        position=parse_position(position),
        component=component,
        steps=steps,
        compare=compare,
        layer_table=layer_table,
        layers=layers,
        max_rows=max_rows,
        progress=progress,
    )


def _wrap(model: Any, tokenizer: Any) -> LoadedModel:
    from headlab.models.loading import wrap

    if tokenizer is None:
        raise InputError("patch_heads needs the model's tokenizer with a transformers model")
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    return wrap(model, tokenizer, name=str(name))


def as_task(lm: LoadedModel, prompts: Any, *, n: int = 24, seed: int = 0) -> Task:
    """A :class:`Task` for ``lm``'s tokenizer from any form :func:`patch_heads` takes."""
    from pathlib import Path

    from headlab.causal.generators import BUILTIN, builtin_prompts
    from headlab.causal.tasks import Prompt, encode_task, parse_prompt, read_prompts

    if isinstance(prompts, Task):
        return prompts
    if lm.tokenizer is None:
        raise InputError(f"{lm.name} has no tokenizer: patching reads text prompts")
    if isinstance(prompts, str) and prompts in BUILTIN:
        drawn = builtin_prompts(prompts, lm.tokenizer, n, seed=seed)
        return encode_task(lm.tokenizer, drawn, name=prompts)
    if isinstance(prompts, (str, Path)):
        path = Path(prompts)
        if path.suffix != ".jsonl" and not path.exists():
            raise InputError(
                f"unknown task {str(prompts)!r}: give {', '.join(BUILTIN)} or a .jsonl file"
            )
        return encode_task(lm.tokenizer, read_prompts(path), name=path.name)
    items = [p if isinstance(p, Prompt) else parse_prompt(p, f"prompt {i + 1}") for i, p in
             enumerate(prompts)]  # fmt: skip
    return encode_task(lm.tokenizer, items, name="prompts")
