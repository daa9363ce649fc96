"""The native kernels as Python functions: each checks its tensors (CPU, contiguous rows,
float32), passes their addresses and sizes to the library that :func:`headlab.native.kernels`
loaded, and splits the work with :func:`headlab.native.parallel`. Build, cache and load live in
``headlab.native`` itself; only :mod:`headlab.attention.blocks` calls these.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headlab.native.build import kernels, parallel


def pointer(t: torch.Tensor) -> int:
    """The address of a contiguous CPU tensor's first element."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("native kernels need contiguous CPU tensors")
    return int(t.data_ptr())


def row_pointer(t: torch.Tensor) -> int:
    """The address of a CPU tensor's first element whose last dimension is contiguous (rows may
    lie any number of elements apart)."""
    if t.device.type != "cpu" or t.stride(-1) != 1 or min(t.stride()) < 0:
        raise ValueError("native kernels need CPU tensors with contiguous rows")
    return int(t.data_ptr())


def softmax_rows(
    scores: torch.Tensor, weights: torch.Tensor, top: torch.Tensor, entropy: torch.Tensor
) -> None:
    """Row softmax of float32 ``scores (..., n)`` into ``weights``, with each row's largest
    weight ``top (...)`` and entropy in nats (all contiguous, written in place)."""
    lib = kernels()
    n_cols = scores.shape[-1]
    n_rows = scores.numel() // max(1, n_cols)
    args = (pointer(scores), pointer(weights), pointer(top), pointer(entropy), n_cols)
    parallel(lambda a, b: lib.softmax_rows(*args, a, b), n_rows, min_share=8)


def attend_rows(
    query: torch.Tensor,
    keys_t: torch.Tensor,
    start: int,
    n_rows: int,
    seen: int,
    *,
    scale: float = 1.0,
    lengths: torch.Tensor | None,
    causal: bool,
    weights: torch.Tensor,
    top: torch.Tensor,
    entropy: torch.Tensor,
    columns_t: torch.Tensor | None = None,
    mixed: torch.Tensor | None = None,
) -> None:
    """Attention weights of query rows ``start:start+n_rows`` over keys ``0:seen`` in one pass
    per row (see ``rows.c``): float32 ``query (B, H, T, D)`` (any strides with the last one 1:
    a model's head view is read in place), ``scale`` on its products with the keys, ``keys_t
    (B, Hkv, D, S)``, ``lengths (B,)`` int64 keys per sentence (right padding) or ``None``,
    ``causal`` (bottom-right aligned); writes ``weights (B, H, t, s)``, ``top`` and ``entropy
    (B, H, t)``; with ``columns_t (B, X, S)`` float32 per-key values, also ``mixed (B, H, t,
    X)``, each row's weighted sums of them."""
    lib = kernels()
    if query.stride(-1) != 1:
        query = query.contiguous()
    n_batch, n_heads, n_queries, d = query.shape
    n_kv, n_keys = keys_t.shape[1], keys_t.shape[3]
    if (columns_t is None) != (mixed is None):
        raise ValueError("attend_rows: give columns_t and mixed together, or neither")
    if columns_t is not None and columns_t.shape[1] > 4:
        raise ValueError(f"attend_rows sums at most 4 columns, got {columns_t.shape[1]}")
    if query.dtype != torch.float32 or keys_t.dtype != torch.float32:
        raise ValueError(f"attend_rows takes float32, got {query.dtype} and {keys_t.dtype}")
    stride_b, stride_h, stride_t, _ = query.stride()
    args = (
        row_pointer(query), pointer(keys_t), pointer(weights), pointer(top), pointer(entropy),
        n_heads, n_heads // n_kv, n_keys, d, start, n_rows, seen,
        pointer(lengths) if lengths is not None else None, int(causal), n_keys - n_queries,
        pointer(columns_t) if columns_t is not None else None,
        0 if columns_t is None else columns_t.shape[1],
        pointer(mixed) if mixed is not None else None,
        stride_b, stride_h, stride_t, float(scale),
    )  # fmt: skip
    parallel(lambda a, b: lib.attend_rows(*args, a, b), n_batch * n_heads)


@dataclass(frozen=True)
class WordTable:
    """What :func:`word_argmax_rows` needs to know about a padded batch's words (all CPU,
    contiguous): ``key_word (B, T)`` each token's word (padding: the number of real words),
    ``n_real (B,)``, ``allowed (B, T)`` uint8, 1 on the token of a real, non-special word of one
    token, ``first_token (B, W)``, ``spans (B, 3, M)`` int32, the real, non-special words of
    several tokens in order: the words, their first tokens and their numbers of tokens, and
    ``n_spans (B,)`` how many."""

    key_word: torch.Tensor
    n_real: torch.Tensor
    allowed: torch.Tensor
    first_token: torch.Tensor
    spans: torch.Tensor
    n_spans: torch.Tensor


def word_argmax_rows(
    weights: torch.Tensor,
    start: int,
    table: WordTable,
    acc: torch.Tensor,
    current: torch.Tensor,
    argmax: torch.Tensor,
    *,
    finish: bool = False,
) -> torch.Tensor:
    """Feed token rows ``start:start+t`` of float32 weights ``(B, H, t, s)`` to each head's word
    argmax (see ``rows.c``): running token sums ``acc (B, H, T)`` float32 and ``argmax (B, H,
    W)`` int64 are updated in place; ``current (B,)`` is the word open before the block.
    Returns the word open after it (``-1``: none; ``finish`` closes every open word)."""
    lib = kernels()
    n_batch, n_heads, n_rows, n_keys = weights.shape
    weights = weights.contiguous()
    following = torch.empty_like(current)
    t = table
    args = (
        pointer(weights), n_heads, n_rows, n_keys, pointer(t.key_word), t.key_word.shape[1],
        start, pointer(t.n_real), pointer(t.allowed), pointer(t.first_token),
        t.first_token.shape[1], pointer(t.spans), pointer(t.n_spans), t.spans.shape[2],
        pointer(acc), pointer(current), pointer(following), pointer(argmax), int(finish),
    )  # fmt: skip
    parallel(lambda a, b: lib.word_argmax_rows(*args, a, b), n_batch * n_heads)
    return following


def positional_rows(
    weights: torch.Tensor, top: torch.Tensor, query: torch.Tensor, start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positional counts of float32 weight rows ``start:start+t`` ``(B, H, t, s)`` with each
    row's largest weight ``top (B, H, t)`` and ``query (B, T)`` uint8, 1 on the rows that count
    (see ``rows.c``): ``hits (B, H, 7)``, the rows whose argmax lies at offset -3..+3 (the
    leftmost on ties), and ``near (B, H, 2)``, the summed weights on the previous and the next
    token."""
    lib = kernels()
    n_batch, n_heads, n_rows, n_keys = weights.shape
    weights, top, query = weights.contiguous(), top.contiguous(), query.contiguous()
    hits = weights.new_empty(n_batch, n_heads, 7)
    near = weights.new_empty(n_batch, n_heads, 2)
    args = (
        pointer(weights), pointer(top), pointer(query), n_heads, n_rows, n_keys,
        query.shape[1], start, pointer(hits), pointer(near),
    )  # fmt: skip
    parallel(lambda a, b: lib.positional_rows(*args, a, b), n_batch * n_heads)
    return hits, near
