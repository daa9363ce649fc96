"""Edges of a circuit graph in a running model: what each sender writes, what a receiver reads
when some edges carry their corrupted value, and the gradient of the metric at each receiver.

:class:`EdgeRun` hooks one forward pass. Recording, it keeps every sender's output ``(S, B, T,
E)`` (the embeddings, each head's output through its columns of the output projection, each
MLP's output). Patching, it gives every receiver its own residual stream::

    input_r = x + sum over left-out edges s -> r of (corrupt_s - current_s)

``x`` the residual the receiver's layer reads in this run, ``current_s`` what sender ``s``
writes in this run; the receiver reads it through its own norm and its own columns of the
query, key or value projection (the MLP through its norm, the logits through the final norm).
With every edge left out a receiver reads the corrupted residual, with none the clean one.

In a post-norm block (:mod:`headlab.causal.graph`) a head writes through the norm on the
attention's output with that norm's scale frozen at the value it took in the same run: in the
clean run at the clean scale, in the corrupted run (the ``corrupt`` writes) at the corrupted
scale, in a patched run at that run's own. The heads' writes then add up to the norm's output
in every run, which keeps the two ends exact; the MLP's write is its output norm's output.

:func:`receiver_gradients` gives ``d metric / d input_r`` for every receiver from one forward
and backward pass: the gradient at each projection's output (or the MLP's input, or the final
norm's output) taken back through the receiver's columns and its norm.

Shape vocabulary: ``S`` senders, ``R`` receivers, ``B`` prompts, ``T`` tokens, ``E`` width,
``D`` head width.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from headlab.causal.graph import KINDS, Block, Graph, apply_norm, tensor_input, weight_rows
from headlab.causal.graph import first_tensor as _first
from headlab.models.hooks import HeadFn, Hooks
from headlab.models.loading import LoadedModel


def _replace_first(out: Any, value: torch.Tensor) -> Any:
    return (value, *out[1:]) if isinstance(out, tuple) else value


def _replace_input(
    args: tuple[Any, ...], kwargs: dict[str, Any], value: torch.Tensor
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A pre-hook's ``(args, kwargs)`` with the tensor :func:`tensor_input` read replaced."""
    if args and isinstance(args[0], torch.Tensor):
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


def residual_reader(block: Block) -> nn.Module:
    """The module whose input is the residual a block's attention reads: its norm, or the block
    itself where the attention reads the residual as is."""
    return block.layer if block.attention_norm is None else block.attention_norm


class EdgeRun(Hooks):
    """Hooks one forward pass over ``B`` prompts: records what every sender writes, and with
    ``corrupt`` and ``left_out`` patches every left-out edge to its corrupted value.

    Args:
        lm, graph: the model and its :func:`~headlab.causal.graph.build_graph`.
        corrupt: ``(S, B, T, E)`` the senders' outputs on the corrupted prompts (recorded by
            an :class:`EdgeRun` without it).
        left_out: ``(S, R)`` weight of each edge's patch: 1 left out (corrupted), 0 kept; a
            value between patches part of the way (finite differences).

    After the pass, :attr:`values` holds each sender's output ``(S, B, T, E)`` in this run.
    """

    def __init__(
        self,
        lm: LoadedModel,
        graph: Graph,
        *,
        corrupt: torch.Tensor | None = None,
        left_out: torch.Tensor | None = None,
        differentiable: bool = False,
    ) -> None:
        if (corrupt is None) != (left_out is None):
            raise ValueError("corrupt and left_out go together")
        self.lm, self.graph = lm, graph
        self.corrupt = corrupt
        self.left_out = None if left_out is None else left_out * graph.edges
        self.values: torch.Tensor | None = None  # (S, B, T, E), allocated at the first hook
        self.residual: dict[str, torch.Tensor] = {}
        self._diff: tuple[int, torch.Tensor] | None = None
        super().__init__()
        #: with ``differentiable``, the senders' writes stay in the autograd graph (a gradient
        #: of the metric reaches ``left_out`` through every later sender), kept by first index
        self.differentiable = differentiable
        self._parts: dict[int, torch.Tensor] = {}
        self._started = False  # a sender has been written in this run

    # ---------------------------------------------------------------- senders
    def _store(self, index: slice | int, value: torch.Tensor) -> None:
        if self.differentiable:
            start = index.start if isinstance(index, slice) else index
            self._parts[start] = value if isinstance(index, slice) else value[None]
            self._started = True
            self._diff = None
            return
        self._started = True
        if self.values is None:
            shape = (len(self.graph.senders), *value.shape[-3:])
            self.values = torch.zeros(shape, dtype=value.dtype, device=value.device)
        self.values[index] = value.detach()
        self._diff = None  # the senders' differences change with every sender written

    def _written(self, index: slice) -> torch.Tensor:
        """``(s, B, T, E)``: the senders of ``index`` as written in this run."""
        if not self.differentiable:
            assert self.values is not None
            return self.values[index]
        starts = [k for k in sorted(self._parts) if index.start <= k < index.stop]
        return torch.cat([self._parts[k] for k in starts])

    def _delta(self, upto: int, receivers: range) -> torch.Tensor | None:
        """``(r, B, T, E)``: the left-out edges' patch of ``receivers``, senders below
        ``upto``; ``None`` when none of their edges is left out."""
        if self.left_out is None or self.corrupt is None or not self._started:
            return None
        w = self.left_out[:upto, receivers.start : receivers.stop]  # (s, r)
        if not bool(w.any()):
            return None
        if self._diff is None or self._diff[0] != upto:  # q, k and v read the same senders
            written = self._written(slice(0, upto))
            self._diff = (upto, self.corrupt[:upto].to(written) - written)
        diff = self._diff[1]  # (s, B, T, E)
        return torch.einsum("sr,sbte->rbte", w.to(diff), diff)

    # ---------------------------------------------------------------- hooks
    def _attention_norm(self, layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = tensor_input(args, kwargs)
            if x is None:
                raise RuntimeError(f"layer {layer}'s residual was not passed as a tensor")
            self.residual[f"attn {layer}"] = x
            if layer == 0:
                self._store(0, x)  # the embeddings: what the first block reads

        return hook

    def _heads(self, layer: int) -> HeadFn:
        out_proj = self.lm.layers[layer].out_proj
        senders = self.graph.head_senders(layer)
        n_heads = len(senders)

        def write(z: torch.Tensor) -> None:  # (B, T, H, D)
            w = self.lm.adapter.out_proj_weight(out_proj).detach().to(z)  # (E, H*D)
            w = w.view(w.shape[0], n_heads, -1)  # (E, H, D)
            self._store(slice(senders.start, senders.stop), torch.einsum("bthd,ehd->hbte", z, w))

        return write

    def _attention_out(self, layer: int) -> Callable[..., None]:
        """Post-norm blocks: the heads' writes through the attention's output norm, its scale
        frozen at this run's (``args[0]``, the attention's output, is what it normalises)."""
        senders = self.graph.head_senders(layer)
        norm = self.graph.blocks[layer].attention_out
        assert norm is not None

        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            assert self._started  # the heads were stored at the output projection
            index = slice(senders.start, senders.stop)
            scale_from = args[0] if self.differentiable else args[0].detach()
            self._store(index, norm.linear(self._written(index), scale_from))

        return hook

    def _projection(self, layer: int, module: nn.Module) -> Callable[..., Any]:
        block = self.graph.blocks[layer]
        kinds = [k for k in KINDS if block.projections[k][0] is module]
        upto = self.graph.head_senders(layer).start
        rows = weight_rows(module)  # (C, E)

        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
            first = _first(out)  # (B, T, C)
            x = self.residual[f"attn {layer}"]
            patched = None
            for kind in kinds:
                delta = self._delta(upto, self.graph.receiver_range(layer, kind))
                if delta is None:
                    continue
                # by forward, not __call__: no hook of this run fires
                moved = (
                    apply_norm(block.attention_norm, x[None] + delta)
                    - apply_norm(block.attention_norm, x)[None]
                )
                patched = first.clone() if patched is None else patched
                for r, cols in enumerate(block.projections[kind][1]):
                    patched[..., cols] += moved[r] @ rows[cols].to(moved).t()
            return None if patched is None else _replace_first(out, patched)

        return hook

    def _mlp_norm(self, layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            self.residual[f"mlp {layer}"] = args[0]

        return hook

    def _mlp_input(self, layer: int) -> Callable[..., Any]:
        block = self.graph.blocks[layer]
        upto = self.graph.mlp_sender(layer)
        receivers = self.graph.receiver_range(layer, "mlp")

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if block.mlp_norm is None:  # the MLP reads the residual as is
                x = tensor_input(args, kwargs)
                if x is None:
                    raise RuntimeError(f"layer {layer}'s MLP input was not passed as a tensor")
                self.residual[f"mlp {layer}"] = x
            delta = self._delta(upto, receivers)
            if delta is None:
                return None
            patched = apply_norm(block.mlp_norm, self.residual[f"mlp {layer}"] + delta[0])
            return _replace_input(args, kwargs, patched)

        return hook

    def _mlp_output(self, layer: int) -> Callable[..., None]:
        index = self.graph.mlp_sender(layer)

        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            self._store(index, _first(out))

        return hook

    def _final_norm(self, module: nn.Module, args: tuple[Any, ...]) -> Any:
        self.residual["final"] = args[0]
        receivers = range(len(self.graph.receivers) - 1, len(self.graph.receivers))
        delta = self._delta(len(self.graph.senders), receivers)
        return None if delta is None else (args[0] + delta[0], *args[1:])

    def install(self) -> None:
        self.at_heads(self.lm, {layer: [self._heads(layer)] for layer in range(self.lm.n_layers)})
        for layer, block in enumerate(self.graph.blocks):
            self.before(residual_reader(block), self._attention_norm(layer), with_kwargs=True)
            if block.attention_out is not None:
                self.after(block.attention_out.module, self._attention_out(layer))
            if self.left_out is not None:
                modules = {id(block.projections[k][0]): block.projections[k][0] for k in KINDS}
                for module in modules.values():
                    self.after(module, self._projection(layer, module))
            if block.mlp_norm is not None:
                self.before(block.mlp_norm, self._mlp_norm(layer))
            self.before(block.mlp, self._mlp_input(layer), with_kwargs=True)
            writer = block.mlp if block.mlp_out is None else block.mlp_out
            self.after(writer, self._mlp_output(layer))
        self.before(self.graph.final_norm, self._final_norm)


def output_biases(lm: LoadedModel, graph: Graph) -> list[torch.Tensor | None]:
    """Each layer's output-projection bias ``(E,)`` (in a post-norm block, the bias of the norm
    on the attention's output, if any): written to the residual in every run, no sender's
    (never patched)."""
    biases = []
    for layer, block in enumerate(graph.blocks):
        if block.attention_out is not None:
            biases.append(block.attention_out.bias)
            continue
        bias = getattr(lm.layers[layer].out_proj, "bias", None)
        biases.append(bias.detach() if isinstance(bias, torch.Tensor) else None)
    return biases


def check_sum(lm: LoadedModel, graph: Graph, run: EdgeRun) -> float:
    """Largest gap, relative to the residual's size, between the final norm's input and the
    sum of every sender's output and the output biases in ``run`` (0 up to rounding when the
    graph describes the model)."""
    if run.values is None or "final" not in run.residual:
        raise ValueError("check_sum needs a recorded run")
    total = run.values.sum(dim=0)  # (B, T, E)
    for bias in output_biases(lm, graph):
        if bias is not None:
            total = total + bias.to(total)
    final = run.residual["final"].to(total)
    return float((final - total).abs().max() / final.abs().max().clamp_min(1e-12))


class _GradientTaps(Hooks):
    """Hooks keeping, inside the autograd graph, each projection's output, each MLP's input
    and the final norm's output, and (detached) the residual each norm reads."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.tensors: dict[str, torch.Tensor] = {}
        self.residual: dict[str, torch.Tensor] = {}
        super().__init__()

    def install(self) -> None:
        def keep_out(name: str) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any, out: Any) -> None:
                self.tensors[name] = _first(out)

            return hook

        def keep_in(name: str, store: dict[str, torch.Tensor]) -> Callable[..., None]:
            def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                x = tensor_input(args, kwargs)
                if x is not None:
                    store[name] = x if store is self.tensors else x.detach()

            return hook

        for layer, block in enumerate(self.graph.blocks):
            self.before(
                residual_reader(block), keep_in(f"attn {layer}", self.residual), with_kwargs=True
            )
            for module in {
                id(block.projections[k][0]): block.projections[k][0] for k in KINDS
            }.values():
                self.after(module, keep_out(f"proj {layer} {id(module)}"))
            reader = block.mlp if block.mlp_norm is None else block.mlp_norm
            self.before(reader, keep_in(f"mlp {layer}", self.residual), with_kwargs=True)
            self.before(block.mlp, keep_in(f"mlp in {layer}", self.tensors), with_kwargs=True)
        self.before(self.graph.final_norm, keep_in("final", self.residual), with_kwargs=True)
        self.after(self.graph.final_norm, keep_out("final out"))


def _through_norm(
    norm: nn.Module | None, x: torch.Tensor, cotangents: torch.Tensor
) -> torch.Tensor:
    """``(r, B, T, E)``: each cotangent at ``norm(x)``'s output taken back to its input (as is
    where there is no norm)."""
    if norm is None:
        return cotangents
    with torch.enable_grad():
        leaf = x.detach().requires_grad_(True)
        y = norm.forward(leaf)
        grads = [
            torch.autograd.grad(y, leaf, c, retain_graph=i < len(cotangents) - 1)[0]
            for i, c in enumerate(cotangents)
        ]
    return torch.stack(grads)


def receiver_gradients(
    lm: LoadedModel, graph: Graph, metric: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """``(R, B, T, E)``: the gradient of ``metric()`` (a scalar from one forward pass of the
    model, run inside) with respect to each receiver's own residual input."""
    with torch.enable_grad(), _GradientTaps(graph) as taps:
        value = metric()
        names = sorted(taps.tensors)
        found = torch.autograd.grad(value, [taps.tensors[n] for n in names], allow_unused=True)
    grads = dict(zip(names, found, strict=True))
    parts: list[torch.Tensor] = []
    for layer, block in enumerate(graph.blocks):
        x = taps.residual[f"attn {layer}"]
        for kind in KINDS:
            module, columns = block.projections[kind]
            g = grads[f"proj {layer} {id(module)}"]
            rows = weight_rows(module)
            if g is None:
                parts.append(torch.zeros(len(columns), *x.shape, dtype=x.dtype, device=x.device))
                continue
            cot = torch.stack([g[..., c] @ rows[c].to(g) for c in columns])  # (r, B, T, E)
            parts.append(_through_norm(block.attention_norm, x, cot))
        g = grads[f"mlp in {layer}"]
        x2 = taps.residual[f"mlp {layer}"]
        cot = torch.zeros_like(x2)[None] if g is None else g[None]
        parts.append(_through_norm(block.mlp_norm, x2, cot))
    g = grads["final out"]
    xf = taps.residual["final"]
    cot = torch.zeros_like(xf)[None] if g is None else g[None]
    parts.append(_through_norm(graph.final_norm, xf, cot))
    return torch.cat([p.detach() for p in parts])
