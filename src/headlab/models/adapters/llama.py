"""Llama family with grouped-query attention: Llama, Mistral, Qwen2, Qwen3, Phi-3.

``layers[i].self_attn`` applies rotary embeddings to queries and keys before calling the
attention interface (so captured queries and keys are post-rotary) and owns ``o_proj``.
"""

from __future__ import annotations

from typing import Any

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
