"""`resstream.steer(...)` and `resstream.attenuation(...)`: measuring steers and attenuations.

`steer` sweeps the coefficient c of Add(site, unit direction, c) over one or more sites and
scores each point as `analysis.steering.sweep` defines (the concept's probe score and token
log-probability on the steered continuations, the KL from the unsteered model on neutral
text, the continuations' perplexity under the unsteered model). Continuations are greedy,
`max_new_tokens` long, the edit acting at `where` ("all", "prompt" or "new" positions).

`attenuation` scales one block's identity path at inference, Scale(L{l}.resid, α) — the
trained model then computes α·h_l + F_l(h_l) at block l, as a model trained with resstream's
residual gate would — for every block and α, and scores each by its loss and shift layer on
one corpus sample; runs trained with attenuation (`reproduce`, `train`) are scored on the same
windows beside them.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import torch
from torch import Tensor
from tqdm.auto import tqdm

from resstream.analysis.steering.generation import Sampling, check_room
from resstream.analysis.steering.sweep import (
    AttenuationPoint,
    AttenuationResult,
    SteerPoint,
    SteerResult,
    TrainedPoint,
    concept_logprob,
    continuation_nll,
    mean_kl,
    mean_or_none,
    probe_probability,
)
from resstream.api.generate import DEFAULT_BATCH, WHERES, Where, end_of_text, generate_all, new_tokens
from resstream.api.inputs import CorpusRequest, LoadOptions, one_model, one_sampled_model, takes_load_args
from resstream.api.texts import TextsLike, text_ids, text_list
from resstream.api.tokenizers import LEADING_SPACE, single_token, tokenizer_of
from resstream.data.tokenizer import decoded_text
from resstream.errors import UsageError
from resstream.models import LoadArgs, ModelLike, ModelView
from resstream.stream.edited import edited
from resstream.stream.edits import Add, Scale, StreamEdit, resolve
from resstream.stream.trace import trace

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: The coefficients swept when none are given (0: the unsteered model).
DEFAULT_COEFS = (0.0, 2.0, 4.0, 8.0, 16.0)
#: The identity-path factors of the attenuation map when none are given (1: the model itself).
DEFAULT_ALPHAS = (1.0, 0.9, 0.75, 0.5, 0.25)

#: A concept probe: the site it reads, its weight (d_model,) and bias.
Probe = tuple[str, Tensor, float]


@takes_load_args
def steer(
    model: ModelLike = None,
    *,
    directions: Mapping[str, Tensor],
    prompts: TextsLike,
    coefs: Sequence[float] = DEFAULT_COEFS,
    neutral: TextsLike | None = None,
    concept_tokens: Sequence[str] = (),
    probe: Probe | None = None,
    max_new_tokens: int = 24,
    where: Where = "all",
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> SteerResult:
    """The steering trade-off of each direction (module docstring).

    `directions` maps a site (``L6.resid``) to the direction added there (normalised to unit
    length: a coefficient is the length added); `prompts` are continued at every point,
    `neutral` texts (default: the prompts) measure the KL; `concept_tokens` (each one token of
    the model's tokenizer) and `probe` (site, weight, bias) score the concept — either may be
    left out, and its score is then None. `prompts` and `neutral` may be token ids, as for
    `resstream.generate` (with ids only and no `concept_tokens`, a model object needs no
    `tokenizer`). UsageError, before anything runs, for a site or a
    direction the model does not have, a coefficient that is not finite, or a concept token
    that is not one token."""
    checked = _checked_coefs(coefs)
    if where not in WHERES:
        raise UsageError(f"`where` {where!r}; allowed: {', '.join(WHERES)}")
    if not directions:
        raise UsageError("`directions` is empty: give a site and its direction, e.g. {'L6.resid': vector}")
    sampling = Sampling(max_new_tokens=max_new_tokens)
    sampling.check()
    listed = text_list(prompts, "prompts", "`prompts`: give one or more non-empty texts")
    neutral_listed = listed  # no `neutral` (or an empty list): the prompts
    if neutral is not None and not (isinstance(neutral, (list, tuple)) and not neutral):
        neutral_listed = text_list(neutral, "neutral", "`neutral`: give one or more non-empty texts")
    every = [*listed, *neutral_listed]
    ids_only = not concept_tokens and not any(isinstance(t, str) for t in every)
    options = LoadOptions.of(load, tokenizer=tokenizer, progress=progress, reads_ids=ids_only)
    with one_model(model, options) as loaded:
        view, reader = loaded.view, loaded.tokenizer
        units = {site: _unit(site, vector) for site, vector in directions.items()}
        resolve([Add(site, unit) for site, unit in units.items()], view)
        if probe is not None:
            resolve([Add(probe[0], probe[1])], view)  # the probe's site and width, checked alike
        concept = _concept_ids(tokenizer_of(loaded), concept_tokens) if concept_tokens else None
        encoded = [text_ids(p, reader, view, f"`prompts` item {i}")[0] for i, p in enumerate(listed)]
        check_room(view, max(len(ids) for ids in encoded), sampling)
        neutral_ids = [
            text_ids(t, reader, view, f"`neutral` item {i}")[0] for i, t in enumerate(neutral_listed)
        ]
        scorer = _Scorer(view, encoded, neutral_ids, concept, probe, end_of_text(view, reader))
        plain = scorer.generate([], sampling, where)
        points = []
        with tqdm(total=len(units) * len(checked), desc="steer", unit="point", disable=not progress) as bar:
            for site, unit in units.items():
                for coef in checked:
                    edits: list[StreamEdit] = [Add(site, unit, coef=coef)]
                    found = plain if coef == 0 else scorer.generate(edits, sampling, where)
                    points.append(scorer.point(site, coef, edits, found, plain, reader))
                    bar.update()
        settings = {
            "prompts": [_recorded(p) for p in listed],
            "neutral": [_recorded(t) for t in neutral_listed],
            "concept_tokens": list(concept_tokens),
            "probe_site": None if probe is None else probe[0],
            "max_new_tokens": max_new_tokens,
            "where": where,
            "direction_norms": {site: float(v.double().norm()) for site, v in directions.items()},
        }
        return SteerResult(loaded.name, tuple(points), settings)


def _checked_coefs(coefs: Sequence[float]) -> list[float]:
    listed = [float(c) for c in coefs]
    if not listed or not all(math.isfinite(c) for c in listed):
        raise UsageError(f"`coefs` {list(coefs)!r}; allowed: one or more finite numbers")
    return sorted(set(listed))


def _recorded(text: str | Tensor) -> str | list[int]:
    """A prompt as the settings record it: its text, or its ids as a list."""
    return text if isinstance(text, str) else [int(t) for t in text[0]]


def _unit(site: str, vector: Tensor) -> Tensor:
    vector = torch.as_tensor(vector).detach().double()
    norm = float(vector.norm())
    if not math.isfinite(norm) or norm == 0:
        raise UsageError(f"`directions`[{site!r}] is zero or not finite; allowed: a nonzero finite vector")
    return vector / norm


def _concept_ids(reader: Any, tokens: Sequence[str]) -> Tensor | None:
    """Each concept token's id (`single_token`: each must be one token), None for none."""
    ids = {single_token(reader, token, "`concept_tokens`:", LEADING_SPACE) for token in tokens}
    return torch.tensor(sorted(ids), dtype=torch.long) if ids else None


class _Scorer:
    """The prompts, neutral texts and concept of one sweep, and the forwards that score it."""

    def __init__(
        self,
        view: ModelView,
        prompts: list[Tensor],
        neutral: list[Tensor],
        concept: Tensor | None,
        probe: Probe | None,
        eos: int | None,
    ) -> None:
        self.view, self.prompts, self.neutral = view, prompts, neutral
        self.concept, self.probe, self.eos = concept, probe, eos
        self.clean_neutral = trace(view, [t.tolist() for t in neutral], ["logits"])["logits"]

    def generate(self, edits: list[StreamEdit], sampling: Sampling, where: Where) -> list[list[int]]:
        """Each prompt with its continuation under `edits`, cut after an end-of-text token."""
        found = generate_all(self.view, self.prompts, edits, where, sampling, False, DEFAULT_BATCH, self.eos)
        return [
            prompt.tolist() + list(new_tokens(found[index][0], len(prompt), self.eos))
            for index, prompt in enumerate(self.prompts)
        ]

    def point(
        self,
        site: str,
        coef: float,
        edits: list[StreamEdit],
        found: list[list[int]],
        plain: list[list[int]],
        reader: Any,
    ) -> SteerPoint:
        """The scores of one site and coefficient (`analysis.steering.sweep`)."""
        names = ["logits"] + ([self.probe[0]] if self.probe is not None else [])
        clean = trace(self.view, found, names)
        steered = trace(self.view, found, ["logits"], edits=edits)["logits"]
        nll, concept, probed = [], [], []
        for row, ids in enumerate(found):
            start, length = len(self.prompts[row]), len(ids)
            if length <= start:
                continue
            tokens = torch.tensor(ids)
            nll += continuation_nll(clean["logits"][row, :length], tokens, start).tolist()
            if self.concept is not None:
                concept += concept_logprob(steered[row, start - 1 : length - 1], self.concept).tolist()
            if self.probe is not None:
                states = clean[self.probe[0]][row, start:length]
                probed.append(probe_probability(states, self.probe[1], self.probe[2]))
        with edited(self.view, edits):
            kl = self._neutral_kl()
        changed = sum(a != b for a, b in zip(found, plain, strict=True)) / len(found)
        example = decoded_text(reader, found[0][len(self.prompts[0]) :])
        return SteerPoint(
            site=site,
            coef=coef,
            concept_score=mean_or_none(probed),
            concept_logprob=mean_or_none(concept),
            kl=kl,
            perplexity=math.exp(sum(nll) / len(nll)) if nll else math.nan,
            changed=changed,
            example=example,
        )

    def _neutral_kl(self) -> float:
        steered = trace(self.view, [t.tolist() for t in self.neutral], ["logits"])["logits"]
        values = [
            mean_kl(self.clean_neutral[row, : len(t)], steered[row, : len(t)])
            for row, t in enumerate(self.neutral)
        ]
        return sum(values) / len(values)


@takes_load_args
def attenuation(
    model: ModelLike = None,
    *,
    layers: Sequence[int] | None = None,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    runs: Sequence[str | os.PathLike[str]] = (),
    dataset: str = "shakespeare",
    num_seqs: int = 16,
    seq_len: int | None = 64,
    top_k: int = 5,
    seed: int = 0,
    batch_size: int = 8,
    data_dir: str | os.PathLike[str] | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = False,
    **load: Unpack[LoadArgs],
) -> AttenuationResult:
    """The inference-time attenuation map (module docstring): for each block of `layers`
    (default: every block) and each α of `alphas`, the loss and shift layer of the model with
    Scale(L{l}.resid, α), on `num_seqs` windows of `seq_len` tokens of `dataset`; each run of
    `runs` (resstream run directories, e.g. `reproduce`'s attenuated variants) is scored on the
    same windows. UsageError for a block out of range, an α not in (0, 1], or a run whose
    tokenizer reads the windows differently."""
    factors = _checked_alphas(alphas)
    corpus = CorpusRequest(dataset, num_seqs, seq_len, seed, data_dir)
    with (
        one_sampled_model(
            model, corpus, load, tokenizer=tokenizer, progress=progress, batch_size=batch_size
        ) as (
            loaded,
            sample,
            fingerprint,
        ),
        tempfile.TemporaryDirectory(prefix="resstream-attenuation-") as tmp,
    ):
        view = loaded.view
        blocks = _checked_layers(layers, view.n_layers)
        windows = [s.tolist() for s in sample.sequences]
        pinned = Path(tmp) / "windows.jsonl"
        pinned.write_text("".join(json.dumps({"input_ids": w}) + "\n" for w in windows), encoding="utf-8")
        score = _WindowScorer(windows, str(pinned), top_k, batch_size)
        scaled = [(layer, alpha) for layer in blocks for alpha in factors if alpha != 1.0]
        bar = tqdm(total=1 + len(scaled) + len(runs), desc="attenuation", unit="model", disable=not progress)
        with bar:
            base = score(loaded, [])
            bar.update()
            points = [AttenuationPoint(layer, 1.0, *base) for layer in blocks if 1.0 in factors]
            for layer, alpha in scaled:
                points.append(
                    AttenuationPoint(layer, alpha, *score(loaded, [Scale(f"L{layer}.resid", alpha)]))
                )
                bar.update()
            trained = []
            for run in runs:
                trained.append(_trained(run, score, loaded))
                bar.update()
        settings = {
            "dataset": dataset,
            "num_seqs": len(windows),
            "seq_len": len(windows[0]) if windows else None,
            "seed": seed,
            "top_k": top_k,
            "dataset_fingerprint": fingerprint,
        }
        return AttenuationResult(loaded.name, view.n_layers, tuple(points), tuple(trained), settings)


def _checked_alphas(alphas: Sequence[float]) -> list[float]:
    listed = [float(a) for a in alphas]
    if not listed or not all(math.isfinite(a) and 0 < a <= 1 for a in listed):
        raise UsageError(f"`alphas` {list(alphas)!r}; allowed: one or more factors in (0, 1]")
    return sorted(set(listed), reverse=True)


def _checked_layers(layers: Sequence[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    listed = sorted({int(layer) for layer in layers})
    if not listed or not all(0 <= layer < n_layers for layer in listed):
        raise UsageError(f"`layers` {list(layers)!r}; allowed: blocks 0..{n_layers - 1}")
    return listed


class _WindowScorer:
    """The loss and shift layer of a model (under edits) on fixed windows."""

    def __init__(self, windows: list[list[int]], pinned: str, top_k: int, batch_size: int) -> None:
        self.windows, self.pinned, self.top_k, self.batch_size = windows, pinned, top_k, batch_size

    def __call__(self, loaded: Any, edits: list[StreamEdit]) -> tuple[float, float | None]:
        from resstream.api.shift import shift

        with edited(loaded.view, edits):
            logits = trace(loaded.view, self.windows, ["logits"], batch_size=self.batch_size)["logits"]
            report = shift(loaded, dataset=self.pinned, top_k=self.top_k, batch_size=self.batch_size)
        losses = [continuation_nll(logits[i], torch.tensor(w), 1).mean() for i, w in enumerate(self.windows)]
        return float(torch.stack(losses).mean()), report.results[0].shift_layer


def _trained(run: str | os.PathLike[str], score: _WindowScorer, reference: Any) -> TrainedPoint:
    """A trained run scored on the same windows (its tokenizer must read them alike)."""
    from resstream.models.loading import load_model

    loaded = load_model(run, progress=False)
    own, theirs = loaded.tokenizer, reference.tokenizer
    if own is not None and theirs is not None and own.get_vocab() != theirs.get_vocab():
        raise UsageError(f"`runs`: {str(run)!r} reads text with another tokenizer than the model's")
    config = getattr(loaded.view.model, "config", None)
    gate = str(getattr(config, "gate", "none"))
    layer = getattr(config, "resolved_cut_layer", None) if gate == "fixed" else None
    alpha = getattr(config, "alpha", None) if gate == "fixed" else None
    return TrainedPoint(loaded.name, gate, layer, alpha, *score(loaded, []))


__all__ = ["DEFAULT_ALPHAS", "DEFAULT_COEFS", "Probe", "attenuation", "steer"]
