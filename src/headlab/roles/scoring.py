"""From corpus sums to per-head scores, evidence and results: each head's role, score,
baseline and stability, and the best head of each relation."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from headlab.errors import InputError
from headlab.roles import registry, stats
from headlab.roles.bootstrap import Sums
from headlab.roles.classify import ROLES, UNCLASSIFIED, RoleEvidence, Thresholds, role_name
from headlab.roles.probes import coreference, syntactic
from headlab.roles.results import HeadRole, RelationRow


def _tested(
    hits: torch.Tensor,
    both: torch.Tensor,
    base_hits: torch.Tensor,
    family: torch.Tensor,
    *,
    count: torch.Tensor,
    bootstrap_rows: slice,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact McNemar p-values and their BH q-values over each row's ``family`` (bool mask).

    Rows are the whole data, the folds and the bootstrap resamples (``bootstrap_rows``); the
    discordant counts of every row are divided by the design effect of the paired difference
    on the whole data (documents share words and style, so their arcs are not independent
    pairs), measured from the resamples' differences ``(hits - base_hits) / count``."""
    b = (hits - both).numpy()  # head right, baseline wrong
    c = (base_hits - both).numpy()  # baseline right, head wrong
    n = count.expand_as(hits).numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = (b - c) / n  # (R+1, ...): the paired difference in each row
    deff = stats.paired_design_effect(b[0], c[0], n[0], diff[bootstrap_rows])
    b, c = b / deff[None], c / deff[None]
    mask = family.numpy()
    p = np.full(mask.shape, np.nan)
    p[mask] = stats.mcnemar_exact(b[mask], c[mask])
    rows = mask.shape[0]
    q = stats.benjamini_hochberg(p.reshape(rows, -1), mask.reshape(rows, -1)).reshape(mask.shape)
    return torch.from_numpy(p), torch.from_numpy(q)


def syntactic_choice(
    syn: dict[str, torch.Tensor],
    relations: Sequence[str],
    present: torch.Tensor,
    thresholds: Thresholds,
    *,
    decide_on: slice = slice(0, 1),
    bootstrap_rows: slice = slice(0, 0),
) -> dict[str, torch.Tensor]:
    """Each head's deciding relation x direction, in every row, from :func:`syntactic.scores`.

    A relation x direction is *tested* when the relation is in
    :data:`~headlab.roles.probes.syntactic.RELATION_SET` and has at least
    ``min_relation_count`` arcs in every row of ``decide_on`` (the whole data, or with folds
    each fold), the same relations in every row: a role the whole data names on a relation
    too rare to be judged in a fold could never be confirmed by the folds. Every tested one of
    every present head is one exact McNemar test against the baseline on the same arcs (its
    discordant counts divided by the paired difference's design effect, from the resamples of
    documents in ``bootstrap_rows``), and each row's tests are one Benjamini-Hochberg family
    (their p and q go into ``syn``). A head *clears* the syntactic bar on a relation when
    its accuracy beats the baseline by ``syntactic_margin`` and q is below ``significance``.
    The deciding relation is the widest margin among those cleared, else the widest among
    those tested (shown, not cleared).

    Returns ``(R+1, L, H)`` tensors: ``best`` (index ``relation * 2 + direction``), ``clears``,
    ``accuracy`` (NaN when nothing was tested), ``baseline``, ``p``, ``q``, ``hits``, ``count``.
    """
    in_set = torch.tensor([r in syntactic.RELATION_SET for r in relations], dtype=torch.bool)
    enough = (syn["count"][decide_on] >= thresholds.min_relation_count).all(0)  # (Rel, 2)
    eligible = (enough & in_set[:, None]).expand_as(syn["count"])  # (R+1, Rel, 2)
    family = eligible[:, None, None] & present[None, :, :, None, None]  # (R+1, L, H, Rel, 2)
    syn["p"], syn["q"] = _tested(
        syn["hits"],
        syn["both"],
        syn["baseline_hits"][:, None, None],
        family,
        count=syn["count"][:, None, None],
        bootstrap_rows=bootstrap_rows,
    )
    margin = syn["accuracy"] - syn["baseline"][:, None, None]  # (R+1, L, H, Rel, 2)
    clears = family & (syn["q"] < thresholds.significance)
    clears &= margin >= thresholds.syntactic_margin
    key = torch.where(clears, margin + 10.0, torch.where(family, margin, -torch.inf))
    key = key.nan_to_num(-torch.inf).flatten(-2)  # (R+1, L, H, Rel*2)
    best = key.argmax(-1)  # (R+1, L, H)

    def at_best(t: torch.Tensor) -> torch.Tensor:
        return t.expand_as(syn["hits"]).flatten(-2).gather(-1, best[..., None]).squeeze(-1)

    tested = torch.isfinite(key.max(-1).values)
    return {
        "best": best,
        "clears": at_best(clears),
        "accuracy": torch.where(tested, at_best(syn["accuracy"]), torch.nan),
        "baseline": at_best(syn["baseline"][:, None, None]),
        "p": at_best(syn["p"]),
        "q": at_best(syn["q"]),
        "hits": at_best(syn["hits"]),
        "count": at_best(syn["count"][:, None, None]),
    }


def evidence(
    sums: Mapping[str, Sums | None],
    thresholds: Thresholds,
    *,
    offsets: torch.Tensor,
    relations: Sequence[str],
    present: torch.Tensor,
    copying: torch.Tensor | None = None,
) -> tuple[RoleEvidence, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every role's score, baseline and bar for every row of the sums, and the tests behind them.

    ``sums``: each pass's sums by name (:data:`~headlab.roles.registry.PASSES`; ``None`` or
    missing: the pass did not run); each registered role with a bar is scored by its probe
    from its pass's sums. ``offsets`` ``(Rel, 2)``: the baseline offsets the treebank pass
    counted with; ``present`` ``(L, H)``: the heads the model has (a pruned layer has fewer):
    the families of the multiple-comparison correction are made of them. ``copying``
    ``(L, H)``: each head's OV copying score (:mod:`headlab.roles.copying`; NaN where
    unknown), shown beside the induction score.
    """
    tb, gap = sums["treebank"], sums.get("gap")
    if tb is None:
        raise InputError("the roles need the treebank pass's sums")
    scores: dict[str, torch.Tensor] = {}
    with_bar = registry.scorers(sums)
    for scorer, pass_sums in {scorer: s for _, scorer, s in with_bar}.items():
        scores.update(scorer(pass_sums))  # a probe that feeds several roles runs once
    syn = syntactic.scores(tb, offsets)
    # with folds, a relation decides roles only when each fold has enough of its arcs
    decide_on = tb.fold_rows if tb.n_folds else slice(0, 1)
    choice = syntactic_choice(
        syn, relations, present, thresholds, decide_on=decide_on, bootstrap_rows=tb.bootstrap_rows
    )
    acc, base = choice["accuracy"], choice["baseline"]
    shape = acc.shape  # (R+1, L, H)
    scores["syntactic"] = acc
    scores["syntactic_relation"] = choice["best"]
    for key in ("p", "q", "hits", "count"):
        scores[f"syntactic_{key}"] = choice[key]
    score: dict[str, torch.Tensor] = {}
    baseline: dict[str, torch.Tensor] = {}
    bar: dict[str, torch.Tensor] = {}

    for role, _, _ in with_bar:  # a literature bar: the baseline too, but for a chance level
        score[role.name] = scores[role.name]
        bar[role.name] = torch.full(shape, thresholds.bar(role.name), dtype=torch.float64)
        baseline[role.name] = bar[role.name] if role.baseline is None else scores[role.baseline]
    score["syntactic"] = acc
    baseline["syntactic"] = base
    bar["syntactic"] = torch.where(choice["clears"], base + thresholds.syntactic_margin, torch.inf)
    if gap is not None and "coref.examples" in gap:
        coref = coreference.scores(gap)
        scores.update(coref)
        bases = torch.stack([coref[f"coref_{b}"] for b in coreference.BASELINES], -1)  # (R+1, 2)
        which = bases.nan_to_num(-1.0).argmax(-1)  # (R+1,)
        best_base = bases.gather(-1, which[:, None]).squeeze(-1)  # (R+1,)
        n = gap.get("coref.examples")  # (R+1,)
        both = gap.get("coref.both")  # (R+1, L, H, 2)
        index = which[:, None, None, None].expand(*both.shape[:-1], 1)
        both = both.gather(-1, index).squeeze(-1)  # (R+1, L, H)
        base_hits = (best_base.nan_to_num(0.0) * n)[:, None, None]
        c_family = present[None] & (n > 0)[:, None, None]
        c_p, c_q = _tested(
            gap.get("coref.hits"),
            both,
            base_hits,
            c_family,
            count=n[:, None, None],
            bootstrap_rows=gap.bootstrap_rows,
        )
        scores["coreference_p"], scores["coreference_q"] = c_p, c_q
        scores["coreference_against"] = which
        scores["coreference_hits"] = gap.get("coref.hits")
        scores["coreference_count"] = n[:, None, None].expand(shape)
        c_clears = c_q < thresholds.significance
        score["coreference"] = coref["coreference"]
        baseline["coreference"] = best_base[:, None, None].expand(shape)
        bar["coreference"] = torch.where(
            c_clears, baseline["coreference"] + thresholds.coreference_margin, torch.inf
        )
    if copying is not None:  # from the weights: the same in every row
        scores["copying"] = copying.to(torch.float64)[None].expand(shape).clone()
    return RoleEvidence(score=score, baseline=baseline, bar=bar), scores, syn


def _interval(
    hits: float, n: float, replicates: torch.Tensor | None = None
) -> tuple[list[float | None], float]:
    """The 95% Wilson interval over documents of ``hits / n`` (``replicates``: the share in
    each bootstrap resample of documents) and its design effect (:func:`stats.clustered_wilson`)."""
    reps = None if replicates is None else replicates.double().cpu().numpy()
    low, high, deff = stats.clustered_wilson(hits, n, reps)
    return [None if math.isnan(v) else v for v in (low, high)], deff


def _number(v: float) -> float | None:
    return None if math.isnan(v) else v


def _syntactic_proof(
    value: Any,
    syn: dict[str, torch.Tensor],
    at: tuple[int, int, int],
    names: tuple[str, str],
    score: float | None,
    baseline: float | None,
    bootstrap_rows: slice | torch.Tensor,
) -> dict[str, Any]:
    """A syntactic head's evidence: its relation x direction (``at``: layer, head, index
    ``relation * 2 + direction``), accuracy and baseline with intervals over documents, p, q."""
    layer, h, k = at
    hits, n = value("syntactic_hits") or 0.0, value("syntactic_count") or 0.0
    interval, deff = _interval(hits, n, syn["accuracy"][bootstrap_rows, layer, h, k // 2, k % 2])
    base_interval, _ = _interval(
        (baseline or 0.0) * n, n, syn["baseline"][bootstrap_rows, k // 2, k % 2]
    )
    return {
        "probe": "syntactic",
        "relation": names[0],
        "direction": names[1],
        "accuracy": score,
        "interval": interval,
        "design_effect": deff,
        "baseline": baseline,
        "baseline_interval": base_interval,
        "baseline_offset": int(syn["baseline_offset"][0, k // 2, k % 2]),
        "count": int(n),
        "p": value("syntactic_p"),
        "q": value("syntactic_q"),
    }


def _coreference_proof(
    value: Any,
    scores: dict[str, torch.Tensor],
    at: tuple[int, int],
    score: float | None,
    baseline: float | None,
    bootstrap_rows: slice | torch.Tensor,
) -> dict[str, Any]:
    """A coreference head's evidence on GAP, against the best baseline, with intervals."""
    layer, h = at
    hits, n = value("coreference_hits") or 0.0, value("coreference_count") or 0.0
    against = coreference.BASELINES[int(scores["coreference_against"][0])]
    interval, deff = _interval(hits, n, scores["coreference"][bootstrap_rows, layer, h])
    base_interval, _ = _interval(
        (baseline or 0.0) * n, n, scores[f"coref_{against}"][bootstrap_rows]
    )
    return {
        "probe": "coreference",
        "accuracy": score,
        "interval": interval,
        "design_effect": deff,
        "baseline": baseline,
        "baseline_interval": base_interval,
        "count": int(n),
        "p": value("coreference_p"),
        "q": value("coreference_q"),
    }


def head_role(
    layer: int,
    h: int,
    dominant: torch.Tensor,
    excess: torch.Tensor,
    evidence: RoleEvidence,
    scores: dict[str, torch.Tensor],
    relations: Sequence[str],
    *,
    fold_rows: slice,
    bootstrap_rows: slice | torch.Tensor,
    thresholds: Thresholds,
    syn: dict[str, torch.Tensor],
) -> HeadRole:
    """One head's result on the whole data (row 0), with its agreement across folds
    (``fold_rows`` of ``dominant``) and across bootstrap resamples (``bootstrap_rows``)."""
    measured = role_name(int(dominant[0, layer, h]))
    cleared = [(float(excess[i, layer, h]), r) for i, r in enumerate(ROLES)]
    # every role the head clears: the primary one first, then by how far each clears its bar
    passing = tuple(
        r
        for margin, r in sorted(cleared, key=lambda c: (c[1] == measured, c[0]), reverse=True)
        if math.isfinite(margin)
    )

    def share(rows: slice | torch.Tensor) -> float | None:
        same = dominant[rows, layer, h] == dominant[0, layer, h]
        return float(same.double().mean()) if same.numel() else None

    folds, boot = share(fold_rows), share(bootstrap_rows)
    stability = folds if folds is not None else boot
    stable = None if folds is None else folds >= thresholds.stable
    role = measured if stable is not False else UNCLASSIFIED

    def value(key: str) -> float | None:
        if key not in scores:
            return None
        v = float(scores[key][0, layer, h])
        return None if math.isnan(v) else v

    score = baseline = margin = None
    if measured in evidence.score:
        score = _number(float(evidence.score[measured][0, layer, h]))
        baseline = _number(float(evidence.baseline[measured][0, layer, h]))
        margin = None if score is None or baseline is None else score - baseline
    detail = ""
    proof: dict[str, Any] | None = None
    described = registry.get(measured)
    if measured == "syntactic":
        k = int(scores["syntactic_relation"][0, layer, h])
        relation, direction = relations[k // 2], syntactic.DIRECTIONS[k % 2]
        detail = f"{relation} {direction.replace('_', ' ')}"
        proof = _syntactic_proof(
            value, syn, (layer, h, k), (relation, direction), score, baseline, bootstrap_rows
        )
    elif measured == "coreference":
        proof = _coreference_proof(value, scores, (layer, h), score, baseline, bootstrap_rows)
    elif described is not None and described.detail is not None:
        detail = described.detail(value)
    if proof is None and measured in evidence.score:  # a literature bar, no baseline to test
        proof = {
            "probe": measured,
            "score": score,
            "bar": _number(float(evidence.bar[measured][0, layer, h])),
        }
        for key in () if described is None else described.proof:  # shown, not required
            if key in scores:
                proof[key] = value(key)
    if stable is False:
        detail = f"unstable: {measured} in {folds:.0%} of folds" + (
            f" ({detail})" if detail else ""
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
        scores={name: value(name) for name in registry.score_names() if name in scores},
        measured_role=measured,
        stable=stable,
        fold_agreement=folds,
        bootstrap_stability=boot,
        evidence=proof,
    )


def relation_rows(
    syn: dict[str, torch.Tensor],
    relations: Sequence[str],
    present: torch.Tensor,
    *,
    bootstrap_rows: slice | None = None,
) -> list[RelationRow]:
    """The best existing head (``present`` ``(L, H)``) of each relation and direction, with
    Wilson intervals over documents (from ``bootstrap_rows`` of ``syn``; none: plain Wilson),
    and the paired test against the baseline (``q``: only for relations of the a-priori set
    with enough arcs, the family the correction runs over)."""
    boot = bootstrap_rows if bootstrap_rows is not None else slice(0, 0)
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
            hits = float(syn["hits"][0, layer, h, r, d])
            base = float(syn["baseline"][0, r, d])
            p = float(syn["p"][0, layer, h, r, d])
            if math.isnan(p):  # outside the family: tested for the table, not corrected
                both = float(syn["both"][0, layer, h, r, d])
                b, c = hits - both, float(syn["baseline_hits"][0, r, d]) - both
                diffs = syn["accuracy"][boot, layer, h, r, d] - syn["baseline"][boot, r, d]
                deff = stats.paired_design_effect(b, c, count, diffs.numpy())
                p = float(stats.mcnemar_exact(b / deff, c / deff))
            rows.append(
                RelationRow(
                    relation=name,
                    direction=direction,
                    layer=layer,
                    head=h,
                    accuracy=float(per_head[layer, h]),
                    baseline=base,
                    baseline_offset=int(syn["baseline_offset"][0, r, d]),
                    count=count,
                    interval=(
                        interval := _interval(hits, count, syn["accuracy"][boot, layer, h, r, d])
                    )[0],
                    design_effect=interval[1],
                    baseline_interval=_interval(base * count, count, syn["baseline"][boot, r, d])[
                        0
                    ],
                    p=p,
                    q=_number(float(syn["q"][0, layer, h, r, d])),
                    in_set=name in syntactic.RELATION_SET,
                )
            )
    return rows
