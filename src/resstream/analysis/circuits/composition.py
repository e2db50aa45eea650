"""Head composition: how much a later head reads what an earlier head writes (Q-, K- and
V-composition of Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits").

Orientation. Everything is in the models' own row-vector orientation x @ W (a residual
vector is a row; a matrix acts from the right). For an earlier head a (layer l1) and a later
head b (layer l2 > l1), with d×d_head matrices W_Q, W_K, W_V and d_head×d W_O per head:

* the write of head a, M_A = W_V[a] @ W_O[a] (d×d): a stream vector u adds u @ M_A;
* the reading matrices of head b, with G = diag(g) its block's `ln1` gain:
  R_Q = G W_Q[b] W_K[b]ᵀ G (d×d), so the attention logit of a query stream x and a key stream
  y is x @ R_Q @ yᵀ (up to the norm's scale and 1/√d_head);
  R_K = R_Qᵀ, the same bilinear form read from the key side;
  R_V = G W_V[b] W_O[b], what head b writes when it reads a vector.
* Q-composition: a's write enters the query side, x = u @ M_A, so the logit is
  u @ (M_A @ R_Q) @ yᵀ; K-composition: it enters the key side, y = u @ M_A, and the logit is
  x @ R_Q @ M_Aᵀ @ uᵀ = x @ (M_A @ R_K)ᵀ @ uᵀ; V-composition: b's value reads it,
  u @ (M_A @ R_V). In every case

      score = ‖M_A @ R‖_F / (‖M_A‖_F · ‖R‖_F)    (R = R_Q, R_K or R_V),

  which is Elhage et al.'s ‖W_QKᵀ W_OV‖, ‖W_QK W_OV‖, ‖W_OV² W_OV¹‖ over the product of the
  norms (their column-vector matrices are the transposes of these). A score is 0 when either
  matrix is 0. The score is invariant to scaling either head's matrices.

Norms. The reading block's `ln1` gain g is folded into R (G on both sides of R_Q: the query
and the key both pass through ln1). Gemma-2's post-attention norm gain is folded into W_O of
both heads (it scales what a head adds to the stream). Post-norm resstream models read the raw
stream, so their R has no gain; instead the gains of the norms the written vector passes
before head b reads it (ln1 and ln2 of blocks l1..l2−1) scale M_A. Every norm's scale 1/s(x)
and centring are otherwise ignored, as are all biases, the scalar factors of residual gates,
attention logit soft-capping, and rotary position embeddings (applied to q and k after W_Q and
W_K, so they are not in these matrices).

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
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from resstream.analysis.norms import norm_form
from resstream.errors import UsageError
from resstream.models.adapters import BlockView, ModelView

Kind = Literal["q", "k", "v"]
KINDS: tuple[Kind, ...] = ("q", "k", "v")
KIND_NAMES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}

#: Monte-Carlo samples of the random baseline, and their seed.
BASELINE_SAMPLES = 256
BASELINE_SEED = 0
#: Samples drawn at once (bounds the baseline's memory: 4 factors of chunk × d × d_head).
_BASELINE_CHUNK = 16

NOTES = (
    "scores ‖M_A·R‖_F/(‖M_A‖_F·‖R‖_F) in x@W orientation: M_A = W_V[a]·W_O[a] (earlier head's write), "
    "R = G·W_Q·W_Kᵀ·G (Q, query side), its transpose (K, key side) or G·W_V·W_O (V) of the later head",
    "G = diag(gain of the later block's ln1) (pre-norm); post-norm models: the gains of the norms "
    "between the two heads scale M_A; Gemma-2's post-attention norm gain scales W_O",
    "ignored: every norm's scale and centring, biases, residual-gate factors, attention soft-capping, "
    "rotary position embeddings (applied after W_Q/W_K)",
)


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

    def to_dict(self) -> dict[str, Any]:
        """Every field, by name."""
        return asdict(self)


@dataclass(frozen=True, eq=False)
class CompositionResult:
    """Q-, K- and V-composition scores of every ordered pair of heads of one model.

    `q`, `k`, `v` are (L, H, L, H) float tensors on the CPU: [l1, h1, l2, h2] is the score of
    earlier head (l1, h1) into later head (l2, h2), NaN where l2 <= l1. `baseline` is the
    random-matrix baseline; `notes` say what the scores fold in and ignore.
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
    notes: tuple[str, ...] = NOTES

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

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        """The content of composition.json: sizes, baseline, notes, per kind its mean and its
        `top` strongest pairs, and every pair with its three scores."""
        summary = {}
        for kind in KINDS:
            values = self.scores(kind)
            values = values[~values.isnan()]
            above = float((values > self.baseline.mean).float().mean())
            summary[kind] = {
                "mean": float(values.mean()),
                "max": float(values.max()),
                "above_baseline": above,
            }
        return {
            "model": self.model,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "baseline": self.baseline.to_dict(),
            "notes": list(self.notes),
            "summary": summary,
            "top": {kind: [pair.to_dict() for pair in self.top(kind, top)] for kind in KINDS},
            "pairs": [self._pair_dict(pair) for pair in self.pairs()],
        }

    def _pair_dict(self, pair: tuple[int, int, int, int]) -> dict[str, Any]:
        names = ("layer_a", "head_a", "layer_b", "head_b")
        return {
            **dict(zip(names, pair, strict=True)),
            **{kind: float(self.scores(kind)[pair]) for kind in KINDS},
        }


def check_top(n: int) -> None:
    """`top` must be >= 1."""
    if n < 1:
        raise UsageError(f"`top` {n} must be >= 1")


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


def composition(
    view: ModelView, *, model: str, samples: int = BASELINE_SAMPLES, seed: int = BASELINE_SEED
) -> CompositionResult:
    """Q-, K- and V-composition scores of every pair of heads of `view` in different layers
    (module docstring), with the random baseline from `samples` seeded draws. `model` names
    the model in the result. UsageError for a model with fewer than 2 layers."""
    n_layers, n_heads = view.n_layers, view.n_heads
    if n_layers < 2:
        raise UsageError(
            f"model {model!r} has {n_layers} layer; head composition needs heads in two different "
            f"layers (a model with at least 2 layers)"
        )
    check_samples(samples)
    shape = (n_layers, n_heads, n_layers, n_heads)
    scores = {kind: torch.full(shape, float("nan")) for kind in KINDS}
    with torch.no_grad():
        writes = [write_factor(block) for block in view.blocks]
        for l2 in range(1, n_layers):
            reads = read_factors(view.blocks[l2])
            for l1 in range(l2):
                gain = path_gain(view.blocks, l1, l2)
                for kind in KINDS:
                    scores[kind][l1, :, l2, :] = pair_scores(writes[l1], reads[kind], gain).cpu()
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


def write_factor(block: BlockView) -> Tensor:
    """Every head's Â (H, k, d) of its write M_A = W_V[h] @ W_O[h] (module docstring)."""
    weights = block.read_attention_weights()
    return squeezed_write(weights.W_V.detach().float(), _written(block))


def read_factors(block: BlockView) -> dict[Kind, Tensor]:
    """Every head's B̂ (H, d, k) of its reading matrix of each kind (module docstring)."""
    weights = block.read_attention_weights()
    gain = _read_gain(block)
    Q, K, V = (gain[:, None] * w.detach().float() for w in (weights.W_Q, weights.W_K, weights.W_V))
    return {
        "q": squeezed_read(Q, K),
        "k": squeezed_read(K, Q),
        "v": squeezed_read(V, _written(block).transpose(-1, -2)),
    }


def _written(block: BlockView) -> Tensor:
    """W_O (H, d_head, d) as float32, times the post-attention norm's gain where there is one."""
    W_O = block.W_O.detach().float()
    if block.post_attn_norm is not None:
        W_O = W_O * _gain(block.post_attn_norm, W_O)
    return W_O


def _read_gain(block: BlockView) -> Tensor:
    """The gain of the norm attention reads through: ln1's (pre-norm), else ones."""
    like = block.W_O.detach().float()
    if block.norm_position == "post":
        return torch.ones(like.shape[-1], device=like.device)
    return _gain(block.ln1, like)


def _gain(module: torch.nn.Module | None, like: Tensor) -> Tensor:
    """A norm's gain vector (d,) as float32 on `like`'s device (ones for no gain)."""
    gain = norm_form(module).gain
    if gain is None:
        return torch.ones(like.shape[-1], device=like.device)
    return gain.detach().float().to(like.device)


def path_gain(blocks: tuple[BlockView, ...], l1: int, l2: int) -> Tensor | None:
    """The gains the write of a head in block l1 is multiplied by before block l2's attention
    reads it: in post-norm models those of ln1 and ln2 of blocks l1..l2−1; None (no factor)
    in pre-norm models, whose stream is a plain sum."""
    if blocks[l2].norm_position != "post":
        return None
    like = blocks[l1].W_O.detach().float()
    gain = torch.ones(like.shape[-1], device=like.device)
    for block in blocks[l1:l2]:
        gain = gain * _gain(block.ln1, like) * _gain(block.ln2, like)
    return gain


def pair_scores(writes: Tensor, reads: Tensor, gain: Tensor | None = None) -> Tensor:
    """Scores of every earlier head against every later head: `writes` Â (Ha, k, d), `reads`
    B̂ (Hb, d, k'), `gain` (d,) a diagonal between them or None. Returns (Ha, Hb):
    ‖Â G B̂‖_F / (‖Â G‖_F ‖B̂‖_F), 0 where either norm is 0."""
    reads = reads.to(writes.device)  # blocks spread over devices (device_map) meet on the writer's
    if gain is not None:
        writes = writes * gain.to(writes.device)
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
    "KINDS",
    "KIND_NAMES",
    "Baseline",
    "CompositionResult",
    "HeadPair",
    "check_samples",
    "check_top",
    "composition",
    "pair_scores",
    "path_gain",
    "random_baseline",
    "read_factors",
    "squeezed_read",
    "squeezed_write",
    "triangular",
    "write_factor",
]
