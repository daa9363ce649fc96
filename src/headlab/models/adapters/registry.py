"""The :class:`~headlab.models.adapters.base.Adapter` of an opened model, found by discovery
(:func:`adapter_for`), and the one seam for a family whose attention bypasses transformers'
attention interface: its *shim* (:func:`register_shim`).

headlab opens a model by routing its attention through transformers' ``AttentionInterface``
(:mod:`headlab.models.interface`), where capture, ablation and patching see every head, and by
discovering the projections around each call (:mod:`headlab.models.discovery`). A family whose
attention modules compute attention themselves (in transformers 5: BLOOM, DeBERTa-v2, MPNet) is
refused in one line, unless a shim is registered for its ``model_type``. A shim rewires one
opened model in place so that each attention module hands its queries ``(B, H, T, D)``, keys and
values ``(B, Hkv, S, D)`` and additive or boolean mask to :func:`interface_attention`, then
applies its own output projection to the result; from there on the family is like any other
(discovery, capture, ablation, patching, roles). A shim:

- replaces the ``forward`` of the family's attention *instances* (never the class: other
  models of the family outside headlab stay as transformers made them);
- computes exactly what the module computed (up to float rounding), which its test checks
  against the model's own output;
- says in its docstring why the family needs it (what bypasses the interface).

Example (a test's toy registration: tests/models/test_shims.py)::

    register_shim("mpnet", route_mpnet)   # every MPNetSelfAttention calls interface_attention
    lm = load("path/to/mpnet")            # refused before: now captured like BERT
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from headlab.errors import InputError
from headlab.models.adapters.base import Adapter
from headlab.models.discovery import discover, dummy_inputs
from headlab.models.interface import ATTN_IMPLEMENTATION, register

#: a family's shim: rewires one opened model in place (see the module's docstring)
Shim = Callable[[nn.Module], None]
#: model_type -> its shim; filled by :func:`register_shim` only
_SHIMS: dict[str, Shim] = {}


def register_shim(model_type: str, shim: Shim) -> None:
    """Open models of ``model_type`` through ``shim`` from now on.

    Raises:
        InputError: another shim is registered for ``model_type`` already.
    """
    known = _SHIMS.get(model_type)
    if known is not None and known is not shim:
        raise InputError(f"model type {model_type!r} has a shim already: {known.__name__}")
    _SHIMS[model_type] = shim


def unregister_shim(model_type: str) -> None:
    """Forget the shim of ``model_type`` (models of it are refused again)."""
    _SHIMS.pop(model_type, None)


def shim_for(model_type: str | None) -> Shim | None:
    """The shim registered for ``model_type``, or ``None``."""
    return None if model_type is None else _SHIMS.get(model_type)


def interface_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scaling: float,
) -> torch.Tensor:
    """What a shimmed attention module calls instead of its own softmax: headlab's attention
    function, as transformers would call it, without dropout (headlab runs models in eval).

    Shape:
        query ``(B, H, T, D)``, key and value ``(B, Hkv, S, D)``, mask broadcastable to
        ``(B, H, T, S)`` (additive float, or boolean True = may attend); returns the heads'
        outputs ``(B, T, H, D)``, the input of the module's output projection once flattened.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    register()
    output, _ = ALL_ATTENTION_FUNCTIONS[ATTN_IMPLEMENTATION](
        module, query, key, value, mask, dropout=0.0, scaling=scaling
    )
    return output  # type: ignore[no-any-return]


def adapter_for(model: Any, inputs: dict[str, torch.Tensor] | None = None) -> Adapter:
    """Discover the attention layers of ``model`` (already switched to headlab's attention
    function, or shimmed) with one short traced forward pass.

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
