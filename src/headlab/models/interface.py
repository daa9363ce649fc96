"""headlab's entry in transformers' ``AttentionInterface``: sdpa, observed.

transformers 5 routes the attention of every modern model through one registry. The function
registered here receives what sdpa receives (queries after rotary embeddings ``(B, H, T, D)``,
keys and values before GQA expansion ``(B, Hkv, S, D)``, the mask, the scaling), hands them to
whoever observes that module, then calls transformers' own sdpa function unchanged: outputs stay
bit-identical to the default attention. An observer may instead compute the output itself
(:mod:`headlab.models.streaming`). The matching mask function (sdpa's) is registered under
the same name, or padding would be ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

ATTN_IMPLEMENTATION = "headlab_sdpa"

#: module id -> observer called with (module, query, key, value, attention_mask, kwargs); an
#: observer that returns a tensor ``(B, T, H, D)`` has computed the attention output itself
Observer = Callable[
    [nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, Any, dict[str, Any]],
    torch.Tensor | None,
]
_OBSERVERS: dict[int, Observer] = {}
_REGISTERED = False


def _observed_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    observer = _OBSERVERS.get(id(module))
    if observer is not None:
        output = observer(module, query, key, value, attention_mask, kwargs)
        if output is not None:
            return output, None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> None:
    """Register the observed sdpa attention and its mask function with transformers (once)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, _observed_sdpa)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    _REGISTERED = True


def observe(module: nn.Module, observer: Observer) -> Callable[[], None]:
    """Call ``observer`` on every attention call of ``module``; returns the function that stops it."""
    _OBSERVERS[id(module)] = observer

    def remove() -> None:
        if _OBSERVERS.get(id(module)) is observer:
            del _OBSERVERS[id(module)]

    return remove
