"""Head counts in model specs: layout, KV cache and FLOPs from a config.json, without torch.

Example:
    >>> from headlab.layout import load_spec
    >>> spec = load_spec("Llama-3.1-8B", context=8192, dtype="bf16")
    >>> spec.kv_cache_bytes_per_token
    131072
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.layout.attention import MLA as MLA
    from headlab.layout.attention import AttentionLayout as AttentionLayout
    from headlab.layout.attention import layout_from_config as layout_from_config
    from headlab.layout.attention import read_config as read_config
    from headlab.layout.catalog import CatalogEntry as CatalogEntry
    from headlab.layout.catalog import find as find
    from headlab.layout.catalog import load_spec as load_spec
    from headlab.layout.catalog import resolve as resolve
    from headlab.layout.costs import HeadSpec as HeadSpec
    from headlab.layout.costs import compute_spec as compute_spec
    from headlab.layout.costs import dtype_bytes as dtype_bytes

__getattr__, __dir__, __all__ = attach(__name__, __file__)
