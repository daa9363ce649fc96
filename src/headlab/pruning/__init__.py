"""Head importance, progressive pruning with re-evaluation, and physically smaller models."""

from headlab.pruning.physical import head_ids, prune_model, save_pruned

__all__ = ["head_ids", "prune_model", "save_pruned"]
