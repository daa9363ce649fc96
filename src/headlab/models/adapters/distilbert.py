"""DistilBERT: ``transformer.layer[i].attention`` computes the heads and owns ``out_lin``."""

from __future__ import annotations

from typing import Any

from headlab.attention.surgery import head_rows, linear_columns, linear_rows
from headlab.models.adapters.base import Adapter, LayerHandles


class DistilBertAdapter(Adapter):
    family = "distilbert"
    model_types = ("distilbert",)
    causal = False

    def layers(self, base_model: Any) -> list[LayerHandles]:
        return [
            LayerHandles(attention=layer.attention, out_proj=layer.attention.out_lin)
            for layer in base_model.transformer.layer
        ]

    def prune_layer(
        self, base_model: Any, layer: int, keep: list[int], keep_kv: list[int], head_dim: int
    ) -> None:
        attention = base_model.transformer.layer[layer].attention
        rows = head_rows(keep, head_dim)
        attention.q_lin = linear_rows(attention.q_lin, rows)
        attention.k_lin = linear_rows(attention.k_lin, rows)
        attention.v_lin = linear_rows(attention.v_lin, rows)
        attention.out_lin = linear_columns(attention.out_lin, rows)
        attention.n_heads = len(keep)
