"""headlab's entry in transformers' ``AttentionInterface``: sdpa, observed.

transformers 5 routes the attention of every modern model through one registry. The function
registered here receives what sdpa receives (queries after rotary embeddings ``(B, H, T, D)``,
keys and values before GQA expansion ``(B, Hkv, S, D)``, the mask, the scaling), hands them to
whoever observes that module, then calls transformers' own sdpa function unchanged: outputs stay
bit-identical to the default attention. One observer per module may instead compute the output
itself (:mod:`headlab.models.streaming`): observers compose (a :class:`HeadCapture` inside a
:class:`StreamingAttention`, or one capture inside another, all see every call), and a second
observer that would also compute the output is refused. The matching mask function (sdpa's) is
registered under the same name, or padding would be ignored.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from headlab.errors import InputError, UnsupportedModelError

ATTN_IMPLEMENTATION = "headlab_sdpa"
#: the same, for models transformers runs only eagerly (``_supports_sdpa = False``: Gemma 2's
#: soft-capping): the call goes on to the model's own eager function instead of sdpa
EAGER_IMPLEMENTATION = "headlab_eager"

#: module id -> observer called with (module, query, key, value, attention_mask, kwargs); an
#: observer that returns a tensor ``(B, T, H, D)`` has computed the attention output itself
Observer = Callable[
    [nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, Any, dict[str, Any]],
    torch.Tensor | None,
]
#: module id -> its observers in the order they came, each with whether it computes the output
_OBSERVERS: dict[int, list[tuple[Observer, bool]]] = {}
#: functions called with (module, query, key, value, output) after every attention call, for
#: :mod:`headlab.models.discovery`'s traced forward pass
_TRACERS: list[Callable[..., None]] = []
_REGISTERED = False


def _eager_of(module: nn.Module) -> Callable[..., Any]:
    """The module's own ``eager_attention_forward`` (what transformers runs by default for a
    model without sdpa support)."""

    found = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if found is None:
        raise UnsupportedModelError(
            f"{type(module).__name__} runs eager attention only and its module has no "
            "eager_attention_forward for headlab to call"
        )
    return found  # type: ignore[no-any-return]


def _observed_eager(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    return _observed_sdpa(module, query, key, value, attention_mask, _eager=True, **kwargs)


def _observed_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    _eager: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    observers = _OBSERVERS.get(id(module), [])
    computing = None
    for observer, computes in list(observers):  # the one that computes the output comes last
        if computes:
            computing = observer
        else:
            observer(module, query, key, value, attention_mask, kwargs)
    if computing is not None:
        output = computing(module, query, key, value, attention_mask, kwargs)
        if output is not None:
            return output, None
    forward = _eager_of(module) if _eager else sdpa_attention_forward
    result = forward(module, query, key, value, attention_mask, **kwargs)
    for tracer in list(_TRACERS):
        tracer(module, query, key, value, result[0])
    return result


def implementation_for(model_class: Any) -> str:
    """headlab's attention function for a model class: sdpa wrapped, or the model's own eager
    function wrapped where transformers refuses sdpa for it."""
    return (
        ATTN_IMPLEMENTATION
        if getattr(model_class, "_supports_sdpa", True)
        else EAGER_IMPLEMENTATION
    )


def register() -> None:
    """Register the observed sdpa attention and its mask function with transformers (once)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, _observed_sdpa)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    AttentionInterface.register(EAGER_IMPLEMENTATION, _observed_eager)
    AttentionMaskInterface.register(EAGER_IMPLEMENTATION, eager_mask)
    _REGISTERED = True


def call_rules(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    mask: Any,
    kwargs: dict[str, Any],
) -> tuple[bool, float]:
    """Whether an attention call is causal, and its scaling, by transformers' sdpa rules: causal
    when the module (or the call) says so and more than one query comes, without a mask or with
    as many keys as queries (a causal model's own mask then implies the triangle, so it may be
    applied on top, and blocks of rows skip the keys they cannot see); the scaling given, else
    ``1 / sqrt(D)``. Every observer reads a call through this one rule."""
    flag = kwargs.get("is_causal")
    flag = getattr(module, "is_causal", True) if flag is None else flag
    n_queries, n_keys = query.shape[2], key.shape[2]
    has_mask = isinstance(mask, torch.Tensor)
    causal = bool(flag) and n_queries > 1 and (not has_mask or n_keys == n_queries)
    scaling = kwargs.get("scaling")
    return causal, float(scaling) if scaling is not None else query.shape[-1] ** -0.5


def per_call(functions: list[Callable[..., Any]]) -> Callable[..., Any]:
    """One function for a module that serves several layers (ALBERT shares one attention module
    across all its layers): its ``i``-th call in a forward pass goes to ``functions[i]``."""
    if len(functions) == 1:
        return functions[0]
    count = [0]

    def dispatch(*args: Any) -> Any:
        fn = functions[count[0] % len(functions)]
        count[0] += 1
        return fn(*args)

    return dispatch


def by_module(modules: list[nn.Module]) -> list[tuple[nn.Module, list[int]]]:
    """The distinct modules of a layer list, each with the layers (in order) it serves."""
    groups: dict[int, tuple[nn.Module, list[int]]] = {}
    for layer, module in enumerate(modules):
        groups.setdefault(id(module), (module, []))[1].append(layer)
    return list(groups.values())


def trace(tracer: Callable[..., None]) -> Callable[[], None]:
    """Call ``tracer(module, query, key, value, output)`` after every attention call of every
    module; returns the function that stops it."""
    _TRACERS.append(tracer)
    return lambda: _TRACERS.remove(tracer) if tracer in _TRACERS else None


def observe(
    module: nn.Module, observer: Observer, *, computes_output: bool = False
) -> Callable[[], None]:
    """Call ``observer`` on every attention call of ``module``; returns the function that stops
    it. Observers of one module compose: all are called, those that only look first; at most
    one may compute the output (``computes_output``), a second is refused."""
    observers = _OBSERVERS.setdefault(id(module), [])
    if computes_output and any(computes for _, computes in observers):
        raise InputError(
            "expected at most one headlab context computing this attention layer's output "
            f"({type(module).__name__}), got a second (nested StreamingAttention?)"
        )
    entry = (observer, computes_output)
    observers.append(entry)

    def remove() -> None:
        current = _OBSERVERS.get(id(module))
        if current is not None and entry in current:
            current.remove(entry)
            if not current:
                del _OBSERVERS[id(module)]

    return remove


def base_attention(module: nn.Module, *, eager: bool) -> Callable[..., Any]:
    """The attention function headlab's own calls on to for ``module``: transformers' sdpa,
    or the module's eager function where the model runs eagerly only."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return _eager_of(module) if eager else sdpa_attention_forward
