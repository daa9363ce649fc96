"""The mixed KV cache (:mod:`headlab.models.kv_mixed`) against independent oracles, in float64.

The oracle for a streaming head is a model of the same folder whose attention is a plain torch
loop, registered in transformers' ``AttentionInterface`` for these tests: every query head,
every query row, the keys the model's own (eager) mask lets it see, narrowed for a streaming
KV head to the sink and the last ``window`` positions; it runs without a cache, on the whole
sequence each time. The mixed cache must give its logits in one forward, in a token-by-token
decode and in ``generate``; with every head full, or a window as long as the text, it must give
the model's own logits; and it must hold the bytes its tensors say, fewer than the full cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.models.tiny import build

from headlab.errors import InputError
from headlab.models import LoadedModel, load
from headlab.models.kv_mixed import MixedKVCache, storage_bytes, streaming_mask

ORACLE = "headlab_test_restricted"
SINK, WINDOW = 2, 5
#: the oracle's streaming KV heads {layer: {kv head}}, set by each test
_STREAMING: dict[int, set[int]] = {}


def _restricted(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Eager attention, a loop over heads and rows; no cache, so keys are positions 0..S-1."""
    batch, n_heads, n_queries, head_dim = query.shape  # (B, H, T, D)
    n_kv, n_keys = key.shape[1], key.shape[2]
    group = n_heads // n_kv
    scale = head_dim**-0.5 if scaling is None else scaling
    streaming = _STREAMING.get(module.layer_idx, set())
    out = torch.zeros(batch, n_queries, n_heads, value.shape[-1], dtype=query.dtype)
    for b in range(batch):
        for h in range(n_heads):
            kv = h // group
            for t in range(n_queries):
                i = n_keys - n_queries + t  # this query's position
                seen = []
                for j in range(n_keys):
                    ok = j <= i and (mask is None or float(mask[b, 0, t, j]) == 0.0)
                    if kv in streaming:
                        ok = ok and (j < SINK or i - j < WINDOW)
                    seen.append(ok)
                keep = torch.tensor(seen)
                scores = (key[b, kv, keep] @ query[b, h, t]) * scale  # (s,)
                out[b, t, h] = torch.softmax(scores, -1) @ value[b, kv, keep]
    return out, None


def _oracle(folder: Path) -> Any:
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ORACLE, _restricted)
    AttentionMaskInterface.register(ORACLE, eager_mask)
    return AutoModelForCausalLM.from_pretrained(
        str(folder), attn_implementation=ORACLE, dtype=torch.float64
    ).eval()


@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma3"])
def models(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[LoadedModel, Any]:
    """Tiny Llama (4 query heads on 2 KV heads), GPT-2 (4 heads), Gemma 3 (two layers with a
    sliding window of 3, then a global one), opened by headlab and as the oracle."""
    folder = build(request.param, tmp_path_factory.mktemp(request.param), lm_head=True)
    lm = load(folder, with_lm_head=True, dtype=torch.float64)
    return lm, _oracle(folder)


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(5, 1000, (1, n), generator=torch.Generator().manual_seed(seed))


def _heads(lm: LoadedModel) -> list[tuple[int, int]]:
    """A streaming set that touches every layer, not all of any layer but the last."""
    n_kv = lm.layout.n_kv_heads
    last = lm.n_layers - 1
    chosen = [(layer, layer % n_kv) for layer in range(last)]
    return chosen + [(last, h) for h in range(n_kv)]


def _logits(lm: LoadedModel, ids: torch.Tensor, cache: MixedKVCache) -> torch.Tensor:
    with torch.no_grad(), cache:
        return lm.model(ids, cache=cache, use_cache=True).logits


def test_every_head_full_is_the_model(models: tuple[LoadedModel, Any]) -> None:
    lm, _ = models
    ids = _ids(30)
    with torch.no_grad():
        own = lm.model(ids).logits
    got = _logits(lm, ids, MixedKVCache(lm, [], sink=SINK, window=WINDOW))
    torch.testing.assert_close(got, own, atol=1e-5, rtol=0)


def test_window_as_long_as_the_text_is_the_model(models: tuple[LoadedModel, Any]) -> None:
    lm, _ = models
    ids = _ids(30)
    every = [(layer, h) for layer in range(lm.n_layers) for h in range(lm.layout.n_kv_heads)]
    with torch.no_grad():
        own = lm.model(ids).logits
    got = _logits(lm, ids, MixedKVCache(lm, every, sink=SINK, window=30))
    torch.testing.assert_close(got, own, atol=1e-5, rtol=0)


def test_streaming_heads_equal_restricted_eager_attention(
    models: tuple[LoadedModel, Any],
) -> None:
    """One forward over 24 tokens, then 6 decoded one at a time, against the oracle run on
    the whole 30 tokens; and the streaming heads change the logits (the test can fail)."""
    lm, oracle = models
    heads = _heads(lm)
    _STREAMING.clear()
    for layer, h in heads:
        _STREAMING.setdefault(layer, set()).add(h)
    ids = _ids(30, seed=1)
    with torch.no_grad():
        want = oracle(ids).logits
        own = lm.model(ids).logits
    assert float((want - own).abs().max()) > 1e-3  # restriction matters at 30 tokens
    torch.testing.assert_close(
        _logits(lm, ids, MixedKVCache(lm, heads, sink=SINK, window=WINDOW)), want, atol=1e-5, rtol=0
    )
    cache = MixedKVCache(lm, heads, sink=SINK, window=WINDOW)
    steps = []
    with torch.no_grad(), cache:
        steps.append(lm.model(ids[:, :24], cache=cache, use_cache=True).logits)
        for t in range(24, 30):
            steps.append(lm.model(ids[:, t : t + 1], cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), want, atol=1e-5, rtol=0)


def test_generate_equals_the_oracles_greedy_loop(models: tuple[LoadedModel, Any]) -> None:
    lm, oracle = models
    heads = _heads(lm)
    _STREAMING.clear()
    for layer, h in heads:
        _STREAMING.setdefault(layer, set()).add(h)
    ids = _ids(20, seed=2)
    cache = MixedKVCache(lm, heads, sink=SINK, window=WINDOW)
    with torch.no_grad(), cache:
        out = lm.model.generate(
            ids,
            cache=cache,
            max_new_tokens=6,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    sequence = ids
    with torch.no_grad():
        for step in range(6):
            logits = oracle(sequence).logits[:, -1]
            # generate hands its logits out in float32
            torch.testing.assert_close(out.logits[step], logits.float(), atol=1e-5, rtol=0)
            sequence = torch.cat([sequence, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.sequences, sequence)
    assert cache.get_seq_length() == 25  # the last token is not fed back


def test_bytes_are_the_kept_tokens(models: tuple[LoadedModel, Any]) -> None:
    """After 40 tokens a streaming head holds SINK + WINDOW - 1 of them, a full head all 40:
    the measured bytes are that count, and those of transformers' own cache when all is full."""
    from transformers import DynamicCache

    lm, _ = models
    ids = _ids(40)
    full = MixedKVCache(lm, [], sink=SINK, window=WINDOW)
    _logits(lm, ids, full)
    own = DynamicCache(config=lm.model.config)
    with torch.no_grad():
        lm.model(ids, cache=own, use_cache=True)
    assert full.kv_bytes() == storage_bytes(t for lay in own.layers for t in (lay.keys, lay.values))
    heads = [(layer, h) for layer in range(lm.n_layers) for h in range(lm.layout.n_kv_heads)]
    mixed = MixedKVCache(lm, heads[:3], sink=SINK, window=WINDOW)
    _logits(lm, ids, mixed)
    per_token = 2 * lm.head_dim * 8  # keys and values, float64
    saved = 3 * (40 - (SINK + WINDOW - 1)) * per_token
    sliding = [w is not None for w in lm.layout.layer_windows]
    if not any(sliding[layer] for layer, _ in heads[:3]):
        assert mixed.kv_bytes() == full.kv_bytes() - saved
    assert mixed.kv_bytes() < full.kv_bytes()
    cache = MixedKVCache(lm, heads, sink=SINK, window=WINDOW)
    _logits(lm, ids, cache)
    assert cache.kv_bytes() == len(heads) * (SINK + WINDOW - 1) * per_token


def test_streaming_mask_rule() -> None:
    """Query 9 of a text sees the sink (0, 1) and the window 5..9, never a later key."""
    positions = torch.arange(12)
    seen = streaming_mask(positions, 9, 1, sink=2, window=5)[0]
    assert seen.nonzero().flatten().tolist() == [0, 1, 5, 6, 7, 8, 9]


def test_bad_input_and_a_cache_used_outside_its_block(tmp_path: Path) -> None:
    lm = load(build("llama", tmp_path / "m", lm_head=True), with_lm_head=True)
    with pytest.raises(InputError, match="--window"):
        MixedKVCache(lm, [], window=0)
    with pytest.raises(InputError, match="--heads"):
        MixedKVCache(lm, [(7, 0)])
    cache = MixedKVCache(lm, [(0, 5)])
    with pytest.raises(InputError, match="KV head 5"), torch.no_grad(), cache:
        lm.model(_ids(8), cache=cache, use_cache=True)
    cache = MixedKVCache(lm, [(0, 1)])
    with pytest.raises(InputError, match="with cache"), torch.no_grad():
        lm.model(_ids(8), cache=cache, use_cache=True)
