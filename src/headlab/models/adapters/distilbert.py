"""DistilBERT: ``transformer.layer[i].attention`` computes the heads and owns ``out_lin``."""

from __future__ import annotations

from typing import Any

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
