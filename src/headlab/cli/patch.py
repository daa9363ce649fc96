"""``headlab patch``: which heads carry a behaviour (activation and attribution patching)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model
from headlab.cli._output import console, emit_json
from headlab.cli._progress import progress_for
from headlab.models.names import DECODER

#: the library's defaults, as numbers here so that --help needs no torch import
TASKS = ("ioi", "induction")
METHODS = ("activation", "attribution", "ig", "dla")
DEFAULT_MODEL = DECODER


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
    p.add_argument("--model", type=text("a model"), help=f"{MODEL_HELP}; here default smollm2")
    add_model_arguments(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--task", choices=TASKS, help="a built-in task (default ioi)")
    source.add_argument(
        "--prompts",
        type=text("a JSON Lines file"),
        metavar="FILE.jsonl",
        help="one JSON object a line: clean, corrupt, answer, distractor",
    )
    p.add_argument(
        "--n", type=integer(1, 100_000), default=24, help="built-in prompts (default 24)"
    )
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=0, help="their seed (default 0)")
    p.add_argument(
        "--write",
        type=text("a .jsonl path"),
        metavar="FILE.jsonl",
        help="write the built-in task's prompts as JSON Lines (to edit, then --prompts) and stop",
    )
    p.add_argument(
        "--method",
        choices=METHODS,
        default="activation",
        help="activation (exact), attribution (gradient x difference, one backward pass; "
        "Nanda 2023), ig (integrated gradients, EAP-IG; Hanna et al. 2024), or dla (direct "
        "logit attribution: what each head writes to the answer directly, through the final "
        "norm frozen at the clean run)",
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
    p.add_argument("--figure", type=text("a PNG path"), help="write a layers x heads heatmap")
    p.add_argument("--csv-out", type=text("a CSV path"), help="write every head's effect as CSV")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--csv", action="store_true", help="every head's effect as CSV on stdout")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.causal.request import check_model, check_request

    check_request(
        method=args.method,
        component=args.component,
        compare=args.compare,
        to=args.to,
        path=args.path,
        prompts=args.prompts,
        write=args.write,
        figure=args.figure,
        csv_out=args.csv_out,
        csv=args.csv,
    )
    if args.model is None:
        args.model = DEFAULT_MODEL
    check_model(args.model, args.prompts)
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from headlab.causal.patching import as_task, parse_position, run_patching

    lm = load_model(args, with_lm_head=True)
    task = as_task(lm, args.prompts or args.task or "ioi", n=args.n, seed=args.seed)
    if args.write:
        from headlab.causal.tasks import write_prompts

        write_prompts(task.prompts, args.write)
        print(f"wrote {len(task.prompts)} prompts to {args.write}", file=sys.stderr)
        return 0
    if args.to is not None:
        return _run_path(args, lm, task)
    if args.method == "dla":
        from headlab.causal.dla import direct_logit_attribution

        with progress_for(args, "headlab patch") as progress:
            dla = direct_logit_attribution(lm, task, progress=progress)
        if args.json:
            emit_json(dla.to_json())
        else:
            _print_dla(dla, args.top)
        return 0
    with progress_for(args, "headlab patch") as progress:
        result = run_patching(
            lm,
            task,
            method=args.method,
            position=parse_position(args.position),
            component=args.component,
            steps=args.steps,
            compare=args.compare,
            layer_table=args.method == "activation"
            and args.component == "z"
            and not args.no_layers,
            progress=progress,
        )
    if args.figure:
        from headlab.causal.figure import write_heatmap

        write_heatmap(result, args.figure)
    if args.csv_out:
        from headlab.outputs import write_text_atomic

        write_text_atomic(args.csv_out, result.to_csv())
    if args.json:
        emit_json(result.to_json())
    elif args.csv:
        sys.stdout.write(result.to_csv())
    else:
        _print(result, args.top)
    return 0


def _print(result: Any, top: int) -> None:
    from rich.table import Table

    out = console()
    unit = "KV head" if result.unit == "kv_head" else "head"
    out.print(
        f"{result.method} patching of {result.model} on {result.task} ({result.n_prompts} "
        f"prompts, position {result.to_json()['position']}): logit difference "
        f"{result.clean:.3f} clean, {result.corrupt:.3f} corrupt, in {result.seconds:.1f} s"
    )
    if result.correlation is not None and result.reference is not None:
        c = result.correlation
        out.print(
            f"against activation patching: Pearson {c['pearson']:.3f}, Spearman {c['spearman']:.3f}"
        )
    table = Table(title=f"top {top} {unit}s by |effect| (share of the logit difference removed)")
    table.add_column("layer.head")
    table.add_column(result.method, justify="right")
    reference = result.reference
    if reference is not None:
        table.add_column("activation", justify="right")
    for layer, head, value in result.top(top):
        row = [f"{layer}.{head}", f"{value:+.3f}"]
        if reference is not None:
            row.append(f"{float(reference.effects[layer, head]):+.3f}")
        table.add_row(*row)
    out.print(table)
    if reference is not None:
        best = ", ".join(f"{la}.{h} {v:+.2f}" for la, h, v in reference.top(min(top, 5)))
        out.print(f"activation patching's top: {best}")
    if result.layers is not None:
        rows = result.layers.to_json()
        strongest = sorted(
            rows, key=lambda r: -max(abs(r[k] or 0.0) for k in ("resid", "attn", "mlp"))
        )[:5]
        layers = Table(title="the 5 layers of largest effect, whole components patched")
        for name in ("layer", "residual in", "attention out", "MLP out"):
            layers.add_column(name, justify="right")
        for r in sorted(strongest, key=lambda r: r["layer"]):
            cells = [f"{r[k]:+.3f}" if r[k] is not None else "-" for k in ("resid", "attn", "mlp")]
            layers.add_row(str(r["layer"]), *cells)
        out.print(layers)


def _print_dla(result: Any, top: int) -> None:
    from rich.table import Table

    out = console()
    out.print(
        f"direct logit attribution of {result.model} on {result.task} ({result.n_prompts} "
        f"prompts, final norm {result.norm} frozen at the clean run): logit difference "
        f"{result.clean:.3f} = heads {result.to_json()['heads_total']:.3f} + the rest "
        f"{result.rest:.3f}"
    )
    table = Table(title=f"top {top} heads by |direct effect| on the logit difference")
    table.add_column("layer.head")
    table.add_column("dla", justify="right")
    table.add_column("")
    for layer, head, value in result.top(top):
        table.add_row(f"{layer}.{head}", f"{value:+.3f}", "negative" if value < 0 else "")
    out.print(table)


def _run_path(args: argparse.Namespace, lm: Any, task: Any) -> int:
    from headlab.causal.patching import parse_position
    from headlab.causal.paths import parse_head, parse_receiver, path_patching

    receiver = parse_receiver(args.to)
    senders = None if args.path is None else [parse_head(args.path)]
    with progress_for(args, "headlab patch") as progress:
        result = path_patching(
            lm,
            task,
            receiver,
            senders=senders,
            position=parse_position(args.position),
            progress=progress,
        )
    if args.json:
        emit_json(result.to_json())
        return 0
    from rich.table import Table

    out = console()
    out.print(
        f"path patching of {result.model} on {result.task} to {result.receiver} "
        f"({result.n_prompts} prompts): logit difference {result.clean:.3f} clean, "
        f"{result.corrupt:.3f} corrupt, in {result.seconds:.1f} s"
    )
    table = Table(title=f"top {args.top} senders by |effect| of their path to {result.receiver}")
    table.add_column("sender")
    table.add_column("effect", justify="right")
    for layer, head, value in result.top(args.top):
        table.add_row(f"{layer}.{head}", f"{value:+.3f}")
    out.print(table)
    return 0
