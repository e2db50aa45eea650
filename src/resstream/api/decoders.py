"""Decoder specs as users write them: "logit-lens", "embedding", "tuned:DIR" or a loaded lens,
and `resstream.load_lens(path)`.

`decoder_specs` checks every spec before any model is loaded (a bad name, a missing or corrupt
lens directory: one line, `UsageError`) and reads each lens once; `DecoderSpec.build(view)`
makes the `Decoder` of one model, refusing a lens trained on another model. A lens directory
is one `resstream tune-lens` wrote or one the tuned-lens package saved (config.json +
params.pt), told apart by its files (`resstream.analysis.decoding.tuned_lens.load_lens`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Unpack, cast

from resstream.analysis.decoding import tuned_lens
from resstream.analysis.decoding.decoder import Decoder, DecoderKind, decoder_of
from resstream.analysis.decoding.tuned_lens import TunedLens
from resstream.api.inputs import LoadOptions, one_model, takes_load_args
from resstream.checks import DECODER_SPELLINGS, TUNED_PREFIX, decoder_kind
from resstream.errors import UsageError
from resstream.models import LoadArgs, ModelLike, ModelView

#: The spellings a user may give (shown in messages and `--help`): resstream.checks's.
SPELLINGS = DECODER_SPELLINGS

DecoderLike = str | TunedLens


@dataclass(frozen=True, eq=False)
class DecoderSpec:
    """One decoder a command was asked for: its kind, its lens (tuned) and how it was given."""

    kind: DecoderKind
    source: str
    lens: TunedLens | None = None

    @property
    def name(self) -> str:
        """How messages name this decoder's lens."""
        return f"the tuned lens {self.source!r}"

    def check(self, view: ModelView) -> None:
        """UsageError (naming both fingerprints) when this is a lens of another model: for a
        refusal before the work starts (`build` checks again)."""
        if self.lens is not None:
            self.lens.check_model(view, source=self.name)

    def build(self, view: ModelView) -> Decoder:
        """The decoder of `view` (`decoder_of`, which refuses another model's lens)."""
        return decoder_of(view, self.kind, self.lens, source=self.name)


def decoder_spec(spec: DecoderLike) -> DecoderSpec:
    """Parse one spec (module docstring); a lens directory is read here."""
    if isinstance(spec, TunedLens):
        return DecoderSpec("tuned", f"(lens of {spec.model})", spec)
    if not isinstance(spec, str):
        raise UsageError(f"decoder {spec!r}; allowed: {', '.join(SPELLINGS)} or a TunedLens")
    kind = decoder_kind(spec)  # the name checked as the command line checks it, before torch
    if kind == "tuned":
        directory = spec[len(TUNED_PREFIX) :]
        return DecoderSpec("tuned", directory, tuned_lens.load_lens(directory))
    return DecoderSpec(cast(DecoderKind, kind), spec)


def decoder_specs(specs: DecoderLike | Sequence[DecoderLike]) -> tuple[DecoderSpec, ...]:
    """Parse one spec or several (duplicates refused: they would give the same result twice)."""
    items = [specs] if isinstance(specs, str | TunedLens) else list(specs)
    if not items:
        raise UsageError(f"no decoder given; allowed: {', '.join(SPELLINGS)}")
    parsed = tuple(decoder_spec(item) for item in items)
    kinds = [spec.kind for spec in parsed]
    repeated = sorted({kind for kind in kinds if kinds.count(kind) > 1})
    if repeated:
        given = [spec.source for spec in parsed if spec.kind == repeated[0]]
        times = "twice" if len(given) == 2 else f"{len(given)} times"
        raise UsageError(
            f"decoder {repeated[0]!r} is given {times} ({', '.join(given)}); give each kind once "
            "(compare two tuned lenses in two runs)"
        )
    return parsed


@takes_load_args
def load_lens(
    path: str | os.PathLike[str], model: ModelLike = None, *, progress: bool = False, **load: Unpack[LoadArgs]
) -> TunedLens:
    """The tuned lens in directory `path`: one `resstream tune-lens` wrote (lens.json +
    translators.safetensors) or one the `tuned-lens` package saved (config.json + params.pt,
    or params.safetensors), told apart by its files. Parameters are read without running code
    (safetensors, or `torch.load(weights_only=True)`): a params.pt that is not a plain state
    dict of tensors is refused in one line (`UsageError`), as is a missing or damaged file.

    `model` None (the default) checks nothing now: the lens is checked against each model it
    decodes for (`decoder="tuned:DIR"` or `decoder=lens` of `resstream.shift`, `.lens`,
    `.attribute`). Given a model (a spec, loaded with `dtype`, `device`, `device_map`,
    `trust_remote_code`, with progress bars if `progress`, or a model in memory), the lens is
    checked against it now, and a lens from the package, which records only its shapes and the
    hash of its unembedding, is returned carrying that model's fingerprint, so it is refused on
    any other model from then on (`lens.save(dir)` keeps it). A lens of another shape is
    refused naming both shapes. `lens.save(dir, layout="tuned-lens")` writes a lens in the
    package's layout.
    """
    lens = tuned_lens.load_lens(path)
    if model is None:
        return lens
    options = LoadOptions.of(load, progress=progress, needs_tokenizer=False)
    with one_model(model, options) as loaded:
        return lens.bound(loaded.view, source=f"the tuned lens {str(path)!r}")


__all__ = ["SPELLINGS", "DecoderLike", "DecoderSpec", "decoder_spec", "decoder_specs", "load_lens"]
