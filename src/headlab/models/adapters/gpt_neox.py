"""GPT-NeoX (Pythia): one fused ``query_key_value`` projection whose rows interleave heads, and
partial rotary embeddings (``rotary_pct``). ``layers[i].attention`` calls the interface and owns
``dense``, the output projection."""

from __future__ import annotations

from typing import Any

from headlab.attention.surgery import head_rows, linear_columns, linear_rows
from headlab.models.adapters.base import Adapter, LayerHandles


class GPTNeoXAdapter(Adapter):
    family = "gpt_neox"
    model_types = ("gpt_neox",)
    causal = True

    def layers(self, base_model: Any) -> list[LayerHandles]:
        return [
            LayerHandles(attention=layer.attention, out_proj=layer.attention.dense)
            for layer in base_model.layers
        ]

    def prune_layer(
        self, base_model: Any, layer: int, keep: list[int], keep_kv: list[int], head_dim: int
    ) -> None:
        attention = base_model.layers[layer].attention
        # rows of query_key_value are [q | k | v] for head 0, then for head 1, ...
        fused = head_rows(keep, head_dim, stride=3 * head_dim)
        attention.query_key_value = linear_rows(attention.query_key_value, fused)
        attention.dense = linear_columns(attention.dense, head_rows(keep, head_dim))
