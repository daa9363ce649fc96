"""Capture every head of a real model: patterns, outputs, contributions; ablate any heads.

Inside ``with HeadCapture(lm) as cap:`` one forward pass of ``lm.model`` records, per layer:

=============================== ====================== =========================================
key (:meth:`HeadCapture.activations`) shape                  what
=============================== ====================== =========================================
``layers.{l}.attn.q``           ``(B, H, T, D)``       queries as attention sees them (post-rotary)
``layers.{l}.attn.k``           ``(B, Hkv, S, D)``     keys (GQA not expanded)
``layers.{l}.attn.v``           ``(B, Hkv, S, D)``     values (GQA not expanded)
``layers.{l}.attn.head_output`` ``(B, H, T, D)``       each head's slice of the output projection's
                                                       input (the concatenation)
``layers.{l}.attn.pattern``     ``(B, H, T, S)``       recomputed on demand (:meth:`pattern`)
``layers.{l}.attn.contribution`` ``(B, H, T, E)``      each head through its columns of the output
                                                       projection (:meth:`contributions`)
=============================== ====================== =========================================

Patterns are recomputed from the captured queries and keys with the model's own mask and
scaling, only for the layers and heads asked for: no eager attention, and no full
layers x heads x T x T tensor. Hooks are always removed on exit; without ablation the model's
outputs are bit-identical to an unhooked run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from headlab.attention.blocks import attention_weights
from headlab.errors import InputError
from headlab.models.dispatch import aligned
from headlab.models.hooks import HeadFn, Hooks, ablation
from headlab.models.interface import by_module, call_rules, observe, per_call
from headlab.models.loading import LoadedModel


@dataclass(kw_only=True)
class LayerRecord:
    """What one layer's attention call and output projection saw."""

    q: torch.Tensor | None = None  # (B, H, T, D)
    k: torch.Tensor | None = None  # (B, Hkv, S, D)
    v: torch.Tensor | None = None  # (B, Hkv, S, D)
    mask: torch.Tensor | None = None  # bool (B|1, 1|H, T, S) True = attend, or additive float
    is_causal: bool = False
    scaling: float = 1.0
    softcap: float | None = None  # Gemma 2: scores become softcap * tanh(scores / softcap)
    head_output: torch.Tensor | None = None  # (B, H, T, D)


#: a layer by its index, or by its name (``"encoder 0"``, ``"cross 2"``, ``"self 3"``)
Layer = int | str
#: heads per layer: ``{layer: [heads]}``, layers by index or by name
LayerHeads = (
    Mapping[int, Iterable[int]] | Mapping[str, Iterable[int]] | Mapping[Layer, Iterable[int]]
)


def layer_index(lm: LoadedModel, layer: Layer) -> int:
    """The index of ``layer`` in ``lm.layers``: an index, or a name as :attr:`LayerHandles.name`
    gives it (an encoder-decoder's ``"cross 1"`` is its second cross-attention layer)."""
    if isinstance(layer, str):
        names = {h.name: i for i, h in enumerate(lm.layers)}
        if layer not in names:
            shown = ", ".join(list(names)[:3] + (["..."] if len(names) > 3 else []))
            raise InputError(f"no layer named {layer!r}: the model's layers are {shown}")
        return names[layer]
    return int(layer)


def _normalise_heads(spec: LayerHeads | None, lm: LoadedModel) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name, heads in (spec or {}).items():
        layer = layer_index(lm, name)
        if not 0 <= int(layer) < lm.n_layers:
            raise InputError(
                f"layer {layer} out of range: the model has layers 0..{lm.n_layers - 1}"
            )
        hs = sorted({int(h) for h in heads})
        bad = [h for h in hs if not 0 <= h < lm.layout.heads_per_layer[int(layer)]]
        if bad:
            raise InputError(
                f"heads {bad} out of range: layer {layer} has heads 0..{lm.layout.heads_per_layer[int(layer)] - 1}"
            )
        out[int(layer)] = hs
    return out


def attention_pattern(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    is_causal: bool,
    scaling: float,
    heads: Sequence[int] | None = None,
    rows: tuple[int, int] | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scaling + mask) for the chosen heads and query rows, from the attention
    engine (:func:`headlab.attention.blocks.attention_weights`; rows with no visible key are
    zeros).

    ``rows=(start, stop)`` computes only those query positions (for block-wise statistics that
    never hold a full ``T x T`` pattern); ``dtype`` is the precision of the product and the
    softmax (default float32, float64 for float64 queries); ``is_causal`` adds the bottom-right
    aligned causal triangle.

    Shape:
        q: ``(B, H, T, D)``; k: ``(B, Hkv, S, D)``; returns ``(B, h, t, S)``.
    """
    return attention_weights(
        q,
        k,
        mask=mask,
        causal=is_causal,
        scaling=scaling,
        heads=None if heads is None else list(heads),
        rows=rows,
        dtype=dtype,
    )


class HeadCapture(Hooks):
    """Context manager that captures (and optionally ablates) heads during forward passes.

    Args:
        lm: a :class:`~headlab.models.loading.LoadedModel`.
        layers: layers to record (default: all), by index or by name (``"cross 1"``: an
            encoder-decoder's second cross-attention layer; ``lm.layers[i].name``).
        record_queries_keys: keep q and k (needed for patterns).
        record_head_outputs: keep each head's output.
        ablate: ``{layer: [heads]}`` to remove from the output projection's input (layers by
            index or name, as ``layers``).
        ablation: ``"zero"`` (replace with zeros), ``"mean"`` (with ``means``) or
            ``"resample"`` (with ``resampled``: another input's outputs, position by position).
        means: ``{layer: (H, D) tensor}`` mean head outputs, for mean-ablation.
        resampled: ``{layer: (T_ref, H, D) tensor}`` each head's outputs on another input of
            at least as many tokens, for resample-ablation (Chan et al. 2022).

    Example:
        >>> from headlab.models import load, HeadCapture, encode
        >>> lm = load()
        >>> batch = encode(lm, ["The chef prepared the fish."])
        >>> with HeadCapture(lm) as cap:
        ...     _ = lm.model(**batch)
        >>> cap.pattern(0).shape  # (B, H, T, S)
        torch.Size([1, 12, 8, 8])
    """

    def __init__(
        self,
        lm: LoadedModel,
        *,
        layers: Iterable[Layer] | None = None,
        record_queries_keys: bool = True,
        record_head_outputs: bool = True,
        ablate: LayerHeads | None = None,
        ablation: Literal["zero", "mean", "resample"] = "zero",
        means: Mapping[int, torch.Tensor] | None = None,
        resampled: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        self.lm = lm
        self.layers = (
            list(range(lm.n_layers))
            if layers is None
            else sorted({layer_index(lm, layer) for layer in layers})
        )
        _normalise_heads({layer: [] for layer in self.layers}, lm)
        self.record_queries_keys = record_queries_keys
        self.record_head_outputs = record_head_outputs
        self.ablate = _normalise_heads(ablate, lm)
        if ablation not in ("zero", "mean", "resample"):
            raise InputError(f"ablation must be 'zero', 'mean' or 'resample', got {ablation!r}")
        fills = {"mean": means, "resample": resampled}.get(ablation, {})
        missing = [layer for layer in self.ablate if fills is None or layer not in fills]
        if ablation != "zero" and missing:
            raise InputError(f"{ablation}-ablation needs head outputs for layers {missing}")
        self.ablation = ablation
        self.means = dict(means or {})
        self.resampled = dict(resampled or {})
        self.records: dict[int, LayerRecord] = {}
        super().__init__()

    # ------------------------------------------------------------------ hooks
    def _attention_observer(self, layer: int) -> Any:
        def record(
            module: nn.Module,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            mask: Any,
            kwargs: dict[str, Any],
        ) -> None:
            rec = self.records.setdefault(layer, LayerRecord())
            rec.q, rec.k, rec.v = query.detach(), key.detach(), value.detach()
            rec.mask = mask.detach() if isinstance(mask, torch.Tensor) else None
            bias = kwargs.get("position_bias")
            if isinstance(bias, torch.Tensor):  # T5: relative position bias added to the scores
                bias = bias.detach()
                if rec.mask is not None and rec.mask.dtype == torch.bool:
                    floor = torch.finfo(bias.dtype).min
                    bias = bias.masked_fill(~rec.mask, floor)
                elif rec.mask is not None:
                    bias = bias + rec.mask
                rec.mask = bias
            rec.is_causal, rec.scaling = call_rules(module, query, key, rec.mask, kwargs)
            cap = kwargs.get("softcap")
            rec.softcap = None if cap is None else float(cap)

        return record

    def _head_functions(self, layer: int) -> list[HeadFn]:
        """What layer ``layer``'s head-output slot runs: the ablation, then the record."""
        functions: list[HeadFn] = []
        heads = self.ablate.get(layer, [])
        if heads:
            n_heads = self.lm.layout.heads_per_layer[layer]
            fills = {"mean": self.means, "resample": self.resampled}.get(self.ablation, {})
            functions.append(ablation(heads, n_heads, fills.get(layer)))
        if self.record_head_outputs and layer in self.layers:

            def record(z: torch.Tensor) -> None:
                rec = self.records.setdefault(layer, LayerRecord())
                rec.head_output = z.detach().permute(0, 2, 1, 3)  # (B, H, T, D)

            functions.append(record)
        return functions

    def install(self) -> None:
        layers = self.lm.layers
        if self.record_queries_keys:
            for module, served in by_module([h.attention for h in layers]):
                if any(layer in self.layers for layer in served):
                    fns = [self._attention_observer(layer) for layer in served]
                    self.add(observe(module, per_call(fns)))
        self.at_heads(self.lm, {layer: self._head_functions(layer) for layer in range(len(layers))})

    # ------------------------------------------------------------------ results
    def _record(self, layer: int) -> LayerRecord:
        if layer not in self.records:
            raise InputError(f"layer {layer} was not captured (captured: {sorted(self.records)})")
        return self.records[layer]

    def _queries_keys(self, layer: int) -> tuple[LayerRecord, torch.Tensor, torch.Tensor]:
        rec = self._record(layer)
        if rec.q is None or rec.k is None:
            raise InputError("patterns need record_queries_keys=True")
        return rec, rec.q, rec.k

    def _check_heads(self, layer: int, heads: Sequence[int]) -> None:
        _normalise_heads({layer: heads}, self.lm)  # the same one-line error as ablate=

    def pattern(
        self,
        layer: int,
        heads: Sequence[int] | None = None,
        *,
        rows: tuple[int, int] | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """Attention weights ``(B, h, T, S)`` of ``heads`` (default all) of ``layer``; only query
        rows ``start:stop`` with ``rows``; the product and softmax in ``dtype`` (default float32,
        float64 for a float64 model)."""
        rec, q, k = self._queries_keys(layer)
        if heads is not None:
            self._check_heads(layer, heads)
        return attention_weights(
            q,
            k,
            mask=rec.mask,
            causal=rec.is_causal,
            scaling=rec.scaling,
            heads=None if heads is None else list(heads),
            rows=rows,
            dtype=dtype,
            softcap=rec.softcap,
        )

    def value_norms(self, layer: int) -> torch.Tensor:
        """``(B, H, S)``: the size of what each key position gives each head, the norm of its
        value vector through the head's columns of the output projection, ``||W_O^h v_s||``
        (Kobayashi et al. 2020; the projection's bias left out, as it is no token's)."""
        rec = self._record(layer)
        if rec.v is None:
            raise InputError("value norms need record_queries_keys=True")
        v = rec.v  # (B, Hkv, S, D)
        handles = self.lm.layers[layer]
        with aligned(handles.out_proj, v.device):
            w = self.lm.adapter.out_proj_weight(handles.out_proj).detach().to(v.device)  # (E, H*D)
        n_heads = self.lm.layout.heads_per_layer[layer]
        w = w.view(w.shape[0], n_heads, v.shape[-1]).to(torch.promote_types(v.dtype, torch.float32))
        v = v.repeat_interleave(n_heads // v.shape[1], dim=1).to(w.dtype)  # (B, H, S, D)
        return torch.einsum("bhsd,ehd->bhse", v, w).norm(dim=-1)

    def norm_weighted_pattern(self, layer: int) -> torch.Tensor:
        """``(B, H, T, S)``: attention weighted by the value norm of what it reads,
        ``a_ts * ||W_O^h v_s||`` (Kobayashi et al. 2020), each row rescaled to sum to 1 so it
        reads as a share beside the raw weights (a padded row stays 0).

        A head that puts most of its weight on a token whose value is small (a sink, a
        delimiter) adds little of it to the output: here that token's share shrinks."""
        weights = self.pattern(layer).float()  # (B, H, T, S)
        scaled = weights * self.value_norms(layer)[:, :, None, :].to(weights)
        total = scaled.sum(dim=-1, keepdim=True)
        return scaled / total.clamp_min(torch.finfo(scaled.dtype).tiny)

    def head_output(self, layer: int) -> torch.Tensor:
        """Each head's output ``(B, H, T, D)`` (after ablation, as the output projection saw it)."""
        rec = self._record(layer)
        if rec.head_output is None:
            raise InputError("head outputs need record_head_outputs=True")
        return rec.head_output

    def contributions(self, layer: int, heads: Sequence[int] | None = None) -> torch.Tensor:
        """Each head's output through its columns of the output projection ``(B, h, T, E)``.

        Summed over all heads plus the projection's bias, this is the projection's output.
        """
        out = self.head_output(layer)  # (B, H, T, D)
        handles = self.lm.layers[layer]
        with aligned(handles.out_proj, out.device):  # an offloaded layer's weight, here for now
            w = self.lm.adapter.out_proj_weight(handles.out_proj).to(out.device)  # (E, H*D)
        n_heads, d = out.shape[1], out.shape[3]
        w = w.view(w.shape[0], n_heads, d)  # (E, H, D)
        if heads is not None:
            self._check_heads(layer, heads)
            idx = torch.as_tensor(list(heads), device=out.device)
            out, w = out.index_select(1, idx), w.index_select(1, idx)
        return torch.einsum("bhtd,ehd->bhte", out, w.to(out.dtype))

    def activations(self) -> dict[str, torch.Tensor]:
        """Every recorded tensor under a plain dotted key (``layers.3.attn.q``...)."""
        acts: dict[str, torch.Tensor] = {}
        for layer, rec in sorted(self.records.items()):
            for name in ("q", "k", "v", "head_output"):
                value = getattr(rec, name)
                if value is not None:
                    acts[f"layers.{layer}.attn.{name}"] = value
        return acts
