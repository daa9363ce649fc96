"""``headlab experiment``: one-vs-many, the lesson's central claim measured, and cost, what
several thin heads cost against one wide head."""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._args import integer, listed, text
from headlab.cli._causal import request
from headlab.cli._model import model_device
from headlab.cli._output import output
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
    add_cost_arguments(p)
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
        return _run_cost(args)
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
    output(args, result, lambda: one_vs_many_text(result))
    return 0


#: head counts and lengths, e.g. 1,4,16
COUNTS = listed(integer(1, 1_000_000), "whole numbers separated by commas", "1,4,16")


def add_cost_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``experiment cost`` (refused with the other experiment)."""
    g = p.add_argument_group("cost")
    g.add_argument("--width", type=int, help="model width E (default 768)")
    g.add_argument(
        "--model",
        help="take the width of this model (a catalog name, config.json or folder, smollm2, gemma3, a "
        ".gguf file) and add its head count to --heads",
    )
    g.add_argument(
        "--heads",
        type=COUNTS,
        help="head counts, e.g. 1,4,16 (default 1,2,4,8,12,16,32,64: those dividing the width)",
    )
    g.add_argument("--lengths", type=COUNTS, help="input lengths (default 512,2048)")
    g.add_argument("--batch", type=int, help="sequences per call (default 1)")
    g.add_argument("--device", help="cpu or cuda (default cpu; one-vs-many takes it too)")
    g.add_argument("--rounds", type=int, help="rounds of alternating timing blocks (default 3)")
    g.add_argument("--no-backward", action="store_true", help="time the forward only")
    g.add_argument("--figure", help="write a PNG of time and memory against heads")


def _run_cost(args: argparse.Namespace) -> int:
    from headlab.experiments.cost_request import CostRequest
    from headlab.experiments.cost_text import cost_text

    cost = request(CostRequest, args)  # every check before anything is measured
    with progress_for(args, "headlab experiment cost") as progress:
        result = cost.run(None, progress).to_json()  # the figure written too
    output(args, result, lambda: cost_text(result))
    return 0
