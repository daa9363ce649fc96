"""What a pruning run is scored by, built from its options: the evaluation and importance
metrics (STS-B, fidelity, perplexity, IOI) and a batch to time forwards on; and the head counts a
point of the curve leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.datasets import read_stsb, sample_path
from headlab.errors import InputError
from headlab.models import encode
from headlab.models.loading import LoadedModel
from headlab.pruning.metrics import FidelityMetric, Metric, PerplexityMetric, StsbMetric
from headlab.pruning.progressive import CurvePoint
from headlab.pruning.results import PruneOptions
from headlab.pruning.tasks import EVAL_PROMPTS, IMPORTANCE_PROMPTS, IoiMetric


def build_metrics(lm: LoadedModel, options: PruneOptions) -> tuple[Metric, Metric, Any]:
    """The evaluation metric, the importance metric, and a batch to time forwards on."""

    metric = options.metric or ("perplexity" if lm.causal else "stsb")
    if metric == "perplexity":
        evaluation, importance = perplexity_halves(lm, options)
        return evaluation, importance, {"input_ids": evaluation.windows[:8].to(lm.device)}
    if metric == "ioi":
        evaluation = IoiMetric.build(lm, n=options.limit or EVAL_PROMPTS, part="evaluation")
        importance = IoiMetric.build(lm, n=IMPORTANCE_PROMPTS, part="importance")
        return evaluation, importance, {"input_ids": evaluation.batches[0][0].to(lm.device)}
    if lm.causal:
        raise InputError(f"--metric {metric} needs an encoder; {lm.name} is a causal model")
    pairs = read_stsb(options.stsb or sample_path("stsb"), limit=options.limit)
    if options.importance_stsb:
        imp_pairs = read_stsb(options.importance_stsb, limit=options.limit)
        eval_pairs = pairs
    else:
        imp_pairs = [p for i, p in enumerate(pairs) if i % 3 == 0]
        eval_pairs = [p for i, p in enumerate(pairs) if i % 3 != 0]
    if options.importance_pairs is not None:
        stride = max(1, len(imp_pairs) // options.importance_pairs)
        imp_pairs = imp_pairs[::stride][: options.importance_pairs]
    probe = encode(lm, [p.first for p in eval_pairs[:64]])
    if metric == "stsb":
        return StsbMetric(eval_pairs), StsbMetric(imp_pairs), probe
    eval_texts = [p.first for p in eval_pairs] + [p.second for p in eval_pairs]
    imp_texts = [p.first for p in imp_pairs] + [p.second for p in imp_pairs]
    return FidelityMetric.build(lm, eval_texts), FidelityMetric.build(lm, imp_texts), probe


def perplexity_halves(lm: LoadedModel, options: PruneOptions) -> tuple[Any, Any]:
    """Perplexity on the second half of ``options.text`` (default: the bundled TinyShakespeare
    sample, 9.8k characters) and, for importance, on its first half."""

    source = options.text or sample_path("shakespeare")
    try:
        text = Path(source).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read --text {source}: {exc}") from None
    half = len(text) // 2
    return PerplexityMetric.from_text(lm, text[half:]), PerplexityMetric.from_text(lm, text[:half])


def counts_after(lm: LoadedModel, point: CurvePoint) -> tuple[list[int], list[int]]:
    """Heads and KV heads per layer once ``point``'s heads are removed."""
    heads, kv = list(lm.layout.heads_per_layer), list(lm.layout.kv_heads_per_layer)
    for layer, removed in point.removed.items():
        group = heads[layer] // kv[layer]
        heads[layer] -= len(removed)
        if kv[layer] != lm.layout.heads_per_layer[layer]:
            kv[layer] -= len(removed) // group
        else:
            kv[layer] = heads[layer]
    return heads, kv
