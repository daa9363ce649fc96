"""Properties every multi-head attention must have, over random shapes and masks (hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headlab.attention import KVCache, MultiHeadAttention

TOL = 1e-10


@st.composite
def layouts(draw: st.DrawFn) -> dict:
    n_kv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    return {
        "n_heads": n_kv * group,
        "n_kv_heads": n_kv,
        "head_dim": draw(st.integers(1, 5)),
        "d_model": draw(st.integers(2, 12)),
        "batch": draw(st.integers(1, 3)),
        "t": draw(st.integers(1, 6)),
        "seed": draw(st.integers(0, 2**16)),
    }


def _module(lay: dict, **extra) -> MultiHeadAttention:
    torch.manual_seed(lay["seed"])
    mha = MultiHeadAttention(
        d_model=lay["d_model"],
        n_heads=lay["n_heads"],
        n_kv_heads=lay["n_kv_heads"],
        head_dim=lay["head_dim"],
        dtype=torch.float64,
        **extra,
    )
    with torch.no_grad():
        mha.in_proj.bias.normal_()
        mha.out_proj.bias.normal_()
    return mha.eval()


def _x(lay: dict, t: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(lay["seed"] + 1)
    return torch.randn(
        lay["batch"], t or lay["t"], lay["d_model"], dtype=torch.float64, generator=g
    )


@settings(max_examples=40, deadline=None)
@given(lay=layouts(), mask_seed=st.integers(0, 1000))
def test_rows_sum_to_one_or_zero_when_nothing_is_visible(lay: dict, mask_seed: int) -> None:
    mha = _module(lay)
    x = _x(lay)
    g = torch.Generator().manual_seed(mask_seed)
    allowed = torch.rand(lay["batch"], lay["t"], lay["t"], generator=g) > 0.5
    res = mha.inspect(x, attn_mask=allowed)
    sums = res.weights.sum(-1)  # (B, H, T)
    visible = allowed.any(-1)[:, None, :].expand_as(sums)
    assert torch.allclose(sums[visible], torch.ones_like(sums[visible]), atol=TOL)
    assert torch.all(sums[~visible] == 0)
    assert torch.all(res.weights[~allowed[:, None].expand_as(res.weights)] == 0)
    assert torch.isfinite(res.output).all()
    # the fused path agrees, including on rows with nothing visible
    torch.testing.assert_close(mha(x, attn_mask=allowed), res.output, atol=TOL, rtol=0)


@settings(max_examples=30, deadline=None)
@given(lay=layouts())
def test_permutation_equivariance_without_masks(lay: dict) -> None:
    mha = _module(lay)
    x = _x(lay)
    perm = torch.randperm(lay["t"], generator=torch.Generator().manual_seed(lay["seed"]))
    torch.testing.assert_close(mha(x[:, perm]), mha(x)[:, perm], atol=TOL, rtol=0)


@settings(max_examples=30, deadline=None)
@given(lay=layouts(), causal=st.booleans())
def test_contributions_sum_to_output(lay: dict, causal: bool) -> None:
    mha = _module(lay)
    res = mha.inspect(_x(lay), is_causal=causal)
    total = res.contributions.sum(1) + mha.out_proj.bias
    torch.testing.assert_close(total, res.output, atol=TOL, rtol=0)


@settings(max_examples=30, deadline=None)
@given(lay=layouts())
def test_gqa_equals_mha_with_repeated_kv_weights(lay: dict) -> None:
    gqa = _module(lay)
    mha = MultiHeadAttention(
        d_model=lay["d_model"],
        n_heads=lay["n_heads"],
        head_dim=lay["head_dim"],
        dtype=torch.float64,
    ).eval()
    d, h, hkv = lay["head_dim"], lay["n_heads"], lay["n_kv_heads"]
    w, b = gqa.in_proj.weight, gqa.in_proj.bias
    q_w, k_w, v_w = w.split([h * d, hkv * d, hkv * d])
    q_b, k_b, v_b = b.split([h * d, hkv * d, hkv * d])

    def rep(t: torch.Tensor) -> torch.Tensor:  # each KV head's D rows, repeated G times in place
        return (
            t.reshape(hkv, d, *t.shape[1:])
            .repeat_interleave(h // hkv, 0)
            .reshape(h * d, *t.shape[1:])
        )

    with torch.no_grad():
        mha.in_proj.weight.copy_(torch.cat([q_w, rep(k_w), rep(v_w)]))
        mha.in_proj.bias.copy_(torch.cat([q_b, rep(k_b), rep(v_b)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = _x(lay)
    a, m = gqa.inspect(x, is_causal=True), mha.inspect(x, is_causal=True)
    torch.testing.assert_close(a.output, m.output, atol=TOL, rtol=0)
    torch.testing.assert_close(a.weights, m.weights, atol=TOL, rtol=0)
    torch.testing.assert_close(gqa(x, is_causal=True), m.output, atol=TOL, rtol=0)


@settings(max_examples=20, deadline=None)
@given(lay=layouts())
def test_n_kv_heads_equal_to_n_heads_is_plain_mha(lay: dict) -> None:
    lay = {**lay, "n_kv_heads": lay["n_heads"]}
    gqa = _module(lay)
    mha = MultiHeadAttention(
        d_model=lay["d_model"],
        n_heads=lay["n_heads"],
        head_dim=lay["head_dim"],
        dtype=torch.float64,
    )
    mha.load_state_dict(gqa.state_dict())
    x = _x(lay)
    torch.testing.assert_close(gqa(x), mha(x), atol=0, rtol=0)


@settings(max_examples=30, deadline=None)
@given(lay=layouts(), prompt=st.integers(1, 4))
def test_kv_cache_decoding_equals_full_causal_forward(lay: dict, prompt: int) -> None:
    mha = _module(lay)
    t = lay["t"] + prompt
    x = _x(lay, t)
    full = mha(x, is_causal=True)
    cache = KVCache()
    steps = [mha(x[:, :prompt], is_causal=True, kv_cache=cache)]
    steps += [mha(x[:, i : i + 1], is_causal=True, kv_cache=cache) for i in range(prompt, t)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=TOL, rtol=0)
    assert cache.length == t


@settings(max_examples=30, deadline=None)
@given(lay=layouts(), data=st.data())
def test_prune_heads_equals_gating_them_to_zero(lay: dict, data: st.DataObject) -> None:
    mha = _module(lay)
    h, g = lay["n_heads"], lay["n_heads"] // lay["n_kv_heads"]
    if data.draw(st.booleans()) or g == 1:
        groups = data.draw(
            st.sets(st.integers(0, lay["n_kv_heads"] - 1), max_size=lay["n_kv_heads"] - 1)
        )
        remove = [grp * g + i for grp in groups for i in range(g)]
    else:  # the same query slots from every group
        slots = data.draw(st.sets(st.integers(0, g - 1), min_size=1, max_size=g - 1))
        remove = [grp * g + i for grp in range(lay["n_kv_heads"]) for i in slots]
    x = _x(lay)
    gate = torch.ones(h, dtype=torch.float64)
    gate[remove] = 0
    gated = mha(x, is_causal=True, head_mask=gate)
    mha.prune_heads(remove)
    assert mha.n_heads == h - len(remove)
    assert mha.head_ids == [i for i in range(h) if i not in remove]
    torch.testing.assert_close(mha(x, is_causal=True), gated, atol=TOL, rtol=0)


@settings(max_examples=30, deadline=None)
@given(lay=layouts(), lengths=st.lists(st.integers(1, 6), min_size=2, max_size=3))
def test_padded_batch_equals_each_sequence_alone(lay: dict, lengths: list[int]) -> None:
    mha = _module(lay)
    t = max(lengths)
    x = _x({**lay, "batch": len(lengths)}, t)
    real = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    batched = mha(x, key_mask=real, is_causal=True)
    for i, n in enumerate(lengths):
        alone = mha(x[i : i + 1, :n], is_causal=True)
        torch.testing.assert_close(batched[i : i + 1, :n], alone, atol=TOL, rtol=0)


def test_gradcheck_float64() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=6, n_heads=4, n_kv_heads=2, head_dim=3, dtype=torch.float64)
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    real = torch.tensor([[True, True, True, True], [True, True, False, False]])
    assert torch.autograd.gradcheck(lambda t: mha(t, key_mask=real, is_causal=True), (x,))
    assert torch.autograd.gradcheck(lambda t: mha.inspect(t).output, (x,))


def test_fully_masked_rows_give_zeros_and_finite_gradients() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, n_heads=2, dtype=torch.float64)
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    allowed = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    for need in (False, True):
        res = mha.inspect(x, attn_mask=allowed, need_weights=need)
        assert torch.isfinite(res.output).all()
        torch.testing.assert_close(
            res.head_outputs[:, :, 1], torch.zeros(1, 2, 4, dtype=torch.float64)
        )
        res.output.sum().backward()
        assert torch.isfinite(x.grad).all()
        x.grad = None


def test_why_not_fast_path_is_recorded() -> None:
    mha = MultiHeadAttention(d_model=8, n_heads=2)
    x = torch.randn(1, 3, 8)
    mha(x)
    assert mha.why_not_fast_path is None
    mha.inspect(x, need_weights=True)
    assert mha.why_not_fast_path == "per-head attention weights requested"
    mha.inspect(x, need_weights=False)  # head outputs and contributions keep the fused kernel
    assert mha.why_not_fast_path is None
