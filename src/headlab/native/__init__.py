"""Optional native row kernels (``rows.c``): attention weights and head statistics, one pass
per row.

torch computes scores, a softmax, its row maxima, the entropy and a word argmax as separate
passes over a whole block of attention weights, each reading megabytes from memory. ``rows.c``
does each row's steps while the row is in the cache:

- :func:`attend_rows`: scores ``q k^T``, right padding and the causal triangle, softmax,
  largest weight and entropy (key/value heads shared by query heads without copies);
- :func:`softmax_rows`: the softmax, largest weight and entropy of given scores;
- :func:`word_argmax_rows`: each word's most attended word (Clark et al. 2019), block by block;
- :func:`positional_rows`: the positional probe's counts of argmax offsets, one pass per head.

Only :mod:`headlab.attention.blocks`, the one attention engine, imports this module: it is that
engine's optional CPU backend (the probes reach the word argmax and positional kernels through
the engine too).

It is plain C, compiled on first use with the system's C compiler (``$CC``, split into words
as a shell would, else ``cc``; at most ``$HEADLAB_CC_TIMEOUT`` seconds, default 60) for this
CPU, cached under ``$HEADLAB_CACHE`` (default ``~/.cache/headlab``) and loaded with ctypes; no
Python or torch headers are needed. Its OpenMP loops run on the libgomp torch has loaded.

The cache is guarded: the library is written to a temporary file and renamed into place, then
its sha256 into a sidecar file; a cached library whose checksum does not match (truncated,
overwritten, planted) is built again; a cache folder that another user owns or that group or
others can write is refused. Once loaded, the library's own table of argument types
(``headlab_signatures()``) must equal :data:`_SIGNATURES`, else the kernels are refused.

The kernels have AVX-512 paths and portable C for other x86 CPUs, whose softmax and word
argmax beat torch's ops but whose products do not (:func:`fused_scores`). Off x86 nothing is
built unless ``HEADLAB_NATIVE=1`` (unmeasured there). Everything has a torch fallback that
gives the same results to float rounding: with ``HEADLAB_NATIVE=0``, without a compiler, off
Linux or macOS, when the build fails or the cache or library is refused, :func:`kernels`
returns ``None`` and :func:`why_not` says why.
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.native.build import by_choice as by_choice
    from headlab.native.build import cache_dir as cache_dir
    from headlab.native.build import fused_scores as fused_scores
    from headlab.native.build import kernels as kernels
    from headlab.native.build import l2_bytes as l2_bytes
    from headlab.native.build import parallel as parallel
    from headlab.native.build import reset as reset
    from headlab.native.build import why_not as why_not
    from headlab.native.calls import WordTable as WordTable
    from headlab.native.calls import attend_rows as attend_rows
    from headlab.native.calls import pointer as pointer
    from headlab.native.calls import positional_rows as positional_rows
    from headlab.native.calls import row_pointer as row_pointer
    from headlab.native.calls import softmax_rows as softmax_rows
    from headlab.native.calls import word_argmax_rows as word_argmax_rows

__getattr__, __dir__, __all__ = attach(__name__, __file__)
