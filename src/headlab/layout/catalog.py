"""The bundled catalog: attention fields of public models' configs, each with its source."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from headlab.errors import InputError
from headlab.layout.attention import layout_from_config, read_config
from headlab.layout.costs import HeadSpec, compute_spec


@dataclass(frozen=True, kw_only=True)
class CatalogEntry:
    """One bundled model: its hub name (without the organisation), source and config fields."""

    name: str
    source: str
    config: dict[str, Any]


@cache
def catalog() -> tuple[CatalogEntry, ...]:
    """Every bundled model, in catalog order."""
    text = resources.files("headlab.layout").joinpath("catalog/models.json").read_text("utf-8")
    return tuple(CatalogEntry(**entry) for entry in json.loads(text)["models"])


def find(name: str) -> CatalogEntry:
    """The catalog entry named ``name`` (case-insensitive); suggests the nearest names on a miss."""
    by_lower = {entry.name.lower(): entry for entry in catalog()}
    hit = by_lower.get(name.lower())
    if hit is not None:
        return hit
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(by_lower[c].name for c in close)}?" if close else ""
    raise InputError(
        f"{name!r} is neither a config file nor a model in the catalog{hint} "
        "(see headlab spec --list)"
    )


def resolve(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """A display name and config mapping for a catalog name, a config.json, or a model folder."""
    path = Path(name_or_path)
    if path.exists():
        label = path.parent.name if path.is_file() else path.name
        return label or str(path), read_config(path)
    if name_or_path.endswith(".json") or "/" in name_or_path.replace("\\", "/"):
        return name_or_path, read_config(path)  # raises: no such file
    entry = find(name_or_path)
    return entry.name, entry.config


def load_spec(name_or_path: str, *, context: int = 8192, dtype: str = "bf16") -> HeadSpec:
    """The :class:`HeadSpec` of a catalog model, a config.json file or a model folder."""
    _, config = resolve(name_or_path)
    return compute_spec(layout_from_config(config), context=context, dtype=dtype)
