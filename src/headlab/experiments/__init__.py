"""Measured experiments: what heads cost at a fixed width (:mod:`~headlab.experiments.cost`), and
one head against many, trained on tasks that need several (:mod:`~headlab.experiments.one_vs_many`)."""

from __future__ import annotations

from headlab.experiments.cost import CostOptions, CostResult, loop_over_heads, run_cost
from headlab.experiments.one_vs_many import GridConfig, one_vs_many

__all__ = [
    "CostOptions",
    "CostResult",
    "GridConfig",
    "loop_over_heads",
    "one_vs_many",
    "run_cost",
]
