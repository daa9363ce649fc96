"""``headlab report``: write the HTML explorer of a model's heads, with figures."""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._args import text
from headlab.cli._model import load_model
from headlab.cli._output import data_notes, native_note, note
from headlab.cli._progress import progress_for
from headlab.cli.roles import add_gold, add_model, read_gold_of


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="an interactive HTML report of every head, with PNG figures",
        description=(
            "Measure every head's role (as headlab roles does), then write a self-contained "
            "HTML report (head grid, attention viewer, relation, coreference, spec, pruning and "
            "experiment tables) and PNG figures. Default: all-MiniLM-L6-v2 on the bundled "
            "samples, written to ./headlab-report/ (open index.html in any browser). A causal "
            "model gets a decoder's page: an IOI prompt, its induction-like heads and its KV "
            "cache (--model smollm2 writes ./headlab-report-smollm2/, linked both ways; --model "
            "gemma3 ./headlab-report-gemma3/)."
        ),
    )
    add, file = p.add_argument, text("a file")
    add_model(p)
    add(
        "--out",
        type=text("a folder"),
        help="output folder (default headlab-report; headlab-report-KEY for --model smollm2 or "
        "gemma3)",
    )
    add(
        "--overwrite",
        action="store_true",
        help="replace another headlab output folder (a report is replaced without it; "
        "folders headlab did not write never are)",
    )
    add_gold(p)
    add(
        "--sentence",
        action="append",
        type=text("a sentence"),
        help="a sentence for the viewer (repeatable; the lesson's sentence always comes first, "
        "for a causal model the IOI prompt)",
    )
    add(
        "--word",
        type=text("a word"),
        help="word the viewer opens on; WORD#2 for its second occurrence (default prepared; "
        "for a causal model to#2, the IOI prompt's last word)",
    )
    add(
        "--pruning",
        type=file,
        help="a pruning result: the JSON of headlab prune --json/--curve",
    )
    add(
        "--prune",
        action="store_true",
        help="measure the pruning curve too (slower): STS-B for an encoder, perplexity on --text "
        "for a causal model (with KV-cache bytes per point)",
    )
    add(
        "--text",
        type=file,
        help="held-out text for a causal model's --prune (default: the pruning library's "
        "bundled text, where it has one)",
    )
    add(
        "--experiment",
        "--one-vs-many",
        action="append",
        type=file,
        help="the JSON of headlab experiment one-vs-many --json (repeatable: e.g. the small "
        "and the large setting)",
    )
    add("--cost", type=file, help="the JSON of headlab experiment cost --json")
    add(
        "--patch",
        type=file,
        help="the JSON of headlab patch --json: which heads carry a behaviour, as a heatmap",
    )
    add(
        "--circuit",
        type=file,
        help="the JSON of headlab circuit --json: the circuit drawn as a graph",
    )
    add(
        "--full",
        action="store_true",
        help="measure everything the ledger needs: roles, the pruning curve, experiment cost "
        "--quick and experiment one-vs-many --quick (files given are used instead)",
    )
    add(
        "--roles-only",
        action="store_true",
        help="skip the quick measurements that fill the lesson's claim table (a pruning curve "
        "on 300 STS-B pairs for an encoder, experiment cost --quick, experiment one-vs-many "
        "--quick: about 25 s on 2 cores); the table then says which claims were not measured",
    )
    add(
        "--ledger-md",
        type=file,
        help="also write the ledger of the lesson's claims as a Markdown table to this file",
    )
    p.set_defaults(handler=run)


#: the flags :class:`headlab.report.request.ReportRequest` holds as they are
REQUEST = (
    "model replicates out overwrite word prune text full roles_only pruning cost patch circuit "
    "ledger_md"
)


def run(args: argparse.Namespace) -> int:
    from headlab.report.request import ReportRequest, build_requested, check_request, write_ledger

    request = ReportRequest(
        sentence=tuple(args.sentence or ()),
        experiment=tuple(args.experiment or ()),
        **{name: getattr(args, name) for name in REQUEST.split()},
    )
    gold = read_gold_of(args)
    inputs = check_request(request, gold)  # the viewer's word, in the treebank's sentences too
    lm, prune_options = request.ready_model(lambda head: load_model(args, with_lm_head=head))
    native_note("headlab report")
    with progress_for(args, "headlab report") as progress:
        built = build_requested(
            request, lm, gold, inputs, prune_options=prune_options, progress=progress
        )
    data_notes("headlab report", built.roles.data, gold.folds_off, built.roles.replicates)
    if built.note:
        note("headlab report", built.note)
    if args.ledger_md:
        write_ledger(built.out, args.ledger_md)
        print(f"wrote {args.ledger_md}")
    print(f"wrote {built.out / 'index.html'}")
    return 0
