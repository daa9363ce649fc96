"""The ``headlab`` command line's entry: the parser of every command and the one place errors
become exit codes.

``main(argv) -> int`` parses, dispatches to one module per command, and maps errors to exit
codes in one place: 0 success, 1 a headlab error (one line on stderr; the traceback with ``-v``),
2 a usage error. Data goes to stdout, logs and progress to stderr (``-q``/``--quiet``, before or
after the command's name, turns progress off). Nothing here imports torch before a command that
needs it runs, so ``headlab --help`` and ``headlab spec`` stay fast.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from headlab._version import __version__
from headlab.cli import (
    cards,
    circuit,
    compose,
    experiment,
    heads,
    kv,
    patch,
    prune,
    report,
    roles,
    serve,
    spec,
    train,
)
from headlab.errors import HeadlabError

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

COMMANDS = (
    report,
    heads,
    roles,
    patch,
    compose,
    circuit,
    cards,
    prune,
    kv,
    spec,
    train,
    experiment,
    serve,
)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, as every other error, pointing at ``--help`` for the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            EXIT_USAGE,
            f"{self.prog}: error: {message}{_suggestion(message)} (see {self.prog} --help)\n",
        )


def _suggestion(message: str) -> str:
    """``"; did you mean 'report'?"`` for an invalid choice close to a valid one, else ``""``."""

    match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if match is None:
        return ""
    choices = re.findall(r"'([^']*)'", match.group(2))
    close = difflib.get_close_matches(match.group(1), choices, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="headlab",
        description="Multi-head attention, opened up: see, measure and prune every head.",
    )
    parser.add_argument("--version", action="version", version=f"headlab {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log progress and show tracebacks"
    )
    quiet = "no progress on stderr (bars, stage lines); errors and notes still show"
    parser.add_argument("-q", "--quiet", action="store_true", help=quiet)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    for command_parser in sub.choices.values():
        # SUPPRESS: the command's own default would overwrite a flag given before its name
        command_parser.add_argument(
            "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=quiet
        )
        command_parser.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="log progress and show tracebacks",
        )
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps the subcommands in this action only
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the command they were given to, not by `headlab`
            command = _subparsers(parser).get(getattr(args, "command", None) or "", parser)
            command.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse exits 0 for --help/--version, 2 for usage errors
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    # transformers' own warnings (a text longer than the model, say) would come before
    # headlab's one-line error about the same thing; -v shows them
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "info" if args.verbose else "error")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.handler(args))
    except HeadlabError as exc:
        if args.verbose:
            raise
        # one write: under torchrun every rank says it, and print's two writes (the text, then
        # the newline) from two processes could interleave into one line
        sys.stderr.write(f"headlab: error: {exc}\n")
        sys.stderr.flush()
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("headlab: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """Console-script entry point."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `headlab spec --json | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_ERROR
    except OSError as exc:  # `--json > /dev/full`: the output could not be written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        where = f" ({exc.filename})" if exc.filename else ""
        sys.stderr.write(f"headlab: error: cannot write the output: {exc.strerror or exc}{where}\n")
        code = EXIT_ERROR
    sys.exit(code)
