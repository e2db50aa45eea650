"""Test-only entry point: several `resstream` commands, one after another, in one process (or in
each rank of one torchrun job), so that one launch checks them all (tests/test_data_parallel.py).

`python tests/commands_launcher.py COMMANDS.json`: the file holds a list of argument lists. Each
runs as `resstream ARGS` would (`resstream.cli.main.main`); the first that exits non-zero ends the
process with its exit code, after a line naming it on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from resstream.cli.main import main


def run_all(commands: list[list[str]]) -> int:
    """Run each command in order; 0, or the exit code of the first that failed."""
    for index, args in enumerate(commands):
        code = main(args)
        if code != 0:
            sys.stderr.write(f"commands_launcher: command {index} ({' '.join(args[:1])}) exited {code}\n")
            return code
    return 0


if __name__ == "__main__":
    sys.exit(run_all(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))))
