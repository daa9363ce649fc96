"""Causal head analysis: which heads carry a behaviour (activation patching, exact and
batched; attribution patching and integrated gradients), on tasks of clean and corrupted
prompts. See docs/causal.md.

The names below are imported on first use, so that the light modules (the method table,
:mod:`headlab.causal.methods`, which ``headlab patch --help`` reads) load without torch."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: where each name of the package lives
_WHERE = {
    "LayerTable": "patching",
    "PatchingResult": "patching",
    "Prompt": "tasks",
    "Task": "tasks",
    "activation_patching": "patching",
    "attribution_patching": "patching",
    "encode_task": "tasks",
    "layer_patching": "patching",
    "patch_heads": "patching",
    "read_prompts": "tasks",
    "run_patching": "patching",
    "write_prompts": "tasks",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'headlab.causal' has no attribute {name!r}")
    return getattr(importlib.import_module(f"headlab.causal.{_WHERE[name]}"), name)


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
