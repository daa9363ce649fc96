"""What a head layout costs: patterns, parameters, KV-cache bytes and attention FLOPs.

Formulas (per layer ``l`` with ``H_l`` query heads, ``Hkv_l`` KV heads, head width ``D``, model
width ``E``, window ``W_l`` and context ``C``; ``C_l = min(C, W_l)``):

* attention patterns per forward: ``sum_l H_l`` (one ``T x S`` map per head per layer).
* attention parameters: ``E*H_l*D + 2*E*Hkv_l*D + H_l*D*E`` weights (+ biases where the
  family has them).
* KV cache per token: ``sum_l 2 * Hkv_l * D * bytes`` (a key and a value per KV head); at context
  ``C`` a sliding-window layer keeps only ``C_l`` tokens. MLA caches the compressed latent and
  the shared rotary key instead: ``(kv_lora_rank + qk_rope_head_dim) * bytes`` per layer
  (DeepSeek-AI 2024, DeepSeek-V2 section 2.1).
* attention FLOPs for one new token at context ``C``: ``2 * weights`` for the projections, plus
  ``2*H_l*D*C_l`` for the scores and ``2*H_l*D_v*C_l`` for the weighted sum of values (matrix
  products only; :func:`attention_flops` gives them by part, with the softmax's elementwise
  operations beside them, ``5*H_l*C_l``, which the total leaves out).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from headlab.errors import ConfigError
from headlab.layout.attention import MAX_POSITIONS, AttentionLayout

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "float32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (``bf16``, ``fp32``...)."""
    key = dtype.lower()
    if key not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


#: elementwise operations of a softmax per score: max, subtract, exp, sum, divide
SOFTMAX_FLOPS_PER_SCORE = 5


@dataclass(frozen=True, kw_only=True)
class AttentionFlops:
    """One layer's attention FLOPs by part, for some number of query tokens.

    Attributes:
        projections: the query, key and value projections (``2 *`` their weights per token).
        scores: ``q k^T`` (``2*H*D`` per query and key).
        softmax: the softmax's elementwise operations (:data:`SOFTMAX_FLOPS_PER_SCORE` per score).
        values: the weights' product with the values (``2*H*D_v`` per query and key).
        output: the output projection (``2 *`` its weights per token).
    """

    projections: int
    scores: int
    softmax: int
    values: int
    output: int

    @property
    def matmuls(self) -> int:
        """The matrix products: what :func:`compute_spec` counts as attention FLOPs."""
        return self.projections + self.scores + self.values + self.output

    @property
    def total(self) -> int:
        """Every part, the softmax included."""
        return self.matmuls + self.softmax

    def as_dict(self) -> dict[str, int]:
        """The JSON form: each part, ``matmuls`` and ``total``."""
        return {
            "projections": self.projections,
            "scores": self.scores,
            "softmax": self.softmax,
            "values": self.values,
            "output": self.output,
            "matmuls": self.matmuls,
            "total": self.total,
        }


def attention_flops(
    *,
    in_weights: int,
    out_weights: int,
    n_heads: int,
    qk_width: int,
    v_width: int,
    keys: int,
    queries: int = 1,
) -> AttentionFlops:
    """FLOPs by part of ``queries`` tokens attending ``keys`` keys in one layer, whose q/k/v
    projections have ``in_weights`` weights and output projection ``out_weights``."""
    return AttentionFlops(
        projections=queries * 2 * in_weights,
        scores=queries * 2 * n_heads * qk_width * keys,
        softmax=queries * SOFTMAX_FLOPS_PER_SCORE * n_heads * keys,
        values=queries * 2 * n_heads * v_width * keys,
        output=queries * 2 * out_weights,
    )


@dataclass(frozen=True, kw_only=True)
class HeadSpec:
    """A model's heads in numbers, at one context length and cache dtype."""

    layout: AttentionLayout
    context: int
    dtype: str
    attention_patterns: int
    attention_params: int
    kv_cache_bytes_per_token: int
    kv_cache_bytes: int
    attention_flops_per_token: int

    def as_dict(self) -> dict[str, object]:
        """The JSON form (stable keys)."""
        lay = self.layout
        return {
            "model_type": lay.model_type,
            "n_layers": lay.n_layers,
            "n_heads": lay.n_heads,
            "n_kv_heads": lay.n_kv_heads,
            "kind": lay.kind,
            "group_size": lay.n_heads // lay.n_kv_heads,
            "head_dim": lay.head_dim,
            "d_model": lay.d_model,
            "heads_per_layer": list(lay.heads_per_layer) if not lay.uniform else None,
            "kv_heads_per_layer": list(lay.kv_heads_per_layer) if not lay.uniform else None,
            "sliding_window_layers": sum(w is not None for w in lay.layer_windows),
            "sliding_window": next((w for w in lay.layer_windows if w is not None), None),
            "max_positions": lay.max_positions,
            "mla": None
            if lay.mla is None
            else {
                "kv_lora_rank": lay.mla.kv_lora_rank,
                "q_lora_rank": lay.mla.q_lora_rank,
                "qk_nope_head_dim": lay.mla.qk_nope_head_dim,
                "qk_rope_head_dim": lay.mla.qk_rope_head_dim,
                "v_head_dim": lay.mla.v_head_dim,
            },
            "context": self.context,
            "dtype": self.dtype,
            "attention_patterns": self.attention_patterns,
            "attention_params": self.attention_params,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "kv_cache_bytes": self.kv_cache_bytes,
            "attention_flops_per_token": self.attention_flops_per_token,
        }


def _layer_weights(lay: AttentionLayout, h: int, kv: int) -> tuple[int, int]:
    """(weights, biases) of one layer's attention projections."""
    e, d = lay.d_model, lay.head_dim
    if lay.mla is not None:
        m = lay.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = e * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * h * qk  # down, norm, up
        else:
            q = e * h * qk
        kv_down = e * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # + latent norm
        kv_up = m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim)
        out = h * m.v_head_dim * e
        return q + kv_down + kv_up + out, 0
    weights = e * h * d + 2 * e * kv * d + h * d * e
    biases = (h * d + 2 * kv * d + e) if lay.attention_bias else 0
    return weights, biases


def compute_spec(lay: AttentionLayout, *, context: int = 8192, dtype: str = "bf16") -> HeadSpec:
    """Every derived number of :class:`HeadSpec` for ``lay`` at ``context`` tokens of ``dtype``."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ConfigError(f"context must be a positive number of tokens, got {context!r}")
    if context > MAX_POSITIONS:
        raise ConfigError(f"context must be at most {MAX_POSITIONS:,} tokens, got {context:,}")
    size = dtype_bytes(dtype)
    params = 0
    cache_per_token = 0.0
    cache_total = 0.0
    flops = 0
    for h, kv, window in zip(
        lay.heads_per_layer, lay.kv_heads_per_layer, lay.layer_windows, strict=True
    ):
        weights, biases = _layer_weights(lay, h, kv)
        params += weights + biases
        if lay.mla is not None:
            per_token = (lay.mla.kv_lora_rank + lay.mla.qk_rope_head_dim) * size
            qk_width, v_width = lay.head_dim, lay.mla.v_head_dim
        else:
            per_token = 2 * kv * lay.head_dim * size
            qk_width = v_width = lay.head_dim
        kept = context if window is None else min(context, window)
        cache_per_token += per_token
        cache_total += per_token * kept
        out_weights = h * v_width * lay.d_model
        flops += attention_flops(
            in_weights=weights - out_weights,
            out_weights=out_weights,
            n_heads=h,
            qk_width=qk_width,
            v_width=v_width,
            keys=kept,
        ).matmuls
    return HeadSpec(
        layout=lay,
        context=context,
        dtype=dtype.lower(),
        attention_patterns=sum(lay.heads_per_layer),
        attention_params=params,
        kv_cache_bytes_per_token=round(cache_per_token),
        kv_cache_bytes=round(cache_total),
        attention_flops_per_token=flops,
    )


@dataclass(frozen=True, kw_only=True)
class EncoderDecoderSpec:
    """An encoder-decoder's heads in numbers: one :class:`HeadSpec` per head set, for a source
    and a target of ``context`` tokens each. Generation keeps the decoder's own keys and values
    and the cross-attention's (the source's, per decoder layer); the encoder runs once and
    keeps none."""

    stacks: dict[str, HeadSpec]
    context: int
    dtype: str

    def total(self, key: str) -> int:
        return sum(int(getattr(spec, key)) for spec in self.stacks.values())

    def as_dict(self) -> dict[str, object]:
        """The JSON form: the totals, and each head set under ``stacks``."""
        first = next(iter(self.stacks.values())).layout
        return {
            "model_type": first.model_type,
            "kind": "encoder-decoder",
            "context": self.context,
            "dtype": self.dtype,
            "attention_patterns": self.total("attention_patterns"),
            "attention_params": self.total("attention_params"),
            "kv_cache_bytes_per_token": self.total("kv_cache_bytes_per_token"),
            "kv_cache_bytes": self.total("kv_cache_bytes"),
            "attention_flops_per_token": self.total("attention_flops_per_token"),
            "stacks": {name: spec.as_dict() for name, spec in self.stacks.items()},
        }


def compute_encoder_decoder_spec(
    stacks: dict[str, AttentionLayout], *, context: int = 8192, dtype: str = "bf16"
) -> EncoderDecoderSpec:
    """:class:`EncoderDecoderSpec` of :func:`~headlab.layout.attention.encoder_decoder_layouts`'
    head sets, a source and a target of ``context`` tokens each (FLOPs per token: the
    encoder's per source token, the decoder's and cross-attention's per target token)."""
    specs = {name: compute_spec(lay, context=context, dtype=dtype) for name, lay in stacks.items()}
    enc = specs["encoder"]
    specs["encoder"] = replace(enc, kv_cache_bytes_per_token=0, kv_cache_bytes=0)
    return EncoderDecoderSpec(stacks=specs, context=context, dtype=dtype.lower())
