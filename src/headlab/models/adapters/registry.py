"""The :class:`~headlab.models.adapters.base.Adapter` of an opened model, found by discovery
(:func:`adapter_for`)."""

from __future__ import annotations

from typing import Any

import torch

from headlab.models.adapters.base import Adapter
from headlab.models.discovery import discover, dummy_inputs


def adapter_for(model: Any, inputs: dict[str, torch.Tensor] | None = None) -> Adapter:
    """Discover the attention layers of ``model`` (already switched to headlab's attention
    function) with one short traced forward pass.

    Raises:
        UnsupportedModelError: the model's attention does not reach transformers' attention
            interface, or a layer's output projection cannot be found (one line, naming what
            was looked for).
    """
    config = model.config
    family = str(getattr(config, "model_type", None) or "unknown")
    inputs = dummy_inputs(model) if inputs is None else inputs
    handles = discover(model, inputs)
    counts = [h.counts for h in handles]
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    causal = not encoder_decoder and all(
        bool(getattr(h.attention, "is_causal", False)) for h in handles
    )
    return Adapter(model, family, handles, counts, causal)
