"""`python -m resstream`: the command-line interface."""

from resstream.cli.main import run

run()
