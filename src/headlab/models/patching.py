"""Hooks for causal interventions on heads: swap head outputs between runs, batched over copies.

Activation patching asks what happens to a behaviour when one head's output is taken from
another run. headlab answers it for every head at once by stacking *copies* of a batch: a
forward pass over ``N x B`` rows, where copy ``n`` of the ``B`` prompts has its own set of heads
replaced. :class:`HeadPatch` is that intervention; :class:`Residuals` records what each decoder
layer reads, so that a patched pass can start at the patched layer (:func:`run_from`) instead of
recomputing the identical layers below it; :class:`HeadOutputs` keeps each layer's head outputs
inside the autograd graph, for gradients with respect to them.

A head's output is its slice of the output projection's input (the concatenation of heads),
as everywhere in headlab (:mod:`headlab.models.capture`).

Shape vocabulary: ``N`` copies, ``B`` prompts, ``T`` tokens, ``H`` heads, ``D`` head width,
``E`` model width.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headlab.models.hooks import HeadFn, Hooks, Swap
from headlab.models.loading import LoadedModel


class HeadPatch(Hooks):
    """Context manager: in a forward pass over ``N x B`` rows (copy-major), replace head outputs
    as ``swaps`` say, layer by layer; swaps of one layer apply in order (a later one wins).

    Example: every head of layer 3 patched from the corrupted run, one head per copy::

        H = lm.layout.heads_per_layer[3]
        swap = Swap(source=corrupt_heads, select=torch.eye(H, dtype=torch.bool))
        with HeadPatch(lm, {3: [swap]}):
            out = lm.model(input_ids=clean_ids.repeat(H, 1))
    """

    def __init__(self, lm: LoadedModel, swaps: Mapping[int, Sequence[Swap]]) -> None:
        super().__init__()
        self.lm = lm
        self.swaps = {int(k): list(v) for k, v in swaps.items() if v}

    def install(self) -> None:
        self.at_heads(self.lm, self.swaps)


class HeadOutputs(Hooks):
    """Context manager that keeps every layer's head outputs ``(B, T, H, D)`` as they enter the
    output projection, inside the autograd graph (for ``torch.autograd.grad``); ``detach=True``
    keeps plain copies instead."""

    def __init__(self, lm: LoadedModel, *, detach: bool = False) -> None:
        super().__init__()
        self.lm = lm
        self.detach = detach
        self.outputs: dict[int, torch.Tensor] = {}

    def _keep(self, layer: int) -> HeadFn:
        def keep(z: torch.Tensor) -> torch.Tensor | None:
            if self.detach:
                self.outputs[layer] = z.detach().clone()
                return None
            # The projection must read the very tensor kept, or a gradient with respect to it
            # would not flow: hand it back as the projection's input.
            self.outputs[layer] = z
            return z

        return keep

    def install(self) -> None:
        self.at_heads(self.lm, {layer: [self._keep(layer)] for layer in range(self.lm.n_layers)})


def decoder_layers(lm: LoadedModel) -> tuple[nn.Module, str, nn.ModuleList] | None:
    """The module list of a one-stack model's blocks, with its parent and attribute name: the
    ``nn.ModuleList`` with one child per layer, child ``i`` holding layer ``i``'s attention.
    ``None`` when there is none (encoder-decoders, shared layers)."""
    attentions = [h.attention for h in lm.layers]
    if len({id(a) for a in attentions}) != len(attentions) or lm.n_layers == 0:
        return None
    for parent in lm.model.modules():
        for name, child in parent.named_children():
            if not isinstance(child, nn.ModuleList) or len(child) != lm.n_layers:
                continue
            if all(
                any(m is attentions[i] for m in block.modules()) for i, block in enumerate(child)
            ):
                return parent, name, child
    return None


def _uniform_layers(lm: LoadedModel) -> bool:
    """Whether every layer runs the same kind of attention (no per-layer mask types, which a
    model's forward looks up by the layer's position in its loop)."""
    config = lm.model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    return len(set(lm.layout.layer_windows)) <= 1 and (not types or len(set(types)) == 1)


class Residuals(Hooks):
    """Context manager recording each decoder block's input ``(B, T, E)`` (the residual stream
    it reads) in one forward pass; ``None`` entries where the model has no block list."""

    def __init__(self, lm: LoadedModel) -> None:
        super().__init__()
        self.lm = lm
        self.inputs: dict[int, torch.Tensor] = {}

    def install(self) -> None:
        found = decoder_layers(self.lm)
        if found is not None:
            self.on_layers(list(found[2]), self._hook, pre=True, with_kwargs=True)

    def _hook(self, layer: int) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs.get("hidden_states")
            if isinstance(hidden, torch.Tensor):
                self.inputs[layer] = hidden.detach()

        return hook


def can_start_later(lm: LoadedModel) -> bool:
    """Whether :func:`run_from` can skip the layers below its start on this model."""
    return decoder_layers(lm) is not None and _uniform_layers(lm)


@contextmanager
def starting_at(
    lm: LoadedModel, layer: int, hidden: torch.Tensor | None, *, must_feed: bool = False
) -> Iterator[None]:
    """Within the block, block ``layer`` reads ``hidden`` ``(N*B, T, E)`` instead of what the
    blocks below would have given it, and (where :func:`can_start_later` says so) the model's
    forward runs only blocks ``layer..L-1``.

    The embedding still runs (it is cheap and gives the blocks their positions and masks).
    With ``hidden=None``, or on a model without one list of blocks, nothing changes, unless
    ``must_feed`` (``hidden`` differs from what the blocks below compute): then that raises
    ``ValueError``."""
    found = decoder_layers(lm) if hidden is not None else None
    if found is None:
        if must_feed:
            raise ValueError(f"{lm.name}: its blocks' residual stream cannot be fed")
        yield
        return
    parent, name, blocks = found

    def feed(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    feeding = Hooks()
    feeding.before(blocks[layer], feed, with_kwargs=True)
    skip = layer > 0 and can_start_later(lm)
    if skip:
        parent._modules[name] = nn.ModuleList(list(blocks)[layer:])
    try:
        yield
    finally:
        if skip:
            parent._modules[name] = blocks
        feeding.remove()


class OutputRecord(Hooks):
    """Context manager keeping plain copies of some modules' outputs ``(B, T, C)`` in one
    forward pass (``outputs[module]``); a module that returns a tuple is read at its first
    element."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.modules = list(modules)
        self.outputs: dict[nn.Module, torch.Tensor] = {}

    def install(self) -> None:
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            first = out[0] if isinstance(out, tuple) else out
            self.outputs[mod] = first.detach().clone()

        for module in self.modules:
            self.after(module, hook)


@dataclass(frozen=True, kw_only=True)
class ColumnSwap:
    """Columns of one module's output that come from ``source`` in chosen copies.

    Shape:
        source: ``(B, T, C)`` the module's output in the run to take them from.
        columns: bool ``(N, C)``: copy ``n`` takes column ``c`` from ``source``.
        positions: bool ``(T,)`` where the swap applies (``None``: everywhere).
    """

    source: torch.Tensor
    columns: torch.Tensor
    positions: torch.Tensor | None = None
    #: ``source`` is ``(N*B, T, C)``: each copy its own (copy-major), not one for all
    per_copy: bool = False


class OutputPatch(Hooks):
    """Context manager: in a forward pass over ``N x B`` rows (copy-major), replace columns of
    modules' outputs as ``swaps`` say (a key or value projection's KV head, an MLP's output)."""

    def __init__(self, swaps: Mapping[nn.Module, ColumnSwap]) -> None:
        super().__init__()
        self.swaps = dict(swaps)

    def install(self) -> None:
        for module, swap in self.swaps.items():

            def hook(mod: nn.Module, args: Any, out: Any, swap: ColumnSwap = swap) -> Any:
                first = out[0] if isinstance(out, tuple) else out  # (N*B, T, C)
                n_copies = swap.columns.shape[0]
                rows = first.view(n_copies, -1, *first.shape[1:])  # (N, B, T, C)
                where = swap.columns.to(first.device)[:, None, None, :]  # (N, 1, 1, C)
                if swap.positions is not None:
                    where = where & swap.positions.to(first.device)[None, None, :, None]
                source = swap.source.to(device=first.device, dtype=first.dtype)
                source = source.view(rows.shape) if swap.per_copy else source[None]
                patched = torch.where(where, source, rows).view(first.shape)
                return (patched, *out[1:]) if isinstance(out, tuple) else patched

            self.after(module, hook)


def kv_columns(lm: LoadedModel, layer: int, component: str) -> tuple[nn.Module, list[slice]]:
    """The module that projects ``layer``'s queries (``component="q"``), keys (``"k"``) or
    values (``"v"``) and, for each query head (``q``) or KV head (``k``, ``v``), the slice of
    that module's output columns it owns.

    Raises:
        ValueError: the layer's projections could not be told apart, or an unknown component.
    """
    if component not in ("q", "k", "v"):
        raise ValueError(f"component must be 'q', 'k' or 'v', got {component!r}")
    qkv = lm.layers[layer].qkv
    if qkv is None:
        raise ValueError(
            f"{lm.name} layer {layer}: its query, key and value projections are not known"
        )
    n_heads = lm.layout.heads_per_layer[layer]
    n_kv = lm.layout.kv_heads_per_layer[layer]
    count = n_heads if component == "q" else n_kv
    d = lm.head_dim
    if qkv.layout == "separate":
        module = {"q": qkv.q, "k": qkv.k, "v": qkv.v}[component]
        return module, [slice(g * d, (g + 1) * d) for g in range(count)]
    if qkv.layout == "fused":  # [q heads | k heads | v heads]
        start = {"q": 0, "k": n_heads, "v": n_heads + n_kv}[component] * d
        return qkv.k, [slice(start + g * d, start + (g + 1) * d) for g in range(count)]
    part = "qkv".index(component)  # interleaved: [q k v] of head 0, then head 1...
    return qkv.k, [slice((3 * g + part) * d, (3 * g + part + 1) * d) for g in range(count)]


def block_mlp(lm: LoadedModel, layer: int) -> nn.Module | None:
    """The feed-forward module of decoder block ``layer`` (``mlp``, ``feed_forward`` or
    ``ffn``), or ``None`` when the block has none of these."""
    found = decoder_layers(lm)
    if found is None:
        return None
    block = found[2][layer]
    for name in ("mlp", "feed_forward", "ffn"):
        module = getattr(block, name, None)
        if isinstance(module, nn.Module):
            return module
    return None
