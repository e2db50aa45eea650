"""The package layout of docs/design.md: imports point downward only.

Every `import` of every module under src/resstream — at the top or inside a function — is
checked against the table below: a part of the package may import only the parts listed
for it. `models` is two parts: `models.adapters` (pure family mappings, near the bottom) and
model loading (`models/loading.py` and the package itself), which sits above `training` and
`data` because it loads resstream runs and tokenizers. `analysis` never imports `training`.
`reporting` reads training results through `training.records` (which itself reads nothing of
training but the metrics log, `training.metrics`, so no torch comes with it) and, for the
evaluation's notebook view only, `training.evaluate.report` (`reporting/evaluation.py`). `api`
may import `reporting` (results register their notebook views there) and `training` (`compare`
evaluates runs); `display` is the bottom-level mixin whose calls import the reporting layer by
name.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "resstream"

BOTTOM = {"errors", "io", "devices", "hub", "assets", "interrupts", "notices", "rundir", "resources", "reprs"}
BOTTOM |= {"display", "checks"}
ALLOWED: dict[str, set[str]] = {
    "cli": {
        "api",
        "reporting",
        "analysis",
        "analysis.interventions",
        "training",
        "training.records",
        "simulation",
        "models",
    }
    | {"models.adapters", "capture", "data", "study", "cli", "(root)", "distributed", "stream"}
    | BOTTOM,
    "study": {"reporting", "training.records", "models", "data"} | BOTTOM,
    "api": {
        "analysis",
        "analysis.interventions",
        "capture",
        "simulation",
        "models",
        "models.adapters",
        "data",
        "reporting",
    }
    | {"training", "training.records", "distributed", "stream"}
    | BOTTOM,
    # the open API over a user's model: the engine's operations and hook points, the capture
    # layer, loading a model by spec, tokens as text (data), and the reporting of its result
    "stream": {
        "analysis",
        "analysis.interventions",
        "capture",
        "models",
        "models.adapters",
        "reporting",
        "data",
    }
    | BOTTOM,
    "reporting": {
        "analysis",
        "analysis.interventions",
        "simulation",
        "training.records",
        "training.evaluate.report",
    }
    | BOTTOM,
    "analysis": {"models.adapters", "simulation"} | BOTTOM,
    # interventions run the model's own forward with the capture layer's hooks and edit it
    "analysis.interventions": {"analysis", "capture", "models.adapters", "simulation"} | BOTTOM,
    "models": {"models.adapters", "training", "training.records", "data"} | BOTTOM,
    "training": {"training.records", "training.metrics", "training.evaluate.report", "data", "distributed"}
    | BOTTOM,
    "training.metrics": BOTTOM,
    "training.records": {"training.metrics"} | BOTTOM,  # the on-disk formats, read by reporting
    # the evaluation's result type, which reporting draws (its scoring and plan come with it)
    "training.evaluate.report": {"training", "training.records", "training.metrics", "data", "distributed"}
    | BOTTOM,
    "simulation": BOTTOM,
    "capture": {"models.adapters"} | BOTTOM,
    "models.adapters": BOTTOM,
    "data": BOTTOM,
    "errors": set(),
    "io": {"errors"},
    "interrupts": set(),
    "notices": set(),
    "reprs": set(),
    "display": set(),
    "rundir": {"errors", "io", "interrupts", "resources"},
    # torchrun's process group and the data-parallel steps of the analyses (never `analysis`)
    "distributed": {"errors", "rundir", "devices"},
    "devices": {"errors", "checks"},
    "checks": {"errors"},
    "hub": {"errors"},
    "assets": {"errors"},
    "resources": {"errors"},
    "(root)": {"api", "stream"},
    "__main__": {"cli"},
}


def part_of(module: str) -> str:
    """The layout part of a dotted module name inside resstream ("resstream.a.b" -> "a")."""
    parts = module.split(".")[1:]
    if not parts or parts == ["__init__"]:
        return "(root)"
    if parts[0] == "models":
        return "models.adapters" if len(parts) > 1 and parts[1] == "adapters" else "models"
    if parts[:3] == ["training", "evaluate", "report"]:
        return "training.evaluate.report"
    if parts[:2] == ["analysis", "interventions"]:
        return "analysis.interventions"
    if parts[0] == "training" and len(parts) > 1 and parts[1] in ("records", "metrics"):
        return f"training.{parts[1]}"
    return parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every resstream import in the file, relative imports resolved."""
    found = []
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base == "resstream":  # `from resstream import hub`: the submodules themselves
                found += [(node.lineno, f"resstream.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return [(line, name) for line, name in found if name == "resstream" or name.startswith("resstream.")]


SOURCES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_downward(path: Path) -> None:
    source = part_of(module_name(path))
    assert source in ALLOWED, f"{source!r} has no row in the layout table"
    for line, target in imported_modules(path):
        part = part_of(target)
        if part == source:
            continue
        assert part in ALLOWED[source], (
            f"{path.relative_to(SRC)}:{line} imports {target} ({source} -> {part})"
        )


def test_the_table_knows_every_part() -> None:
    parts = {part_of(module_name(p)) for p in SOURCES}
    assert parts <= set(ALLOWED), parts - set(ALLOWED)


MODULES = {module_name(p): p for p in SOURCES}


def _runs_on_import(tree: ast.AST) -> list[ast.AST]:
    """The statements that importing a module executes, at any depth, less `if TYPE_CHECKING:`
    and `if __name__ == "__main__":` blocks (the latter runs only as the module `__main__`)."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') in (
            "TYPE_CHECKING",
            '__name__ == "__main__"',
        ):
            found += [n for child in node.orelse for n in (child, *_runs_on_import(child))]
            continue
        found += [node, *_runs_on_import(node)]
    return found


def _runtime_imports(module: str, path: Path) -> set[str]:
    """The modules of the package that importing `module` (or calling its functions) imports,
    with the packages above each (importing a.b.c runs a and a.b first)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in _runs_on_import(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base])
            names |= {
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names
            }
    targets = set()
    for name in (n for n in names if n.startswith("resstream")):
        parts = name.split(".")
        targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & MODULES.keys()
    return {t for t in targets if not (module == t or module.startswith(t + "."))}


def test_no_import_circle() -> None:
    """No module imports, directly or not, a module that imports it back (`study` runs commands
    through a runner the CLI hands it, so it never imports `cli`)."""
    graph = {module: _runtime_imports(module, path) for module, path in MODULES.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as circle:
        pytest.fail(f"import circle: {' -> '.join(circle.args[1])}")


#: The longest a module of the package may be: past it, a module holds more than one idea.
MAX_MODULE_LINES = 650


def test_no_module_is_longer_than_the_limit() -> None:
    lengths = {
        str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
        for path in SRC.rglob("*.py")
    }
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}
