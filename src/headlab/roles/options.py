"""How role statistics are measured: :class:`RoleOptions`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headlab.roles.classify import Thresholds


@dataclass(frozen=True, kw_only=True)
class RoleOptions:
    """How to measure.

    Attributes:
        replicates: bootstrap resamples (0: none).
        reliability: folds of documents to assign roles on as well (0: none; else at least 2).
            With folds, a head's stability is the share of folds that give it its role, and a
            head below ``thresholds.stable`` is reported unclassified (see docs/roles.md).
        seed: seed of the bootstrap weights and the induction sequences.
        batch_tokens: padded tokens per forward pass.
        induction_sequences: random repeated sequences for the induction probe (causal models).
        induction_length: length of each random half.
        thresholds: the bars of each role.
        block_elements: attention is computed in blocks of query rows of about this many
            weights (``B x H x rows x S``), so no full ``T x S`` pattern of a long input exists.
        dtype: precision of ``q k^T`` (``torch.bfloat16`` is faster on CPUs with AMX; the
            softmax and the statistics stay in float32); ``None``: the model's.
    """

    replicates: int = 100
    reliability: int = 0
    seed: int = 0
    batch_tokens: int = 4096
    induction_sequences: int = 32
    induction_length: int = 48
    thresholds: Thresholds = field(default_factory=Thresholds)
    block_elements: int = 1 << 20
    dtype: torch.dtype | None = None
