"""report.html in a real headless Chromium: it renders, every image loads, nothing errs, nothing
is fetched. Skipped where Debian's `chromium` is not installed."""

from __future__ import annotations

import re

import pytest

from resstream.reporting.report import find_outputs, write_report
from tests.chromium import Browser, chromium_binary
from tests.report_fixtures import write_everything
from tests.test_report import HEADINGS

BINARY = chromium_binary()
pytestmark = pytest.mark.skipif(BINARY is None, reason="chromium is not installed (apt-get install chromium)")

#: What the page shows, read in the browser.
STATE = """({
  text: document.body.innerText.length,
  headings: [...document.querySelectorAll('h2')].map(h => h.textContent),
  images: [...document.images].map(i => ({complete: i.complete, width: i.naturalWidth, alt: i.alt})),
})"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    return write_report(find_outputs(write_everything(root / "in")), root)


@pytest.mark.slow
def test_the_report_renders_offline_in_chromium(report):
    assert not re.search(r"https?://", report.read_text(encoding="utf-8"))  # nothing to fetch
    with Browser(BINARY, timeout=60) as browser:
        events = browser.load(report.as_uri())
        state = browser.evaluate(STATE)
    assert events.errors == []
    assert [url for url in events.requests if not url.startswith(("file:", "data:"))] == []
    assert state["text"] > 1000
    assert state["headings"] == list(HEADINGS.values())
    assert len(state["images"]) == 6
    assert all(image["complete"] and image["width"] > 0 for image in state["images"]), state["images"]


def test_the_driver_sees_console_errors_and_broken_images(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        "<!doctype html><title>bad</title><img src='data:image/png;base64,AAAA'>"
        "<script>console.error('boom'); undefined_name();</script>",
        encoding="utf-8",
    )
    with Browser(BINARY, timeout=60) as browser:
        events = browser.load(page.as_uri())
        images = browser.evaluate("[...document.images].map(i => i.naturalWidth)")
    assert events.console_errors == ["boom"]
    assert len(events.exceptions) == 1 and "undefined_name" in events.exceptions[0]
    assert images == [0]
