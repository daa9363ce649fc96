"""The weights of every head's OV circuit: where each layer's values come from and where its
heads write, read off the opened model for the copying score (:mod:`headlab.roles.copying`).

Shape vocabulary: ``V`` vocabulary, ``E`` model width, ``H`` query heads, ``Hkv`` KV heads,
``D`` head width.

A head's OV circuit maps a token to logits: the embedding, the layer's input norm, the head's
value projection (its KV group's, under GQA), its slice of the output projection, the final norm
and the unembedding (Elhage et al. 2021). Nothing here names an architecture:

* the embedding is the model's ``get_input_embeddings()``; the unembedding its
  ``get_output_embeddings()`` when the head is loaded, else the embedding when the config ties
  them, else the output head's tensor read from the folder's safetensors (its name found on an
  empty causal-LM skeleton of the same config);
* the value and output projections are those discovery found (:class:`LayerHandles`);
* a norm is the module with a 1-D ``weight`` of width ``E`` whose output *is* the tensor the
  value projection reads (the layer's input norm), or the model's last hidden state (the final
  norm), as one traced forward pass sees them. Its ``weight`` is the per-feature gain (the
  LayerNorm and RMSNorm convention). Where no such module feeds it, there is no norm to fold.

Biases and the norms' division by the row's scale are left out, as in Elhage et al.'s and
Olsson et al.'s circuits: the copying score is a ratio of eigenvalues and does not depend on
a positive scale.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headlab.models.discovery import dummy_inputs, is_conv1d
from headlab.models.hooks import Hooks
from headlab.models.loading import LoadedModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LayerOV:
    """One layer's OV weights.

    Shape:
        value: ``(Hkv, D, E)``: each KV head's value projection (``v = value[g] @ x``).
        out: ``(H, E, D)``: each query head's slice of the output projection.
        input_norm: ``(E,)`` the gain of the norm the value projection reads, or ``None``.
    """

    value: torch.Tensor
    out: torch.Tensor
    input_norm: torch.Tensor | None

    @property
    def group(self) -> int:
        """Query heads per KV head (``G = H // Hkv``): head ``h`` reads KV head ``h // G``."""
        return self.out.shape[0] // self.value.shape[0]


@dataclass(frozen=True, kw_only=True)
class OVWeights:
    """Every layer's OV weights, with the embedding, the unembedding and the final norm.

    Shape:
        embed: ``(V, E)``; unembed: ``(V, E)`` (logits ``= unembed @ x``);
        final_norm: ``(E,)`` or ``None``.
    """

    embed: torch.Tensor
    unembed: torch.Tensor
    final_norm: torch.Tensor | None
    layers: list[LayerOV]


def _weight_out_in(module: Any) -> torch.Tensor:
    """A linear's weight as ``(out, in)`` (GPT-2's Conv1D stores it ``(in, out)``)."""
    weight = module.weight.detach()
    return weight.t() if is_conv1d(module) else weight


def _value_rows(lm: LoadedModel, layer: int) -> torch.Tensor | None:
    """``(Hkv, D, E)``: the value projection of ``layer``'s KV heads, or ``None``."""
    qkv = lm.layers[layer].qkv
    if qkv is None:
        return None
    n_heads, n_kv, d = lm.adapter.head_counts[layer]
    weight = _weight_out_in(qkv.v)  # (rows, E)
    if qkv.layout == "separate":
        rows = weight
    elif qkv.layout == "fused":  # [q heads | k heads | v heads]
        rows = weight[(n_heads + n_kv) * d : (n_heads + 2 * n_kv) * d]
    else:  # interleaved [q k v] per head
        rows = weight.view(n_heads, 3, d, -1)[:, 2].reshape(n_heads * d, -1)
    return rows.reshape(n_kv, d, -1)


def out_columns(lm: LoadedModel, layer: int) -> torch.Tensor:
    """``(H, E, D)``: each query head's columns of ``layer``'s output projection."""
    n_heads, _, d = lm.adapter.head_counts[layer]
    weight = _weight_out_in(lm.layers[layer].out_proj)  # (E, H*D)
    return weight.reshape(weight.shape[0], n_heads, d).permute(1, 0, 2)


def _output_head(lm: LoadedModel) -> Any:
    """The loaded LM head (``None`` on a base model)."""
    get = getattr(lm.model, "get_output_embeddings", None)
    return get() if get is not None else None


def _gains(lm: LoadedModel, width: int) -> tuple[list[torch.Tensor | None], torch.Tensor | None]:
    """Each layer's input-norm gain and the final norm's, from one traced forward pass."""
    norms = [
        m
        for m in lm.model.modules()
        if isinstance(getattr(m, "weight", None), nn.Parameter)
        and m.weight.dim() == 1
        and m.weight.numel() == width
    ]
    # data_ptr of a norm's output -> (the norm, the output): the outputs are kept alive until
    # the end of the pass, so that no later tensor reuses their memory and address
    outputs: dict[int, tuple[nn.Module, torch.Tensor]] = {}
    reads: dict[Any, int] = {}  # layer (or "head") -> data_ptr of what it read

    inputs: dict[int, torch.Tensor] = {}  # data_ptr of a norm's output -> what it normalised

    def on_norm(module: nn.Module, args: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            outputs[out.data_ptr()] = (module, out)
            if args and isinstance(args[0], torch.Tensor):
                inputs[out.data_ptr()] = args[0]

    def reader(key: Any) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if args and isinstance(args[0], torch.Tensor):
                reads.setdefault(key, args[0].data_ptr())

        return hook

    with Hooks() as hooks, torch.no_grad():
        for m in norms:
            hooks.after(m, on_norm)
        for layer, handles in enumerate(lm.layers):
            if handles.qkv is not None:
                hooks.before(handles.qkv.v, reader(layer))
        head = _output_head(lm)
        if head is not None:  # a model with its LM head: the norm whose output the head reads
            hooks.before(head, reader("head"))
        out = lm.model(**dummy_inputs(lm.model))
    last = getattr(out, "last_hidden_state", None)
    if "head" not in reads and isinstance(last, torch.Tensor):
        reads["head"] = last.data_ptr()

    def gain(key: Any) -> torch.Tensor | None:
        found = outputs.get(reads.get(key, -1))
        weight = None if found is None else found[0].weight
        if not isinstance(weight, torch.Tensor) or found is None:
            return None
        x = inputs.get(found[1].data_ptr())
        return _effective_gain(weight.detach(), x, found[1])

    return [gain(layer) for layer in range(len(lm.layers))], gain("head")


def _effective_gain(weight: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """A norm's per-feature gain as it multiplied ``x`` into ``y``: its ``weight`` (LayerNorm,
    most RMSNorms), or ``1 + weight`` where that is what the norm computed (Gemma's RMSNorm,
    whose weight starts at 0), told apart by which reproduces ``y`` from ``x / rms(x)``."""
    if x is None or x.shape != y.shape:
        return weight
    rows = x.detach().double().reshape(-1, x.shape[-1])
    normed = rows / (rows.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    out = y.detach().double().reshape(-1, y.shape[-1])
    plain = (normed * weight.double() - out).abs().max()
    shifted = (normed * (1.0 + weight.double()) - out).abs().max()
    return 1.0 + weight if shifted < plain else weight


def _folder_unembedding(lm: LoadedModel) -> torch.Tensor | None:
    """The output head's weight from the folder's safetensors, when the head was not loaded."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    config = lm.model.config
    head_class: Any = AutoModelForCausalLM._model_mapping.get(type(config), None)
    if head_class is None:
        return None
    with torch.device("meta"):
        skeleton = head_class(config)
    head = skeleton.get_output_embeddings()
    names = [n for n, m in skeleton.named_modules() if m is head]
    if not names:
        return None
    key = f"{names[0]}.weight"
    for file in sorted(Path(lm.path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            if key in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                return f.get_tensor(key)
    return None


def _unembedding(lm: LoadedModel, embed: torch.Tensor) -> torch.Tensor | None:
    """``(V, E)``: the loaded LM head's weight, the tied embedding, or the folder's head."""
    head = _output_head(lm)
    if head is not None:
        return _weight_out_in(head)
    config = lm.model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "tie_word_embeddings", False):
        return embed
    try:
        return _folder_unembedding(lm)
    except Exception as exc:  # no causal-LM class, unreadable files: no copying score
        logger.info("no unembedding for %s: %s: %s", lm.name, type(exc).__name__, exc)
        return None


def ov_weights(lm: LoadedModel) -> OVWeights | None:
    """Every head's OV weights, or ``None`` when the embedding, the unembedding or some layer's
    value projection cannot be found (then there is no copying score)."""
    get = getattr(lm.model, "get_input_embeddings", None)
    embeddings = get() if get is not None else None
    weight = getattr(embeddings, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    embed = weight.detach()
    unembed = _unembedding(lm, embed)
    if unembed is None or unembed.shape != embed.shape:
        return None
    values = [_value_rows(lm, layer) for layer in range(len(lm.layers))]
    if any(v is None for v in values):
        return None
    gains, final = _gains(lm, embed.shape[1])
    layers = [
        LayerOV(value=v, out=out_columns(lm, layer), input_norm=gains[layer])
        for layer, v in enumerate(values)
        if v is not None
    ]
    return OVWeights(embed=embed, unembed=unembed, final_norm=final, layers=layers)


# ---------------------------------------------------------------------- all of a layer's weights
@dataclass(frozen=True, kw_only=True)
class LayerWeights:
    """One layer's query, key, value and output weights, for circuits that read both the QK and
    the OV side (:mod:`headlab.causal.composition`). Attention scores are
    ``(query[h] x_t) . (key[h // G] x_s)`` before rotary and scaling; a head writes
    ``out[h] @ value[h // G] @ x``.

    Shape:
        query: ``(H, D, E)``; key, value: ``(Hkv, D, E)``; out: ``(H, E, D)``;
        input_norm: ``(E,)`` the gain of the norm the projections read, or ``None``.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    out: torch.Tensor
    input_norm: torch.Tensor | None

    @property
    def group(self) -> int:
        """Query heads per KV head (``G = H // Hkv``): head ``h`` reads KV head ``h // G``."""
        return self.query.shape[0] // self.key.shape[0]


def _projection_rows(lm: LoadedModel, layer: int, part: int) -> torch.Tensor | None:
    """``(heads, D, E)``: the query (``part`` 0, ``H`` heads), key (1) or value (2, ``Hkv``
    heads each) projection of ``layer``, read from any of the three layouts, or ``None``."""
    qkv = lm.layers[layer].qkv
    if qkv is None:
        return None
    n_heads, n_kv, d = lm.adapter.head_counts[layer]
    weight = _weight_out_in((qkv.q, qkv.k, qkv.v)[part])  # (rows, E)
    count = n_heads if part == 0 else n_kv
    if qkv.layout == "separate":
        rows = weight
    elif qkv.layout == "fused":  # [q heads | k heads | v heads]
        start = (0, n_heads, n_heads + n_kv)[part] * d
        rows = weight[start : start + count * d]
    else:  # interleaved [q k v] per head (then Hkv == H)
        rows = weight.view(n_heads, 3, d, -1)[:, part].reshape(n_heads * d, -1)
    return rows.reshape(count, d, -1)


def layer_weights(lm: LoadedModel) -> list[LayerWeights] | None:
    """Every layer's query, key, value and output weights with its input-norm gain, or
    ``None`` when some layer's projections cannot be told apart. Needs no embedding.

    The gain is that of the norm the *value* projection reads (as in :func:`ov_weights`):
    queries, keys and values read one normalised residual in every architecture headlab opens
    (the very same tensor when the projections are fused)."""
    n_layers = len(lm.layers)
    parts = [[_projection_rows(lm, layer, part) for part in range(3)] for layer in range(n_layers)]
    if not parts or any(p is None for rows in parts for p in rows):
        return None
    outs = [out_columns(lm, layer) for layer in range(n_layers)]  # (H, E, D) each
    gains, _ = _gains(lm, outs[0].shape[1])
    return [
        LayerWeights(query=q, key=k, value=v, out=outs[layer], input_norm=gains[layer])
        for layer, (q, k, v) in enumerate(parts)
        if q is not None and k is not None and v is not None
    ]
