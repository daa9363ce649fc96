"""``headlab report``: write the HTML explorer of a model's heads, with figures."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import MAX_REPLICATES, integer, text
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model, text_side
from headlab.cli._output import data_notes, native_note
from headlab.cli._progress import progress_for


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
            "cache (--model smollm2 writes ./headlab-report-smollm2/, linked both ways)."
        ),
    )
    p.add_argument(
        "--model",
        type=text("a model folder"),
        help=MODEL_HELP,
    )
    add_model_arguments(p)
    p.add_argument(
        "--out",
        type=text("a folder"),
        help="output folder (default headlab-report; headlab-report-smollm2 for --model smollm2)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace another headlab output folder (a report is replaced without it; "
        "folders headlab did not write never are)",
    )
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
        "--limit",
        type=integer(1, 10**9),
        help="use at most this many sentences and GAP rows",
    )
    p.add_argument(
        "--replicates",
        type=integer(0, MAX_REPLICATES),
        default=100,
        help="bootstrap resamples (default 100)",
    )
    p.add_argument(
        "--reliability",
        type=integer(0, 100),
        metavar="K",
        help="assign roles on K folds of whole documents too, as headlab roles does (default 5 "
        "when the data has 5 documents, else off; 0: off)",
    )
    p.add_argument(
        "--sentence",
        action="append",
        type=text("a sentence"),
        help="a sentence for the viewer (repeatable; the lesson's sentence always comes first, "
        "for a causal model the IOI prompt)",
    )
    p.add_argument(
        "--word",
        type=text("a word"),
        help="word the viewer opens on; WORD#2 for its second occurrence (default prepared; "
        "for a causal model to#2, the IOI prompt's last word)",
    )
    p.add_argument(
        "--pruning",
        type=text("a file"),
        help="a pruning result: the JSON of headlab prune --json/--curve",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="measure the pruning curve too (slower): STS-B for an encoder, perplexity on --text "
        "for a causal model (with KV-cache bytes per point)",
    )
    p.add_argument(
        "--text",
        type=text("a file"),
        help="held-out text for a causal model's --prune (default: the pruning library's "
        "bundled text, where it has one)",
    )
    _add_result_files(p)
    p.add_argument(
        "--full",
        action="store_true",
        help="measure everything the ledger needs: roles, the pruning curve, experiment cost "
        "--quick and experiment one-vs-many --quick (files given are used instead)",
    )
    p.add_argument(
        "--roles-only",
        action="store_true",
        help="skip the quick measurements that fill the lesson's claim table (a pruning curve "
        "on 300 STS-B pairs for an encoder, experiment cost --quick, experiment one-vs-many "
        "--quick: about 25 s on 2 cores); the table then says which claims were not measured",
    )
    p.add_argument(
        "--ledger-md",
        type=text("a file"),
        help="also write the ledger of the lesson's claims as a Markdown table to this file",
    )
    p.set_defaults(handler=run)


def _add_result_files(p: Any) -> None:
    """The results a report draws from files instead of measuring them."""
    p.add_argument(
        "--experiment",
        "--one-vs-many",
        action="append",
        type=text("a file"),
        help="the JSON of headlab experiment one-vs-many --json (repeatable: e.g. the small "
        "and the large setting)",
    )
    p.add_argument("--cost", type=text("a file"), help="the JSON of headlab experiment cost --json")
    p.add_argument(
        "--patch",
        type=text("a file"),
        help="the JSON of headlab patch --json: which heads carry a behaviour, as a heatmap",
    )
    p.add_argument(
        "--circuit",
        type=text("a file"),
        help="the JSON of headlab circuit --json: the circuit drawn as a graph",
    )


def run(args: argparse.Namespace) -> int:
    from headlab.errors import InputError
    from headlab.outputs import check_output, write_text_atomic
    from headlab.report import KIND
    from headlab.report.build import (
        build_report,
        causal_prune_options,
        check_focus_word,
        default_folder,
        measure_mode,
        read_inputs,
        viewer_sentences,
    )
    from headlab.roles.workflow import read_gold

    inputs = read_inputs(
        pruning=args.pruning,
        experiments=args.experiment,
        cost=args.cost,
        patch=args.patch,
        circuit=args.circuit,
    )
    args.out = args.out or default_folder(args.model)
    if args.text is not None and not args.prune:
        raise InputError("--text is the held-out text of --prune's perplexity curve: add --prune")
    if args.model is None:  # the default encoder: check the word before any work
        check_focus_word(*_focus(viewer_sentences(False, args.sentence, args.word)))
    check_output(args.out, overwrite=args.overwrite, kind=KIND, replace_kind=True)
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    gold = read_gold(
        treebank=args.treebank,
        gap=args.gap,
        no_gap=args.no_gap,
        limit=args.limit,
        reliability=args.reliability,
    )
    lm = text_side(load_model(args))  # an encoder-decoder's encoder, as roles measure it
    prune_options = None
    if args.prune and lm.causal:  # perplexity needs the language-model head
        lm = load_model(args, with_lm_head=True)
        prune_options = causal_prune_options(lm, args.text)  # before the roles, not after
    native_note("headlab report")
    sentences, word = viewer_sentences(lm.causal, args.sentence, args.word)
    if args.model is not None:  # now that the model, and so its sentences, are known
        check_focus_word(word, sentences)
    measure = measure_mode(full=args.full, prune=args.prune, roles_only=args.roles_only)
    with progress_for(args, "headlab report") as progress:
        built = build_report(
            lm,
            gold,
            inputs,
            out=args.out,
            sentences=sentences,
            word=word,
            replicates=args.replicates,
            measure=measure,
            prune_options=prune_options,
            overwrite=args.overwrite,
            progress=progress,
        )
    data_notes("headlab report", built.roles.data, gold.folds_off, built.roles.replicates)
    if built.note:
        print(f"headlab report: note: {built.note}", file=sys.stderr, flush=True)
    if args.ledger_md:
        ledger = (built.out / "ledger.md").read_text(encoding="utf-8")
        write_text_atomic(args.ledger_md, ledger)
        print(f"wrote {args.ledger_md}")
    print(f"wrote {built.out / 'index.html'}")
    return 0


def _focus(chosen: tuple[list[str], str]) -> tuple[str, list[str]]:
    sentences, word = chosen
    return word, sentences
