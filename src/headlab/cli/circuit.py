"""``headlab circuit``: a behaviour's circuit, found automatically, measured on held-out prompts,
its heads named from evidence (:mod:`headlab.experiments.circuit`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from headlab.cli._args import integer, listed, share, text
from headlab.cli._causal import (
    IG_STEPS,
    add_model,
    add_outputs,
    add_prompts,
    request,
)
from headlab.cli._model import load_model
from headlab.cli._output import note, output
from headlab.cli._progress import progress_for


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "circuit",
        help="a behaviour's circuit: edges scored, cut, measured on held-out prompts",
        description=(
            "Scores every edge of the model's graph (embeddings, heads and MLPs to the heads' "
            "queries, keys and values, the MLPs and the logits) by EAP-IG or EAP on the "
            "discovery prompts, cuts it to circuits of growing size and runs each on held-out "
            "prompts with every other edge corrupted: faithfulness (LD_circuit - LD_corrupt) / "
            "(LD_clean - LD_corrupt). The circuit kept is the smallest reaching --target; on IOI "
            "prompts its heads are named by the IOI paper's classes where measurements support "
            "them. Default: SmolLM2-135M on 24 IOI prompts, measured on 24 held-out ones."
        ),
    )
    add_model(p)
    add_prompts(p, "discovery prompts, one JSON object a line: clean, corrupt, answer, distractor")
    p.add_argument(
        "--eval-prompts",
        type=text("a JSON Lines file"),
        metavar="FILE.jsonl",
        help="held-out prompts to measure on (default with --task: the task's held-out part, "
        "names and words the discovery prompts never use)",
    )
    p.add_argument(
        "--eval-n", type=integer(1, 100_000), help="built-in held-out prompts (default --n)"
    )
    p.add_argument(
        "--method",
        choices=("eap-ig", "eap"),
        default="eap-ig",
        help="eap-ig: gradients averaged over --steps points from the corrupted to the clean "
        "embeddings (default; Hanna et al. 2024); eap: at the clean run (Syed et al. 2023)",
    )
    p.add_argument("--steps", type=integer(1, 100), help=f"eap-ig's points ({IG_STEPS})")
    p.add_argument(
        "--search",
        choices=("greedy", "top", "learned"),
        default="greedy",
        help="greedy: from the logits down, an edge joins once its receiver is in (default); "
        "top: the edges of largest |score|, less those that lead nowhere; learned: a mask per "
        "edge learned by gradient descent to keep the behaviour with --mask-edges edges "
        "(edge pruning, Bhaskar et al. 2024)",
    )
    p.add_argument(
        "--mask-edges",
        type=integer(1, 10**9),
        metavar="N",
        help="with --search learned: the edges the masks aim for (default 5%% of the graph's)",
    )
    p.add_argument(
        "--mask-steps",
        type=integer(1, 100_000),
        metavar="N",
        help="with --search learned: optimiser steps, 8 prompts each (default 300)",
    )
    p.add_argument(
        "--sizes",
        type=listed(integer(0, 10**9), "edge counts separated by commas", "10,100,1000"),
        metavar="N,N,...",
        help="circuit sizes in edges to measure (default 1, 2, 3, 5, 7 x each power of ten)",
    )
    p.add_argument(
        "--target",
        type=share(one=True),
        default=0.8,
        help="keep the smallest circuit reaching this share of the logit difference (0.8)",
    )
    p.add_argument(
        "--no-classes", action="store_true", help="skip naming the heads (DLA, paths, attention)"
    )
    p.add_argument(
        "--roles",
        type=text("a file"),
        metavar="ROLES.json",
        help="headlab roles --json of the model: its induction, duplicate-token and "
        "previous-token heads are evidence for those classes (default: the model's cached run, "
        "where headlab roles or report kept one)",
    )
    p.add_argument("--top", type=integer(1, 10_000), default=15, help="edges listed (15)")
    add_outputs(p, "write the circuit as a PNG graph", html=True)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from headlab.experiments.circuit import circuit_text
    from headlab.experiments.circuit_request import CircuitRequest

    circuit = request(CircuitRequest, args)  # every check before the model loads
    lm = load_model(args, with_lm_head=True)
    with progress_for(args, "headlab circuit") as progress:
        found = circuit.run(lm, progress, notify=_note)  # --html and --figure written
    _gap_warnings(found.result)
    data = found.to_json()
    for path in (args.html, args.figure):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    output(args, data, lambda: circuit_text(data, args.top))
    return 0


def _gap_warnings(result: Any) -> None:
    """A line for each set of prompts, discovery or held-out, whose clean and corrupted runs
    prefer the same token, as headlab patch says it (:func:`gap_warning`)."""
    from headlab.causal.metric import gap_warning

    sets = (
        ("discovery", result.scores, "the senders' effects"),
        ("held-out", result.curve, "the circuits' faithfulness values"),
    )
    for which, measured, measures in sets:
        prompts = f"the {which} clean and corrupted prompts"
        warning = gap_warning(measured.clean, measured.corrupt, prompts=prompts, measures=measures)
        if warning:
            note("headlab circuit", warning, kind="warning: ")


def _note(line: str) -> None:
    note("headlab circuit", line, kind="")
