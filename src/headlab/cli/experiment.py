"""``headlab experiment one-vs-many``: the lesson's central claim, measured; ``cost`` in
:mod:`headlab.cli.experiment_cost`."""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli import experiment_cost
from headlab.cli._args import text
from headlab.cli._model import model_device
from headlab.cli._output import emit_json, show
from headlab.cli._progress import progress_for
from headlab.errors import InputError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "experiment",
        help="reproducible experiments (one-vs-many: one head against several; cost: what "
        "heads cost)",
        description=(
            "one-vs-many: at the same width and parameter count, models with 1, 2, 4 and 8 heads "
            "on a synthetic binding task (name the subject and the object at once) and on "
            "TinyShakespeare language modelling, 3 seeds each. --quick: 1 and 4 heads, one "
            "seed, the binding task only (under a minute). cost: parameters, FLOPs by part, "
            "time and peak memory of attention at one width for several head counts and "
            "lengths, and heads in a Python loop against all at once (see --width, --heads, "
            "--lengths, --device, --figure; --quick: width 256, 1/4/16 heads, 256 tokens)."
        ),
    )
    p.add_argument("name", choices=("one-vs-many", "cost"))
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small grid (small setting: binding task only; large: 1 and 8 heads, 2 seeds, "
        "200 steps)",
    )
    p.add_argument(
        "--setting",
        choices=("small", "large"),
        default="small",
        help="one-vs-many: small (width 64, 2 layers, 1/2/4/8 heads, binding + BPE language "
        "model) or large (width 256, 4 layers, 1/4/8/16 heads, character-level language model "
        "of TinyShakespeare; meant for --device cuda, --quick for a CPU)",
    )
    p.add_argument(
        "--data",
        type=text("a folder"),
        help="folder with corpus/tinyshakespeare/input.txt (default: ../shared/data beside "
        "the headlab checkout)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    experiment_cost.add_arguments(p)
    p.set_defaults(handler=run)


#: the flags of each experiment alone: given to the other, one line
ONLY = {
    "cost": ("width", "heads", "lengths", "batch", "rounds", "no_backward", "figure"),
    "one-vs-many": ("data",),
}


def run(args: argparse.Namespace) -> int:
    owner = "one-vs-many" if args.name == "cost" else "cost"  # the other experiment's flags
    given = [
        f"--{n.replace('_', '-')}" for n in ONLY[owner] if getattr(args, n) not in (None, False)
    ]
    if owner == "one-vs-many" and args.setting != "small":
        given.append("--setting")
    if given:
        raise InputError(f"{', '.join(given)}: for `headlab experiment {owner}` only")
    if args.name == "cost":
        return experiment_cost.run(args)
    from headlab.experiments.one_vs_many import (
        data_folder,
        grid_config,
        one_vs_many,
        one_vs_many_text,
    )

    device = str(model_device(args)) if args.device is not None else "cpu"
    cfg = grid_config(args.setting, quick=args.quick, device=device)
    data = data_folder(cfg, args.data)
    with progress_for(args, "headlab experiment") as progress:
        result = one_vs_many(cfg, data=data, progress=progress)
    if args.json:
        emit_json(result)
    else:
        show(one_vs_many_text(result))
    return 0
