"""headlab: multi-head attention, opened up.

The package is light to import: its names load on first use (PEP 562, :mod:`headlab._lazy`), so
``headlab spec`` and ``headlab --help`` never load torch.
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach
from headlab._version import __version__ as __version__

if TYPE_CHECKING:
    from headlab.explore.sentence import capture as capture

__getattr__, __dir__, __all__ = attach(__name__, __file__)
__all__ += ["__version__"]
