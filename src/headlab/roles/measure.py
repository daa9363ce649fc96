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

from headlab.datasets.gap import GapData
from headlab.datasets.treebank import TreebankData, TreebankSentence
from headlab.errors import InputError
from headlab.models.loading import LoadedModel
from headlab.progress import Progress
from headlab.roles.bootstrap import Sums
from headlab.roles.options import RoleOptions
from headlab.roles.passes import gap_pass, induction_pass, treebank_pass
from headlab.roles.probes import coreference
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
        progress: told of each pass over the data (``treebank``, ``GAP``, ``induction``) as
            its batches go by (:mod:`headlab.progress`; default: nothing).
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
    freq = frequencies if frequencies is not None else word_frequencies(treebank)
    relations = sorted({r for s in treebank for r in s.relations} - {"root"})
    # the statistics run where the model is; each corpus's sums come to the CPU once
    device = lm.device
    tb = Sums(len(treebank), options.replicates, options.seed, device=device)
    tb_skipped = treebank_pass(lm, treebank, freq, relations, tb, options, progress)
    tb.cpu()
    if "queries" not in tb:
        raise InputError("no treebank sentence could be aligned to the model's tokens")
    gap_sums = None
    gap_skipped: dict[str, int] = {}
    if gap is not None:
        gap_sums = Sums(len(gap.examples), options.replicates, options.seed + 1, device=device)
        gap_skipped = gap_pass(lm, gap, gap_sums, options, progress)
        gap_sums.cpu()
    ind = None
    if lm.causal:
        ind = Sums(options.induction_sequences, options.replicates, options.seed + 2, device=device)
        induction_pass(lm, ind, options, progress)
        ind.cpu()
    evidence, scores, syn = score_evidence(tb, gap_sums, ind, options.thresholds)
    dominant = evidence.dominant()  # (R+1, L, H)
    excess = evidence.excess()[:, 0]  # (roles, L, H)
    counts = tuple(lm.layout.heads_per_layer)  # a model pruned layer by layer has fewer in some
    present = torch.arange(lm.n_heads)[None, :] < torch.tensor(counts)[:, None]  # (L, H)
    heads = []
    ids = lm.head_ids()  # a pruned folder's heads keep their unpruned ids
    for layer in range(lm.n_layers):
        for h in range(counts[layer]):
            role = head_role(
                layer, h, dominant, excess, evidence, scores, relations, options.replicates
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
        },
    }
    coref_result = None
    if gap is not None and gap_sums is not None:
        n_used = int(gap_sums.get("coref.examples")[0]) if "coref.examples" in gap_sums else 0
        data["gap"] = {
            "rows": len(gap.examples) + sum(gap.skipped.values()),
            "used": n_used,
            "skipped": {**gap_skipped, **{k: n for k, n in gap.skipped.items() if n}},
        }
        if n_used:
            acc = scores["coreference"][0].masked_fill(~present, torch.nan)  # (L, H)
            flat = int(acc.nan_to_num(-1).argmax())
            layer, h = divmod(flat, lm.n_heads)
            coref_result = CoreferenceResult(
                layer=layer,
                head=h,
                accuracy=float(acc[layer, h]),
                count=n_used,
                baselines={
                    name: float(scores[f"coref_{name}"][0]) for name in coreference.BASELINES
                },
            )
    return RoleReport(
        model=lm.name,
        n_layers=lm.n_layers,
        n_heads=lm.n_heads,
        heads_in_layer=counts,
        heads=heads,
        relations=relation_rows(syn, relations, present),
        coreference=coref_result,
        data=data,
        thresholds=options.thresholds,
        replicates=options.replicates,
    )
