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
from dataclasses import replace
from typing import Any

import torch

from headlab import distributed
from headlab.datasets.gap import GapData
from headlab.datasets.treebank import TreebankData, TreebankSentence
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.progress import Progress
from headlab.roles import stats
from headlab.roles.bootstrap import Sums
from headlab.roles.checkpoint import Checkpoint, Stage, fingerprint
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
    from headlab.datasets.treebank import word_frequencies

    read_skipped: dict[str, int] = {}
    if isinstance(treebank, TreebankData):
        read_skipped = {k: n for k, n in treebank.skipped.items() if n}
        treebank = treebank.sentences

    options = options or RoleOptions()
    if options.replicates < 0:
        raise InputError(f"replicates must be 0 or more, got {options.replicates}")
    if not treebank:
        raise InputError("the treebank has no sentences")
    if options.reliability == 1 or options.reliability < 0:
        raise InputError(
            f"reliability must be 0 (off) or at least 2 folds, got {options.reliability}"
        )
    freq = frequencies if frequencies is not None else word_frequencies(treebank)
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

    part = distributed.part()
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
    stages = [s for s in (tb, gap_stage, ind) if s is not None]
    if checkpoint is not None:
        checkpoint.open(fingerprint(lm, treebank, gap, freq, options, part), part)
        for stage in stages:
            checkpoint.begin(stage)

    def cursor(stage: Stage) -> Cursor:
        after = None if checkpoint is None else checkpoint.after_batch(stage)
        return Cursor(part=part, skip=stage.done, after_batch=after)

    gap_skipped: dict[str, int] = {}
    with distributed.failures("the role statistics"):
        tb_skipped = treebank_pass(
            lm, treebank, freq, relations, tb.sums, options, cursor(tb), offsets, progress
        )
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
    distributed.reduce_sums(*(s.sums for s in stages))
    if gap_stage is not None:
        gap_skipped = dict(Counter(gap_skipped) + distributed.reduce_counts(gap_stage.counts))
    for stage in stages:
        stage.sums.cpu()
    if "queries" not in tb.sums:
        raise InputError("no treebank sentence could be aligned to the model's tokens")
    counts = tuple(lm.layout.heads_per_layer)  # a model pruned layer by layer has fewer in some
    present = torch.arange(lm.n_heads)[None, :] < torch.tensor(counts)[:, None]  # (L, H)
    gap_sums = None if gap_stage is None else gap_stage.sums
    copying = None
    if lm.causal:  # Olsson et al.'s OV eigenvalue score, from the weights
        from headlab.roles.copying import copying_scores

        copying = copying_scores(lm)
    evidence, scores, syn = score_evidence(
        tb.sums,
        gap_sums,
        None if ind is None else ind.sums,
        options.thresholds,
        offsets=offsets,
        relations=relations,
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
        for h in range(counts[layer]):
            role = head_role(
                layer,
                h,
                dominant,
                excess,
                evidence,
                scores,
                relations,
                fold_rows=tb.sums.fold_rows,
                bootstrap_rows=boot[drawn],
                thresholds=options.thresholds,
                syn=syn,
            )
            heads.append(replace(role, original_head=ids[layer][h]))
    used = len(treebank) - sum(tb_skipped.values())
    data: dict[str, Any] = {
        "device": str(lm.device),
        "dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch."),
        "treebank": {
            "sentences": len(treebank) + sum(read_skipped.values()),
            "used": used,
            "skipped": {**tb_skipped, **read_skipped},
            "resampled": _unit(options.replicates, units["the treebank"], "sentences"),
        },
    }
    coref_result = None
    if gap is not None and gap_sums is not None:
        n_used = int(gap_sums.get("coref.examples")[0]) if "coref.examples" in gap_sums else 0
        data["gap"] = {
            "rows": len(gap.examples) + sum(gap.skipped.values()),
            "used": n_used,
            "skipped": {**gap_skipped, **{k: n for k, n in gap.skipped.items() if n}},
            "resampled": _unit(options.replicates, units["the GAP file"], "rows"),
        }
        if n_used:
            acc = scores["coreference"][0].masked_fill(~present, torch.nan)  # (L, H)
            flat = int(acc.nan_to_num(-1).argmax())
            layer, h = divmod(flat, lm.n_heads)
            against = coreference.BASELINES[int(scores["coreference_against"][0])]
            base = float(scores[f"coref_{against}"][0])
            gap_boot = gap_sums.bootstrap_rows  # Wilson intervals over GAP's source pages
            hits = float(scores["coreference_hits"][0, layer, h])
            interval, deff = _wilson(hits, n_used, scores["coreference"][gap_boot, layer, h])
            base_interval = _wilson(base * n_used, n_used, scores[f"coref_{against}"][gap_boot])[0]
            coref_result = CoreferenceResult(
                layer=layer,
                head=h,
                accuracy=float(acc[layer, h]),
                count=n_used,
                baselines={
                    name: float(scores[f"coref_{name}"][0]) for name in coreference.BASELINES
                },
                interval=interval,
                design_effect=deff,
                baseline=against,
                baseline_interval=base_interval,
                p=float(scores["coreference_p"][0, layer, h]),
                q=float(scores["coreference_q"][0, layer, h]),
            )
    return RoleReport(
        model=lm.name,
        n_layers=lm.n_layers,
        n_heads=lm.n_heads,
        heads_in_layer=counts,
        heads=heads,
        relations=relation_rows(syn, relations, present, bootstrap_rows=tb.sums.bootstrap_rows),
        coreference=coref_result,
        data=data,
        thresholds=options.thresholds,
        replicates=options.replicates,
        folds=k,
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
