"""Directions read from data: DiffMean, the first principal component of paired differences and
a logistic-regression probe at every layer, each scored by its held-out ROC-AUC.

Input: one state per text and layer, `positive` (P, layers, d) and `negative` (N, layers, d),
each text already reduced by its position rule (`resstream.api.directions` reads them); layer l
is h_l (`L{l}.resid`): h_0 the input of block 0, h_l for l ≥ 1 the output of block l−1
(0-based), before the final norm.

Split (`held_out_split`): a seeded fraction `held_out` of each set is held out (contrast pairs:
of the pairs, so a pair is wholly in or out); every method trains on the rest and is scored on
the same held-out texts. Each set needs at least `MIN_TRAIN` training texts and one held out.

Methods, on the training split only. Each gives a unit direction u, its sign chosen so that the
positives project higher: Δμ·u ≥ 0, Δμ = mean(positive) − mean(negative) over the training split.

* ``diffmean``: u ∝ Δμ.
* ``pca``: the first principal component of paired differences pos_i − neg_i, uncentred (the top
  right singular vector of the matrix of differences, as llama.cpp's cvector-generator finds it
  by power iteration on DᵀD: centring would remove the mean difference, DiffMean, from it). Sets
  given as pairs use their training pairs; other sets are paired in order after a shuffle seeded
  with `seed` (the larger set's extra texts left out).
* ``probe``: an L2-regularised logistic regression in float64, its features standardised by the
  training split's mean and standard deviation (a constant feature keeps scale 1), a bias column
  regularised like the weights, minimising mean log-loss + (`probe_l2`/2)·‖w‖² by Newton's method
  with a backtracking line search (in the n-dimensional span of the training texts when there
  are fewer texts than features); u ∝ w/σ, the weights in the state's own coordinates.

Raw vector and norm: raw = (Δμ·u)·u, the class means' separation along u (for DiffMean, Δμ
itself), and norm = Δμ·u. Adding raw to the negatives' mean state moves it to the positives'
mean along u, the scale `resstream.Add(site, raw)` and an exported control vector use.

Scores: the held-out ROC-AUC of concept detection (as AxBench measures it: positives against
negatives, by a score per text), here the projection x·u of each held-out text's state; the
Mann–Whitney statistic with ties counted half (`roc_auc`). `train_auc` is the same on the
training split. Cosines: between the methods' directions at each layer, and between each
direction and the unembedding rows W_U[t] of chosen tokens (no final norm or its gain applied);
NaN where a direction or row is zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor

from resstream.checks import check_fraction
from resstream.display import Displayable
from resstream.errors import RunError, UsageError, check_choice
from resstream.reprs import summary

Method = Literal["diffmean", "pca", "probe"]
METHODS: tuple[Method, ...] = ("diffmean", "pca", "probe")
Position = Literal["last", "mean"]
POSITIONS: tuple[Position, ...] = ("last", "mean")
Pairing = Literal["given", "shuffled"]

#: The default held-out fraction, and the fewest training texts a set may keep.
HELD_OUT = 0.25
MIN_TRAIN = 2
#: The probe's L2 strength λ (on standardised features), and Newton's limits.
PROBE_L2 = 1e-2
_NEWTON_STEPS = 50
_NEWTON_TOLERANCE = 1e-20

#: How the layers are named, as results and files state it.
LAYER_CONVENTION = (
    "L{l}.resid = h_l: h_0 the input of block 0 (the embedding), h_l (l >= 1) the output of "
    "block l-1 (0-based), before the final norm"
)


def site_name(layer: int) -> str:
    """The residual state's name in resstream's component grammar: ``L6.resid``."""
    return f"L{layer}.resid"


def check_position(position: str) -> Position:
    """`position` if it is a position rule (`POSITIONS`), else UsageError listing them."""
    return check_choice("`position`", position, POSITIONS)  # type: ignore[return-value]


def held_out_count(n: int, held_out: float) -> int:
    """Texts held out of a set of `n`: `held_out`·n rounded half up, at least one."""
    return max(1, int(held_out * n + 0.5))


def minimum_texts(held_out: float) -> int:
    """The fewest texts a set needs to hold out `held_out` and keep `MIN_TRAIN` to train on."""
    n = MIN_TRAIN + 1
    while n - held_out_count(n, held_out) < MIN_TRAIN:
        n += 1
    return n


def check_set_size(what: str, n: int, held_out: float) -> None:
    """UsageError when a set of `n` texts (`what`: a parameter in backticks) is too small to
    split with `held_out`, naming the minimum."""
    check_fraction("held_out", held_out)
    least = minimum_texts(held_out)
    if n < least:
        kind = "pair" if "pairs" in what else "text"
        raise UsageError(
            f"{what} has {n} {kind}{'s' * (n != 1)}: too few to hold out a fraction {held_out:g} "
            f"and train on the rest; allowed: at least {least} {kind}s (with `held_out` {held_out:g})"
        )


@dataclass(frozen=True, eq=False)
class HeldOutSplit:
    """Which texts (indices into each set, ascending) train and which are held out, and the
    pairs (`pair_positive[i]`, `pair_negative[i]`) of training texts whose differences the
    first principal component reads; `pairing` says whether they were given or made."""

    train_positive: Tensor
    test_positive: Tensor
    train_negative: Tensor
    test_negative: Tensor
    pair_positive: Tensor
    pair_negative: Tensor
    pairing: Pairing

    def counts(self) -> dict[str, int]:
        """The size of each part: train/test × positive/negative, and the pairs."""
        return {
            "train_positive": len(self.train_positive),
            "test_positive": len(self.test_positive),
            "train_negative": len(self.train_negative),
            "test_negative": len(self.test_negative),
            "pairs": len(self.pair_positive),
        }


def held_out_split(
    n_positive: int, n_negative: int, *, held_out: float = HELD_OUT, seed: int = 0, paired: bool = False
) -> HeldOutSplit:
    """The split of the module docstring, drawn with `seed` (torch's generator: the same split
    on every machine). `paired`: the i-th texts of the two sets are a pair (equal sizes); else
    each set is split on its own and the training texts are paired after a seeded shuffle."""
    generator = torch.Generator().manual_seed(seed)
    if paired:
        if n_positive != n_negative:
            raise ValueError(f"pairs need sets of one size, got {n_positive} and {n_negative}")
        check_set_size("`pairs`", n_positive, held_out)
        train, test = _split(n_positive, held_out, generator)
        return HeldOutSplit(train, test, train, test, train, train, "given")
    check_set_size("`positive`", n_positive, held_out)
    check_set_size("`negative`", n_negative, held_out)
    train_pos, test_pos = _split(n_positive, held_out, generator)
    train_neg, test_neg = _split(n_negative, held_out, generator)
    shuffled_pos = train_pos[torch.randperm(len(train_pos), generator=generator)]
    shuffled_neg = train_neg[torch.randperm(len(train_neg), generator=generator)]
    pairs = min(len(shuffled_pos), len(shuffled_neg))
    return HeldOutSplit(
        train_pos, test_pos, train_neg, test_neg, shuffled_pos[:pairs], shuffled_neg[:pairs], "shuffled"
    )


def _split(n: int, held_out: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(training indices, held-out indices) of a set of `n`, each ascending."""
    order = torch.randperm(n, generator=generator)
    test = held_out_count(n, held_out)
    return order[test:].sort().values, order[:test].sort().values


# --------------------------------------------------------------------------- measures


def roc_auc(positive: Tensor, negative: Tensor) -> float:
    """The probability that a positive's score exceeds a negative's, ties counted half: the
    Mann–Whitney U of the scores over P·N, from their mid-ranks (tied scores share the mean of
    the ranks they occupy). ValueError when either set is empty."""
    pos, neg = positive.double().flatten(), negative.double().flatten()
    if not len(pos) or not len(neg):
        raise ValueError("the ROC-AUC needs at least one positive and one negative score")
    _, group, counts = torch.unique(
        torch.cat([pos, neg]), sorted=True, return_inverse=True, return_counts=True
    )
    last_rank = counts.cumsum(0).double()  # 1-based rank of each distinct score's last occurrence
    mid_rank = last_rank - (counts.double() - 1) / 2
    rank_sum = mid_rank[group[: len(pos)]].sum()
    u = rank_sum - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def unit(vector: Tensor) -> Tensor:
    """`vector` / ‖vector‖, or zeros for a zero vector."""
    norm = vector.norm()
    return vector / norm if norm > 0 else torch.zeros_like(vector)


def cosines(rows: Tensor, others: Tensor) -> Tensor:
    """(len(rows), len(others)) cosines between the rows of two matrices; NaN where a row is 0."""
    a, b = rows.norm(dim=-1, keepdim=True), others.norm(dim=-1, keepdim=True)
    found = (rows / a.clamp_min(1e-300)) @ (others / b.clamp_min(1e-300)).T
    return found.masked_fill((a == 0) | (b == 0).T, float("nan"))


def first_principal_component(differences: Tensor) -> Tensor:
    """The unit top right singular vector of `differences` (pairs × d), uncentred; its sign is
    the caller's to choose."""
    _, _, vh = torch.linalg.svd(differences, full_matrices=False)
    return vh[0]


def logistic_probe(features: Tensor, labels: Tensor, l2: float = PROBE_L2) -> tuple[Tensor, float]:
    """(weight, bias) in the features' own coordinates of the module docstring's logistic
    regression of `labels` (0/1) on `features` (n × d, float64): σ(weight·x + bias) is the
    probability that x is a positive."""
    mean = features.mean(0)
    std = features.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    design = torch.cat([(features - mean) / std, torch.ones_like(features[:, :1])], dim=1)
    fitted = _newton_logistic(design, labels.double(), l2)
    weight = fitted[:-1] / std
    return weight, float(fitted[-1] - weight @ mean)


def _newton_logistic(x: Tensor, y: Tensor, l2: float) -> Tensor:
    """argmin_w mean(softplus(x·w) − y·(x·w)) + l2/2·‖w‖² by Newton's method, in the span of
    the rows of `x` (w = xᵀα, n unknowns) when it has fewer rows than columns."""
    n, k = x.shape
    if k > n:
        return x.T @ _newton_in_span(x @ x.T, y, l2)
    w = torch.zeros(k, dtype=x.dtype)
    for _ in range(_NEWTON_STEPS):
        s = x @ w
        p = torch.sigmoid(s)
        grad = x.T @ (p - y) / n + l2 * w
        hessian = (x.T * (p * (1 - p))) @ x / n + l2 * torch.eye(k, dtype=x.dtype)
        step = -torch.linalg.solve(hessian, grad)
        t = _backtrack(partial(_objective, s, x @ step, w, step, y, l2, None), grad @ step)
        if t == 0.0:
            break
        w = w + t * step
    return w


def _newton_in_span(gram: Tensor, y: Tensor, l2: float) -> Tensor:
    """α of w = xᵀα for `_newton_logistic`, from the Gram matrix x·xᵀ alone: the scores are
    gram·α, ‖w‖² = αᵀ·gram·α, the gradient xᵀ(r/n + l2·α) with r = p − y, and the Newton step
    xᵀβ solves (diag(p(1−p))·gram/n + l2·I)·β = −(r/n + l2·α)."""
    n = len(y)
    alpha = torch.zeros(n, dtype=gram.dtype)
    for _ in range(_NEWTON_STEPS):
        s = gram @ alpha
        p = torch.sigmoid(s)
        coefficient = (p - y) / n + l2 * alpha
        system = (p * (1 - p)).unsqueeze(1) * gram / n + l2 * torch.eye(n, dtype=gram.dtype)
        beta = -torch.linalg.solve(system, coefficient)
        moved = gram @ beta
        t = _backtrack(partial(_objective, s, moved, alpha, beta, y, l2, (s, moved)), coefficient @ moved)
        if t == 0.0:
            break
        alpha = alpha + t * beta
    return alpha


def _objective(
    s: Tensor,
    moved: Tensor,
    at: Tensor,
    step: Tensor,
    y: Tensor,
    l2: float,
    in_span: tuple[Tensor, Tensor] | None,
    t: float,
) -> float:
    """The regularised loss a step `t` along `step` from `at` reaches: scores s + t·moved, and
    ‖w‖² as (at + t·step)² or, in the span (`in_span` = (gram·α, gram·β)), (α + tβ)ᵀ·gram·(α + tβ)."""
    scores = s + t * moved
    loss = (torch.nn.functional.softplus(scores) - y * scores).mean()
    moved_at = at + t * step
    square = moved_at.square().sum() if in_span is None else moved_at @ (in_span[0] + t * in_span[1])
    return float(loss + l2 / 2 * square)


def _backtrack(objective: Callable[[float], float], slope: Tensor) -> float:
    """The step t ∈ {1, ½, ¼, …} that lowers `objective(t)` enough (Armijo, ¼ of the slope);
    0.0 when the Newton decrement −slope is below tolerance or no step helps (converged)."""
    if -float(slope) < _NEWTON_TOLERANCE:
        return 0.0
    start = objective(0.0)
    t = 1.0
    while t > 1e-12:
        if objective(t) <= start + 0.25 * t * float(slope):
            return t
        t /= 2
    return 0.0


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True, eq=False)
class DirectionsResult(Displayable, renderer="resstream.reporting.steering"):
    """Directions at every layer (module docstring), by method (`methods`, `METHODS`) and layer
    (`layers`, 0..L: h_l = `L{l}.resid`).

    `unit` and `raw` are (methods, layers, d) float64 (`direction`), `norm`, `auc` (held out)
    and `train_auc` (methods, layers), `method_cosines` (layers, methods, methods) and
    `token_cosines` (methods, layers, tokens) for the `tokens` (text, as given) and `token_ids`;
    `probe_weight` (layers, d) and `probe_bias` (layers,) are the probe as a classifier of a
    state h (σ(weight·h + bias): the probability that h is a positive's).
    `split` says which texts trained and which were held out; `source` where the texts came
    from; `model_fingerprint` what identifies the weights (None when not known), `model_hint`
    the architecture name an exported control vector names (`controlvector.model_hint`)."""

    model: str
    position: Position
    layers: tuple[int, ...]
    unit: Tensor
    raw: Tensor
    norm: Tensor
    auc: Tensor
    train_auc: Tensor
    method_cosines: Tensor
    token_cosines: Tensor
    probe_weight: Tensor
    probe_bias: Tensor
    split: HeldOutSplit
    held_out: float
    seed: int
    tokens: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()
    source: str = ""
    probe_l2: float = PROBE_L2
    model_fingerprint: str | None = None
    family: str = ""
    model_hint: str = ""
    methods: tuple[Method, ...] = METHODS

    def __repr__(self) -> str:
        method, layer, auc = self.best()
        counts = self.split.counts()
        return summary(
            self,
            repr(self.model),
            f"{len(self.layers)} layers × {len(self.methods)} methods",
            f"position {self.position}",
            f"{self.n_positive} positive, {self.n_negative} negative texts "
            f"({counts['test_positive']} + {counts['test_negative']} held out)",
            f"best held-out AUC {auc:.3f} ({method} at {site_name(layer)})",
        )

    @property
    def n_positive(self) -> int:
        """Positive texts, training and held out."""
        return len(self.split.train_positive) + len(self.split.test_positive)

    @property
    def n_negative(self) -> int:
        """Negative texts, training and held out."""
        return len(self.split.train_negative) + len(self.split.test_negative)

    @property
    def d_model(self) -> int:
        """The width of a direction."""
        return int(self.unit.shape[-1])

    def method_index(self, method: str) -> int:
        """The row of `method` in the tensors; UsageError for an unknown one."""
        return self.methods.index(check_choice("`method`", method, self.methods))

    def layer_index(self, layer: int) -> int:
        """The column of layer `layer` (h_layer); UsageError outside 0..L."""
        if layer not in self.layers:
            raise UsageError(
                f"`layer` {layer} is not a layer here; allowed: {self.layers[0]}..{self.layers[-1]}"
            )
        return self.layers.index(layer)

    def direction(self, layer: int, method: str = "diffmean", *, raw: bool = False) -> Tensor:
        """The unit direction (or, with `raw`, the raw vector) of `method` at h_`layer`."""
        vectors = self.raw if raw else self.unit
        return vectors[self.method_index(method), self.layer_index(layer)]

    def probe(self, layer: int) -> tuple[str, Tensor, float]:
        """(site, weight, bias) of the probe at h_`layer` as a classifier: σ(weight·h + bias)
        is the probability that a state h there is a positive's (`resstream.steer`'s judge)."""
        column = self.layer_index(layer)
        return site_name(layer), self.probe_weight[column], float(self.probe_bias[column])

    def best(self, method: str | None = None) -> tuple[Method, int, float]:
        """(method, layer, held-out AUC) of the highest held-out AUC (of `method` alone, if
        given); the earliest layer and first method among equals."""
        rows = [self.method_index(method)] if method is not None else list(range(len(self.methods)))
        best = (float("-inf"), 0, rows[0])
        for j in range(len(self.layers)):
            for m in rows:
                if float(self.auc[m, j]) > best[0]:
                    best = (float(self.auc[m, j]), j, m)
        return self.methods[best[2]], self.layers[best[1]], best[0]

    def to_dict(self) -> dict[str, Any]:
        """directions.json: the settings, the split's sizes, the best direction, and per layer
        and method the held-out and training AUC, the norm and the cosines (the vectors
        themselves are in directions.safetensors)."""
        method, layer, auc = self.best()
        entries = []
        for j, lay in enumerate(self.layers):
            per_method = {}
            for m, name in enumerate(self.methods):
                per_method[name] = {
                    "auc": float(self.auc[m, j]),
                    "train_auc": float(self.train_auc[m, j]),
                    "norm": float(self.norm[m, j]),
                    "cosines": {
                        other: float(self.method_cosines[j, m, o])
                        for o, other in enumerate(self.methods)
                        if o != m
                    },
                    "token_cosines": {
                        token: float(self.token_cosines[m, j, t]) for t, token in enumerate(self.tokens)
                    },
                }
            entries.append({"layer": lay, "site": site_name(lay), "methods": per_method})
        return {
            "model": self.model,
            "model_fingerprint": self.model_fingerprint,
            "family": self.family,
            "source": self.source,
            "position": self.position,
            "layer_convention": LAYER_CONVENTION,
            "held_out": self.held_out,
            "seed": self.seed,
            "pairing": self.split.pairing,
            "texts": {"positive": self.n_positive, "negative": self.n_negative, **self.split.counts()},
            "probe": {"l2": self.probe_l2, "standardised": True, "bias": "regularised like the weights"},
            "tokens": [
                {"token": text, "id": tid} for text, tid in zip(self.tokens, self.token_ids, strict=True)
            ],
            "best": {"method": method, "layer": layer, "site": site_name(layer), "auc": auc},
            "layers": entries,
        }


def find_directions(
    positive: Tensor,
    negative: Tensor,
    *,
    paired: bool = False,
    held_out: float = HELD_OUT,
    seed: int = 0,
    unembedding: Tensor | None = None,
    tokens: Sequence[str] = (),
    token_ids: Sequence[int] = (),
    probe_l2: float = PROBE_L2,
    position: Position = "last",
    model: str = "",
    **about: Any,
) -> DirectionsResult:
    """Every method's direction at every layer of the states `positive` (P, layers, d) and
    `negative` (N, layers, d) (module docstring); `paired` when their i-th rows are a pair.

    `unembedding` (tokens, d): the rows W_U[t] of the `tokens` (`token_ids`) whose cosines to
    each direction are wanted. `position`, `model` and `about` (`source`, `model_fingerprint`,
    `family`, `model_hint`) describe where the states came from. A layer is taken one at a time
    in float64. RunError when a state is not finite."""
    if positive.ndim != 3 or negative.shape[1:] != positive.shape[1:]:
        raise ValueError(
            f"states must be (texts, layers, d) of one shape, got {positive.shape}, {negative.shape}"
        )
    split = held_out_split(len(positive), len(negative), held_out=held_out, seed=seed, paired=paired)
    n_layers, d = positive.shape[1], positive.shape[2]
    shape = (len(METHODS), n_layers)
    unit_all = torch.zeros((*shape, d), dtype=torch.float64)
    raw_all = torch.zeros_like(unit_all)
    probe_weight = torch.zeros((n_layers, d), dtype=torch.float64)
    probe_bias = torch.zeros(n_layers, dtype=torch.float64)
    norm, auc, train_auc = (torch.zeros(shape, dtype=torch.float64) for _ in range(3))
    for layer in range(n_layers):
        pos, neg = positive[:, layer].double(), negative[:, layer].double()
        if not (torch.isfinite(pos).all() and torch.isfinite(neg).all()):
            raise RunError(
                f"the states at {site_name(layer)} are not all finite (NaN or inf); no direction there"
            )
        directions, probe_weight[layer], probe_bias[layer] = _layer_directions(pos, neg, split, probe_l2)
        unit_all[:, layer] = directions
        delta = pos[split.train_positive].mean(0) - neg[split.train_negative].mean(0)
        norm[:, layer] = directions @ delta
        raw_all[:, layer] = norm[:, layer, None] * directions
        for m in range(len(METHODS)):
            score_pos, score_neg = pos @ directions[m], neg @ directions[m]
            auc[m, layer] = roc_auc(score_pos[split.test_positive], score_neg[split.test_negative])
            train_auc[m, layer] = roc_auc(score_pos[split.train_positive], score_neg[split.train_negative])
    method_cosines = torch.stack([cosines(unit_all[:, j], unit_all[:, j]) for j in range(n_layers)])
    rows = unembedding.double().cpu() if unembedding is not None else torch.zeros((0, d), dtype=torch.float64)
    token_cosines = torch.stack([cosines(unit_all[m], rows) for m in range(len(METHODS))])
    return DirectionsResult(
        model=model,
        position=position,
        layers=tuple(range(n_layers)),
        unit=unit_all,
        raw=raw_all,
        norm=norm,
        auc=auc,
        train_auc=train_auc,
        method_cosines=method_cosines,
        token_cosines=token_cosines,
        probe_weight=probe_weight,
        probe_bias=probe_bias,
        split=split,
        held_out=held_out,
        seed=seed,
        tokens=tuple(tokens),
        token_ids=tuple(int(t) for t in token_ids),
        probe_l2=probe_l2,
        **about,
    )


def _layer_directions(
    pos: Tensor, neg: Tensor, split: HeldOutSplit, probe_l2: float
) -> tuple[Tensor, Tensor, float]:
    """(methods, d) unit directions of one layer's states, each signed so that Δμ·u ≥ 0, and
    the probe's (weight, bias) as it classifies a state."""
    train_pos, train_neg = pos[split.train_positive], neg[split.train_negative]
    delta = train_pos.mean(0) - train_neg.mean(0)
    pca = first_principal_component(pos[split.pair_positive] - neg[split.pair_negative])
    labels = torch.cat([torch.ones(len(train_pos)), torch.zeros(len(train_neg))])
    weight, bias = logistic_probe(torch.cat([train_pos, train_neg]), labels, probe_l2)
    found = torch.stack([unit(delta), unit(pca), unit(weight)])
    signs = torch.where(found @ delta < 0, -1.0, 1.0).to(found.dtype)
    return found * signs[:, None], weight, bias


__all__ = [
    "HELD_OUT",
    "LAYER_CONVENTION",
    "METHODS",
    "MIN_TRAIN",
    "POSITIONS",
    "PROBE_L2",
    "DirectionsResult",
    "HeldOutSplit",
    "Method",
    "Position",
    "check_position",
    "check_set_size",
    "cosines",
    "find_directions",
    "first_principal_component",
    "held_out_count",
    "held_out_split",
    "logistic_probe",
    "minimum_texts",
    "roc_auc",
    "site_name",
    "unit",
]
