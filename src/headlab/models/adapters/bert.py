"""BERT family: BERT, RoBERTa, XLM-R, MiniLM (all-MiniLM-L6-v2 is a BertModel).

Each ``encoder.layer[i].attention`` holds ``self`` (queries, keys, values; calls the attention
interface) and ``output.dense`` (the output projection), followed by a residual LayerNorm.
"""

from __future__ import annotations

from typing import Any

from headlab.attention.surgery import head_rows, linear_columns, linear_rows
from headlab.models.adapters.base import Adapter, LayerHandles


class BertAdapter(Adapter):
    family = "bert"
    model_types = ("bert", "roberta", "xlm-roberta", "camembert")
    causal = False

    def layers(self, base_model: Any) -> list[LayerHandles]:
        return [
            LayerHandles(attention=layer.attention.self, out_proj=layer.attention.output.dense)
            for layer in base_model.encoder.layer
        ]

    def reserved_positions(self, config: Any) -> int:
        # RoBERTa-style models number positions from pad_token_id + 1
        if config.model_type == "bert":
            return 0
        pad = getattr(config, "pad_token_id", None)
        return 0 if pad is None else pad + 1

    def prune_layer(
        self, base_model: Any, layer: int, keep: list[int], keep_kv: list[int], head_dim: int
    ) -> None:
        attention = base_model.encoder.layer[layer].attention
        heads = attention.self
        rows = head_rows(keep, head_dim)
        heads.query = linear_rows(heads.query, rows)
        heads.key = linear_rows(heads.key, rows)
        heads.value = linear_rows(heads.value, rows)
        attention.output.dense = linear_columns(attention.output.dense, rows)
        heads.num_attention_heads = len(keep)
        heads.all_head_size = len(keep) * head_dim
