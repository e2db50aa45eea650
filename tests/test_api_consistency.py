"""The Python API behaves alike across functions (issue 23, item 7).

* `resstream.simulate` returns a frozen `SimulationRun` (a mapping from label to result) whose
  `to_dict()` is exactly what `resstream simulate` writes to simulate.json.
* Every result's repr is a short summary (`resstream.reprs.summary`): a few lines naming the
  model and the headline number, however much data the result holds, built from the headline
  fields alone.
* The functions are quiet by default (`progress=False`); `progress=True` shows a bar, and every
  command of the CLI passes `progress` itself, so it keeps its bars unless `--quiet`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest

import resstream
from resstream.cli.main import main
from resstream.reprs import WIDTH, summary
from resstream.simulation import SimulationResult, SimulationRun
from tests.cli_support import strict_json

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

TEXT = "The cat sat on the mat and the dog"
SMALL = {"simulations": 200, "tokens": 4, "layers": 2}


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A short text (the built-in corpus takes seconds to tokenise)."""
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("To be, or not to be, that is the question. " * 40, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def grid() -> SimulationRun:
    return resstream.simulate(grid=True, **SMALL)


def check_short(text: str, *, lines: int = 8, chars: int = 700) -> None:
    assert text.count("\n") + 1 <= lines and len(text) <= chars, text


# --------------------------------------------------------------------------- the summary helper


class Thing:
    pass


def test_a_summary_fits_one_line_when_it_can() -> None:
    assert summary(Thing(), "model 'x'", "", "p 0.5") == "Thing(model 'x'; p 0.5)"


def test_a_long_or_nested_summary_puts_one_part_per_indented_line() -> None:
    long = "x" * WIDTH
    assert summary(Thing(), "a", long) == f"Thing(\n  a\n  {long}\n)"
    inner = summary(Thing(), "a", long)
    assert summary(Thing(), "outer", inner) == f"Thing(\n  outer\n  Thing(\n    a\n    {long}\n  )\n)"


# --------------------------------------------------------------------------- simulate


def test_simulate_returns_a_frozen_mapping_by_label(grid: SimulationRun) -> None:
    labels = [label for label, _ in grid.results]
    assert list(grid) == labels and len(grid) == 4 and labels[0] == "no LayerNorm"
    assert all(isinstance(grid[label], SimulationResult) for label in labels)
    assert grid[labels[2]] is grid.results[2][1] and dict(grid.items())[labels[3]] is grid.results[3][1]
    assert "LayerNorm, γ = 0" in grid and "nope" not in grid
    with pytest.raises(KeyError, match=r"no configuration 'no layernorm' \(did you mean 'no LayerNorm'\?\)"):
        grid["no layernorm"]
    with pytest.raises(KeyError, match=r"by position: `\.results\[i\]`"):
        grid[0]  # a position, not a label: the message says how
    with pytest.raises(dataclasses.FrozenInstanceError):
        grid.grid = False


def test_one_configuration_is_a_run_of_one(grid: SimulationRun) -> None:
    run = resstream.simulate(**SMALL)
    assert list(run) == ["LayerNorm, γ = 0"] and not run.grid
    assert run.to_dict()["label"] == "LayerNorm, γ = 0"
    assert [entry["label"] for entry in grid.to_dict()["configurations"]] == list(grid)


@pytest.mark.parametrize("flags", [[], ["--grid"]], ids=["one", "grid"])
def test_to_dict_is_what_the_command_writes(tmp_path: Path, capsys, flags: list[str]) -> None:
    args = ["--sims", "200", "--tokens", "4", "--layers", "2"]
    assert main(["simulate", "--quiet", *args, *flags, "--out", str(tmp_path)]) == 0, capsys.readouterr().err
    run = resstream.simulate(grid=bool(flags), **SMALL)
    assert strict_json(tmp_path / "simulate.json") == json.loads(json.dumps(run.to_dict()))


def test_a_simulation_run_prints_one_line_per_configuration(grid: SimulationRun) -> None:
    text = repr(grid)
    check_short(text)
    assert text.startswith("SimulationRun(\n  2 layers × 4 tokens, 200 simulations\n")
    for label, result in grid.items():
        assert f"{label}: ρ by layer {result.layers[0].trend.spearman.value:+.2f}" in text


# --------------------------------------------------------------------------- reprs


def _largest(entries):
    """The (name, score) with the largest |score|, the first of equals."""
    return max(entries, key=lambda entry: abs(getattr(entry[1], "value", entry[1])))


def test_attribute_prints_its_headline_in_a_few_lines() -> None:
    result = resstream.attribute(TEXT)
    text = repr(result)
    check_short(text)
    assert "model 'reference'" in text and f"target {result.target!r} (id {result.target_id})" in text
    assert f"p {result.probability:.4g}" in text and f"rank {result.rank}" in text
    name, score = _largest([(f"L{h.layer}.H{h.head}", h.dla) for h in result.heads])
    assert "largest |DLA|: " in text and f"head {name} {score:+.3g}" in text
    assert f"DLA residual {result.check.dla_residual:.1e}" in text
    # the same summary however many entries the lists hold, and from the headline fields alone
    bigger = dataclasses.replace(result, sources=result.sources * 1000, heads=result.heads * 1000)
    assert repr(bigger) == text
    unread = dataclasses.replace(
        result, sources=None, trajectory=None, query_contributions=None, linearity=None
    )
    assert repr(unread) == text


def test_corpus_attribution_prints_its_headline_in_a_few_lines(small_corpus: str) -> None:
    result = resstream.attribute_corpus(dataset=small_corpus, num_seqs=2, seq_len=16, candidates=4)
    text = repr(result)
    check_short(text)
    assert "model 'reference'" in text and f"{result.positions:,} positions" in text
    name, score = _largest([(f"L{n.layer}.N{n.neuron}", n.dla) for n in result.neurons])
    assert f"neuron {name} {score.value:+.3g}" in text
    assert repr(dataclasses.replace(result, heads=result.heads * 1000)) == text


def test_decompose_prints_without_reading_its_vectors() -> None:
    result = resstream.decompose(TEXT)
    text = repr(result)
    check_short(text, lines=4)
    assert "reference" in text and f"max |Σ − h| {result.residual:.1e}" in text
    assert repr(dataclasses.replace(result, vectors=None, state=None)) == text


def test_reports_of_several_results_nest_their_summaries(small_corpus: str) -> None:
    shift = resstream.shift(dataset=small_corpus, num_seqs=2, seq_len=16, decoder=["logit-lens", "embedding"])
    text = repr(shift)
    check_short(text)
    for result in shift.results:
        assert f"reference ({result.decoder}): shift layer" in text
    recency = resstream.recency(dataset=small_corpus, num_seqs=2, seq_len=8)
    text = repr(recency)
    check_short(text)
    assert "  RecencyResult(\n    'reference', 6 layers × 4 heads" in text and "ρ by layer" in text


def test_neurons_lists_a_few_neurons_and_the_largest_coefficient(small_corpus: str) -> None:
    result = resstream.neurons(layer=1, top=30, dataset=small_corpus, num_seqs=2, seq_len=16)
    text = repr(result)
    check_short(text, lines=5)
    assert "… (30 in all)" in text
    strongest = max(result.neurons, key=lambda n: n.max_activation)
    assert f"largest m {strongest.max_activation:.3g} (L1.N{strongest.neuron})" in text


# --------------------------------------------------------------------------- progress


API_WITH_PROGRESS = [
    name for name in resstream.__all__ if "progress" in inspect.signature(getattr(resstream, name)).parameters
]


#: The open stream's edits and `edited` (a context manager around the user's own calls) do no
#: long work of their own: they take no `progress`.
STREAM_EDITS = {"Add", "Apply", "Clamp", "Project", "Scale", "Set", "edited"}


def test_every_api_function_takes_progress() -> None:
    assert set(resstream.__all__) - STREAM_EDITS == set(API_WITH_PROGRESS)


@pytest.mark.parametrize("name", API_WITH_PROGRESS)
def test_every_api_function_is_quiet_by_default(name: str) -> None:
    assert inspect.signature(getattr(resstream, name)).parameters["progress"].default is False


def test_models_load_quietly_by_default() -> None:
    from resstream.api.inputs import LoadOptions

    assert LoadOptions().progress is False and LoadOptions.of({}).progress is False


def test_a_call_with_defaults_writes_nothing_and_progress_shows_bars(small_corpus: str, capfd) -> None:
    calls = {
        "simulate": lambda **kw: resstream.simulate(**SMALL, **kw),
        "shift": lambda **kw: resstream.shift(dataset=small_corpus, num_seqs=2, seq_len=16, **kw),
        "attribute": lambda **kw: resstream.attribute_corpus(
            dataset=small_corpus, num_seqs=2, seq_len=16, candidates=4, **kw
        ),
    }
    for desc, call in calls.items():
        capfd.readouterr()
        call()
        assert capfd.readouterr().err == "", desc
        call(progress=True)
        assert f"{desc} " in capfd.readouterr().err, desc


def test_the_simulate_command_keeps_its_bar(tmp_path: Path, capsys) -> None:
    args = ["--sims", "200", "--tokens", "4", "--layers", "2", "--out"]
    assert main(["simulate", *args, str(tmp_path / "bars")]) == 0
    assert "simulate LayerNorm, γ = 0" in capsys.readouterr().err
    assert main(["simulate", "--quiet", *args, str(tmp_path / "quiet")]) == 0
    assert "simulate LayerNorm" not in capsys.readouterr().err


def _gives_progress(value: ast.AST) -> bool:
    """Whether `value` is a dict literal with a "progress" key, or `options.api_kwargs(...)` of
    the command's `output` group (whose keywords are `progress`)."""
    if isinstance(value, ast.Dict):
        return "progress" in {key.value for key in value.keys if isinstance(key, ast.Constant)}
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "api_kwargs"
        and any(isinstance(arg, ast.Name) and arg.id == "output" for arg in value.args)
    )


def _progress_given(call: ast.Call, function: ast.AST) -> bool:
    """Whether `call` passes `progress=`: itself, in a ``**`` of `_gives_progress`, or in a
    `**name` assigned one in `function`."""
    if any(keyword.arg == "progress" for keyword in call.keywords):
        return True
    splats = [keyword.value for keyword in call.keywords if keyword.arg is None]
    if any(_gives_progress(splat) for splat in splats):
        return True
    names = {splat.id for splat in splats if isinstance(splat, ast.Name)}
    return any(
        isinstance(node, ast.Assign)
        and _gives_progress(node.value)
        and bool(names & {target.id for target in node.targets if isinstance(target, ast.Name)})
        for node in ast.walk(function)
    )


def test_every_command_passes_progress_to_the_api() -> None:
    """The API is quiet by default; a command that left `progress` out would lose its bars."""
    cli = Path(resstream.__file__).parent / "cli"
    calls = []
    for path in sorted(cli.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)):
            for call in (node for node in ast.walk(function) if isinstance(node, ast.Call)):
                target = call.func
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "resstream"
                    and target.attr in API_WITH_PROGRESS
                ):
                    calls.append((path.name, target.attr))
                    assert _progress_given(call, function), f"{path.name}: resstream.{target.attr}(...)"
    assert {"shift", "lens", "attribute", "attribute_corpus", "neurons", "recency", "simulate"} <= {
        name for _, name in calls
    }
