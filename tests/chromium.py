"""A headless Chromium driven through the DevTools protocol, with the standard library only.

Chromium started with `--remote-debugging-pipe` reads protocol messages from its fd 3 and
writes them to its fd 4: JSON objects, each terminated by a NUL byte. `Browser` starts it with
two pipes in those places, opens one page target (`Target.createTarget`, attached with a flat
session), and `Page.load` navigates it and waits for its load event while recording what a
test wants to know: console errors, uncaught exceptions, log entries of level error and every
URL the page requested. Every wait is bounded by a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

#: Flags for a quiet, self-contained headless browser (no first-run pages, no sandbox: tests
#: may run as root in a container, and the page is a local file the test wrote).
FLAGS = (
    "--headless",
    "--remote-debugging-pipe",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
)


def chromium_binary() -> str | None:
    """The path of Debian's `chromium`, None when it is not installed."""
    return shutil.which("chromium")


@dataclass
class PageEvents:
    """What happened while a page loaded."""

    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries, each as one line."""
        return [*self.console_errors, *self.exceptions, *self.log_errors]

    def record(self, method: str, params: dict[str, Any]) -> None:
        """Keep what an event says, if it is one of the kinds above."""
        if method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.console_errors.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.exceptions.append(
                str(details.get("exception", {}).get("description") or details.get("text"))
            )
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.log_errors.append(f"{entry.get('source')}: {entry.get('text')} ({entry.get('url', '')})")
        elif method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])


class ProtocolError(RuntimeError):
    """The browser answered a command with an error, or did not answer in time."""


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, binary: str, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="resstream-chromium-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def place_pipes() -> None:  # in the child: its fd 3 reads commands, its fd 4 writes answers
            high_read, high_write = os.dup(to_browser_read), os.dup(from_browser_write)
            os.dup2(high_read, 3)
            os.dup2(high_write, 4)
            # dup2 onto itself (a `dup` that returned 3 or 4, e.g. after matplotlib closed its
            # cached font files in the forked child) leaves the fd close-on-exec: clear it.
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self._process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=place_pipes,
            close_fds=False,  # keep the fds 3 and 4 placed above (the other pipe ends close on exec)
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self._pending: list[dict[str, Any]] = []  # events read while waiting for an answer
        self.session: str | None = None

    # ---------------------------------------------------------------- the wire
    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode("utf-8") + b"\0")
        return self._next_id

    def _read(self, deadline: float) -> dict[str, Any]:
        """The next message from the browser; ProtocolError at the deadline."""
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError("the browser did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise ProtocolError(f"the browser closed its pipe (exit code {self._process.poll()})")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def command(
        self, method: str, params: dict[str, Any] | None = None, *, page: bool = True
    ) -> dict[str, Any]:
        """Send a command (to the page's session unless `page` is False) and return its result."""
        number = self._send(method, params, self.session if page else None)
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._read(deadline)
            if message.get("id") == number:
                if "error" in message:
                    raise ProtocolError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._pending.append(message)

    def wait_for(self, method: str, events: PageEvents) -> dict[str, Any]:
        """Record events until `method` arrives from the page; return its parameters."""
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._pending.pop(0) if self._pending else self._read(deadline)
            if "method" not in message:
                continue
            events.record(message["method"], message.get("params", {}))
            if message["method"] == method and message.get("sessionId") == self.session:
                return message.get("params", {})

    def drain(self, events: PageEvents, seconds: float) -> None:
        """Record the events that arrive within `seconds` (late console messages)."""
        deadline = time.monotonic() + seconds
        while self._pending:
            message = self._pending.pop(0)
            if "method" in message:
                events.record(message["method"], message.get("params", {}))
        try:
            while True:
                message = self._read(deadline)
                if "method" in message:
                    events.record(message["method"], message.get("params", {}))
        except ProtocolError:
            return

    # ---------------------------------------------------------------- the page
    def __enter__(self) -> Browser:
        try:
            target = self.command("Target.createTarget", {"url": "about:blank"}, page=False)["targetId"]
            attached = self.command(
                "Target.attachToTarget", {"targetId": target, "flatten": True}, page=False
            )
            self.session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.command(f"{domain}.enable")
        except BaseException:
            self.close()
            raise
        return self

    def load(self, url: str) -> PageEvents:
        """Navigate the page to `url`, wait for its load event, then a moment for late events."""
        events = PageEvents()
        answer = self.command("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise ProtocolError(f"navigation to {url} failed: {answer['errorText']}")
        self.wait_for("Page.loadEventFired", events)
        self.drain(events, 0.5)
        return events

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values)."""
        result = self.command("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise ProtocolError(f"{expression!r} threw: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def close(self) -> None:
        """Ask the browser to close, kill it if it does not, and remove its profile."""
        try:
            if self._process.poll() is None:
                self._send("Browser.close")
                self._process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait(timeout=10)
        finally:
            for fd in (self._to_browser, self._from_browser):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._profile.cleanup()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
