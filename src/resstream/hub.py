"""The Hugging Face hub as seen from here: can it be reached, and does a name mean it?

Shared by model loading (`resstream.models`), tokenizer loading and corpus loading
(`resstream.data`), so it sits below all three.

* `offline_reason()`: why the hub cannot be used now — an offline switch in the environment
  (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``, ``TRANSFORMERS_OFFLINE``), or a hub that does
  not answer one request within `PROBE_TIMEOUT_S` — or None when it may be. Offline machines
  then fail within seconds instead of waiting out the libraries' retries (about 25 s when a
  proxy refuses, minutes when a host accepts connections but never answers), and
  huggingface_hub is told to stay offline for the rest of the process.
* `looks_like_path(spec)`: whether a spec can only be a filesystem path. Hub names are
  ``name`` or ``org/name``; a spec that starts with ``.``, ``/`` or ``~``, holds a backslash,
  has a second ``/``, ends with a separator or carries a file suffix (``.txt``, ``.json``,
  ...) is a path. Where no hub name is possible (named corpora), any ``/`` makes a path.
"""

from __future__ import annotations

import os
import re
import threading
from functools import lru_cache
from pathlib import PurePath
from urllib.parse import urlparse

from resstream.errors import short_reason

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
FILE_SUFFIXES = frozenset({".txt", ".jsonl", ".json", ".md", ".text"})
PROBE_TIMEOUT_S = 2.0
# answers after which huggingface_hub would retry for about 25 s: nothing usable is behind them
UNAVAILABLE_STATUSES = frozenset({408, 500, 502, 503, 504})


def offline_env() -> str | None:
    """Which environment variable asks for Hugging Face offline mode, as a reason."""
    for var in OFFLINE_VARIABLES:
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return f"offline mode is set ({var})"
    return None


def endpoint() -> str:
    """The hub's address (``HF_ENDPOINT`` or huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline_reason() -> str | None:
    """Why the hub cannot be used now (offline mode set, or the hub does not answer within
    `PROBE_TIMEOUT_S`), or None when it may be.

    When there is a reason, huggingface_hub is put in offline mode for the rest of the process:
    even a look-up in its local cache otherwise makes a request of its own first (the registry
    behind its user-agent header, up to 3 s against a host that does not answer).
    """
    reason = offline_env() or probe(endpoint())
    if reason is not None:
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True
    return reason


@lru_cache(maxsize=4)
def probe(address: str) -> str | None:
    """One HEAD request to the hub at `address`: None when it answers, else why not.

    The request goes through huggingface_hub's own HTTP client (its proxies, certificates and
    offline switch), without retries, and is given `PROBE_TIMEOUT_S` in all, name look-up
    included; the answer is kept for the process.
    """
    from huggingface_hub import get_session, is_offline_mode  # imported here: the limit is for the network

    host = urlparse(address).hostname or address
    if is_offline_mode():  # set when it was imported, or by `offline_reason` since
        return f"{host} is not asked (huggingface_hub is in offline mode)"
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            response = get_session().head(address, timeout=PROBE_TIMEOUT_S, follow_redirects=False)
        except Exception as exc:
            outcome.append(f"{host} is unreachable ({_network_reason(exc)})")
            return
        status = response.status_code
        unavailable = status in UNAVAILABLE_STATUSES
        outcome.append(f"{host} answered {status} {response.reason_phrase}".rstrip() if unavailable else None)

    asker = threading.Thread(target=ask, name="resstream-hub-probe", daemon=True)
    asker.start()
    asker.join(PROBE_TIMEOUT_S + 0.5)
    return outcome[0] if outcome else f"{host} is unreachable (no answer within {PROBE_TIMEOUT_S:g} s)"


def _network_reason(exc: BaseException) -> str:
    """Why a request failed, in a few words: ``Connection refused``, ``no answer within 2 s``."""
    if "Timeout" in type(exc).__name__:
        return f"no answer within {PROBE_TIMEOUT_S:g} s"
    return re.sub(r"^\[Errno -?\d+\] ", "", short_reason(exc))


def looks_like_path(spec: str, *, hub_names: bool = True) -> bool:
    """Whether `spec` can only be a filesystem path (module docstring).

    `hub_names=False` where a spec can never be a hub name: then any ``/`` makes a path.
    """
    if spec.startswith((".", "/", "~")) or "\\" in spec or spec.endswith(("/", os.sep)):
        return True
    if spec.count("/") > (1 if hub_names else 0) or os.sep in spec.replace("/", ""):
        return True
    return PurePath(spec).suffix.lower() in FILE_SUFFIXES
