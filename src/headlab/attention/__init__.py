"""Multi-head attention: a readable NumPy reference and a fast torch module.

Dimension legend, used in every shape comment of headlab:

====== =====================================================
``B``  batch
``T``  query positions
``S``  key/value positions
``H``  query heads
``Hkv`` key/value heads (``H`` for MHA, fewer for GQA, 1 for MQA)
``G``  query heads per key/value head, ``H // Hkv``
``D``  head width (``head_dim``)
``E``  model width (``d_model``)
====== =====================================================

Internal layout everywhere: q ``(B, H, T, D)``, k/v ``(B, Hkv, S, D)``, pattern ``(B, H, T, S)``,
head output ``(B, H, T, D)``, head contribution ``(B, H, T, E)``.

Mask convention: **boolean, True means "may attend"** (the convention of
``torch.nn.functional.scaled_dot_product_attention`` and of Hugging Face's ``attention_mask``) for
``attn_mask`` and ``key_mask``. The one exception keeps torch's name and torch's meaning:
``key_padding_mask`` is True for padding ("ignore"), exactly as in ``torch.nn.MultiheadAttention``,
so code ported from torch gives torch's answer.
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.attention.kv_cache import KVCache as KVCache
    from headlab.attention.masks import causal_mask as causal_mask
    from headlab.attention.module import AttentionOutput as AttentionOutput
    from headlab.attention.module import MultiHeadAttention as MultiHeadAttention
    from headlab.attention.reference import HeadWeights as HeadWeights
    from headlab.attention.reference import ReferenceResult as ReferenceResult
    from headlab.attention.reference import reference_attention as reference_attention

__getattr__, __dir__, __all__ = attach(__name__, __file__)
