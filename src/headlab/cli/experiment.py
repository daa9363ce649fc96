"""``headlab experiment one-vs-many``: the lesson's central claim, measured."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headlab.cli._args import text
from headlab.cli._output import console, emit_json


def default_data() -> Path:
    """``../shared/data`` beside the headlab checkout (:func:`headlab.experiments.one_vs_many.
    default_data`)."""
    from headlab.experiments.one_vs_many import default_data as beside_checkout

    return beside_checkout()


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
    from headlab.cli import experiment_cost

    experiment_cost.add_arguments(p)
    p.set_defaults(handler=run)


#: the flags of ``cost`` alone, and of ``one-vs-many`` alone: given to the other, one line
COST_ONLY = ("width", "heads", "lengths", "batch", "rounds", "no_backward", "figure")
GRID_ONLY = ("data",)


def _refuse(args: argparse.Namespace, names: tuple[str, ...], owner: str) -> None:
    from headlab.errors import InputError

    given = [
        f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) not in (None, False)
    ]
    if owner == "one-vs-many" and args.setting != "small":
        given.append("--setting")
    if given:
        raise InputError(f"{', '.join(given)}: for `headlab experiment {owner}` only")


def run(args: argparse.Namespace) -> int:
    if args.name == "cost":
        from headlab.cli import experiment_cost

        _refuse(args, GRID_ONLY, "one-vs-many")
        return experiment_cost.run(args)
    _refuse(args, COST_ONLY, "cost")
    from headlab.cli._model import model_device
    from headlab.cli._progress import progress_for
    from headlab.experiments.one_vs_many import grid_config, one_vs_many

    device = str(model_device(args)) if args.device is not None else "cpu"
    cfg = grid_config(args.setting, quick=args.quick, device=device)
    needs_data = "language-model" in cfg.tasks
    data = Path(args.data) if args.data else (default_data() if needs_data else Path("."))

    with progress_for(args, "headlab experiment") as progress:
        result = one_vs_many(cfg, data=data, progress=progress)
    if args.json:
        emit_json(result)
        return 0
    from rich.table import Table

    table = Table(
        title=f"one head vs many, same width and parameters ({cfg.setting} setting, "
        f"{result['device']}, {result['wall_s']:.0f} s)"
    )
    for col in ("task", "heads", "metric", "mean", "spread (sd)", "seeds"):
        table.add_column(col, justify="right")
    for r in result["summary"]:
        table.add_row(
            r["task"],
            str(r["n_heads"]),
            r["metric"],
            f"{r['mean']:.3f}",
            "\u2013" if r["std"] is None else f"{r['std']:.3f}",
            str(r["seeds"]),
        )
    con = console()
    con.print(table)
    for run in result["runs"]:
        if run["task"] == "binding" and run["seed"] == cfg.seeds[0]:
            heads = run["diagnostic"]["heads"]
            focus = "; ".join(
                f"head {h['head']}: subject {h['mass_on_subject']:.2f}, object "
                f"{h['mass_on_object']:.2f}, entropy {h['entropy']:.2f}"
                for h in heads
            )
            con.print(f"{run['n_heads']} head(s), last layer, from the query token: {focus}")
    return 0
