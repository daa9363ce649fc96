"""GPT-2: ``h[i].attn`` computes the heads; ``c_proj`` is a ``Conv1D`` whose weight is stored
transposed, ``(in, out) = (H*D, E)``, so it is turned around here."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headlab.attention.surgery import head_rows
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

    @torch.no_grad()
    def prune_layer(
        self, base_model: Any, layer: int, keep: list[int], keep_kv: list[int], head_dim: int
    ) -> None:
        from transformers.pytorch_utils import Conv1D

        attention = base_model.h[layer].attn
        split = attention.split_size  # current H*D: c_attn's outputs are [q | k | v]
        rows = head_rows(keep, head_dim)
        cols = torch.cat([rows, rows + split, rows + 2 * split])
        c_attn, c_proj = attention.c_attn, attention.c_proj
        new_attn = Conv1D(cols.numel(), c_attn.weight.shape[0]).to(c_attn.weight)
        new_attn.weight.copy_(c_attn.weight[:, cols])  # Conv1D weight is (in, out)
        new_attn.bias.copy_(c_attn.bias[cols])
        new_proj = Conv1D(c_proj.weight.shape[1], rows.numel()).to(c_proj.weight)
        new_proj.weight.copy_(c_proj.weight[rows])
        new_proj.bias.copy_(c_proj.bias)
        attention.c_attn, attention.c_proj = new_attn, new_proj
        attention.num_heads = len(keep)
        attention.split_size = len(keep) * head_dim
