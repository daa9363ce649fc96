"""Attention computed by headlab in query blocks, with every block's weights handed out on the way.

Inside ``with StreamingAttention(lm, consumer):`` each attention layer of ``lm.model`` computes
its own output, one block of query rows at a time: scores ``q k^T``, softmax, weights times
values, the same arithmetic as eager attention. Before a block's weights are used for the output,
``consumer.block`` gets them with each row's entropy and argmax, and the attention-weighted sums
of any per-key columns the consumer asked for (computed in the same matrix product as the output).

This is what makes head statistics cost little more than the model's own forward: the patterns are
never recomputed, no layer's ``H x T x S`` tensor exists at once (a block is about
``block_elements`` weights), and nothing is kept between layers. Causal layers skip the keys a
block cannot see. The model's outputs match its sdpa outputs to float rounding, rows with no
visible key included (zeros). The arithmetic is the attention engine's,
:func:`headlab.attention.blocks.attention_blocks`; this module hooks it into the model.

Shape vocabulary: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``T`` queries, ``S``
keys, ``D`` head width, ``t`` rows in a block, ``s`` keys a block sees, ``X`` consumer columns.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from headlab.attention.blocks import Workspace, attention_blocks, key_lengths
from headlab.errors import InputError
from headlab.models.interface import by_module, call_rules, observe, per_call
from headlab.models.loading import LoadedModel


class BlockConsumer(Protocol):
    """What :class:`StreamingAttention` feeds, layer by layer and block by block."""

    def columns(self, layer: int) -> torch.Tensor | None:
        """Per-key values ``(B, S, X)`` whose attention-weighted sums each block needs."""

    def block(
        self,
        layer: int,
        start: int,
        weights: torch.Tensor,
        entropy: torch.Tensor,
        top: torch.Tensor,
        mixed: torch.Tensor | None,
    ) -> None:
        """Query rows ``start:start+t``: weights ``(B, H, t, s)`` (keys ``0:s``; a causal block
        sees no later key), each row's entropy and largest weight ``(B, H, t)``, mixed
        ``(B, H, t, X)``. The weights live in a buffer that the next block overwrites: copy
        them to keep them."""

    def layer_done(self, layer: int) -> None:
        """Every block of ``layer`` has been seen."""


class StreamingAttention:
    """Context manager: ``lm``'s attention layers compute their output in query blocks and hand
    each block to ``consumer`` (:class:`BlockConsumer`).

    Args:
        lm: the model.
        consumer: gets ``columns``, ``block`` and ``layer_done`` calls during each forward pass.
        block_elements: about this many weights per block.
        dtype: precision of ``q k^T`` (default: the model's).
        stop_after_last: end the forward pass as soon as every layer's attention has been
            handed out: what comes after (the last layer's output projection and MLP, final
            norms, any head on top) cannot change a pattern. The ``with`` block then ends at the
            forward call, without an error, and the model returns nothing.

    Example:
        >>> with StreamingAttention(lm, consumer):   # doctest: +SKIP
        ...     lm.model(**batch)
    """

    def __init__(
        self,
        lm: LoadedModel,
        consumer: BlockConsumer,
        *,
        block_elements: int = 1 << 20,
        dtype: torch.dtype | None = None,
        stop_after_last: bool = False,
    ) -> None:
        if block_elements < 1:
            raise InputError(f"block_elements must be 1 or more, got {block_elements}")
        self.lm = lm
        self.consumer = consumer
        self.block_elements = block_elements
        self.dtype = dtype
        self.stop_after_last = stop_after_last
        self._pending: set[int] = set()  # layers not yet seen in this forward pass
        self._removers: list[Any] = []
        self._workspace = Workspace()
        # every layer of a forward pass gets the same mask tensor: its lengths are found once
        # (the tensor is held, so a later mask cannot be mistaken for it)
        self._mask: tuple[Any, ...] | None = None
        self._use_cache: Any = None

    def _lengths(
        self, mask: torch.Tensor | None, causal: bool, n_queries: int, n_keys: int
    ) -> list[int] | None:
        shape = (causal, n_queries, n_keys)
        cached = self._mask
        if cached is None or cached[0] is not mask or cached[1] != shape:
            cached = self._mask = (mask, shape, key_lengths(mask, causal, n_queries, n_keys))
        return cached[2]

    def _layer(self, layer: int) -> Any:
        consumer = self.consumer

        def attend(
            module: nn.Module,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            mask: Any,
            kwargs: dict[str, Any],
        ) -> torch.Tensor:
            for name in ("s_aux", "sinks"):
                if kwargs.get(name) is not None:
                    raise InputError(
                        f"layer {layer} uses attention {name!r}, which headlab's block attention "
                        "does not implement"
                    )
            n_queries, n_keys = query.shape[2], key.shape[2]
            causal, scaling = call_rules(module, query, key, mask, kwargs)

            def on_block(start: int, *parts: Any) -> None:
                consumer.block(layer, start, *parts)

            mask = mask if isinstance(mask, torch.Tensor) else None
            out = attention_blocks(
                query,
                key,
                value,
                mask=mask,
                causal=causal,
                scaling=scaling,
                on_block=on_block,
                columns=_on(consumer.columns(layer), query.device),
                bias=kwargs.get("position_bias"),
                block_elements=self.block_elements,
                dtype=self.dtype,
                workspace=self._workspace,
                lengths=self._lengths(mask, causal, n_queries, n_keys),
                softcap=kwargs.get("softcap"),
            )
            consumer.layer_done(layer)
            if self.stop_after_last:
                self._pending.discard(layer)
                if not self._pending:
                    self._pending = set(range(len(self.lm.layers)))
                    raise _ForwardDone
            return out

        return attend

    def __enter__(self) -> StreamingAttention:
        self._pending = set(range(len(self.lm.layers)))
        # a decoder's forward keeps every layer's keys and values for generation by default;
        # nothing here reads them (44 of the 147 MiB of a 100M decoder's peak at 1,023 tokens)
        config = self.lm.model.config
        self._use_cache = getattr(config, "use_cache", None)
        if self._use_cache:
            config.use_cache = False
        try:
            for module, served in by_module([h.attention for h in self.lm.layers]):
                fn = per_call([self._layer(layer) for layer in served])
                self._removers.append(observe(module, fn, computes_output=True))
        except BaseException:
            self.__exit__(None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> bool:
        while self._removers:
            self._removers.pop()()
        self._mask = None
        if self._use_cache:
            self.lm.model.config.use_cache = self._use_cache
            self._use_cache = None
        return exc_type is _ForwardDone


class _ForwardDone(BaseException):
    """Raised inside the model once every layer's attention has been seen
    (``stop_after_last``); :class:`StreamingAttention` swallows it on exit. Not an
    ``Exception``: no ``except Exception`` in model code may mistake it for an error."""


def _on(columns: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A consumer's columns where the layer runs (a model spread over devices)."""
    return None if columns is None else columns.to(device)
