"""One component name everywhere (issue 38): every name `attribute`, `composition` and `routes`
write — in the terminal, CSV, JSON, the pages and the figures' text — is spelled in the
intervention grammar (`resstream.analysis.names`, parsed by
`analysis.interventions.components`), so a name read anywhere can be handed to `ablate` as
it is. One small run of each command, in-process; every file it writes is read."""

from __future__ import annotations

import contextlib
import csv
import io
import re
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from resstream.analysis import names
from resstream.analysis.interventions.components import Component, ComponentSpace, parse_component
from resstream.cli.main import main
from resstream.errors import UsageError

FAST = ["--device", "cpu", "--quiet"]
TEXT = "KING HENRY: Come, come, my lord"
#: Spellings used before issue 38, none of which may appear again.
OLD_NAMES = {
    "a source as L0.H2<-3": re.compile(r"H\d+<-\d"),
    "a pair of heads as 2.1 -> 5.2": re.compile(r"(?<![\w.])\d+\.\d+ -> \d+\.\d+"),
    "a sub-layer as L0 MLP or L0 attn": re.compile(r"\bL\d+ (?:attn|MLP|mlp)\b"),
    'the embedding as "embed"': re.compile(r"\"component\": \"embed\"|^embed,", re.MULTILINE),
}
#: Anything that looks like a component name: L<digits>.<something>.
NAME_LIKE = re.compile(r"\bL\d+\.[A-Za-z][\w@.]*")
#: Terms of a decomposition that are not components (no intervention acts on them alone).
BIASES = re.compile(r"^L\d+\.(?:attn|mlp|norm)_bias$")
#: Large enough for every index of the built-in model.
SPACE = ComponentSpace(n_layers=64, n_heads=64, d_ff=1 << 16)
#: CSV columns whose values are component names (or the word "residual" for a residual edge).
NAME_COLUMNS = ("component", "label")

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str, list[str]]]:
    """Per command: its output folder, what it printed and the text of every figure it saved."""
    commands = {
        "attribute": ["attribute", "--text", TEXT, "--top", "4"],
        "composition": ["composition", "--samples", "8", "--top", "5"],
        "routes": ["routes", "--text", TEXT],
    }
    found = {}
    for name, args in commands.items():
        out = tmp_path_factory.mktemp(name) / "out"
        texts: list[str] = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Figure, "savefig", _recording(Figure.savefig, texts))
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                assert main([*args[:1], *FAST, *args[1:], "--out", str(out)]) == 0
        found[name] = (out, printed.getvalue(), texts)
    return found


def _recording(save, texts: list[str]):
    """`Figure.savefig` that first records every text of the figure: titles, labels, tick
    labels, annotations."""

    def savefig(figure: Figure, *args, **kwargs):
        from matplotlib.text import Text

        texts.extend(t.get_text() for t in figure.findobj(Text))
        for ax in figure.axes:
            texts.extend(t.get_text() for t in [*ax.get_xticklabels(), *ax.get_yticklabels()])
        return save(figure, *args, **kwargs)

    return savefig


def _is_a_name(name: str) -> bool:
    """Whether `name` spells a component of the grammar, or a bias term of a decomposition."""
    if BIASES.match(name) or name in ("residual", names.EMBEDDING):
        return True
    try:
        parse_component(name, SPACE)
    except UsageError:
        return False
    return True


def _problems(text: str) -> list[str]:
    """Every old spelling in `text`, and every name-like token the grammar does not spell."""
    found = [f"{what}: {m.group(0)!r}" for what, pattern in OLD_NAMES.items() for m in pattern.finditer(text)]
    for match in NAME_LIKE.finditer(text):
        token = match.group(0).rstrip(".")
        if not _is_a_name(token):
            found.append(f"not a component name: {token!r}")
    return found


def _csv_names(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [row[column] for row in rows for column in NAME_COLUMNS if row.get(column)]


@pytest.mark.parametrize("command", ["attribute", "composition", "routes"])
def test_every_output_spells_components_in_the_grammar(runs, command: str) -> None:
    out, printed, figures = runs[command]
    problems = {"printed": _problems(printed), "figures": _problems("\n".join(figures))}
    for path in sorted(out.iterdir()):
        if path.suffix in (".csv", ".json", ".html"):
            problems[path.name] = _problems(path.read_text(encoding="utf-8"))
        if path.suffix == ".csv":
            problems[path.name] += [f"{v!r} in a name column" for v in _csv_names(path) if not _is_a_name(v)]
    assert figures and not {where: found for where, found in problems.items() if found}


def test_a_corpus_attribution_prints_and_draws_names_in_the_grammar() -> None:
    """Corpus mode's lines and figures (its CSVs hold no names: layer, head and neuron columns)."""
    from resstream.reporting.attribute import attribute_figures, terminal_summary
    from tests.test_reporting_attribute import corpus

    result = corpus()
    texts: list[str] = []
    for _, draw in attribute_figures(result):
        _recording(lambda *_args, **_kwargs: None, texts)(draw())
    lines = "\n".join(terminal_summary(result))
    assert "L2.mlp" in lines and "L0.N300" in "\n".join(texts)
    assert not _problems(lines) and not _problems("\n".join(texts))


def test_the_runs_do_write_names_to_check(runs) -> None:
    """The check above reads real names: sources, pairs of heads and route terms are there."""
    attribute, _, _ = runs["attribute"]
    assert re.search(r"\"component\": \"L\d+\.H\d+\.S\d+\"", (attribute / "attribute.json").read_text())
    assert "emb" in _csv_names(attribute / "query_contributions.csv")
    _, printed, figures = runs["composition"]
    assert re.search(r"\n  L\d+\.H\d+ -> L\d+\.H\d+  0\.", printed) and "L0.H0" in figures
    routes, printed, figures = runs["routes"]
    assert re.search(r"L\d+\.H\d+\.S\d+ ", printed) and "L0.attn" in figures
    assert any(re.fullmatch(r"L\d+\.H\d+\.S\d+", v) for v in _csv_names(routes / "routes.csv"))


def test_the_grammar_parses_every_name_the_naming_functions_write() -> None:
    """`analysis.names` and the parser agree on every kind (the parser is the grammar's other half)."""
    cases = {
        names.EMBEDDING: Component(-1, "emb"),
        names.sublayer_name(3, "attn"): Component(3, "attn"),
        names.head_name(3, 2): Component(3, "head", 2),
        names.source_name(3, 2, 7): Component(3, "source", 2, source=7),
        names.neuron_name(5, 1031): Component(5, "neuron", 1031),
        names.residual_name(2, 5): Component(2, "resid", position=5),
    }
    for name, component in cases.items():
        assert parse_component(name, SPACE) == component and component.name == name
    assert names.pair_name(names.head_name(2, 1), names.head_name(5, 2)) == "L2.H1 -> L5.H2"
