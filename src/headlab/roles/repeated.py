"""The induction pass: repeated random token sequences through a causal model, whose captured
patterns give the induction, previous-token and duplicate-token weights
(:mod:`headlab.roles.probes.induction`). Random tokens carry no grammar, so only copying and
position can score; the treebank and GAP passes are :mod:`headlab.roles.passes`.
"""

from __future__ import annotations

import torch

from headlab.errors import TooLongError
from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel
from headlab.progress import Progress, stage
from headlab.roles import registry
from headlab.roles.bootstrap import Sums
from headlab.roles.options import RoleOptions
from headlab.roles.passes import Cursor
from headlab.roles.probes import induction


def induction_pass(
    lm: LoadedModel,
    sums: Sums,
    options: RoleOptions,
    cursor: Cursor | None = None,
    progress: Progress | None = None,
) -> None:
    """Add the repeated random sequences' sums into ``sums``: each registered role's probe
    fed by this pass (:attr:`~headlab.roles.registry.Role.collect`; today
    :mod:`~headlab.roles.probes.induction`: the induction, previous-token and duplicate-token
    weights)."""

    cursor = cursor or Cursor()
    probes = registry.collectors("induction")  # every role's this pass feeds, each once

    ids, start = induction.sequences(
        lm.tokenizer, options.induction_sequences, options.induction_length, options.seed
    )
    limit = lm.max_positions
    if limit is not None and ids.shape[1] > limit:
        raise TooLongError(
            f"induction sequences of {ids.shape[1]} tokens exceed the model's {limit} positions"
        )
    per_batch = max(1, options.batch_tokens // ids.shape[1])
    rank, world = cursor.part
    starts = range(0, ids.shape[0], per_batch)[rank::world][cursor.skip :]
    total = sum(min(per_batch, ids.shape[0] - lo) for lo in starts)
    with stage(progress, "induction", total, "sequences") as report:
        for lo in starts:
            chunk = ids[lo : lo + per_batch].to(lm.device)
            items = list(range(lo, lo + chunk.shape[0]))
            with torch.inference_mode(), HeadCapture(lm, record_head_outputs=False) as cap:
                lm.model(input_ids=chunk, attention_mask=torch.ones_like(chunk))
            sums.add("induction.n", items, torch.ones(len(items)))
            for layer in range(lm.n_layers):
                pattern = cap.pattern(layer)  # (B, H, T, T)
                for collect in probes:
                    for key, value in collect(pattern, options.induction_length, start).items():
                        sums.add_layer(
                            f"{key}.sum", layer, lm.n_layers, items, value, n_heads=lm.n_heads
                        )
            if cursor.after_batch is not None:
                cursor.after_batch()
            report.advance(len(items))
