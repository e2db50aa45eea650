"""What `routes` writes and shows (`resstream.reporting.routes`): the frames have the documented
columns and one row per edge or component, routes.csv is the frame, routes.png is a PNG that
draws every edge and node, routes.html fetches nothing, holds every edge and the whole result,
escapes hostile tokens and, in a headless Chromium, shows a tooltip on hover and the node panel
on a click or Enter; the corpus figure draws its numbers; a notebook shows a picture and a table."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from html.parser import HTMLParser

import numpy as np
import pandas
import pytest
from matplotlib.image import AxesImage, imread
from matplotlib.patches import PathPatch, Rectangle

import resstream
from resstream.analysis.routes import CorpusRoutes, RoutesResult
from resstream.reporting.routes import (
    SIDE_BOW,
    corpus_routes_figure,
    edge_curves,
    edge_width,
    route_figure,
    route_page,
    routes_lines,
    write_routes_report,
)
from resstream.reporting.text import show_token
from tests.chromium import Browser, chromium_binary
from tests.notebook_support import assert_displays, assert_frame_columns, fetched

TEXT = "To be, or not to be, that is the question"
HOSTILE = '</script><b>&"x'
PNG = b"\x89PNG\r\n\x1a\n"
#: The columns the result classes' docstrings document.
EDGE_COLUMNS = (
    "kind",
    "layer",
    "head",
    "label",
    "source",
    "target",
    "source_token",
    "target_token",
    "from_point",
    "to_point",
    "importance",
)
CORPUS_COLUMNS = ("component", "layer", "head", "on_route", "low", "high", "flow")
BINARY = chromium_binary()
needs_chromium = pytest.mark.skipif(
    BINARY is None, reason="chromium is not installed (apt-get install chromium)"
)
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")


@pytest.fixture(scope="module")
def route() -> RoutesResult:
    return resstream.routes(TEXT)


@pytest.fixture(scope="module")
def corpus() -> CorpusRoutes:
    return resstream.routes_corpus(dataset="shakespeare", num_seqs=2, seq_len=16)


def _hostile(route: RoutesResult) -> RoutesResult:
    """`route` with a token and the prediction that would break out of an attribute, a text or
    the page's script if anything were written unescaped."""
    return replace(route, tokens=(HOSTILE, *route.tokens[1:]), prediction=HOSTILE + "\n")


# --------------------------------------------------------------------------- frames and files
def test_the_frame_has_one_row_per_edge_with_the_documented_columns(route: RoutesResult) -> None:
    frame = assert_frame_columns(route, EDGE_COLUMNS)
    assert len(frame) == len(route.edges) > 0
    for row, edge in zip(frame.itertuples(index=False), route.edges, strict=True):
        assert (row.kind, row.layer, row.label, row.importance) == (
            edge.kind,
            edge.layer,
            edge.label,
            edge.importance,
        )
        assert (row.source, row.target, row.from_point, row.to_point) == (
            edge.source,
            edge.target,
            edge.from_point,
            edge.to_point,
        )
        assert (row.source_token, row.target_token) == (route.tokens[edge.source], route.tokens[edge.target])
        assert (row.head is pandas.NA) == (edge.kind != "head")


@pytest.mark.slow
def test_the_corpus_frame_has_one_row_per_head_and_mlp(corpus: CorpusRoutes) -> None:
    frame = assert_frame_columns(corpus, CORPUS_COLUMNS)
    assert len(frame) == corpus.n_layers * (corpus.n_heads + 1)
    mlps = frame[frame["component"].str.endswith(".mlp")]
    assert list(mlps["component"]) == [f"L{layer}.mlp" for layer in range(corpus.n_layers)]
    assert mlps["head"].isna().all() and frame.drop(mlps.index)["head"].notna().all()
    assert list(mlps["on_route"]) == [rate.value for rate in corpus.mlp_on_route]
    head = frame[frame["component"] == "L1.H2"].iloc[0]
    rate = corpus.head_on_route[1][2]
    assert (head["layer"], head["head"], head["on_route"], head["flow"]) == (
        1,
        2,
        rate.value,
        corpus.head_flow[1][2],
    )


def _is_png(path) -> bool:
    data = path.read_bytes()
    image = imread(io.BytesIO(data), format="png")
    return data.startswith(PNG) and image.shape[0] > 100 and image.shape[1] > 100


def test_one_text_writes_csv_png_and_page(tmp_path, route: RoutesResult) -> None:
    written = write_routes_report(route, tmp_path)
    assert sorted(path.name for path in written) == ["routes.csv", "routes.html", "routes.png"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["routes.csv", "routes.html", "routes.png"]
    table = pandas.read_csv(tmp_path / "routes.csv", keep_default_na=False)
    assert tuple(table.columns) == EDGE_COLUMNS and len(table) == len(route.edges)
    assert list(table["label"]) == [edge.label for edge in route.edges]
    assert _is_png(tmp_path / "routes.png")
    assert (tmp_path / "routes.html").read_text(encoding="utf-8") == route_page(route)


def test_corpus_mode_writes_csv_and_png_only(tmp_path, corpus: CorpusRoutes) -> None:
    written = write_routes_report(corpus, tmp_path)
    assert sorted(path.name for path in written) == ["routes.csv", "routes.png"]
    table = pandas.read_csv(tmp_path / "routes.csv")
    assert tuple(table.columns) == CORPUS_COLUMNS and len(table) == len(corpus.to_pandas())
    assert _is_png(tmp_path / "routes.png")


# --------------------------------------------------------------------------- figures
def test_every_edge_is_a_curve_between_its_nodes() -> None:
    from resstream.analysis.routes import RouteEdge

    edges = [
        RouteEdge("residual", 0, None, 3, 3, 0, 1, 0.9),
        RouteEdge("mlp", 0, None, 3, 3, 1, 2, 0.3),
        RouteEdge("head", 0, 1, 3, 3, 0, 1, 0.2),
        RouteEdge("head", 0, 2, 3, 3, 0, 1, 0.1),
        RouteEdge("head", 0, 1, 1, 3, 0, 1, 0.2),
        RouteEdge("head", 0, 2, 1, 3, 0, 1, 0.1),
    ]
    curves = edge_curves(edges)
    for edge, curve in zip(edges, curves, strict=True):
        assert curve.start == (edge.source, edge.from_point) and curve.end == (edge.target, edge.to_point)
    residual, mlp, head, other_head, across, other_across = curves
    assert residual.control == (3.0, 0.5)  # straight
    assert mlp.control[0] > 3 and head.control[0] < 3  # the MLP bows right, a head to itself left
    assert other_head.control[0] < head.control[0] < 3 - SIDE_BOW  # parallel heads apart
    assert across.control != other_across.control
    assert edge_width(0.5) > edge_width(0.1) > 0


def test_the_route_figure_draws_every_edge_and_node(route: RoutesResult) -> None:
    fig = route_figure(route)
    fig.canvas.draw()
    ax = fig.axes[0]
    curves = [patch for patch in ax.patches if isinstance(patch, PathPatch)]
    assert len(curves) == len(route.edges)
    widths = sorted(patch.get_linewidth() for patch in curves)
    assert widths[0] >= edge_width(0.0) and widths[-1] == pytest.approx(
        edge_width(max(e.importance for e in route.edges))
    )
    dots = sum(len(collection.get_offsets()) for collection in ax.collections)
    assert dots == len(route.nodes) + 1  # every node, and the prediction's ring
    assert [label.get_text() for label in ax.get_xticklabels()][route.position].endswith(f" {route.position}")
    assert len(ax.get_yticklabels()) == 2 * route.n_layers + 1
    assert ax.get_yticklabels()[0].get_text() == "emb"
    assert any(show_token(route.prediction) in text.get_text() for text in ax.texts)
    head_colours = {
        e.layer: tuple(p.get_edgecolor()[:3])
        for e, p in zip(_drawn(route), curves, strict=True)
        if e.kind == "head"
    }
    assert len(set(head_colours.values())) == len(head_colours)  # one colour per layer


def _drawn(route: RoutesResult):
    """The edges in the order the figure draws them (residual, MLP, heads; wide first)."""
    kinds = {"residual": 0, "mlp": 1, "head": 2}
    return sorted(route.edges, key=lambda e: (kinds[e.kind], -e.importance))


def test_the_corpus_figure_draws_its_numbers(corpus: CorpusRoutes) -> None:
    fig = corpus_routes_figure(corpus)
    fig.canvas.draw()
    images = [artist for ax in fig.axes for artist in ax.get_images() if isinstance(artist, AxesImage)]
    (heatmap,) = images
    expected = [[rate.value for rate in row] for row in corpus.head_on_route]
    assert np.allclose(heatmap.get_array(), expected)
    bars = [p for ax in fig.axes for p in ax.patches if isinstance(p, Rectangle) and p.get_width() < 1]
    heights = [bar.get_height() for bar in bars]
    assert heights == pytest.approx([rate.value for rate in corpus.edge_shares.values()])
    text = " ".join(t.get_text() for ax in fig.axes for t in ax.get_xticklabels())
    assert "first token" in text and "previous" in text and "same" in text


def test_the_layer_profile_has_layer_ticks_and_the_colour_bar_sits_under_the_heatmap(
    corpus: CorpusRoutes,
) -> None:
    """Issue 38: the middle panel showed no layers, and the colour bar's label stood between it
    and the heatmap, where it read as the middle panel's axis."""
    fig = corpus_routes_figure(corpus)
    fig.canvas.draw()
    (heatmap,) = [ax for ax in fig.axes if ax.get_images()]
    (profile,) = [ax for ax in fig.axes if ax.get_xlabel() == "share of predictions, per layer"]
    (bar,) = [ax for ax in fig.axes if "share of predictions with" in ax.get_xlabel() + ax.get_ylabel()]
    low, high = profile.get_ylim()
    ticks = zip(profile.get_yticks(), profile.get_yticklabels(), strict=True)
    shown = [label.get_text() for at, label in ticks if low <= at <= high and label.get_visible()]
    assert [str(layer) for layer in range(corpus.n_layers)] == shown
    heat, where = heatmap.get_window_extent(), bar.get_window_extent()
    assert where.y1 < heat.y0 and heat.x0 <= where.x0 < where.x1 <= heat.x1
    assert where.x1 < profile.get_window_extent().x0


# --------------------------------------------------------------------------- the page
class _Page(HTMLParser):
    """The elements of routes.html the tests read."""

    def __init__(self) -> None:
        super().__init__()
        self.edges: list[dict[str, str | None]] = []
        self.nodes: list[dict[str, str | None]] = []
        self.tags: list[str] = []
        self.tokens: list[str] = []
        self.scripts: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.tags.append(tag)
        classes = (found.get("class") or "").split()
        if tag == "g" and "edge" in classes:
            self.edges.append(found)
        if tag == "circle" and "node" in classes:
            self.nodes.append(found)
        self._in = "token" if tag == "text" and "token" in classes else tag

    def handle_data(self, data: str) -> None:
        if self._in == "token":
            self.tokens.append(data)
        if self._in == "script":
            self.scripts.append(data)

    def handle_endtag(self, tag: str) -> None:
        self._in = None


def _parsed(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    return parser


def test_the_page_fetches_nothing_and_holds_every_edge(route: RoutesResult) -> None:
    page = route_page(route)
    assert not re.search(r"https?://", page) and fetched(page) == []
    parsed = _parsed(page)
    assert sorted(int(edge["data-edge"] or -1) for edge in parsed.edges) == list(range(len(route.edges)))
    assert sorted(edge["data-label"] or "" for edge in parsed.edges) == sorted(e.label for e in route.edges)
    assert len(parsed.nodes) == len(route.nodes)
    assert all(node["tabindex"] == "0" for node in parsed.nodes)  # reachable by keyboard
    assert len(parsed.tokens) == len(route.tokens)
    embedded = json.loads(parsed.scripts[0])
    assert embedded["result"] == json.loads(json.dumps(route.to_dict()))
    for heading in (route.model, f"{len(route.nodes)} nodes", f"{route.threshold:g}", "How to read"):
        assert heading in page


def test_the_page_escapes_hostile_tokens(route: RoutesResult) -> None:
    hostile = _hostile(route)
    page = route_page(hostile)
    parsed = _parsed(page)
    assert "b" not in parsed.tags  # no element made of a token
    assert parsed.tags.count("script") == 2 and page.count("</script") == 2
    assert parsed.tokens[0].startswith(show_token(HOSTILE)[:8])  # shown as text
    embedded = json.loads(parsed.scripts[0])
    assert embedded["result"]["tokens"][0] == HOSTILE
    assert embedded["result"]["prediction"]["token"] == HOSTILE + "\n"


# --------------------------------------------------------------------------- in Chromium
def _browser() -> Browser:
    """A headless Chromium (the tests that call this are skipped where there is none)."""
    assert BINARY is not None
    return Browser(BINARY, timeout=60)


def _centre(browser: Browser, selector: str) -> tuple[float, float]:
    """The viewport point of the middle of an element (along its path for an edge)."""
    return tuple(
        browser.evaluate(
            f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: 'center', inline: 'center'}});
            const line = e.querySelector('.line');
            const r = e.getBoundingClientRect();
            if (!line) return [r.x + r.width / 2, r.y + r.height / 2];
            const p = line.getPointAtLength(line.getTotalLength() / 2), m = line.getScreenCTM();
            return [p.x * m.a + p.y * m.c + m.e, p.x * m.b + p.y * m.d + m.f]; }})()"""
        )
    )


def _mouse(browser: Browser, kind: str, point: tuple[float, float]) -> None:
    params = {"type": kind, "x": point[0], "y": point[1], "button": "left", "clickCount": 1}
    browser.command("Input.dispatchMouseEvent", params)


@needs_chromium
def test_hovering_an_edge_and_clicking_a_node_in_chromium(tmp_path, route: RoutesResult) -> None:
    page = tmp_path / "routes.html"
    page.write_text(route_page(route), encoding="utf-8")
    (index, edge) = next((i, e) for i, e in enumerate(route.edges) if e.kind == "head")
    (other, node) = next((i, n) for i, n in enumerate(route.nodes) if n.point != 2 * route.n_layers)
    with _browser() as browser:
        browser.command(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1500, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
        )
        events = browser.load(page.as_uri())
        assert browser.evaluate("document.querySelectorAll('#graph .edge').length") == len(route.edges)
        first_panel = browser.evaluate("document.querySelector('#panel h3').textContent")
        _mouse(browser, "mouseMoved", _centre(browser, f'.edge[data-edge="{index}"]'))
        tip = browser.evaluate(
            "[document.getElementById('tip').hidden, document.getElementById('tip').textContent]"
        )
        _mouse(browser, "mouseMoved", (1, 1))
        hidden_after = browser.evaluate("document.getElementById('tip').hidden")
        point = _centre(browser, f'.node[data-node="{other}"]')
        _mouse(browser, "mousePressed", point)
        _mouse(browser, "mouseReleased", point)
        clicked = browser.evaluate("document.querySelector('#panel').innerText")
        dimmed = browser.evaluate("document.querySelectorAll('#graph .edge.dim').length")
        browser.evaluate(f"document.querySelector('.node[data-node=\"{0 if other else 1}\"]').focus()")
        for kind in ("keyDown", "keyUp"):
            browser.command(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13},
            )
        pressed = browser.evaluate("document.querySelector('#panel h3').textContent")
    assert events.errors == []
    assert [url for url in events.requests if not url.startswith(("file:", "data:"))] == []
    assert first_panel.startswith("L_out_")  # the prediction's node, shown on load
    assert tip[0] is False and edge.label in tip[1] and show_token(route.tokens[edge.source]) in tip[1]
    assert hidden_after is True
    assert node.name in clicked and "logit lens" in clicked and show_token(node.lens[0].name) in clicked
    assert 0 < dimmed < len(route.edges)
    assert pressed.startswith(route.nodes[0 if other else 1].name)


@needs_chromium
def test_a_hostile_token_stays_text_in_chromium(tmp_path, route: RoutesResult) -> None:
    page = tmp_path / "routes.html"
    page.write_text(route_page(_hostile(route)), encoding="utf-8")
    with _browser() as browser:
        events = browser.load(page.as_uri())
        state = browser.evaluate(
            "[document.querySelectorAll('b').length, document.querySelector('#graph .token').textContent,"
            " document.querySelector('#panel h3') !== null]"
        )
    assert events.errors == []
    assert state[0] == 0 and state[1].startswith("</script>") and state[2] is True


# --------------------------------------------------------------------------- terminal and notebook
def test_the_lines_name_the_prediction_counts_and_heads(route: RoutesResult, corpus: CorpusRoutes) -> None:
    text = "\n".join(routes_lines(route))
    assert repr(show_token(route.prediction)) in text
    assert f"{len(route.nodes)} nodes, {len(route.edges)} edges" in text
    assert route.top_heads(1)[0][0] in text
    text = "\n".join(routes_lines(corpus))
    assert corpus.top_heads(1)[0][0] in text and f"{corpus.positions:,}" in text
    assert all(name in text for name in corpus.edge_shares)


def test_a_notebook_shows_a_picture_and_a_table(route: RoutesResult, corpus: CorpusRoutes) -> None:
    fragment = assert_displays(route, ["kind", "source_token", "importance", "prediction"])
    assert "<img" in fragment and "<table" in fragment
    fragment = assert_displays(corpus, ["component", "on_route", "flow", "previous"])
    assert "<img" in fragment and "<table" in fragment
