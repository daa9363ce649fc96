"""headlab's module against torch.nn.MultiheadAttention and against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from headlab.attention import HeadWeights, MultiHeadAttention, reference_attention

TOL = 1e-10


def _torch_pair(d_model: int, n_heads: int, bias: bool, seed: int = 0):
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True).double().eval()
    # torch initialises the input bias to zero; make it matter.
    if bias:
        with torch.no_grad():
            theirs.in_proj_bias.normal_()
            theirs.out_proj.bias.normal_()
    ours = MultiHeadAttention.from_torch(theirs).eval()
    return theirs, ours


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masking", ["none", "padding", "key_mask", "causal", "attn_mask"])
def test_matches_torch_multihead_attention(bias: bool, masking: str) -> None:
    theirs, ours = _torch_pair(24, 4, bias)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 24, dtype=torch.float64, generator=g)
    kwargs_theirs: dict = {}
    kwargs_ours: dict = {}
    if masking in ("padding", "key_mask"):
        real = torch.ones(3, 7, dtype=torch.bool)
        real[1, 5:] = False
        real[2, 2:] = False
        kwargs_theirs["key_padding_mask"] = ~real  # torch: True = ignore
        if masking == "padding":  # code ported from torch: the same argument, the same answer
            kwargs_ours["key_padding_mask"] = ~real
        else:  # headlab's other spelling: True = real token
            kwargs_ours["key_mask"] = real
    elif masking == "causal":
        allowed = torch.ones(7, 7, dtype=torch.bool).tril()
        kwargs_theirs["attn_mask"] = ~allowed
        kwargs_ours["is_causal"] = True
    elif masking == "attn_mask":
        allowed = torch.rand(7, 7, generator=g) > 0.4
        allowed[:, 0] = True  # every query keeps a key (torch gives NaN otherwise)
        kwargs_theirs["attn_mask"] = ~allowed
        kwargs_ours["attn_mask"] = allowed
    out_t, w_t = theirs(x, x, x, need_weights=True, average_attn_weights=False, **kwargs_theirs)
    res = ours.inspect(x, **kwargs_ours)
    torch.testing.assert_close(res.output, out_t, atol=TOL, rtol=0)
    torch.testing.assert_close(res.weights, w_t, atol=TOL, rtol=0)
    # the fused path gives the same output
    fast = ours(x, **kwargs_ours)
    torch.testing.assert_close(fast, out_t, atol=TOL, rtol=0)


@pytest.mark.parametrize("masking", ["none", "padding"])
def test_gradients_through_weights_match_torch(masking: str) -> None:
    """Training on per-head weights: a loss on the output and on every head's weights gives the
    input and parameter gradients torch's module gives (float64)."""
    theirs, ours = _torch_pair(24, 4, True, seed=5)
    theirs.train(), ours.train()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 7, 24, dtype=torch.float64, generator=g)
    target = torch.randn(3, 4, 7, 7, dtype=torch.float64, generator=g)  # (B, H, T, S)
    real = torch.ones(3, 7, dtype=torch.bool)
    if masking == "padding":
        real[1, 5:] = False
    grads = []
    for run in ("torch", "headlab"):
        xi = x.clone().requires_grad_(True)
        if run == "torch":
            out, w = theirs(
                xi, xi, xi, need_weights=True, average_attn_weights=False, key_padding_mask=~real
            )
            params = [theirs.in_proj_weight, theirs.in_proj_bias, theirs.out_proj.weight]
        else:
            res = ours.inspect(xi, key_padding_mask=~real)
            out, w = res.output, res.weights
            params = [ours.in_proj.weight, ours.in_proj.bias, ours.out_proj.weight]
        loss = out.square().sum() + (w * target).sum()
        grads.append(torch.autograd.grad(loss, [xi, *params]))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=0)


def test_cross_attention_matches_torch() -> None:
    theirs, ours = _torch_pair(16, 2, True, seed=3)
    q = torch.randn(2, 4, 16, dtype=torch.float64)
    kv = torch.randn(2, 9, 16, dtype=torch.float64)
    out_t, w_t = theirs(q, kv, kv, need_weights=True, average_attn_weights=False)
    res = ours.inspect(q, kv)
    torch.testing.assert_close(res.output, out_t, atol=TOL, rtol=0)
    torch.testing.assert_close(res.weights, w_t, atol=TOL, rtol=0)


@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), [(4, 4, 6), (6, 2, 5), (4, 1, 8)])
@pytest.mark.parametrize("cross", [False, True])
def test_module_matches_numpy_reference(
    n_heads: int, n_kv_heads: int, head_dim: int, cross: bool
) -> None:
    torch.manual_seed(n_heads * 10 + n_kv_heads)
    mha = MultiHeadAttention(
        d_model=20, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, dtype=torch.float64
    )
    with torch.no_grad():
        mha.in_proj.bias.normal_()
    weights = HeadWeights.from_module(mha)
    x = torch.randn(2, 5, 20, dtype=torch.float64)
    kv = torch.randn(2, 7, 20, dtype=torch.float64) if cross else None
    s = 7 if cross else 5
    allowed = torch.rand(2, 5, s) > 0.3
    allowed[0, 2] = False  # one query with no key at all: defined as zeros
    res = mha.inspect(x, kv, attn_mask=allowed)
    for b in range(2):
        ref = reference_attention(
            x[b].numpy(), None if kv is None else kv[b].numpy(), weights, mask=allowed[b].numpy()
        )
        np.testing.assert_allclose(res.output[b].detach().numpy(), ref.output, atol=TOL, rtol=0)
        np.testing.assert_allclose(res.weights[b].detach().numpy(), ref.weights, atol=TOL, rtol=0)
        np.testing.assert_allclose(
            res.head_outputs[b].detach().numpy(), ref.head_outputs, atol=TOL, rtol=0
        )
        np.testing.assert_allclose(
            res.contributions[b].detach().numpy(), ref.contributions, atol=TOL, rtol=0
        )
    # a query with no key left attends nowhere: zero weights, and its output is the bias alone
    assert torch.all(res.weights[0, :, 2] == 0)
    torch.testing.assert_close(res.output[0, 2], mha.out_proj.bias.detach(), atol=TOL, rtol=0)


def test_fused_inference_projection_equals_the_autograd_path() -> None:
    """Without autograd, q/k/v come from torch's fused bias-scale-split pass; same numbers."""
    torch.manual_seed(3)
    mha = MultiHeadAttention(d_model=24, n_heads=4, bias=True).double().eval()
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    graph = mha.inspect(x, is_causal=True)  # parameters require grad: the plain path
    with torch.inference_mode():
        fused = mha.inspect(x, is_causal=True)
        fused_padded = mha(x, key_mask=torch.tensor([[True] * 7, [True] * 4 + [False] * 3]))
    plain_padded = mha(x, key_mask=torch.tensor([[True] * 7, [True] * 4 + [False] * 3]))
    assert torch.allclose(fused.output, graph.output, atol=1e-12)
    assert fused.weights is not None and graph.weights is not None
    assert torch.allclose(fused.weights, graph.weights, atol=1e-12)
    assert torch.allclose(fused_padded, plain_padded, atol=1e-12)


@pytest.mark.parametrize("masking", ["none", "padding", "causal"])
def test_weights_on_huge_pages_match_torch(masking: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without autograd, large weights are written to memory mapped for huge pages: the same
    numbers as torch, and they stay valid after everything else of the call is gone."""
    import gc

    from headlab.attention import memory

    monkeypatch.setattr(memory, "HUGE_FROM", 0)  # every weights tensor takes that route
    theirs, ours = _torch_pair(24, 4, bias=True)
    x = torch.randn(3, 7, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    real = torch.ones(3, 7, dtype=torch.bool)
    real[1, 4:] = False
    kw_t: dict = {"key_padding_mask": ~real} if masking == "padding" else {}
    kw_o: dict = {"key_padding_mask": ~real} if masking == "padding" else {}
    if masking == "causal":
        kw_t["attn_mask"] = ~torch.ones(7, 7, dtype=torch.bool).tril()
        kw_o["is_causal"] = True
    out_t, w_t = theirs(x, x, x, need_weights=True, average_attn_weights=False, **kw_t)
    with torch.inference_mode():
        res = ours.inspect(x, **kw_o)
        head = res.weights[1] if res.weights is not None else None
    del res
    gc.collect()
    assert head is not None
    torch.testing.assert_close(head, w_t[1], atol=TOL, rtol=0)
    with torch.inference_mode():
        torch.testing.assert_close(ours.inspect(x, **kw_o).output, out_t, atol=TOL, rtol=0)


def _resident_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_huge_page_tensors_are_sized_typed_and_returned() -> None:
    """``memory.empty`` gives a writable tensor of the asked shape and dtype; a large one is a
    mapping of its own, given back to the system with its last view."""
    from headlab.attention import memory

    small = memory.empty((3, 5), dtype=torch.float16, device=torch.device("cpu"))
    assert small.shape == (3, 5) and small.dtype == torch.float16
    if not memory.HUGE_PAGES:
        pytest.skip("no transparent huge pages here")
    shape = (memory.HUGE_FROM // 4 // 1024 + 1, 1024)
    before = _resident_bytes()
    for i in range(8):
        big = memory.empty(shape, dtype=torch.float32, device=torch.device("cpu"))
        view = big[1:]
        del big
        view.fill_(i)  # every page touched
        assert view.shape == (shape[0] - 1, 1024) and float(view[-1, -1]) == i
        assert view.data_ptr() % 4096 == 0  # its own mapping, past the first row's page
        del view
    assert _resident_bytes() - before < memory.HUGE_FROM  # 8 x 32 MiB touched, none kept


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_float32_inference_matches_float64(causal: bool, n_kv_heads: int) -> None:
    """Float32 inference (fused projections, in-place softmax, no autograd): per-head weights
    and outputs as the float64 autograd path gives them, for MHA, GQA and MQA, causal or not."""
    import copy

    torch.manual_seed(5)
    ours = MultiHeadAttention(d_model=32, n_heads=4, n_kv_heads=n_kv_heads, bias=True).eval()
    x = torch.randn(3, 37, 32)
    with torch.inference_mode():
        fast = ours.inspect(x, is_causal=causal)
    ref = copy.deepcopy(ours).double().inspect(x.double(), is_causal=causal)
    assert fast.weights is not None and ref.weights is not None
    assert (fast.weights.double() - ref.weights).abs().max() < 2e-6
    assert (fast.output.double() - ref.output).abs().max() < 1e-5
    if causal:
        assert bool((fast.weights.triu(1) == 0).all())


@pytest.mark.parametrize(
    ("n_kv_heads", "cross", "causal"),
    [(None, False, False), (None, False, True), (2, False, True), (1, True, False)],
)
def test_float32_weights_path_matches_float64(
    n_kv_heads: int | None,
    cross: bool,
    causal: bool,
) -> None:
    """``inspect`` in float32 without autograd: output, weights, head outputs and contributions as the
    same module computes them in float64, with a head mask, GQA/MQA, cross-attention and a
    causal mask over cached keys (T < S)."""
    torch.manual_seed(3)
    module = MultiHeadAttention(d_model=48, n_heads=4, n_kv_heads=n_kv_heads).eval()
    with torch.no_grad():
        module.in_proj.bias.normal_()
        module.out_proj.bias.normal_()
    double = MultiHeadAttention(d_model=48, n_heads=4, n_kv_heads=n_kv_heads).double().eval()
    double.load_state_dict(module.state_dict())
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 9, 48, generator=g)
    kv = torch.randn(3, 13, 48, generator=g) if cross else None
    if causal:  # the last 9 of 13 positions query: keys 0..3 come first
        kv = torch.randn(3, 13, 48, generator=g)
    gate = torch.tensor([1.0, 0.0, 0.5, 1.0])
    kwargs = {"is_causal": causal, "head_mask": gate}
    with torch.inference_mode():
        got = module.inspect(x, kv, **kwargs)
        want = double.inspect(x.double(), None if kv is None else kv.double(), **kwargs)
    for name in ("output", "weights", "head_outputs", "contributions"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == torch.float32
        assert (a.double() - b).abs().max() < 2e-5, name
    assert got.weights is not None and bool((got.weights[..., 0, 5:] == 0).all()) == causal


def test_cross_attention_to_no_keys_gives_zero_head_outputs() -> None:
    """With no key at all, every query row sees nothing: zero weights (of width 0) and zero
    head outputs, never NaN, as torch's sdpa gives."""
    torch.manual_seed(5)
    narrow = MultiHeadAttention(d_model=64, n_heads=2).eval()  # D = 32
    with torch.inference_mode():
        nothing = narrow.inspect(torch.randn(1, 3, 64), torch.randn(1, 0, 64))  # no keys
    assert torch.equal(nothing.head_outputs, torch.zeros(1, 2, 3, 32))
    assert nothing.weights is not None and tuple(nothing.weights.shape) == (1, 2, 3, 0)
