"""THE definition of how a residual state becomes scores over the vocabulary.

Every command decodes through a `Decoder` built from a model's `ModelView`:

* ``logit-lens`` (default): scores(h) = W_U · final_norm(h) (+ b_U), then the model's logit
  soft-capping c·tanh(scores / c) where it has one (Gemma-2). W_U is the model's own
  unembedding (tied models: W_E).
* ``embedding``: scores(h) = W_E · h, no norm, no bias.
* ``tuned``: the logit lens applied to a translated state, scores_l(h) = W_U ·
  final_norm(h + A_l h + b_l) (+ b_U), with one trained affine translator per layer
  (`resstream.analysis.decoding.tuned_lens`). The translator depends on the layer, so a tuned decoder
  decodes one layer's states at a time: `decoder.at(layer)` is the decoder of layer l (for the
  other kinds, `at` returns the decoder itself). Zero translators give the logit lens exactly.

Two evaluations of the same definition:

* exact (`Decoder.exact()` → `ExactScorer`: `ranks`, `top_k`, `scores`): ranks and top-k
  lists from scores evaluated exactly in float64 (`resstream.analysis.decoding.ranks`), independent of
  BLAS kernels, batch shapes and devices. Soft-capping is strictly increasing, so it changes
  no rank in exact arithmetic and is not applied here (in floating point, tanh can round two
  different scores to one, which would invent ties). `shift`'s match rates and `lens`'s
  trajectories both use it, so they agree on every rank, ties included.
* fast (`logits`): float32 scores with soft-capping, for callers that need the values (a
  softmax, a log-probability), not a ranking.

`description` says in one line what the decoder applies; results record it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Unpack

import torch
from torch import Tensor

from resstream.analysis.decoding.ranks import Decoded, NonFiniteCall, RankScreen, ScreenOptions, check_matrix
from resstream.errors import RunError, check_choice
from resstream.models.adapters.base import ModelView

if TYPE_CHECKING:
    from resstream.analysis.decoding.tuned_lens import TunedLens

DecoderKind = Literal["logit-lens", "embedding", "tuned"]
DECODERS: tuple[DecoderKind, ...] = ("logit-lens", "embedding", "tuned")


@dataclass(frozen=True, eq=False)
class Decoder:
    """How a residual state becomes scores (module docstring). Build it with `decoder_of`.

    `matrix` is W_U (logit lens) or W_E (embedding), shape (vocab, d_model); `bias` b_U or
    None; `norm` the final norm (None: applied to the state as it is); `softcap` the logit
    soft-capping constant or None; `tied` whether the model's unembedding W_U is its input
    embedding W_E (recorded with results whatever the kind). A tuned decoder also holds its
    `lens` and, once `at(layer)` has chosen one, the `layer` whose translator it applies.
    """

    kind: DecoderKind
    matrix: Tensor
    bias: Tensor | None = None
    norm: Callable[[Tensor], Tensor] | None = None
    softcap: float | None = None
    tied: bool = True
    lens: TunedLens | None = None
    layer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in DECODERS:
            raise ValueError(f"decoder kind {self.kind!r}; allowed: {', '.join(DECODERS)}")
        if (self.kind == "tuned") != (self.lens is not None):
            raise ValueError("a tuned decoder needs its lens, and only a tuned decoder has one")
        check_matrix("decoder matrix", self.matrix)
        if self.bias is not None and tuple(self.bias.shape) != (self.matrix.shape[0],):
            raise ValueError(
                f"decoder bias has shape {tuple(self.bias.shape)}, "
                f"expected ({self.matrix.shape[0]},) to match the decoder matrix"
            )

    @property
    def vocab_size(self) -> int:
        """Number of scores per state."""
        return int(self.matrix.shape[0])

    def at(self, layer: int) -> Decoder:
        """The decoder of states of `layer` (0..L): a tuned decoder with that layer's
        translator chosen; any other decoder is the same at every layer."""
        return self if self.lens is None else replace(self, layer=layer)

    @property
    def description(self) -> str:
        """What this decoder applies to a state, in one line (saved with results)."""
        if self.kind == "embedding":
            return "W_E · h (input embedding matrix, no norm)"
        if self.lens is not None:
            translated = replace(self, kind="logit-lens", lens=None, layer=None).description
            package = "from the tuned-lens package"
            origin = f"model {self.lens.fingerprint}" if self.lens.signature else package
            lens = f"tuned lens (per-layer affine translator h + A_l h + b_l, {origin})"
            return f"{lens}, then {translated}"
        matrix = "W_U = W_E (tied)" if self.tied else "the model's own unembedding W_U (untied from W_E)"
        bias = " + b_U" if self.bias is not None else ""
        cap = "; logit soft-capping ignored (monotone, ranks unchanged)" if self.softcap else ""
        return f"final norm, then {matrix}{bias}{cap}"

    def inputs(self, h: Tensor) -> Tensor:
        """The vectors the decoder matrix is applied to: final_norm(h) (of the translated
        state for a tuned decoder), or h itself."""
        if self.lens is not None:
            if self.layer is None:
                raise ValueError("a tuned decoder decodes one layer at a time: use decoder.at(layer)")
            h = self.lens.translators.translate(h, self.layer)
        return self.norm(h) if self.norm is not None else h

    def logits(self, h: Tensor) -> Tensor:
        """Fast float32 scores (..., vocab) of states h (..., d_model), soft-capping applied."""
        scores = self.inputs(h).float() @ self.matrix.float().T
        if self.bias is not None:
            scores = scores + self.bias.float()
        if self.softcap:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        return scores

    def exact(self, **screen: Unpack[ScreenOptions]) -> ExactScorer:
        """The exact evaluation of this decoder (build once, query many batches).

        `screen` are the rank engine's settings (`ScreenOptions`): `low_precision` its
        screening precision (bf16, None = fp32, "auto": bf16 on CUDA, fp32 on the CPU),
        `chunk_bytes` its score-block size (None: by device) and `sync_free` whether it avoids
        host synchronisations ("auto": on CUDA); the answers depend on none of them.
        """
        return ExactScorer(self, RankScreen(self.matrix.detach(), _detached(self.bias), **screen))


@dataclass(frozen=True, eq=False)
class ExactScorer:
    """Exact ranks and top-k lists of a decoder's scores (module docstring)."""

    decoder: Decoder
    engine: RankScreen

    def at(self, layer: int) -> ExactScorer:
        """The scorer of states of `layer` (`Decoder.at`), sharing this one's rank engine."""
        return self if self.decoder.lens is None else ExactScorer(self.decoder.at(layer), self.engine)

    def ranks(
        self, h: Tensor, ids: Tensor, limit: int | None = None, *, ids_checked: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Ranks (n, m) of tokens `ids` (n, m) among the scores of states h (n, d_model), and
        their exact fp64 scores; with `limit` = k, min(rank, k) (`RankScreen.ranks`, which
        also explains `ids_checked`). Inside `deferred` the ranks are final after the block."""
        x = self.decoder.inputs(h) if self.engine.deferring else self.finite_inputs(h)
        return self.engine.ranks(x, ids, limit, ids_checked=ids_checked)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """`RankScreen.deferred` of the rank engine: the `ranks` calls inside the block (for
        instance one per layer of a batch) synchronise with the host once, at its end, when
        their inputs are checked: `NonFiniteInputs` with `call` = the index of the first call
        whose inputs held inf or nan."""
        try:
            with self.engine.deferred():
                yield
        except NonFiniteCall as found:
            raise NonFiniteInputs(
                f"non-finite values in the decoder inputs: {NonFiniteInputs.HINT}", call=found.call
            ) from None

    def scores(self, h: Tensor, ids: Tensor) -> Tensor:
        """Exact fp64 scores (n, m) of tokens `ids` (n, m) for states h (n, d_model)."""
        x64 = self.finite_inputs(h).to(self.engine.device, torch.float64)
        return self.engine.exact_scores(x64, ids.to(self.engine.device))

    def decode(self, h: Tensor, ids: Tensor, k: int, *, probabilities: bool = True) -> Decoded:
        """Everything a lens reads of states h (n, d_model) from one fp32 screen per block:
        the exact top-`k` lists, the exact ranks of tokens `ids` (n, m) and the softmax
        normaliser of the decoder's scores (`RankScreen.decode`; soft-capping applied to the
        probabilities only). The scorer must be built with ``low_precision=None``."""
        softcap = self.decoder.softcap
        return self.engine.decode(self.finite_inputs(h), ids, k, softcap=softcap, probabilities=probabilities)

    def top_k(self, h: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The `k` best token ids (n, k) of states h (n, d_model) and their exact scores,
        ordered by score, ties broken by the lower id (`RankScreen.top_k`)."""
        return self.engine.top_k(self.finite_inputs(h), k)

    def finite_inputs(self, h: Tensor) -> Tensor:
        """`Decoder.inputs(h)`, refused with `NonFiniteInputs` if any value is inf or nan
        (no rank is defined then)."""
        x = self.decoder.inputs(h)
        if not bool(torch.isfinite(x).all()):
            raise NonFiniteInputs(f"non-finite values in the decoder inputs: {NonFiniteInputs.HINT}")
        return x


class NonFiniteInputs(RunError, ValueError):
    """A state whose decoder input holds inf or nan: it has no scores to rank. A `RunError`
    (the CLI shows one line, exit 1) and a `ValueError` (what callers of the analysis expect).
    `call`: inside `ExactScorer.deferred`, the index of the first call that met it."""

    HINT = "no ranks exist (a float16/bfloat16 model overflowing? try `dtype` float32)"

    def __init__(self, message: str, *, call: int | None = None) -> None:
        super().__init__(message)
        self.call = call


def decoder_of(
    view: ModelView,
    kind: DecoderKind = "logit-lens",
    lens: TunedLens | None = None,
    *,
    source: str = "the lens",
) -> Decoder:
    """The decoder `kind` of a model: its final norm, unembedding, bias and soft-capping, and
    for `tuned` the `lens` (checked against the model: UsageError for another model's lens,
    naming it as `source`)."""
    check_choice("decoder", kind, DECODERS)
    if kind == "embedding":
        return Decoder("embedding", view.W_E.detach(), tied=view.tied)
    if kind == "tuned":
        if lens is None:
            raise ValueError(
                "the tuned decoder needs a lens (resstream.analysis.decoding.tuned_lens.load_lens)"
            )
        lens.check_model(view, source=source)
        lens.translators.to(view.W_U.device)
    return Decoder(
        kind,
        view.W_U.detach(),
        bias=_detached(view.b_U),
        norm=view.final_norm,
        softcap=view.logit_softcap,
        tied=view.tied,
        lens=lens if kind == "tuned" else None,
    )


def _detached(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach()


__all__ = ["DECODERS", "Decoder", "DecoderKind", "ExactScorer", "NonFiniteInputs", "decoder_of"]
