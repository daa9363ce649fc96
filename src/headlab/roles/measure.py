"""Measure every head's roles on gold data, in one streaming pass per data set.

Each layer's attention is computed by headlab in blocks of query rows during the model's own
forward pass (:mod:`headlab.models.streaming`; never eager attention, never a recomputation),
each probe adds up per-sentence sums from every block as it goes by
(:mod:`headlab.roles.passes`), and the bootstrap replicates ride along in the same pass
(:mod:`headlab.roles.bootstrap`). The sums become scores and roles in
:mod:`headlab.roles.scoring`; the results and their JSON are :mod:`headlab.roles.results`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from headlab import distributed
from headlab.datasets.gap import GapData
from headlab.datasets.treebank import TreebankData, TreebankSentence, word_frequencies
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.progress import Progress
from headlab.roles import stats
from headlab.roles.bootstrap import Sums
from headlab.roles.checkpoint import Checkpoint, Stage, fingerprint
from headlab.roles.copying import copying_scores
from headlab.roles.folds import assign_folds, resampling_unit
from headlab.roles.options import RoleOptions
from headlab.roles.passes import Cursor, gap_pass, treebank_pass
from headlab.roles.probes import coreference, syntactic
from headlab.roles.repeated import induction_pass
from headlab.roles.results import CoreferenceResult, HeadRole, RelationRow, RoleReport
from headlab.roles.scoring import evidence as score_evidence
from headlab.roles.scoring import head_role, relation_rows

__all__ = [
    "CoreferenceResult",
    "HeadRole",
    "RelationRow",
    "RoleOptions",
    "RoleReport",
    "measure_roles",
]


def measure_roles(
    lm: LoadedModel,
    treebank: Sequence[TreebankSentence] | TreebankData,
    *,
    gap: GapData | None = None,
    frequencies: Counter[str] | None = None,
    options: RoleOptions | None = None,
    checkpoint: Checkpoint | None = None,
    progress: Progress | None = None,
) -> RoleReport:
    """Score every head of ``lm`` for every role, classify it, and bootstrap the stability.

    Args:
        lm: the model.
        treebank: gold sentences (positional, delimiter, broad, rare-token, syntactic probes);
            a :class:`~headlab.datasets.treebank.TreebankData` also brings the counts of the
            sentences its reader left out (not one tree), which join the report's skips.
        gap: GAP examples (coreference probe); ``None`` skips it.
        frequencies: word counts for the rare-token probe (default: the treebank's own).
        options: replicates, seed, batch size, thresholds.
        checkpoint: save the sums so far every few batches, and resume from the sums its file
            holds (:mod:`headlab.roles.checkpoint`).
        progress: told of each pass over the data (``treebank``, ``GAP``, ``induction``) as
            its batches go by (:mod:`headlab.progress`; default: nothing).

    Under ``torchrun`` (an initialized :mod:`torch.distributed` process group) each rank runs
    its share of the batches and the sums are added up over the ranks
    (:mod:`headlab.distributed`): every rank returns the same report.
    """

    read_skipped: dict[str, int] = {}
    if isinstance(treebank, TreebankData):
        read_skipped = {k: n for k, n in treebank.skipped.items() if n}
        treebank = treebank.sentences
    options = options or RoleOptions()
    _check(treebank, options)
    freq = frequencies if frequencies is not None else word_frequencies(treebank)
    plan = _plan(lm, treebank, gap, options)
    skipped = _run_passes(lm, plan, treebank, gap, freq, options, checkpoint, progress)
    counts = tuple(lm.layout.heads_per_layer)  # a model pruned layer by layer has fewer in some
    present = torch.arange(lm.n_heads)[None, :] < torch.tensor(counts)[:, None]  # (L, H)
    heads, scores, syn = _classify(lm, plan, options, present)
    used = len(treebank) - sum(skipped["treebank"].values())
    data: dict[str, Any] = {
        "device": str(lm.device),
        "dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch."),
        "treebank": {
            "sentences": len(treebank) + sum(read_skipped.values()),
            "used": used,
            "skipped": {**skipped["treebank"], **read_skipped},
            "resampled": _unit(options.replicates, plan.units["the treebank"], "sentences"),
        },
    }
    coref_result = None
    if gap is not None and plan.gap is not None:
        data["gap"], coref_result = _coreference(
            lm, gap, plan.gap.sums, scores, present, skipped["gap"], options, plan.units
        )
    return RoleReport(
        model=lm.name,
        n_layers=lm.n_layers,
        n_heads=lm.n_heads,
        heads_in_layer=counts,
        heads=heads,
        relations=relation_rows(
            syn, plan.relations, present, bootstrap_rows=plan.treebank.sums.bootstrap_rows
        ),
        coreference=coref_result,
        data=data,
        thresholds=options.thresholds,
        replicates=options.replicates,
        folds=options.reliability,
    )


def _check(treebank: Sequence[TreebankSentence], options: RoleOptions) -> None:
    """Stage 0: refuse options and data no run can use."""
    if options.replicates < 0:
        raise InputError(f"replicates must be 0 or more, got {options.replicates}")
    if not treebank:
        raise InputError("the treebank has no sentences")
    if options.reliability == 1 or options.reliability < 0:
        raise InputError(
            f"reliability must be 0 (off) or at least 2 folds, got {options.reliability}"
        )


@dataclass
class _Plan:
    """What the passes fill: a stage (sums, folds, resampling unit) per data set, the
    relations and the syntactic baseline's offsets."""

    relations: list[str]
    offsets: Any
    treebank: Stage
    gap: Stage | None
    induction: Stage | None
    units: dict[str, str]
    part: tuple[int, int]

    @property
    def stages(self) -> list[Stage]:
        return [s for s in (self.treebank, self.gap, self.induction) if s is not None]


def _plan(
    lm: LoadedModel,
    treebank: Sequence[TreebankSentence],
    gap: GapData | None,
    options: RoleOptions,
) -> _Plan:
    """Stage 1: the relations, the baseline's offsets, and each data set's sums."""
    relations = sorted({r for s in treebank for r in s.relations} - {"root"})
    rel_id = {r: i for i, r in enumerate(relations)}
    # the baseline's offsets: chosen once, on all gold trees, for every fold and resample
    offsets = syntactic.best_offsets(
        [s.heads for s in treebank],
        [[rel_id.get(r, -1) for r in s.relations] for s in treebank],
        len(relations),
        causal=lm.causal,
    )
    k = options.reliability
    units: dict[str, str] = {}

    def sums(n: int, seed: int, documents: Sequence[str] | None, what: str) -> Sums:
        folds = assign_folds(documents, k, what) if k and documents is not None else None
        if k and folds is None:  # no documents (random induction sequences): round robin
            folds = [i % k for i in range(n)]
        # the statistics run where the model is; each corpus's sums come to the CPU once
        # the bootstrap resamples documents (all of a document's items together) when there
        # are enough of them to stand for others, else items
        units[what] = resampling_unit(documents)
        return Sums(
            n,
            options.replicates,
            seed,
            device=lm.device,
            folds=folds,
            n_folds=k,
            clusters=documents if units[what] == "documents" else None,
        )

    tb_docs = [s.doc_id or s.sent_id for s in treebank]
    tb = Stage("treebank", sums(len(treebank), options.seed, tb_docs, "the treebank"))
    gap_stage: Stage | None = None
    ind: Stage | None = None
    if gap is not None:
        gap_docs = [e.source or e.id for e in gap.examples]
        gap_stage = Stage(
            "gap", sums(len(gap.examples), options.seed + 1, gap_docs, "the GAP file")
        )
    if lm.causal:
        ind = Stage(
            "induction", sums(options.induction_sequences, options.seed + 2, None, "induction")
        )
    return _Plan(
        relations=relations,
        offsets=offsets,
        treebank=tb,
        gap=gap_stage,
        induction=ind,
        units=units,
        part=distributed.part(),
    )


def _run_passes(
    lm: LoadedModel,
    plan: _Plan,
    treebank: Sequence[TreebankSentence],
    gap: GapData | None,
    freq: Counter[str],
    options: RoleOptions,
    checkpoint: Checkpoint | None,
    progress: Progress | None,
) -> dict[str, dict[str, int]]:
    """Stage 2: one streaming pass per data set (resumed from ``checkpoint``), the sums added up
    over the ranks and brought to the CPU; the items each pass skipped, by reason."""
    part = plan.part
    if checkpoint is not None:
        checkpoint.open(fingerprint(lm, treebank, gap, freq, options, part), part)
        for stage in plan.stages:
            checkpoint.begin(stage)

    def cursor(stage: Stage) -> Cursor:
        after = None if checkpoint is None else checkpoint.after_batch(stage)
        return Cursor(part=part, skip=stage.done, after_batch=after)

    tb, gap_stage, ind = plan.treebank, plan.gap, plan.induction
    gap_skipped: dict[str, int] = {}
    with distributed.failures("the role statistics"):
        tb_skipped = treebank_pass(
            lm, treebank, freq, plan.relations, tb.sums, options, cursor(tb), plan.offsets,
            progress,
        )  # fmt: skip
        if gap is not None and gap_stage is not None:
            gap_skipped = gap_pass(
                lm,
                gap,
                gap_stage.sums,
                options,
                cursor(gap_stage),
                counts=gap_stage.counts,
                progress=progress,
            )
        if ind is not None:
            induction_pass(lm, ind.sums, options, cursor(ind), progress)
    distributed.reduce_sums(*(s.sums for s in plan.stages))
    if gap_stage is not None:
        gap_skipped = dict(Counter(gap_skipped) + distributed.reduce_counts(gap_stage.counts))
    for stage in plan.stages:
        stage.sums.cpu()
    if "queries" not in tb.sums:
        raise InputError("no treebank sentence could be aligned to the model's tokens")
    return {"treebank": tb_skipped, "gap": gap_skipped}


def _classify(
    lm: LoadedModel, plan: _Plan, options: RoleOptions, present: torch.Tensor
) -> tuple[list[HeadRole], dict[str, torch.Tensor], Any]:
    """Stage 3: the sums become scores and evidence, and each head its role (with its folds'
    and resamples' agreement)."""
    tb = plan.treebank
    gap_sums = None if plan.gap is None else plan.gap.sums
    copying = None
    if lm.causal:  # Olsson et al.'s OV eigenvalue score, from the weights
        copying = copying_scores(lm)
    evidence, scores, syn = score_evidence(
        {stage.name: stage.sums for stage in plan.stages},
        options.thresholds,
        offsets=plan.offsets,
        relations=plan.relations,
        present=present,
        copying=copying,
    )
    # resamples that drew no sentence (or no GAP row) say nothing; they are left out of the
    # bootstrap share rather than counted as disagreeing
    queries = tb.sums.get("queries")  # (1 + K + R,)
    boot = torch.arange(queries.shape[0])[tb.sums.bootstrap_rows]
    drawn = queries[boot] > 0
    if gap_sums is not None and "coref.examples" in gap_sums:
        drawn &= gap_sums.get("coref.examples")[boot] > 0
    dominant = evidence.dominant()  # (1 + K + R, L, H)
    excess = evidence.excess()[:, 0]  # (roles, L, H)
    heads = []
    ids = lm.head_ids()  # a pruned folder's heads keep their unpruned ids
    for layer in range(lm.n_layers):
        for h in range(lm.layout.heads_per_layer[layer]):
            role = head_role(
                layer,
                h,
                dominant,
                excess,
                evidence,
                scores,
                plan.relations,
                fold_rows=tb.sums.fold_rows,
                bootstrap_rows=boot[drawn],
                thresholds=options.thresholds,
                syn=syn,
            )
            heads.append(replace(role, original_head=ids[layer][h]))
    return heads, scores, syn


def _coreference(
    lm: LoadedModel,
    gap: GapData,
    gap_sums: Sums,
    scores: dict[str, torch.Tensor],
    present: torch.Tensor,
    gap_skipped: dict[str, int],
    options: RoleOptions,
    units: dict[str, str],
) -> tuple[dict[str, Any], CoreferenceResult | None]:
    """Stage 4: GAP's rows in the report's data, and the best coreference head with its
    Wilson interval over GAP's source pages."""
    n_used = int(gap_sums.get("coref.examples")[0]) if "coref.examples" in gap_sums else 0
    data = {
        "rows": len(gap.examples) + sum(gap.skipped.values()),
        "used": n_used,
        "skipped": {**gap_skipped, **{k: n for k, n in gap.skipped.items() if n}},
        "resampled": _unit(options.replicates, units["the GAP file"], "rows"),
    }
    if not n_used:
        return data, None
    acc = scores["coreference"][0].masked_fill(~present, torch.nan)  # (L, H)
    flat = int(acc.nan_to_num(-1).argmax())
    layer, h = divmod(flat, lm.n_heads)
    against = coreference.BASELINES[int(scores["coreference_against"][0])]
    base = float(scores[f"coref_{against}"][0])
    gap_boot = gap_sums.bootstrap_rows  # Wilson intervals over GAP's source pages
    hits = float(scores["coreference_hits"][0, layer, h])
    interval, deff = _wilson(hits, n_used, scores["coreference"][gap_boot, layer, h])
    base_interval = _wilson(base * n_used, n_used, scores[f"coref_{against}"][gap_boot])[0]
    return data, CoreferenceResult(
        layer=layer,
        head=h,
        accuracy=float(acc[layer, h]),
        count=n_used,
        baselines={name: float(scores[f"coref_{name}"][0]) for name in coreference.BASELINES},
        interval=interval,
        design_effect=deff,
        baseline=against,
        baseline_interval=base_interval,
        p=float(scores["coreference_p"][0, layer, h]),
        q=float(scores["coreference_q"][0, layer, h]),
    )


def _unit(replicates: int, unit: str, items: str) -> str | None:
    """What the bootstrap resampled, for the report's data: documents, ``items``, or nothing."""
    if not replicates:
        return None
    return "documents" if unit == "documents" else items


def _wilson(hits: float, n: float, replicates: torch.Tensor) -> tuple[list[float | None], float]:
    """Wilson interval over documents (``replicates``: the share in each bootstrap resample)."""
    low, high, deff = stats.clustered_wilson(hits, n, replicates.double().numpy())
    return [low, high], deff
