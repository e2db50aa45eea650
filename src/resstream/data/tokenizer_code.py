"""Tokenizers that ship Python code of their own, and when resstream lets it run.

A tokenizer folder (or hub repository) whose ``tokenizer_config.json`` has an ``auto_map``
naming a tokenizer class asks for that class's code, shipped beside it, to be run. Without the
code Hugging Face loads a built-in class in its place when the config also names one, so the
user silently gets a tokenizer other than the author's. resstream therefore refuses such a
tokenizer, after reading only JSON files (nothing from the folder is imported), unless the
caller trusts its code (`trust_remote_code=True`, which is then passed on to Hugging Face).

Two cases load without the code, because it would not run anyway and the tokenizer files are
the tokenizer (`TokenizerCode.runs` is False, and the loader says so in a notice: `say_loaded_without_code`):

* the folder does not hold the module the ``auto_map`` names: Hugging Face copies the
  ``auto_map`` into every tokenizer it saves, such as a run's ``tokenizer/`` folder made from a
  tokenizer loaded without its code (code in another repository, ``org/repo--module.Class``,
  is fetched, so it always counts as present);
* the folder's ``config.json`` names a model type whose hub ``auto_map`` transformers itself
  ignores without trust (its ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``, Phi-3 and Qwen2
  among them): transformers loads its own class for those by design.

`trust_remote_code` has three states: True runs the code; False refuses, saying that
``trust_remote_code=True`` allows it; None (the default of callers that offer no way to trust
code: training and tokenising, whose saved tokenizer every later command would have to trust
too) refuses it as not supported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resstream.errors import UsageError
from resstream.notices import notify

TOKENIZER_CONFIG = "tokenizer_config.json"
MODEL_CONFIG = "config.json"


@dataclass(frozen=True)
class TokenizerCode:
    """The code a tokenizer's ``auto_map`` asks for, and whether loading it would run it."""

    reference: str  # "module.Class" (or "org/repo--module.Class")
    source: str  # where the auto_map is: a file path, or "its tokenizer_config.json" on the hub
    runs: bool  # whether Hugging Face would run it when trusted
    why_not: str | None = None  # why it would not (for the notice)


def tokenizer_code(where: str | os.PathLike[str], *, local_only: bool = False) -> TokenizerCode | None:
    """What the ``auto_map`` of the tokenizer at `where` (a directory, or a hub name; with
    `local_only` only the local cache is asked) asks for, or None when it asks for nothing.

    Only JSON is read. A file that is absent, unreadable or not JSON gives None: loading the
    tokenizer reports it.
    """
    directory = Path(where).expanduser()
    local = directory.is_dir()
    reference = _auto_map_class(_config_of(where, TOKENIZER_CONFIG, local_only))
    if reference is None:
        return None
    source = repr(str(directory / TOKENIZER_CONFIG)) if local else f"its {TOKENIZER_CONFIG}"
    model = _config_of(where, MODEL_CONFIG, local_only)
    model_type = model.get("model_type") if isinstance(model, dict) else None
    if isinstance(model_type, str) and model_type in _types_whose_auto_map_is_ignored():
        why = f"transformers ignores it for model type {model_type!r} and loads its own class"
        return TokenizerCode(reference, source, runs=False, why_not=why)
    if local and not _holds_code(directory, reference):
        return TokenizerCode(reference, source, runs=False, why_not="its code is not in the folder")
    return TokenizerCode(reference, source, runs=True)


def check_tokenizer_code(
    where: str | os.PathLike[str],
    what: str,
    trust_remote_code: bool | None,
    *,
    local_only: bool = False,
) -> TokenizerCode | None:
    """UsageError when the tokenizer at `where` would run its own code (`tokenizer_code`) and
    `trust_remote_code` is not True (module docstring for False and None); `what` names the
    tokenizer ("tokenizer directory '...'", "the tokenizer of model '...'"). Returns what its
    auto_map asks for (None: nothing), for the caller's notice when the code does not run."""
    code = tokenizer_code(where, local_only=local_only)
    if code is None or trust_remote_code is True or not code.runs:
        return code
    reason = f"{what} needs custom code: the auto_map of {code.source} names {code.reference!r}"
    raise code_refusal(reason, trust_remote_code)


def say_loaded_without_code(code: TokenizerCode | None, what: str, trust_remote_code: bool | None) -> None:
    """Tell the user (`notices.notify`) that the tokenizer `what` was loaded without the code its
    auto_map names, when it was (nothing to say otherwise)."""
    if code is None or code.runs or trust_remote_code is True:
        return
    notify(
        f"{what}: the auto_map of {code.source} names {code.reference!r}, which was not run "
        f"({code.why_not}); loaded from its tokenizer files"
    )


def refuse_code_asked_for(exc: BaseException, what: str, trust_remote_code: bool | None) -> None:
    """The refusal of `check_tokenizer_code` for a load that Hugging Face stopped because it
    asks for code the JSON check did not see (a `trust_remote_code` error); else nothing."""
    if trust_remote_code is not True and "trust_remote_code" in str(exc):
        raise code_refusal(
            f"{what} needs custom code from its folder or repository", trust_remote_code
        ) from None


def code_refusal(reason: str, trust_remote_code: bool | None) -> UsageError:
    """The one-line refusal of a tokenizer that needs its own code: allowed with
    `trust_remote_code` where the caller offers it (False), not supported where not (None)."""
    if trust_remote_code is None:
        return UsageError(
            f"{reason}, and resstream runs no tokenizer's own code when it trains or tokenises; "
            f"allowed: a tokenizer without custom code (no auto_map)"
        )
    return UsageError(f"{reason}; allowed only with `trust_remote_code=True`, if you trust it")


def _auto_map_class(config: Any) -> str | None:
    """The tokenizer class an ``auto_map`` names ([slow, fast]: the fast one, as Hugging Face
    prefers it), or None."""
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if isinstance(auto_map, dict):
        auto_map = auto_map.get("AutoTokenizer")
    if isinstance(auto_map, str):
        return auto_map or None
    if isinstance(auto_map, (list, tuple)):
        classes = [str(c) for c in auto_map if c]
        return classes[-1] if classes else None
    return None


def _holds_code(directory: Path, reference: str) -> bool:
    """Whether the code of `reference` is something loading `directory` could run."""
    if "--" in reference:  # in another repository: fetched when trusted
        return True
    module = reference.rsplit(".", 1)[0]
    return (directory / (module.replace(".", "/") + ".py")).is_file()


def _types_whose_auto_map_is_ignored() -> frozenset[str]:
    """Model types whose hub tokenizer auto_map transformers ignores without trust."""
    try:
        from transformers.models.auto import tokenization_auto
    except ImportError:
        return frozenset()
    return frozenset(getattr(tokenization_auto, "MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS", ()))


def _config_of(where: str | os.PathLike[str], filename: str, local_only: bool) -> Any:
    """The JSON file `filename` of the folder or hub repository `where` (None when it cannot be had)."""
    directory = Path(where).expanduser()
    return (
        _read_json(directory / filename)
        if directory.is_dir()
        else _hub_json(str(where), filename, local_only)
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _hub_json(name: str, filename: str, local_only: bool) -> Any:
    """A JSON file of hub repository `name` (None when it cannot be had)."""
    try:
        from transformers.utils import cached_file

        path = cached_file(
            name,
            filename,
            local_files_only=local_only,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except Exception:
        return None
    return _read_json(Path(path)) if path else None
