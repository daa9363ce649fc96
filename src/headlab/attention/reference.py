"""The lesson in code: multi-head attention in plain NumPy, one head at a time.

Nothing here is fast; everything here is explicit. Read it top to bottom next to the paper
(Vaswani et al. 2017, section 3.2). One sequence at a time, no batch dimension.

Shapes in this file (single sequence): ``x_q (T, E)``, ``x_kv (S, E)``, per-head weights
``(E, D)``, per-head pattern ``(T, S)``, per-head output ``(T, D)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from headlab.errors import ConfigError, MaskError, ShapeError

if TYPE_CHECKING:
    from headlab.attention.module import MultiHeadAttention


@dataclass(frozen=True, kw_only=True)
class HeadWeights:
    """Every head's own weights, stored per head so that the lesson can read them one by one.

    Attributes:
        w_q: ``(H, E, D)`` query weights of each query head.
        w_k: ``(Hkv, E, D)`` key weights of each key/value head.
        w_v: ``(Hkv, E, D)`` value weights of each key/value head.
        b_q, b_k, b_v: ``(H, D)``, ``(Hkv, D)``, ``(Hkv, D)`` biases.
        w_o: ``(H, D, E)`` the rows of the output projection that read each head.
        b_o: ``(E,)`` the output projection's bias.
    """

    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    b_q: np.ndarray
    b_k: np.ndarray
    b_v: np.ndarray
    w_o: np.ndarray
    b_o: np.ndarray

    def __post_init__(self) -> None:
        n_heads, d_model, head_dim = self.w_q.shape
        n_kv = self.w_k.shape[0]
        if n_heads % n_kv:
            raise ConfigError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv})")
        if self.w_o.shape != (n_heads, head_dim, d_model):
            raise ShapeError(
                f"w_o must have shape (H, D, E)={(n_heads, head_dim, d_model)}, "
                f"got {self.w_o.shape}"
            )

    @classmethod
    def from_module(cls, module: MultiHeadAttention) -> HeadWeights:
        """Copy a :class:`MultiHeadAttention`'s weights into per-head float64 arrays."""
        h, hkv, d, e = module.n_heads, module.n_kv_heads, module.head_dim, module.d_model
        w = module.in_proj.weight.detach().cpu().double().numpy()  # ((H + 2 Hkv) D, E)
        zeros = np.zeros(w.shape[0])
        b = (
            module.in_proj.bias.detach().cpu().double().numpy()
            if module.in_proj.bias is not None
            else zeros
        )
        q_end, k_end = h * d, (h + hkv) * d
        # nn.Linear computes x @ W.T, so head i's (E, D) matrix is the transpose of its D rows.
        w_q = w[:q_end].reshape(h, d, e).transpose(0, 2, 1)
        w_k = w[q_end:k_end].reshape(hkv, d, e).transpose(0, 2, 1)
        w_v = w[k_end:].reshape(hkv, d, e).transpose(0, 2, 1)
        w_o_full = module.out_proj.weight.detach().cpu().double().numpy()  # (E, H D)
        b_o = (
            module.out_proj.bias.detach().cpu().double().numpy()
            if module.out_proj.bias is not None
            else np.zeros(e)
        )
        return cls(
            w_q=w_q,
            w_k=w_k,
            w_v=w_v,
            b_q=b[:q_end].reshape(h, d),
            b_k=b[q_end:k_end].reshape(hkv, d),
            b_v=b[k_end:].reshape(hkv, d),
            w_o=w_o_full.T.reshape(h, d, e),
            b_o=b_o,
        )


@dataclass(frozen=True, kw_only=True)
class ReferenceResult:
    """Output of :func:`reference_attention` for one sequence.

    Attributes:
        output: ``(T, E)``.
        weights: ``(H, T, S)`` attention pattern of every head.
        head_outputs: ``(H, T, D)`` every head's output before concatenation.
        contributions: ``(H, T, E)`` every head's share of the output.
    """

    output: np.ndarray
    weights: np.ndarray
    head_outputs: np.ndarray
    contributions: np.ndarray


def softmax_row(scores: np.ndarray) -> np.ndarray:
    """Softmax of one row of scores, where ``-inf`` marks a masked key.

    A row with every key masked has nothing to attend: headlab defines its weights as zeros.
    """
    if np.all(np.isneginf(scores)):
        return np.zeros_like(scores)
    shifted = scores - np.max(scores)  # subtracting the max changes nothing but avoids overflow
    exp = np.exp(shifted)  # exp(-inf) = 0: masked keys get no weight
    return exp / exp.sum()  # the weights of a row sum to 1


def reference_attention(
    x_q: np.ndarray,
    x_kv: np.ndarray | None,
    weights: HeadWeights,
    *,
    mask: np.ndarray | None = None,
) -> ReferenceResult:
    """Multi-head attention for one sequence, written as the lesson explains it.

    Args:
        x_q: ``(T, E)`` the positions that ask (queries).
        x_kv: ``(S, E)`` the positions that answer (keys and values); ``None`` for self-attention.
        weights: every head's weights (:class:`HeadWeights`).
        mask: boolean ``(T, S)`` (or ``(H, T, S)``), True where a query may attend a key.
    """
    x_kv = x_q if x_kv is None else x_kv
    n_heads, d_model, head_dim = weights.w_q.shape
    n_kv_heads = weights.w_k.shape[0]
    group = n_heads // n_kv_heads  # query heads that share one key/value head
    n_q, n_k = x_q.shape[0], x_kv.shape[0]
    if x_q.shape[1] != d_model or x_kv.shape[1] != d_model:
        raise ShapeError(f"inputs must have E={d_model} columns, got {x_q.shape} and {x_kv.shape}")
    if mask is not None:
        if mask.dtype != np.bool_:
            raise MaskError(f"mask must be boolean (True = may attend), got {mask.dtype}")
        if mask.shape not in ((n_q, n_k), (n_heads, n_q, n_k)):
            raise MaskError(f"mask must have shape (T, S)={(n_q, n_k)}, got {mask.shape}")

    pattern = np.zeros((n_heads, n_q, n_k))
    head_out = np.zeros((n_heads, n_q, head_dim))
    contributions = np.zeros((n_heads, n_q, d_model))
    for h in range(n_heads):
        kv = h // group  # the key/value head this query head reads (GQA; kv == h for MHA)

        # 1. Each head has its OWN projections: the same input, seen through different weights.
        q = x_q @ weights.w_q[h] + weights.b_q[h]  # (T, D): what each position looks for
        k = x_kv @ weights.w_k[kv] + weights.b_k[kv]  # (S, D): what each position offers
        v = x_kv @ weights.w_v[kv] + weights.b_v[kv]  # (S, D): what each position passes on

        # 2. Scores: how well each query matches each key, scaled by 1/sqrt(D) so that the
        #    dot products of wide heads do not push softmax into saturation.
        scores = np.zeros((n_q, n_k))
        for i in range(n_q):
            for j in range(n_k):
                scores[i, j] = np.dot(q[i], k[j]) / np.sqrt(head_dim)
                allowed = (
                    True if mask is None else bool(mask[i, j] if mask.ndim == 2 else mask[h, i, j])
                )
                if not allowed:
                    scores[i, j] = -np.inf  # a masked key can receive no attention

        # 3. Softmax per query row: one budget of weight, summing to 1, spread over the keys.
        for i in range(n_q):
            pattern[h, i] = softmax_row(scores[i])

        # 4. The head's output: for each query, the weighted average of the values.
        head_out[h] = pattern[h] @ v  # (T, D)

        # 5. What this head adds to the final output: its D columns of the output projection.
        contributions[h] = head_out[h] @ weights.w_o[h]  # (T, E)

    # 6. Concatenate the heads side by side (T, H*D) and mix them with the output projection.
    #    Doing that in one matrix product is the same as summing every head's contribution.
    concat = np.concatenate([head_out[h] for h in range(n_heads)], axis=1)  # (T, H D)
    w_o_full = weights.w_o.reshape(n_heads * head_dim, d_model)  # (H D, E)
    output = concat @ w_o_full + weights.b_o  # (T, E)
    return ReferenceResult(
        output=output, weights=pattern, head_outputs=head_out, contributions=contributions
    )
