"""The parts of a head's card that do not depend on the request (:mod:`headlab.experiments.cards`
joins them): each head's strongest composition senders, its top examples on the bundled
sentences, its pruning importance and rank, its shares of attention FLOPs and KV cache, and one
head's card from what was measured.

Shape vocabulary: ``L`` layers, ``H`` heads of a layer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from headlab.causal.composition import KINDS, receiver_senders
from headlab.causal.request import ComposeRequest
from headlab.errors import InputError, TooLongError
from headlab.layout.costs import compute_spec
from headlab.models.analysis import word_attention
from headlab.models.loading import LoadedModel
from headlab.progress import NO_PROGRESS, Progress
from headlab.pruning.importance import gradient_importance
from headlab.pruning.inputs import build_metrics
from headlab.pruning.results import PruneOptions

#: senders listed per head and kind of composition
TOP_SENDERS = 3
#: top examples kept per head
TOP_EXAMPLES = 3


def composition_senders(lm: LoadedModel) -> dict[tuple[int, int], dict[str, list[dict[str, Any]]]]:
    """Each head's :data:`TOP_SENDERS` strongest senders of each kind (``headlab compose
    --receivers L.H --kind KIND --top 3``); empty lists in the first layer."""
    scores = ComposeRequest(model=lm.name).run(lm).scores
    out: dict[tuple[int, int], dict[str, list[dict[str, Any]]]] = {}
    for layer, count in enumerate(lm.layout.heads_per_layer):
        for head in range(count):
            out[(layer, head)] = {kind: [] for kind in KINDS}
            if layer == 0:
                continue
            for kind in KINDS:
                (found,) = receiver_senders(lm, scores, kind, [(layer, head)], TOP_SENDERS)
                out[(layer, head)][kind] = [
                    {
                        "head": f"{s['layer']}.{s['head']}",
                        "score": s["score"],
                        "x_baseline": s["x_baseline"],
                    }
                    for s in found["senders"]
                ]
    return out


def top_examples(
    lm: LoadedModel,
    sentences: list[list[str]],
    k: int = TOP_EXAMPLES,
    progress: Progress = NO_PROGRESS,
) -> tuple[list[list[str]], dict[tuple[int, int], list[dict[str, Any]]]]:
    """Each head's ``k`` sentences where its attention is most concentrated away from the
    sink: in each sentence its largest word-level weight (:func:`~headlab.models.analysis.
    word_attention`) from a query word to a key word, neither a special token, the key not the
    attention sink; the ``k`` sentences where that weight is largest, strongest first.

    Returns:
        every sentence's words as the model reads them (special tokens included), and per head
        ``[{"sentence", "query", "key", "weight"}]`` (indices into those words).
    """
    words_of: list[list[str]] = []
    found: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for words in sentences:
        try:
            seen = word_attention(lm, words=words)
        except TooLongError:  # longer than the model reads: not an example of it
            progress.advance()
            continue
        index = len(words_of)
        aligned = seen.alignment
        words_of.append(list(aligned.words))
        special = torch.tensor(aligned.is_special)
        for layer, pattern in seen.patterns.items():  # (H, W, W)
            p = pattern.double().clone()
            p[:, special, :] = -1.0
            p[:, :, special] = -1.0
            if seen.sink is not None:  # the sink set apart (its own row then holds nothing)
                p[:, :, seen.sink] = -1.0
            width = p.shape[-1]
            weight, where = p.flatten(1).max(-1)  # (H,)
            for head, (w, at) in enumerate(zip(weight.tolist(), where.tolist(), strict=True)):
                if w > 0:
                    found.setdefault((layer, head), []).append(
                        {"sentence": index, "query": at // width, "key": at % width, "weight": w}
                    )
        progress.advance()
    top = {h: sorted(rows, key=lambda r: -r["weight"])[:k] for h, rows in found.items()}
    return words_of, top


def prune_importance(lm: LoadedModel) -> torch.Tensor:
    """``(L, H)``: gradient importance as ``headlab prune`` scores heads by default
    (:func:`~headlab.pruning.inputs.build_metrics` of the default options)."""
    head = getattr(lm.model, "get_output_embeddings", lambda: None)()
    if lm.causal and head is None:
        raise InputError(
            "a causal model's importance reads its perplexity: load it with its language-model "
            "head (headlab cards does)"
        )
    _, metric, _ = build_metrics(lm, PruneOptions())
    return gradient_importance(lm, metric)


def cost_shares(lm: LoadedModel, context: int) -> tuple[list[float], list[float]]:
    """Each layer's share, per query head, of the attention FLOPs per token and of the KV
    cache at ``context`` tokens (:func:`~headlab.layout.costs.compute_spec` of the layout and
    of each layer alone; a layer's cost split evenly among its query heads)."""
    lay = lm.layout
    whole = compute_spec(lay, context=context)
    flops, kv = [], []
    for layer, n_heads in enumerate(lay.heads_per_layer):
        alone = replace(
            lay,
            n_layers=1,
            heads_per_layer=(n_heads,),
            kv_heads_per_layer=(lay.kv_heads_per_layer[layer],),
            layer_windows=(lay.layer_windows[layer],),
        )
        one = compute_spec(alone, context=context)
        flops.append(one.attention_flops_per_token / whole.attention_flops_per_token / n_heads)
        kv.append(one.kv_cache_bytes / whole.kv_cache_bytes / n_heads)
    return flops, kv


def _value(t: torch.Tensor | None, layer: int, head: int) -> float | None:
    if t is None:
        return None
    v = float(t[layer, head])
    return None if v != v else v


def _tokens(lm: LoadedModel, ids: torch.Tensor, logits: torch.Tensor) -> list[dict[str, Any]]:
    """``[{"token", "id", "logit"}]`` of one head's token ids (their text as decoded)."""
    out = []
    for token, logit in zip(ids.tolist(), logits.tolist(), strict=True):
        if token < 0:
            continue
        text = lm.tokenizer.decode([token]) if lm.tokenizer is not None else str(token)
        out.append({"token": text, "id": token, "logit": logit})
    return out


@dataclass(frozen=True, kw_only=True)
class Measured:
    """Every part measured, per head where it is per head (``None``: left out)."""

    roles: dict[tuple[int, int], dict[str, Any]]
    examples: dict[tuple[int, int], list[dict[str, Any]]] | None
    senders: dict[tuple[int, int], dict[str, list[dict[str, Any]]]] | None
    written: Any
    copying: torch.Tensor | None
    dla: dict[str, torch.Tensor]
    patching: dict[str, torch.Tensor]
    classes: dict[tuple[int, int], dict[str, Any]]
    flops: list[float]
    kv: list[float] | None
    importance: torch.Tensor | None
    ranks: torch.Tensor | None


def importance_ranks(importance: torch.Tensor | None) -> torch.Tensor | None:
    """``(L, H)``: each head's rank by importance among all heads, 1 the most important."""
    if importance is None:
        return None
    order = importance.nan_to_num(float("-inf")).flatten().argsort(descending=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(1, order.numel() + 1)
    return ranks.view(importance.shape)


def card_of(lm: LoadedModel, m: Measured, layer: int, head: int) -> dict[str, Any]:
    """Head ``layer.head``'s card, its verdict to come."""
    w = m.written
    looks = m.roles.get((layer, head))
    if looks is not None and m.examples is not None:
        looks = {**looks, "examples": m.examples.get((layer, head), [])}
    elif m.examples is not None:
        looks = {"examples": m.examples.get((layer, head), [])}
    return {
        "id": f"{layer}.{head}",
        "layer": layer,
        "head": head,
        "looks": looks,
        "reads": None if m.senders is None else m.senders[(layer, head)],
        "writes": {
            "unembedding": None if w is None else w.unembedding,
            "promoted": None
            if w is None
            else _tokens(lm, w.promoted[layer, head], w.promoted_logits[layer, head]),
            "suppressed": None
            if w is None
            else _tokens(lm, w.suppressed[layer, head], w.suppressed_logits[layer, head]),
            "copying": _value(m.copying, layer, head),
            "dla": {t: _value(v, layer, head) for t, v in m.dla.items()},
        },
        "does": {
            "patching": {t: _value(v, layer, head) for t, v in m.patching.items()},
            "ioi_class": m.classes.get((layer, head)),
        },
        "costs": {
            "flops_share": m.flops[layer],
            "kv_share": None if m.kv is None else m.kv[layer],  # an encoder keeps none
            "importance": _value(m.importance, layer, head),
            "importance_rank": None if m.ranks is None else int(m.ranks[layer, head]),
        },
    }
