"""What ``headlab report --full`` measures beside the roles, for the ledger: the pruning curve,
the cost of heads (``experiment cost --quick``) and one head versus many (``--quick``).

Each stage is its own library's workflow; this module only runs them in turn on the model's
device and tells ``progress`` (:mod:`headlab.progress`) of each workflow's stages, their names
prefixed with the stage of the whole run (``stage 3/4, cost of heads: grid points``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.models.loading import LoadedModel
from headlab.progress import Prefixed, Progress

#: the stages after the roles, in order (the CLI counts the roles as stage 1)
STAGES = ("pruning curve", "cost of heads", "one head versus many")


def measure_extras(
    lm: LoadedModel,
    *,
    progress: Progress | None = None,
    first_stage: int = 2,
    total_stages: int = len(STAGES) + 1,
    prune_options: Any = None,
) -> dict[str, Any]:
    """``{"pruning", "cost", "experiment"}``: the JSON results of the three workflows (the
    pruning curve on STS-B for encoders; for a causal model only with ``prune_options``, a
    perplexity curve's :class:`~headlab.pruning.workflow.PruneOptions`, else ``None``)."""
    from headlab.experiments.cost import CostOptions, run_cost
    from headlab.experiments.one_vs_many import GridConfig, one_vs_many
    from headlab.pruning.workflow import PruneOptions, run_pruning

    device = str(lm.device)

    def stage(i: int) -> Progress:
        return Prefixed(progress, f"stage {first_stage + i}/{total_stages}, {STAGES[i]}")

    pruning = None
    if prune_options is not None or not lm.causal:  # the STS-B sample, as headlab prune --curve
        pruning = run_pruning(lm, prune_options or PruneOptions(), progress=stage(0)).to_json()
    # headlab experiment cost --quick, then headlab experiment one-vs-many --quick
    cost = run_cost(CostOptions.quick(device=device), progress=stage(1)).to_json()
    experiment = one_vs_many(GridConfig.quick(device=device), data=Path("."), progress=stage(2))
    return {"pruning": pruning, "cost": cost, "experiment": experiment}
