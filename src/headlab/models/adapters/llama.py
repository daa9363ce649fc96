"""Llama family with grouped-query attention: Llama, Mistral, Qwen2, Qwen3, Phi-3.

``layers[i].self_attn`` applies rotary embeddings to queries and keys before calling the
attention interface (so captured queries and keys are post-rotary) and owns ``o_proj``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from headlab.attention.surgery import head_rows, linear_columns, linear_rows
from headlab.models.adapters.base import Adapter, LayerHandles


class LlamaAdapter(Adapter):
    family = "llama"
    model_types = ("llama", "mistral", "qwen2", "qwen3", "phi3")
    causal = True

    def layers(self, base_model: Any) -> list[LayerHandles]:
        return [
            LayerHandles(attention=layer.self_attn, out_proj=layer.self_attn.o_proj)
            for layer in base_model.layers
        ]

    def prune_layer(
        self, base_model: Any, layer: int, keep: list[int], keep_kv: list[int], head_dim: int
    ) -> None:
        attention = base_model.layers[layer].self_attn
        q_rows, kv_rows = head_rows(keep, head_dim), head_rows(keep_kv, head_dim)
        if hasattr(attention, "qkv_proj"):  # Phi-3 fuses [q | k | v]
            n_q = attention.qkv_proj.out_features - 2 * attention.num_key_value_heads * head_dim
            n_kv = attention.num_key_value_heads * head_dim
            rows = torch.cat([q_rows, kv_rows + n_q, kv_rows + n_q + n_kv])
            attention.qkv_proj = linear_rows(attention.qkv_proj, rows)
            # Phi-3 reads the query width from its config: give this layer its own copy
            attention.config = copy.copy(attention.config)
            attention.config.num_attention_heads = len(keep)
        else:
            attention.q_proj = linear_rows(attention.q_proj, q_rows)
            attention.k_proj = linear_rows(attention.k_proj, kv_rows)
            attention.v_proj = linear_rows(attention.v_proj, kv_rows)
        attention.o_proj = linear_columns(attention.o_proj, q_rows)
        attention.num_key_value_groups = len(keep) // len(keep_kv)
        if hasattr(attention, "num_key_value_heads"):
            attention.num_key_value_heads = len(keep_kv)
        if hasattr(attention, "num_heads"):
            attention.num_heads = len(keep)

    def native_config(
        self, config: dict[str, Any], heads: list[int], kv_heads: list[int], head_dim: int
    ) -> dict[str, Any] | None:
        # Llama, Mistral and Qwen configs carry an explicit head_dim; Phi-3's does not (its
        # head width is hidden_size / num_attention_heads), so a pruned Phi-3 loads with
        # headlab only. One head count for every layer.
        if len(set(heads)) != 1 or len(set(kv_heads)) != 1 or config.get("model_type") == "phi3":
            return None
        # transformers 5 validates hidden_size % num_attention_heads == 0 even with an explicit
        # head_dim (Llama-3.2-1B: 2048 wide, 28 heads after one KV group per layer)
        hidden = config.get("hidden_size")
        if not isinstance(hidden, int) or hidden % heads[0]:
            return None
        return {
            "num_attention_heads": heads[0],
            "num_key_value_heads": kv_heads[0],
            "head_dim": head_dim,
        }
