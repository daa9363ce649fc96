"""One adapter per model family; :func:`adapter_for` picks one by ``model_type``."""

from __future__ import annotations

from headlab.errors import UnsupportedModelError
from headlab.models.adapters.base import Adapter, LayerHandles
from headlab.models.adapters.bert import BertAdapter
from headlab.models.adapters.distilbert import DistilBertAdapter
from headlab.models.adapters.gpt2 import GPT2Adapter
from headlab.models.adapters.gpt_neox import GPTNeoXAdapter
from headlab.models.adapters.llama import LlamaAdapter

ADAPTERS: tuple[Adapter, ...] = (
    BertAdapter(),
    DistilBertAdapter(),
    GPT2Adapter(),
    LlamaAdapter(),
    GPTNeoXAdapter(),
)


def supported_model_types() -> list[str]:
    """Every ``model_type`` headlab can open."""
    return sorted(t for a in ADAPTERS for t in a.model_types)


def adapter_for(model_type: str) -> Adapter:
    """The adapter serving ``model_type``."""
    for adapter in ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    raise UnsupportedModelError(
        f"no headlab adapter for model_type {model_type!r}; supported: "
        f"{', '.join(supported_model_types())}"
    )


__all__ = ["ADAPTERS", "Adapter", "LayerHandles", "adapter_for", "supported_model_types"]
