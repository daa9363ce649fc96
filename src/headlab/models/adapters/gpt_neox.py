"""GPT-NeoX (Pythia): one fused ``query_key_value`` projection whose rows interleave heads, and
partial rotary embeddings (``rotary_pct``). ``layers[i].attention`` calls the interface and owns
``dense``, the output projection."""

from __future__ import annotations

from typing import Any

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
