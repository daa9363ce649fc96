"""Bad input gets a clear message that names what was expected and what came in."""

from __future__ import annotations

import pytest
import torch

from headlab.attention import MultiHeadAttention
from headlab.errors import ConfigError, HeadlabError, MaskError, PruningError, ShapeError


def test_n_heads_not_divisible_by_n_kv_heads() -> None:
    with pytest.raises(ConfigError, match=r"n_heads \(12\) must be divisible by n_kv_heads \(5\)"):
        MultiHeadAttention(d_model=48, n_heads=12, n_kv_heads=5)


def test_d_model_not_divisible_without_head_dim() -> None:
    with pytest.raises(ConfigError, match=r"d_model \(10\) must be divisible by n_heads \(3\)"):
        MultiHeadAttention(d_model=10, n_heads=3)
    assert MultiHeadAttention(d_model=10, n_heads=3, head_dim=4).head_dim == 4


def test_errors_are_also_builtin_errors() -> None:
    with pytest.raises(ValueError):
        MultiHeadAttention(d_model=10, n_heads=0)
    assert issubclass(ShapeError, HeadlabError)


@pytest.fixture
def mha() -> MultiHeadAttention:
    return MultiHeadAttention(d_model=8, n_heads=4, n_kv_heads=2)


def test_wrong_query_shape(mha: MultiHeadAttention) -> None:
    with pytest.raises(ShapeError, match=r"query must have shape \(B, T, E=8\), got \(2, 3, 7\)"):
        mha(torch.randn(2, 3, 7))
    with pytest.raises(ShapeError, match=r"got \(3, 8\)"):
        mha(torch.randn(3, 8))


def test_wrong_key_value_shape(mha: MultiHeadAttention) -> None:
    with pytest.raises(ShapeError, match=r"key_value must have shape \(B=2, S, E=8\)"):
        mha(torch.randn(2, 3, 8), torch.randn(1, 4, 8))


def test_mask_of_wrong_size(mha: MultiHeadAttention) -> None:
    x = torch.randn(2, 3, 8)
    with pytest.raises(
        MaskError, match=r"attn_mask must have shape \(T, S\)=\(3, 3\).*got \(3, 4\)"
    ):
        mha(x, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(
        MaskError, match=r"key_padding_mask must have shape \(B, S\)=\(2, 3\), got \(2, 4\)"
    ):
        mha(x, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(
        MaskError, match=r"key_mask must have shape \(B, S\)=\(2, 3\), got \(2, 4\)"
    ):
        mha(x, key_mask=torch.ones(2, 4, dtype=torch.bool))


def test_mask_of_wrong_dtype(mha: MultiHeadAttention) -> None:
    x = torch.randn(2, 3, 8)
    with pytest.raises(MaskError, match=r"must be a boolean tensor.*got dtype torch.float32"):
        mha(x, attn_mask=torch.zeros(3, 3))
    with pytest.raises(MaskError, match="key_padding_mask must be a boolean"):
        mha(x, key_padding_mask=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(MaskError, match=r"key_mask must be a boolean tensor \(True = real token\)"):
        mha(x, key_mask=torch.ones(2, 3, dtype=torch.long))


def test_both_key_masks_refused(mha: MultiHeadAttention) -> None:
    """The two spellings of the key mask mean opposite things: both at once is ambiguous."""
    x = torch.randn(2, 3, 8)
    real = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(MaskError, match="not both"):
        mha(x, key_mask=real, key_padding_mask=~real)


def test_key_padding_mask_means_what_torch_means(mha: MultiHeadAttention) -> None:
    """True in key_padding_mask is padding (torch's meaning), True in key_mask a real token: a
    padded key gets zero weight from every query either way, and both spellings agree."""
    x = torch.randn(2, 3, 8)
    pad = torch.tensor([[False, False, False], [False, False, True]])
    with torch.no_grad():
        w_pad = mha.inspect(x, key_padding_mask=pad).weights
        w_real = mha.inspect(x, key_mask=~pad).weights
    assert w_pad is not None and w_real is not None
    assert torch.equal(w_pad[1, :, :, 2], torch.zeros_like(w_pad[1, :, :, 2]))
    assert bool((w_pad[1, :, :, :2] > 0).all())
    torch.testing.assert_close(w_pad, w_real, atol=0, rtol=0)


def test_head_mask_of_wrong_shape(mha: MultiHeadAttention) -> None:
    with pytest.raises(ShapeError, match=r"head_mask must have shape \(H,\)=\(4,\)"):
        mha(torch.randn(2, 3, 8), head_mask=torch.ones(3))


def test_pruning_every_head(mha: MultiHeadAttention) -> None:
    with pytest.raises(PruningError, match="removing all 4 heads would leave no attention"):
        mha.prune_heads([0, 1, 2, 3])


def test_pruning_that_breaks_the_gqa_layout(mha: MultiHeadAttention) -> None:
    # groups are (0, 1) and (2, 3): removing only head 0 leaves groups of 1 and 2 heads
    with pytest.raises(PruningError, match=r"unequal query heads \[1, 2\]"):
        mha.prune_heads([0])
    with pytest.raises(PruningError, match=r"head indices must be in \[0, 4\), got \[7\]"):
        mha.prune_heads([7])
    mha.prune_heads([0, 2])  # one from each group is fine
    assert (mha.n_heads, mha.n_kv_heads) == (2, 2)
    mha.prune_heads([1])  # removes the whole second group
    assert (mha.n_heads, mha.n_kv_heads, mha.head_ids) == (1, 1, [1])
