"""Physical pruning: rewrite a real model's weights so that removed heads no longer exist.

Query/key/value rows and output-projection columns of the removed heads go; under GQA whole KV
groups go, or the same number of query heads from every group (see
:func:`headlab.attention.surgery.plan_removal`). The result computes exactly what the unpruned
model computes with those heads zero-ablated, in less time and memory.

Saving: safetensors, with the per-layer head counts, head width and the original ids of the
kept heads recorded in ``config.json`` (``headlab_pruned``), so that :func:`headlab.models.load`
rebuilds the smaller shapes (:mod:`headlab.models.pruned`). Where the family's own config can
express the result (Llama-family models: explicit ``head_dim``, the same counts in every layer,
and a head count that divides ``hidden_size``, which transformers 5 checks) the folder also loads
with transformers' ``AutoModel``. BERT-style configs tie the head width to ``hidden_size /
num_attention_heads`` and transformers 5 dropped ``pruned_heads``, so those folders load with
headlab only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from headlab.attention.surgery import plan_removal
from headlab.errors import InputError
from headlab.models.dispatch import refuse_offloaded
from headlab.models.loading import LoadedModel, wrap
from headlab.models.pruned import PRUNED_KEY
from headlab.outputs import atomic_folder, write_error

#: the kind of output recorded in the folder's ``.headlab-output`` marker
KIND = "pruned-model"


def head_ids(lm: LoadedModel) -> list[list[int]]:
    """For each layer, the original index of each current head (``range`` if never pruned)."""
    return lm.head_ids()


def prune_model(lm: LoadedModel, remove: Mapping[int, Iterable[int]]) -> LoadedModel:
    """Remove heads ``{layer: [current head indices]}`` from ``lm``'s model, in place.

    Every layer's request is checked before any weight changes.

    Raises:
        PruningError: a layer would lose all its heads, or a GQA layout would break, or some
            of the model's weights are offloaded (to disk, or to the CPU of a GPU model).
        InputError: a layer index out of range.
    """
    refuse_offloaded(lm.device_map, "physical pruning")
    plans: dict[int, tuple[list[int], list[int]]] = {}
    for layer, heads in remove.items():
        if not 0 <= int(layer) < lm.n_layers:
            raise InputError(
                f"layer {layer} out of range: the model has layers 0..{lm.n_layers - 1}"
            )
        heads = list(heads)
        if not heads:
            continue
        plans[int(layer)] = plan_removal(
            lm.layout.heads_per_layer[int(layer)],
            lm.layout.kv_heads_per_layer[int(layer)],
            heads,
            where=f"layer {layer}",
        )
    ids = head_ids(lm)
    heads_now = list(lm.layout.heads_per_layer)
    kv_now = list(lm.layout.kv_heads_per_layer)
    base = getattr(lm.model, "base_model", lm.model)
    d = lm.head_dim
    for layer, (keep, keep_kv) in sorted(plans.items()):
        lm.adapter.prune_layer(base, layer, keep, keep_kv, d)
        ids[layer] = [ids[layer][h] for h in keep]
        heads_now[layer], kv_now[layer] = len(keep), len(keep_kv)
    _record(lm, heads_now, kv_now, d, ids)
    return wrap(lm.model, lm.tokenizer, name=lm.name, path=lm.path)


def _record(
    lm: LoadedModel, heads: list[int], kv_heads: list[int], head_dim: int, ids: list[list[int]]
) -> None:
    config = lm.model.config
    native = lm.adapter.native_config(config.to_dict(), heads, kv_heads, head_dim)
    if native:
        for key, value in native.items():
            setattr(config, key, value)
    if getattr(config, "head_dim", None) != head_dim:  # Falcon derives it (a read-only property)
        config.head_dim = head_dim
    config.headlab_heads_per_layer = heads
    config.headlab_kv_heads_per_layer = kv_heads
    setattr(
        config,
        PRUNED_KEY,
        {
            "native": bool(native),
            "heads_per_layer": heads,
            "kv_heads_per_layer": kv_heads,
            "head_dim": head_dim,
            "head_ids": ids,
        },
    )


def save_pruned(
    lm: LoadedModel, out: str | Path, *, overwrite: bool = False, info: dict[str, Any] | None = None
) -> Path:
    """Save model, tokenizer and ``pruning.json`` (``info``) to ``out``, atomically.

    ``overwrite`` replaces only a folder headlab wrote (see :mod:`headlab.outputs`).

    Raises:
        OutputExistsError: ``out`` exists and may not be replaced.
        OutputError: the folder cannot be written (read-only, full disk), in one line.
    """
    from safetensors import SafetensorError

    out = Path(out)
    with atomic_folder(out, overwrite=overwrite, kind=KIND) as tmp:
        try:
            lm.model.save_pretrained(tmp, safe_serialization=True)
            lm.tokenizer.save_pretrained(tmp)
            if info is not None:
                (tmp / "pruning.json").write_text(json.dumps(info, indent=2) + "\n")
        except (OSError, SafetensorError) as exc:
            raise write_error(out, exc) from None
    return out
