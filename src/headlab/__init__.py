"""headlab: multi-head attention, opened up.

The package is light to import: submodules that need torch (``headlab.attention``,
``headlab.models``) are imported on use, so ``headlab spec`` and ``headlab --help`` never load it.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
