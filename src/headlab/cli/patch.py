"""``headlab patch``: which heads carry a behaviour (activation and attribution patching)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.causal.methods import SOURCES, choices_help, names
from headlab.cli._args import integer, text
from headlab.cli._causal import add_model, add_outputs, add_prompts, request
from headlab.cli._model import load_model
from headlab.cli._output import note, output
from headlab.cli._progress import progress_for


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "patch",
        help="which heads carry a behaviour: patch each head from a corrupted run",
        description=(
            "Activation patching per head: each query head's output is taken from the corrupted "
            "prompt's run into the clean run (all heads of a layer at once, on the batch axis, "
            "from that layer's clean residual upward), and its effect is the share of the logit "
            "difference answer - distractor it removes: (LD_clean - LD_patched) / (LD_clean - "
            "LD_corrupt). --method attribution and ig estimate the same from gradients. Default: "
            "SmolLM2-135M on 24 IOI prompts (Wang et al. 2022)."
        ),
    )
    add_model(p)
    add_prompts(p, "one JSON object a line: clean, corrupt, answer, distractor", n=24)
    p.add_argument(
        "--write",
        type=text("a .jsonl path"),
        metavar="FILE.jsonl",
        help="write the built-in task's prompts as JSON Lines (to edit, then --prompts) and stop",
    )
    p.add_argument(
        "--method",
        choices=names(),  # the table of headlab.causal.methods, which imports no torch
        default="activation",
        help=choices_help(),
    )
    p.add_argument(
        "--source",
        choices=SOURCES,
        default="corrupt",
        help="what replaces a head's output: corrupt (the corrupted prompt's run: activation "
        "patching, default), mean (the head's mean output over the clean prompts: mean "
        "ablation) or resample (the previous clean prompt's output: resample ablation, Chan et "
        "al. 2022; at every position one of the same length); the effect is normalized by the "
        "clean-corrupt gap",
    )
    p.add_argument(
        "--steps", type=integer(1, 1000), default=5, help="ig: points on the path (default 5)"
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="with attribution or ig: run activation patching too, print both correlations "
        "(Pearson, Spearman) and the top heads of each",
    )
    p.add_argument(
        "--position",
        choices=("all", "last"),
        default="all",
        help="patch every position (default) or the last token only",
    )
    p.add_argument(
        "--component",
        choices=("z", "k", "v"),
        default="z",
        help="z: each query head's output (default); k or v: each KV head's keys or values "
        "(under GQA one KV head feeds a group of query heads)",
    )
    p.add_argument(
        "--no-layers",
        action="store_true",
        help="skip the per-layer table (residual stream, attention output, MLP output), "
        "which activation patching of head outputs adds by default",
    )
    p.add_argument(
        "--path",
        metavar="L.H",
        help="path patching from this sender head (default with --to: every head below it)",
    )
    p.add_argument(
        "--to",
        metavar="RECEIVER",
        help="path patching to q:L.H, k:L.H or v:L.H (a query head's queries, a KV head's keys "
        "or values) or logits: the share of the behaviour each sender's path there carries, "
        "every other head frozen at the clean run (Wang et al. 2022)",
    )
    p.add_argument("--top", type=integer(1, 10_000), default=10, help="heads listed (default 10)")
    add_outputs(p, "write a layers x heads heatmap", csv=True)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.causal.metric import gap_warning
    from headlab.causal.request import PatchRequest, patch_task, run_patch
    from headlab.causal.text import patch_text

    patching = request(PatchRequest, args)  # every check before the model loads
    lm = load_model(args, with_lm_head=True)
    task = patch_task(lm, patching)
    for line in task.notes:
        note("headlab patch", line)
    with progress_for(args, "headlab patch") as progress:
        result = run_patch(lm, task, patching, progress=progress)
    if args.write:  # the prompts written (PromptsWritten), nothing patched
        print(f"wrote {result.n_prompts} prompts to {result.path}", file=sys.stderr)
        return 0
    corrupt = getattr(result, "corrupt", None)  # direct logit attribution has no corrupted run
    warning = None if corrupt is None else gap_warning(result.clean, corrupt)
    if warning:
        note("headlab patch", warning, kind="warning: ")
    for path in (args.figure, args.csv_out):
        if path and not args.to:  # path patching writes a table only
            print(f"wrote {path}", file=sys.stderr)
    csv = None if args.to else lambda: result.to_csv()  # path patching has a table only
    output(args, result.to_json(), lambda: patch_text(result, args.top), csv)
    return 0
