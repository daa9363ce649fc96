"""``headlab circuit``: a behaviour's circuit, found automatically, measured on held-out prompts,
its heads named from evidence (:mod:`headlab.experiments.circuit`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from headlab.cli._args import integer, text
from headlab.cli._model import MODEL_HELP, add_model_arguments, load_model
from headlab.cli._output import emit_json, show
from headlab.cli._progress import progress_for
from headlab.errors import DataFormatError, InputError
from headlab.models.names import DECODER

TASKS = ("ioi", "induction")
#: built-in prompts drawn by default
N_PROMPTS = 24
#: eap-ig's default points: headlab.causal.metric.IG_STEPS, repeated so that --help imports
#: no torch (a test keeps the two equal)
IG_STEPS = 5


def _sizes(value: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in value.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected edge counts separated by commas (10,100,1000), got {value!r}"
        ) from None
    if not sizes or sizes[0] < 0:
        raise argparse.ArgumentTypeError(f"expected counts of 0 or more, got {value!r}")
    return sizes


def _share(value: str) -> float:
    try:
        share = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {value!r}") from None
    if not 0.0 < share <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {value!r}")
    return share


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
    p.add_argument("--model", type=text("a model"), help=f"{MODEL_HELP}; here default smollm2")
    add_model_arguments(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--task", choices=TASKS, help="a built-in task (default ioi)")
    source.add_argument(
        "--prompts",
        type=text("a JSON Lines file"),
        metavar="FILE.jsonl",
        help="discovery prompts, one JSON object a line: clean, corrupt, answer, distractor",
    )
    p.add_argument(
        "--eval-prompts",
        type=text("a JSON Lines file"),
        metavar="FILE.jsonl",
        help="held-out prompts to measure on (default with --task: the task's held-out part, "
        "names and words the discovery prompts never use)",
    )
    p.add_argument("--n", type=integer(1, 100_000), help=f"built-in prompts ({N_PROMPTS})")
    p.add_argument(
        "--eval-n", type=integer(1, 100_000), help="built-in held-out prompts (default --n)"
    )
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=0, help="their seed (default 0)")
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
        choices=("greedy", "top"),
        default="greedy",
        help="greedy: from the logits down, an edge joins once its receiver is in (default); "
        "top: the edges of largest |score|, less those that lead nowhere",
    )
    p.add_argument(
        "--sizes",
        type=_sizes,
        metavar="N,N,...",
        help="circuit sizes in edges to measure (default 1, 2, 3, 5, 7 x each power of ten)",
    )
    p.add_argument(
        "--target",
        type=_share,
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
    p.add_argument("--html", type=text("an .html path"), help="write the circuit's page")
    p.add_argument("--figure", type=text("a PNG path"), help="write the circuit as a PNG graph")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


#: flags that only mean something beside another: (flag, its value, why it is ignored)
def _unused(args: argparse.Namespace) -> list[tuple[str, str]]:
    return [
        (flag, reason)
        for flag, given, reason in (
            ("--n", args.n is not None and args.prompts, "--prompts gives the prompts"),
            (
                "--eval-n",
                args.eval_n is not None and args.eval_prompts,
                "--eval-prompts gives them",
            ),
            ("--steps", args.steps is not None and args.method == "eap", "--method eap has none"),
            ("--roles", args.roles and args.no_classes, "--no-classes names no head"),
        )
        if given
    ]


def _check(args: argparse.Namespace) -> None:
    outputs = [("--html", args.html, ".html"), ("--figure", args.figure, ".png")]
    for flag, value, suffix in outputs:
        if value is None:
            continue
        path = Path(value)
        if path.suffix.lower() != suffix:
            raise InputError(f"{flag} {value}: expected a {suffix} file")
        if path.is_dir():
            raise InputError(f"{flag} {value}: is a folder; expected a {suffix} file")
        if not path.parent.is_dir():
            raise InputError(f"{flag} {value}: folder {path.parent} does not exist")
    if args.html and args.figure and Path(args.html).resolve() == Path(args.figure).resolve():
        raise InputError("--html and --figure name the same file")
    for flag, reason in _unused(args):
        raise InputError(f"{flag} has no effect here: {reason}")
    if args.prompts and not args.eval_prompts:
        raise InputError(
            "--prompts finds the circuit; add --eval-prompts FILE.jsonl to measure it on "
            "prompts it was not found on"
        )
    from headlab.causal.tasks import read_prompts

    if args.roles:
        from headlab.roles.results import read_roles_json

        read_roles_json(args.roles)
    for flag in ("prompts", "eval_prompts"):
        if getattr(args, flag):
            read_prompts(getattr(args, flag))  # a malformed file costs no model load


def run(args: argparse.Namespace) -> int:
    _check(args)
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from headlab.causal.generators import builtin_prompts
    from headlab.causal.patching import as_task
    from headlab.causal.tasks import encode_task
    from headlab.experiments.circuit import circuit_text, find_circuit

    if args.model is None:
        args.model = DECODER
    lm = load_model(args, with_lm_head=True)
    name, n = args.task or "ioi", args.n or N_PROMPTS
    task = as_task(lm, args.prompts or name, n=n, seed=args.seed)
    if args.eval_prompts:
        held = as_task(lm, args.eval_prompts)
    else:
        drawn = builtin_prompts(
            name, lm.tokenizer, args.eval_n or n, seed=args.seed, part="held-out"
        )
        held = encode_task(lm.tokenizer, drawn, name=f"{name} held-out")
    roles, roles_from = _roles(args, lm)
    with progress_for(args, "headlab circuit") as progress:
        result = find_circuit(
            lm,
            task,
            held,
            method=args.method,
            steps=args.steps or IG_STEPS,
            search=args.search,
            sizes=args.sizes,
            target=args.target,
            classes=not args.no_classes,
            roles=roles,
            progress=progress,
        )
    data = {**result.to_json(), "roles_from": roles_from}
    if not result.reached:
        print(
            f"headlab circuit: no circuit measured reaches {args.target:.0%} of the logit "
            f"difference; kept the most faithful, {data['circuit']['edges']} edges at "
            f"{data['circuit']['faithfulness']:.1%} (try more --sizes)",
            file=sys.stderr,
        )
    page = None
    if args.html:
        from headlab.page.circuit import circuit_html

        page = circuit_html(data)  # built before any file is written
    if args.figure:
        from headlab.causal.figure import write_circuit

        write_circuit(data, args.figure)
    if page is not None:
        from headlab.outputs import write_text_atomic

        write_text_atomic(args.html, page)
    if args.json:
        emit_json(data)
    else:
        show(circuit_text(data, args.top))
    return 0


def _roles(args: argparse.Namespace, lm: Any) -> tuple[Any, str | None]:
    """The roles run given, else the model's cached one (``None`` without either), checked
    against the model's heads."""
    from headlab.experiments.circuit import roles_by_head
    from headlab.roles.results import read_roles_json
    from headlab.roles.workflow import cached_roles_path

    path = Path(args.roles) if args.roles else cached_roles_path(lm.name)
    if args.no_classes or not path.is_file():
        return None, None
    try:
        data = read_roles_json(path)
        roles = roles_by_head(data, list(lm.layout.heads_per_layer))
    except (InputError, DataFormatError) as exc:
        if args.roles:
            raise InputError(f"--roles {path}: {exc}") from None
        return None, None  # a cached run that cannot be read, or of another model: no evidence
    if data["model"] != lm.name:
        print(
            f"headlab circuit: --roles {path} was measured on {data['model']!r}, the model is "
            f"{lm.name!r}; its heads match in number, so its roles are used",
            file=sys.stderr,
        )
    return roles, str(path)
