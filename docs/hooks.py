"""Build-time hooks of the documentation site (mkdocs.yml `hooks:`), in three parts.

Pages from outside docs/: README.md is the home page (index.md), CONTRIBUTING.md the page
contributing.md and every examples/*.ipynb a page at the same path (rendered by mkdocs-jupyter).
They are read where they live, never copied; a notebook's page renders the executed copy in
the folder `RESSTREAM_EXECUTED_NOTEBOOKS` names, when it does (tests/test_examples.py writes
them there as it runs the notebooks; CI builds the site from them, so each notebook runs once),
and a copy whose code differs from the notebook's is an error. Links are written for the
repository, so each link whose file the site publishes elsewhere is rewritten to the site's
path (the README's `docs/metrics.md` becomes `metrics.md`, a page's `../examples/shift.ipynb`
the notebook's page).
A link to a file the site does not publish is left as written: mkdocs reports it, and
`--strict` fails.

The CLI reference: the line `<!-- cli-reference -->` of docs/reference/cli.md becomes the help of
`resstream` and of every command (usage, description, and each option's name, type, default and
help), read from the Typer app's click commands at build time, so it cannot drift from
`resstream COMMAND --help`.

Docstrings: every object a page documents with a mkdocstrings line `::: path`, and its public
methods and properties, must have a docstring (mkdocstrings would silently leave out a member
without one); every function of `resstream.__all__` and the class it returns must be documented
on some page. Each miss is a warning, which `mkdocs build --strict` turns into a failure.
"""

from __future__ import annotations

import html
import logging
import os
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

if TYPE_CHECKING:
    import griffe
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.pages import Page

#: The repository: the folder above docs/.
REPOSITORY = Path(__file__).resolve().parent.parent
#: Files of the repository outside docs/ that are pages of the site, and their place there.
REPOSITORY_PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md"}
#: The example notebooks, each a page at its repository path.
NOTEBOOKS = "examples/*.ipynb"
#: Folders of the repository that a link may name, and the page that presents them on the site.
REPOSITORY_FOLDERS = {"examples": "notebooks.md"}
#: The environment variable naming a folder of executed copies of the notebooks, each at its
#: repository path (examples/NAME.ipynb).
EXECUTED_NOTEBOOKS = "RESSTREAM_EXECUTED_NOTEBOOKS"
#: The line of a page that the CLI reference replaces.
CLI_MARKER = "<!-- cli-reference -->"
#: The package whose public names must be documented.
PACKAGE = "resstream"

log = logging.getLogger("mkdocs.hooks.resstream")

# --------------------------------------------------------------------------------------------
# Pages from outside docs/ and their links


def outside_pages(repository: Path) -> dict[str, str]:
    """Repository path → site path of every page that lives outside docs/."""
    pages = {path: uri for path, uri in REPOSITORY_PAGES.items() if (repository / path).is_file()}
    for notebook in sorted(repository.glob(NOTEBOOKS)):
        path = notebook.relative_to(repository).as_posix()
        pages[path] = path
    return pages


def _code(path: Path) -> list[str]:
    """The sources of a notebook's code cells, in order."""
    import json

    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]


def notebook_root(repository: Path, repository_path: str, executed: str | None) -> Path:
    """The folder a notebook's page is read from, the notebook at `repository_path` below it:
    the folder `executed` of executed copies (`EXECUTED_NOTEBOOKS`) when one is named, else the
    repository. (mkdocs-jupyter reads the file at src_dir / path, and renders it only where the
    path matches its `include`.) ValueError for a copy that is missing or whose code is not the
    notebook's (it would show the outputs of other code)."""
    if not executed:
        return repository
    copy = Path(executed) / repository_path
    if not copy.is_file():
        raise ValueError(f"{EXECUTED_NOTEBOOKS}={executed!r} holds no executed copy of {repository_path}")
    if _code(copy) != _code(repository / repository_path):
        raise ValueError(f"the executed copy {copy} of {repository_path} runs other code: run it again")
    return Path(executed)


def site_path(repository_path: str, outside: Mapping[str, str]) -> str | None:
    """Where the site publishes a file of the repository (or the page that presents a folder,
    `REPOSITORY_FOLDERS`); None when it does not."""
    if repository_path in outside:
        return outside[repository_path]
    if repository_path in REPOSITORY_FOLDERS:
        return REPOSITORY_FOLDERS[repository_path]
    if repository_path.startswith("docs/"):
        return repository_path.removeprefix("docs/")
    return None


def _is_url_or_anchor(target: str) -> bool:
    """Whether a link target is a URL (`https:`, `mailto:`, `data:`), an anchor or an absolute
    path: nothing to rewrite."""
    return bool(re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith(("#", "/"))


def site_link(target: str, page_repository_path: str, page_site_path: str, outside: Mapping[str, str]) -> str:
    """A link of a page, written for the repository, rewritten for the site: relative to the
    page's place in the site, anchor kept. URLs, anchors, absolute paths and files the site does
    not publish stay as written."""
    if _is_url_or_anchor(target):
        return target
    path, hash_sign, anchor = target.partition("#")
    if not path:
        return target
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_repository_path), path))
    published = site_path(resolved, outside)
    if published is None:
        return target
    relative = posixpath.relpath(published, posixpath.dirname(page_site_path) or ".")
    return relative + hash_sign + anchor


#: An href or src attribute of HTML (in Markdown, or rendered).
_HTML_TARGET = re.compile(r"(?P<before>\b(?:href|src)=\")(?P<target>[^\"]*)")
#: An inline Markdown link or image target, and an HTML src or href.
_LINK_TARGETS = (re.compile(r"(?P<before>\]\(\s*<?)(?P<target>[^)\s>]+)"), _HTML_TARGET)
#: A fenced code block (whose text is never a link).
_FENCE = re.compile(r"^(?P<fence>```|~~~).*?^(?P=fence)[ \t]*$", re.MULTILINE | re.DOTALL)


def outside_code(markdown: str, change: Callable[[str], str]) -> str:
    """`markdown` with `change` applied to each stretch outside fenced code blocks."""
    pieces, start = [], 0
    for block in _FENCE.finditer(markdown):
        pieces += [change(markdown[start : block.start()]), block.group(0)]
        start = block.end()
    return "".join([*pieces, change(markdown[start:])])


def rewrite_links(
    markdown: str, page_repository_path: str, page_site_path: str, outside: Mapping[str, str]
) -> str:
    """Every link of a page's Markdown rewritten for the site (`site_link`)."""

    def change(text: str) -> str:
        for pattern in _LINK_TARGETS:
            text = pattern.sub(
                lambda m: m["before"] + site_link(m["target"], page_repository_path, page_site_path, outside),
                text,
            )
        return text

    return outside_code(markdown, change)


def notebook_links(
    content: str, page_site_path: str, files: Files, outside: Mapping[str, str]
) -> tuple[str, list[str]]:
    """A rendered notebook's links (written for the repository, e.g. `../docs/metrics.md`)
    turned into the site's URLs (`../metrics.html`), and the links that name nothing the site
    publishes. mkdocs-jupyter renders a notebook without mkdocs' own link handling, so this is
    where its links are both rewritten and checked."""
    page_file = files.get_file_from_path(page_site_path)
    broken: list[str] = []

    def change(match: re.Match[str]) -> str:
        target = match["target"]
        if not target or _is_url_or_anchor(target):
            return match.group(0)
        rewritten = site_link(target, repository_path_of(page_site_path, outside), page_site_path, outside)
        path, hash_sign, anchor = rewritten.partition("#")
        linked = files.get_file_from_path(
            posixpath.normpath(posixpath.join(posixpath.dirname(page_site_path), path))
        )
        if linked is None or page_file is None:
            broken.append(target)
            return match.group(0)
        return match["before"] + linked.url_relative_to(page_file) + hash_sign + anchor

    return _HTML_TARGET.sub(change, content), broken


def repository_path_of(site_path_: str, outside: Mapping[str, str]) -> str:
    """The repository path of the page at `site_path_`."""
    by_site = {uri: path for path, uri in outside.items()}
    return by_site.get(site_path_, f"docs/{site_path_}")


# --------------------------------------------------------------------------------------------
# The CLI reference


def cli_reference() -> str:
    """The help of `resstream` and of each of its commands, as Markdown headings and HTML
    tables, read from the Typer app."""
    import typer

    from resstream.cli.main import app

    group = typer.main.get_command(app)
    context = group.context_class(group, info_name="resstream")
    names = group.list_commands(context)
    commands = [(name, group.get_command(context, name)) for name in names]
    summaries = [
        (
            f'<a href="#resstream-{name}"><code{_NOWRAP}>{name}</code></a>',
            command.get_short_help_str(limit=300),
        )
        for name, command in commands
    ]
    parts = [
        command_help(group, context, "resstream"),
        "### Commands",
        html_table(("command", "what it does"), [(link, text_html(text)) for link, text in summaries]),
    ]
    for name, command in commands:
        sub_context = command.context_class(command, info_name=name, parent=context)
        parts.append(command_help(command, sub_context, f"resstream {name}"))
    return "\n\n".join(parts) + "\n"


def command_help(command: Any, context: Any, title: str) -> str:
    """One command's section: heading, usage, description, options table and epilog."""
    usage = command.get_usage(context).removeprefix("Usage: ")
    rows = [option_row(param, context) for param in command.get_params(context)]
    parts = [f"## {title}", f"```text\n{usage}\n```", help_html(command.help or "")]
    parts.append(html_table(("option", "type", "default", "description"), [r for r in rows if r]))
    if command.epilog:
        parts.append(help_html(command.epilog))
    return "\n\n".join(part for part in parts if part)


#: An option's or command's name stays on one line (a narrow column would break it at "-").
_NOWRAP = ' style="white-space: nowrap"'
#: A default or required marker at the end of an option's help (`\[` is Rich's escaped bracket).
_DEFAULT = re.compile(r"\s*\\?\[default: (?P<value>[^\]]*)\]")
_REQUIRED = re.compile(r"\s*\[required\]")


def option_row(param: Any, context: Any) -> tuple[str, str, str, str] | None:
    """An option's (or argument's) name, type, default and help as HTML cells; None for a
    hidden one."""
    record = param.get_help_record(context)
    if record is None:
        return None
    declaration, help_text = record
    if getattr(param, "param_type_name", "") == "argument":
        name, _, kind = declaration.partition(" ")
    else:
        name = ", ".join(param.opts)
        if param.secondary_opts:
            name += " / " + ", ".join(param.secondary_opts)
        kind = declaration.removeprefix(name).strip()
    default = _DEFAULT.search(help_text)
    required = _REQUIRED.search(help_text)
    description = _REQUIRED.sub("", _DEFAULT.sub("", help_text)).replace("\\[", "[")
    shown_default = "required" if required else (default["value"] if default else "")
    kind = kind.removeprefix("<").removesuffix(">")
    return (
        f"<code{_NOWRAP}>{html.escape(name)}</code>",
        f"<code>{html.escape(kind)}</code>" if kind else "",
        f"<code>{html.escape(shown_default)}</code>" if shown_default else "",
        text_html(description),
    )


def html_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """An HTML table (raw HTML: help text is not Markdown) of cells already in HTML."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>{body}</tbody>\n</table>"


def text_html(text: str) -> str:
    """Help text as HTML: escaped, with `backticked` spans as code."""
    pieces = re.split(r"`([^`]*)`", html.escape(" ".join(text.split()), quote=False))
    return "".join(f"<code>{piece}</code>" if i % 2 else piece for i, piece in enumerate(pieces))


def help_html(text: str) -> str:
    """A command's help or epilog: paragraphs of prose as HTML paragraphs, and a paragraph of
    indented lines (a listing such as the config fields) as preformatted text."""
    blocks = []
    for paragraph in re.split(r"\n\s*\n", text.strip("\n")):
        if any(line.startswith((" ", "\t")) for line in paragraph.splitlines()[1:]):
            blocks.append(f"<pre><code>{html.escape(paragraph)}</code></pre>")
        elif paragraph.strip():
            blocks.append(f"<p>{text_html(paragraph)}</p>")
    return "\n".join(blocks)


# --------------------------------------------------------------------------------------------
# Docstrings of the documented names


def public_members(obj: griffe.Object) -> Iterator[griffe.Object]:
    """The members of a class or module that the reference shows: its own (not inherited, not
    imported) public functions, classes and properties. A plain attribute (a dataclass field)
    is described by its class's docstring and is not counted."""
    exported = getattr(obj, "exports", None) if obj.is_module else None
    for name, member in obj.members.items():
        if name.startswith("_") or member.is_alias or (exported is not None and name not in exported):
            continue
        if member.is_function or member.is_class or "property" in member.labels:
            yield member


def undocumented(obj: griffe.Object | griffe.Alias) -> list[str]:
    """The paths of `obj` and of its public members (`public_members`, recursively) that have
    no docstring."""
    target = obj.final_target if obj.is_alias else obj
    missing = [] if target.docstring and target.docstring.value.strip() else [target.path]
    if target.is_class or target.is_module:
        for member in public_members(target):
            missing += undocumented(member)
    return missing


#: A mkdocstrings directive: `::: dotted.path` at the start of a line.
_DIRECTIVE = re.compile(r"^:::\s+(?P<identifier>[\w.]+)", re.MULTILINE)


def documented_identifiers(markdown: str) -> list[str]:
    """The identifiers a page documents with mkdocstrings (`::: path` lines, code blocks left
    out)."""
    found: list[str] = []

    def collect(text: str) -> str:
        found.extend(match["identifier"] for match in _DIRECTIVE.finditer(text))
        return text

    outside_code(markdown, collect)
    return found


def load_package(name: str = PACKAGE) -> griffe.Module:
    """The package as mkdocstrings sees it (static analysis of its sources)."""
    import griffe

    return griffe.load(name, search_paths=[str(REPOSITORY / "src")], resolve_aliases=False)


def resolve(package: griffe.Module, identifier: str) -> griffe.Object | None:
    """The object at a dotted path of the package (aliases followed); None if there is none."""
    import griffe

    if identifier == package.path:
        return package
    try:
        obj = package[identifier.removeprefix(package.path + ".")]
        return obj.final_target if obj.is_alias else obj
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def api_obligations(package: griffe.Module) -> dict[str, str]:
    """Path → why it must be documented: each function of the package's `__all__` and each of
    the package's classes its return annotation names."""
    import griffe

    required: dict[str, str] = {}
    for name in package.exports or ():
        function = resolve(package, str(name))
        if function is None:
            continue
        required[function.path] = f"{package.path}.{name} is in {package.path}.__all__"
        returns = getattr(function, "returns", None)
        names = returns.iterate(flat=True) if isinstance(returns, griffe.Expr) else []
        for part in names:
            if isinstance(part, griffe.ExprName) and part.canonical_path.startswith(package.path + "."):
                returned = resolve(package, part.canonical_path)
                if returned is not None and returned.is_class:
                    required[returned.path] = f"{package.path}.{name} returns it"
    return required


class DocstringCheck:
    """Collects what the pages document and warns about every name without a docstring and
    every public API name left undocumented."""

    def __init__(self, package: griffe.Module) -> None:
        self.package = package
        self.documented: set[str] = set()

    def page(self, markdown: str, page_name: str) -> list[str]:
        """Warnings for one page's `::: path` lines: unknown paths and missing docstrings."""
        warnings = []
        for identifier in documented_identifiers(markdown):
            obj = resolve(self.package, identifier)
            if obj is None:
                warnings.append(f"{page_name}: '::: {identifier}' names nothing in {self.package.path}")
                continue
            self.documented.add(obj.path)
            warnings += [f"{page_name}: {path} has no docstring" for path in undocumented(obj)]
        return warnings

    def coverage(self) -> list[str]:
        """Warnings for the public API names that no page documents (after every page)."""
        return [
            f"{path} is not in the API reference ({why}): add '::: {path}' to docs/reference/api.md"
            for path, why in api_obligations(self.package).items()
            if path not in self.documented
        ]


# --------------------------------------------------------------------------------------------
# Text that only looks like a cross-reference

#: What mkdocs-autorefs says about a `[title][identifier]` it cannot resolve.
_UNRESOLVED = re.compile(r"Could not find cross-reference target '(?P<identifier>[^']*)'")
#: A cross-reference the docs mean: a dotted Python path (`resstream.display.Displayable`).
_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class IndexingIsNotAReference(logging.Filter):
    """Drops mkdocs-autorefs' warning about an unresolved reference that is not a dotted path.

    autorefs reads every `[a][b]` as a reference, so the prose `A[i][j+1]` (a matrix entry) is
    an unresolved reference to `j+1`, which autorefs leaves as written: the page is right and the
    warning false. A dotted path that does not resolve is a broken reference and still warns."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) for an unresolved identifier that is not a dotted path."""
        unresolved = _UNRESOLVED.search(record.getMessage())
        return unresolved is None or _DOTTED_PATH.fullmatch(unresolved["identifier"]) is not None


def quiet_false_references() -> None:
    """Attach `IndexingIsNotAReference` to mkdocs-autorefs' loggers (once each)."""
    names = [
        name for name in logging.root.manager.loggerDict if name.startswith("mkdocs.plugins.mkdocs_autorefs")
    ]
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, IndexingIsNotAReference) for f in logger.filters):
            logger.addFilter(IndexingIsNotAReference())


# --------------------------------------------------------------------------------------------
# The mkdocs events

_check: DocstringCheck | None = None


def on_pre_build(config: MkDocsConfig) -> None:
    """Load the package once per build for the docstring check."""
    global _check
    _check = DocstringCheck(load_package())
    quiet_false_references()


@event_priority(100)  # before mkdocs-jupyter's on_files turns the notebooks into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the pages that live outside docs/ (README, CONTRIBUTING, the notebooks)."""
    for repository_path, uri in outside_pages(REPOSITORY).items():
        if uri == repository_path:  # a notebook: a plain file (mkdocs-jupyter reads its real path)
            root = notebook_root(REPOSITORY, repository_path, os.environ.get(EXECUTED_NOTEBOOKS))
            page = File(uri, str(root), config.site_dir, config.use_directory_urls)
        else:
            page = File.generated(config, uri, abs_src_path=str(REPOSITORY / repository_path))
        files.append(page)
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite the page's links for the site, fill in the CLI reference, check docstrings."""
    outside = outside_pages(REPOSITORY)
    uri = page.file.src_uri
    markdown = rewrite_links(markdown, repository_path_of(uri, outside), uri, outside)
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if _check is not None:
        for warning in _check.page(markdown, uri):
            log.warning(warning)
    return markdown


def on_page_content(html_content: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """A notebook page: its links rewritten for the site and checked (`notebook_links`)."""
    if not page.file.src_uri.endswith(".ipynb"):
        return html_content
    html_content, broken = notebook_links(html_content, page.file.src_uri, files, outside_pages(REPOSITORY))
    for target in broken:
        log.warning(f"{page.file.src_uri}: a link to '{target}', which the site does not publish")
    return html_content


def on_env(env: Any, config: MkDocsConfig, files: Files) -> Any:
    """After every page's Markdown was read: warn about public API names no page documents."""
    if _check is not None:
        for warning in _check.coverage():
            log.warning(warning)
    return env
