"""``headlab prune``: find the heads a model can lose, and write the smaller model."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from headlab.cli._args import integer, listed, number, share, text
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model, model_device
from headlab.cli._output import note, output
from headlab.cli._progress import progress_for

#: the library's defaults (kept here as numbers so that --help needs no torch import)
L0_WEIGHT = 0.5
L0_STEPS = 300


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
    p.add_argument("--model", type=text("a model folder"), help=MODEL_HELP)
    add_model_arguments(p)
    p.add_argument("--fraction", type=number(), help="share of heads to remove, in (0, 1)")
    p.add_argument("--curve", action="store_true", help="only the pruning curve, no model")
    p.add_argument("--out", type=Path, help="folder for the pruned model (refused if it exists)")
    p.add_argument("--overwrite", action="store_true", help="replace an --out folder headlab wrote")
    p.add_argument(
        "--metric",
        choices=("stsb", "fidelity", "perplexity", "ioi"),
        help="stsb (Spearman), fidelity (cosine to the unpruned embeddings), perplexity (causal "
        "models, on --text) or ioi (causal models: logit difference of the indirect object over "
        "the subject, Wang et al. 2022). Default: stsb for encoders, perplexity for causal models",
    )
    p.add_argument(
        "--importance",
        choices=("gradient", "ablation", "l0"),
        default="gradient",
        help="gradient (Michel et al. 2019), ablation, or l0: a hard-concrete gate per head "
        "trained with an L0 penalty (Louizos et al. 2018, Voita et al. 2019); with --out and no "
        "--fraction the gates decide which heads go (default gradient)",
    )
    p.add_argument(
        "--l0-weight",
        type=number(0.0),
        default=L0_WEIGHT,
        help=f"the L0 penalty's weight: higher closes more gates (default {L0_WEIGHT})",
    )
    p.add_argument(
        "--l0-steps",
        type=integer(1, 10**7),
        default=L0_STEPS,
        help=f"training steps of the gates (default {L0_STEPS})",
    )
    p.add_argument(
        "--seed", type=integer(0, 2**63 - 1), default=0, help="seed of gates and recovery"
    )
    p.add_argument(
        "--recover",
        type=integer(1, 10**7),
        metavar="STEPS",
        help="after pruning, distill the pruned model to the unpruned one for STEPS steps "
        "(on a curve: at the points of --recover-at)",
    )
    p.add_argument(
        "--recover-at",
        type=listed(share(one=False), "shares of heads separated by commas", "0.5,0.7"),
        default=(0.5, 0.7),
        metavar="F,F",
        help="on a curve, recover at the last point at or below these shares (default 0.5,0.7)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="with --curve: gradient, ablation and L0 curves (each with --recover) on the same "
        "data, in one run",
    )
    p.add_argument(
        "--x",
        choices=("heads", "kv-bytes"),
        default="heads",
        dest="x_axis",
        help="the figure's x-axis: heads removed, or KV-cache bytes per token (causal models)",
    )
    p.add_argument("--figure", type=text("a PNG path"), help="with --compare: write the figure")
    p.add_argument(
        "--step", type=number(), default=0.1, help="share of heads per step (default 0.1)"
    )
    p.add_argument(
        "--max-loss", type=number(0.0), help="stop before losing more than this (metric units)"
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
    _add_data_arguments(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--csv", action="store_true", help="the curve as CSV")
    p.set_defaults(handler=run)


def _add_data_arguments(p: Any) -> None:
    """The data: STS-B pairs for importance and the metric, text for perplexity."""
    p.add_argument(
        "--stsb", type=a_file, help="STS-B file to evaluate on (default: the bundled sample)"
    )
    p.add_argument(
        "--importance-stsb",
        type=a_file,
        help="STS-B file to score importance on (default: every third pair of --stsb)",
    )
    p.add_argument(
        "--importance-pairs",
        type=int,
        help="score importance on this many pairs, evenly spaced through the file (default all)",
    )
    p.add_argument(
        "--text",
        type=a_file,
        help="text file for perplexity: importance on its first half, perplexity on the second "
        "(default: the bundled TinyShakespeare sample)",
    )
    p.add_argument(
        "--limit",
        type=integer(2, 10**9),
        help="use at most this many STS-B pairs (--metric ioi: this many evaluation prompts)",
    )


def run(args: argparse.Namespace) -> int:
    from headlab import distributed

    # under torchrun (WORLD_SIZE > 1) the ranks share importance scoring; rank 0 writes
    with distributed.group(model_device(args)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from headlab import distributed
    from headlab.pruning.results import PruneOptions
    from headlab.pruning.workflow import PruneRequest, PruneResult

    options = PruneOptions(**{f.name: getattr(args, f.name) for f in fields(PruneOptions)})
    # options and the output folder, before the model loads
    prune = PruneRequest(options=options, model=args.model, curve=args.curve, figure=args.figure)
    lm = prune.ready(lambda head: load_model(args, with_lm_head=head))
    writer = distributed.writes()
    with progress_for(args, "headlab prune", draws=writer) as progress:
        result = prune.run(lm, progress)  # the model folder or the --compare figure written
    if not writer:
        return 0
    if not isinstance(result, PruneResult):  # the importance methods compared
        return _print(args, result.to_json(), compared=True)
    for line in result.notes:
        note("headlab prune", line, kind="")
    return _print(args, result.to_json())


def a_file(value: str) -> Path:
    """A file's path, not empty or only spaces."""
    return Path(text("a file")(value))


def _print(args: argparse.Namespace, result: dict[str, Any], compared: bool = False) -> int:
    """``result`` as JSON, CSV or tables: a curve, or a comparison of importance methods."""
    from headlab.pruning.request import compare_csv, curve_csv
    from headlab.pruning.text import compare_text, curve_text

    if compared:
        output(args, result, lambda: compare_text(result, args.figure), lambda: compare_csv(result))
    else:
        output(args, result, lambda: curve_text(result), lambda: curve_csv(result))
    return 0
