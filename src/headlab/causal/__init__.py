"""Causal head analysis: which heads carry a behaviour (activation patching, exact and
batched; attribution patching and integrated gradients), on tasks of clean and corrupted
prompts. See docs/causal.md."""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.causal.patching import LayerTable as LayerTable
    from headlab.causal.patching import PatchingResult as PatchingResult
    from headlab.causal.patching import activation_patching as activation_patching
    from headlab.causal.patching import attribution_patching as attribution_patching
    from headlab.causal.patching import layer_patching as layer_patching
    from headlab.causal.patching import patch_heads as patch_heads
    from headlab.causal.patching import run_patching as run_patching
    from headlab.causal.tasks import Prompt as Prompt
    from headlab.causal.tasks import Task as Task
    from headlab.causal.tasks import encode_task as encode_task
    from headlab.causal.tasks import read_prompts as read_prompts
    from headlab.causal.tasks import write_prompts as write_prompts

__getattr__, __dir__, __all__ = attach(__name__, __file__)
