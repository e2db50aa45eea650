"""The Python API the CLI mirrors: `resstream.lens(...)` and `resstream.shift(...)`.

Both load models through the adapters (a run directory, a local Hugging Face directory, a hub
name, or None for the built-in reference model), capture the residual stream with hooks and
hand it to the pure functions of `resstream.analysis`, returning frozen result objects.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from resstream.errors import UsageError, check_choice

DecoderKind = Literal["logit-lens", "embedding"]
DECODERS: tuple[str, ...] = ("logit-lens", "embedding")


@dataclass(frozen=True)
class ShiftReport:
    """`shift` over one or several models on one sample of sequences."""

    results: tuple[Any, ...]  # AlignmentResult per model
    dataset: str
    sample_rule: str
    dataset_fingerprint: str | None
    num_seqs: int
    seq_len: int | None  # None for pinned rows of varying length

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "sample": self.sample_rule,
            "dataset_fingerprint": self.dataset_fingerprint,
            "num_seqs": self.num_seqs,
            "seq_len": self.seq_len,
            "models": [r.to_dict() for r in self.results],
        }


def make_decoder(view: Any, kind: str) -> Any:
    """The analysis Decoder of a ModelView: logit lens (final norm, W_U, bias) or embedding."""
    from resstream.analysis.alignment import Decoder

    check_choice("decoder", kind, DECODERS)
    return Decoder.from_view(view, kind)


def decoding_note(view: Any, kind: str) -> str:
    """What decoder `kind` applies to a state of this model, in words (saved with results)."""
    if kind == "embedding":
        return "W_E · h (input embedding matrix, no norm)"
    matrix = "W_U = W_E (tied)" if view.tied else "the model's own unembedding W_U (untied from W_E)"
    bias = " + b_U" if getattr(view, "b_U", None) is not None else ""
    cap = (
        "; logit soft-capping ignored (monotone, ranks unchanged)"
        if getattr(view, "logit_softcap", None)
        else ""
    )
    return f"final norm, then {matrix}{bias}{cap}"


def decode_scores(decoder: Any) -> Any:
    """A function (n, d) states -> (n, vocab) fp32 scores for `decoder` (used by the lens)."""

    def decode(h: torch.Tensor) -> torch.Tensor:
        x = decoder.norm(h) if decoder.norm is not None else h
        scores = x.float() @ decoder.matrix.float().T
        return scores + decoder.bias.float() if decoder.bias is not None else scores

    return decode


def check_top_k(top_k: int, vocab: int) -> None:
    if not 1 <= top_k <= vocab:
        raise UsageError(f"--top-k {top_k} is outside [1, {vocab}] (the model's vocabulary)")


def check_length(length: int, view: Any, what: str) -> None:
    """UsageError when `length` tokens exceed the model's context; `what` names them ({n})."""
    if view.max_positions is not None and length > view.max_positions:
        raise UsageError(
            f"{what.format(n=length)} is longer than the model's context of "
            f"{view.max_positions} tokens; allowed: 2..{view.max_positions}"
        )


def lens(
    text: str,
    *,
    model: str | None = None,
    positions: range | slice | None = None,
    top_k: int = 1,
    decoder: str = "logit-lens",
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> tuple[Any, Any]:
    """Decoding trajectories of `text`: returns (LensResult, tokenizer).

    `model`, `dtype`, `device`, `device_map`, `trust_remote_code` and `progress` are those
    of `resstream.models.adapters.load_model`.
    """
    from resstream.analysis.lens import trajectories
    from resstream.capture import residual_states
    from resstream.models import load_model

    if not text.strip():
        raise UsageError("--text is empty")
    loaded = load_model(
        model,
        dtype=dtype,
        device=device,
        device_map=device_map,
        trust_remote_code=trust_remote_code,
        progress=progress,
    )
    view = loaded.view
    ids = loaded.tokenizer(text, add_special_tokens=True, return_tensors="pt")["input_ids"]
    check_length(ids.shape[1], view, "the text ({n} tokens)")
    check_top_k(top_k, view.W_U.shape[0])
    positions = _position_range(positions, ids.shape[1])
    device_of = next(view.model.parameters()).device
    states = residual_states(view, ids.to(device_of))[:, 0]
    result = trajectories(
        states,
        ids[0],
        decode_scores(make_decoder(view, decoder)),
        top_k=top_k,
        positions=positions,
        model=loaded.name,
        decoder=decoder,
    )
    return replace(result, decoding=decoding_note(view, decoder)), loaded.tokenizer


def _position_range(positions: range | slice | None, length: int) -> range | None:
    """A non-empty range inside 0..length (a slice's missing stop: the end); UsageError if not."""
    if positions is None:
        return None
    start = positions.start or 0
    stop = length if positions.stop is None else positions.stop
    if start < 0 or stop > length or stop <= start:
        raise UsageError(
            f"--positions {start}:{stop} is outside the text's 0:{length} tokens; "
            f"allowed: A:B with 0 <= A < B <= {length}"
        )
    return range(start, stop)


def _check_sample_length(sample: Any, view: Any, source: str) -> None:
    """The longest sampled sequence (or pinned row, named by number) must fit the context."""
    lengths = [len(seq) for seq in sample.sequences]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    what = (
        "--seq-len {n}"
        if sample.windows_available is not None
        else f"row {longest + 1} of {source!r} ({{n}} tokens)"
    )
    check_length(lengths[longest], view, what)


def _check_vocabulary(sample: Any, vocab: int, source: str) -> None:
    """Every token id must index the model's vocabulary (pinned rows may hold any integer)."""
    for row, seq in enumerate(sample.sequences, start=1):
        top = int(seq.max())
        if top >= vocab:
            where = f"row {row} of {source!r}" if sample.windows_available is None else f"{source!r}"
            raise UsageError(
                f"{where} holds token id {top}, outside the model's vocabulary of {vocab} "
                f"(allowed: 0..{vocab - 1})"
            )


def _sample(
    dataset: str,
    tokenizer: Any,
    *,
    num_seqs: int,
    seq_len: int,
    seed: int,
    data_dir: str | os.PathLike[str] | None,
) -> tuple[Any, str | None]:
    from resstream.data import default_split, load_token_rows, stream_corpus
    from resstream.data.sampling import sample_sequences, sample_token_rows

    if dataset.endswith(".jsonl") and Path(dataset).is_file():
        rows = load_token_rows(dataset)
        if rows is not None:
            digest = hashlib.sha256(Path(dataset).read_bytes()).hexdigest()[:16]
            return sample_token_rows(rows, source=dataset), digest
    corpus = stream_corpus(dataset, split=default_split(dataset), data_dir=data_dir)
    sample = sample_sequences(
        corpus, tokenizer, num_seqs=num_seqs, seq_len=seq_len, seed=seed, corpus_name=dataset
    )
    return sample, corpus.fingerprint


def _batches(sequences: Sequence[torch.Tensor], batch_size: int) -> Iterator[torch.Tensor]:
    """Stack sequences of equal length into batches (pinned rows may differ in length)."""
    by_length: dict[int, list[torch.Tensor]] = {}
    for seq in sequences:
        by_length.setdefault(len(seq), []).append(seq)
    for group in by_length.values():
        for start in range(0, len(group), batch_size):
            yield torch.stack(group[start : start + batch_size])


def shift(
    models: Sequence[str | None] = (None,),
    *,
    dataset: str = "shakespeare",
    num_seqs: int = 64,
    seq_len: int = 128,
    top_k: int = 5,
    decoder: str = "logit-lens",
    batch_size: int = 8,
    seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> ShiftReport:
    """Layer-wise alignment with the input and the next token over a corpus sample.

    Each model gets `num_seqs` windows of `seq_len` tokens sampled from `dataset` with `seed`
    by the same rule (see `resstream.data.sampling`) from its own tokenizer's token stream, so
    models that share a tokenizer see identical windows; or a `.jsonl` of `input_ids` rows used
    as given. Each model's entry records its own sample. Models are loaded one at a time
    (`_each_model`) and freed before the next; `progress` shows a bar per model.
    """
    check_choice("decoder", decoder, DECODERS)
    results, rule, sample, fingerprint = [], "", None, None
    corpus = CorpusRequest(dataset, num_seqs, seq_len, seed, data_dir)
    for loaded, sample, fingerprint in _each_model(  # noqa: B007 - the last fingerprint is reported
        models,
        corpus,
        batch_size=batch_size,
        dtype=dtype,
        device=device,
        device_map=device_map,
        trust_remote_code=trust_remote_code,
        progress=progress,
        check=lambda view: check_top_k(top_k, view.W_U.shape[0]),
    ):
        rule = sample.rule
        result = _align(
            loaded, sample.sequences, top_k=top_k, decoder=decoder, batch_size=batch_size, progress=progress
        )
        results.append(replace(result, sample=rule))
        del loaded  # free this model before the next is loaded
    lengths = {len(s) for s in sample.sequences} if sample is not None else set()
    return ShiftReport(
        tuple(results),
        dataset,
        rule,
        fingerprint,
        len(sample.sequences) if sample else 0,
        lengths.pop() if len(lengths) == 1 else None,
    )


@dataclass(frozen=True)
class CorpusRequest:
    """What to sample for an analysis: `num_seqs` windows of `seq_len` tokens of `dataset`
    with `seed`, or the rows of a pinned `.jsonl` (see `_sample`)."""

    dataset: str
    num_seqs: int
    seq_len: int
    seed: int
    data_dir: str | os.PathLike[str] | None


def _each_model(
    models: Sequence[str | None],
    corpus: CorpusRequest,
    *,
    batch_size: int,
    dtype: str,
    device: str,
    device_map: str | None,
    trust_remote_code: bool,
    progress: bool,
    check: Any = None,
) -> Iterator[tuple[Any, Any, str | None]]:
    """(loaded model, its sample, dataset fingerprint) for each model in turn.

    Every model is checked before any is loaded, so a bad one is refused before time is spent
    on the others. Each loaded model passes `check(view)` (if given), gets its own sample of
    the corpus (its tokenizer's token stream, tokenised once per distinct tokenizer), and the
    sample must fit its vocabulary and context. The generator drops its reference to a model
    before loading the next; the caller should too.
    """
    from resstream.models import check_model, load_model

    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size} must be >= 1")
    from resstream.data import tokenizer_fingerprint

    models = list(models) or [None]
    for spec in models:
        check_model(spec, trust_remote_code=trust_remote_code)
    samples: dict[str, tuple[Any, str | None]] = {}  # models sharing a tokenizer share a sample
    for spec in models:
        loaded = load_model(
            spec,
            dtype=dtype,
            device=device,
            device_map=device_map,
            trust_remote_code=trust_remote_code,
            progress=progress,
        )
        if check is not None:
            check(loaded.view)
        if not corpus.dataset.endswith(".jsonl"):  # pinned rows are checked once read
            check_length(corpus.seq_len, loaded.view, "--seq-len {n}")
        key = tokenizer_fingerprint(loaded.tokenizer)
        if key not in samples:
            samples[key] = _sample(
                corpus.dataset,
                loaded.tokenizer,
                num_seqs=corpus.num_seqs,
                seq_len=corpus.seq_len,
                seed=corpus.seed,
                data_dir=corpus.data_dir,
            )
        sample, fingerprint = samples[key]
        _check_vocabulary(sample, loaded.view.W_U.shape[0], corpus.dataset)
        _check_sample_length(sample, loaded.view, corpus.dataset)
        yield loaded, sample, fingerprint
        del loaded


def _each_batch(
    sequences: Sequence[torch.Tensor], batch_size: int, desc: str, progress: bool
) -> Iterator[torch.Tensor]:
    """The sequences in batches (`_batches`), with a progress bar counting sequences."""
    with tqdm(total=len(sequences), desc=desc, unit="seq", disable=not progress) as bar:
        for batch in _batches(sequences, batch_size):
            yield batch
            bar.update(len(batch))


def _align(
    loaded: Any,
    sequences: Sequence[torch.Tensor],
    *,
    top_k: int,
    decoder: str,
    batch_size: int,
    progress: bool,
) -> Any:
    """The AlignmentResult of one loaded model over the sequences."""
    from resstream.analysis.alignment import AlignmentAccumulator
    from resstream.capture import residual_states

    view = loaded.view
    accumulator = AlignmentAccumulator(
        num_layers=view.n_layers,
        top_k=top_k,
        decoder=make_decoder(view, decoder),
        W_E=view.W_E.detach(),
        W_U=view.W_U.detach(),
    )
    for batch in _each_batch(sequences, batch_size, f"shift {loaded.name}", progress):
        with torch.inference_mode():
            batch = batch.to(view.W_E.device)
            accumulator.update(residual_states(view, batch), batch)
    return replace(accumulator.result(loaded.name), tied=view.tied, decoding=decoding_note(view, decoder))


# --------------------------------------------------------------------------- positional bias

#: The four standard configurations of `resstream simulate --grid` (label, overrides).
GRID_GAMMA = 0.5


def grid_configurations(gamma: float = GRID_GAMMA) -> tuple[tuple[str, dict[str, Any]], ...]:
    """No LayerNorm; LayerNorm with γ = 0; LayerNorm with γ > 0; the same with the residual."""
    return (
        ("no LayerNorm", {"layernorm": False, "gamma": 0.0, "residual": False}),
        ("LayerNorm, γ = 0", {"layernorm": True, "gamma": 0.0, "residual": False}),
        (f"LayerNorm, γ = {gamma:g}", {"layernorm": True, "gamma": gamma, "residual": False}),
        (f"LayerNorm, γ = {gamma:g}, residual", {"layernorm": True, "gamma": gamma, "residual": True}),
    )


def simulate(*, grid: bool = False, progress: bool = True, **config: Any) -> tuple[tuple[str, Any], ...]:
    """Parameter-free causal attention stacks: ((label, SimulationResult), ...).

    `config` holds `resstream.simulation.SimulationConfig` fields. With `grid`, the four
    standard configurations (`grid_configurations`, γ from `config["gamma"]` when it is > 0)
    are run with the other fields shared; otherwise the one configuration given. Every config
    is checked before any is run.
    """
    from resstream.simulation import SimulationConfig
    from resstream.simulation import simulate as run_simulation

    if grid:
        gamma = config.get("gamma") or GRID_GAMMA
        runs = [(label, {**config, **overrides}) for label, overrides in grid_configurations(gamma)]
    else:
        runs = [(_simulation_label(config), config)]
    configs = [(label, SimulationConfig(**fields)) for label, fields in runs]
    results = []
    for label, cfg in configs:
        with tqdm(total=cfg.simulations, desc=f"simulate {label}", unit="sim", disable=not progress) as bar:
            results.append((label, run_simulation(cfg, progress=bar.update)))
    return tuple(results)


def _simulation_label(config: dict[str, Any]) -> str:
    norm = "LayerNorm" if config.get("layernorm", True) else "no LayerNorm"
    parts = [norm, f"γ = {config.get('gamma', 0.0):g}"]
    if config.get("residual", False):
        parts.append(f"residual λ = {config.get('residual_scale', 1.0):g}")
    return ", ".join(parts)


@dataclass(frozen=True)
class RecencyReport:
    """`recency` over one or several models on a corpus sample."""

    results: tuple[Any, ...]  # RecencyResult per model
    dataset: str
    dataset_fingerprint: str | None
    seq_len: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "dataset_fingerprint": self.dataset_fingerprint,
            "seq_len": self.seq_len,
            "models": [r.to_dict() for r in self.results],
        }


def recency(
    models: Sequence[str | None] = (None,),
    *,
    dataset: str = "shakespeare",
    num_seqs: int = 64,
    seq_len: int = 64,
    batch_size: int = 8,
    seed: int = 0,
    threshold: float = 3.0,
    data_dir: str | os.PathLike[str] | None = None,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> RecencyReport:
    """Mean attention by query and key position, per layer and head, over a corpus sample.

    The sample is drawn as for `shift` (all sequences must have one length: pinned rows of
    different lengths are refused). Each sequence is one sample of the statistics, so the
    verdicts are the simulation's (`resstream.analysis.recency`).
    """
    from resstream.analysis.recency import RecencyAccumulator
    from resstream.capture import attention_probs

    if not threshold > 0:
        raise UsageError(f"--threshold {threshold} must be > 0 (standard errors)")
    results, fingerprint, length = [], None, seq_len
    corpus = CorpusRequest(dataset, num_seqs, seq_len, seed, data_dir)
    for loaded, sample, fingerprint in _each_model(  # noqa: B007 - the last fingerprint is reported
        models,
        corpus,
        batch_size=batch_size,
        dtype=dtype,
        device=device,
        device_map=device_map,
        trust_remote_code=trust_remote_code,
        progress=progress,
    ):
        view = loaded.view
        lengths = {len(s) for s in sample.sequences}
        if len(lengths) != 1:
            raise UsageError(
                f"{dataset!r}: pinned rows have {len(lengths)} different lengths; recency "
                f"averages position by position and needs one length"
            )
        length = lengths.pop()
        accumulator = RecencyAccumulator(
            num_layers=view.n_layers, num_heads=view.n_heads, seq_len=length, threshold=threshold
        )
        for batch in _each_batch(sample.sequences, batch_size, f"recency {loaded.name}", progress):
            accumulator.update(attention_probs(view, batch))
        results.append(accumulator.result(loaded.name, sample=sample.rule, notes=view.notes))
        del loaded, view  # free this model before the next is loaded
    return RecencyReport(tuple(results), dataset, fingerprint, length)
