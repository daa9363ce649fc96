"""``python -m headlab`` runs the command-line interface."""

from headlab.cli import run

run()
