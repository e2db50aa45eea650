"""`resstream.ablate(...)` and `resstream.patch(...)`: does a component matter for a prediction?

Both take one text (`text` or `text_file`; `text` a string, or token ids: a 1-D integer
tensor, a (1, T) tensor or a list of ints, used exactly as given, and a model object then
needs no tokenizer), the prediction at `position` (default the last) of
`target` (default the model's own top prediction there), an optional `foil`, and the
components to intervene on (`components`: names in the grammar of
`analysis.interventions.components`, `*` wildcards allowed; default: every head, every MLP
and the `top_neurons` neurons with the largest |DLA|). Every component is intervened on alone
at `positions` (default every position), and measured along the total path (everything
downstream recomputes) and, with `direct`, the direct path too (only through the residual
stream; it costs one more pass per component).

* `ablate`: `mode` zero (default), mean (each component's mean over `num_seqs` windows of
  `dataset`, cached per model and corpus) or resample (its activation in `num_seqs` other
  windows of the corpus, effects averaged over them);
* `patch`: activation patching between the text and `corrupt` (same length, or aligned at
  the end with `align_end`): `direction` "noise" puts the corrupted run's activations into
  the clean run, "denoise" the clean run's into the corrupted run.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

import torch
from tqdm.auto import tqdm

from resstream.analysis.attribution.readouts import readouts
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.interventions.atp import DEFAULT_CONFIRM, screen_and_confirm
from resstream.analysis.interventions.components import Component, ComponentSpace, parse_components
from resstream.analysis.interventions.effects import (
    PATHS,
    Readout,
    component_effects,
    mean_effects,
    prediction,
)
from resstream.analysis.interventions.engine import DEFAULT_BATCH
from resstream.analysis.interventions.faithfulness import neuron_dlas
from resstream.analysis.interventions.metrics import Measured
from resstream.analysis.interventions.paths import parse_receivers, path_effects, sender_pairs
from resstream.analysis.interventions.results import AtpScreen, Effect, InterventionResult, ScreenedComponent
from resstream.analysis.interventions.runs import (
    Means,
    Run,
    Values,
    accumulate_means,
    capture_run,
    mean_values,
    run_values,
    zero_values,
)
from resstream.api.inputs import (
    CorpusRequest,
    LoadOptions,
    corpus_stream,
    one_model,
    refuse_device_map,
    sample_corpus,
    takes_load_args,
)
from resstream.api.prediction import EncodedText, PredictionArgs, TextRequest
from resstream.api.texts import TextLike, given_ids, text_ids
from resstream.api.tokenizers import tokenizer_of
from resstream.data.tokenizer import token_text
from resstream.errors import UsageError, check_choice
from resstream.io import atomic_path, cache_root
from resstream.models import LoadedModel, ModelLike, ModelView
from resstream.models.evaluation import directory_fingerprint, model_fingerprint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from resstream.data import CorpusStream

ABLATIONS = ("zero", "mean", "resample")
DIRECTIONS = ("noise", "denoise")
#: Neurons intervened on by default (largest |DLA| at the position), and corpus windows
#: averaged by mean ablation and resampled by resample ablation.
TOP_NEURONS = 20
MEAN_WINDOWS = 16
RESAMPLE_WINDOWS = 8


@takes_load_args
def ablate(
    text: TextLike | None = None,
    *,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    components: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    mode: str = "zero",
    direct: bool = False,
    dataset: str = "shakespeare",
    num_seqs: int | None = None,
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    top_neurons: int = TOP_NEURONS,
    batch_size: int = DEFAULT_BATCH,
    progress: bool = False,
    **given: Unpack[PredictionArgs],
) -> InterventionResult:
    """Ablate components and measure the prediction (module docstring). `text`: a string, or
    token ids (a 1-D integer tensor, a (1, T) tensor or a list of ints, used exactly as given;
    a model object then needs no `tokenizer`). `mode` zero, mean or resample; mean and
    resample read `num_seqs` windows (default 16 and 8) of `dataset` sampled with `seed`, as
    long as the text. `direct`: measure the direct path too (default: the total path only).
    `model` is a spec or a loaded model with its `tokenizer`, as for `resstream.attribute`."""
    check_choice("mode", mode, ABLATIONS)
    refuse_device_map(given, "ablate", "interventions restart blocks on one device")
    _check_counts(top_neurons, batch_size)
    corpus = None if mode == "zero" else _Corpus.found(mode, dataset, num_seqs, seed, data_dir)
    asked = TextRequest.of(text, given)
    options = asked.load_options(given, tokenizer=tokenizer, progress=progress)
    with one_model(model, options) as loaded:
        setup = _Setup.of(loaded, asked, positions, direct)
        chosen = setup.components(components, top_neurons)
        if mode == "mean":
            for component in chosen:
                Means.check(component)
        clean = setup.readout.of_run(setup.run)
        resampled = None
        if corpus is not None and mode == "resample":
            other = capture_run(setup.view, corpus.windows(setup), attention=setup.sources(chosen))
            samples = [
                setup.effects(run_values(setup.run, other, k), chosen, mode, clean, batch_size, progress)
                for k in range(other.internals.input_ids.shape[0])
            ]
            effects, resampled = mean_effects(samples), len(samples)
        else:
            values = zero_values(setup.run) if corpus is None else corpus.mean_values(loaded, setup)
            effects = setup.effects(values, chosen, mode, clean, batch_size, progress)
        return setup.result("ablate", mode, clean, effects, samples=resampled)


@takes_load_args
def patch(
    text: TextLike | None = None,
    *,
    corrupt: TextLike,
    model: ModelLike = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    components: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    direction: str = "noise",
    align_end: bool = False,
    direct: bool = False,
    receivers: Sequence[str] | None = None,
    atp: bool = False,
    confirm: int = DEFAULT_CONFIRM,
    top_neurons: int = TOP_NEURONS,
    batch_size: int = DEFAULT_BATCH,
    progress: bool = False,
    **given: Unpack[PredictionArgs],
) -> InterventionResult:
    """Activation patching between `text` and `corrupt` (module docstring): each component
    alone takes its value from the other run; `fraction_*` of every effect is (patched −
    corrupt) / (clean − corrupt). Either text may be a string or token ids (a 1-D integer
    tensor, a (1, T) tensor or a list of ints, used exactly as given; with both as ids a model
    object needs no `tokenizer`). Texts of different lengths are refused unless `align_end`
    (then the texts are aligned at their last tokens and only the shared tail is patched).
    `direct`: measure the direct path too (default: the total path only).

    With `receivers` (``L5.H3.q``, ``L5.H3.k``, ``L5.H3.v``, ``L5.mlp``; `*` wildcards allowed),
    path patching adds one effect per component and receiver, its `path` the receiver's name:
    the component's change reaches the prediction only through that receiver's input
    (`analysis.interventions.paths`). A component named without `*` that does not write below
    a receiver is refused; of the default components or a wildcard's, those pairs are left out
    (a receiver that none of them writes below is refused).

    With `atp`, attribution patching (`analysis.interventions.atp`) first estimates to first
    order the effect of every head and neuron (or of the `components` named) from one forward
    and one backward; exact patching then confirms the `confirm` with the largest |estimate|,
    their effects carrying the `estimate`, and a note says how far the estimates were off.
    `confirm` 0 patches nothing exactly: the estimates alone. Either way the result's
    `screen` holds every head's and every neuron's estimate (`AtpScreen`, its `to_pandas()`
    one row per head and neuron; the command's screen.csv), `screened` those of every head
    and of the neurons with the largest |estimate| (or of the `components` named)."""
    check_choice("direction", direction, DIRECTIONS)
    refuse_device_map(given, "patch", "interventions restart blocks on one device")
    _check_counts(top_neurons, batch_size)
    if isinstance(corrupt, str) and not corrupt.strip():
        raise UsageError("`corrupt` is empty; give the corrupted text to patch from")
    corrupt_given = corrupt if isinstance(corrupt, str) else given_ids(corrupt, "`corrupt`")
    if atp and receivers:
        raise UsageError("`receivers` cannot be combined with `atp`; path patching is exact patching only")
    if atp and direct:
        raise UsageError(
            "`direct` cannot be combined with `atp`; attribution patching confirms the total effect only"
        )
    asked = TextRequest.of(text, given)
    both_ids = asked.reads_ids and not isinstance(corrupt_given, str)  # then no tokenizer is needed
    options = LoadOptions.of(given, tokenizer=tokenizer, progress=progress, reads_ids=both_ids)
    with one_model(model, options) as loaded:
        setup = _Setup.of(loaded, asked, positions, direct)
        read = text_ids(corrupt_given, setup.tokenizer, setup.view, "`corrupt`")
        corrupt_ids = _aligned(read, setup.ids, align_end)
        chosen = setup.components(components, top_neurons)
        received = parse_receivers(list(receivers), setup.space) if receivers else []
        named = bool(components) and not any("*" in name for name in components or ())
        sender_pairs(chosen, received, setup.view, strict=named)
        attention = setup.sources(chosen)
        dirty = capture_run(setup.view, corrupt_ids, attention=attention)
        clean = setup.readout.of_run(setup.run)
        corrupted = setup.readout.of_run(dirty)
        base, source = (setup.run, dirty) if direction == "noise" else (dirty, setup.run)
        notes: tuple[str, ...] = ()
        screened: tuple[ScreenedComponent, ...] = ()
        whole: AtpScreen | None = None
        if atp:
            confirmed = min(confirm, len(chosen)) if components else confirm  # runs
            screen = screen_and_confirm(
                base,
                source,
                setup.readout,
                clean=clean,
                corrupt=corrupted,
                among=chosen if components else None,
                confirm=confirm,
                positions=setup.positions,
                batch_size=batch_size,
                progress=setup.bar(progress and confirm > 0, confirmed),
            )
            effects, notes, screened, whole = screen.effects, (screen.note,), screen.screened, screen.screen
        else:
            values = run_values(base, source)
            effects = setup.effects(values, chosen, "patch", clean, batch_size, progress, base, corrupted)
            if received:
                effects += path_effects(
                    base,
                    setup.readout,
                    values,
                    chosen,
                    received,
                    mode="patch",
                    positions=setup.positions,
                    clean=clean,
                    corrupt=corrupted,
                    strict=named,
                    batch_size=batch_size,
                )
        tokens = tuple(token_text(setup.tokenizer, int(t)) for t in corrupt_ids[0])
        return setup.result(
            "patch",
            direction,
            clean,
            effects,
            corrupt=prediction(corrupted),
            corrupt_tokens=tokens,
            notes=notes,
            screened=screened,
            screen=whole,
        )


class _Setup:
    """One text's model, run, prediction and intervened positions."""

    def __init__(
        self,
        loaded: LoadedModel,
        text: EncodedText,
        run: Run,
        readout: Readout,
        positions: torch.Tensor | None,
        direct: bool,
    ) -> None:
        self.loaded, self.text, self.run, self.readout, self.positions = loaded, text, run, readout, positions
        self.view: ModelView = loaded.view
        self.ids, self.tokenizer = text.ids, text.tokenizer
        self.direct = direct

    @classmethod
    def of(
        cls, loaded: LoadedModel, asked: TextRequest, positions: Sequence[int] | None, direct: bool
    ) -> _Setup:
        text = asked.encoded(loaded)
        run = capture_run(loaded.view, text.ids, attention=False)
        decoder = decoder_of(loaded.view)
        chosen = text.target(decoder, run.internals)
        readout = Readout(decoder, text.position, chosen, text.foil(chosen))
        return cls(loaded, text, run, readout, _positions(positions, text.ids.shape[1]), direct)

    @property
    def space(self) -> ComponentSpace:
        d_ff = tuple(block.d_ff for block in self.view.blocks)
        experts = next((b.experts.n_experts for b in self.view.blocks if b.experts is not None), 0)
        return ComponentSpace(self.view.n_layers, self.view.n_heads, d_ff, int(self.ids.shape[1]), experts)

    def components(self, names: Sequence[str] | None, top_neurons: int) -> list[Component]:
        """The components named, or the defaults (module docstring). An attention source after
        the prediction's position is refused when named, left out of a wildcard's (`L2.H1.S*`:
        the sources the prediction can read)."""
        if names:
            chosen = parse_components(list(names), self.space)
            named = set(parse_components([n for n in names if "*" not in n], self.space))
            position = self.readout.position
            late = [c for c in chosen if c.kind == "source" and c.source > position]
            for c in late:
                if c in named or len(late) == len(chosen):
                    raise UsageError(
                        f"`component` {c.name}: source position {c.source} is after the prediction's "
                        f"position {position}; allowed: 0..{position}"
                    )
            kept = [c for c in chosen if c not in late]
            if self.sources(kept):  # attention sources read the recorded attention probabilities
                self.run = capture_run(self.view, self.ids, attention=True)
            return kept
        return self.space.heads() + self.space.sublayers() + self.top_neurons(top_neurons)

    def top_neurons(self, count: int) -> list[Component]:
        """The `count` neurons with the largest |DLA| at the prediction's position."""
        at = torch.tensor([self.readout.position])
        read = readouts(
            self.view, self.run.internals, self.readout.decoder, at, torch.tensor([self.readout.target])
        )
        scores = neuron_dlas(self.view, self.run.internals, read, self.readout.position)
        flat = torch.cat(scores).abs()
        top = flat.topk(min(count, len(flat))).indices
        d_ff = scores[0].shape[0]
        return sorted(Component(int(i) // d_ff, "neuron", int(i) % d_ff) for i in top)

    @staticmethod
    def sources(components: Sequence[Component]) -> bool:
        """Whether the runs need attention probabilities (attention sources)."""
        return any(c.kind == "source" for c in components)

    def bar(self, show: bool, total: int) -> _Progress | None:
        return _Progress(total) if show else None

    def effects(
        self,
        values: Values,
        chosen: list[Component],
        mode: str,
        clean: Measured,
        batch_size: int,
        progress: bool,
        base: Run | None = None,
        corrupt: Measured | None = None,
    ) -> list[Effect]:
        """Each chosen component alone set from `values` in `base` (default the text's own
        run), total effects (and direct ones, with `direct`); `corrupt` is the corrupted run's
        prediction."""
        return component_effects(
            self.run if base is None else base,
            self.readout,
            values,
            [[c] for c in chosen],
            mode=mode,
            positions=self.positions,
            clean=clean,
            corrupt=corrupt,
            paths=PATHS if self.direct else ("total",),
            batch_size=batch_size,
            progress=self.bar(progress, len(chosen)),
        )

    def result(self, command: str, mode: str, clean, effects, **extra) -> InterventionResult:
        readout, tokenizer = self.readout, self.tokenizer
        return InterventionResult(
            command=command,
            mode=mode,
            model=self.loaded.name,
            tokens=self.text.tokens(),
            position=readout.position,
            target_id=readout.target,
            target=token_text(tokenizer, readout.target),
            foil_id=readout.foil,
            foil=None if readout.foil is None else token_text(tokenizer, readout.foil),
            clean=prediction(clean),
            effects=tuple(effects),
            n_layers=self.view.n_layers,
            n_heads=self.view.n_heads,
            positions=None if self.positions is None else tuple(int(p) for p in self.positions),
            direct=self.direct,
            **extra,
        )


class _Progress:
    """A tqdm bar advanced by a count of interventions."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar = tqdm(total=total, desc="interventions", unit="run", leave=False)

    def __call__(self, count: int) -> None:
        self.bar.update(count)
        if self.bar.n >= self.total:
            self.bar.close()


def _positions(positions: Sequence[int] | None, length: int) -> torch.Tensor | None:
    if positions is None:
        return None
    out: list[int] = []
    for p in positions:
        where = p + length if p < 0 else p
        if not 0 <= where < length:
            raise UsageError(
                f"`positions` {p} is outside the text's {length} tokens; allowed: 0..{length - 1}"
            )
        out.append(where)
    if not out:
        raise UsageError("`positions` is empty; give at least one position (or none for every position)")
    return torch.tensor(sorted(set(out)), dtype=torch.long)


def _aligned(corrupt: torch.Tensor, clean: torch.Tensor, align_end: bool) -> torch.Tensor:
    """The corrupted ids, of the clean text's length: equal lengths as they are; different
    lengths refused, or with `align_end` cut or left-padded with the clean text's own tokens
    so that both texts end together."""
    n_clean, n_corrupt = clean.shape[1], corrupt.shape[1]
    if n_clean == n_corrupt:
        return corrupt
    if not align_end:
        raise UsageError(
            f"the text is {n_clean} tokens and `corrupt` is {n_corrupt} tokens; give texts of the same "
            "length, or set `align_end` to align them at their last tokens"
        )
    if n_corrupt > n_clean:
        return corrupt[:, n_corrupt - n_clean :]
    return torch.cat([clean[:, : n_clean - n_corrupt], corrupt], dim=1)


def _check_counts(top_neurons: int, batch_size: int) -> None:
    if top_neurons < 0:
        raise UsageError(f"`top_neurons` {top_neurons} is not allowed; allowed: 0 or more")
    if batch_size < 1:
        raise UsageError(f"`batch_size` {batch_size} is not allowed; allowed: 1 or more")


#: What the means cache's file names cover besides the model and the sample: the format of
#: its files (2: means kept in float64; the float32 files of format 1 are never read).
MEANS_FORMAT = 2


@dataclass(frozen=True)
class _Corpus:
    """The corpus of mean and resample ablation: `count` windows of `dataset` sampled with
    `seed`, as long as the text, and the corpus opened (None: a pinned `.jsonl`, read once
    the tokenizer is known) before any model is loaded (`found`)."""

    request: CorpusRequest
    stream: CorpusStream | None

    @classmethod
    def found(
        cls, mode: str, dataset: str, num_seqs: int | None, seed: int, data_dir: str | os.PathLike[str] | None
    ) -> _Corpus:
        """The corpus checked and opened: a bad `num_seqs`, an unknown name, a missing file or a
        corpus that is not available refused here, before the model loads (`inputs.corpus_stream`)."""
        count = (RESAMPLE_WINDOWS if mode == "resample" else MEAN_WINDOWS) if num_seqs is None else num_seqs
        if count < 1:
            raise UsageError(f"`num_seqs` {count} is not allowed; allowed: 1 or more")
        request = CorpusRequest(dataset, count, None, seed, data_dir)
        return cls(request, corpus_stream(request))

    def windows(self, setup: _Setup) -> torch.Tensor:
        """The windows as long as the text (batch, seq); the rows of a pinned `.jsonl` as given,
        cut to the text's length (a shorter row refused)."""
        length = int(setup.ids.shape[1])
        request = replace(self.request, seq_len=length)
        tokenizer = tokenizer_of(setup.loaded)  # a model given ids without one: refused here
        sample, _ = sample_corpus(request, tokenizer, setup.readout.decoder.vocab_size, self.stream)
        for number, row in enumerate(sample.sequences, start=1):
            if len(row) < length:
                raise UsageError(
                    f"`dataset` {request.dataset!r}: row {number} has {len(row)} tokens, fewer than the "
                    f"text's {length}; allowed: rows of {length} tokens or more"
                )
        return torch.stack([torch.as_tensor(s[:length], dtype=torch.long) for s in sample.sequences])

    def mean_values(self, loaded: LoadedModel, setup: _Setup) -> Values:
        """Mean ablation values, from the cache when this model and corpus sample were averaged
        before (`RESSTREAM_CACHE`/means). The corpus is named by its content (`key`), so
        another `data_dir` or an edited file is another sample."""
        path = self._cache_path(loaded, int(setup.ids.shape[1]))
        if path is not None and path.is_file():
            stored = torch.load(path, weights_only=True, map_location=setup.view.W_E.device)
            return mean_values(Means(**stored), setup.view)
        windows = self.windows(setup)
        means = accumulate_means(
            [capture_run(setup.view, windows[i : i + 1], attention=False) for i in range(len(windows))]
        )
        if path is not None:
            with atomic_path(path) as partial:
                torch.save({name: _on_cpu(getattr(means, name)) for name in MEANS_FIELDS}, partial)
        return mean_values(means, setup.view)

    def _cache_path(self, loaded: LoadedModel, length: int) -> Path | None:
        """The means file of this model, dtype, corpus content and sample; None for a model held
        in memory (its means are not cached)."""
        fingerprint = _model_key(loaded)
        if fingerprint is None:
            return None
        request = self.request
        identity = (
            MEANS_FORMAT,
            fingerprint,
            loaded.dtype,
            request.dataset,
            self.key(),
            request.num_seqs,
            length,
            request.seed,
        )
        return cache_root() / "means" / f"{hashlib.sha256(repr(identity).encode()).hexdigest()[:20]}.pt"

    def key(self) -> str:
        """The corpus's content fingerprint, read without tokenising: a pinned file's bytes, else
        one pass over the corpus stream."""
        if self.stream is None:
            return hashlib.sha256(Path(self.request.dataset).read_bytes()).hexdigest()[:16]
        return self.stream.scan()


def _on_cpu(value: object) -> object:
    """A field of `Means` as stored: tensors (and tuples of them) on the CPU, so a cache written
    on one device loads on any."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, tuple):
        return tuple(_on_cpu(v) for v in value)
    return value


#: The fields of `Means` the cache holds.
MEANS_FIELDS = ("z", "coefficients", "attn", "mlp", "resid", "count")


def _model_key(loaded: LoadedModel) -> str | None:
    """What names a model's weights for the means cache: a Hugging Face model's fingerprint, a
    resstream run directory's (or the built-in model's) weights; None for a model
    held in memory (its means are not cached)."""
    if loaded.source in ("reference", "resstream") and loaded.where is not None:
        return directory_fingerprint(loaded.where)
    return model_fingerprint(loaded)


__all__ = ["ablate", "patch"]
