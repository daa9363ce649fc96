"""Plan before you run: the peak memory of role statistics and of eager capture, from a config.

``headlab spec NAME --plan roles --context T --batch B`` adds up what is alive at the peak of one
forward pass over ``B`` sequences of ``T`` tokens, beside the weights (shape vocabulary: ``N = B
T`` tokens, ``E`` model width, ``Q = H D`` query width, ``K = Hkv D`` key/value width, ``I`` MLP
width, ``W`` words, bounded by ``T``; ``s`` bytes per activation in the model's dtype, statistics
in float32):

* **streaming** (headlab's role statistics, :mod:`headlab.models.streaming`): nothing of the
  statistics is kept between layers, so the peak is one layer's step, its attention or its MLP,
  whichever is larger. The attention holds the layer's input (``N E``; ``2 N E`` with the
  normed copy of a pre-norm layer) and the engine's step, ``q``, ``k``, ``v``, keys and values
  laid out for its products and its output, ``N (2Q + 4K)``, or, larger in rotary families,
  the rotation of ``q``: ``q``, ``rotate_half(q)``, ``q cos`` and ``rotate_half(q) sin`` beside
  ``k`` and ``v``, ``N (4Q + 2K)``. The MLP holds the layer's input (and normed copy), the
  attention's output and ``2 N I`` activations, ``3 N I`` gated. Beside the layer, for the
  whole forward: the embeddings' output (the model's forward holds it, ``N E``; no key/value
  cache: the streaming forward turns ``use_cache`` off, as nothing reads it), the ``B T T``
  boolean attention
  mask, the engine's block buffer (one block of query rows, as
  :func:`headlab.attention.blocks.stream.block_rows` cuts them, reused by every layer: the
  native kernel writes the weights over the scores), the word geometry (``to_words``,
  ``from_words`` and their transposed copy, ``3 B T W`` floats), the probes' per-key columns
  and the word-argmax state (``B H T`` float sums, ``B H W`` indices).
* **eager** (every ``H x T x T`` pattern of every layer, as ``output_attentions`` returns them):
  ``L B H T T`` weights in the model's dtype, plus one layer's scores beside its weights while
  the softmax runs, plus the forward's own largest layer step, the embeddings' output, the
  mask and a decoder's key/value cache of all ``L`` layers.

The sums of the statistics (a few numbers per head and relation, times the replicates) are
allocated by the first batch and kept for the run (a few MiB for 12 layers and 100
replicates): not part of a batch's peak, and left out. ``benchmarks/plan.py`` measures both
peaks on MiniLM and a 100M-parameter decoder (within 20%: benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headlab.errors import ConfigError
from headlab.layout.attention import AttentionLayout, layout_from_config
from headlab.layout.costs import _layer_weights, dtype_bytes

#: what a plan can be asked for
PLANS = ("roles",)

#: families whose MLP is gated (three matrices: gate, up, down); the others have two
GATED = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3"})

#: families with rotary position embeddings (queries and keys rotated in every layer)
ROTARY = GATED | {"gpt_neox"}

#: decoder families (a causal mask per forward)
CAUSAL = GATED | {"gpt2", "gpt_neox"}

#: pre-norm families: a layer's normed input lives beside its input
PRE_NORM = CAUSAL

#: the default block size of the streaming engine (:class:`headlab.roles.RoleOptions`)
BLOCK_ELEMENTS = 1 << 20
#: the engine's fewest query rows per block (``headlab.attention.blocks.stream.MIN_BLOCK_ROWS``)
MIN_BLOCK_ROWS = 64

STATS_BYTES = 4  # statistics run in float32


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Predicted memory, in bytes, of one forward pass over ``batch`` sequences of ``context``
    tokens (weights apart: ``weights``; each peak is what comes on top of them)."""

    context: int
    batch: int
    dtype: str
    parameters: int
    weights: int
    streaming: dict[str, int]
    eager: dict[str, int]

    @property
    def streaming_peak(self) -> int:
        return sum(self.streaming.values())

    @property
    def eager_peak(self) -> int:
        return sum(self.eager.values())

    def as_dict(self) -> dict[str, object]:
        """The JSON form (stable keys)."""
        return {
            "context": self.context,
            "batch": self.batch,
            "dtype": self.dtype,
            "parameters": self.parameters,
            "weights_bytes": self.weights,
            "roles_streaming": {"peak_bytes": self.streaming_peak, "parts": self.streaming},
            "eager_capture": {"peak_bytes": self.eager_peak, "parts": self.eager},
            "roles_total_bytes": self.weights + self.streaming_peak,
            "eager_total_bytes": self.weights + self.eager_peak,
        }


def _field(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def _mlp_width(config: Mapping[str, Any], d_model: int) -> int:
    width = _field(config, "intermediate_size", "n_inner", "hidden_dim", "ffn_dim")
    if width is None:  # GPT-2's n_inner None and BERT's default: 4 E
        return 4 * d_model
    return int(width)


def parameters(config: Mapping[str, Any], lay: AttentionLayout) -> int:
    """Parameters of the base model (no language-model head): embeddings, attention, MLPs,
    norms (and the BERT family's pooler).

    Raises:
        ConfigError: the config has no ``vocab_size`` (a catalog entry keeps only the attention
            fields: plan from the model's own config.json).
    """
    cfg = _text_config(config)
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise ConfigError(
            "the plan needs the config's vocab_size (and MLP width); this config has only the "
            "attention fields: give the model's folder or its config.json"
        )
    e = lay.d_model
    gated = lay.model_type in GATED
    mlp_width = _mlp_width(cfg, e)
    positions = 0
    if lay.model_type in ("bert", "roberta", "xlm-roberta", "distilbert", "gpt2"):
        positions = int(_field(cfg, "max_position_embeddings", "n_positions") or 0) * e
    types = int(cfg.get("type_vocab_size") or 0) * e if lay.model_type != "gpt2" else 0
    pooler = e * e + e if lay.model_type in ("bert", "roberta", "xlm-roberta") else 0
    total = vocab * e + positions + types + pooler
    norm = e if gated else 2 * e  # RMSNorm: a scale; LayerNorm: a scale and a bias
    for h, kv in zip(lay.heads_per_layer, lay.kv_heads_per_layer, strict=True):
        weights, biases = _layer_weights(lay, h, kv)
        mlp = (3 if gated else 2) * e * mlp_width + (0 if gated else mlp_width + e)
        total += weights + biases + mlp + 2 * norm
    return total + norm  # the embeddings' or the final norm


def block_rows(n_batch: int, n_heads: int, n_keys: int, block_elements: int) -> int:
    """Query rows of one block of the streaming engine, as
    :func:`headlab.attention.blocks.stream.block_rows` cuts them (kept here without torch; a
    test holds the two equal): about ``block_elements`` weights, at least one row, and up to
    :data:`MIN_BLOCK_ROWS` rows for wide batches (at most 16x ``block_elements``)."""
    per_row = max(1, n_batch * n_heads * n_keys)
    wide = min(MIN_BLOCK_ROWS, (16 * block_elements) // per_row)
    return max(1, block_elements // per_row, wide)


def plan_memory(
    config: Mapping[str, Any],
    *,
    context: int,
    batch: int,
    dtype: str = "fp32",
    block_elements: int = BLOCK_ELEMENTS,
) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``config`` for ``batch`` sequences of ``context`` tokens in
    ``dtype`` (the model's parameters and activations).

    Raises:
        ConfigError: a context, batch or block size below 1, an unknown dtype, a config without
            the attention fields or without ``vocab_size``.
    """
    for name, value in (("context", context), ("batch", batch), ("block size", block_elements)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"the plan's {name} must be a positive whole number, got {value!r}")
    lay = layout_from_config(dict(config))
    if lay.max_positions is not None and context > lay.max_positions:
        raise ConfigError(
            f"--context {context:,} is longer than the {lay.max_positions:,} positions the "
            "config declares"
        )
    s = dtype_bytes(dtype)
    n_params = parameters(config, lay)
    n = batch * context
    e = lay.d_model
    h = max(lay.heads_per_layer)
    q = h * lay.head_dim
    kv = max(lay.kv_heads_per_layer) * lay.head_dim
    mlp_width = _mlp_width(_text_config(config), e)
    gated = lay.model_type in GATED
    words = context  # an upper bound: at most one word per token

    rows = min(context, block_rows(batch, h, context, block_elements))  # query rows per block
    block = rows * batch * h * context  # (B, H, rows, T) weights
    pre_norm = lay.model_type in PRE_NORM
    rotary = lay.model_type in ROTARY
    # the layer's input (its caller holds it) and, in a pre-norm layer, its normed copy
    inputs = e + (e if pre_norm else 0)
    # the engine's step: q, k, v (Q + 2K), keys and values laid out for its products (2K), its
    # output (Q); a rotary family's rotation of q: q, rotate_half(q), q cos and
    # rotate_half(q) sin alive together (4Q) beside k and v (2K)
    engine = 2 * q + 4 * kv
    attention = round(n * (inputs + (max(engine, 4 * q + 2 * kv) if rotary else engine)) * s)
    # the MLP's step: the layer's input, the attention's output (the residual), a pre-norm
    # layer's normed copy, and the MLP's activations (gate, up and their product when gated)
    mlp = round(n * (inputs + e + (3 if gated else 2) * mlp_width) * s)
    # decoders keep every layer's keys and values for generation (transformers' default
    # use_cache) in an eager forward; the streaming forward turns it off (nothing reads them)
    cached = 0
    if lay.model_type in CAUSAL and _text_config(config).get("use_cache", True):
        cached = 2 * batch * context * kv
    streaming = {
        "layer (attention or MLP, the larger)": max(attention, mlp),
        "embeddings' output (held by the model's forward)": round(n * e * s),
        "attention mask (B, 1, T, T) booleans": batch * context * context,
        "engine's block of weights (reused by every layer)": block * STATS_BYTES,
        "word geometry": 3 * batch * context * words * STATS_BYTES,
        "probe columns and word-argmax state": (batch * context * 3 + batch * h * context)
        * STATS_BYTES
        + batch * h * words * 8,
    }
    pattern = batch * h * context * context
    eager = {
        "patterns of every layer": round(lay.n_layers * pattern * s),
        "one layer's scores during its softmax": round(pattern * s),
        # q, k, v and the output beside the layer's input
        "layer (attention or MLP, the larger)": max(round(n * (inputs + 2 * q + 2 * kv) * s), mlp),
        "embeddings' output (held by the model's forward)": round(n * e * s),
        "key/value cache of every layer": round(lay.n_layers * cached * s),
        "attention mask (B, 1, T, T) booleans": batch * context * context,
    }
    return MemoryPlan(
        context=context,
        batch=batch,
        dtype=dtype.lower(),
        parameters=n_params,
        weights=round(n_params * s),
        streaming=streaming,
        eager=eager,
    )
