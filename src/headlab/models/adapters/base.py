"""What an adapter tells headlab about one model family.

Shared code never asks which architecture it is looking at: it asks the adapter for the layers'
attention modules (the modules that call Hugging Face's attention interface) and their output
projections (whose input is the concatenation of the head outputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headlab.errors import UnsupportedModelError


@dataclass(frozen=True, kw_only=True)
class LayerHandles:
    """The two modules of one layer that headlab hooks.

    Attributes:
        attention: the module passed as ``module`` to the attention function.
        out_proj: the output projection; its input ``(B, T, H*D)`` is the concatenated heads.
    """

    attention: nn.Module
    out_proj: nn.Module


class Adapter:
    """Base class of the per-family adapters. Subclasses set the class attributes and paths."""

    #: short family name shown to users
    family: str = ""
    #: Hugging Face ``model_type`` values this adapter serves
    model_types: tuple[str, ...] = ()
    #: whether the family is a causal (decoder-only) language model
    causal: bool = False

    def layers(self, base_model: Any) -> list[LayerHandles]:
        """Handles of every layer, in order, from the family's base model."""
        raise NotImplementedError

    def reserved_positions(self, config: Any) -> int:
        """Position slots the family uses for something other than tokens (0 for most)."""
        return 0

    def prune_layer(
        self, base_model: Any, layer: int, keep: list[int], keep_kv: list[int], head_dim: int
    ) -> None:
        """Rewrite layer ``layer`` in place so that only query heads ``keep`` and KV heads
        ``keep_kv`` remain (indices into the layer's current heads, already validated)."""
        raise UnsupportedModelError(f"physical pruning is not implemented for {self.family} models")

    def native_config(
        self, config: dict[str, Any], heads: list[int], kv_heads: list[int], head_dim: int
    ) -> dict[str, Any] | None:
        """The family's own config for a pruned model, when it can express one (else None)."""
        return None

    def out_proj_weight(self, out_proj: nn.Module) -> torch.Tensor:
        """The output projection as an ``(E, H*D)`` matrix (``y = W x + b``)."""
        weight = out_proj.weight
        if not isinstance(weight, torch.Tensor):
            raise TypeError("output projection has no weight tensor")
        return weight

    def out_proj_bias(self, out_proj: nn.Module) -> torch.Tensor | None:
        """The output projection's bias ``(E,)``, if any."""
        bias = getattr(out_proj, "bias", None)
        return bias if isinstance(bias, torch.Tensor) else None
