"""`python -m resstream`: the command-line interface."""

from resstream.cli.entry import run

run()
