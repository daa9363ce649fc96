"""headlab: multi-head attention, opened up.

The front door: what a notebook or script needs, in a few names. Each measurement is the
library call its command makes (the same request, checked before any model loads, and the same
run), and returns a result whose ``to_json()`` is the command's ``--json``:

=================  ==============================================  ==========================
``load``           a model, opened for its heads                   :class:`LoadedModel`
``capture``        every head's pattern on one sentence            ``headlab heads``
``roles``          what every head specializes in, on gold data    ``headlab roles``
``patch``          which heads carry a behaviour (patching, DLA)   ``headlab patch``
``circuit``        a behaviour's circuit, measured on held-out     ``headlab circuit``
``cards``          one card per head, every measurement joined     ``headlab cards``
``prune``          the pruning curve, or a smaller model written   ``headlab prune``
``spec``           heads, KV cache and FLOPs from a config          ``headlab spec``
=================  ==============================================  ==========================

Example:
    >>> import headlab
    >>> lm = headlab.load("tiny-shakespeare")
    >>> report = headlab.measure_roles(lm, limit=50, replicates=10)
    >>> report.to_json()["heads"][0]["role"]  # doctest: +SKIP
    'positional'

Names load on first use (PEP 562, :mod:`headlab._lazy`): ``import headlab``, ``headlab spec``
and ``headlab --help`` never load torch. Everything else is importable from the module that
defines it; these names are the ones kept stable. (Roles are ``measure_roles``: the name
``headlab.roles`` is the package that measures them.)
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach
from headlab._version import __version__ as __version__

if TYPE_CHECKING:
    from headlab.api import cards as cards
    from headlab.api import circuit as circuit
    from headlab.api import measure_roles as measure_roles
    from headlab.api import patch as patch
    from headlab.api import prune as prune
    from headlab.api import spec as spec
    from headlab.explore.sentence import capture as capture
    from headlab.models.loading import LoadedModel as LoadedModel
    from headlab.models.loading import load as load

__getattr__, __dir__, __all__ = attach(__name__, __file__)
__all__ += ["__version__"]
