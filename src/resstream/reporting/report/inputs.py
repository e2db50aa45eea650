"""What `resstream report` reads: `find_outputs(paths)` recognises what resstream commands
left in each directory: shift (shift.json), lens (lens.json), sweep (sweep.json), eval
(eval.json), compare (compare.json), misalignment (misalignment.json), or a whole reproduction
(reproduce.json, whose stage folders shift/*/, lens/*/, sweep/, eval/*/, compare/ and
misalignment/ are searched instead). A file that is there but is not what its command writes
is refused in one line (`UsageError`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream.errors import UsageError
from resstream.reporting.misalignment import FORMAT as MISALIGNMENT_FORMAT
from resstream.rundir import RUN_FILE
from resstream.training.records import SWEEP_FORMAT, read_json

__all__ = [
    "OUTPUT_FILES",
    "REPRODUCTION_FILE",
    "STAGE_FOLDERS",
    "Output",
    "ReportInputs",
    "find_outputs",
]

REPRODUCTION_FILE = "reproduce.json"
#: The file each kind of output is recognised by, in the order the report shows them.
OUTPUT_FILES: dict[str, str] = {
    "lens": "lens.json",
    "shift": "shift.json",
    "sweep": "sweep.json",
    "compare": "compare.json",
    "eval": "eval.json",
    "misalignment": "misalignment.json",
}
#: Where a reproduction keeps each kind of output (folders below its directory; * = any).
STAGE_FOLDERS: dict[str, str] = {
    "lens": "lens/*",
    "shift": "shift/*",
    "sweep": "sweep",
    "compare": "compare",
    "eval": "eval/*",
    "misalignment": "misalignment",
}


@dataclass(frozen=True)
class Output:
    """One command's output found in a directory: its kind, its file's content and the
    run.json beside it (None when there is none)."""

    kind: str
    directory: Path
    data: dict[str, Any]
    record: dict[str, Any] | None = None


@dataclass(frozen=True)
class ReportInputs:
    """Everything `find_outputs` recognised: the outputs, and the reproduce.json of each
    reproduction given (its scale)."""

    outputs: tuple[Output, ...]
    reproductions: tuple[Output, ...] = ()

    def of(self, kind: str) -> tuple[Output, ...]:
        """The outputs of one kind, in the order found."""
        return tuple(output for output in self.outputs if output.kind == kind)

    @property
    def directories(self) -> tuple[Path, ...]:
        """Every directory something was read from, each once."""
        found = [o.directory for o in (*self.reproductions, *self.outputs)]
        return tuple(dict.fromkeys(found))


def _shape_problem(kind: str, data: Any) -> str | None:
    """Why `data` is not the file `resstream <kind>` writes (None when it is)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    wanted = {
        "lens": ("positions", list),
        "shift": ("models", list),
        "compare": ("rows", list),
        "eval": ("benchmarks", list),
    }
    if kind in wanted:
        key, kind_of = wanted[kind]
        return None if isinstance(data.get(key), kind_of) else f"no {key!r} list"
    expected = {"sweep": SWEEP_FORMAT, "misalignment": MISALIGNMENT_FORMAT}[kind]
    return None if data.get("format") == expected else f"its format is not {expected!r}"


def _read_output(kind: str, directory: Path) -> Output | None:
    """The output of `kind` in `directory`, None when its file is absent; UsageError when the
    file is there but is not what that command writes (e.g. a tuned lens's lens.json)."""
    path = directory / OUTPUT_FILES[kind]
    data = read_json(path)
    if data is None:
        return None
    problem = _shape_problem(kind, data)
    if problem is not None:
        raise UsageError(f"{str(path)!r} is not the {path.name} `resstream {kind}` writes ({problem})")
    record = read_json(directory / RUN_FILE)
    return Output(kind, directory, data, record if isinstance(record, dict) else None)


def _outputs_in(directory: Path) -> list[Output]:
    """The outputs directly in `directory`."""
    found = (_read_output(kind, directory) for kind in OUTPUT_FILES)
    return [output for output in found if output is not None]


def _stage_outputs(root: Path) -> list[Output]:
    """The outputs in a reproduction's stage folders."""
    outputs = []
    for kind, pattern in STAGE_FOLDERS.items():
        for folder in sorted(p for p in root.glob(pattern) if p.is_dir()):
            output = _read_output(kind, folder)
            if output is not None:
                outputs.append(output)
    return outputs


def _looked_for(reproduction: bool) -> str:
    """The files `find_outputs` looks for, as a list in words."""
    if reproduction:
        names = [f"{STAGE_FOLDERS[k]}/{OUTPUT_FILES[k]}" for k in OUTPUT_FILES]
    else:
        names = [*OUTPUT_FILES.values(), REPRODUCTION_FILE]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _checked_directory(path: str | Path) -> Path:
    directory = Path(path)
    if not directory.exists():
        raise UsageError(f"{str(directory)!r} does not exist; give directories that resstream commands wrote")
    if not directory.is_dir():
        raise UsageError(f"{str(directory)!r} is a file; give the directory that holds it")
    return directory


def find_outputs(paths: Sequence[str | Path]) -> ReportInputs:
    """The known outputs in each of `paths` (module docstring). UsageError, in one line naming
    the directory and the files looked for, when one holds none of them."""
    if not paths:
        raise UsageError("give at least one directory of resstream outputs")
    outputs: dict[tuple[Path, str], Output] = {}
    reproductions: list[Output] = []
    for path in paths:
        directory = _checked_directory(path)
        state = read_json(directory / REPRODUCTION_FILE)
        found = _stage_outputs(directory) if state is not None else _outputs_in(directory)
        if not found:
            what = "the reproduction" if state is not None else "the directory"
            raise UsageError(
                f"{what} {str(directory)!r} holds none of the outputs `resstream report` reads; "
                f"looked for {_looked_for(state is not None)}"
            )
        if state is not None:
            reproductions.append(Output("reproduce", directory, state if isinstance(state, dict) else {}))
        for output in found:
            outputs.setdefault((output.directory.resolve(), output.kind), output)
    return ReportInputs(tuple(outputs.values()), tuple(reproductions))
