"""The documentation site (mkdocs.yml, docs/hooks.py): its docstring check, its link rewriting,
the CLI reference it renders, and (slow) `mkdocs build --strict` of the real site, which passes,
and of a copy with a broken link and an unknown documented name, which fails.

Skipped where the `docs` extra (mkdocs, mkdocstrings, griffe) is not installed."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
griffe = pytest.importorskip("griffe")

from mkdocs.structure.files import File, Files  # noqa: E402

from tests.chromium import Browser, chromium_binary  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _load_hooks():
    """docs/hooks.py as a module (it lives outside the package, where mkdocs loads it from)."""
    spec = importlib.util.spec_from_file_location("resstream_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()

SYNTHETIC = '''
"""A module."""
from dataclasses import dataclass

def documented():
    """Has one."""

def bare():
    pass

def _private():
    pass

@dataclass(frozen=True)
class Result:
    """A result."""

    value: int  # a field: described by the class docstring

    @property
    def documented_property(self) -> int:
        """Has one."""
        return 1

    @property
    def bare_property(self) -> int:
        return 1

    def documented_method(self) -> None:
        """Has one."""

    def bare_method(self) -> None:
        pass

    def _helper(self) -> None:
        pass

class Bare:
    def method(self) -> None:
        """Has one."""
'''


def test_undocumented_names_the_public_names_without_a_docstring():
    with griffe.temporary_visited_module(SYNTHETIC, module_name="synthetic") as module:
        assert hooks.undocumented(module["documented"]) == []
        assert hooks.undocumented(module["bare"]) == ["synthetic.bare"]
        assert hooks.undocumented(module["Result"]) == [
            "synthetic.Result.bare_property",
            "synthetic.Result.bare_method",
        ]
        assert hooks.undocumented(module["Bare"]) == ["synthetic.Bare"]
        assert sorted(hooks.undocumented(module)) == [
            "synthetic.Bare",
            "synthetic.Result.bare_method",
            "synthetic.Result.bare_property",
            "synthetic.bare",
        ]


def test_the_check_warns_for_each_documented_name_without_a_docstring_or_target():
    with griffe.temporary_visited_module(SYNTHETIC, module_name="synthetic") as module:
        check = hooks.DocstringCheck(module)
        page = (
            "# API\n\n::: synthetic.documented\n\n::: synthetic.Result\n\n::: synthetic.gone\n\n"
            "```\n::: synthetic.bare\n```\n"  # in a code block: not a directive
        )
        warnings = check.page(page, "api.md")
    assert warnings == [
        "api.md: synthetic.Result.bare_property has no docstring",
        "api.md: synthetic.Result.bare_method has no docstring",
        "api.md: '::: synthetic.gone' names nothing in synthetic",
    ]
    assert check.documented == {"synthetic.documented", "synthetic.Result"}


def test_the_check_warns_for_an_exported_function_or_its_result_left_out():
    package = {
        "__init__.py": '"""Package."""\nfrom pkg.api import run, other\n__all__ = ["run", "other"]\n',
        "api.py": '"""API."""\nclass Report:\n    """R."""\n\ndef run() -> Report:\n    """Run."""\n\n'
        'def other() -> int:\n    """Other."""\n',
    }
    with griffe.temporary_visited_package("pkg", package) as pkg:
        check = hooks.DocstringCheck(pkg)
        assert check.page("::: pkg.run\n", "api.md") == []  # documented under its public name
        assert check.coverage() == [
            "pkg.api.Report is not in the API reference (pkg.run returns it): "
            "add '::: pkg.api.Report' to docs/reference/api.md",
            "pkg.api.other is not in the API reference (pkg.other is in pkg.__all__): "
            "add '::: pkg.api.other' to docs/reference/api.md",
        ]
        check.page("::: pkg.api.Report\n::: pkg.other\n", "api.md")
        assert check.coverage() == []


OUTSIDE = {
    "README.md": "index.md",
    "CONTRIBUTING.md": "contributing.md",
    "examples/a.ipynb": "examples/a.ipynb",
}


@pytest.mark.parametrize(
    ("target", "page", "expected"),
    [
        ("docs/metrics.md#the-shift", ("README.md", "index.md"), "metrics.md#the-shift"),
        ("docs/img/x.png", ("README.md", "index.md"), "img/x.png"),
        ("CONTRIBUTING.md", ("README.md", "index.md"), "contributing.md"),
        ("examples/", ("README.md", "index.md"), "notebooks.md"),  # the folder: the page listing it
        # a file the site does not publish: left as written, for mkdocs to report
        ("src/resstream/cli/main.py", ("README.md", "index.md"), "src/resstream/cli/main.py"),
        ("docs/design.md", ("CONTRIBUTING.md", "contributing.md"), "design.md"),
        ("../examples/a.ipynb", ("docs/notebooks.md", "notebooks.md"), "examples/a.ipynb"),
        ("../README.md#quick-start", ("docs/metrics.md", "metrics.md"), "index.md#quick-start"),
        ("metrics.md", ("docs/metrics.md", "metrics.md"), "metrics.md"),
        ("../metrics.md", ("docs/reference/api.md", "reference/api.md"), "../metrics.md"),
        ("https://example.org/docs/x.md", ("README.md", "index.md"), "https://example.org/docs/x.md"),
        ("#quick-start", ("README.md", "index.md"), "#quick-start"),
    ],
)
def test_site_link_rewrites_a_repository_link_for_the_site(target, page, expected):
    assert hooks.site_link(target, page[0], page[1], OUTSIDE) == expected


def test_rewrite_links_leaves_code_blocks_alone():
    markdown = (
        '[m](docs/metrics.md) ![i](docs/img/a.png) <img src="docs/img/b.png">\n\n'
        "```\n[m](docs/metrics.md)\n```\n"
    )
    assert hooks.rewrite_links(markdown, "README.md", "index.md", OUTSIDE) == (
        '[m](metrics.md) ![i](img/a.png) <img src="img/b.png">\n\n```\n[m](docs/metrics.md)\n```\n'
    )


def test_a_notebooks_links_become_site_urls_and_a_missing_target_is_reported(tmp_path):
    def file(path: str) -> File:
        return File(path, str(tmp_path), str(tmp_path / "site"), use_directory_urls=False)

    files = Files([file("metrics.md"), file("img/a.png"), file("examples/a.ipynb")])
    content = (
        '<a href="../docs/metrics.md#the-shift">m</a> <img src="../docs/img/a.png"> '
        '<a href="../docs/gone.md">g</a> <img src="data:image/png;base64,AAAA"> <a href="#top">t</a> '
        '<a href="https://example.org">e</a>'
    )
    rewritten, broken = hooks.notebook_links(content, "examples/a.ipynb", files, OUTSIDE)
    assert rewritten == (
        '<a href="../metrics.html#the-shift">m</a> <img src="../img/a.png"> '
        '<a href="../docs/gone.md">g</a> <img src="data:image/png;base64,AAAA"> <a href="#top">t</a> '
        '<a href="https://example.org">e</a>'
    )
    assert broken == ["../docs/gone.md"]


def test_only_an_unresolved_dotted_path_stays_a_warning():
    keep = hooks.IndexingIsNotAReference().filter

    def record(identifier: str) -> logging.LogRecord:
        message = f"simulation.md: Could not find cross-reference target '{identifier}'"
        return logging.LogRecord(
            "mkdocs.plugins.mkdocs_autorefs", logging.WARNING, "", 0, message, None, None
        )

    assert not keep(record("j+1")) and not keep(record("i − δ")) and not keep(record("0"))
    assert keep(record("resstream.display.Displayable"))


def test_the_cli_reference_has_every_command_and_option_with_its_default():
    import typer

    from resstream.cli.main import app

    page = hooks.cli_reference()
    group = typer.main.get_command(app)
    context = group.context_class(group, info_name="resstream")
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert f"\n## resstream {name}\n" in page
        sub = command.context_class(command, info_name=name, parent=context)
        for param in command.get_params(sub):
            if param.get_help_record(sub) is not None and param.param_type_name == "option":
                assert f">{', '.join(param.opts)}" in page, (name, param.opts)
    shift = page.split("\n## resstream shift\n")[1].split("\n## ")[0]
    assert "--top-k</code></td><td><code>int</code></td><td><code>5</code></td>" in shift
    assert "--out</code></td><td><code>path</code></td><td></td><td>Output directory" in shift  # --json
    assert "Required, except with --json" in shift
    train = page.split("\n## resstream train\n")[1].split("\n## ")[0]
    assert "--out</code></td><td><code>path</code></td><td><code>required</code></td>" in train
    assert "\\[" not in page  # Rich's escaped bracket is shown as a bracket


def _notebook(path: Path, code: str, output: str | None = None) -> None:
    cell = {"cell_type": "code", "source": [code], "metadata": {}, "outputs": [], "execution_count": None}
    if output is not None:
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [output]}]
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_a_notebook_page_renders_its_executed_copy_when_a_folder_of_them_is_named(tmp_path):
    repository, executed = tmp_path / "repo", tmp_path / "executed"
    (repository / "examples").mkdir(parents=True)
    (executed / "examples").mkdir(parents=True)
    _notebook(repository / "examples" / "one.ipynb", "print(1)")
    assert hooks.notebook_root(repository, "examples/one.ipynb", None) == repository
    with pytest.raises(ValueError, match=r"holds no executed copy of examples/one\.ipynb"):
        hooks.notebook_root(repository, "examples/one.ipynb", str(executed))
    _notebook(executed / "examples" / "one.ipynb", "print(2)", output="2")
    with pytest.raises(ValueError, match="runs other code: run it again"):
        hooks.notebook_root(repository, "examples/one.ipynb", str(executed))
    _notebook(executed / "examples" / "one.ipynb", "print(1)", output="1")
    assert hooks.notebook_root(repository, "examples/one.ipynb", str(executed)) == executed


# --------------------------------------------------------------------------------------------
# The real build (slow)


def _without(environ: Mapping[str, str], name: str) -> dict[str, str]:
    return {key: value for key, value in environ.items() if key != name}


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict`, the notebooks rendered from the repository without running them
    (tests/test_examples.py runs them, and CI's own build of the site renders those executed
    copies)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=config.parent,
        env={**_without(os.environ, hooks.EXECUTED_NOTEBOOKS), "RESSTREAM_DOCS_EXECUTE": "false"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The real site, built with --strict."""
    site = tmp_path_factory.mktemp("site")
    built = _build(ROOT / "mkdocs.yml", site)
    assert built.returncode == 0, built.stderr[-4000:]
    return site


@pytest.mark.slow
def test_the_site_builds_strictly_with_home_api_cli_and_notebooks(site):
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Where does the shift happen?" in home and 'href="metrics.html"' in home
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    for name in ("resstream.shift", "ShiftReport", "AlignmentResult", "to_pandas", "Displayable"):
        assert name in api, name
    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    assert 'id="resstream-shift"' in cli and "--top-k" in cli
    notebooks = sorted(path.name for path in (ROOT / "examples").glob("*.ipynb"))
    assert notebooks and all(
        (site / "examples" / name.replace(".ipynb", ".html")).is_file() for name in notebooks
    )
    for page in site.rglob("*.html"):  # nothing is loaded from elsewhere (material's fonts are off)
        fetched = re.findall(
            r"<(?:script|link|img)\b[^>]*(?:src|href)=\"(https?://[^\"]+)", page.read_text(encoding="utf-8")
        )
        assert fetched == [], (page, fetched)


@pytest.mark.slow
@pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed")
def test_the_built_pages_open_offline_in_chromium(site):
    notebook = sorted((site / "examples").glob("*.html"))[0]
    with Browser(chromium_binary(), timeout=60) as browser:
        for page in (site / "index.html", site / "reference" / "api.html", notebook):
            events = browser.load(page.as_uri())
            text = browser.evaluate("document.body.innerText.length")
            images = browser.evaluate("[...document.images].map(i => i.complete && i.naturalWidth > 0)")
            assert [url for url in events.requests if not url.startswith(("file:", "data:"))] == [], page
            assert text > 1000, page
            assert all(images), (page, images)


@pytest.mark.slow
def test_a_broken_link_or_an_unknown_documented_name_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("mkdocs.yml", "README.md", "CONTRIBUTING.md"):
        shutil.copy(ROOT / name, copy / name)
    for folder in ("docs", "examples"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "src").symlink_to(ROOT / "src")
    design = copy / "docs" / "design.md"
    design.write_text(design.read_text(encoding="utf-8") + "\n[gone](no-such-page.md)\n", encoding="utf-8")
    api = copy / "docs" / "reference" / "api.md"
    api.write_text(api.read_text(encoding="utf-8") + "\n::: resstream.no_such_function\n", encoding="utf-8")
    built = _build(copy / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr
    assert "'::: resstream.no_such_function' names nothing in resstream" in built.stderr
