"""The attention engine (``headlab.attention.blocks``) against a NumPy loop, on every device.

Every path that computes attention weights (the block engine with the native row kernels or
torch's ops, whole patterns, MultiHeadAttention's explicit path) gives what a plain loop over
rows gives, with one convention for a query row that sees no key: zero weights, zero output,
entropy 0 and largest weight 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from headlab.attention.blocks import (
    attention_blocks,
    attention_weights,
    explicit_attention,
    key_lengths,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _oracle(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``(B, H, T, S)`` and head outputs ``(B, H, T, D)`` row by row in float64 NumPy:
    ``visible (B, H, T, S)`` says which keys a row sees; a row that sees none is zeros."""
    qn, kn, vn = (x.double().cpu().numpy() for x in (q, k, v))
    n_batch, n_heads, n_queries, _ = qn.shape
    group = n_heads // kn.shape[1]
    weights = np.zeros((n_batch, n_heads, n_queries, kn.shape[2]))
    outputs = np.zeros((*qn.shape[:3], vn.shape[3]))
    for b in range(n_batch):
        for h in range(n_heads):
            for i in range(n_queries):
                keys = np.flatnonzero(visible[b, h, i])
                if keys.size == 0:
                    continue
                scores = np.array([qn[b, h, i] @ kn[b, h // group, j] * scale for j in keys])
                p = np.exp(scores - scores.max())
                p /= p.sum()
                weights[b, h, i, keys] = p
                outputs[b, h, i] = p @ vn[b, h // group, keys]
    return weights, outputs


def _inputs(
    device: str, *, b: int = 3, h: int = 4, hkv: int = 2, t: int = 7, s: int = 7, d: int = 8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, t, d, generator=g)
    k = torch.randn(b, hkv, s, d, generator=g)
    v = torch.randn(b, hkv, s, d, generator=g)
    return q.to(device), k.to(device), v.to(device)


def _causal(t: int, s: int) -> np.ndarray:
    return np.arange(s)[None, :] <= np.arange(t)[:, None] + s - t  # (T, S)


def _sliding_padded(lengths: list[int], t: int, window: int) -> torch.Tensor:
    """A decoder's mask for right-padded rows under a sliding window ``(B, 1, T, T)``: the rows
    past a sentence's end by ``window`` or more see no key."""
    pos = torch.arange(t)
    near = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)  # (T, T)
    real = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    return (near[None] & real[:, None, :])[:, None]  # (B, 1, T, T)


def _visible(mask: torch.Tensor | None, causal: bool, shape: tuple[int, ...]) -> np.ndarray:
    out = np.ones(shape, dtype=bool)
    if mask is not None:
        m = mask.cpu()
        out &= (m if m.dtype == torch.bool else m > -1e30).numpy()
    if causal:
        out &= _causal(shape[2], shape[3])
    return out


class _Blocks:
    """Collects every block the engine hands out (copied: the buffers are reused)."""

    def __init__(self) -> None:
        self.blocks: list[tuple[Any, ...]] = []

    def __call__(self, start: int, *parts: torch.Tensor | None) -> None:
        self.blocks.append((start, *(None if x is None else x.clone() for x in parts)))

    def whole(self, n_keys: int) -> list[torch.Tensor]:
        """Weights ``(B, H, T, S)`` (keys past a causal block's view are zeros), entropy, top
        ``(B, H, T)`` and mixed ``(B, H, T, X)``, stitched from the blocks."""
        weights = torch.cat([F.pad(w, (0, n_keys - w.shape[-1])) for _, w, *_ in self.blocks], 2)
        entropy = torch.cat([blk[2] for blk in self.blocks], 2)
        top = torch.cat([blk[3] for blk in self.blocks], 2)
        mixed = torch.cat([blk[4] for blk in self.blocks], 2)
        return [weights, entropy, top, mixed]


CASES = ["none", "causal", "lengths", "lengths-causal", "sliding", "additive", "cached"]


def _case(case: str, device: str) -> dict[str, Any]:
    """Inputs and masks of one case (``empty``: whether some row sees no key)."""
    b, t, s = 3, 7, 7
    if case == "cached":
        s = 10  # 3 keys cached before the 7 queries
    q, k, v = _inputs(device, t=t, s=s)
    mask, causal = None, False
    if case == "causal" or case == "cached":
        causal = True
    elif case.startswith("lengths"):
        real = torch.arange(s)[None, :] < torch.tensor([7, 0, 4])[:, None]  # a sentence of none
        real = real[:, None, :].expand(b, t, s)  # (B, T, S)
        causal = case.endswith("causal")
        if causal:  # a causal model's own mask (read as lengths by the engine)
            real = real & torch.tensor(_causal(t, s))
        mask = real[:, None].contiguous().to(device)  # (B, 1, T, S)
    elif case == "sliding":
        mask = _sliding_padded([7, 3, 5], t, window=2).to(device)
        causal = True
    elif case == "additive":
        hide = _sliding_padded([7, 3, 5], t, window=2)
        mask = torch.zeros(b, 1, t, s).masked_fill(~hide, torch.finfo(torch.float32).min)
        mask = mask.to(device)
    return {"q": q, "k": k, "v": v, "mask": mask, "causal": causal}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("block_elements", [40, 1 << 20])
def test_block_engine_matches_a_row_loop(
    device: str, case: str, block_elements: int, kernels: str
) -> None:
    """Weights, head outputs, entropy, largest weight and column sums of every block, with the
    native kernels (CPU) and torch's ops; rows that see no key are zeros everywhere."""
    if device != "cpu" and kernels != "torch":
        pytest.skip("the native kernels run on the CPU only")
    c = _case(case, device)
    q, k, v = c["q"], c["k"], c["v"]
    n_batch, n_heads, n_queries, _ = q.shape
    n_keys = k.shape[2]
    columns = torch.rand(n_batch, n_keys, 3, generator=torch.Generator().manual_seed(1))
    seen = _Blocks()
    scale = 0.3
    out = attention_blocks(
        q, k, v, mask=c["mask"], causal=c["causal"], scaling=scale, on_block=seen,
        columns=columns.to(device), block_elements=block_elements,
    )  # fmt: skip
    assert out.device.type == device
    visible = _visible(c["mask"], c["causal"], (n_batch, n_heads, n_queries, n_keys))
    want_w, want_out = _oracle(q, k, v, visible, scale)
    weights, entropy, top, mixed = (x.double().cpu().numpy() for x in seen.whole(n_keys))
    with np.errstate(divide="ignore", invalid="ignore"):
        want_entropy = -np.where(want_w > 0, want_w * np.log(want_w), 0.0).sum(-1)
    np.testing.assert_allclose(weights, want_w, atol=1e-5)
    np.testing.assert_allclose(out.transpose(1, 2).cpu().numpy(), want_out, atol=1e-5)
    np.testing.assert_allclose(entropy, want_entropy, atol=1e-4)
    np.testing.assert_allclose(top, want_w.max(-1), atol=1e-5)
    np.testing.assert_allclose(mixed, want_w @ columns.double().numpy()[:, None], atol=1e-5)
    empty = ~visible.any(-1)
    assert empty.any() == (case in ("lengths", "lengths-causal", "sliding", "additive"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("heads", [None, [3, 0]])
def test_whole_patterns_match_a_row_loop(device: str, case: str, heads: list[int] | None) -> None:
    """``attention_weights`` (HeadCapture's patterns): chosen heads and rows, any mask."""
    c = _case(case, device)
    q, k, v = c["q"], c["k"], c["v"]
    n_batch, n_heads, n_queries, _ = q.shape
    n_keys = k.shape[2]
    visible = _visible(c["mask"], c["causal"], (n_batch, n_heads, n_queries, n_keys))
    want, _ = _oracle(q, k, v, visible, 0.3)
    chosen = list(range(n_heads)) if heads is None else heads
    for rows in (None, (2, 6)):
        got = attention_weights(
            q, k, mask=c["mask"], causal=c["causal"], scaling=0.3, heads=heads, rows=rows
        )
        assert got.device.type == device and got.dtype == torch.float32
        start, stop = rows or (0, n_queries)
        expect = want[:, chosen, start:stop]
        np.testing.assert_allclose(got.cpu().numpy(), expect, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_explicit_path_matches_sdpa_with_empty_rows_and_gradients(device: str, n_kv: int) -> None:
    """MultiHeadAttention's explicit path: GQA/MQA read without copies, rows with no key give
    zero weights and outputs as sdpa does, and gradients equal those through sdpa (zero
    through the empty rows, never NaN)."""
    q, k, v = _inputs(device, hkv=n_kv)
    mask = _sliding_padded([7, 3, 5], 7, window=2).to(device)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out, weights = explicit_attention(*leaves, mask=mask, scale=0.3)
    group = q.shape[1] // n_kv
    expanded = [x.repeat_interleave(group, 1) for x in leaves[1:]]
    want = F.scaled_dot_product_attention(leaves[0], *expanded, attn_mask=mask, scale=0.3)
    empty = ~mask.any(-1)  # (B, 1, T)
    assert bool(empty.any())
    assert torch.allclose(out, want, atol=1e-10)
    assert bool((weights.detach()[empty.expand(-1, q.shape[1], -1)] == 0).all())
    grads = torch.autograd.grad(out.square().sum(), leaves)
    want_grads = torch.autograd.grad(want.square().sum(), leaves)
    for got, expect in zip(grads, want_grads, strict=True):
        assert torch.isfinite(got).all()
        assert torch.allclose(got, expect, atol=1e-10)


def test_key_lengths_reads_right_padding_only() -> None:
    """Right padding (with or without the causal triangle) becomes lengths; anything else
    (a sliding window) stays a mask."""
    real = torch.arange(5)[None, :] < torch.tensor([5, 2, 0])[:, None]  # (B, S)
    padding = real[:, None, None, :]  # (B, 1, 1, S)
    assert key_lengths(padding, False, 5, 5) == [5, 2, 0]
    causal = padding & torch.tensor(_causal(5, 5))
    assert key_lengths(causal, True, 5, 5) == [5, 2, 0]
    assert key_lengths(causal, False, 5, 5) is None
    assert key_lengths(_sliding_padded([5, 2, 0], 5, window=2), True, 5, 5) is None


def test_a_row_loop_oracle_is_what_sdpa_gives() -> None:
    """The oracle's convention is torch's: sdpa's output on a row with no visible key is 0."""
    q, k, v = _inputs("cpu", hkv=4)
    mask = _sliding_padded([7, 3, 5], 7, window=2)
    visible = _visible(mask, False, (3, 4, 7, 7))
    _, want = _oracle(q, k, v, visible, 1 / math.sqrt(8))
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


def test_float16_scores_past_its_range_stay_finite() -> None:
    """float16 queries whose scores pass 65,504 (float16's largest) still give finite weights
    that put all of a row on its largest score: the engine takes q k^T in float32 for them."""
    from headlab.attention.blocks import attention_blocks

    q = torch.zeros(1, 1, 2, 4, dtype=torch.float16)
    q[..., 0] = 300.0
    k = torch.zeros(1, 1, 3, 4, dtype=torch.float16)
    k[0, 0, :, 0] = torch.tensor([300.0, 1.0, -1.0], dtype=torch.float16)  # score 90,000 on key 0
    v = torch.eye(3, 4, dtype=torch.float16)[None, None]
    seen: list[torch.Tensor] = []
    out = attention_blocks(
        q, k, v, mask=None, causal=False, scaling=1.0,
        on_block=lambda start, weights, *rest: seen.append(weights.clone()),
    )  # fmt: skip
    assert torch.isfinite(out).all()
    assert torch.equal(seen[0][0, 0, :, 0], torch.ones(2))
