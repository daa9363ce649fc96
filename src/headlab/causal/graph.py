"""The graph a circuit is cut from: which components write to the residual stream (senders),
which read it (receivers), and the edges between them.

In a pre-norm decoder block ``x + attn(norm1(x))`` then ``+ mlp(norm2(.))``, the residual
stream a component reads is the sum of what every component below it wrote: the embeddings,
each head's output through its columns of the output projection, each MLP's output, and the
output projections' biases (the same in every run, so never patched). A circuit keeps some of
the edges ``sender -> receiver``; every other edge carries its corrupted value.

- Senders: ``embed``, then per layer every head ``L.H``, then the layer's MLP ``mlp L``.
- Receivers: per layer every query head's queries ``q:L.H``, every KV head's keys and values
  ``k:L.G`` / ``v:L.G`` (one KV head feeds a group of query heads under GQA), the MLP's input
  ``mlp L``; then ``logits`` (the final norm's input).

An edge goes from a sender to every receiver above it: a head of layer ``l`` to the receivers
of layers after ``l`` and to layer ``l``'s MLP; an MLP of layer ``l`` to layers after ``l``;
the embeddings and every sender to the logits.

Post-norm ("sandwich") blocks normalize each sublayer's output before adding it to the residual:
``h = x + post1(attn(norm1(x)))``, ``out = h + post2(mlp(norm2(h)))`` (Gemma 2 and 3, whose MLP
reads ``pre_feedforward_layernorm`` and whose ``post_attention_layernorm`` is ``post1``; OLMo 2,
with no ``norm1``/``norm2`` at all). The MLP's write is ``post2``'s output, one sender, exact.
The heads of a layer share ``post1``: with its scale (the per-row ``1 / rms``, the divisor)
frozen at the value it took in the run the write is measured in, ``post1`` is linear and head
``h``'s write is ``gain * (z_h @ W_O[h]^T) * scale``; the heads' writes add up to ``post1``'s
output. **An approximation**: a head's corrupted write is the one it made in the corrupted run,
at the corrupted run's scale, and its write in any other run is at that run's own scale; the
scale is never recomputed for the mix of kept and corrupted heads a circuit leaves in a layer.
With every edge kept a run is the clean one, with none the corrupted one, both exactly.

The parts are found by tracing one forward pass, not by the families' module names: a block's
``norm1`` is the child whose output the query projection reads (none when it reads the block's
input), ``norm2`` the child whose output the MLP reads (none when it reads the residual),
``post1`` the child reading the output projection's output, ``post2`` the child reading the
MLP's output; the sums ``h`` and ``out`` are then checked on that pass. Models whose blocks are
not of that form (post-norm encoders such as BERT, parallel attention and MLP) are refused with
one line.

Shape vocabulary: ``S`` senders, ``R`` receivers, ``B`` prompts, ``T`` tokens, ``E`` width,
``H`` heads.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headlab.causal.norms import gain, recognise_norm
from headlab.errors import InputError
from headlab.models.discovery import dummy_inputs, is_conv1d
from headlab.models.hooks import Hooks
from headlab.models.loading import LoadedModel
from headlab.models.patching import block_mlp, decoder_layers, kv_columns

FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_norm")
KINDS = ("q", "k", "v")


@dataclass(frozen=True, eq=False)
class OutputNorm:
    """A norm on the attention's output before it joins the residual (a post-norm block), with
    its scale frozen: linear in what the heads write.

    Attributes:
        module: the norm.
        kind: its formula as recognised (``"rmsnorm"``, ``"rmsnorm (1 + g)"``, ``"layernorm"``).
        frozen: ``f(v, x) -> (linear part of v, bias or None)``, the norm's map with the scale
            that of ``x`` (the rows it normalised in a run).
    """

    module: nn.Module
    kind: str
    frozen: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, Any]]

    def linear(self, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``v`` ``(..., B, T, E)`` through the norm at the scale of ``x`` ``(B, T, E)``."""
        return self.frozen(v, x)[0]

    @property
    def gain(self) -> torch.Tensor | None:
        """``(E,)`` the per-feature gain (Gemma's ``1 + g``)."""
        return gain(self.module, self.kind)

    @property
    def bias(self) -> torch.Tensor | None:
        """The norm's own bias (a LayerNorm's): the same in every run."""
        bias = getattr(self.module, "bias", None)
        return bias.detach() if isinstance(bias, torch.Tensor) else None


@dataclass(frozen=True, eq=False)
class Block:
    """The parts of one decoder block a circuit patches.

    Attributes:
        layer: the block.
        attention_norm, mlp_norm: the norms the attention and the MLP read the residual
            through; ``None`` where they read it as is (OLMo 2).
        mlp: the feed-forward module.
        projections: per ``q``/``k``/``v``: the module that projects it and, per head (query
            heads for ``q``, KV heads for ``k``/``v``), that module's output columns.
        attention_out: the norm on the attention's output (post-norm blocks), else ``None``.
        mlp_out: the module whose output is the MLP's write when it is not the MLP's own
            output (post-norm blocks: the norm on it), else ``None``.
    """

    layer: nn.Module
    attention_norm: nn.Module | None
    mlp_norm: nn.Module | None
    mlp: nn.Module
    projections: dict[str, tuple[nn.Module, list[slice]]]
    attention_out: OutputNorm | None = None
    mlp_out: nn.Module | None = None


def apply_norm(norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` by its ``forward`` (no hook fires), or ``x`` where there is no norm."""
    return x if norm is None else norm.forward(x)


def tensor_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The tensor a module reads: its first argument, or ``hidden_states`` by keyword."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    x = kwargs.get("hidden_states")
    return x if isinstance(x, torch.Tensor) else None


def first_tensor(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


@dataclass(frozen=True, eq=False)
class Graph:
    """A model's senders, receivers and edges.

    Attributes:
        senders: names, in order (``embed``, ``L.H``, ``mlp L``).
        receivers: names, in order (``q:L.H``, ``k:L.G``, ``v:L.G``, ``mlp L``, ``logits``).
        edges: bool ``(S, R)``: the sender writes below the receiver's read.
        sender_layer, receiver_layer: ``(S,)`` and ``(R,)`` layer of each (``-1`` for the
            embeddings, ``L`` for the logits).
        blocks: each layer's :class:`Block`; final_norm: the norm before the unembedding.
        final_kind: its formula as recognised (``"rmsnorm"``, ``"rmsnorm (1 + g)"``,
            ``"layernorm"``), ``None`` where it is none of these.
    """

    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    edges: torch.Tensor
    sender_layer: torch.Tensor
    receiver_layer: torch.Tensor
    blocks: tuple[Block, ...]
    final_norm: nn.Module
    final_kind: str | None = None

    @property
    def final_gain(self) -> torch.Tensor | None:
        """``(E,)`` the final norm's per-feature gain (Gemma's ``1 + g``; its ``weight`` where
        the formula was not recognised)."""
        return gain(self.final_norm, self.final_kind or "")

    @property
    def n_edges(self) -> int:
        return int(self.edges.sum())

    def head_senders(self, layer: int) -> range:
        """The sender indices of ``layer``'s heads."""
        first = 1 + sum(len(self.blocks[i].projections["q"][1]) + 1 for i in range(layer))
        return range(first, first + len(self.blocks[layer].projections["q"][1]))

    def mlp_sender(self, layer: int) -> int:
        return self.head_senders(layer).stop

    def receiver_range(self, layer: int, kind: str) -> range:
        """The receiver indices of ``layer``'s ``q``/``k``/``v`` heads, or its ``mlp``."""
        first = 0
        for i in range(layer):
            first += sum(len(self.blocks[i].projections[k][1]) for k in KINDS) + 1
        for k in KINDS:
            count = len(self.blocks[layer].projections[k][1])
            if k == kind:
                return range(first, first + count)
            first += count
        if kind == "mlp":
            return range(first, first + 1)
        raise ValueError(f"kind must be q, k, v or mlp, got {kind!r}")


def _refuse(lm: LoadedModel, why: str) -> InputError:
    return InputError(
        f"{lm.name}: circuits need a pre-norm decoder whose blocks compute "
        f"x + attn(norm(x)), then + mlp(norm(x)) (Llama, Qwen, Mistral, GPT-2 and kin), or "
        f"that with norms on the sublayers' outputs (Gemma 2 and 3, OLMo 2): {why}"
    )


def _final_norm(lm: LoadedModel, blocks: nn.ModuleList) -> nn.Module:
    inside = {id(m) for m in blocks.modules()}
    for name, module in lm.model.named_modules():
        if name.rsplit(".", 1)[-1] in FINAL_NORMS and id(module) not in inside:
            return module
    raise _refuse(lm, "no final norm before the unembedding was found")


class _Trace:
    """What every watched module read and wrote in one forward pass of dummy inputs (the
    first call of each), kept as the tensors themselves: a module feeds another when one's
    output *is* the other's input."""

    def __init__(self, lm: LoadedModel, watched: list[nn.Module]) -> None:
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = tensor_input(args, kwargs)
            if x is not None:
                self.inputs.setdefault(id(module), x)

        def post(module: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
            y = first_tensor(out)
            if isinstance(y, torch.Tensor):
                self.outputs.setdefault(id(module), y)

        with Hooks() as hooks, torch.no_grad():
            for module in {id(m): m for m in watched}.values():
                hooks.before(module, pre, with_kwargs=True)
                hooks.after(module, post, with_kwargs=True)
            lm.model(**dummy_inputs(lm.model))

    def made(self, x: torch.Tensor, among: list[nn.Module]) -> nn.Module | None:
        """The module of ``among`` whose output is ``x``."""
        return next((m for m in among if self.outputs.get(id(m)) is x), None)

    def read(self, x: torch.Tensor, among: list[nn.Module]) -> nn.Module | None:
        """The module of ``among`` whose input is ``x``."""
        return next((m for m in among if self.inputs.get(id(m)) is x), None)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    tolerance = 1e-4 if a.dtype in (torch.float32, torch.float64) else 2e-2
    a, b = a.double(), b.double()
    return bool((a - b).abs().max() <= tolerance * (1.0 + b.abs().max()))


def _block(lm: LoadedModel, layer: int, block: nn.Module, trace: _Trace) -> Block:
    """Layer ``layer``'s parts, found from ``trace`` (see the module's docstring)."""
    mlp = block_mlp(lm, layer)
    if mlp is None:
        raise _refuse(lm, f"layer {layer}'s MLP was not found")
    try:
        projections = {kind: kv_columns(lm, layer, kind) for kind in KINDS}
    except ValueError as e:
        raise _refuse(lm, str(e)) from None
    out_proj = lm.layers[layer].out_proj
    children = list(block.children())
    attention = next((c for c in children if any(m is out_proj for m in c.modules())), None)
    if attention is None:
        raise _refuse(lm, f"layer {layer}'s attention was not found among its parts")

    def seen(store: dict[int, torch.Tensor], module: nn.Module) -> torch.Tensor:
        if id(module) not in store:
            raise _refuse(lm, f"layer {layer}'s {type(module).__name__} was not traced")
        return store[id(module)]

    x = seen(trace.inputs, block)
    reads = [seen(trace.inputs, projections[k][0]) for k in KINDS]
    others = [c for c in children if c is not attention and c is not mlp]
    attention_norm = trace.made(reads[0], others)
    if any(r is not reads[0] for r in reads) or (attention_norm is None and reads[0] is not x):
        raise _refuse(lm, f"layer {layer}'s queries, keys and values read something else")
    if attention_norm is not None and not _close(seen(trace.inputs, attention_norm), x):
        raise _refuse(lm, f"layer {layer}'s attention does not read the residual")
    mlp_in = seen(trace.inputs, mlp)
    mlp_norm = trace.made(mlp_in, others)
    attention_out = trace.read(seen(trace.outputs, out_proj), others)
    if attention_out is None:  # a module between the projection and the block (a dropout)
        attention_out = trace.read(seen(trace.outputs, attention), others)
    mlp_out = trace.read(seen(trace.outputs, mlp), others)
    attention_write = seen(trace.outputs, attention if attention_out is None else attention_out)
    mlp_write = seen(trace.outputs, mlp if mlp_out is None else mlp_out)
    h = mlp_in if mlp_norm is None else seen(trace.inputs, mlp_norm)
    out = seen(trace.outputs, block)
    if not (_close(h, x + attention_write) and _close(out, h + mlp_write)):
        raise _refuse(lm, f"layer {layer} does not add its attention's and MLP's outputs in turn")
    frozen = None
    if attention_out is not None:
        if isinstance(getattr(out_proj, "bias", None), torch.Tensor):
            raise _refuse(
                lm,
                f"layer {layer}'s output projection has a bias under its post-attention norm "
                "(a write no head owns that changes with the norm's scale)",
            )
        kind, fn = recognise_norm(
            attention_out,
            trace.inputs[id(attention_out)].double(),
            trace.outputs[id(attention_out)].double(),
            needs=f"{lm.name}: circuits need layer {layer}'s norm on the attention's output",
        )
        frozen = OutputNorm(attention_out, kind, fn)
    return Block(
        layer=block,
        attention_norm=attention_norm,
        mlp_norm=mlp_norm,
        mlp=mlp,
        projections=projections,
        attention_out=frozen,
        mlp_out=mlp_out,
    )


def build_graph(lm: LoadedModel) -> Graph:
    """The circuit graph of ``lm`` (a causal language model with its head), its blocks' parts
    found by one traced forward pass of a few tokens.

    Raises:
        InputError: the model is not a one-stack pre-norm or post-norm decoder of the forms
            above.
    """
    if not lm.causal:
        raise _refuse(lm, "it is an encoder")
    found = decoder_layers(lm)
    if found is None:
        raise _refuse(lm, "its blocks were not found as one list")
    config = lm.model.config
    if getattr(config, "use_parallel_residual", False) or getattr(config, "parallel_attn", False):
        raise _refuse(lm, "its attention and MLP run in parallel")
    layers = found[2]
    final = _final_norm(lm, layers)
    watched = [final, *(m for block in layers for m in (block, *block.children()))]
    for layer in range(len(layers)):
        watched += [lm.layers[layer].out_proj]
        try:
            watched += [kv_columns(lm, layer, kind)[0] for kind in KINDS]
        except ValueError as e:
            raise _refuse(lm, str(e)) from None
    trace = _Trace(lm, watched)
    blocks = [_block(lm, layer, block, trace) for layer, block in enumerate(layers)]
    final_kind = None
    # a circuit reads the final norm as a module: its formula, when known, names only its gain
    if id(final) in trace.inputs and id(final) in trace.outputs:
        with suppress(InputError):
            final_kind, _ = recognise_norm(
                final, trace.inputs[id(final)].double(), trace.outputs[id(final)].double()
            )
    del trace
    senders, sender_layer = ["embed"], [-1]
    receivers, receiver_layer = [], []
    for layer, b in enumerate(blocks):
        heads = len(b.projections["q"][1])
        senders += [f"{layer}.{h}" for h in range(heads)] + [f"mlp {layer}"]
        sender_layer += [layer] * (heads + 1)
        for kind in KINDS:
            count = len(b.projections[kind][1])
            receivers += [f"{kind}:{layer}.{g}" for g in range(count)]
            receiver_layer += [layer] * count
        receivers.append(f"mlp {layer}")
        receiver_layer.append(layer)
    receivers.append("logits")
    receiver_layer.append(len(blocks))
    s_layer, r_layer = torch.tensor(sender_layer), torch.tensor(receiver_layer)
    edges = s_layer[:, None] < r_layer[None, :]  # (S, R): below the receiver's layer
    is_head = torch.tensor([not (n == "embed" or n.startswith("mlp")) for n in senders])
    is_mlp_receiver = torch.tensor([n.startswith("mlp") for n in receivers])
    # a layer's heads write before its MLP reads
    edges |= is_head[:, None] & is_mlp_receiver[None, :] & (s_layer[:, None] == r_layer[None, :])
    return Graph(
        senders=tuple(senders),
        receivers=tuple(receivers),
        edges=edges,
        sender_layer=s_layer,
        receiver_layer=r_layer,
        blocks=tuple(blocks),
        final_norm=final,
        final_kind=final_kind,
    )


def weight_rows(module: nn.Module) -> torch.Tensor:
    """A linear's weight as ``(out, in)`` (GPT-2's Conv1D stores it ``(in, out)``)."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError("projection has no weight tensor")
    return weight.detach().t() if is_conv1d(module) else weight.detach()
