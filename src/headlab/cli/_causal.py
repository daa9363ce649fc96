"""What ``patch``, ``compose`` and ``circuit`` share on the command line: the model they load,
where the prompts come from, where the results go; and :func:`request`, the library request
built from the flags (:mod:`headlab.causal.request`, :mod:`headlab.experiments.circuit_request`;
``roles``, ``heads`` and ``report`` build theirs with it too), whose checks run before any model
loads.

Nothing here imports torch (``headlab --help`` stays fast).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TypeVar

from headlab.cli._args import integer, text
from headlab.cli._model import MODEL_HELP, add_model_arguments
from headlab.models.names import DECODER

#: the built-in tasks (headlab.causal.generators.BUILTIN)
TASKS = ("ioi", "induction")
#: EAP-IG's points by default: headlab.causal.metric.IG_STEPS, repeated so that parsing imports
#: no torch (a test keeps the two equal)
IG_STEPS = 5

Request = TypeVar("Request")


def add_model(p: argparse.ArgumentParser) -> None:
    """``--model`` (default smollm2, a causal language model) and its neighbours."""
    p.add_argument(
        "--model", type=text("a model"), default=DECODER, help=f"{MODEL_HELP}; here default smollm2"
    )
    add_model_arguments(p)


def add_prompts(p: argparse.ArgumentParser, prompts_help: str, n: int | None = None) -> None:
    """``--task`` or ``--prompts`` (``prompts_help`` says what the file holds), ``--n`` (default
    ``n``; ``None``: left to the library, 24) and ``--seed`` of the built-in prompts."""
    source = p.add_mutually_exclusive_group()
    source.add_argument("--task", choices=TASKS, help="a built-in task (default ioi)")
    source.add_argument(
        "--prompts", type=text("a JSON Lines file"), metavar="FILE.jsonl", help=prompts_help
    )
    p.add_argument(
        "--n", type=integer(1, 100_000), default=n, help=f"built-in prompts (default {n or 24})"
    )
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=0, help="their seed (default 0)")


def add_outputs(
    p: argparse.ArgumentParser,
    figure: str,
    *,
    html: bool = False,
    csv: bool = False,
    json: str = "machine-readable output",
) -> None:
    """``--figure`` (a PNG: ``figure`` says of what), ``--html`` and ``--csv-out``/``--csv``
    where asked, and ``--json`` (``json`` says what it holds; not with ``--csv``)."""
    if html:
        p.add_argument("--html", type=text("an .html path"), help="write the circuit's page")
    p.add_argument("--figure", type=text("a PNG path"), help=figure)
    if csv:
        p.add_argument(
            "--csv-out", type=text("a CSV path"), help="write every head's effect as CSV"
        )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help=json)
    if csv:
        out.add_argument("--csv", action="store_true", help="every head's effect as CSV on stdout")


def request(cls: type[Request], args: argparse.Namespace, **given: object) -> Request:
    """The library's request ``cls`` (a dataclass whose fields are named as the command's
    flags) from the parsed flags, ``given`` taking the place of theirs (a repeatable flag's
    list as a tuple...); its checks run now."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    flags = {f.name: getattr(args, f.name) for f in fields if f.init and f.name not in given}
    return cls(**flags, **given)
