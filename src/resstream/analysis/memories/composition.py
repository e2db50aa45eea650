"""Head composition: how much a later head reads what an earlier head writes (Q-, K- and
V-composition of Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits").

Orientation. Everything is in the models' own row-vector orientation x @ W (a residual
vector is a row; a matrix acts from the right). For an earlier head a (layer l1) and a later
head b (layer l2 > l1), with d×d_head matrices W_Q, W_K, W_V and d_head×d W_O per head, and
N the linear part of a norm as it acts on a direction (its scale 1/s left out: u ↦ u·C·G,
C = I − 11ᵀ/d the centring of LayerNorm, I for RMSNorm, G = diag(gain)):

* every head reads the stream through its own `ln1`: its reading matrices are
  N_ln1 W = C·G·W (W = W_Q, W_K, W_V; post-norm models read the raw stream, W itself);
* every head writes W_O, through Gemma-2's post-attention norm where there is one
  (W_O·N_post), as the norms that read the stream see it: centred (·C) in pre-norm models
  with LayerNorm, since every norm reading the stream removes the mean (C_s below; I otherwise);
* OV(h) = (N_ln1 W_V[h]) · (W_O[h] N_post C_s), what head h adds per stream vector;
  QK(h) = (N_ln1 W_Q[h] N_q) · (N_ln1 W_K[h] N_k)ᵀ, the bilinear form of its attention logit.

QK-norm (Qwen3, Gemma-3, OLMo-2, Cohere, Phi with qk_layernorm) normalises each head's query
and key after W_Q / W_K and before the dot product: q = q_norm(x W_Q). As it acts on a
direction it is N_q = C_q·G_q on the d_head side (centring for a LayerNorm, then the gain;
a norm over all heads joined, OLMo-2's, centres over them and gives each head its slice of
the gain; Cohere's gain has one row per head), and the same N_k for keys; I without one. Its
scale 1/s is one positive number per query and per key: it multiplies the logit x·QK·yᵀ,
never changes which directions of the stream the head reads, and no score changes when a
matrix is scaled. But the norm sets the size of every query and key (its gain does, not the
stream), so with QK-norm Q- and K-composition are about directions only: how much of what a
writes lies along what b's normalised query or key reads, not how much a's write changes
the size of b's logits.

Then M_A = OV(a) and R_Q = QK(b), R_K = QK(b)ᵀ, R_V = OV(b): Q-composition (a's write enters
b's query: u @ M_A @ R_Q @ yᵀ), K-composition (it enters b's key), V-composition (b's value
reads it), and in every case

    score = ‖M_A @ R‖_F / (‖M_A‖_F · ‖R‖_F),

which is Elhage et al.'s ‖W_QKᵀ W_OV‖, ‖W_QK W_OV‖, ‖W_OV² W_OV¹‖ over the product of the
norms (their column-vector matrices are the transposes of these). A score is 0 when either
matrix is 0, and invariant to scaling either head's matrices.

Conventions. "resstream" (the default) is the rule above. "transformer-lens" reproduces
TransformerLens's scores with its default weight processing (fold_ln, center_writing_weights):
the same, except that Gemma-2's post-attention norm is left out of W_O (TransformerLens keeps
it as a separate norm). The two agree on every other pre-norm model; TransformerLens has no
post-norm layout, so that convention refuses one; it refuses a QK-norm model too, as
TransformerLens's documentation does not define its composition scores through query and key
norms. Post-norm resstream models (default convention only): heads read the raw stream, and
what head a writes passes the norms of blocks l1..l2−1 (ln1, ln2 of each, their linear
parts N) before head b reads it, so M_A is OV(a)·N_ln1(l1)·N_ln2(l1)⋯N_ln2(l2−1) for that
pair; R_V is OV(b) with no norm. Ignored in both: every norm's scale 1/s(x), all biases,
the scalar factors of residual gates, attention logit soft-capping, and rotary position
embeddings (applied to q and k after W_Q and W_K, so they are not in these matrices).

Speed. M_A = V O and R = P Sᵀ are products of d×d_head factors. With the thin QR
factorisations V = Q_V T_V and S = Q_S T_S (Q orthonormal columns), ‖V O P Sᵀ‖_F =
‖T_V O P T_Sᵀ‖_F, so a pair costs one (d_head×d)(d×d_head) product and the d×d matrices are
never formed: `write_factor` gives Â = T_V O (k×d), `read_factors` B̂ = P T_Sᵀ (d×k), and
‖M_A‖ = ‖Â‖, ‖R‖ = ‖B̂‖.

Baseline. For random matrices of the same shapes with Gaussian factors, the reading matrix is
rotation invariant (P → U P), so E_U ‖M_A U B‖² = ‖M_A‖² ‖B‖² / d exactly: E[score²] = 1/d
whatever d_head is, and the root-mean-square score is 1/√d. The mean score is slightly lower
(for d_head = 1 the score is |cos| of two random directions, mean ≈ √(2/(π d))); `baseline`
estimates it by Monte Carlo with seeded Gaussian factors of the model's shapes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor

from resstream.analysis.names import head_name, pair_name
from resstream.analysis.norms import FrozenNorm, NormForm, head_norm, norm_form
from resstream.checks import check_positive
from resstream.display import Displayable
from resstream.errors import UsageError
from resstream.models.adapters import BlockView, ModelView
from resstream.reprs import summary

Kind = Literal["q", "k", "v"]
KINDS: tuple[Kind, ...] = ("q", "k", "v")
KIND_NAMES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}

Convention = Literal["resstream", "transformer-lens"]
#: The conventions, the default first (module docstring).
CONVENTIONS: tuple[Convention, ...] = ("resstream", "transformer-lens")

#: Monte-Carlo samples of the random baseline, and their seed.
BASELINE_SAMPLES = 256
BASELINE_SEED = 0
#: Samples drawn at once (bounds the baseline's memory: 4 factors of chunk × d × d_head).
_BASELINE_CHUNK = 16

#: The columns of `CompositionResult.to_pandas()` (and of composition.csv), in order.
COMPOSITION_COLUMNS = (
    "kind",
    "writer_layer",
    "writer_head",
    "reader_layer",
    "reader_head",
    "score",
    "baseline",
)

_SCORE_NOTE = (
    "scores ‖M_A·R‖_F/(‖M_A‖_F·‖R‖_F) in x@W orientation: M_A = OV of the earlier head, R = QK "
    "(Q, query side), QKᵀ (K, key side) or OV (V) of the later head; OV = (N·W_V)·(W_O·N_post·C_s), "
    "QK = (N·W_Q·N_q)·(N·W_K·N_k)ᵀ (N_q, N_k: the QK-norm, I without one)"
)
_IGNORED_NOTE = (
    "ignored: every norm's scale 1/s, biases, residual-gate factors, attention soft-capping, "
    "rotary position embeddings (applied after W_Q/W_K); with QK-norm the scores are about "
    "directions, not magnitudes (the norm fixes the size of every query and key)"
)
NOTES: dict[Convention, tuple[str, ...]] = {
    "resstream": (
        _SCORE_NOTE,
        "convention resstream: N = the head's own ln1 as it acts on a direction (centring for "
        "LayerNorm, then gain; post-norm models: none); N_q, N_k = the QK-norm (a norm on each "
        "head's query and key) the same way, on the d_head side; N_post = Gemma-2's post-attention "
        "norm gain; C_s = centring where LayerNorms read the stream (pre-norm); post-norm models: the norms "
        "between the two heads act on M_A",
        _IGNORED_NOTE,
    ),
    "transformer-lens": (
        _SCORE_NOTE,
        "convention transformer-lens (TransformerLens's fold_ln + center_writing_weights): N = ln1's "
        "gain, reading weights centred over d_model for LayerNorm; W_O centred over d_model for "
        "LayerNorm; no post-attention norm gain (N_post = I)",
        _IGNORED_NOTE,
    ),
}


@dataclass(frozen=True)
class Baseline:
    """The score expected for random matrices of the model's shapes: `rms_analytic` = 1/√d
    (exact root mean square, module docstring), and the Monte-Carlo `mean` (± `stderr`) and
    `rms` of `samples` draws with Gaussian factors seeded with `seed`."""

    d_model: int
    d_head: int
    rms_analytic: float
    mean: float
    stderr: float
    rms: float
    mean_square: float
    mean_square_stderr: float
    samples: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        """Every field, and the rule the baseline follows."""
        return {
            **asdict(self),
            "rule": "Gaussian factors of the model's shapes; E[score²] = 1/d_model exactly",
        }


@dataclass(frozen=True)
class HeadPair:
    """One composition score: earlier head (`layer_a`, `head_a`) into later head (`layer_b`,
    `head_b`)."""

    layer_a: int
    head_a: int
    layer_b: int
    head_b: int
    score: float

    @property
    def name(self) -> str:
        """The pair in the component grammar (`analysis.names`): L2.H1 -> L5.H2."""
        return pair_name(head_name(self.layer_a, self.head_a), head_name(self.layer_b, self.head_b))

    def to_dict(self) -> dict[str, Any]:
        """Every field, by name, and the pair's `name`."""
        return {**asdict(self), "name": self.name}


@dataclass(frozen=True, eq=False, repr=False)
class CompositionResult(Displayable, renderer="resstream.reporting.composition"):
    """Q-, K- and V-composition scores of every ordered pair of heads of one model.

    `q`, `k`, `v` are (L, H, L, H) float tensors on the CPU: [l1, h1, l2, h2] is the score of
    earlier head (l1, h1) into later head (l2, h2), NaN where l2 <= l1. `baseline` is the
    random-matrix baseline; `convention` says which norms enter the matrices (module docstring)
    and `notes` what the scores fold in and ignore.

    `to_pandas()` columns (`COMPOSITION_COLUMNS`; one row per kind and pair of heads in
    different layers, the frame composition.csv is written from): kind — "q", "k" or "v";
    writer_layer, writer_head — the earlier head, whose output is read; reader_layer,
    reader_head — the later head, whose query, key or value reads it; score — the composition
    score (module docstring); baseline — the random baseline's mean score, the same in every
    row (a score well above it is composition the weights chose).
    """

    model: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    q: Tensor
    k: Tensor
    v: Tensor
    baseline: Baseline
    convention: Convention = "resstream"
    notes: tuple[str, ...] = NOTES["resstream"]

    def scores(self, kind: Kind) -> Tensor:
        """The (L, H, L, H) scores of one kind ("q", "k" or "v")."""
        if kind not in KINDS:
            raise UsageError(f"`kind` {kind!r} is not one of {', '.join(KINDS)}")
        return getattr(self, kind)

    def pairs(self) -> list[tuple[int, int, int, int]]:
        """Every (layer_a, head_a, layer_b, head_b) with layer_a < layer_b, in that order."""
        heads = range(self.n_heads)
        return [
            (l1, h1, l2, h2)
            for l1 in range(self.n_layers)
            for h1 in heads
            for l2 in range(l1 + 1, self.n_layers)
            for h2 in heads
        ]

    def top(self, kind: Kind, n: int) -> list[HeadPair]:
        """The `n` highest-scoring pairs of one kind, best first (ties: the earlier pair)."""
        check_top(n)
        flat = self.scores(kind).flatten()
        valid = torch.nonzero(~flat.isnan()).flatten()
        order = torch.sort(flat[valid], descending=True, stable=True).indices[:n]
        shape = (self.n_layers, self.n_heads, self.n_layers, self.n_heads)
        return [HeadPair(*_unravel(int(valid[i]), shape), float(flat[valid[i]])) for i in order]

    def __repr__(self) -> str:
        tops = []
        for kind in KINDS:
            for pair in self.top(kind, 1):
                tops.append(f"top {kind.upper()} {pair.name} {pair.score:.3f}")
        sizes = f"{self.model}: {self.n_layers} layers × {self.n_heads} heads, {self.convention} convention"
        return summary(self, sizes, ", ".join(tops), f"random baseline {self.baseline.mean:.3f}")

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        """The content of composition.json: sizes, convention, baseline, notes, per kind its mean
        and its `top` strongest pairs, and every pair with its three scores."""
        by_kind = {kind: self.kind_summary(kind) for kind in KINDS}
        return {
            "model": self.model,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "convention": self.convention,
            "baseline": self.baseline.to_dict(),
            "notes": list(self.notes),
            "summary": by_kind,
            "top": {kind: [pair.to_dict() for pair in self.top(kind, top)] for kind in KINDS},
            "pairs": [self._pair_dict(pair) for pair in self.pairs()],
        }

    def kind_summary(self, kind: Kind) -> dict[str, float]:
        """The mean and largest score of one kind, and the share of pairs above the baseline's mean."""
        values = self.scores(kind)
        values = values[~values.isnan()]
        return {
            "mean": float(values.mean()),
            "max": float(values.max()),
            "above_baseline": float((values > self.baseline.mean).float().mean()),
        }

    def _pair_dict(self, pair: tuple[int, int, int, int]) -> dict[str, Any]:
        names = ("layer_a", "head_a", "layer_b", "head_b")
        return {
            **dict(zip(names, pair, strict=True)),
            **{kind: float(self.scores(kind)[pair]) for kind in KINDS},
        }


def check_top(n: int) -> None:
    """`top` must be >= 1 (`resstream.checks.check_positive`, as the command line checks it)."""
    check_positive("top", n)


def check_samples(samples: int) -> None:
    """`samples` (the baseline's random draws) must be >= 2."""
    if samples < 2:
        raise UsageError(f"`samples` {samples} must be >= 2 (the baseline's standard error needs two)")


def _unravel(index: int, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The (l1, h1, l2, h2) position of a flat (row-major) `index` into scores of `shape`."""
    index, h2 = divmod(index, shape[3])
    index, l2 = divmod(index, shape[2])
    index, h1 = divmod(index, shape[1])
    return index % shape[0], h1, l2, h2


def check_convention(convention: str) -> None:
    """`convention` must be one of `CONVENTIONS`."""
    if convention not in CONVENTIONS:
        raise UsageError(f"`convention` {convention!r} is not one of {', '.join(CONVENTIONS)}")


def composition(
    view: ModelView,
    *,
    model: str,
    convention: Convention = "resstream",
    samples: int = BASELINE_SAMPLES,
    seed: int = BASELINE_SEED,
) -> CompositionResult:
    """Q-, K- and V-composition scores of every pair of heads of `view` in different layers,
    in `convention` (module docstring), with the random baseline from `samples` seeded draws.
    `model` names the model in the result. UsageError for a model with fewer than 2 layers,
    an unknown convention, or "transformer-lens" for a post-norm or QK-norm model."""
    n_layers, n_heads = view.n_layers, view.n_heads
    if n_layers < 2:
        raise UsageError(
            f"model {model!r} has {n_layers} layer; head composition needs heads in two different "
            f"layers (a model with at least 2 layers)"
        )
    check_convention(convention)
    check_samples(samples)
    if convention == "transformer-lens":
        check_transformer_lens_layout(view, model)
    shape = (n_layers, n_heads, n_layers, n_heads)
    scores = {kind: torch.full(shape, float("nan")) for kind in KINDS}
    with torch.no_grad():
        writes = [write_factor(block, convention) for block in view.blocks]
        for l2 in range(1, n_layers):
            reads = read_factors(view.blocks[l2], convention)
            for l1 in range(l2):
                written = through_path(writes[l1], view.blocks, l1, l2)
                for kind in KINDS:
                    scores[kind][l1, :, l2, :] = pair_scores(written, reads[kind]).cpu()
        device = view.blocks[0].W_O.device
        baseline = random_baseline(view.d_model, view.d_head, samples=samples, seed=seed, device=device)
    return CompositionResult(
        model=model,
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=view.d_model,
        d_head=view.d_head,
        q=scores["q"],
        k=scores["k"],
        v=scores["v"],
        baseline=baseline,
        convention=convention,
        notes=NOTES[convention],
    )


def check_transformer_lens_layout(view: ModelView, model: str) -> None:
    """UsageError for a model the "transformer-lens" convention does not define: post-norm
    blocks (TransformerLens has no such layout) or QK-norm (module docstring)."""
    if view.blocks[0].norm_position == "post":
        raise UsageError(
            f"`convention` 'transformer-lens' needs a pre-norm model; {model!r} is post-norm "
            f"(TransformerLens has no post-norm layout); use `convention` 'resstream'"
        )
    if any(block.q_norm is not None or block.k_norm is not None for block in view.blocks):
        raise UsageError(
            f"`convention` 'transformer-lens' is not defined for {model!r}, which normalises each "
            f"head's queries and keys (QK-norm); use `convention` 'resstream'"
        )


def triangular(factor: Tensor) -> Tensor:
    """T of the thin QR factorisation factor = Q T, batched: (..., d, h) -> (..., min(d, h), h).
    ‖Q T X‖_F = ‖T X‖_F for every X, since Q has orthonormal columns."""
    return torch.linalg.qr(factor, mode="r").R


def squeezed_write(V: Tensor, W: Tensor) -> Tensor:
    """Â = T_V @ W for M_A = V @ W ((..., d, h) @ (..., h, d)): ‖M_A X‖_F = ‖Â X‖_F."""
    return triangular(V) @ W


def squeezed_read(P: Tensor, S: Tensor) -> Tensor:
    """B̂ = P @ T_Sᵀ for R = P @ Sᵀ (both (..., d, h)): ‖X R‖_F = ‖X B̂‖_F."""
    return P @ triangular(S).transpose(-1, -2)


def write_factor(block: BlockView, convention: Convention = "resstream") -> Tensor:
    """Every head's Â (H, k, d) of its write M_A = OV (module docstring)."""
    weights = block.read_attention_weights()
    return squeezed_write(read_through_ln1(block, weights.W_V), written(block, convention))


def read_factors(block: BlockView, convention: Convention = "resstream") -> dict[Kind, Tensor]:
    """Every head's B̂ (H, d, k) of its reading matrix of each kind (module docstring)."""
    weights = block.read_attention_weights()
    Q, K, V = (read_through_ln1(block, w) for w in (weights.W_Q, weights.W_K, weights.W_V))
    Q, K = read_through_qk_norm(block, "q", Q), read_through_qk_norm(block, "k", K)
    return {
        "q": squeezed_read(Q, K),
        "k": squeezed_read(K, Q),
        "v": squeezed_read(V, written(block, convention).transpose(-1, -2)),
    }


def read_through_ln1(block: BlockView, weight: Tensor) -> Tensor:
    """A reading matrix (H, d, h) as the head applies it to the stream: N·W = C·G·W, the
    block's ln1 as it acts on a direction (centring for LayerNorm, gain; no scale), float32.
    Post-norm blocks read the raw stream: W itself. The same in both conventions
    (TransformerLens's fold_ln multiplies by the gain and centres over d_model)."""
    weight = weight.detach().float()
    if block.norm_position == "post":
        return weight
    # (C G W)ᵀ = Wᵀ G C: each column of W goes back through the norm (its adjoint)
    return _directional(block.ln1, weight).adjoint(weight.transpose(-1, -2)).transpose(-1, -2)


def read_through_qk_norm(block: BlockView, which: Literal["q", "k"], reading: Tensor) -> Tensor:
    """Query (`which` "q") or key ("k") reading matrices (H, d, d_head) through the block's
    QK-norm as it acts on a direction (module docstring): ·C·G on the d_head side, over all
    heads joined for a norm of span "all"; unchanged for a block without one."""
    norm = head_norm(block, which)
    if norm is None:
        return reading
    joined = norm.joined(reading)  # (d, heads, d_head) or (d, heads·d_head)
    return norm.split(_directional_form(norm.form, joined).apply(joined), reading.shape[0])


def written(block: BlockView, convention: Convention = "resstream") -> Tensor:
    """W_O (H, d_head, d) as float32, as the stream's readers see it: through the
    post-attention norm where there is one (convention resstream only), then centred where
    LayerNorms read the stream (pre-norm blocks; TransformerLens's center_writing_weights)."""
    W_O = block.W_O.detach().float()
    if convention == "resstream" and block.post_attn_norm is not None:
        W_O = _directional(block.post_attn_norm, W_O).apply(W_O)
    if block.norm_position == "post":
        return W_O
    return norm_form(block.ln1).centred(W_O)


def through_path(writes: Tensor, blocks: tuple[BlockView, ...], l1: int, l2: int) -> Tensor:
    """The writes Â (H, k, d) of a head in block l1 as block l2's attention reads them: in
    post-norm models through the linear parts of ln1 and ln2 of blocks l1..l2−1 (centring,
    gain); unchanged in pre-norm models, whose stream is a plain sum."""
    if blocks[l2].norm_position != "post":
        return writes
    for block in blocks[l1:l2]:
        for norm in (block.ln1, block.ln2):
            writes = _directional(norm, writes).apply(writes)
    return writes


def _directional(module: torch.nn.Module | None, like: Tensor) -> FrozenNorm:
    """A norm as it acts on a direction (centring, gain): its formula with the scale 1/s set
    to 1, the gain float32 on `like`'s device."""
    return _directional_form(norm_form(module), like)


def _directional_form(form: NormForm, like: Tensor) -> FrozenNorm:
    """`_directional` of a norm's formula."""
    gain = None if form.gain is None else form.gain.detach().to(like.device, torch.float32)
    return FrozenNorm(replace(form, gain=gain, bias=None), torch.ones((), device=like.device))


def pair_scores(writes: Tensor, reads: Tensor) -> Tensor:
    """Scores of every earlier head against every later head: `writes` Â (Ha, k, d), `reads`
    B̂ (Hb, d, k'). Returns (Ha, Hb): ‖Â B̂‖_F / (‖Â‖_F ‖B̂‖_F), 0 where either norm is 0."""
    reads = reads.to(writes.device)  # blocks spread over devices (device_map) meet on the writer's
    n_a, k_a, d = writes.shape
    n_b, _, k_b = reads.shape
    cores = writes.reshape(n_a * k_a, d) @ reads.permute(1, 0, 2).reshape(d, n_b * k_b)
    core_norms = cores.reshape(n_a, k_a, n_b, k_b).pow(2).sum((1, 3)).sqrt()
    return _normalised(core_norms, _frobenius(writes)[:, None], _frobenius(reads)[None, :])


def _frobenius(matrices: Tensor) -> Tensor:
    """‖·‖_F of each matrix of a (n, r, c) stack."""
    return matrices.pow(2).sum((-2, -1)).sqrt()


def _normalised(products: Tensor, left: Tensor, right: Tensor) -> Tensor:
    """products / (left · right), 0 where the denominator is 0."""
    denominator = left * right
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return torch.where(denominator > 0, products / safe, torch.zeros_like(products))


def random_baseline(
    d_model: int,
    d_head: int,
    *,
    samples: int = BASELINE_SAMPLES,
    seed: int = BASELINE_SEED,
    device: torch.device | str | None = None,
) -> Baseline:
    """The composition score of random matrices of the given shapes (module docstring):
    `samples` draws of Gaussian factors V, O, P, S (seeded and drawn on the CPU, so the same
    on every device; scored on `device`), each scored as ‖V O P Sᵀ‖_F / (‖V O‖_F ‖P Sᵀ‖_F)
    through the same squeezed factors as the model."""
    generator = torch.Generator().manual_seed(seed)
    drawn = []
    for start in range(0, samples, _BASELINE_CHUNK):
        n = min(_BASELINE_CHUNK, samples - start)
        V, P, S = (torch.randn(n, d_model, d_head, generator=generator).to(device) for _ in range(3))
        W = torch.randn(n, d_head, d_model, generator=generator).to(device)
        A, B = squeezed_write(V, W), squeezed_read(P, S)
        drawn.append(_normalised(_frobenius(A @ B), _frobenius(A), _frobenius(B)))
    values = torch.cat(drawn).double().cpu()
    squares = values.pow(2)
    return Baseline(
        d_model=d_model,
        d_head=d_head,
        rms_analytic=1.0 / math.sqrt(d_model),
        mean=float(values.mean()),
        stderr=float(values.std() / math.sqrt(samples)),
        rms=float(squares.mean().sqrt()),
        mean_square=float(squares.mean()),
        mean_square_stderr=float(squares.std() / math.sqrt(samples)),
        samples=samples,
        seed=seed,
    )


__all__ = [
    "BASELINE_SAMPLES",
    "BASELINE_SEED",
    "COMPOSITION_COLUMNS",
    "CONVENTIONS",
    "KINDS",
    "KIND_NAMES",
    "Baseline",
    "CompositionResult",
    "Convention",
    "HeadPair",
    "check_convention",
    "check_samples",
    "check_top",
    "check_transformer_lens_layout",
    "composition",
    "pair_scores",
    "random_baseline",
    "read_factors",
    "read_through_ln1",
    "read_through_qk_norm",
    "squeezed_read",
    "squeezed_write",
    "through_path",
    "triangular",
    "write_factor",
    "written",
]
