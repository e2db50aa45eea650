"""Decoder specs as users write them: "logit-lens", "embedding", "tuned:DIR" or a loaded lens.

`decoder_specs` checks every spec before any model is loaded (a bad name, a missing or corrupt
lens directory: one line, `UsageError`) and reads each lens once; `DecoderSpec.build(view)`
makes the `Decoder` of one model, refusing a lens trained on another model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from resstream.analysis.decoding.decoder import Decoder, DecoderKind, decoder_of
from resstream.analysis.decoding.tuned_lens import TunedLens, load_lens
from resstream.errors import UsageError, closest
from resstream.models import ModelView

#: The spellings a user may give (shown in messages and `--help`).
SPELLINGS = ("logit-lens", "embedding", "tuned:DIR")
TUNED_PREFIX = "tuned:"

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
    if spec == "logit-lens":
        return DecoderSpec("logit-lens", spec)
    if spec == "embedding":
        return DecoderSpec("embedding", spec)
    if spec.startswith(TUNED_PREFIX) and spec[len(TUNED_PREFIX) :]:
        directory = spec[len(TUNED_PREFIX) :]
        return DecoderSpec("tuned", directory, load_lens(directory))
    if spec in ("tuned", TUNED_PREFIX):
        raise UsageError(
            "decoder 'tuned' needs its lens directory: tuned:DIR (from `resstream tune-lens`); "
            f"allowed: {', '.join(SPELLINGS)}"
        )
    raise UsageError(f"unknown decoder {spec!r}{closest(spec, SPELLINGS)}; allowed: {', '.join(SPELLINGS)}")


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


__all__ = ["SPELLINGS", "DecoderLike", "DecoderSpec", "decoder_spec", "decoder_specs"]
