"""``headlab report``: write the HTML explorer of a model's heads, with figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._model import add_model_arguments, load_model
from headlab.cli._output import native_note
from headlab.cli.heads import LESSON_SENTENCE


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="an interactive HTML report of every head, with PNG figures",
        description=(
            "Measure every head's role (as headlab roles does), then write a self-contained "
            "HTML report (head grid, attention viewer, relation, coreference, spec, pruning and "
            "experiment tables) and PNG figures. Default: all-MiniLM-L6-v2 on the bundled "
            "samples, written to ./headlab-report/ (open index.html in any browser)."
        ),
    )
    p.add_argument(
        "--model",
        type=text("a model folder"),
        help="a model folder, tiny-shakespeare, or a model name in the local Hugging Face cache (default: all-MiniLM-L6-v2)",
    )
    add_model_arguments(p)
    p.add_argument(
        "--out",
        type=text("a folder"),
        default="headlab-report",
        help="output folder (default headlab-report)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a folder that is not a report")
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
        type=integer(0, 100_000),
        default=100,
        help="bootstrap resamples (default 100)",
    )
    p.add_argument(
        "--sentence",
        action="append",
        type=text("a sentence"),
        help="a sentence for the viewer (repeatable; the lesson's sentence always comes first)",
    )
    p.add_argument(
        "--word",
        type=text("a word"),
        default="prepared",
        help="word the viewer opens on; WORD#2 for its second occurrence (default prepared)",
    )
    p.add_argument(
        "--pruning",
        type=text("a file"),
        help="a pruning result: the JSON of headlab prune --json/--curve",
    )
    p.add_argument("--prune", action="store_true", help="measure the pruning curve too (slower)")
    p.add_argument(
        "--experiment",
        type=text("a file"),
        help="the JSON of headlab experiment one-vs-many --json",
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


def check_pruning(data: dict[str, Any], path: str) -> None:
    """The fields of ``headlab prune --json/--curve`` that the report reads, with their types:
    strings ``model``, ``metric``, ``unit``, ``importance``, and a non-empty ``curve`` of
    objects with numbers ``fraction``, ``metric`` and ``loss`` and an integer
    ``heads_removed``."""
    from headlab.errors import InputError

    def fail(what: str, value: Any) -> InputError:
        shown = json.dumps(value)[:60]
        return InputError(f"{path}: expected the JSON of headlab prune, with {what}; got {shown}")

    if "curve" not in data:
        raise fail("a 'curve'", sorted(data)[:8])
    for key in ("model", "metric", "unit", "importance"):
        if not isinstance(data.get(key), str):
            raise fail(f"a string '{key}'", data.get(key))
    curve = data["curve"]
    if not isinstance(curve, list) or not curve:
        raise fail("a non-empty list 'curve'", curve)
    for point in curve:
        if not isinstance(point, dict):
            raise fail("objects in 'curve'", point)
        for key in ("fraction", "metric", "loss"):
            value = point.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise fail(f"a number '{key}' in every curve point", point)
        removed = point.get("heads_removed")
        if isinstance(removed, bool) or not isinstance(removed, int):
            raise fail("an integer 'heads_removed' in every curve point", point)


def run(args: argparse.Namespace) -> int:
    from headlab.datasets import read_conllu, read_frequencies, read_gap, sample_path
    from headlab.errors import InputError
    from headlab.report import write_report
    from headlab.roles import RoleOptions, measure_roles

    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be at least 1, got {args.limit}")
    pruning = _read_json(args.pruning, "pruning result") if args.pruning else None
    if pruning is not None:
        check_pruning(pruning, args.pruning)
    experiment = _read_json(args.experiment, "experiment result") if args.experiment else None
    if experiment is not None and not isinstance(experiment.get("summary", []), list):
        raise InputError(f"{args.experiment}: expected the JSON of headlab experiment")
    _check_focus_word(args.word)

    out_dir = Path(args.out)
    from headlab.errors import OutputExistsError
    from headlab.report import MARKER

    if out_dir.exists() and not args.overwrite and not (out_dir / MARKER).is_file():
        raise OutputExistsError(
            f"{out_dir} already exists and is not a headlab report (choose another --out, or "
            "pass --overwrite to replace it)"
        )

    def say(message: str) -> None:
        print(f"headlab report: {message}", file=sys.stderr, flush=True)

    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    treebank = read_conllu(args.treebank or sample_path("treebank"), limit=args.limit)
    gap = None if args.no_gap else read_gap(args.gap or sample_path("gap"), limit=args.limit)
    lm = load_model(args)
    native_note("headlab report")
    say(f"measuring the roles of {lm.n_layers * lm.n_heads} heads on {len(treebank)} sentences")
    roles = measure_roles(
        lm,
        treebank,
        gap=gap,
        frequencies=read_frequencies(sample_path("frequencies")),
        options=RoleOptions(replicates=args.replicates, progress=sys.stderr.isatty()),
    )
    if args.prune:
        pruning = _measure_curve(lm, say)
    sentences = [LESSON_SENTENCE, *(args.sentence or [])]
    sentences += [" ".join(s.words) for s in treebank if 6 <= len(s.words) <= 25][:4]
    out = write_report(
        lm,
        roles,
        args.out,
        sentences=sentences,
        focus_word=args.word,
        pruning=pruning,
        experiment=experiment,
        overwrite=args.overwrite,
        progress=say,
    )
    print(f"wrote {out / 'index.html'}")
    return 0


def _check_focus_word(word: str) -> None:
    """The viewer opens on ``word`` in the lesson's sentence (its first): refuse a word that is
    not there before any work, as ``headlab heads`` does."""
    from headlab.models.words import find_word, split_words

    words = [w for w, _, _ in split_words(LESSON_SENTENCE)]
    find_word(words, [False] * len(words), word)


def _measure_curve(lm: Any, say: Any) -> dict[str, Any]:
    from headlab.datasets import read_stsb, sample_path
    from headlab.errors import InputError
    from headlab.pruning.metrics import StsbMetric
    from headlab.pruning.progressive import progressive_prune

    if lm.causal:
        raise InputError("--prune measures STS-B, an encoder task; use headlab prune --curve")
    pairs = read_stsb(sample_path("stsb"))
    say("measuring the pruning curve on the bundled STS-B sample")
    search = progressive_prune(
        lm,
        StsbMetric([p for i, p in enumerate(pairs) if i % 3 != 0]),
        StsbMetric([p for i, p in enumerate(pairs) if i % 3 == 0]),
        fraction=0.9,
    )
    return {
        "model": lm.name,
        "metric": search.metric,
        "unit": search.unit,
        "importance": "gradient",
        "curve": [
            {
                "heads_removed": p.heads_removed,
                "fraction": p.fraction,
                "metric": p.metric,
                "loss": p.loss,
            }
            for p in search.points
        ],
    }
