"""headlab.attention.compiled: one block's weights and statistics, compiled or eager, against
float64 torch over the whole matrices; a failed compilation falls back to eager torch."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from headlab.attention import compiled
from headlab.errors import ShapeError


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    compiled.reset()
    yield
    compiled.reset()


def oracle(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    columns: torch.Tensor,
    lengths: torch.Tensor,
    rows: torch.Tensor,
    scale: float,
) -> dict[str, torch.Tensor]:
    """float64 attention with key/value heads repeated, as a plain loop-free reference."""
    group = query.shape[1] // key.shape[1]
    k = key.double().repeat_interleave(group, dim=1)  # (B, H, s, D)
    v = value.double().repeat_interleave(group, dim=1)
    scores = scale * query.double() @ k.transpose(-2, -1)  # (B, H, t, s)
    s = key.shape[2]
    visible = torch.arange(s)[None, None, None, :] < lengths[:, None, None, None]
    visible = visible & (torch.arange(s)[None, :] <= rows[:, None])
    weights = torch.softmax(scores.masked_fill(~visible, -1e30), -1)
    return {
        "weights": weights,
        "top": weights.amax(-1),
        "entropy": -torch.xlogy(weights, weights).sum(-1),
        "mixed": weights @ columns.double()[:, None],
        "product": weights @ v,
    }


CASES = [
    # B, H, Hkv, t, s, D, causal, first row
    (2, 4, 4, 5, 9, 8, False, 0),
    (3, 6, 2, 7, 19, 16, True, 12),  # GQA, a causal block that sees 19 keys
    (2, 3, 1, 4, 4, 40, True, 0),  # MQA, the first causal block
]


def inputs(case: tuple) -> tuple:
    n_batch, n_heads, n_kv, t, s, d, causal, first = case
    g = torch.Generator().manual_seed(t * s + d)
    tokens = torch.randn(n_batch, t, n_heads, d, generator=g)  # (B, t, H, D)
    query = tokens.transpose(1, 2)  # (B, H, t, D), a model's head view
    key = torch.randn(n_batch, n_kv, s, d, generator=g)
    value = torch.randn(n_batch, n_kv, s, d, generator=g)
    columns = torch.rand(n_batch, s, 3, generator=g)
    lengths = torch.tensor([s, max(1, s - 3), 0][:n_batch])  # the last: no key (if B = 3)
    rows = torch.arange(first, first + t) if causal else torch.full((t,), s)
    return query, key, value, columns, lengths, rows


def check(case: tuple, *, use_compiled: bool) -> None:
    query, key, value, columns, lengths, rows = inputs(case)
    got = compiled.block_statistics(
        query, key, value, scale=0.3, rows=rows, lengths=lengths, columns=columns,
        compiled=use_compiled,
    )  # fmt: skip
    expect = oracle(query, key, value, columns, lengths, rows, 0.3)
    real = lengths > 0  # rows that see a key; the others are checked apart
    for name, tol in [("weights", 2e-6), ("top", 2e-6), ("entropy", 2e-5), ("mixed", 2e-6),
                      ("product", 2e-5)]:  # fmt: skip
        value_got = getattr(got, name)
        assert value_got.dtype == torch.float32
        assert (value_got[real] - expect[name][real]).abs().max() < tol, name
    assert torch.equal(got.top, got.weights.amax(-1)) or (
        (got.top - got.weights.amax(-1)).abs().max() < 1e-7
    )
    if not bool(real.all()):  # no visible key: uniform weights over the block's keys
        s = key.shape[2]
        none = got.weights[~real]
        assert torch.allclose(none, torch.full_like(none, 1 / s))
        assert torch.allclose(got.entropy[~real], torch.full_like(got.entropy[~real], s).log())


@pytest.mark.parametrize("case", CASES)
def test_eager_block_matches_float64(case: tuple) -> None:
    check(case, use_compiled=False)


def test_compiled_blocks_match_float64() -> None:
    """The compiled function (a second block shape: recompiled for dynamic shapes) gives the
    same results; where compilation is unavailable, the eager fallback does."""
    for case in CASES[1:]:
        check(case, use_compiled=True)


def test_a_failed_compilation_falls_back_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(fn: object, **kwargs: object) -> object:
        def run(*args: object) -> object:
            raise RuntimeError("no C++ compiler here\nsecond line")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    with caplog.at_level(logging.WARNING, logger="headlab.attention.compiled"):
        check(CASES[0], use_compiled=True)
    why = compiled.why_not()
    assert why == "torch.compile failed (RuntimeError: no C++ compiler here)"
    assert why in caplog.text
    check(CASES[0], use_compiled=True)  # stays eager without trying again
    assert caplog.text.count("torch.compile failed") == 1


def test_compilation_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADLAB_COMPILE", "0")
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled"))
    check(CASES[0], use_compiled=True)
    assert compiled.why_not() == "HEADLAB_COMPILE=0"


def test_shapes_that_do_not_fit_are_refused() -> None:
    query, key, value, _, _, rows = inputs(CASES[0])
    with pytest.raises(ShapeError, match="rows must be"):
        compiled.block_statistics(query, key, value, scale=1.0, rows=rows[:-1])
    with pytest.raises(ShapeError, match="do not fit"):
        compiled.block_statistics(query[..., :4], key, value, scale=1.0, rows=rows)
