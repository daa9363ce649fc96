"""``headlab roles``: what every head of a model specializes in, measured on gold data."""

from __future__ import annotations

import argparse
import sys
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from headlab.cli._args import MAX_REPLICATES, integer, seed, text
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model, model_device, text_side
from headlab.cli._output import console, data_notes, emit_json, native_note
from headlab.cli._progress import progress_for
from headlab.progress import NO_PROGRESS, Progress


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
        help=MODEL_HELP,
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
    p.add_argument(
        "--reliability",
        type=integer(0, 100),
        metavar="K",
        help="assign roles on K folds of whole documents too; a head is named only when at least "
        "80%% of the folds agree (default 5 when the data has 5 documents, else off; 0: off)",
    )
    p.add_argument("--seed", type=seed, default=0, help="bootstrap seed (default 0)")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="the same as --dtype bfloat16: model and q k^T in bfloat16, softmax and statistics "
        "in float32 (faster on CPUs with AMX; scores move by well under 0.01, see "
        "benchmarks/HISTORY.md)",
    )
    p.add_argument(
        "--batch-tokens",
        type=integer(1, 10**9),
        default=4096,
        metavar="N",
        help="padded tokens per forward pass (default 4096)",
    )
    p.add_argument(
        "--checkpoint",
        type=text("a file"),
        help="save the sums so far to this file every --checkpoint-every batches, and resume "
        "from it when it exists (the same arguments, model and data: the same result as an "
        "uninterrupted run); deleted once the result is out. Under torchrun each rank keeps "
        "FILE.rankR-of-W",
    )
    p.add_argument(
        "--checkpoint-every",
        type=integer(1, 10**9),
        default=50,
        metavar="N",
        help="batches between checkpoints (default 50)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the full result as JSON")
    out.add_argument("--csv", action="store_true", help="one CSV row per head")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab import distributed

    # under torchrun (WORLD_SIZE > 1) the ranks share the corpus; rank 0 writes the result
    with distributed.group(model_device(args)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from headlab import distributed
    from headlab.errors import InputError, ModalityError
    from headlab.roles.checkpoint import Checkpoint
    from headlab.roles.workflow import keep_roles, read_gold, run_roles

    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    gold = read_gold(
        treebank=args.treebank,
        gap=args.gap,
        no_gap=args.no_gap,
        frequencies=args.frequencies,
        limit=args.limit,
        reliability=args.reliability,
    )
    if args.bf16:
        if args.dtype not in ("float32", "bfloat16"):
            raise InputError(f"--bf16 is --dtype bfloat16; it contradicts --dtype {args.dtype}")
        args.dtype = "bfloat16"
    checkpoint = None
    if args.checkpoint is not None:
        checkpoint = Checkpoint(args.checkpoint, every=args.checkpoint_every)
    try:
        lm = load_model(args)  # a dual encoder (CLIP) loads its text tower alone
    except ModalityError as exc:
        raise ModalityError(
            f"headlab roles measures heads on text (a treebank, GAP); {exc}", reads=exc.reads
        ) from None
    lm = text_side(lm)  # roles are measured on text: an encoder-decoder's encoder
    writer = distributed.writes()
    if writer:
        native_note("headlab roles")
    # only the rank that writes draws (progress_for also checks RANK, set by torchrun)
    drawn: AbstractContextManager[Progress] = (
        progress_for(args, "headlab roles") if writer else nullcontext(NO_PROGRESS)
    )
    with drawn as progress:
        report = run_roles(
            lm,
            gold,
            replicates=args.replicates,
            seed=args.seed,
            batch_tokens=args.batch_tokens,
            checkpoint=checkpoint,
            progress=progress,
        )
    if not writer:
        _done(checkpoint)
        return 0
    data_notes("headlab roles", report.data, gold.folds_off, report.replicates)
    note = keep_roles(report.to_json())  # where headlab serve looks for it
    if note:
        print(f"headlab roles: note: {note}", file=sys.stderr, flush=True)
    if args.json:
        emit_json(report.to_json())
    elif args.csv:
        from headlab.roles.results import heads_csv

        sys.stdout.write(heads_csv(report))
    else:
        print_report(report)
    _done(checkpoint)
    return 0


def _done(checkpoint: Any) -> None:
    """The result is out: the checkpoint has served (and is never resumed into a new run)."""
    if checkpoint is not None:
        checkpoint.remove()


def _pct(v: float | None, interval: Any) -> str:
    """``57.5 [55.3-59.7]``: a share and its 95% interval, in %."""
    if v is None:
        return ""
    if not interval or interval[0] is None:
        return f"{100 * v:.1f}"
    return f"{100 * v:.1f} [{100 * interval[0]:.1f}-{100 * interval[1]:.1f}]"


def print_report(report: Any) -> None:
    from rich.table import Table

    from headlab.roles import LETTERS
    from headlab.roles.probes.syntactic import RELATION_SET
    from headlab.roles.results import fmt_p

    con = console()
    rows = report.grid()
    legend = [f"{v} {k}" for k, v in LETTERS.items()]
    if any("-" in row for row in rows):
        legend.append("- pruned away")
    stability = (
        f"stability over {report.folds} folds of documents"
        if report.folds
        else "stability over bootstrap resamples"
    )
    grid = Table(
        title=f"{report.model}: dominant role of each head ({stability} in the JSON/CSV)",
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
    if report.folds:
        unstable = [h for h in report.heads if h.stable is False]
        con.print(
            f"{len(unstable)} of {len(report.heads)} heads get their role in fewer than "
            f"{report.thresholds.stable:.0%} of {report.folds} folds of documents: reported "
            "unclassified (measured_role in the JSON/CSV)."
        )
    elif report.replicates:
        unstable = [h for h in report.heads if h.stability is not None and h.stability < 0.8]
        con.print(
            f"{len(unstable)} of {len(report.heads)} heads keep their role in fewer than 80% of "
            f"{report.replicates} bootstrap resamples: roles are tendencies, not assignments."
        )
    named = [h for h in report.heads if h.role in ("syntactic", "coreference") and h.evidence]
    if named:
        ev_table = Table(
            title="evidence: syntactic and coreference heads (accuracy, 95% Wilson interval "
            "over documents; exact McNemar vs the baseline on the same arcs, BH-corrected q)"
        )
        for col in ("head", "role", "decided by", "accuracy %", "baseline %", "arcs", "q"):
            ev_table.add_column(col)
        for h in named:
            ev = h.evidence
            ev_table.add_row(
                f"{h.layer}.{h.head}",
                h.role,
                h.detail or "GAP",
                _pct(ev.get("accuracy"), ev.get("interval")),
                _pct(ev.get("baseline"), ev.get("baseline_interval")),
                str(ev.get("count", "")),
                fmt_p(ev.get("q")),
            )
        con.print(ev_table)
    rel = Table(
        title="syntactic relations: best head vs best fixed offset (Clark et al. 2019); "
        "accuracy % [95% Wilson interval over documents]; * outside the a-priori set "
        "(never decides a role); q blank: not tested (outside the set, or under "
        f"{report.thresholds.min_relation_count} arcs{' in some fold' if report.folds else ''})"
    )
    for col in (
        "relation",
        "direction",
        "head (L.H)",
        "accuracy",
        "baseline (offset)",
        "arcs",
        "q",
    ):
        rel.add_column(col)
    by_key = {(r.relation, r.direction): r for r in report.relations}
    order = [n for n in RELATION_SET] + sorted(
        {r.relation for r in report.relations if not r.in_set}
    )
    for name in order:
        for direction in ("dependent_to_head", "head_to_dependent"):
            r = by_key.get((name, direction))
            if r is None or (not r.in_set and r.count < report.thresholds.min_relation_count):
                continue
            rel.add_row(
                name if r.in_set else f"{name} *",
                "dep -> head" if direction == "dependent_to_head" else "head -> dep",
                f"{r.layer}.{r.head}",
                _pct(r.accuracy, r.interval),
                f"{_pct(r.baseline, r.baseline_interval)} ({r.baseline_offset:+d})",
                str(r.count),
                fmt_p(r.q),
            )
    con.print(rel)
    c = report.coreference
    if c is not None:
        bases = ", ".join(f"{k} {100 * v:.1f}" for k, v in c.baselines.items())
        con.print(
            f"coreference (GAP, {c.count} pronouns): best head {c.layer}.{c.head} "
            f"{_pct(c.accuracy, c.interval)}% vs baselines {bases} "
            f"(q = {fmt_p(c.q)} against {c.baseline})"
        )
    for name, info in report.data.items():
        if not isinstance(info, dict) or "used" not in info:  # device, dtype
            continue
        skipped = ", ".join(f"{v} {k}" for k, v in info.get("skipped", {}).items() if v)
        con.print(f"{name}: {info['used']} used" + (f"; skipped: {skipped}" if skipped else ""))
