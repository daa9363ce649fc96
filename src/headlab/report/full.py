"""What ``headlab report`` measures beside the roles, for the ledger of the lesson's claims: the
pruning curve, the cost of heads (``experiment cost --quick``) and one head versus many
(``--quick``); with ``--full`` the pruning curve on the whole STS-B sample.

Each stage is its own library's workflow; this module only runs them in turn on the model's
device and tells ``progress`` (:mod:`headlab.progress`) of each workflow's stages, their names
prefixed with the stage of the whole run (``stage 3/4, cost of heads: grid points``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.experiments.cost import CostOptions, run_cost
from headlab.experiments.one_vs_many import GridConfig, one_vs_many
from headlab.models.loading import LoadedModel
from headlab.progress import Prefixed, Progress
from headlab.pruning.workflow import PruneOptions, run_pruning

#: the stages after the roles, in order (the CLI counts the roles as stage 1)
STAGES = ("pruning curve", "cost of heads", "one head versus many")
#: STS-B pairs of the default report's quick pruning curve (a third score importance); the
#: whole 750-pair sample with ``--prune`` or ``--full``
QUICK_PRUNE_PAIRS = 300


def measure_extras(
    lm: LoadedModel,
    *,
    progress: Progress | None = None,
    first_stage: int = 2,
    total_stages: int = len(STAGES) + 1,
    prune_options: Any = None,
    quick: bool = False,
    given: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """``{"pruning", "cost", "experiment"}``: the JSON results of the three workflows (the
    pruning curve on STS-B for encoders; for a causal model only with ``prune_options``, a
    perplexity curve's :class:`~headlab.pruning.workflow.PruneOptions`, else ``None``).

    ``quick``: what the default ``headlab report`` measures so that the lesson's claims are
    filled (about 25 s on 2 cores): the encoder's pruning curve on the first
    :data:`QUICK_PRUNE_PAIRS` pairs of the STS-B sample (a decoder's perplexity curve only with
    ``prune_options``), cost and one-vs-many at their ``--quick`` sizes. ``given``: results the
    caller already has (``"pruning"``, ``"cost"``, ``"experiment"``), not measured again."""

    device = str(lm.device)

    def stage(i: int) -> Progress:
        return Prefixed(progress, f"stage {first_stage + i}/{total_stages}, {STAGES[i]}")

    pruning = None
    wanted = prune_options is not None or not lm.causal  # the STS-B sample, as prune --curve
    if wanted and "pruning" not in given:
        options = prune_options or PruneOptions(limit=QUICK_PRUNE_PAIRS if quick else None)
        pruning = run_pruning(lm, options, progress=stage(0)).to_json()
    # headlab experiment cost --quick, then headlab experiment one-vs-many --quick
    cost = None
    if "cost" not in given:
        cost = run_cost(CostOptions.quick(device=device), progress=stage(1)).to_json()
    experiment = None
    if "experiment" not in given:
        experiment = one_vs_many(GridConfig.quick(device=device), data=Path("."), progress=stage(2))
    return {"pruning": pruning, "cost": cost, "experiment": experiment}
