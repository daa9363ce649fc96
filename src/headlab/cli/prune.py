"""``headlab prune``: find the heads a model can lose, and write the smaller model."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path
from typing import Any

from headlab.cli._args import integer, number, text
from headlab.cli._model import add_model_arguments, load_model
from headlab.cli._output import console, emit_json, human_bytes
from headlab.cli._progress import progress_for


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "prune",
        help="prune the least important heads and save a physically smaller model",
        description=(
            "Score heads (gradient importance, Michel et al. 2019, or ablation), remove the "
            "least important in steps while re-measuring a task metric, then rewrite the weights "
            "so the heads are gone and save the model (safetensors, atomically). Default: "
            "all-MiniLM-L6-v2 on the bundled STS-B sample (CC BY-SA pairs of STS-B dev; a third "
            "of the pairs scores importance, the rest measures the metric)."
        ),
    )
    p.add_argument(
        "--model",
        type=text("a model folder"),
        help="a model folder, tiny-shakespeare, or a model name in the local Hugging Face cache (default: all-MiniLM-L6-v2)",
    )
    add_model_arguments(p)
    p.add_argument("--fraction", type=number(), help="share of heads to remove, in (0, 1)")
    p.add_argument("--curve", action="store_true", help="only the pruning curve, no model")
    p.add_argument("--out", help="folder for the pruned model (refused if it exists)")
    p.add_argument("--overwrite", action="store_true", help="replace an --out folder headlab wrote")
    p.add_argument(
        "--metric",
        choices=("stsb", "fidelity", "perplexity"),
        help="stsb (Spearman), fidelity (cosine to the unpruned embeddings) or perplexity "
        "(causal models; needs --text). Default: stsb for encoders, perplexity for causal models",
    )
    p.add_argument(
        "--importance",
        choices=("gradient", "ablation"),
        default="gradient",
        help="(default gradient)",
    )
    p.add_argument(
        "--step", type=number(), default=0.1, help="share of heads per step (default 0.1)"
    )
    p.add_argument(
        "--max-loss",
        type=number(0.0),
        help="stop before losing more than this (metric units)",
    )
    p.add_argument(
        "--uniform",
        action="store_true",
        help="remove the same number of heads from every layer (Llama, Mistral, Qwen2 and "
        "Qwen3 results then load in transformers too; Phi-3 results load with headlab only)",
    )
    p.add_argument(
        "--transformers-compatible",
        action="store_true",
        help="refuse results that only headlab can load (implies --uniform)",
    )
    p.add_argument(
        "--stsb",
        type=text("a file"),
        help="STS-B file to evaluate on (default: the bundled sample)",
    )
    p.add_argument(
        "--importance-stsb",
        type=text("a file"),
        help="STS-B file to score importance on (default: every third pair of --stsb)",
    )
    p.add_argument(
        "--importance-pairs",
        type=int,
        help="score importance on this many pairs, evenly spaced through the file (default all)",
    )
    p.add_argument("--text", type=text("a file"), help="held-out text file for perplexity")
    p.add_argument("--limit", type=integer(2, 10**9), help="use at most this many STS-B pairs")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--csv", action="store_true", help="the curve as CSV")
    p.set_defaults(handler=run)


def options_from(args: argparse.Namespace) -> Any:
    """The library's :class:`~headlab.pruning.workflow.PruneOptions` for parsed arguments."""
    from headlab.pruning.workflow import PruneOptions

    def path(value: str | None) -> Path | None:
        return None if value is None else Path(value)

    return PruneOptions(
        fraction=args.fraction,
        out=path(args.out),
        overwrite=args.overwrite,
        metric=args.metric,
        importance=args.importance,
        step=args.step,
        max_loss=args.max_loss,
        uniform=args.uniform,
        transformers_compatible=args.transformers_compatible,
        stsb=path(args.stsb),
        importance_stsb=path(args.importance_stsb),
        importance_pairs=args.importance_pairs,
        text=path(args.text),
        limit=args.limit,
    )


def run(args: argparse.Namespace) -> int:
    from headlab.errors import InputError
    from headlab.pruning.workflow import run_pruning

    if args.curve == (args.fraction is not None):
        raise InputError("give either --fraction F (prune and save) or --curve (measure only)")
    options = options_from(args)
    options.check()  # options and the output folder, before the model loads
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args, with_lm_head=options.needs_lm_head)
    with progress_for(args, "headlab prune") as progress:
        result = run_pruning(lm, options, progress=progress)
    for note in result.notes:
        print(f"headlab prune: {note}", file=sys.stderr)
    return _print(args, result.to_json())


def _print(args: argparse.Namespace, result: dict[str, Any]) -> int:
    if args.json:
        emit_json(result)
        return 0
    if args.csv:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(result["curve"][0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(result["curve"])
        sys.stdout.write(buf.getvalue())
        return 0
    from rich.table import Table

    con = console()
    table = Table(title=f"{result['model']}: pruning curve ({result['importance']} importance)")
    for col in ("step", "heads removed", "share", f"{result['metric']} ({result['unit']})", "loss"):
        table.add_column(col, justify="right")
    for p in result["curve"]:
        table.add_row(
            str(p["step"]),
            f"{p['heads_removed']} / {result['heads_before']}",
            f"{100 * p['fraction']:.0f}%",
            f"{p['metric']:.2f}",
            f"{p['loss']:+.2f}",
        )
    con.print(table)
    if "heads_after" not in result:
        return 0
    con.print(
        f"pruned {result['heads_before']} -> {result['heads_after']} heads "
        f"(per layer {result['heads_per_layer']}); {result['metric']} "
        f"{result['metric_before']:.2f} -> {result['metric_after']:.2f}\n"
        f"parameters {result['params_before']:,} -> {result['params_after']:,}; weights "
        f"{human_bytes(result['bytes_before'])} -> {human_bytes(result['bytes_after'])}\n"
        f"forward ({result['timed_batch'][0]} x {result['timed_batch'][1]} tokens) "
        f"{result['time_before_ms']:.1f} ms -> {result['time_after_ms']:.1f} ms; "
        f"{100 * result['flops_removed_share']:.1f}% of the FLOPs removed\n"
        f"saved to {result['out']}; loads with {' and '.join(result['loads_with'])}"
    )
    return 0
