"""What a set of streaming KV heads costs and saves, measured with the mixed cache itself
(:class:`headlab.models.kv_mixed.MixedKVCache`): the bytes it holds, the perplexity of a long
text read through it in chunks, passkeys answered by greedy decoding through it, and the time
per decoded token.

Every measurement runs the model with the cache, so what is saved is what the cache's tensors
no longer hold, and what is lost is what the model then gets wrong.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headlab.experiments.kv_scores import PasskeyIds
from headlab.models.kv_mixed import KVHead, MixedKVCache, storage_bytes
from headlab.models.loading import LoadedModel

#: tokens fed per forward when a long text is read through the cache
CHUNK = 512


def mixed_cache(lm: LoadedModel, streaming: Iterable[KVHead], sink: int, window: int) -> Any:
    """The mixed cache, or transformers' own ``DynamicCache`` when no head streams (the
    baseline that headlab's cache must match)."""
    from transformers import DynamicCache

    heads = list(streaming)
    if not heads:
        return DynamicCache(config=lm.model.config)
    return MixedKVCache(lm, heads, sink=sink, window=window)


def cache_bytes(cache: Any) -> int:
    """Bytes held by the cache's tensors (either kind of cache)."""
    if isinstance(cache, MixedKVCache):
        return cache.kv_bytes()
    return storage_bytes(t for layer in cache.layers for t in (layer.keys, layer.values))


class _Using:
    """``with cache:`` for the mixed cache, nothing for transformers' own."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def __enter__(self) -> None:
        if isinstance(self.cache, MixedKVCache):
            self.cache.__enter__()

    def __exit__(self, *exc: object) -> None:
        if isinstance(self.cache, MixedKVCache):
            self.cache.__exit__()


@dataclass(frozen=True)
class TextRead:
    """A text read through a cache: its perplexity and the bytes the cache held at the end."""

    perplexity: float
    kv_bytes: int


def read_text(
    lm: LoadedModel,
    ids: torch.Tensor,
    streaming: Iterable[KVHead],
    *,
    sink: int,
    window: int,
    chunk: int = CHUNK,
) -> TextRead:
    """Perplexity of ``ids`` ``(1, T)`` read ``chunk`` tokens at a time through a cache whose
    ``streaming`` heads keep ``sink`` + ``window`` tokens; each token is predicted from all the
    tokens before it that the cache still holds."""
    cache = mixed_cache(lm, streaming, sink, window)
    total = ids.shape[1]
    nll, count = 0.0, 0
    with torch.no_grad(), _Using(cache):
        for start in range(0, total, chunk):
            piece = ids[:, start : start + chunk].to(lm.device)
            logits = lm.model(input_ids=piece, cache=cache, use_cache=True).logits  # (1, t, V)
            targets = ids[:, start + 1 : start + chunk + 1].to(lm.device)  # (1, t') t' <= t
            logp = torch.log_softmax(logits[:, : targets.shape[1]].double(), -1)
            nll -= float(logp.gather(-1, targets[..., None]).sum())
            count += targets.numel()
    return TextRead(math.exp(nll / count), cache_bytes(cache))


@dataclass(frozen=True)
class Decoded:
    """A greedy decode: the tokens, the seconds per token after the first, the cache's bytes."""

    tokens: list[int]
    seconds_per_token: float
    kv_bytes: int


def decode(
    lm: LoadedModel,
    ids: torch.Tensor,
    n_tokens: int,
    streaming: Iterable[KVHead],
    *,
    sink: int,
    window: int,
) -> Decoded:
    """Greedy decoding of ``n_tokens`` after ``ids`` ``(1, T)``, one token per forward through
    the cache (as ``generate`` does); the time counts the forwards after the prompt's."""
    cache = mixed_cache(lm, streaming, sink, window)
    tokens: list[int] = []
    with torch.no_grad(), _Using(cache):
        out = lm.model(input_ids=ids.to(lm.device), cache=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        tokens.append(int(token))
        _sync(lm)
        began = time.perf_counter()
        for _ in range(n_tokens - 1):
            out = lm.model(input_ids=token, cache=cache, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(int(token))
        _sync(lm)
        spent = time.perf_counter() - began
    return Decoded(tokens, spent / max(n_tokens - 1, 1), cache_bytes(cache))


def _sync(lm: LoadedModel) -> None:
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)


def passkey_accuracy(
    lm: LoadedModel,
    prompts: Sequence[PasskeyIds],
    streaming: Iterable[KVHead],
    *,
    sink: int,
    window: int,
) -> float:
    """The share of ``prompts`` whose key the model decodes greedily, every digit right."""
    heads = list(streaming)
    right = 0
    for prompt in prompts:
        out = decode(lm, prompt.question, prompt.n_answer, heads, sink=sink, window=window)
        right += out.tokens == prompt.answer
    return right / len(prompts) if prompts else float("nan")


def curve_point(
    lm: LoadedModel,
    streaming: Sequence[KVHead],
    *,
    sink: int,
    window: int,
    text: torch.Tensor,
    prompts: Sequence[PasskeyIds],
    decode_tokens: int,
) -> dict[str, float]:
    """One point of the curve for a set of streaming heads: the KV bytes held after reading
    ``text`` ``(1, T)``, its perplexity, the passkey accuracy on ``prompts``, and the
    milliseconds per token of ``decode_tokens`` greedy tokens after ``text``."""
    read = read_text(lm, text, streaming, sink=sink, window=window)
    accuracy = passkey_accuracy(lm, prompts, streaming, sink=sink, window=window)
    timed = decode(lm, text, decode_tokens, streaming, sink=sink, window=window)
    n = lm.n_layers * lm.layout.n_kv_heads
    return {
        "fraction": len(streaming) / n,
        "kv_bytes": read.kv_bytes,
        "passkey": accuracy,
        "perplexity": read.perplexity,
        "ms_per_token": 1000 * timed.seconds_per_token,
    }
