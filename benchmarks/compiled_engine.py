"""One block of attention rows and its statistics in one ``torch.compile``d function: the
compiled engine that ``benchmarks/engine.py`` measures against headlab's native kernels and
torch's ops (the measured losers stay here, out of the package: see RESULTS.md).

:func:`block_statistics` computes, for a block of query rows, what every head probe needs: the
scores ``q k^T`` scaled, right padding and the causal triangle, the softmax in float32, each
row's largest weight and entropy, the attention-weighted sums of a few per-key columns, and the
values' product. It is plain torch, so the same source runs anywhere torch runs; on first use
for a kind of input it is compiled with ``torch.compile`` (inductor: vectorized C++ on the CPU,
Triton on a GPU), which fuses the masks, the softmax and both statistics into one pass over the
scores. When compilation is unavailable (no C++ compiler, an unsupported platform, an inductor
error) the same function runs eagerly and :func:`why_not` says why (also logged once).

Conventions: key ``j`` is visible to a row at position ``p`` (in key coordinates: a causal
model's query ``i`` sits at ``i + S - T``) when ``j < lengths[b]`` and, when causal, ``j <= p``.
A row that sees no key gets uniform weights over the block's keys and entropy ``log s`` (only
padding rows can; callers do not count them).

Shape vocabulary: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``t`` rows in the
block, ``s`` keys the block sees, ``D`` head width, ``X`` per-key columns.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headlab.errors import ShapeError

logger = logging.getLogger(__name__)

#: masked scores: large and finite, so that a row with no visible key gives no NaN
MASKED = -1e30

_lock = threading.Lock()
#: compiled functions by (device type, query dtype, value dtype, with columns)
_compiled: dict[tuple[str, torch.dtype, torch.dtype, bool], Callable[..., Any]] = {}
_failed: dict[str, str] = {}


@dataclass(frozen=True)
class BlockStatistics:
    """One block's attention: ``weights (B, H, t, s)`` float32, each row's largest weight
    ``top`` and entropy in nats ``entropy (B, H, t)`` float32, ``mixed (B, H, t, X)`` float32
    (the weighted sums of the columns, ``None`` without columns) and ``product (B, H, t, D)``
    (the weights times the values, in the values' dtype)."""

    weights: torch.Tensor
    top: torch.Tensor
    entropy: torch.Tensor
    mixed: torch.Tensor | None
    product: torch.Tensor


def _statistics(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    lengths: torch.Tensor,
    rows: torch.Tensor,
    columns: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The block's arithmetic in plain torch (compiled by :func:`block_statistics`)."""
    n_batch, n_heads, t, d = query.shape
    n_kv, s = key.shape[1], key.shape[2]
    group = n_heads // n_kv
    q = query.reshape(n_batch, n_kv, group * t, d)  # (B, Hkv, g t, D): a group's heads stacked
    scores = torch.matmul(q, key.transpose(-2, -1)).float() * scale  # (B, Hkv, g t, s)
    scores = scores.view(n_batch, n_heads, t, s)  # (B, H, t, s)
    positions = torch.arange(s, device=query.device)  # (s,)
    visible = (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, s)
    visible = visible & (positions[None, :] <= rows[:, None])  # (B, 1, t, s)
    scores = scores.masked_fill(~visible, MASKED)
    shifted = scores - scores.amax(dim=-1, keepdim=True)  # (B, H, t, s), each row's max at 0
    exp = shifted.exp()
    total = exp.sum(dim=-1, keepdim=True)  # (B, H, t, 1), >= 1
    weights = exp / total  # (B, H, t, s)
    top = total.reciprocal().squeeze(-1)  # the largest weight: exp(0) / total
    entropy = total.log().squeeze(-1) - (weights * shifted).sum(dim=-1)  # (B, H, t)
    mixed = None
    if columns is not None:
        flat = weights.view(n_batch, n_heads * t, s)
        mixed = torch.bmm(flat, columns.float()).view(n_batch, n_heads, t, -1)  # (B, H, t, X)
    mixed_w = weights.to(value.dtype).view(n_batch, n_kv, group * t, s)
    product = torch.matmul(mixed_w, value).view(n_batch, n_heads, t, d)  # (B, H, t, D)
    return weights, top, entropy, mixed, product


def _compile_disabled() -> str:
    """Why compilation is off by choice (``HEADLAB_COMPILE=0``), else empty."""
    if os.environ.get("HEADLAB_COMPILE", "1") == "0":
        return "HEADLAB_COMPILE=0"
    return ""


def why_not(device_type: str = "cpu") -> str:
    """Why :func:`block_statistics` runs eagerly on this kind of device (empty when it has
    not failed to compile there and compilation is not turned off)."""
    return _compile_disabled() or _failed.get(device_type, "")


def reset() -> None:
    """Forget the compiled functions and past failures (tests)."""
    with _lock:
        _compiled.clear()
        _failed.clear()


def _function(
    device_type: str, dtype: torch.dtype, value_dtype: torch.dtype, with_columns: bool
) -> Callable[..., Any] | None:
    """The compiled function for this kind of input (made lazily), or ``None`` (eager)."""
    if _compile_disabled() or device_type in _failed:
        return None
    key = (device_type, dtype, value_dtype, with_columns)
    with _lock:
        fn = _compiled.get(key)
        if fn is None:
            # block shapes change (the last block of a layer, the keys of causal blocks):
            # dynamo's automatic dynamic shapes compile a second, shape-generic version then
            fn = _compiled[key] = torch.compile(_statistics, fullgraph=True)
    return fn


def block_statistics(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    scale: float,
    rows: torch.Tensor,
    lengths: torch.Tensor | None = None,
    columns: torch.Tensor | None = None,
    compiled: bool = True,
) -> BlockStatistics:
    """Attention weights and statistics of one block of query rows.

    Args:
        query: ``(B, H, t, D)``, the block's rows.
        key, value: ``(B, Hkv, s, D)``, the keys the block sees; ``H`` a multiple of ``Hkv``.
        scale: the factor on ``q k^T``.
        rows: ``(t,)`` int64, each row's position in key coordinates: row ``i`` sees keys
            ``j <= rows[i]`` (causal); give ``s - 1`` (or more) everywhere for no triangle.
        lengths: ``(B,)`` int64, each sentence's number of keys (right padding); all keys
            when ``None``.
        columns: ``(B, s, X)`` per-key values whose weighted sums each row gets.
        compiled: use the compiled function (else, or when compiling fails, eager torch).

    The scores are computed in the query's dtype and the softmax in float32.
    """
    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape:
        raise ShapeError(
            "block_statistics expects query (B, H, t, D) and key, value (B, Hkv, s, D), got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    n_batch, n_heads, t, d = query.shape
    if key.shape[0] != n_batch or key.shape[3] != d or n_heads % key.shape[1]:
        raise ShapeError(
            f"block_statistics: keys {tuple(key.shape)} do not fit queries {tuple(query.shape)}"
        )
    if rows.shape != (t,):
        raise ShapeError(f"block_statistics: rows must be ({t},), got {tuple(rows.shape)}")
    if lengths is None:
        lengths = torch.full((n_batch,), key.shape[2], dtype=torch.long, device=query.device)
    args = (query, key.to(query.dtype), value, lengths, rows, columns, float(scale))
    fn = _function(query.device.type, query.dtype, value.dtype, columns is not None)
    if compiled and fn is not None:
        try:
            return BlockStatistics(*fn(*args))
        except Exception as err:  # inductor or a missing compiler: keep the eager path
            first = (str(err).strip().splitlines() or ["no message"])[0]
            reason = f"torch.compile failed ({type(err).__name__}: {first})"
            with _lock:
                _failed.setdefault(query.device.type, reason)
            logger.warning("headlab: block statistics run without compilation: %s", reason)
    return BlockStatistics(*_statistics(*args))
