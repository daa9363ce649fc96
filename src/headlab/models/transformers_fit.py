"""Whether transformers itself can build a pruned model from its family's config.

A candidate config sets the family's own head-count keys (and ``head_dim``); transformers then
builds the model on the meta device (no memory), and the candidate counts only if every
query/key/value and output projection has exactly the pruned shape. No family list: BERT-style
configs, which tie the head width to ``hidden_size / num_attention_heads``, fail the check by
themselves.
"""

from __future__ import annotations

from typing import Any

import torch

from headlab.layout.attention import HEAD_KEYS, KV_HEAD_KEYS
from headlab.models.discovery import is_conv1d


def _key(config: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if config.get(k) is not None), None)


def native_config(
    adapter: Any, config: dict[str, Any], heads: list[int], kv_heads: list[int], head_dim: int
) -> dict[str, Any] | None:
    if len(set(heads)) != 1 or len(set(kv_heads)) != 1:
        return None
    if any(h.kind != "self" or h.qkv is None for h in adapter.handles):
        return None
    head_key = _key(config, HEAD_KEYS)
    if head_key is None:
        return None
    update: dict[str, Any] = {head_key: heads[0], "head_dim": head_dim}
    kv_key = _key(config, KV_HEAD_KEYS)
    if kv_key is not None:
        update[kv_key] = kv_heads[0]
    elif kv_heads[0] != heads[0]:
        return None
    try:
        from transformers import AutoConfig

        candidate = {k: v for k, v in config.items() if not k.startswith("headlab_")}
        candidate.update(update)
        model_type = candidate.pop("model_type")
        for key in ("transformers_version", "architectures", "_name_or_path"):
            candidate.pop(key, None)
        cfg = AutoConfig.for_model(model_type, **candidate)
        with torch.device("meta"):
            built = type(adapter.model)._from_config(cfg)
    except Exception:
        return None
    modules = dict(built.named_modules())
    paths = {id(m): p for p, m in adapter.model.named_modules()}
    n_h, n_kv, d = heads[0], kv_heads[0], head_dim
    for h in adapter.handles:
        qkv = h.qkv
        want: list[tuple[Any, int, str]] = [(h.out_proj, n_h * d, "in")]
        if qkv.layout == "separate":
            want += [(qkv.q, n_h * d, "out"), (qkv.k, n_kv * d, "out"), (qkv.v, n_kv * d, "out")]
        else:
            want.append((qkv.q, (n_h + 2 * n_kv) * d, "out"))
        for module, width, side in want:
            other = modules.get(paths.get(id(module), ""))
            weight = getattr(other, "weight", None)
            if other is None or weight is None:
                return None
            shape = tuple(weight.shape)
            out, inp = (shape[1], shape[0]) if is_conv1d(other) else (shape[0], shape[1])
            if (out if side == "out" else inp) != width:
                return None
    return update
