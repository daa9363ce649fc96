"""What ``headlab report --full`` measures beside the roles, for the ledger: the pruning curve,
the cost of heads (``experiment cost --quick``) and one head versus many (``--quick``).

Each stage is its own library's workflow; this module only runs them in turn on the model's
device and says which stage is running through ``progress`` (one line per stage).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from headlab.models.loading import LoadedModel

#: the stages after the roles, in order (the CLI counts the roles as stage 1)
STAGES = ("pruning curve", "cost of heads", "one head versus many")


def measure_extras(
    lm: LoadedModel,
    *,
    progress: Callable[[str], None] | None = None,
    first_stage: int = 2,
    total_stages: int = len(STAGES) + 1,
) -> dict[str, Any]:
    """``{"pruning", "cost", "experiment"}``: the JSON results of the three workflows (the
    pruning curve only for encoders: it is measured on STS-B; ``None`` for causal models)."""
    from headlab.experiments.cost import CostOptions, run_cost
    from headlab.pruning.workflow import PruneOptions, run_pruning
    from headlab.training.experiment import GridConfig, one_vs_many

    say = progress or (lambda line: None)
    device = str(lm.device)

    def stage(i: int, what: str) -> None:
        say(f"stage {first_stage + i}/{total_stages}: {what}")

    stage(0, f"{STAGES[0]} (STS-B sample, headlab prune --curve)")
    pruning = None if lm.causal else run_pruning(lm, PruneOptions()).to_json()
    stage(1, f"{STAGES[1]} (headlab experiment cost --quick)")
    cost = run_cost(CostOptions.quick(device=device)).to_json()
    stage(2, f"{STAGES[2]} (headlab experiment one-vs-many --quick)")
    experiment = one_vs_many(GridConfig.quick(device=device), data=Path("."))
    return {"pruning": pruning, "cost": cost, "experiment": experiment}
