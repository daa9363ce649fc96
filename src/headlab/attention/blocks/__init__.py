"""The attention engine: the one place where headlab computes attention weights.

Every attention weight headlab hands out comes from this module, ``softmax(q k^T * scale +
mask)`` (Vaswani et al. 2017, eq. 1), by one of three entries that share its rules:

- :func:`attention_blocks`: a model layer's output computed one block of query rows at a time,
  each block's weights, largest weight, entropy and sums over chosen key columns handed out on
  the way (:class:`~headlab.models.StreamingAttention`, role statistics);
- :func:`attention_weights`: whole patterns of chosen heads and query rows
  (:class:`~headlab.models.HeadCapture`);
- :func:`explicit_attention`: :class:`~headlab.attention.MultiHeadAttention`'s explicit path
  (weights returned, differentiable);

The rules they share:

- **Masks**: boolean (True = may attend) or additive float, broadcastable to ``(B, H, T, S)``;
  right padding as each batch row's number of keys (:func:`key_lengths`); the causal triangle
  aligned to the bottom right (:func:`~headlab.attention.masks.causal_rows`: query ``i`` sees
  keys ``j <= i + S - T``); a sliding window is whatever the given mask says. An additive mask
  hides a key where it is ``-inf`` or at most ``max(-1e30, finfo(dtype).min)``.
- **GQA/MQA**: query head ``h`` reads key/value head ``h // G`` (``G = H // Hkv``); the heads of
  a group are stacked as rows of one product, so keys and values are never copied per head.
- **A query row with no visible key** (every key hidden: a padded query under a sliding window,
  a sentence with no keys) gets **zero weights, a zero head output, entropy 0 and largest
  weight 0**, on every path (torch's ops, the native kernels, whole patterns, the explicit
  path), never NaN, with zero gradients through it. This is what torch's
  ``scaled_dot_product_attention`` gives such a row, so a model run through headlab's engine
  matches its sdpa run there too.

The optional native kernels (:mod:`headlab.native`) sit behind this module alone: they run only
on CPU tensors, where they are built, and give the same results to float rounding. Everything
else is torch's ops on the inputs' device.
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.attention.blocks.backend import WordTable as WordTable
    from headlab.attention.blocks.backend import cpu_kernels as cpu_kernels
    from headlab.attention.blocks.backend import cpu_kernels_missing as cpu_kernels_missing
    from headlab.attention.blocks.backend import positional_rows as positional_rows
    from headlab.attention.blocks.backend import word_argmax_rows as word_argmax_rows
    from headlab.attention.blocks.rules import MASKED as MASKED
    from headlab.attention.blocks.rules import key_lengths as key_lengths
    from headlab.attention.blocks.stream import KERNEL_COLUMNS as KERNEL_COLUMNS
    from headlab.attention.blocks.stream import MIN_BLOCK_ROWS as MIN_BLOCK_ROWS
    from headlab.attention.blocks.stream import Workspace as Workspace
    from headlab.attention.blocks.stream import attention_blocks as attention_blocks
    from headlab.attention.blocks.stream import block_rows as block_rows
    from headlab.attention.blocks.whole import AttendResult as AttendResult
    from headlab.attention.blocks.whole import attention_weights as attention_weights
    from headlab.attention.blocks.whole import explicit_attention as explicit_attention
    from headlab.attention.blocks.whole import rows_without_keys as rows_without_keys

__getattr__, __dir__, __all__ = attach(__name__, __file__)
