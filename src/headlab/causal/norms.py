"""Norms with their scale frozen: the map a LayerNorm or an RMSNorm computes, made linear by
taking the per-row divisor from the rows it normalised in a given run (direct logit
attribution's final norm, a post-norm block's norm on the attention's output).

A norm's formula is recognised from what it computed, ``y`` from ``x``: RMSNorm
(``x / rms(x) * g``; Gemma's ``* (1 + g)``) or LayerNorm (``(x - mean(x)) / std(x) * g + b``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from headlab.errors import InputError


def _candidates(norm: nn.Module) -> list[tuple[str, Callable[[torch.Tensor, torch.Tensor], Any]]]:
    """The frozen-scale maps a norm may be: ``f(v, x) -> (linear part of v, bias)`` with
    the scale taken from ``x`` (the rows the norm normalised)."""
    weight = getattr(norm, "weight", None)
    bias = getattr(norm, "bias", None)
    eps_values = [
        float(e)
        for e in (getattr(norm, "eps", None), getattr(norm, "variance_epsilon", None))
        if isinstance(e, int | float)
    ] or [1e-5, 1e-6]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return []
    g = weight.detach().double()
    b = None if not isinstance(bias, torch.Tensor) else bias.detach().double()
    out: list[tuple[str, Callable[[torch.Tensor, torch.Tensor], Any]]] = []
    for eps in eps_values:

        def rms(v: torch.Tensor, x: torch.Tensor, eps: float = eps) -> Any:
            scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            return v / scale * g, None

        def rms_one(v: torch.Tensor, x: torch.Tensor, eps: float = eps) -> Any:
            scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            return v / scale * (1.0 + g), None

        def layer(v: torch.Tensor, x: torch.Tensor, eps: float = eps) -> Any:
            scale = (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
            return (v - v.mean(-1, keepdim=True)) / scale * g, b

        out += [("rmsnorm", rms), ("rmsnorm (1 + g)", rms_one), ("layernorm", layer)]
    return out


def recognise_norm(
    norm: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    needs: str = "direct logit attribution needs the final norm",
) -> tuple[str, Callable[..., Any]]:
    """The candidate that reproduces what the norm computed, ``y`` from ``x`` ``(R, E)``:
    its name and its frozen-scale map ``f(v, x) -> (linear part of v, bias or None)``.

    Raises:
        InputError: no candidate does; ``needs`` opens the message (who needs the norm).
    """
    for name, fn in _candidates(norm):
        linear, bias = fn(x, x)
        got = linear if bias is None else linear + bias
        if torch.allclose(got, y, atol=1e-4 * (1.0 + float(y.abs().max())), rtol=1e-4):
            return name, fn
    raise InputError(
        f"{needs} to be a LayerNorm or an RMSNorm; {type(norm).__name__} computes something else"
    )


def gain(norm: nn.Module, kind: str) -> torch.Tensor | None:
    """The per-feature gain ``(E,)`` of a norm whose formula is ``kind`` (as
    :func:`recognise_norm` names it): its weight, or ``1 + weight`` for Gemma's RMSNorm;
    ``None`` where it has no weight."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    return 1.0 + weight.detach() if kind == "rmsnorm (1 + g)" else weight.detach()
