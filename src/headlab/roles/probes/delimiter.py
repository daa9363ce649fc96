"""Delimiter heads and sink heads: where the mass that is not spread over words goes.

Two measures from one product of the attention with four columns, averaged over real,
non-special query tokens after the first position (whose row, in a decoder, sees only itself):

- **sink**: the mean attention mass on the *attention sink*, the tokens a head parks what it
  does not use: [CLS], [SEP], BOS, EOS and the first position (a decoder without a BOS sinks
  on its first token: Xiao et al. 2023). Clark et al. (2019, section 3.2) found that more than
  half of BERT-base's attention in layers 6-10 goes to [SEP] and read it as a no-op; the sink is
  kept apart from what a head does with the rest.
- **delimiter**: the mean attention mass on punctuation in the text (periods, commas, quotes,
  brackets), the first position left out (it is the sink). Clark et al. count attention to
  periods and commas as its own category beside [SEP].
"""

from __future__ import annotations

import torch

from headlab.roles.bootstrap import Sums, ratio
from headlab.roles.geometry import Geometry

#: the columns :func:`columns` gives, in order: the sink's three parts, then punctuation
PARTS = ("cls", "sep", "first", "punct")
#: the parts that make up the sink
SINK_PARTS = ("cls", "sep", "first")
N_COLUMNS = len(PARTS)


def columns(geo: Geometry) -> torch.Tensor:
    """``(B, T, 4)``: 1.0 on the [CLS] token, on other special tokens, on the first position
    when it is not special (a decoder's sink without a BOS), and on punctuation after it."""
    first = torch.zeros_like(geo.punct)
    first[:, 0] = 1.0 - geo.cls[:, 0] - geo.sep[:, 0]  # (B, T): 1 where position 0 is a word
    punct = geo.punct.clone()
    punct[:, 0] = 0.0
    return torch.stack([geo.cls, geo.sep, first, punct], dim=-1)


def rows(geo: Geometry) -> torch.Tensor:
    """``(B, T)`` bool: the query rows the two measures average over (real, non-special, not
    the first position)."""
    query = geo.query.clone()
    query[:, 0] = False
    return query


def collect(
    pattern: torch.Tensor, geo: Geometry, start: int = 0, *, mass: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """pattern rows ``(B, H, t, T)`` -> mass sums ``(B, H)`` on each of :data:`PARTS`.

    ``mass`` ``(B, H, t, 4)``: each row's weight on :func:`columns`, when the caller has it
    (the attention's product with its values can carry it)."""
    query = rows(geo)[:, None, start : start + pattern.shape[2]].float()  # (B, 1, t)
    if mass is None:
        mass = pattern @ columns(geo)[:, None, : pattern.shape[-1]]  # (B, H, t, 4)
    total = (mass * query[..., None]).sum(2)  # (B, H, 4)
    return {f"delimiter.{name}": total[..., i] for i, name in enumerate(PARTS)}


def count(geo: Geometry) -> torch.Tensor:
    """``(B,)`` the query rows of each sentence, summed as ``delimiter.queries``."""
    return rows(geo).sum(1).float()


def scores(sums: Sums) -> dict[str, torch.Tensor]:
    """``(R+1, L, H)``: ``sink`` (its parts together) with ``cls``, ``sep``, ``first``, and
    ``delimiter`` (punctuation), each a mean share of the rows' attention."""
    queries = sums.get("delimiter.queries")[:, None, None]
    parts = {name: ratio(sums.get(f"delimiter.{name}"), queries) for name in PARTS}
    sink = sum((parts[name] for name in SINK_PARTS), torch.zeros_like(parts["punct"]))
    return {
        "sink": sink,
        "delimiter": parts["punct"],
        "cls": parts["cls"],
        "sep": parts["sep"],
        "first": parts["first"],
        "punct": parts["punct"],
    }
