"""Plan before you run: the peak memory of role statistics and of eager capture, from a config.

``headlab spec NAME --plan roles --context T --batch B`` adds up what is alive at the peak of one
forward pass over ``B`` sequences of ``T`` tokens, beside the weights (shape vocabulary: ``N = B
T`` tokens, ``E`` model width, ``Q = H D`` query width, ``K = Hkv D`` key/value width, ``I`` MLP
width, ``W`` words, bounded by ``T``; ``s`` bytes per activation in the model's dtype, statistics
in float32):

* **streaming** (headlab's role statistics, :mod:`headlab.models.streaming`): nothing is kept
  between layers, so the peak is one layer's: its attention (the residual stream and the
  layer's input ``2 N E``, ``q``, ``k``, ``v``, the engine's copies of keys and values and its
  output ``N (2Q + 4K)``, for rotary families the rotated ``q`` and ``k`` and their temporaries
  ``N (3Q + 2K)``, a decoder's ``B T T`` boolean causal mask, plus one block of query rows, about
  ``block_elements`` weights, or one row of every head when longer: its scores, its weights and
  the softmax's temporary) or its MLP (``2 N E`` plus ``2 N I``, ``3 N I`` for a
  gated MLP), whichever is larger; beside it the statistics' tables: the word geometry
  (``to_words``, ``from_words`` and their transposed copy, ``3 B T W`` floats), the probes'
  per-key columns and the word-argmax scratch of one block.
* **eager** (every ``H x T x T`` pattern of every layer, as ``output_attentions`` returns them):
  ``L B H T T`` weights in the model's dtype, plus one layer's scores beside its weights while
  the softmax runs, plus the forward's own largest layer.

The sums of the statistics (a few numbers per head and relation, times the replicates) are
kilobytes and left out. ``benchmarks/plan.py`` measures both peaks on MiniLM and a 100M-parameter
decoder (within 20%: benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headlab.errors import ConfigError
from headlab.spec.costs import _layer_weights, dtype_bytes
from headlab.spec.layout import AttentionLayout, layout_from_config

#: what a plan can be asked for
PLANS = ("roles",)

#: families whose MLP is gated (three matrices: gate, up, down); the others have two
GATED = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3"})

#: families with rotary position embeddings (queries and keys rotated in every layer)
ROTARY = GATED | {"gpt_neox"}

#: decoder families (a causal mask per forward)
CAUSAL = GATED | {"gpt2", "gpt_neox"}

#: the default block size of the streaming engine (:class:`headlab.roles.RoleOptions`)
BLOCK_ELEMENTS = 1 << 20

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

    block = max(block_elements, batch * h * context)  # a block holds at least one row per head
    # residual and input 2E; q, k, v Q + 2K; the engine's keys and values laid out for its
    # products 2K and its output Q; rotary families: the rotated q and k and their temporaries
    per_token = 2 * e + 2 * q + 4 * kv + (3 * q + 2 * kv if lay.model_type in ROTARY else 0)
    attention = round(n * per_token * s) + 3 * block * STATS_BYTES
    if lay.model_type in CAUSAL:  # the causal mask, one (B, T, T) bool tensor per forward
        attention += batch * context * context
    mlp = round(n * (2 * e + (3 if gated else 2) * mlp_width) * s)
    streaming = {
        "layer (attention or MLP, the larger)": max(attention, mlp),
        "word geometry": 3 * batch * context * words * STATS_BYTES,
        "probe columns and argmax scratch": (batch * context * 3 + block) * STATS_BYTES,
    }
    pattern = batch * h * context * context
    eager = {
        "patterns of every layer": round(lay.n_layers * pattern * s),
        "one layer's scores during its softmax": round(pattern * s),
        "layer (attention or MLP, the larger)": max(round(n * (2 * e + 2 * q + 2 * kv) * s), mlp),
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
