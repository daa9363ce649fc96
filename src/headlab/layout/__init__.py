"""Head counts in model specs: layout, KV cache and FLOPs from a config.json, without torch.

Example:
    >>> from headlab.layout import load_spec
    >>> spec = load_spec("Llama-3.1-8B", context=8192, dtype="bf16")
    >>> spec.kv_cache_bytes_per_token
    131072
"""

from __future__ import annotations

from headlab.layout.attention import MLA, AttentionLayout, layout_from_config, read_config
from headlab.layout.catalog import CatalogEntry, catalog, find, resolve
from headlab.layout.costs import HeadSpec, compute_spec, dtype_bytes


def load_spec(name_or_path: str, *, context: int = 8192, dtype: str = "bf16") -> HeadSpec:
    """The :class:`HeadSpec` of a catalog model, a config.json file or a model folder."""
    _, config = resolve(name_or_path)
    return compute_spec(layout_from_config(config), context=context, dtype=dtype)


__all__ = [
    "MLA",
    "AttentionLayout",
    "CatalogEntry",
    "HeadSpec",
    "catalog",
    "compute_spec",
    "dtype_bytes",
    "find",
    "layout_from_config",
    "load_spec",
    "read_config",
    "resolve",
]
