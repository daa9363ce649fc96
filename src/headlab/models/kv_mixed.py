"""A KV cache that keeps the whole context for some KV heads and only a sink and a window for the rest.

Long-context work (DuoAttention, Xiao et al. 2024; retrieval heads, Wu et al. 2024) found that
most heads look at the first few tokens (the *sink*) and the last few, and only a few retrieve
from anywhere. :class:`MixedKVCache` is a transformers ``Cache``: a *full* KV head keeps every
token, as transformers' own cache layer does (``DynamicLayer``, or ``DynamicSlidingWindowLayer``
on a sliding-window layer); a *streaming* KV head keeps the first ``sink`` tokens and the last
``window - 1`` (what its next query needs beside its own key), so its memory stops growing.

A streaming head's query at position ``i`` sees key ``j`` when ``j <= i`` and (``j < sink`` or
``i - j < window``), and also what the model's own mask lets it see (padding, a sliding window):
in a forward over a long text (prefill) as in ``generate``, so a prefill and a token-by-token
decode compute the same thing.

Heads with different key lengths cannot share one attention call, so each layer's cache hands
transformers the full heads' keys and values (the tensors of its own cache layer) and keeps the
streaming heads' keys, values and positions for the attention call that follows; inside ``with
cache:`` headlab's attention function (:mod:`headlab.models.interface`) computes the layer's
output in two calls of the model's own attention function (sdpa, or its eager one): the full
heads' query groups with the model's mask, the streaming heads' with that mask restricted to the
sink and the window. No family's code is touched; a layer with no streaming head runs exactly as
without headlab (the same call, the same tensors).

Shape vocabulary: ``B`` batch, ``H`` query heads, ``Hkv`` KV heads (``Hf`` full, ``Hs``
streaming), ``G = H // Hkv``, ``T`` new tokens, ``S`` keys, ``s`` a streaming head's keys, ``D``
head width.

Example:
    >>> cache = MixedKVCache(lm, {(3, 0), (5, 1)}, sink=4, window=256)  # doctest: +SKIP
    >>> with cache:
    ...     lm.model.generate(ids, past_key_values=cache, max_new_tokens=20)
    >>> cache.kv_bytes()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer

from headlab.errors import InputError
from headlab.models.interface import EAGER_IMPLEMENTATION, base_attention, by_module, observe
from headlab.models.loading import LoadedModel

#: one KV head: (layer, KV head)
KVHead = tuple[int, int]


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes the tensors' storages hold, each storage counted once: what the cache keeps in
    memory (a view that keeps a larger tensor alive counts that tensor whole)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is not None and tensor.numel() > 0:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class MixedLayer(CacheLayerMixin):
    """One layer's cache: transformers' own layer (``full``) for the full KV heads, the sink and
    the recent window for the streaming ones.

    Args:
        full: transformers' cache layer for this layer's type; it receives the full heads only.
        streaming: the layer's streaming KV heads.
        sink: tokens kept at the start; window: the last tokens a streaming query sees (itself
            included).
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, full: DynamicLayer, streaming: Iterable[int], sink: int, window: int):
        super().__init__()
        self.full = full
        self.streaming = tuple(sorted(set(streaming)))
        self.sink, self.window = sink, window
        self.length = 0  # tokens seen
        self.full_heads = torch.empty(0, dtype=torch.long)  # (Hf,) index, set on first update
        self.stream_heads = torch.empty(0, dtype=torch.long)  # (Hs,) index
        self.sink_keys: torch.Tensor | None = None  # (B, Hs, <= sink, D), values alike
        self.sink_values: torch.Tensor | None = None
        self.recent_keys: torch.Tensor | None = None  # (B, Hs, <= window - 1, D)
        self.recent_values: torch.Tensor | None = None
        #: what the attention call in progress needs of the streaming heads: keys and values
        #: (B, Hs, s, D), their positions (s,), the new tokens' first position and the full
        #: keys' first position; taken (and cleared) by the attention call
        self.pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None = None
        self.attached = False  # inside ``with cache:``, where attention reads ``pending``

    @property
    def is_sliding(self) -> bool:
        return bool(getattr(self.full, "is_sliding", False))

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        n_kv = key_states.shape[1]
        if self.streaming and self.streaming[-1] >= n_kv:
            raise InputError(
                f"--heads: KV head {self.streaming[-1]} does not exist (this layer has {n_kv})"
            )
        device = key_states.device
        full = [h for h in range(n_kv) if h not in self.streaming]
        self.full_heads = torch.tensor(full, dtype=torch.long, device=device)
        self.stream_heads = torch.tensor(self.streaming, dtype=torch.long, device=device)
        self.device = device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``T`` new tokens ``(B, Hkv, T, D)``; return the full heads' keys and values
        ``(B, Hf, S, D)`` for the attention call (every head's when none streams)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, new = self.length, key_states.shape[-2]
        self.length += new
        if not self.streaming:
            keys, values = self.full.update(key_states, value_states)
            self.keys, self.values = self.full.keys, self.full.values
            return keys, values
        if not self.attached:
            raise InputError(
                "a MixedKVCache with streaming heads runs inside `with cache:` (its attention "
                "is computed there); it was passed to a model outside it"
            )
        keys, values = self.full.update(
            key_states.index_select(1, self.full_heads),
            value_states.index_select(1, self.full_heads),
        )
        self.keys, self.values = self.full.keys, self.full.values
        stream = self._stream(
            key_states.index_select(1, self.stream_heads),
            value_states.index_select(1, self.stream_heads),
            start,
        )
        self.pending = (*stream, self.length - keys.shape[-2])
        return keys, values

    def _stream(
        self, keys: torch.Tensor, values: torch.Tensor, start: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The streaming heads' keys and values for this call (kept ones, then the new), with
        their positions; keeps the sink and the last ``window - 1`` of them."""
        new = keys.shape[-2]
        kept_sink = 0 if self.sink_keys is None else self.sink_keys.shape[-2]
        kept_recent = 0 if self.recent_keys is None else self.recent_keys.shape[-2]
        parts_k = [t for t in (self.sink_keys, self.recent_keys) if t is not None] + [keys]
        parts_v = [t for t in (self.sink_values, self.recent_values) if t is not None] + [values]
        all_keys = torch.cat(parts_k, dim=-2)  # (B, Hs, s, D)
        all_values = torch.cat(parts_v, dim=-2)
        device = keys.device
        positions = torch.cat(
            [
                torch.arange(kept_sink, device=device),
                torch.arange(start - kept_recent, start + new, device=device),
            ]
        )  # (s,) increasing: the sink, the window, the new tokens
        n_sink = min(self.sink, self.length)
        n_recent = min(self.window - 1, self.length - n_sink)
        s = all_keys.shape[-2]
        # clones: a slice would keep the whole concatenation alive
        self.sink_keys = all_keys[:, :, :n_sink].clone() if n_sink else None
        self.sink_values = all_values[:, :, :n_sink].clone() if n_sink else None
        self.recent_keys = all_keys[:, :, s - n_recent :].clone() if n_recent else None
        self.recent_values = all_values[:, :, s - n_recent :].clone() if n_recent else None
        return all_keys, all_values, positions, start

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.is_sliding:
            return self.full.get_mask_sizes(query_length)
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.full.get_max_length()

    def tensors(self) -> list[torch.Tensor | None]:
        """Every tensor this layer keeps between calls."""
        return [
            self.full.keys,
            self.full.values,
            self.sink_keys,
            self.sink_values,
            self.recent_keys,
            self.recent_values,
        ]

    def reset(self) -> None:
        self.full.reset()
        self.length = 0
        self.sink_keys = self.sink_values = self.recent_keys = self.recent_values = None
        self.keys = self.values = None
        self.pending = None

    def crop(self, tokens_to_remove: int) -> None:
        raise InputError("a mixed KV cache cannot be cropped: its streaming heads have evicted")

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        for name in ("sink_keys", "sink_values", "recent_keys", "recent_values"):
            tensor = getattr(self, name)
            if tensor is not None:
                setattr(self, name, fn(tensor))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.full.reorder_cache(beam_idx)
        self._apply(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.full.batch_repeat_interleave(repeats)
        self._apply(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.full.batch_select_indices(indices)
        self._apply(lambda t: t[indices, ...])


class MixedKVCache(Cache):
    """A transformers ``Cache`` for ``lm`` whose ``streaming`` KV heads keep only ``sink`` +
    ``window`` tokens; use it inside ``with cache:`` (which routes each layer's attention through
    it) as ``past_key_values`` of a forward or of ``generate``.

    Args:
        lm: the model (loaded by headlab, so its attention runs through headlab's function).
        streaming: the streaming KV heads, as (layer, KV head) pairs; the rest keep everything.
        sink: the first tokens every streaming head keeps (attention sinks).
        window: the last tokens a streaming head's query sees, its own included.
    """

    def __init__(
        self, lm: LoadedModel, streaming: Iterable[KVHead], *, sink: int = 4, window: int = 256
    ) -> None:
        if window < 1:
            raise InputError(f"--window must be 1 or more, got {window}")
        if sink < 0:
            raise InputError(f"--sink must be 0 or more, got {sink}")
        heads: dict[int, list[int]] = {}
        for layer, head in streaming:
            if not 0 <= layer < lm.n_layers or head < 0:
                raise InputError(
                    f"--heads: expected (layer, KV head) with layer in 0..{lm.n_layers - 1}, "
                    f"got ({layer}, {head})"
                )
            heads.setdefault(int(layer), []).append(int(head))
        base = DynamicCache(config=lm.model.config)
        if len(base.layers) != lm.n_layers:  # a config transformers cannot type per layer
            base.layers = [DynamicLayer() for _ in range(lm.n_layers)]
        layers = [
            MixedLayer(cast(DynamicLayer, full), heads.get(i, ()), sink, window)
            for i, full in enumerate(base.layers)
        ]
        super().__init__(layers=list[Any](layers))
        self.mixed = layers  # the same layers, as what they are
        self.lm = lm
        self.sink, self.window = sink, window
        self._eager = lm.model.config._attn_implementation == EAGER_IMPLEMENTATION
        self._removers: list[Callable[[], None]] = []

    def kv_bytes(self) -> int:
        """Bytes the cache holds now, read from its tensors' storages."""
        return storage_bytes(t for layer in self.mixed for t in layer.tensors())

    def __enter__(self) -> MixedKVCache:
        try:
            modules = [h.attention for h in self.lm.layers]
            for module, served in by_module(modules):
                if len(served) != 1:
                    raise InputError(
                        f"{type(module).__name__} serves {len(served)} layers; a mixed KV cache "
                        "needs one attention module per layer"
                    )
                index = getattr(module, "layer_idx", served[0])
                self._removers.append(
                    observe(module, self._attend(self.mixed[index]), computes_output=True)
                )
                self.mixed[index].attached = True
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        while self._removers:
            self._removers.pop()()
        for layer in self.mixed:
            layer.pending = None
            layer.attached = False

    def _attend(self, layer: MixedLayer) -> Callable[..., torch.Tensor | None]:
        eager = self._eager

        def attend(
            module: nn.Module,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            mask: Any,
            kwargs: dict[str, Any],
        ) -> torch.Tensor | None:
            pending, layer.pending = layer.pending, None
            if pending is None:  # no streaming head here, or a call without this cache
                return None
            return _mixed_attention(
                module, layer, query, key, value, mask, kwargs, pending, eager=eager
            )

        return attend


def streaming_mask(
    positions: torch.Tensor, first_query: int, n_queries: int, sink: int, window: int
) -> torch.Tensor:
    """Which keys a streaming head's queries see ``(T, s)``: query ``i`` sees key ``j`` when
    ``j <= i`` and (``j < sink`` or ``i - j < window``).

    Shape:
        positions: ``(s,)`` the keys' positions; result ``(T, s)`` bool.
    """
    queries = torch.arange(first_query, first_query + n_queries, device=positions.device)
    gap = queries[:, None] - positions[None, :]  # (T, s)
    return (gap >= 0) & ((positions[None, :] < sink) | (gap < window))


def _model_visible(mask: Any, positions: torch.Tensor, first_full: int) -> torch.Tensor | None:
    """The model's own mask ``(B, 1, T, S)`` (over the full keys, the first at ``first_full``)
    read at the streaming keys' positions: ``(B, 1, T, s)`` bool, or None without a mask."""
    if not isinstance(mask, torch.Tensor):
        return None
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    column = positions - first_full  # (s,)
    inside = (column >= 0) & (column < visible.shape[-1])
    picked = visible.index_select(-1, column.clamp(0, visible.shape[-1] - 1))
    return picked & inside


def _mixed_attention(
    module: nn.Module,
    layer: MixedLayer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Any,
    kwargs: dict[str, Any],
    pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int],
    *,
    eager: bool,
) -> torch.Tensor:
    """The layer's attention output ``(B, T, H, D)``: the full heads' query groups over ``key``
    and ``value`` with the model's mask, the streaming heads' over their sink and window."""
    stream_keys, stream_values, positions, first_query, first_full = pending
    forward = base_attention(module, eager=eager)
    batch, n_heads, n_queries, _ = query.shape  # (B, H, T, D)
    n_kv = layer.full_heads.numel() + layer.stream_heads.numel()
    group = n_heads // n_kv
    expand = torch.arange(group, device=query.device)

    def query_heads(kv_heads: torch.Tensor) -> torch.Tensor:
        return (kv_heads[:, None] * group + expand[None, :]).reshape(-1)  # (Hkv' * G,)

    out = query.new_empty(batch, n_queries, n_heads, value.shape[-1])  # (B, T, H, D)
    if layer.full_heads.numel():
        heads = query_heads(layer.full_heads)
        full, _ = forward(module, query.index_select(1, heads), key, value, mask, **kwargs)
        out[:, :, heads] = full
    rule = streaming_mask(positions, first_query, n_queries, layer.sink, layer.window)
    model = _model_visible(mask, positions, first_full)
    visible = rule[None, None] if model is None else model & rule  # (B or 1, 1, T, s)
    # a row that sees nothing (a padding query) sees everything, as transformers' own masks do
    visible = visible | ~visible.any(-1, keepdim=True)
    if eager:  # eager attention adds its mask
        visible = torch.zeros_like(visible, dtype=query.dtype).masked_fill(
            ~visible, torch.finfo(query.dtype).min
        )
    heads = query_heads(layer.stream_heads)
    call = {k: v for k, v in kwargs.items() if k != "is_causal"}
    streamed, _ = forward(
        module, query.index_select(1, heads), stream_keys, stream_values, visible, **call
    )
    out[:, :, heads] = streamed
    return out
