"""Measured experiments that combine analyses.

- :mod:`~headlab.experiments.cost` (and ``cost_request``, ``cost_text``, ``cost_figure``,
  ``peak``): what heads cost at a fixed width, in time and peak memory (``headlab experiment
  cost``: its request, tables and figure).
- :mod:`~headlab.experiments.one_vs_many`: one head against many, trained on tasks that need
  several (:mod:`~headlab.experiments.induction`: the induction toy).
- :mod:`~headlab.experiments.circuit_request` (and ``circuit``, ``head_classes``): a
  behaviour's circuit found and measured, its heads named from evidence (``headlab circuit``).
- :mod:`~headlab.experiments.agreement`: roles checked against patching.
- :mod:`~headlab.experiments.cards` (and ``card_parts``, ``card_verdict``): one card per head
  joining its roles, composition, OV circuit, patching, DLA, cost and importance, with a
  verdict (``headlab cards``).
- :mod:`~headlab.experiments.kv` (and ``kv_scores``, ``kv_measure``): which KV heads need the
  whole context, and the smaller cache the others allow (``headlab kv``).
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.experiments.circuit_request import CircuitRequest as CircuitRequest
    from headlab.experiments.cost import CostOptions as CostOptions
    from headlab.experiments.cost import CostResult as CostResult
    from headlab.experiments.cost import loop_over_heads as loop_over_heads
    from headlab.experiments.cost import run_cost as run_cost
    from headlab.experiments.cost_request import CostRequest as CostRequest
    from headlab.experiments.kv import KVRequest as KVRequest
    from headlab.experiments.kv import KVResult as KVResult
    from headlab.experiments.one_vs_many import GridConfig as GridConfig

__getattr__, __dir__, __all__ = attach(__name__, __file__)
