"""Head importance, progressive pruning with re-evaluation, and physically smaller models."""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.pruning.physical import head_ids as head_ids
    from headlab.pruning.physical import prune_model as prune_model
    from headlab.pruning.physical import save_pruned as save_pruned

__getattr__, __dir__, __all__ = attach(__name__, __file__)
