"""What headlab knows about one opened model's attention, found by discovery.

Shared code never asks which architecture it is looking at: it asks the :class:`Adapter` for the
layers' attention modules (the modules that call transformers' attention interface), their
output projections (whose input is the concatenation of the head outputs) and their
query/key/value projections, all found by :func:`headlab.models.discovery.discover`. Physical
pruning rewrites those projections whatever the family. There is one class for every family: a
family whose attention bypasses transformers' attention interface gets a shim that routes it
there (:mod:`headlab.models.adapters.registry`), never an adapter subclass.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import nn

from headlab.attention.surgery import head_rows, linear_columns, linear_rows
from headlab.errors import PruningError
from headlab.models.discovery import LayerHandles, is_conv1d
from headlab.models.transformers_fit import native_config

#: int attributes of an attention module that count its query heads, its KV heads, the KV
#: groups, or measure its concatenated query/KV width: pruning updates them
_HEAD_ATTRS = ("num_heads", "num_attention_heads", "n_heads", "n_head", "num_q_heads")
_KV_ATTRS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_head_kv")
_WIDTH_ATTRS = ("all_head_size", "split_size", "inner_dim", "embed_dim", "q_size", "hidden_size_q")
_KV_WIDTH_ATTRS = ("kv_dim", "kv_size")
#: config keys a module may read its head counts from during the forward pass (Phi-3)
_CONFIG_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads")
_CONFIG_KV_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads")


def _rows(module: Any, rows: torch.Tensor) -> nn.Module:
    """``module`` keeping only output features ``rows`` (Linear or Conv1D)."""
    if not is_conv1d(module):
        return linear_rows(module, rows)
    new: Any = copy.deepcopy(module)
    with torch.no_grad():
        new.weight = nn.Parameter(module.weight[:, rows.to(module.weight.device)].clone())
        new.bias = nn.Parameter(module.bias[rows.to(module.bias.device)].clone())
    new.nf = rows.numel()
    return new


def _columns(module: Any, cols: torch.Tensor) -> nn.Module:
    """``module`` reading only input features ``cols`` (Linear or Conv1D)."""
    if not is_conv1d(module):
        return linear_columns(module, cols)
    new: Any = copy.deepcopy(module)
    with torch.no_grad():
        new.weight = nn.Parameter(module.weight[cols.to(module.weight.device)].clone())
    return new


class Adapter:
    """One opened model's attention layers and how to rewrite them.

    Attributes:
        family: the config's ``model_type``.
        causal: a decoder-only model whose self-attention is causal.
        handles: every attention layer (:class:`LayerHandles`), in forward order.
        head_counts: ``(H, Hkv, D)`` of every layer as the interface saw them.
    """

    def __init__(
        self,
        model: Any,
        family: str,
        handles: list[LayerHandles],
        head_counts: list[tuple[int, int, int]],
        causal: bool,
    ) -> None:
        self.model = model
        self.family = family
        self.handles = handles
        self.head_counts = head_counts
        self.causal = causal
        self._paths = dict(model.named_modules())  # as discovered, before any pruning

    def layers(self) -> list[LayerHandles]:
        """Handles of every layer, in order."""
        return list(self.handles)

    def reserved_positions(self) -> int:
        """Position slots used for something other than tokens: RoBERTa-style embeddings number
        positions from ``padding_idx + 1`` (read off the position embedding itself)."""
        for name, module in self.model.named_modules():
            if name.endswith("position_embeddings") and isinstance(module, nn.Embedding):
                return 0 if module.padding_idx is None else int(module.padding_idx) + 1
        return 0

    # ------------------------------------------------------------------ pruning
    def prunable(self, layer: int) -> str | None:
        """Why layer ``layer`` cannot be pruned physically, or None."""
        h = self.handles[layer]
        if h.qkv is None:
            return (
                f"physical pruning of {type(h.attention).__name__} needs its query/key/value "
                "projections, which discovery could not tell apart"
            )
        cls = type(h.attention).__name__
        if h.kind != "self":
            return (
                f"physical pruning of {cls} ({h.kind} attention) is not supported: headlab's "
                "pruned folders record head counts for one stack of layers, not an encoder-decoder"
            )
        if (
            getattr(self.model.config, "vision_config", None) is not None
            and len({x.path.split(".")[0] for x in self.handles}) > 1
        ):
            return (
                f"physical pruning of {cls} is not supported: headlab's pruned folders record "
                "head counts for one stack of layers, not a model with two towers"
            )
        n_heads, n_kv, d = self.head_counts[layer]
        own = {id(p) for m in (h.qkv.q, h.qkv.k, h.qkv.v, h.out_proj) for p in m.parameters()}
        for name, p in h.attention.named_parameters():
            qk = name.split(".")[0].lower().startswith(("q", "k"))  # q_norm, k_layernorm...
            # a norm D wide is applied to each head alone (Gemma 3, Qwen3), even when it is as
            # wide as all KV heads together: one KV head (MQA)
            across = p.numel() in (n_heads * d, n_kv * d) and p.numel() != d
            if qk and id(p) not in own and across and d > 1:
                return (
                    f"physical pruning of {cls} is not supported: {name} normalises all heads' "
                    "queries or keys together, so removing a head changes the others"
                )
        shared = [i for i, o in enumerate(self.handles) if o.attention is h.attention]
        if len(shared) > 1:
            return (
                f"{type(h.attention).__name__} is one module shared by layers {shared}: "
                "its heads cannot be pruned per layer"
            )
        return None

    def _replace(self, old: nn.Module, new: nn.Module) -> None:
        for _, parent in self.model.named_modules():
            for attr, child in list(parent.named_children()):
                if child is old:
                    setattr(parent, attr, new)

    def prune_layer(
        self, base_model: Any, layer: int, keep: list[int], keep_kv: list[int], head_dim: int
    ) -> None:
        """Rewrite layer ``layer`` in place so that only query heads ``keep`` and KV heads
        ``keep_kv`` remain (indices into the layer's current heads, already validated)."""
        reason = self.prunable(layer)
        if reason:
            raise PruningError(reason)
        h = self.handles[layer]
        qkv = h.qkv
        if qkv is None:  # prunable() said why above; this cannot happen
            raise PruningError(f"layer {layer}: no query/key/value projections found")
        n_heads, n_kv, d = self.head_counts[layer]
        q_rows, kv_rows = head_rows(keep, d), head_rows(keep_kv, d)
        if qkv.layout == "separate":
            self._replace(qkv.q, _rows(qkv.q, q_rows))
            self._replace(qkv.k, _rows(qkv.k, kv_rows))
            self._replace(qkv.v, _rows(qkv.v, kv_rows))
        elif qkv.layout == "fused":
            rows = torch.cat([q_rows, kv_rows + n_heads * d, kv_rows + (n_heads + n_kv) * d])
            self._replace(qkv.q, _rows(qkv.q, rows))
        else:  # interleaved [q k v] per head
            self._replace(qkv.q, _rows(qkv.q, head_rows(keep, d, stride=3 * d)))
        self._replace(h.out_proj, _columns(h.out_proj, q_rows))
        new_h, new_kv = len(keep), len(keep_kv)
        attention = h.attention
        for attr, value in list(vars(attention).items()):
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            if attr in _KV_ATTRS and value == n_kv:
                setattr(attention, attr, new_kv)
            elif attr in _HEAD_ATTRS and value == n_heads:
                setattr(attention, attr, new_h)
            elif attr == "num_key_value_groups":
                setattr(attention, attr, new_h // new_kv)
            elif attr in _WIDTH_ATTRS and value == n_heads * d:
                setattr(attention, attr, new_h * d)
            elif attr in _KV_WIDTH_ATTRS and value == n_kv * d:
                setattr(attention, attr, new_kv * d)
        config = getattr(attention, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            # a module reading its head counts from the config in forward (Phi-3) gets its own
            own = copy.copy(config)
            for key in _CONFIG_HEAD_KEYS:
                if getattr(own, key, None) == n_heads:
                    setattr(own, key, new_h)
            for key in _CONFIG_KV_KEYS:
                if getattr(own, key, None) == n_kv:
                    setattr(own, key, new_kv)
            attention.config = own
        self.head_counts[layer] = (new_h, new_kv, d)
        self.handles[layer] = self._rediscovered(h)

    def _rediscovered(self, h: LayerHandles) -> LayerHandles:
        """``h`` pointing at the modules now at its projections' paths."""

        modules = dict(self.model.named_modules())
        paths = {id(m): p for p, m in self._paths.items()}

        def now(m: nn.Module) -> nn.Module:
            return modules.get(paths.get(id(m), ""), m)

        qkv = h.qkv
        if qkv is not None:
            qkv = dataclasses.replace(qkv, q=now(qkv.q), k=now(qkv.k), v=now(qkv.v))
        return dataclasses.replace(h, out_proj=now(h.out_proj), qkv=qkv)

    def native_config(
        self, config: dict[str, Any], heads: list[int], kv_heads: list[int], head_dim: int
    ) -> dict[str, Any] | None:
        """The family's own config keys for a pruned model, when transformers builds exactly
        the pruned shapes from them (checked by building the model on the meta device), else
        None. One head count for every layer."""

        return native_config(self, config, heads, kv_heads, head_dim)

    def out_proj_weight(self, out_proj: nn.Module) -> torch.Tensor:
        """The output projection as an ``(E, H*D)`` matrix (``y = W x + b``; a view)."""
        weight = out_proj.weight
        if not isinstance(weight, torch.Tensor):
            raise TypeError("output projection has no weight tensor")
        return weight.t() if is_conv1d(out_proj) else weight

    def out_proj_bias(self, out_proj: nn.Module) -> torch.Tensor | None:
        """The output projection's bias ``(E,)``, if any."""
        bias = getattr(out_proj, "bias", None)
        return bias if isinstance(bias, torch.Tensor) else None
