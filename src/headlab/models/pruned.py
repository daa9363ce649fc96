"""Open a model folder that headlab pruned into a layout its family's config cannot express.

:mod:`headlab.pruning.physical` saves such folders with the unpruned config plus a
``headlab_pruned`` record (per-layer head and KV-head counts, head width, original head ids).
Loading builds the unpruned shapes, shrinks every layer to the recorded counts, then loads the
saved weights, checking that every tensor has the shape the record implies. This module belongs
to the models floor so that loading never imports the pruning code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.errors import ModelLoadError
from headlab.layout.attention import layout_from_config

#: the key of the pruning record in a pruned model's config.json
PRUNED_KEY = "headlab_pruned"


def _counts(info: Any, key: str, n_layers: int, folder: Path) -> list[int]:
    values = info.get(key) if isinstance(info, dict) else None
    if (
        not isinstance(values, list)
        or len(values) != n_layers
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
    ):
        raise ModelLoadError(
            f"{folder / 'config.json'}: {PRUNED_KEY}.{key} must list a positive count for each "
            f"of the {n_layers} layers, got {values!r}"[:300]
        )
    return values


def _full_counts(config: Any, layer: int) -> tuple[int, int]:
    """The unpruned head and KV-head counts of ``layer`` from the family's own config keys."""

    cfg = config.to_dict()
    cfg.pop("headlab_heads_per_layer", None)
    cfg.pop("headlab_kv_heads_per_layer", None)
    layout = layout_from_config(cfg)
    return layout.heads_per_layer[layer], layout.kv_heads_per_layer[layer]


def load_pruned_weights(model: Any, folder: Path, adapter: Any, config: dict[str, Any]) -> None:
    """Shrink a freshly built (unpruned-shape) ``model`` to the saved layout and load weights.

    Raises:
        ModelLoadError: the record disagrees with the config or with the saved weights (one line,
            naming the first disagreeing layer or tensor).
    """
    from safetensors.torch import load_file

    info = config[PRUNED_KEY]
    base = getattr(model, "base_model", model)
    layers = adapter.layers()
    n_layers = len(layers)
    heads = _counts(info, "heads_per_layer", n_layers, folder)
    kv_heads = _counts(info, "kv_heads_per_layer", n_layers, folder)
    for key, values in (("heads_per_layer", heads), ("kv_heads_per_layer", kv_heads)):
        top = config.get(f"headlab_{key}")
        if top is not None and top != values:
            raise ModelLoadError(
                f"{folder / 'config.json'}: headlab_{key} {top!r} disagrees with "
                f"{PRUNED_KEY}.{key} {values!r}"[:300]
            )
    head_dim = info.get("head_dim")
    if not isinstance(head_dim, int) or head_dim <= 0:
        raise ModelLoadError(
            f"{folder / 'config.json'}: {PRUNED_KEY}.head_dim must be a positive integer, "
            f"got {head_dim!r}"
        )
    for layer in range(n_layers):
        n_heads, n_kv = heads[layer], kv_heads[layer]
        full_heads, full_kv = _full_counts(model.config, layer)
        if n_heads > full_heads or n_kv > full_kv or n_heads % n_kv:
            raise ModelLoadError(
                f"{folder / 'config.json'}: layer {layer} records {n_heads} heads in {n_kv} KV "
                f"groups; expected at most {full_heads} heads in at most {full_kv} groups, the "
                "heads a whole multiple of the groups"
            )
        group = full_heads // full_kv
        per_group = n_heads // n_kv
        if per_group > group:
            raise ModelLoadError(
                f"{folder / 'config.json'}: layer {layer} records {per_group} query heads per KV "
                f"group; the unpruned model has {group}"
            )
        keep = [g * group + i for g in range(n_kv) for i in range(per_group)]
        if (n_heads, n_kv) != (full_heads, full_kv):
            adapter.prune_layer(base, layer, keep, list(range(n_kv)), head_dim)
    state: dict[str, Any] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    target = model
    own = set(model.state_dict())
    if not set(state) & own:
        prefix = f"{getattr(model, 'base_model_prefix', '')}."
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
        target = base
    expected = target.state_dict()
    for key, tensor in state.items():
        if key in expected and tuple(expected[key].shape) != tuple(tensor.shape):
            raise ModelLoadError(
                f"{folder}: the per-layer head counts in config.json disagree with the weights: "
                f"{key} has shape {list(tensor.shape)}, the recorded layout needs "
                f"{list(expected[key].shape)}"
            )
    missing, unexpected = target.load_state_dict(state, strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if unexpected or set(missing) - tied:
        raise ModelLoadError(
            f"{folder}: the saved weights do not fit the pruned layout "
            f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()
