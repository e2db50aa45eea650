"""The Hugging Face hub when it cannot be used: a hub name fails within seconds, with one line.

Spec (issue 23, item 9): with ``HF_HUB_OFFLINE`` (or its sisters) set, no request is made;
otherwise one request to the hub (``HF_ENDPOINT``) decides, bounded to a couple of seconds and
kept for the process: a refused connection, a host that accepts but never answers, or an
answer that huggingface_hub would retry on (503 from a proxy, say) makes the hub unreachable,
and a hub name is then looked up in the local cache only. Before, such hosts cost about 25 s
of the library's retries (503, refused) or minutes (silent). A model in the local Hugging Face
cache, or in a local directory, still loads.

The hubs here are real sockets on 127.0.0.1: a closed port, a listener that never answers, and
an HTTP server answering a chosen status. The time bounds are generous (the probe allows 2 s).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from resstream import hub
from resstream.errors import UsageError
from resstream.models import load_model
from tests.cli_support import expect_usage_error
from tests.test_models_loading import SENTENCES, _tiny_gpt2

BOUND_S = 10.0  # generous: the probe allows 2 s; the library's retries took 25 s or more
NOT_CACHED = "resstream-tests/not-cached-anywhere"


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """No offline switch, in the environment or in huggingface_hub (read when it was imported)."""
    import huggingface_hub.constants

    for var in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def closed_port() -> str:
    """The address of a port on 127.0.0.1 nobody listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_host() -> Iterator[str]:
    """A host that accepts connections (the kernel completes them) but never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


class Hub:
    """An HTTP server on 127.0.0.1 answering every request with `status`; counts requests."""

    def __init__(self, status: int) -> None:
        self.requests = 0
        hub_ = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                hub_.requests += 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        # a short poll: shutdown() waits up to one poll interval (0.5 s by default) per server
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def answering() -> Iterator[Callable[[int], Hub]]:
    """Start `Hub(status)` servers; all are stopped after the test."""
    started: list[Hub] = []

    def start(status: int) -> Hub:
        started.append(Hub(status))
        return started[-1]

    yield start
    for server in started:
        server.close()


def timed_probe(address: str) -> tuple[str | None, float]:
    start = time.monotonic()
    reason = hub.probe(address)
    return reason, time.monotonic() - start


# --------------------------------------------------------------------------- the probe


def test_a_refused_connection_is_unreachable_at_once(online, closed_port: str) -> None:
    reason, took = timed_probe(closed_port)
    assert reason == "127.0.0.1 is unreachable (Connection refused)"
    assert took < BOUND_S


def test_a_host_that_never_answers_is_unreachable_within_the_probe_timeout(online, silent_host: str) -> None:
    reason, took = timed_probe(silent_host)
    assert reason == f"127.0.0.1 is unreachable (no answer within {hub.PROBE_TIMEOUT_S:g} s)"
    assert took < BOUND_S


@pytest.mark.parametrize("status", [502, 503, 504])
def test_an_answer_the_library_would_retry_on_is_unreachable(online, answering, status: int) -> None:
    server = answering(status)
    reason, took = timed_probe(server.address)
    assert reason is not None and reason.startswith(f"127.0.0.1 answered {status} ")
    assert server.requests == 1 and took < BOUND_S


@pytest.mark.parametrize("status", [200, 301, 404])
def test_any_other_answer_means_the_hub_is_reachable(online, answering, status: int) -> None:
    server = answering(status)
    assert hub.probe(server.address) is None
    assert server.requests == 1


def test_the_answer_is_asked_once_per_process(online, answering, monkeypatch: pytest.MonkeyPatch) -> None:
    server = answering(503)
    monkeypatch.setenv("HF_ENDPOINT", server.address + "/")
    first = hub.offline_reason()
    assert first == hub.offline_reason() == "127.0.0.1 answered 503 Service Unavailable"
    assert server.requests == 1


def test_an_unreachable_hub_puts_huggingface_hub_offline_for_the_process(
    online, closed_port: str, answering, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else its own requests (the registry behind its user-agent header) would still wait."""
    import huggingface_hub

    monkeypatch.setenv("HF_ENDPOINT", answering(200).address)
    assert hub.offline_reason() is None and not huggingface_hub.is_offline_mode()
    monkeypatch.setenv("HF_ENDPOINT", closed_port)
    assert hub.offline_reason() is not None and huggingface_hub.is_offline_mode()
    later = answering(200)
    assert hub.probe(later.address) == "127.0.0.1 is not asked (huggingface_hub is in offline mode)"
    assert later.requests == 0


@pytest.mark.parametrize("variable", hub.OFFLINE_VARIABLES)
def test_an_offline_switch_is_honoured_without_a_request(
    online, answering, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    server = answering(200)
    monkeypatch.setenv("HF_ENDPOINT", server.address)
    monkeypatch.setenv(variable, "1")
    assert hub.offline_reason() == f"offline mode is set ({variable})"
    assert server.requests == 0


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize(
    ("which", "reason"),
    [
        ("closed", "127.0.0.1 is unreachable (Connection refused)"),
        ("silent", "127.0.0.1 is unreachable (no answer within 2 s)"),
        ("503", "127.0.0.1 answered 503 Service Unavailable"),
    ],
)
def test_an_uncached_hub_name_fails_fast_with_one_line(
    online,
    answering,
    closed_port: str,
    silent_host: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys,
    which: str,
    reason: str,
) -> None:
    address = {"closed": closed_port, "silent": silent_host}.get(which) or answering(503).address
    monkeypatch.setenv("HF_ENDPOINT", address)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES), encoding="utf-8")
    start = time.monotonic()
    expect_usage_error(
        ["shift", "--model", NOT_CACHED, "--dataset", str(corpus)],
        tmp_path / "out",
        capsys,
        f"model '{NOT_CACHED}' not found: not a local directory, and the Hugging Face hub could not "
        f"provide its config ({reason}; not in the local Hugging Face cache either)",
    )
    assert time.monotonic() - start < BOUND_S


def test_a_named_dataset_without_a_data_directory_fails_fast(
    online, answering, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", answering(503).address)
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    start = time.monotonic()
    expect_usage_error(
        ["shift", "--dataset", "wikitext-2"],
        tmp_path / "out",
        capsys,
        "dataset 'wikitext-2'",
        "could not be loaded from Hugging Face: 127.0.0.1 answered 503 Service Unavailable",
    )
    assert time.monotonic() - start < BOUND_S


# --------------------------------------------------------------------------- what is here still loads


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 and its tokenizer saved with save_pretrained."""
    from resstream.data import train_bpe

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    path = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    _tiny_gpt2(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def cache_holding(cache: Path, repo: str, model_dir: Path) -> None:
    """Lay out `model_dir`'s files as the Hugging Face hub cache holds hub name `repo`'s main."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    entry = cache / f"models--{repo.replace('/', '--')}"
    snapshot = entry / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in model_dir.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(commit)


def test_a_cached_hub_name_loads_while_the_hub_is_unreachable(
    online, closed_port: str, tiny_gpt2: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import huggingface_hub.constants

    repo = "resstream-tests/tiny-gpt2"
    cache_holding(tmp_path / "hub", repo, tiny_gpt2)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", closed_port)
    loaded = load_model(repo, device="cpu", progress=False)
    reference = load_model(str(tiny_gpt2), device="cpu", progress=False)
    assert (loaded.source, loaded.name) == ("hub", repo)
    assert loaded.view.n_layers == 2
    for (name, mine), (_, theirs) in zip(
        loaded.view.model.state_dict().items(), reference.view.model.state_dict().items(), strict=True
    ):
        assert mine.equal(theirs), name
    with pytest.raises(UsageError, match=r"Connection refused\); not in the local Hugging Face cache"):
        load_model(NOT_CACHED, device="cpu")


def test_a_local_directory_loads_while_the_hub_is_unreachable(
    online, silent_host: str, tiny_gpt2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", silent_host)
    start = time.monotonic()
    loaded = load_model(str(tiny_gpt2), device="cpu", progress=False)
    assert loaded.source == "local" and loaded.view.n_layers == 2
    assert time.monotonic() - start < BOUND_S
