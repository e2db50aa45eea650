"""Reading a Hugging Face model's config and accepting it: a supported causal LM.

`checked_hf_config(where, ...)` reads config.json (from a local directory, or from the hub or
its local cache) and refuses a model that is not a causal language model of a supported
family. `hf_error` turns what Hugging Face raises while reading a config, tokenizer or weights
into one line naming the model, and `hf_output` keeps Hugging Face's own logging quiet while
it reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from resstream.errors import UsageError, short_reason
from resstream.hub import offline_reason
from resstream.models.adapters.registry import supported_families

HF_CONFIG = "config.json"
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


@contextmanager
def hf_output(*, progress: bool = True) -> Iterator[None]:
    """Hugging Face's logging kept to errors for the block (its multi-line load reports and
    config warnings would come before our one-line message), and its progress bars off
    unless `progress`; both restored afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    if bars and not progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars and not progress:
            hf_logging.enable_progress_bar()


def checked_hf_config(where: str, name: str, source: str, trust_remote_code: bool) -> tuple[Any, bool]:
    """The config of a supported causal LM, and whether only the local cache may be used."""
    local_only = False
    if source == "hub":
        local_only = offline_reason() is not None
    config = _load_config(where, name, source, local_only, trust_remote_code)
    family = getattr(config, "model_type", None) or "?"
    families = supported_families()
    if family not in families:
        if not is_causal_config(config):
            raise UsageError(
                f"model {name!r} is not a causal LM (model_type {family!r}, "
                f"architectures {_archs(config)}); resstream analyses decoder-only "
                f"causal language models: {', '.join(families)}"
            )
        raise UsageError(
            f"model {name!r} has unsupported family {family!r}; supported families: {', '.join(families)} "
            "(to add one, see docs/adding-a-model.md)"
        )
    if not is_causal_config(config):
        raise UsageError(
            f"model {name!r} is not a causal LM (architectures {_archs(config)}); "
            f"allowed: a checkpoint with a language-model head "
            f"(*ForCausalLM / *LMHeadModel)"
        )
    return config, local_only


def config_source(where: str, source: str) -> str:
    """How messages name the config file of a model: its path, or hub name/config.json."""
    path = Path(where) / HF_CONFIG if source == "local" else f"{where}/{HF_CONFIG}"
    return repr(str(path))


def is_causal_config(config: Any) -> bool:
    """Whether a Hugging Face config describes a causal (decoder-only) LM.

    Its `architectures` decide when present (a causal-LM head, or a bare trunk of a family
    that has one); otherwise the family must have a causal-LM class, and encoder families
    (BERT, RoBERTa, ...) count only when configured as decoders.
    """
    if getattr(config, "is_encoder_decoder", False):
        return False
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    encoder_family = model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    archs = list(getattr(config, "architectures", None) or [])
    if archs:
        if any(a.endswith(_CAUSAL_SUFFIXES) for a in archs):
            return not encoder_family or bool(getattr(config, "is_decoder", False))
        bare_trunk = any(a.endswith("Model") and "For" not in a for a in archs)
        return bare_trunk and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not encoder_family
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return False
    return not encoder_family or bool(getattr(config, "is_decoder", False))


def _load_config(where: str, name: str, source: str, local_only: bool, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    try:
        with hf_output():
            return AutoConfig.from_pretrained(
                where, trust_remote_code=trust_remote_code, local_files_only=local_only
            )
    except Exception as exc:
        raise hf_error(exc, name, source, local_only, "config") from None


def hf_error(
    exc: BaseException,
    name: str,
    source: str,
    local_only: bool,
    what: str,
) -> UsageError:
    """The one-line refusal for what Hugging Face raised while reading `what` ("config",
    "weights") of model `name` from `source` ("local" or "hub")."""
    short = short_reason(exc)
    if "trust_remote_code" in str(exc):
        return UsageError(
            f"model {name!r} needs custom code from its repository; allowed only "
            f"with `trust_remote_code=True`, if you trust it"
        )
    if source == "hub":
        reason = short
        if local_only:
            reason = f"{offline_reason()}; not in the local Hugging Face cache either"
        return UsageError(
            f"model {name!r} not found: not a local directory, and the Hugging "
            f"Face hub could not provide its {what} ({reason})"
        )
    return UsageError(f"model directory {name!r}: cannot load its {what} ({short})")


def _archs(config: Any) -> str:
    archs = getattr(config, "architectures", None)
    return ", ".join(archs) if archs else "none given"


__all__ = ["HF_CONFIG", "checked_hf_config", "config_source", "hf_error", "hf_output", "is_causal_config"]
