"""Measured experiments on attention itself (not on trained models): what heads cost."""

from __future__ import annotations

from headlab.experiments.cost import CostOptions, CostResult, loop_over_heads, run_cost

__all__ = ["CostOptions", "CostResult", "loop_over_heads", "run_cost"]
