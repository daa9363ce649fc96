"""GPT-2: ``h[i].attn`` computes the heads; ``c_proj`` is a ``Conv1D`` whose weight is stored
transposed, ``(in, out) = (H*D, E)``, so it is turned around here."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headlab.models.adapters.base import Adapter, LayerHandles


class GPT2Adapter(Adapter):
    family = "gpt2"
    model_types = ("gpt2",)
    causal = True

    def layers(self, base_model: Any) -> list[LayerHandles]:
        return [
            LayerHandles(attention=block.attn, out_proj=block.attn.c_proj) for block in base_model.h
        ]

    def out_proj_weight(self, out_proj: nn.Module) -> torch.Tensor:
        weight = out_proj.weight
        if not isinstance(weight, torch.Tensor):
            raise TypeError("GPT-2 c_proj has no weight tensor")
        return weight.t()  # Conv1D keeps (H*D, E)
