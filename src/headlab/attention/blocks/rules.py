"""The rules every entry of the engine shares: masks (boolean or additive, right padding as
key lengths, the causal triangle) and the row with no visible key.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from headlab.attention.masks import causal_rows

#: masked scores: large and finite, so that a row with no visible key gives no NaN (its weights
#: are then set to zero)
MASKED = -1e30


# ---------------------------------------------------------------------------------- masks
def _rows(m: torch.Tensor, start: int, stop: int, n_queries: int) -> torch.Tensor:
    """Rows ``start:stop`` of a mask or bias broadcastable to ``(B, H, T, S)``."""
    if m.dim() >= 2 and m.shape[-2] == n_queries:
        return m[..., start:stop, :]
    return m


def _hiding_below(dtype: torch.dtype) -> float:
    """Additive mask values at or below this hide a key."""
    return max(MASKED, torch.finfo(dtype).min)


def _empty_by_rule(
    lengths: list[int] | None,
    causal: bool,
    start: int,
    stop: int,
    n_queries: int,
    n_keys: int,
    device: torch.device,
) -> torch.Tensor | None:
    """Rows ``start:stop`` that right padding of ``lengths`` or the causal triangle leave with
    no key, ``(B|1, 1, t)`` bool; ``None`` when there are none."""
    empty = None
    if causal and start + n_keys - n_queries < 0:  # rows before the first key (T > S)
        empty = ~causal_rows(start, stop, n_queries, n_keys, device=device).any(-1)[None, None]
    if lengths is not None and min(lengths, default=1) == 0:
        none = torch.tensor([n == 0 for n in lengths], device=device)[:, None, None]  # (B, 1, 1)
        empty = none if empty is None else empty | none
    return empty


def _mask_scores(
    scores: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    lengths: list[int] | None,
    causal: bool,
    start: int,
    n_queries: int,
    n_keys: int,
) -> Callable[[], torch.Tensor | None]:
    """Add ``bias`` and hide every masked key of float32 ``scores (B, H, t, s)`` (query rows
    ``start:start+t`` over keys ``0:s``) in place: a hidden key's score becomes
    :data:`MASKED` (so a row's largest score is at most ``MASKED / 2`` exactly when it sees no
    key). Returns the function that finds the rows left with no visible key from the masks,
    bool broadcastable to ``(B, H, t)`` (``None`` when there are none for sure): called only
    when a cheaper sign says there may be some."""
    t, seen = scores.shape[-2], scores.shape[-1]
    stop = start + t
    if bias is not None:
        scores.add_(_rows(bias, start, stop, n_queries)[..., :seen].float())
    hidden = None
    if mask is not None:
        m = _rows(mask, start, stop, n_queries)[..., :seen]
        if m.dtype == torch.bool:
            hidden = ~m
            scores.masked_fill_(hidden, MASKED)
        else:
            hidden = m <= _hiding_below(m.dtype)
            scores.add_(m.float().clamp_min(MASKED).masked_fill_(hidden, MASKED))
    if lengths is not None:
        for b, n in enumerate(lengths):
            if n < seen:
                scores[b, ..., n:].fill_(MASKED)
    first = max(0, seen - t)  # only the last t keys can lie after a row of this block
    later = None
    if causal:
        allowed = causal_rows(start, stop, n_queries, n_keys, first_key=first, device=scores.device)
        later = ~allowed[:, : seen - first]  # (t, <=t)
        scores[..., first:].masked_fill_(later, MASKED)

    def empty_rows() -> torch.Tensor | None:
        empty = _empty_by_rule(lengths, causal, start, stop, n_queries, n_keys, scores.device)
        if hidden is None:
            return empty
        if later is None:
            by_mask = hidden.all(-1)
        else:
            by_mask = hidden[..., :first].all(-1) & (hidden[..., first:] | later).all(-1)
        return by_mask if empty is None else empty | by_mask

    return empty_rows


def _zero_rows(
    empty: torch.Tensor | None,
    cells: tuple[torch.Tensor | None, ...],
    rows: tuple[torch.Tensor, ...] = (),
) -> None:
    """Write zeros, in place, over the rows ``empty`` (bool broadcastable to ``(B, H, t)``) of
    ``cells`` (``(B, H, t, n)`` each) and ``rows`` (``(B, H, t)`` each): the convention for
    rows with no visible key."""
    if empty is None or not bool(empty.any()):
        return
    for x in cells:
        if x is not None:
            x.masked_fill_(empty[..., None], 0.0)
    for x in rows:
        x.masked_fill_(empty, 0.0)


def key_lengths(
    mask: torch.Tensor | None, causal: bool, n_queries: int, n_keys: int
) -> list[int] | None:
    """Each batch row's number of keys when ``mask`` only hides keys from that number on (right
    padding; on top of the causal triangle when ``causal``); ``None`` when it does more."""
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        return None
    if mask.shape[-1] != n_keys or mask.shape[-2] not in (1, n_queries):
        return None
    keys = mask[:, 0].any(dim=-2)  # (B, S) keys someone sees
    lengths = keys.sum(-1)
    expected = torch.arange(n_keys, device=mask.device)[None, :] < lengths[:, None]  # (B, S)
    full = expected[:, None, :].expand(-1, mask.shape[-2], -1)
    if causal:
        rule = causal_rows(0, mask.shape[-2], n_queries, n_keys, device=mask.device)  # (T|1, S)
        full = full & rule
    if not torch.equal(mask[:, 0], full):
        return None
    return [int(n) for n in lengths.tolist()]
