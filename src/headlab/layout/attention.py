"""Read a model's attention layout from its config.json, whatever the spelling.

Pure Python: no torch, no transformers. Hugging Face configs name the same quantity in many ways
(``n_head`` in GPT-2, ``num_attention_heads`` in BERT and Llama, ``n_heads`` in DistilBERT...);
this module maps them all onto one :class:`AttentionLayout`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.errors import ConfigError, DataFormatError, ModelLoadError

# Each quantity and the keys it goes by, in the order they are tried.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "num_query_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num")
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "n_embed", "model_dim")
HEAD_DIM_KEYS = ("head_dim", "kv_channels", "attention_head_dim")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")
# headlab writes per-layer head counts of pruned models under this key.
PER_LAYER_HEADS_KEY = "headlab_heads_per_layer"


@dataclass(frozen=True, kw_only=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values pass through a low rank.

    Attributes:
        kv_lora_rank: width of the compressed key/value latent ``d_c`` (what the cache stores).
        q_lora_rank: width of the compressed query latent, or ``None`` for a full query projection.
        qk_nope_head_dim: per-head query/key width without rotary embedding.
        qk_rope_head_dim: per-head query/key width with rotary embedding (one shared key part).
        v_head_dim: per-head value width.
    """

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, kw_only=True)
class AttentionLayout:
    """The attention-relevant facts of one model.

    Attributes:
        model_type: the config's ``model_type`` (``"unknown"`` when absent).
        n_layers: ``L``.
        heads_per_layer: query heads of each layer (the same number in most models).
        kv_heads_per_layer: key/value heads of each layer.
        head_dim: ``D``, the width of one head (query/key width for MLA).
        d_model: ``E``, the model width.
        layer_windows: for each layer, its sliding-window length, or ``None`` for full attention.
        max_positions: longest context the config declares, when it declares one.
        attention_bias: whether the q/k/v/o projections carry biases (for parameter counts).
        mla: the latent-attention ranks for MLA models.
    """

    model_type: str
    n_layers: int
    heads_per_layer: tuple[int, ...]
    kv_heads_per_layer: tuple[int, ...]
    head_dim: int
    d_model: int
    layer_windows: tuple[int | None, ...]
    max_positions: int | None = None
    attention_bias: bool = False
    mla: MLA | None = None

    def __post_init__(self) -> None:
        n = self.n_layers
        for name in ("heads_per_layer", "kv_heads_per_layer", "layer_windows"):
            if len(getattr(self, name)) != n:
                raise ConfigError(
                    f"{name} must have n_layers={n} entries, got {len(getattr(self, name))}"
                )
        for h, kv in zip(self.heads_per_layer, self.kv_heads_per_layer, strict=True):
            if kv < 1 or h % kv:
                raise ConfigError(f"n_heads ({h}) must be divisible by n_kv_heads ({kv})")

    @property
    def n_heads(self) -> int:
        """Query heads per layer (the largest, if layers differ)."""
        return max(self.heads_per_layer)

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer (the largest, if layers differ)."""
        return max(self.kv_heads_per_layer)

    @property
    def uniform(self) -> bool:
        """Every layer has the same head counts."""
        return len(set(self.heads_per_layer)) == 1 and len(set(self.kv_heads_per_layer)) == 1

    @property
    def kind(self) -> str:
        """``"MLA"``, ``"MHA"``, ``"MQA"`` or ``"GQA (G=...)"``."""
        if self.mla is not None:
            return "MLA"
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        if self.n_kv_heads == 1:
            return "MQA"
        return f"GQA (G={self.n_heads // self.n_kv_heads})"


def _first(cfg: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def _require(cfg: Mapping[str, Any], keys: Sequence[str], what: str) -> Any:
    value = _first(cfg, keys)
    if value is None:
        raise ConfigError(f"config has no {what} (looked for {', '.join(keys)})")
    return value


#: bounds on a config's sizes: far above any real model (the largest have ~200 layers, 128
#: heads, widths ~2^15), low enough that a typo or a hostile config cannot make a spec take
#: minutes or all memory
MAX_LAYERS = 10_000
MAX_HEADS = 65_536
MAX_WIDTH = 1 << 24
MAX_POSITIONS = 1 << 40


def _positive_int(value: Any, what: str, most: int = MAX_WIDTH) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    if value > most:
        raise ConfigError(f"{what} must be at most {most:,}, got {value:,}")
    return value


def _per_layer(value: Any, n_layers: int, what: str) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(value) != n_layers:
            raise ConfigError(f"{what} lists {len(value)} layers, config has {n_layers}")
        return tuple(_positive_int(v, what, MAX_HEADS) for v in value)
    return (_positive_int(value, what, MAX_HEADS),) * n_layers


def _text_part(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs nest the language model under ``text_config`` (or ``llm_config``)."""
    if _first(cfg, HEAD_KEYS) is None:
        for key in ("text_config", "llm_config", "language_config"):
            if isinstance(cfg.get(key), Mapping):
                return cfg[key]
    return cfg


def _windows(cfg: Mapping[str, Any], n_layers: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or window is None or window is False or window == 0:
        window = None  # 0 and false mean no window in some families' configs
    else:
        window = _positive_int(window, "sliding_window", MAX_POSITIONS)
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n_layers:
        return tuple(
            window if (t in ("sliding_attention", "local", "sliding") and window) else None
            for t in layer_types
        )
    pattern = cfg.get("sliding_window_pattern")
    if window and isinstance(pattern, int) and pattern > 1:
        # Gemma 3: every pattern-th layer is global, the others local.
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(n_layers))
    if window and cfg.get("model_type") == "gemma2":
        # Gemma 2 alternates local and global layers, starting with a local one.
        return tuple(window if i % 2 == 0 else None for i in range(n_layers))
    if window and isinstance(cfg.get("max_window_layers"), int) and cfg.get("use_sliding_window"):
        # Qwen2: the first max_window_layers layers use full attention.
        first = cfg["max_window_layers"]
        return tuple(None if i < first else window for i in range(n_layers))
    return (window,) * n_layers


_BIASED_TYPES = {"gpt2", "bert", "roberta", "distilbert", "gpt_neox", "qwen2", "phi", "xlm-roberta"}


def layout_from_config(config: Mapping[str, Any]) -> AttentionLayout:
    """Normalise a config.json mapping into an :class:`AttentionLayout`.

    Raises:
        ConfigError: naming the missing or inconsistent key.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"a config must be a JSON object, got {type(config).__name__}")
    cfg = _text_part(config)
    model_type = str(cfg.get("model_type") or config.get("model_type") or "unknown")
    n_layers = _positive_int(
        _require(cfg, LAYER_KEYS, "number of layers"), "number of layers", MAX_LAYERS
    )
    heads_value = cfg.get(PER_LAYER_HEADS_KEY) or _require(
        cfg, HEAD_KEYS, "number of attention heads"
    )
    heads = _per_layer(heads_value, n_layers, "number of attention heads")
    d_model = _positive_int(_require(cfg, WIDTH_KEYS, "model width"), "model width")

    kv_value = _first(cfg, KV_HEAD_KEYS)
    if cfg.get("headlab_kv_heads_per_layer") is not None:
        kv_value = cfg["headlab_kv_heads_per_layer"]
    if kv_value is None and cfg.get("multi_query"):
        kv_value = 1  # Falcon-7B and other multi-query configs
    if kv_value is None and cfg.get("new_decoder_architecture") and cfg.get("num_kv_heads"):
        kv_value = cfg["num_kv_heads"]
    kv_heads = heads if kv_value is None else _per_layer(kv_value, n_layers, "number of KV heads")

    mla = None
    if cfg.get("kv_lora_rank"):
        try:
            mla = MLA(
                kv_lora_rank=_positive_int(cfg["kv_lora_rank"], "kv_lora_rank"),
                q_lora_rank=cfg.get("q_lora_rank") or None,
                qk_nope_head_dim=_positive_int(cfg["qk_nope_head_dim"], "qk_nope_head_dim"),
                qk_rope_head_dim=_positive_int(cfg["qk_rope_head_dim"], "qk_rope_head_dim"),
                v_head_dim=_positive_int(cfg["v_head_dim"], "v_head_dim"),
            )
        except KeyError as exc:
            raise ConfigError(f"an MLA config (kv_lora_rank) also needs {exc.args[0]}") from None
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    else:
        explicit = _first(cfg, HEAD_DIM_KEYS)
        pruned = cfg.get("headlab_pruned")  # a folder headlab pruned records its head width
        if explicit is None and isinstance(pruned, Mapping):
            explicit = pruned.get("head_dim")  # (Falcon derives head_dim and never writes it)
        if explicit is not None:
            head_dim = _positive_int(explicit, "head_dim")
        else:
            if d_model % max(heads):
                raise ConfigError(
                    f"model width ({d_model}) is not divisible by the number of heads "
                    f"({max(heads)}) and the config has no head_dim"
                )
            head_dim = d_model // max(heads)

    bias_flag = _first(cfg, ("attention_bias", "qkv_bias", "bias", "add_qkv_bias"))
    bias = bool(bias_flag) if bias_flag is not None else model_type in _BIASED_TYPES
    max_positions = _first(cfg, POSITION_KEYS)
    if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 1:
        max_positions = None  # not declared (some configs write 0 or -1 for "unbounded")
    elif max_positions > MAX_POSITIONS:
        raise ConfigError(
            f"longest context must be at most {MAX_POSITIONS:,}, got {max_positions:,}"
        )
    return AttentionLayout(
        model_type=model_type,
        n_layers=n_layers,
        heads_per_layer=heads,
        kv_heads_per_layer=kv_heads,
        head_dim=head_dim,
        d_model=d_model,
        layer_windows=_windows(cfg, n_layers),
        max_positions=max_positions if isinstance(max_positions, int) else None,
        attention_bias=bias,
        mla=mla,
    )


#: encoder-decoders whose projections have no biases (the others: BART, Marian, Whisper... do;
#: Whisper's key projection has none, a count 1 / (4 D) too high per layer)
_UNBIASED_PAIRS = {"t5", "mt5", "umt5", "longt5", "switch_transformers"}


def encoder_decoder_layouts(config: Mapping[str, Any]) -> dict[str, AttentionLayout] | None:
    """An encoder-decoder's three head sets, each as one stack of layers: ``encoder``
    (self-attention over the source), ``decoder`` (self-attention over the target) and
    ``cross`` (the decoder's attention to the source); ``None`` for any other config.

    Raises:
        ConfigError: an encoder-decoder config without its layer, head or width fields.
    """
    if not isinstance(config, Mapping) or not config.get("is_encoder_decoder"):
        return None
    model_type = str(config.get("model_type") or "unknown")

    def count(keys: Sequence[str], what: str, most: int, default: int | None = None) -> int:
        value = _first(config, keys)
        if value is None and default is None:
            raise ConfigError(f"config has no {what} (looked for {', '.join(keys)})")
        return _positive_int(default if value is None else value, what, most)

    d_model = count(("d_model", "hidden_size"), "model width", MAX_WIDTH)
    enc_layers = count(("encoder_layers", "num_layers"), "number of encoder layers", MAX_LAYERS)
    dec_layers = count(
        ("decoder_layers", "num_decoder_layers"), "number of decoder layers", MAX_LAYERS, enc_layers
    )
    enc_heads = count(
        ("encoder_attention_heads", "num_heads"), "number of encoder heads", MAX_HEADS
    )
    dec_heads = count(
        ("decoder_attention_heads", "num_heads"), "number of decoder heads", MAX_HEADS, enc_heads
    )
    explicit = _first(config, ("d_kv", *HEAD_DIM_KEYS))

    def width(heads: int) -> int:
        if explicit is not None:
            return _positive_int(explicit, "head_dim")
        if d_model % heads:
            raise ConfigError(
                f"model width ({d_model}) is not divisible by the number of heads ({heads}) "
                "and the config has no d_kv or head_dim"
            )
        return d_model // heads

    def positions(keys: Sequence[str]) -> int | None:
        value = _first(config, keys)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_POSITIONS
        return value if ok else None

    source = positions(("max_source_positions", "max_position_embeddings"))
    target = positions(("max_target_positions", "max_position_embeddings"))

    def stack(n_layers: int, heads: int, longest: int | None) -> AttentionLayout:
        return AttentionLayout(
            model_type=model_type,
            n_layers=n_layers,
            heads_per_layer=(heads,) * n_layers,
            kv_heads_per_layer=(heads,) * n_layers,
            head_dim=width(heads),
            d_model=d_model,
            layer_windows=(None,) * n_layers,
            max_positions=longest,
            attention_bias=model_type not in _UNBIASED_PAIRS,
        )

    return {
        "encoder": stack(enc_layers, enc_heads, source),
        "decoder": stack(dec_layers, dec_heads, target),
        "cross": stack(dec_layers, dec_heads, source),  # its keys are the source's tokens
    }


def read_config(path: str | Path) -> dict[str, Any]:
    """Read a config.json file (or the config.json inside a model folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"no config file at {path} (expected a config.json or a model folder)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except UnicodeDecodeError:
        raise DataFormatError(f"{path}: not a UTF-8 text file") from None
    except RecursionError:
        raise DataFormatError(f"{path}: JSON nested too deeply to be a config") from None
    if not isinstance(data, dict):
        raise DataFormatError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
