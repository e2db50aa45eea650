"""The example notebooks under examples/: committed without outputs, with a title, listed in
docs/notebooks.md (fast); and each executed headless in a fresh kernel of this environment, where
no cell may raise and every cell tagged "result" must display a result object as HTML (slow).

A cell tagged "result" (cell metadata ``tags: ["result"]``) ends with a result object; its
display is the fragment `resstream.reporting.notebook.result_html` makes, whose outer element
has the class ``resstream-result``. A notebook may write only into a temporary directory of its
own: its working directory and resstream's cache (RESSTREAM_CACHE) must stay empty. Each
notebook's execution time is printed (`pytest -s`) for docs/timings.md. Where
RESSTREAM_EXECUTED_NOTEBOOKS names a folder, each executed notebook is written there, for the
documentation site to render without running the notebooks again (docs/hooks.py, .ci/run).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
#: The class of the outer element of every result's notebook display.
RESULT_CLASS = "resstream-result"
#: Seconds any one cell may take before the execution fails.
CELL_TIMEOUT = 300


def read(path: Path) -> Any:
    """The notebook at `path` (nbformat 4)."""
    return nbformat.read(path, as_version=4)


def code_cells(notebook: Any) -> list[Any]:
    """The notebook's code cells, in order."""
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def result_cells(notebook: Any) -> list[Any]:
    """The code cells tagged "result": they end with a result object that displays itself."""
    return [cell for cell in code_cells(notebook) if "result" in cell.metadata.get("tags", [])]


def test_there_are_seven_examples():
    assert [path.name for path in NOTEBOOKS] == [
        "01_causal_shift.ipynb",
        "02_who_wrote_it.ipynb",
        "03_neurons_and_composition.ipynb",
        "04_residual_attenuation.ipynb",
        "05_recency_simulation.ipynb",
        "06_does_it_matter.ipynb",
        "08_open_stream.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_committed_clean(path: Path):
    notebook = read(path)
    nbformat.validate(notebook)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    first = notebook.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), "first cell: a markdown title"
    for index, cell in enumerate(code_cells(notebook)):
        assert cell.outputs == [], f"code cell {index} has outputs: strip them"
        assert cell.execution_count is None, f"code cell {index} has an execution count: strip it"
    assert result_cells(notebook), "no cell is tagged 'result': nothing checks the display"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_listed_in_the_docs(path: Path):
    assert f"examples/{path.name}" in (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8")


#: A number of notebooks in words, as the README and docs/timings.md say it ("five example
#: notebooks", "the five notebooks executed", "the five, kernel starts included").
COUNT_IN_WORDS = re.compile(
    r"\b(one|two|three|four|five|six|seven|eight|nine|ten)(?= (?:example )?notebooks\b|, kernel starts)",
    re.IGNORECASE,
)
NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def test_the_docs_count_the_notebooks_there_are():
    for name in ("README.md", "docs/timings.md"):
        counts = COUNT_IN_WORDS.findall((ROOT / name).read_text(encoding="utf-8"))
        assert counts, f"{name} no longer counts the notebooks: update this test"
        for word in counts:
            assert NUMBER_WORDS.index(word.lower()) + 1 == len(NOTEBOOKS), f"{name} says {word} notebooks"


def html_outputs(cell: Any) -> list[str]:
    """The text/html of every rich output of an executed cell."""
    found = []
    for output in cell.outputs:
        html = output.get("data", {}).get("text/html") if output.output_type != "stream" else None
        if html is not None:
            found.append(html if isinstance(html, str) else "".join(html))
    return found


def execute(notebook: Any, where: Path) -> float:
    """Run every cell of `notebook` in a fresh python3 kernel whose working directory is
    `where` (the environment is this process's); seconds taken. A cell that raises fails."""
    from nbclient import NotebookClient

    client = NotebookClient(
        notebook, kernel_name="python3", timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(where)}}
    )
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    where, cache = tmp_path / "cwd", tmp_path / "cache"
    where.mkdir()
    cache.mkdir()
    monkeypatch.setenv("RESSTREAM_CACHE", str(cache))  # the kernel inherits this environment
    notebook = read(path)
    seconds = execute(notebook, where)
    print(f"\n{path.name}: executed in {seconds:.1f} s")
    for cell in result_cells(notebook):
        shown = [html for html in html_outputs(cell) if RESULT_CLASS in html]
        assert shown, f"cell {cell.id} displayed no result:\n{cell.source}"
        assert "<img" in "".join(shown) or "<table" in "".join(shown)
    assert not list(where.iterdir()), "the notebook wrote into its working directory"
    assert not list(cache.iterdir()), "the notebook wrote into resstream's cache (use a temporary directory)"
    keep = os.environ.get("RESSTREAM_EXECUTED_NOTEBOOKS")
    if keep:
        copy = Path(keep) / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, copy)
