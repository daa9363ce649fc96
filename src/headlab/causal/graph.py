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

Models whose blocks are not of that form (post-norm encoders such as BERT, parallel attention
and MLP, extra norms around the sublayers as in Gemma) are refused with one line.

Shape vocabulary: ``S`` senders, ``R`` receivers, ``B`` prompts, ``T`` tokens, ``E`` width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from headlab.errors import InputError
from headlab.models.discovery import is_conv1d
from headlab.models.loading import LoadedModel
from headlab.models.patching import block_mlp, decoder_layers, kv_columns

#: a block's norm before the attention, and before the MLP, by the families' own names
ATTENTION_NORMS = ("input_layernorm", "ln_1")
MLP_NORMS = ("post_attention_layernorm", "ln_2")
#: norms around a sublayer's output (Gemma 2/3, OLMo 2): the residual is no longer a plain sum
SANDWICH_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm", "post_attention_norm")
FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_norm")
KINDS = ("q", "k", "v")


@dataclass(frozen=True, eq=False)
class Block:
    """The parts of one pre-norm decoder block a circuit patches.

    Attributes:
        attention_norm, mlp_norm: the norms the attention and the MLP read the residual through.
        mlp: the feed-forward module.
        projections: per ``q``/``k``/``v``: the module that projects it and, per head (query
            heads for ``q``, KV heads for ``k``/``v``), that module's output columns.
    """

    attention_norm: nn.Module
    mlp_norm: nn.Module
    mlp: nn.Module
    projections: dict[str, tuple[nn.Module, list[slice]]]


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
    """

    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    edges: torch.Tensor
    sender_layer: torch.Tensor
    receiver_layer: torch.Tensor
    blocks: tuple[Block, ...]
    final_norm: nn.Module

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


def _child(block: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    for name in names:
        module = getattr(block, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def _refuse(lm: LoadedModel, why: str) -> InputError:
    return InputError(
        f"{lm.name}: circuits need a pre-norm decoder whose blocks compute "
        f"x + attn(norm(x)), then + mlp(norm(x)) (Llama, Qwen, Mistral, GPT-2 and kin): {why}"
    )


def _final_norm(lm: LoadedModel, blocks: nn.ModuleList) -> nn.Module:
    inside = {id(m) for m in blocks.modules()}
    for name, module in lm.model.named_modules():
        if name.rsplit(".", 1)[-1] in FINAL_NORMS and id(module) not in inside:
            return module
    raise _refuse(lm, "no final norm before the unembedding was found")


def build_graph(lm: LoadedModel) -> Graph:
    """The circuit graph of ``lm`` (a causal language model with its head).

    Raises:
        InputError: the model is not a one-stack pre-norm decoder of the form above.
    """
    if not lm.causal:
        raise _refuse(lm, "it is an encoder")
    found = decoder_layers(lm)
    if found is None:
        raise _refuse(lm, "its blocks were not found as one list")
    config = lm.model.config
    if getattr(config, "use_parallel_residual", False) or getattr(config, "parallel_attn", False):
        raise _refuse(lm, "its attention and MLP run in parallel")
    blocks = []
    for layer, block in enumerate(found[2]):
        if _child(block, SANDWICH_NORMS) is not None:
            raise _refuse(lm, "its blocks normalize the sublayers' outputs too")
        attention_norm, mlp_norm = _child(block, ATTENTION_NORMS), _child(block, MLP_NORMS)
        mlp = block_mlp(lm, layer)
        if attention_norm is None or mlp_norm is None or mlp is None:
            raise _refuse(lm, f"layer {layer}'s norms or MLP were not found")
        try:
            projections = {kind: kv_columns(lm, layer, kind) for kind in KINDS}
        except ValueError as e:
            raise _refuse(lm, str(e)) from None
        blocks.append(Block(attention_norm, mlp_norm, mlp, projections))
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
        final_norm=_final_norm(lm, found[2]),
    )


def weight_rows(module: nn.Module) -> torch.Tensor:
    """A linear's weight as ``(out, in)`` (GPT-2's Conv1D stores it ``(in, out)``)."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError("projection has no weight tensor")
    return weight.detach().t() if is_conv1d(module) else weight.detach()
