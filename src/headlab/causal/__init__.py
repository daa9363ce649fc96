"""Causal head analysis: which heads carry a behaviour (activation patching, exact and
batched; attribution patching and integrated gradients), on tasks of clean and corrupted
prompts. See docs/causal.md."""

from headlab.causal.patching import (
    LayerTable,
    PatchingResult,
    activation_patching,
    attribution_patching,
    layer_patching,
    patch_heads,
    run_patching,
)
from headlab.causal.tasks import Prompt, Task, encode_task, read_prompts, write_prompts

__all__ = [
    "LayerTable",
    "PatchingResult",
    "Prompt",
    "Task",
    "activation_patching",
    "attribution_patching",
    "encode_task",
    "layer_patching",
    "patch_heads",
    "read_prompts",
    "run_patching",
    "write_prompts",
]
