"""The ``headlab`` command line: a thin layer over the library.

:mod:`headlab.cli.app` holds ``main(argv) -> int`` (parse, dispatch to one module per command,
errors to exit codes in one place) and ``run``, the console script; each command is a module
(``cli/NAME.py``: ``add_parser`` and ``run``: parse, call, print); the flags' types, the model's
loading and the one printer are ``_args``, ``_model`` and ``_output``. Nothing here imports
torch before a command that needs it runs, so ``headlab --help`` and ``headlab spec`` stay fast.
"""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.cli.app import build_parser as build_parser
    from headlab.cli.app import main as main
    from headlab.cli.app import run as run

__getattr__, __dir__, __all__ = attach(__name__, __file__)
