"""From corpus sums to per-head scores, evidence and results: each head's role, score,
baseline and stability, and the best head of each relation."""

from __future__ import annotations

import math

import torch

from headlab.roles.bootstrap import Sums
from headlab.roles.classify import ROLES, RoleEvidence, Thresholds, role_name
from headlab.roles.probes import (
    broad,
    coreference,
    delimiter,
    induction,
    positional,
    rare,
    syntactic,
)
from headlab.roles.results import HeadRole, RelationRow


def evidence(
    tb: Sums, gap: Sums | None, ind: Sums | None, thresholds: Thresholds
) -> tuple[RoleEvidence, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    scores: dict[str, torch.Tensor] = {}
    scores.update(positional.scores(tb))
    scores.update(delimiter.scores(tb))
    scores.update(broad.scores(tb))
    scores.update(rare.scores(tb))
    syn = syntactic.scores(tb)
    shape = scores["positional"].shape  # (R+1, L, H)
    eligible = syn["count"][0] >= thresholds.min_relation_count  # (Rel, 2)
    margin = (syn["accuracy"] - syn["baseline"][:, None, None]).nan_to_num(-2.0)
    margin = margin.masked_fill(~eligible, -2.0).flatten(-2)  # (R+1, L, H, Rel*2)
    best = margin.argmax(-1)  # (R+1, L, H)
    acc = syn["accuracy"].flatten(-2).gather(-1, best[..., None]).squeeze(-1)
    base = (
        syn["baseline"].flatten(-2)[:, None, None, :].expand(*shape, -1).gather(-1, best[..., None])
    ).squeeze(-1)
    if not bool(eligible.any()):
        acc = torch.full(shape, torch.nan, dtype=acc.dtype)
    scores["syntactic"] = acc
    scores["syntactic_relation"] = best
    score: dict[str, torch.Tensor] = {}
    baseline: dict[str, torch.Tensor] = {}
    bar: dict[str, torch.Tensor] = {}

    def fixed(role: str, key: str, value: float) -> None:
        score[role] = scores[key]
        baseline[role] = torch.full(shape, value, dtype=torch.float64)
        bar[role] = baseline[role]

    fixed("positional", "positional", thresholds.positional)
    fixed("delimiter", "delimiter", thresholds.delimiter)
    fixed("rare-token", "rare-token", thresholds.rare_token)
    fixed("broad", "broad", thresholds.broad)
    baseline["rare-token"] = scores["rare_chance"]
    score["syntactic"] = acc
    baseline["syntactic"] = base
    bar["syntactic"] = base + thresholds.syntactic_margin
    if gap is not None and "coref.examples" in gap:
        coref = coreference.scores(gap)
        scores.update(coref)
        best_base = torch.maximum(coref["coref_nearest"], coref["coref_first"])[:, None, None]
        score["coreference"] = coref["coreference"]
        baseline["coreference"] = best_base.expand(shape)
        bar["coreference"] = baseline["coreference"] + thresholds.coreference_margin
    if ind is not None and "induction.n" in ind:
        scores.update(induction.scores(ind))
        fixed("induction", "induction", thresholds.induction)
    return RoleEvidence(score=score, baseline=baseline, bar=bar), scores, syn


def head_role(
    layer: int,
    h: int,
    dominant: torch.Tensor,
    excess: torch.Tensor,
    evidence: RoleEvidence,
    scores: dict[str, torch.Tensor],
    relations: list[str],
    replicates: int,
) -> HeadRole:
    role = role_name(int(dominant[0, layer, h]))
    cleared = [(float(excess[i, layer, h]), r) for i, r in enumerate(ROLES)]
    passing = tuple(r for margin, r in sorted(cleared, reverse=True) if math.isfinite(margin))
    stability = None
    if replicates:
        same = dominant[1:, layer, h] == dominant[0, layer, h]
        stability = float(same.double().mean())

    def value(key: str) -> float | None:
        if key not in scores:
            return None
        v = float(scores[key][0, layer, h])
        return None if math.isnan(v) else v

    score = baseline = margin = None
    if role in evidence.score:
        score = float(evidence.score[role][0, layer, h])
        baseline = float(evidence.baseline[role][0, layer, h])
        margin = score - baseline
    detail = ""
    if role == "positional":
        detail = f"offset {int(scores['positional_offset'][0, layer, h]):+d}"
    elif role == "syntactic":
        k = int(scores["syntactic_relation"][0, layer, h])
        detail = f"{relations[k // 2]} {syntactic.DIRECTIONS[k % 2].replace('_', ' ')}"
    elif role == "delimiter":
        parts = {p: value(p) or 0.0 for p in ("cls", "sep", "punct")}
        detail = {"cls": "[CLS]", "sep": "[SEP]/EOS", "punct": "punctuation"}[
            max(parts, key=lambda p: parts[p])
        ]
    elif role == "broad":
        detail = f"{value('entropy') or 0.0:.2f} nats"
    names = (
        "positional",
        "previous",
        "next",
        "delimiter",
        "cls",
        "sep",
        "punct",
        "rare-token",
        "syntactic",
        "coreference",
        "broad",
        "entropy",
        "induction",
    )
    return HeadRole(
        layer=layer,
        head=h,
        role=role,
        roles=passing,
        score=score,
        baseline=baseline,
        margin=margin,
        detail=detail,
        stability=stability,
        scores={name: value(name) for name in names if name in scores},
    )


def relation_rows(
    syn: dict[str, torch.Tensor], relations: list[str], present: torch.Tensor
) -> list[RelationRow]:
    """The best existing head (``present`` ``(L, H)``) of each relation and direction."""
    rows = []
    n_heads = present.shape[1]
    acc = syn["accuracy"][0].masked_fill(~present[..., None, None], torch.nan)  # (L, H, Rel, 2)
    for r, name in enumerate(relations):
        for d, direction in enumerate(syntactic.DIRECTIONS):
            count = int(syn["count"][0, r, d])
            if count == 0:
                continue
            per_head = acc[..., r, d].nan_to_num(-1.0)
            flat = int(per_head.argmax())
            layer, h = divmod(flat, n_heads)
            rows.append(
                RelationRow(
                    relation=name,
                    direction=direction,
                    layer=layer,
                    head=h,
                    accuracy=float(per_head[layer, h]),
                    baseline=float(syn["baseline"][0, r, d]),
                    baseline_offset=int(syn["baseline_offset"][0, r, d]),
                    count=count,
                )
            )
    return rows
