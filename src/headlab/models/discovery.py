"""Find the heads of any model whose attention goes through transformers' attention interface.

Nothing here names an architecture. One short traced forward pass (a few dummy tokens, or a
small image or spectrogram where the model reads those) records, in call order:

* every call of headlab's attention function: the module that made it, its queries ``(B, H, T,
  D)``, keys and values ``(B, Hkv, S, D)`` and its output;
* every ``nn.Linear`` and ``Conv1D`` (GPT-2's transposed linear) call: the module, its input and
  its output.

From these, per attention call (one "layer"):

* the **output projection** is the first linear after the call whose input is the call's output
  tensor itself (the same storage: the heads concatenated, ``(B, T, H*D)``);
* the **query/key/value projections** are the linears inside the attention module that ran
  before the call. Their layout is read off their output widths and checked against the
  captured values: three separate projections, one fused ``[q | k | v]`` projection, or one
  projection interleaving ``[q k v]`` per head (GPT-NeoX); grouped KV from the key's head count;
* the **kind** of attention: ``self`` in a model with one stack; ``encoder``, ``decoder`` and
  ``cross`` in an encoder-decoder (cross-attention: keys read another tensor than queries).

Head counts and widths come from the config (:func:`headlab.layout.attention.layout_from_config`) and
must agree with the shapes the interface saw. Forward hooks are removed on any error.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from headlab.errors import UnsupportedModelError
from headlab.models.hooks import Hooks
from headlab.models.interface import trace

Kind = Literal["self", "encoder", "decoder", "cross"]
QKVLayout = Literal["separate", "fused", "interleaved"]


@dataclass(frozen=True, kw_only=True)
class QKV:
    """Where one layer's queries, keys and values are projected, and how.

    Attributes:
        layout: ``separate`` (``q``, ``k``, ``v`` each a module), ``fused`` (one module whose
            outputs are ``[q heads | k heads | v heads]``) or ``interleaved`` (one module whose
            outputs are ``[q k v]`` of head 0, then of head 1...).
        q, k, v: the projections (all three the same module when fused or interleaved).
    """

    layout: QKVLayout
    q: nn.Module
    k: nn.Module
    v: nn.Module


@dataclass(frozen=True, kw_only=True)
class LayerHandles:
    """The modules of one attention layer that headlab hooks.

    Attributes:
        attention: the module passed as ``module`` to the attention function.
        out_proj: the output projection; its input ``(B, T, H*D)`` is the concatenated heads.
        kind: ``self`` (one stack), or ``encoder``, ``decoder``, ``cross`` (encoder-decoders).
        block: the index of the layer within its kind (``cross`` 2: the third decoder block's
            cross-attention).
        qkv: the query/key/value projections, when discovery could tell them apart.
        path: the attention module's dotted name in the model.
    """

    attention: nn.Module
    out_proj: nn.Module
    kind: Kind = "self"
    block: int = 0
    qkv: QKV | None = None
    path: str = ""
    counts: tuple[int, int, int] = (0, 0, 0)  # (H, Hkv, D) as the interface saw them

    @property
    def name(self) -> str:
        """``self 3``, ``encoder 0``, ``cross 2``..."""
        return f"{self.kind} {self.block}"


@dataclass(kw_only=True)
class _Call:
    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    output: torch.Tensor
    index: int  # position in the event sequence


@dataclass(kw_only=True)
class _Linear:
    module: nn.Module
    input: torch.Tensor
    output: torch.Tensor
    index: int


@dataclass(kw_only=True)
class Trace:
    """What one traced forward pass saw (see the module docstring)."""

    calls: list[_Call] = field(default_factory=list)
    linears: list[_Linear] = field(default_factory=list)


def _is_linear(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def is_conv1d(module: nn.Module) -> bool:
    """GPT-2's ``Conv1D``: a linear whose weight is stored ``(in, out)``."""
    return not isinstance(module, nn.Linear) and _is_linear(module)


def dummy_inputs(model: Any, n_tokens: int = 5) -> dict[str, torch.Tensor]:
    """A small input for every tensor the model's forward needs: token ids (and decoder ids
    for an encoder-decoder), an image for a vision model, a spectrogram for Whisper."""
    config = model.config
    params = inspect.signature(model.forward).parameters
    first = next(model.parameters())
    device, dtype = first.device, first.dtype  # images and sound in the model's precision
    inputs: dict[str, torch.Tensor] = {}
    text = getattr(config, "text_config", None) or config
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    if "input_ids" in params and vocab:
        ids = torch.arange(n_tokens, device=device) % max(vocab - 3, 1) + 3
        inputs["input_ids"] = ids[None]
        if "attention_mask" in params:
            inputs["attention_mask"] = torch.ones_like(ids)[None]
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        start = getattr(config, "decoder_start_token_id", None) or 1
        inputs["decoder_input_ids"] = torch.full((1, 3), int(start), device=device)
    if "pixel_values" in params:
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", 32)
        size = size if isinstance(size, int) else int(size[0])
        channels = getattr(vision, "num_channels", 3)
        inputs["pixel_values"] = torch.zeros(1, channels, size, size, device=device, dtype=dtype)
    if "input_features" in params:
        mels = getattr(config, "num_mel_bins", 80)
        frames = 2 * getattr(config, "max_source_positions", 1500)
        inputs["input_features"] = torch.zeros(1, mels, frames, device=device, dtype=dtype)
    return inputs


def _train(model: nn.Module) -> None:
    model.train()


@torch.no_grad()
def run_trace(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Trace:
    """One forward pass of ``model`` on ``inputs``, recording attention calls and linears.

    Every hook is removed on the way out, whatever happens.
    """
    record = Trace()
    counter = [0]

    def on_call(module: nn.Module, q: Any, k: Any, v: Any, out: Any) -> None:
        counter[0] += 1
        record.calls.append(
            _Call(module=module, query=q, key=k, value=v, output=out, index=counter[0])
        )

    def on_linear(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            counter[0] += 1
            record.linears.append(
                _Linear(module=module, input=args[0], output=out, index=counter[0])
            )

    with Hooks() as hooks:
        hooks.add(trace(on_call))
        if model.training:  # no dropout in the traced pass
            model.eval()
            hooks.add(lambda: _train(model))
        for module in model.modules():
            if _is_linear(module):
                hooks.after(module, on_linear)
        model(**inputs)
    return record


def _attention_linears(call: _Call, trace_: Trace, previous: int) -> list[_Linear]:
    """Linears of the attention module that ran after the previous call and before this one."""
    inside = set(map(id, call.module.modules()))
    return [
        rec
        for rec in trace_.linears
        if previous < rec.index < call.index and id(rec.module) in inside
    ]


def _heads_of(output: torch.Tensor, n_heads: int, d: int) -> torch.Tensor:
    """A projection's output ``(B, S, n*D)`` as ``(B, n, S, D)``."""
    return output.reshape(*output.shape[:-1], n_heads, d).transpose(-3, -2)


def _matches(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), atol=1e-5, rtol=1e-4))


_Q_NAMES = ("q", "query", "q_proj", "q_lin", "to_q", "wq", "q_attn")
_K_NAMES = ("k", "key", "k_proj", "k_lin", "to_k", "wk")


def _name_in(module: nn.Module, owner: nn.Module) -> str:
    for name, child in owner.named_modules():
        if child is module:
            return name.rsplit(".", 1)[-1]
    return ""


def _find_qkv(call: _Call, linears: list[_Linear]) -> QKV | None:
    n_heads, n_kv, d = call.query.shape[1], call.key.shape[1], call.query.shape[-1]
    value = call.value  # (B, Hkv, S, D): values are never rotated or normalised
    if value.shape[-1] != d:
        return None
    fused_width = (n_heads + 2 * n_kv) * d
    for rec in linears:
        if rec.output.shape[-1] != fused_width:
            continue
        out = rec.output
        blocked = out[..., (n_heads + n_kv) * d :]
        if _matches(_heads_of(blocked, n_kv, d), value):
            return QKV(layout="fused", q=rec.module, k=rec.module, v=rec.module)
        if n_heads == n_kv:
            per_head = out.reshape(*out.shape[:-1], n_heads, 3, d)[..., 2, :].transpose(-3, -2)
            if _matches(per_head, value):
                return QKV(layout="interleaved", q=rec.module, k=rec.module, v=rec.module)
    values = [
        r
        for r in linears
        if r.output.shape[-1] == n_kv * d and _matches(_heads_of(r.output, n_kv, d), value)
    ]
    if len(values) != 1:
        return None
    v = values[0]
    q_candidates = [r for r in linears if r is not v and r.output.shape[-1] == n_heads * d]
    k_candidates = [r for r in linears if r is not v and r.output.shape[-1] == n_kv * d]
    if n_heads == n_kv:  # same widths: names, then call order (queries first)
        named_q = [r for r in q_candidates if _name_in(r.module, call.module) in _Q_NAMES]
        named_k = [r for r in q_candidates if _name_in(r.module, call.module) in _K_NAMES]
        if len(named_q) == 1 and len(named_k) == 1:
            q_candidates, k_candidates = named_q, named_k
        elif len(q_candidates) == 2:
            q_candidates, k_candidates = q_candidates[:1], q_candidates[1:]
    if len(q_candidates) != 1 or len(k_candidates) != 1:
        return None
    return QKV(layout="separate", q=q_candidates[0].module, k=k_candidates[0].module, v=v.module)


def _out_proj(call: _Call, trace_: Trace) -> nn.Module | None:
    out = call.output
    for rec in trace_.linears:
        if rec.index <= call.index:
            continue
        x = rec.input
        if x.data_ptr() == out.data_ptr() and x.numel() == out.numel():
            return rec.module
    return None


_CROSS_NAMES = ("crossattention", "encoder_attn", "encdecattention", "cross_attn", "src_attn")


def discover(model: nn.Module, inputs: dict[str, torch.Tensor] | None = None) -> list[LayerHandles]:
    """Every attention layer of ``model`` (already switched to headlab's attention function),
    in forward order, with its output and query/key/value projections.

    Raises:
        UnsupportedModelError: no attention call reached the interface (naming the model class
            and what was looked for), or a call's output reached no linear projection.
    """
    inputs = dummy_inputs(model) if inputs is None else inputs
    name = type(model).__name__
    record = run_trace(model, inputs)
    if not record.calls:
        raise UnsupportedModelError(
            f"attention in {name} does not go through transformers' attention interface "
            "(a forward pass made no call to it)"
        )
    paths = {id(m): p for p, m in model.named_modules()}
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    layers: list[LayerHandles] = []
    counts: dict[str, int] = {}
    previous = 0
    for call in record.calls:
        linears = _attention_linears(call, record, previous)
        previous = call.index
        out_proj = _out_proj(call, record)
        path = paths.get(id(call.module), "")
        if out_proj is None:
            raise UnsupportedModelError(
                f"{name}: found no output projection for the attention in {path or 'a layer'} "
                "(looked for an nn.Linear or Conv1D reading the attention function's output)"
            )
        qkv = _find_qkv(call, linears)
        kind: Kind = "self"
        if encoder_decoder:
            lowered = path.lower().replace("_", "")
            is_cross = any(c.replace("_", "") in lowered for c in _CROSS_NAMES)
            if qkv is not None and qkv.layout == "separate":
                ins = {id(r.module): r.input for r in linears}
                q_in, k_in = ins.get(id(qkv.q)), ins.get(id(qkv.k))
                if q_in is not None and k_in is not None:
                    is_cross = q_in.data_ptr() != k_in.data_ptr() or q_in.shape != k_in.shape
            if is_cross:
                kind = "cross"
            elif "decoder" in path.split("."):
                kind = "decoder"
            else:
                kind = "encoder"
        block = counts.get(kind, 0)
        counts[kind] = block + 1
        layers.append(
            LayerHandles(
                attention=call.module,
                out_proj=out_proj,
                kind=kind,
                block=block,
                qkv=qkv,
                path=path,
                counts=(call.query.shape[1], call.key.shape[1], call.query.shape[-1]),
            )
        )
    return layers
