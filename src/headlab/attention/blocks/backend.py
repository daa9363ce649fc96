"""The optional native CPU backend's one seam: no module outside this package imports
:mod:`headlab.native`.
"""

from __future__ import annotations

from headlab import native

# ------------------------------------------------------------ the CPU backend's one seam
# The probes' own per-block kernels (Clark et al.'s word argmax, the positional probe's offset
# counts) belong to the same optional CPU backend; they are reached here, so that no module
# but this one imports headlab.native.
from headlab.native.calls import WordTable as WordTable
from headlab.native.calls import positional_rows as positional_rows
from headlab.native.calls import word_argmax_rows as word_argmax_rows


def cpu_kernels() -> bool:
    """Whether the native CPU backend is built and loaded here (it then serves CPU tensors)."""
    return native.kernels() is not None


def cpu_kernels_missing() -> str | None:
    """Why the native CPU backend could not be built, or ``None`` when it runs or was turned
    off on purpose (``HEADLAB_NATIVE=0``, a CPU it is not built for): the note a command
    prints once."""
    if native.kernels() is not None or native.by_choice():
        return None
    return native.why_not()
