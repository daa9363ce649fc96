"""What headlab knows about one opened model's attention: :mod:`~headlab.models.adapters.base`
(the :class:`Adapter`: layers, projections, physical pruning) and
:mod:`~headlab.models.adapters.registry` (:func:`adapter_for`, found by discovery; the shims of
families whose attention bypasses transformers' attention interface, :func:`register_shim`)."""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.models.adapters.base import Adapter as Adapter
    from headlab.models.adapters.registry import adapter_for as adapter_for
    from headlab.models.adapters.registry import interface_attention as interface_attention
    from headlab.models.adapters.registry import register_shim as register_shim
    from headlab.models.adapters.registry import shim_for as shim_for
    from headlab.models.adapters.registry import unregister_shim as unregister_shim
    from headlab.models.discovery import LayerHandles as LayerHandles

__getattr__, __dir__, __all__ = attach(__name__, __file__)
