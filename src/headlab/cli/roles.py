"""``headlab roles``: what every head of a model specializes in, measured on gold data."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from typing import Any

from headlab.cli._args import integer, seed, text
from headlab.cli._model import add_model_arguments, load_model
from headlab.cli._output import console, emit_json, native_note
from headlab.cli._progress import progress_for

#: bootstrap resamples: each costs memory per head; 100,000 is far past where estimates settle
MAX_REPLICATES = 100_000


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "roles",
        help="each head's role (positional, delimiter, syntactic, ...) on gold data",
        description=(
            "Score every head for each role the literature names (positional, delimiter, "
            "rare-token, syntactic, coreference, broad, and induction for causal models) on "
            "gold data, classify each head or leave it unclassified, and bootstrap how stable "
            "that is. Default: all-MiniLM-L6-v2 on the bundled samples (500 UD English EWT dev "
            "sentences, 300 GAP development rows)."
        ),
    )
    p.add_argument(
        "--model",
        type=text("a model folder"),
        help="a model folder, tiny-shakespeare, or a model name in the local Hugging Face cache (default: all-MiniLM-L6-v2)",
    )
    add_model_arguments(p)
    p.add_argument(
        "--treebank",
        type=text("a file"),
        help="a CoNLL-U file (default: the bundled UD EWT dev sample)",
    )
    p.add_argument(
        "--gap", type=text("a file"), help="a GAP TSV file (default: the bundled GAP sample)"
    )
    p.add_argument("--no-gap", action="store_true", help="skip the coreference probe")
    p.add_argument(
        "--frequencies",
        type=text("a file"),
        help="word frequencies for the rare-token probe: word<TAB>count TSV or a .conllu "
        "(default: counts of UD English EWT train, bundled)",
    )
    p.add_argument(
        "--limit",
        type=integer(1, 10**9),
        help="use at most this many sentences and GAP rows",
    )
    p.add_argument(
        "--replicates",
        type=integer(0, MAX_REPLICATES),
        default=100,
        help="bootstrap resamples (default 100; 0: none)",
    )
    p.add_argument("--seed", type=seed, default=0, help="bootstrap seed (default 0)")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="the same as --dtype bfloat16: model and q k^T in bfloat16, softmax and statistics "
        "in float32 (faster on CPUs with AMX; scores move by well under 0.01, see "
        "benchmarks/RESULTS.md)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the full result as JSON")
    out.add_argument("--csv", action="store_true", help="one CSV row per head")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.datasets import read_frequencies, read_gap, read_treebank, sample_path
    from headlab.errors import InputError
    from headlab.roles import RoleOptions, measure_roles

    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be at least 1, got {args.limit}")
    if args.replicates < 0:
        raise InputError(f"--replicates must be 0 or more, got {args.replicates}")
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    gold = read_treebank(args.treebank or sample_path("treebank"), limit=args.limit)
    gap = None if args.no_gap else read_gap(args.gap or sample_path("gap"), limit=args.limit)
    frequencies = read_frequencies(args.frequencies or sample_path("frequencies"))
    if args.bf16:
        if args.dtype not in ("float32", "bfloat16"):
            raise InputError(f"--bf16 is --dtype bfloat16; it contradicts --dtype {args.dtype}")
        args.dtype = "bfloat16"
    lm = load_model(args)
    native_note("headlab roles")
    with progress_for(args, "headlab roles") as progress:
        report = measure_roles(
            lm,
            gold,
            gap=gap,
            frequencies=frequencies,
            options=RoleOptions(replicates=args.replicates, seed=args.seed),
            progress=progress,
        )
    if args.json:
        emit_json(report.to_json())
    elif args.csv:
        sys.stdout.write(heads_csv(report))
    else:
        print_report(report)
    return 0


def heads_csv(report: Any) -> str:
    """One row per head: position, role, score, baseline, margin, stability, every score."""
    names = sorted({k for h in report.heads for k in h.scores})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        [
            *("layer", "head", "role", "roles", "detail"),
            *("score", "baseline", "margin", "stability"),
            *names,
        ]
    )
    for h in report.heads:
        writer.writerow(
            [h.layer, h.head, h.role, "+".join(h.roles), h.detail]
            + [_fmt(v) for v in (h.score, h.baseline, h.margin, h.stability)]
            + [_fmt(h.scores.get(n)) for n in names]
        )
    return buf.getvalue()


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def print_report(report: Any) -> None:
    from rich.table import Table

    from headlab.roles import LETTERS
    from headlab.roles.probes.syntactic import CORE_RELATIONS

    con = console()
    rows = report.grid()
    legend = [f"{v} {k}" for k, v in LETTERS.items()]
    if any("-" in row for row in rows):
        legend.append("- pruned away")
    grid = Table(
        title=f"{report.model}: dominant role of each head (stability in the JSON/CSV)",
        caption="  ".join(legend),
    )
    grid.add_column("layer", justify="right")
    for h in range(report.n_heads):
        grid.add_column(str(h), justify="center")
    for layer, row in enumerate(rows):
        grid.add_row(str(layer), *row)
    con.print(grid)
    counts = report.role_counts()
    con.print("heads per role: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    unstable = [h for h in report.heads if h.stability is not None and h.stability < 0.8]
    if report.replicates:
        con.print(
            f"{len(unstable)} of {len(report.heads)} heads keep their role in fewer than 80% of "
            f"{report.replicates} bootstrap resamples: roles are tendencies, not assignments."
        )
    rel = Table(title="syntactic relations: best head vs best fixed offset (Clark et al. 2019)")
    for col in ("relation", "direction", "head (L.H)", "accuracy", "baseline (offset)", "arcs"):
        rel.add_column(col)
    rows = {(r.relation, r.direction): r for r in report.relations}
    for name in CORE_RELATIONS:
        for direction in ("dependent_to_head", "head_to_dependent"):
            r = rows.get((name, direction))
            if r is None:
                continue
            rel.add_row(
                name,
                "dep -> head" if direction == "dependent_to_head" else "head -> dep",
                f"{r.layer}.{r.head}",
                f"{100 * r.accuracy:.1f}",
                f"{100 * r.baseline:.1f} ({r.baseline_offset:+d})",
                str(r.count),
            )
    con.print(rel)
    c = report.coreference
    if c is not None:
        bases = ", ".join(f"{k} {100 * v:.1f}" for k, v in c.baselines.items())
        con.print(
            f"coreference (GAP, {c.count} pronouns): best head {c.layer}.{c.head} "
            f"{100 * c.accuracy:.1f}% vs baselines {bases}"
        )
    for name, info in report.data.items():
        skipped = ", ".join(f"{v} {k}" for k, v in info.get("skipped", {}).items() if v)
        con.print(f"{name}: {info['used']} used" + (f"; skipped: {skipped}" if skipped else ""))
