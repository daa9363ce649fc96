"""What a model folder must hold: a config.json, safetensors weights, and weights that fit the
config (transformers fills a missing weight with random numbers and drops an unexpected one,
both silently: headlab refuses either in one line)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headlab.errors import ModelLoadError
from headlab.layout.attention import read_config
from headlab.models import gguf, hub
from headlab.models.names import (
    BUNDLED,
    BUNDLED_NAMES,
    DEFAULT_MODEL_NAME,
    GGUF_MODELS,
    bundled_model_path,
    default_model_path,
    resolve,
)


def check_folder(path: Path) -> dict[str, Any]:
    """The folder's config.json, once the folder is known to hold safetensors weights.

    Raises:
        ModelLoadError: a missing folder, a file, no weights or only pickle checkpoints.
        DataFormatError: a malformed config.json.
    """
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


#: modules a folder may lack: headlab never reads them (the pooler of BERT-like encoders)
OPTIONAL_MODULES = ("pooler",)


def _first(keys: list[str], n: int = 3) -> str:
    more = f" and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def check_loading_info(folder: Path, model: Any, info: dict[str, Any]) -> None:
    """Refuse weights that do not fit the config: transformers fills a missing weight with
    random numbers and drops an unexpected one, both silently.

    A weight the config's model needs and the folder lacks is an error (weights tied to
    another, like a GPT-2 ``lm_head``, are not reported missing by transformers); so is a
    weight the folder holds for a module of the model that the config does not build (a layer
    beyond ``n_layer``, say). Weights of a task head the model does not load (BERT's ``cls.*``
    under :class:`AutoModel`) and a missing pooler are fine: headlab reads neither.

    Raises:
        ModelLoadError: naming the first few keys and what the config says.
    """
    prefix = getattr(model, "base_model_prefix", "") or ""
    base = getattr(model, "base_model", model)
    children = {name for name, _ in base.named_children()} | {
        name for name, _ in model.named_children()
    }

    def module_of(key: str) -> str:
        parts = key.split(".")
        if prefix and parts[0] == prefix and len(parts) > 1:
            parts = parts[1:]
        return parts[0]

    missing = sorted(
        k for k in info.get("missing_keys", ()) if module_of(k) not in OPTIONAL_MODULES
    )
    unexpected = sorted(
        k
        for k in info.get("unexpected_keys", ())
        if module_of(k) in children and module_of(k) != prefix
    )
    mismatched = [str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys", ())]
    config = folder / "config.json"
    if missing:
        raise ModelLoadError(
            f"{folder}: the weights lack {len(missing)} tensor(s) that {config.name} asks for "
            f"({_first(missing)}); the config does not match the weights (layer or head counts?)"
        )
    if unexpected:
        raise ModelLoadError(
            f"{folder}: the weights hold {len(unexpected)} tensor(s) that {config.name} has no "
            f"place for ({_first(unexpected)}); the config does not match the weights "
            "(layer or head counts?)"
        )
    if mismatched:
        raise ModelLoadError(
            f"{folder}: {len(mismatched)} weight(s) have other shapes than {config.name} "
            f"gives ({_first(sorted(mismatched))})"
        )


def display_name(folder: Path) -> str:
    """A model folder's name for people: a GGUF file's conversion in headlab's cache by that
    file (a bundled model's by its name: ``SmolLM2-135M``), a snapshot in the Hugging Face
    cache (``models--ORG--NAME/snapshots/HASH``) by its model name (``ORG/NAME``), any other
    folder by its own name; never the cache's hashed folder."""
    real = folder.resolve()
    try:
        record = json.loads((real / gguf.SOURCE).read_text(encoding="utf-8"))
        source = Path(str(record["gguf_file"]))
    except (OSError, ValueError, KeyError, TypeError):
        source = None
    if source is not None:
        bundled = [m.display for m in GGUF_MODELS.values() if m.file == source.name]
        return bundled[0] if bundled else source.name.removesuffix(".gguf")
    repo = real.parent.parent.name
    if real.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return real.name or str(folder)


def locate(
    path: str | Path | None,
    *,
    revision: str | None = None,
    offline: bool = False,
    notify: Callable[[str], None] | None = None,
) -> tuple[Path, str]:
    """The folder ``load`` reads ``path`` from, and the model's display name: the default
    model's package (for any of its names, :func:`headlab.models.names.resolve`), a ``.gguf``
    file's converted folder, a bundled model, a Hub name's snapshot (downloaded unless
    ``offline``, :func:`headlab.models.hub.resolve`), or the folder itself.

    Raises:
        ModelLoadError: ``revision`` given for anything but a cached model name.
    """
    if path is not None and resolve(path).source is None:  # the default model by another name
        path = None
    folder = default_model_path() if path is None else Path(path)
    name = DEFAULT_MODEL_NAME if path is None else (folder.resolve().name or str(folder))
    if path is not None and folder.is_dir():
        name = display_name(folder)
    if path is not None and gguf.is_gguf_path(path):
        source = folder
        folder = gguf.folder_for(source, notify=notify)
        name = source.name[: -len(".gguf")]
    elif path is not None and not folder.exists():
        if str(path) in BUNDLED:
            folder = bundled_model_path(str(path), notify=notify)
            name = BUNDLED_NAMES[str(path)]
        elif hub.looks_like_repo_id(str(path)):  # a model name: the Hub's cache, or the Hub
            folder = hub.resolve(str(path), revision=revision, offline=offline, notify=notify)
            name = str(path)
            revision = None
    if revision is not None:
        raise ModelLoadError(
            f"--revision {revision!r} applies to Hugging Face model names, not to the folder {folder}"
        )
    return folder, name
