"""``headlab report``: write the HTML explorer of a model's heads, with figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from headlab.cli._args import MAX_REPLICATES, integer, text
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model, text_side
from headlab.cli._output import data_notes, native_note
from headlab.cli._progress import progress_for
from headlab.cli.heads import LESSON_SENTENCE
from headlab.progress import Prefixed, Progress


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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _read_json(path: str, what: str) -> dict[str, Any]:
    from headlab.errors import InputError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise InputError(f"cannot read {what} {path}: JSON nested too deeply") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"cannot read {what} {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def run(args: argparse.Namespace) -> int:
    from headlab.errors import InputError
    from headlab.report import write_report
    from headlab.roles.workflow import keep_roles, read_gold, run_roles

    pruning = None
    if args.pruning:
        from headlab.pruning.workflow import read_pruning_json

        pruning = read_pruning_json(_read_json(args.pruning, "pruning result"), args.pruning)
    experiments = [_read_json(f, "experiment result") for f in args.experiment or []]
    for path, experiment in zip(args.experiment or [], experiments, strict=True):
        if not isinstance(experiment.get("summary", []), list):
            raise InputError(f"{path}: expected the JSON of headlab experiment")
    cost = _read_json(args.cost, "cost result") if args.cost else None
    patching = _read_json(args.patch, "patching result") if args.patch else None
    if patching is not None:  # checked whole before any measurement
        from headlab.causal.patching import PatchingResult

        PatchingResult.from_json(patching, args.patch)
    if cost is not None and not isinstance(cost.get("rows"), list):
        raise InputError(f"{args.cost}: expected the JSON of headlab experiment cost --json")
    if args.out is None:  # the decoder's page goes beside the encoder's, so each can link the other
        from headlab.report.decoder import DECODER_FOLDER, DECODER_NAME

        args.out = DECODER_FOLDER if args.model == DECODER_NAME else "headlab-report"
    if args.text is not None and not args.prune:
        raise InputError("--text is the held-out text of --prune's perplexity curve: add --prune")
    if args.model is None:  # the default encoder: check the word before any work
        _check_focus_word(args.word or "prepared", [LESSON_SENTENCE, *(args.sentence or [])])

    from headlab.outputs import check_output
    from headlab.report import KIND

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
        prune_options = _causal_prune_options(args, lm)  # before the roles, not after
    native_note("headlab report")
    sentences, word = _viewer_sentences(args, lm.causal)
    if args.model is not None:  # now that the model, and so its sentences, are known
        _check_focus_word(word, sentences)
    sentences += [" ".join(s.words) for s in gold.treebank.sentences if 6 <= len(s.words) <= 25][:4]
    with progress_for(args, "headlab report") as progress:
        # the roles are stage 1 of 4 (headlab.report.full counts the others)
        roles_stage = Prefixed(progress, "stage 1/4, roles")
        roles = run_roles(
            lm,
            gold,
            replicates=args.replicates,
            progress=progress if args.roles_only and not args.full else roles_stage,
        )
        data_notes("headlab report", roles.data, gold.folds_off, roles.replicates)
        note = keep_roles(roles.to_json())  # headlab serve shows it
        if note:
            print(f"headlab report: note: {note}", file=sys.stderr, flush=True)
        if args.full or not args.roles_only:
            from headlab.report.full import measure_extras

            given = {"pruning"} if pruning is not None else set()
            given |= {"cost"} if cost is not None else set()
            if any(e.get("task", "").startswith("binding") for e in experiments):
                given.add("experiment")
            extras = measure_extras(
                lm,
                progress=progress,
                prune_options=prune_options,
                quick=not (args.full or args.prune),
                given=frozenset(given),
            )
            pruning = pruning or extras["pruning"]
            cost = cost or extras["cost"]
            if extras["experiment"] is not None:
                experiments.insert(0, extras["experiment"])
        elif args.prune:
            pruning = _measure_curve(lm, progress, prune_options)
        out = write_report(
            lm,
            roles,
            args.out,
            sentences=sentences,
            focus_word=word,
            pruning=pruning,
            experiment=experiments[0] if experiments else None,
            experiments=experiments[1:],
            cost=cost,
            patching=patching,
            overwrite=args.overwrite,
            progress=progress,
        )
    if args.ledger_md:
        from headlab.outputs import write_text_atomic

        ledger = (out / "ledger.md").read_text(encoding="utf-8")
        write_text_atomic(args.ledger_md, ledger)
        print(f"wrote {args.ledger_md}")
    print(f"wrote {out / 'index.html'}")
    return 0


def _check_focus_word(word: str, sentences: list[str]) -> None:
    """The viewer opens on ``word`` in the first of ``sentences`` (the lesson's, then each
    ``--sentence``) that has it: refuse a word that none has before any work, as ``headlab
    heads`` does."""
    from headlab.errors import InputError
    from headlab.models.words import find_word, split_words

    first: InputError | None = None
    for sentence in sentences:
        words = [w for w, _, _ in split_words(sentence)]
        try:
            find_word(words, [False] * len(words), word)
            return
        except InputError as err:
            first = first or err
    if len(sentences) == 1 and first is not None:
        raise first
    shown = "; ".join(repr(s) for s in sentences)
    raise InputError(f"--word {word!r} is in none of the viewer's sentences ({shown})")


def _viewer_sentences(args: argparse.Namespace, causal: bool) -> tuple[list[str], str]:
    """The viewer's own sentences and the word it opens on: the lesson's sentence at
    "prepared" for an encoder; for a decoder the IOI prompt at its last word, a repeated
    sentence (for induction heads), then the lesson's sentence, each ``--sentence`` between."""
    from headlab.report.decoder import DECODER_FOCUS, DECODER_PROMPT, REPEAT_PROMPT

    own = list(args.sentence or [])
    if causal:
        return [DECODER_PROMPT, REPEAT_PROMPT, *own, LESSON_SENTENCE], args.word or DECODER_FOCUS
    return [LESSON_SENTENCE, *own], args.word or "prepared"


def _causal_prune_options(args: argparse.Namespace, lm: Any) -> Any:
    """``headlab prune --curve``'s options for a causal model (perplexity on ``--text``, or on
    the pruning library's default text), checked on the text before any measurement."""
    from headlab.errors import InputError
    from headlab.pruning.workflow import PruneOptions, build_metrics

    options = PruneOptions(metric="perplexity", text=None if args.text is None else Path(args.text))
    options.check()
    try:
        build_metrics(lm, options)  # reads and cuts the text: a missing one fails here
    except InputError as exc:
        why = f"cannot measure perplexity ({exc})" if args.text else "needs held-out text"
        raise InputError(
            f"--prune on a causal model {why}: give --text FILE, or give the curve as --pruning "
            "FILE (headlab prune --model MODEL --curve --json > FILE)"
        ) from None
    return options


def _measure_curve(lm: Any, progress: Progress | None, options: Any = None) -> dict[str, Any]:
    """``headlab prune --curve``'s workflow and JSON: on the bundled STS-B sample for an
    encoder, with ``options`` (:func:`_causal_prune_options`) for a causal model."""
    from headlab.pruning.workflow import PruneOptions, run_pruning

    return run_pruning(lm, options or PruneOptions(), progress=progress).to_json()
