"""The one hook layer: every forward hook headlab puts on a model is added, served and removed here.

Two pieces:

- :class:`Hooks`, the base of every hook context (capture, patching, pruning gates, circuit
  runs), and the one place that calls torch's ``register_forward_(pre_)hook``. A subclass says
  which hooks it wants in :meth:`Hooks.install` (or a plain ``with Hooks() as hooks:`` adds them
  in its block); per layer, the base adds them on *distinct modules*, one function per layer a
  module serves, called per call: ALBERT runs one
  attention module (one output projection) for every layer, and its ``i``-th call in a forward
  pass is layer ``i``'s (:func:`headlab.models.interface.per_call`). Every hook is removed on
  exit, and on a failure while they are being added.
- The **head-output slot**, TransformerLens's ``hook_z``: each layer's per-head outputs as they
  enter the output projection, reshaped from the projection's input in this one place::

      z = x.view(B, T, H, D)      x: the output projection's input (B, T, H*D)

  What reads or replaces head outputs plugs in there as a :data:`HeadFn` (:meth:`Hooks.at_heads`):
  recording, ablation and patching (both a :class:`Swap`: a source in chosen heads of chosen
  copies of the batch), gradient taps, pruning gates.

Shape vocabulary: ``N`` copies of a batch, ``B`` prompts, ``T`` tokens, ``H`` heads, ``D`` head
width.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

import torch
from torch import nn

from headlab.errors import InputError
from headlab.models.interface import by_module, per_call


class Layered(Protocol):
    """What the head-output slot reads of a model (a
    :class:`~headlab.models.loading.LoadedModel`, not imported: loading's discovery traces
    with these hooks): each layer's handles (``out_proj``) and the heads per layer."""

    @property
    def layers(self) -> Sequence[Any]: ...

    @property
    def layout(self) -> Any: ...


#: a function plugged into a layer's head-output slot: reads ``z`` ``(B, T, H, D)`` and returns
#: what the output projection reads instead (the same shape), or ``None`` to leave it
HeadFn = Callable[[torch.Tensor], "torch.Tensor | None"]


def _nothing(*args: Any) -> None:
    """The hook of a layer that a shared module serves but this context leaves alone."""
    return None


class Hooks:
    """Base of a context manager of forward hooks: :meth:`install` adds them on entry (through
    :meth:`on_layers`, :meth:`at_heads` or :meth:`add`); all are removed on exit, and on any
    failure while they are being added.

    Example: a context that doubles every head of layer 0::

        class Double(Hooks):
            def __init__(self, lm):
                super().__init__()
                self.lm = lm

            def install(self):
                self.at_heads(self.lm, {0: [lambda z: 2 * z]})
    """

    def __init__(self) -> None:
        self._removers: list[Callable[[], None]] = []

    def install(self) -> None:
        """Add this context's hooks (subclasses)."""

    def add(self, remove: Callable[[], None]) -> None:
        """Keep ``remove`` (a hook's remover) to call on exit."""
        self._removers.append(remove)

    def before(
        self, module: nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False
    ) -> None:
        """``hook`` as a forward pre-hook of ``module`` (with the call's keyword arguments when
        ``with_kwargs``) while the context is open: may return a replaced input."""
        self.add(module.register_forward_pre_hook(hook, with_kwargs=with_kwargs).remove)

    def after(
        self, module: nn.Module, hook: Callable[..., Any], *, with_kwargs: bool = False
    ) -> None:
        """``hook`` as a forward hook of ``module`` while the context is open: may return a
        replaced output."""
        self.add(module.register_forward_hook(hook, with_kwargs=with_kwargs).remove)

    def on_layers(
        self,
        modules: Sequence[nn.Module],
        make: Callable[[int], Callable[..., Any] | None],
        *,
        pre: bool = False,
        with_kwargs: bool = False,
    ) -> None:
        """A hook on each distinct module of ``modules`` (module ``i`` serves layer ``i``),
        calling ``make(layer)`` at that layer's call: a forward pre-hook (``pre``) or a forward
        hook, with the call's keyword arguments when ``with_kwargs``. A module none of whose
        layers gets a function (``make`` gives ``None``) is left unhooked."""
        for module, served in by_module(list(modules)):
            functions = [make(layer) for layer in served]
            if all(fn is None for fn in functions):
                continue
            hook = per_call([_nothing if fn is None else fn for fn in functions])
            (self.before if pre else self.after)(module, hook, with_kwargs=with_kwargs)

    def at_heads(self, lm: Layered, functions: Mapping[int, Sequence[HeadFn]]) -> None:
        """Plug ``functions[layer]`` into layer ``layer``'s head-output slot, in order: each
        reads ``z`` ``(B, T, H, D)`` as the ones before it left it."""
        heads = lm.layout.heads_per_layer
        self.on_layers(
            [h.out_proj for h in lm.layers],
            lambda layer: head_slot(heads[layer], functions.get(layer, ())),
            pre=True,
        )

    def remove(self) -> None:
        """Remove every hook added (the last first)."""
        while self._removers:
            self._removers.pop()()

    def __enter__(self) -> Self:
        try:
            self.install()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def head_slot(n_heads: int, functions: Sequence[HeadFn]) -> Callable[..., Any] | None:
    """The output projection's pre-hook of one layer of ``n_heads`` heads that runs
    ``functions`` on its head outputs (``None`` without functions)."""
    if not functions:
        return None

    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = args[0]  # (B, T, H*D)
        z = x.view(*x.shape[:-1], n_heads, -1)  # (B, T, H, D)
        replaced = False
        for fn in functions:
            new = fn(z)
            if new is not None:
                z, replaced = new, True
        # a function that hands ``z`` itself back (a gradient tap) still replaces the input, so
        # that the projection reads the very tensor the tap kept
        return (z.reshape(x.shape), *args[1:]) if replaced else None

    return hook


@dataclass(frozen=True, kw_only=True)
class Swap:
    """Heads whose output comes from ``source`` in chosen copies of the batch: patching (another
    run's outputs) and ablation (zeros, means, another input's outputs) alike.

    A forward pass over ``N x B`` rows (copy-major) holds ``N`` copies of ``B`` prompts; copy
    ``n`` takes head ``h`` from ``source`` where ``select[n, h]``, at ``positions``.

    Shape:
        source: broadcast to ``(N, B, T, H, D)``: ``(B, T, H, D)`` another run's outputs of the
            same prompts (patching); ``(T_ref, H, D)`` one input's outputs position by position,
            cut to the first ``T`` (resampling; ``T_ref >= T``); ``(H, D)`` each head's mean
            output; ``()`` a constant (zero-ablation).
        select: bool ``(N, H)``: copy ``n`` takes head ``h`` from ``source``.
        positions: bool ``(T,)`` where the swap applies (``None``: everywhere).
    """

    source: torch.Tensor
    select: torch.Tensor
    positions: torch.Tensor | None = None

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """``z`` ``(N*B, T, H, D)`` with the swap applied."""
        n_copies, t = self.select.shape[0], z.shape[-3]
        rows = z.view(n_copies, -1, *z.shape[1:])  # (N, B, T, H, D)
        where = self.select.to(z.device)[:, None, None, :, None]  # (N, 1, 1, H, 1)
        if self.positions is not None:
            where = where & self.positions.to(z.device)[None, None, :, None, None]
        source = self.source
        if source.dim() == 3:  # (T_ref, H, D): one input's outputs, position by position
            if source.shape[0] < t:
                raise InputError(
                    f"resample-ablation has outputs for {source.shape[0]} positions, "
                    f"the input has {t}: resample from an input at least as long"
                )
            source = source[:t]
        source = source.to(device=z.device, dtype=z.dtype)
        return torch.where(where, source, rows).view(z.shape)


def ablation(heads: Sequence[int], n_heads: int, source: torch.Tensor | None = None) -> Swap:
    """The :class:`Swap` that ablates ``heads`` of a layer of ``n_heads`` in every row: with
    ``source`` (``(H, D)`` means or ``(T_ref, H, D)`` another input's outputs) or zeros."""
    select = torch.zeros(1, n_heads, dtype=torch.bool)  # (1, H): one copy, the batch itself
    select[0, list(heads)] = True
    return Swap(source=torch.zeros(()) if source is None else source, select=select)
