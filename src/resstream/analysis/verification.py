"""`resstream verify`: for one text, does resstream see exactly what the model computes?

Comparisons of what resstream reads through a model's `ModelView` (the residual states
h_0..h_L of `capture.residual_states`, the records of `capture.block_internals`) with the
model's own forward (`Reference`: for a Hugging Face model `model(ids,
output_hidden_states=True)`, its output layer and, for a mixture of experts, its router logits):

1. ``logits``: at the last position, max |resstream logit − model logit|, resstream's logits
   being `decoder_of(view).logits(h_L)`; relative to max |model logit|.
2. ``states``: per layer l = 0..L, max |h_l − the model's hidden state l|, relative to the
   largest norm ‖·‖ of the model's state over positions. The model's last entry is, for most
   families, after the final norm: it is compared with h_L before the final norm, after it,
   and (a final norm that carries a constant factor, `InlineScale`) after the norm without
   its factor; the reading that matches best is kept and named in `last_state`.
   ``decomposition``: per layer, the exact decomposition's residual max |Σ components − h_l|
   at residual point 2l (`analysis.attribution.decomposition.decompose` at every position,
   summed in float64: heads and whole MLPs, and at h_L, which holds every block's writes,
   heads and neurons), relative to max ‖h_l‖. A last point whose neuron split would hold more
   than `DECOMPOSITION_BUDGET` numbers for one position is decomposed into heads and whole
   MLPs too (`LayerCheck.neurons` says which).
   ``weights``: per block, the weights the view reads (W_Q, W_K, W_V where the view names
   their columns, W_O, the MLP's or experts' flat W_out) applied to what the block received,
   against what the model's own modules returned (`weight_errors`): a wrong weight there
   would change attribution and composition but no state.
3. ``lens``: per layer, the fraction of positions where the logit lens's top-1 token of h_l
   equals the top-1 of the model's own hidden state through the final norm and the model's
   own output layer (`Reference.head`). Two tokens whose scores tie exactly, in either
   model's scores, agree.
4. ``router`` (mixture of experts only): per routed block, the fraction of tokens whose set
   of experts (`BlockInternals.expert_index`) equals the top k of the softmax of the model's
   own router logits.

A check passes when its figure is within the tolerance of the model's dtype (`TOLERANCES`,
one row per dtype: the largest relative error, the least agreement); a check the model
offers nothing to compare with (no hidden states, no output layer, no router) does not
apply. `verification` returns one `VerifyResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from resstream.analysis.attribution.decomposition import decompose
from resstream.analysis.decoding.decoder import decoder_of
from resstream.display import Displayable
from resstream.errors import check_choice
from resstream.models.adapters.base import BlockView, InlineScale, Internals, ModelView
from resstream.reprs import summary

#: The checks, in the order they are reported.
CHECKS = ("logits", "states", "weights", "decomposition", "lens", "router")

#: Most numbers (components × positions × d_model) one decomposition with neurons holds; a
#: point whose components for one position are more is decomposed into heads and whole MLPs
#: (a 7B model's last point split into neurons would hold ~2·10⁹ numbers per position).
DECOMPOSITION_BUDGET = 1 << 25


@dataclass(frozen=True)
class Tolerances:
    """What a check may reach and still pass: the largest relative error of the `logits`, of
    the `states`, of the `weights` and of the `decomposition` (each the largest over layers),
    and the least top-1 agreement of the `lens` and of the `router` (fractions)."""

    logits: float
    states: float
    decomposition: float
    lens: float = 1.0
    router: float = 1.0
    weights: float = 1e-5


#: The tolerances per dtype, from measurements (docs/models.md): on every family's tiny model,
#: random GPT-2-small, Llama, Gemma-2 and Qwen3-MoE models and two trained ones, float32
#: reached at most 6e-7 (logits) and 2e-7 (decomposition), so 1e-5 leaves a margin of 15;
#: bfloat16 rounds every logit and component to 8 bits of mantissa (a relative step of
#: 2⁻⁸ ≈ 4e-3) and reached at most 5e-3 (logits) and 7.4e-3 (decomposition, resstream's
#: post-norm variant), so 3e-2 leaves a margin of 4. The states are the model's own tensors,
#: hooked in the same computation: 0 in both dtypes.
TOLERANCES: dict[str, Tolerances] = {
    "float32": Tolerances(logits=1e-5, states=1e-5, decomposition=1e-5, weights=1e-5),
    "bfloat16": Tolerances(logits=3e-2, states=1e-5, decomposition=3e-2, weights=3e-2),
}


def tolerances_for(dtype: str) -> Tolerances:
    """The tolerances of models in `dtype` ("float32", "bfloat16"); UsageError for another
    dtype (none is measured for it)."""
    return TOLERANCES[check_choice("`dtype`", dtype, TOLERANCES)]


@dataclass(frozen=True, eq=False)
class Reference:
    """What the model itself computes for the text (one sequence of T tokens), to compare with.

    `logits` (T, vocab); `hidden_states` h_0..h_L (each (T, d_model); the last may be after
    the final norm) or None where the model gives none; `head` the model's own output layer
    (d_model → vocab, before any soft-capping) or None; `router_logits` one (T, n_experts)
    tensor per block with experts, in block order, or None; `source` says in words where
    they come from."""

    source: str
    logits: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    head: Callable[[Tensor], Tensor] | None = None
    router_logits: tuple[Tensor, ...] | None = None


@dataclass(frozen=True)
class Check:
    """One check's verdict: whether it `applies` to the model, whether it `passed` (None where
    it does not apply), its figure `value` (the largest relative error, or the least
    agreement) against `tolerance`, and `note`: what was compared, or why it does not apply."""

    name: str
    applies: bool
    passed: bool | None
    value: float | None
    tolerance: float | None
    note: str


@dataclass(frozen=True)
class LayerCheck:
    """The figures of one residual state h_l (layer 0 = the embedding): the state's error
    against the model's own (None without hidden states), absolute and relative; the
    decomposition's residual, absolute and relative, its number of `components` and whether
    MLPs were split into `neurons`; the lens's top-1 agreement (None where it does not
    apply)."""

    layer: int
    state_error: float | None
    state_relative: float | None
    decomposition_residual: float
    decomposition_relative: float
    components: int
    neurons: bool
    lens_agreement: float | None


@dataclass(frozen=True)
class RouterCheck:
    """The routing of one block with experts: the fraction of tokens whose experts agree."""

    block: int
    agreement: float


@dataclass(frozen=True, eq=False, repr=False)
class VerifyResult(Displayable, renderer="resstream.reporting.verify"):
    """`resstream.verify`'s answer for one model and text (module docstring): every figure,
    the tolerances of its dtype and a verdict per check.

    `logit_error` / `logit_relative`: the last position's max |Δ logit|, and over max |model
    logit| (`logit_scale`); `layers`: one `LayerCheck` per state h_0..h_L; `router`: one
    `RouterCheck` per block with experts (empty for a dense model); `last_state`: which
    reading of h_L matched the model's last hidden state (None without hidden states);
    `checks`: one `Check` per name of `CHECKS`; `passed`: every check that applies passed.

    `to_pandas()` columns, one row per layer 0..L: layer; state_error, state_relative —
    max |h_l − model state| and over the model state's largest norm (empty without hidden
    states); decomposition_residual, decomposition_relative — max |Σ components − h_l| and
    over max ‖h_l‖; components — how many; neurons — whether MLPs were split into neurons;
    lens_agreement — the share of positions whose top-1 tokens agree; router_agreement — the
    share of tokens routed to the same experts by block l−1, whose output h_l is (empty for
    layer 0 and dense blocks).
    """

    model: str
    family: str
    dtype: str
    device: str
    text: str
    tokens: int
    reference: str
    logit_error: float
    logit_relative: float
    logit_scale: float
    last_state: str | None
    layers: tuple[LayerCheck, ...]
    router: tuple[RouterCheck, ...]
    tolerances: Tolerances
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        """Whether every check that applies passed."""
        return all(check.passed for check in self.checks if check.applies)

    @property
    def failed(self) -> tuple[str, ...]:
        """The names of the checks that apply and failed."""
        return tuple(check.name for check in self.checks if check.applies and not check.passed)

    def check(self, name: str) -> Check:
        """The verdict of check `name` (one of `CHECKS`)."""
        return next(check for check in self.checks if check.name == check_choice("check", name, CHECKS))

    def __repr__(self) -> str:
        verdict = "passed" if self.passed else f"FAILED: {', '.join(self.failed)}"
        applied = [check.name for check in self.checks if check.applies]
        return summary(
            self,
            f"{self.model} ({self.family}, {self.dtype}, {self.device}), {self.tokens} tokens",
            f"{verdict} ({', '.join(applied)}); max |Δ logit| / max |logit| {self.logit_relative:.1e}",
        )

    def to_dict(self) -> dict[str, Any]:
        """Every figure, the tolerances and the verdicts (verify.json)."""
        return {
            "model": self.model,
            "family": self.family,
            "dtype": self.dtype,
            "device": self.device,
            "text": self.text,
            "tokens": self.tokens,
            "reference": self.reference,
            "passed": self.passed,
            "failed": list(self.failed),
            "checks": [asdict(check) for check in self.checks],
            "tolerances": asdict(self.tolerances),
            "logits": {
                "error": self.logit_error,
                "relative": self.logit_relative,
                "scale": self.logit_scale,
            },
            "last_state": self.last_state,
            "layers": [asdict(layer) for layer in self.layers],
            "router": [asdict(block) for block in self.router],
        }


@dataclass(frozen=True)
class _Reading:
    """How the model's hidden state relates to h_l: `state` maps h_l to what the model
    records, `rest` maps that to the input of the output layer (rest ∘ state = final norm)."""

    label: str
    state: Callable[[Tensor], Tensor]
    rest: Callable[[Tensor], Tensor]


def _identity(x: Tensor) -> Tensor:
    return x


def last_state_readings(final_norm: nn.Module) -> list[_Reading]:
    """The ways a model's last hidden state may relate to h_L: before the final norm, after it,
    or after a final norm with a constant factor (`InlineScale`) before the factor."""
    readings = [
        _Reading("before the final norm", _identity, final_norm),
        _Reading("after the final norm", final_norm, _identity),
    ]
    if isinstance(final_norm, InlineScale) and final_norm.inner is not None:
        factor = final_norm.factor
        readings.append(
            _Reading("after the final norm, before its factor", final_norm.inner, lambda x: x * factor)
        )
    return readings


def _largest(values: Sequence[float]) -> float:
    """The largest value, nan if any is nan (Python's max would skip it)."""
    return float(torch.tensor(list(values), dtype=torch.float64).max()) if values else 0.0


def _least(values: Sequence[float]) -> float:
    """The least value, nan if any is nan."""
    return float(torch.tensor(list(values), dtype=torch.float64).min()) if values else 1.0


def _ratio(error: float, scale: float) -> float:
    """error / scale, 0 for a zero error over a zero scale."""
    return error / scale if scale > 0 else (0.0 if error == 0 else math.inf)


def logit_error(ours: Tensor, theirs: Tensor) -> tuple[float, float, float]:
    """max |ours − theirs|, that over max |theirs|, and max |theirs| (any shapes alike)."""
    theirs = theirs.to(ours.device).double()
    error = float((ours.double() - theirs).abs().max())
    scale = float(theirs.abs().max())
    return error, _ratio(error, scale), scale


def state_error(ours: Tensor, theirs: Tensor) -> tuple[float, float]:
    """max |ours − theirs| of two (T, d) states and that over the largest ‖theirs‖."""
    theirs = theirs.to(ours.device).double()
    error = float((ours.double() - theirs).abs().max())
    return error, _ratio(error, float(theirs.norm(dim=-1).max()))


def state_errors(
    view: ModelView, states: Tensor, hidden: Sequence[Tensor]
) -> tuple[list[tuple[float, float]], _Reading]:
    """Per layer, `state_error` of h_l (`states` (L+1, T, d)) against the model's hidden state
    l (as many), and the reading of the last state that matched best (`last_state_readings`)."""
    with torch.no_grad():
        errors = [state_error(h, theirs) for h, theirs in zip(states[:-1], hidden[:-1], strict=True)]
        readings = last_state_readings(view.final_norm)
        last = [state_error(reading.state(states[-1]), hidden[-1]) for reading in readings]
    best = min(range(len(readings)), key=lambda i: (math.isnan(last[i][0]), last[i][0]))
    return [*errors, last[best]], readings[best]


def decomposition_residuals(view: ModelView, internals: Internals) -> list[tuple[float, float, int, bool]]:
    """Per layer l = 0..L, the decomposition of h_l (residual point 2l) of sequence 0 at every
    position, a few positions at a time: into heads and whole MLPs, and at h_L into heads and
    neurons (every block's neurons, as h_L holds them all; heads and whole MLPs past
    `DECOMPOSITION_BUDGET`). Splitting every point into neurons would cost L/2 times more for
    no block the last point does not already split. Returns per layer (max |Σ components −
    h_l|, that over max ‖h_l‖, the number of components, whether MLPs were split into neurons)."""
    widths = [block.d_ff for block in view.blocks]
    found = []
    for layer in range(view.n_layers + 1):
        split = _components_after(view, widths[:layer], neurons=True)
        neurons = layer == view.n_layers and split * view.d_model <= DECOMPOSITION_BUDGET
        count = split if neurons else _components_after(view, widths[:layer], neurons=False)
        step = max(1, DECOMPOSITION_BUDGET // (count * view.d_model))
        found.append(_residual_at(view, internals, 2 * layer, step, neurons=neurons))
    return found


def _components_after(view: ModelView, widths: Sequence[int], *, neurons: bool) -> int:
    """At most how many components a point after blocks with MLPs of `widths` neurons has: the
    embedding, and per block its heads, up to four biases and every neuron (or one MLP)."""
    return 1 + sum(view.n_heads + 4 + (width if neurons else 1) for width in widths)


def _residual_at(
    view: ModelView, internals: Internals, point: int, step: int, *, neurons: bool
) -> tuple[float, float, int, bool]:
    """The decomposition's residual at `point`, `step` positions at a time: (max |Σ − h|, that
    over max ‖h‖, the number of components, `neurons`)."""
    seq_len = int(internals.input_ids.shape[1])
    errors, scales, count = [], [], 0
    for start in range(0, seq_len, step):
        positions = list(range(start, min(seq_len, start + step)))
        parts = decompose(view, internals, positions, point=point, heads=True, neurons=neurons)
        errors.append(parts.residual()[0])
        scales.append(float(parts.state.double().norm(dim=-1).max()))
        count = len(parts)
    error = _largest(errors)
    return error, _ratio(error, _largest(scales)), count, neurons


def top1_agreement(ours: Tensor, theirs: Tensor) -> float:
    """The fraction of rows (positions) whose best-scoring token agrees between two score
    tensors (T, vocab): the same token, or a token that ties the best score exactly in either."""
    theirs = theirs.to(ours.device)
    mine, other = ours.argmax(-1), theirs.argmax(-1)
    tie_theirs = theirs.gather(-1, mine[:, None])[:, 0] == theirs.max(-1).values
    tie_ours = ours.gather(-1, other[:, None])[:, 0] == ours.max(-1).values
    return float(((mine == other) | tie_theirs | tie_ours).double().mean())


def lens_agreements(
    view: ModelView,
    states: Tensor,
    hidden: Sequence[Tensor],
    head: Callable[[Tensor], Tensor],
    last: _Reading,
) -> list[float]:
    """Per layer, `top1_agreement` of the logit lens of h_l with the model's own hidden state
    through the final norm (the last: through what `last` leaves of it) and its own `head`."""
    decoder = decoder_of(view)
    found = []
    with torch.no_grad():
        for layer, (h, theirs) in enumerate(zip(states, hidden, strict=True)):
            rest = last.rest if layer == len(hidden) - 1 else view.final_norm
            found.append(top1_agreement(decoder.logits(h), head(rest(theirs)).float()))
    return found


#: A module's output in the model's own forward of the text (sequence 0), or None where it was
#: not recorded: how `weight_errors` reads the q/k/v projections.
Projected = Callable[[nn.Module], Tensor | None]


def weight_errors(view: ModelView, internals: Internals, projected: Projected) -> list[float]:
    """Per block, the largest relative error of the weights the view reads, each applied to
    what the block actually received and compared with what the model's own module returned:
    Σ_k m_k·W_out[k] + b_out against the MLP's output (experts: the flat coefficients and
    weights), Σ_h z_h·W_O[h] + b_O against the attention's output, and, where the view says
    which columns hold them (`qkv_columns`), every head's x·W_Q[h] + b_Q[h] (and K, V) against
    those columns of the projection's output. The decomposition and composition read these
    weights; the states, logits and lens would not notice a wrong one."""
    found = []
    with torch.no_grad():
        for block, rec in zip(view.blocks, internals.blocks, strict=True):
            mlp = block.read_mlp_weights()
            errors = [
                _relative(_affine(rec.coefficients[0], mlp.W_out, mlp.b_out), rec.mlp_raw[0]),
                _relative(
                    torch.einsum("thd,hdm->tm", rec.z[0].float(), block.W_O.detach().float())
                    + (0 if block.b_O is None else block.b_O.detach().float()),
                    rec.attn_raw[0],
                ),
            ]
            errors += _projection_errors(block, rec.attn_input[0], projected)
            found.append(max(errors))
    return found


def _affine(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
    """x @ W + b in float32."""
    out = x.float() @ W.detach().float()
    return out if b is None else out + b.detach().float()


def _relative(ours: Tensor, theirs: Tensor) -> float:
    """max |ours − theirs| over max |theirs|."""
    theirs = theirs.to(ours.device).float()
    return _ratio(float((ours - theirs).abs().max()), float(theirs.abs().max()))


def _projection_errors(block: BlockView, x: Tensor, projected: Projected) -> list[float]:
    """`weight_errors`'s query, key and value part for one block (none without `qkv_columns`)."""
    if block.qkv_columns is None or block.attention_weights is None:
        return []
    weights = block.read_attention_weights()
    errors = []
    for which, W, b in (
        ("q", weights.W_Q, weights.b_Q),
        ("k", weights.W_K, weights.b_K),
        ("v", weights.W_V, weights.b_V),
    ):
        for head in range(W.shape[0]):
            module, columns = block.qkv_columns(which, head)
            output = projected(module)
            if output is not None:
                ours = _affine(x, W[head], None if b is None else b[head])
                errors.append(_relative(ours, output[..., columns.to(output.device)]))
    return errors


def router_agreements(
    view: ModelView, internals: Internals, router_logits: Sequence[Tensor]
) -> list[RouterCheck]:
    """Per block with experts (as many as `router_logits`, in order), the fraction of tokens
    (sequence 0) whose recorded experts (`BlockInternals.expert_index`) are, as a set, the top
    k of softmax(`router_logits`)."""
    routed = [i for i, block in enumerate(view.blocks) if block.experts is not None]
    found = []
    for index, logits in zip(routed, router_logits, strict=True):
        experts, record = view.blocks[index].experts, internals.blocks[index]
        if experts is None or record.expert_index is None:
            raise ValueError(f"block {index} recorded no routing")
        ours = record.expert_index[0].reshape(-1, experts.top_k).sort(-1).values
        probs = torch.softmax(logits.reshape(ours.shape[0], -1).float(), dim=-1)
        theirs = probs.topk(experts.top_k, dim=-1).indices.sort(-1).values.to(ours.device)
        found.append(RouterCheck(index, float((ours == theirs).all(-1).double().mean())))
    return found


def verification(
    view: ModelView,
    states: Tensor,
    internals: Internals,
    reference: Reference,
    *,
    model: str,
    dtype: str,
    device: str,
    text: str,
    projected: Projected = lambda module: None,
) -> VerifyResult:
    """Every check of one text (module docstring): `states` (L+1, T, d) are resstream's h_l of
    the text's one sequence, `internals` its block records, `reference` the model's own
    forward, `projected` the outputs of its q/k/v projections in that forward (`Projected`;
    by default none: the weights check then reads W_O and the MLP only); `model`, `dtype`,
    `device` and `text` label the result. UsageError for a dtype without tolerances."""
    tolerances = tolerances_for(dtype)
    with torch.no_grad():
        ours = decoder_of(view).logits(states[-1, -1])
    logits = logit_error(ours, reference.logits[-1].float())
    layers, last = layer_checks(view, states, internals, reference)
    routed = sum(block.experts is not None for block in view.blocks)
    router_logits = reference.router_logits if _counts_match(reference.router_logits, routed) else None
    router = () if router_logits is None else tuple(router_agreements(view, internals, router_logits))
    checks = (
        _at_most("logits", logits[1], tolerances.logits, "max |Δ logit| / max |logit| at the last position"),
        _states_check(layers, last, reference, states.shape[0], tolerances.states),
        _at_most(
            "weights",
            _largest(weight_errors(view, internals, projected)),
            tolerances.weights,
            "the view's W_Q, W_K, W_V (where it names their columns), W_O and MLP (experts) weights "
            "applied to each block's inputs, against its modules' outputs; largest relative error",
        ),
        _at_most(
            "decomposition",
            _largest([layer.decomposition_relative for layer in layers]),
            tolerances.decomposition,
            "max |Σ components − h| / max ‖h‖, largest over layers",
        ),
        _lens_check(layers, reference, tolerances.lens),
        _router_check(router, routed, reference, tolerances.router),
    )
    return VerifyResult(
        model=model,
        family=view.family,
        dtype=dtype,
        device=device,
        text=text,
        tokens=int(states.shape[1]),
        reference=reference.source,
        logit_error=logits[0],
        logit_relative=logits[1],
        logit_scale=logits[2],
        last_state=None if last is None else last.label,
        layers=layers,
        router=router,
        tolerances=tolerances,
        checks=checks,
    )


def layer_checks(
    view: ModelView, states: Tensor, internals: Internals, reference: Reference
) -> tuple[tuple[LayerCheck, ...], _Reading | None]:
    """One `LayerCheck` per state h_0..h_L (`verification`'s arguments), and the reading of
    the model's last hidden state that matched (None where the model gave no hidden states,
    or not one per state)."""
    hidden = reference.hidden_states if _counts_match(reference.hidden_states, states.shape[0]) else None
    errors, last = state_errors(view, states, hidden) if hidden is not None else (None, None)
    lens = None
    if hidden is not None and last is not None and reference.head is not None:
        lens = lens_agreements(view, states, hidden, reference.head, last)
    layers = tuple(
        LayerCheck(
            layer,
            None if errors is None else errors[layer][0],
            None if errors is None else errors[layer][1],
            *residual,
            None if lens is None else lens[layer],
        )
        for layer, residual in enumerate(decomposition_residuals(view, internals))
    )
    return layers, last


def _counts_match(tensors: Sequence[Tensor] | None, expected: int) -> bool:
    """Whether the model gave `expected` tensors (None: it gave none)."""
    return tensors is not None and len(tensors) == expected


def _states_check(
    layers: Sequence[LayerCheck], last: _Reading | None, reference: Reference, count: int, tolerance: float
) -> Check:
    """The states' verdict: the largest relative error over layers; failed where the model
    gave another number of hidden states, not applicable where it gave none."""
    given = reference.hidden_states
    if given is None:
        return _not_applicable("states", f"the model gives no hidden states ({reference.source})")
    if last is None:
        return _failed("states", tolerance, f"the model gave {len(given)} hidden states for {count} states")
    relative = [layer.state_relative for layer in layers if layer.state_relative is not None]
    note = f"max |Δh| / max ‖h‖, largest over layers; the model's last hidden state is {last.label}"
    return _at_most("states", _largest(relative), tolerance, note)


def _lens_check(layers: Sequence[LayerCheck], reference: Reference, tolerance: float) -> Check:
    """The lens's verdict: the least top-1 agreement over layers; not applicable without the
    model's hidden states or its output layer."""
    agreements = [layer.lens_agreement for layer in layers if layer.lens_agreement is not None]
    if not agreements:
        why = "no hidden states to compare" if reference.head is not None else "no output layer of its own"
        return _not_applicable("lens", f"the model gives {why}")
    note = "top-1 token of the logit lens, least share of positions that agree over layers (exact ties agree)"
    return _at_least("lens", _least(agreements), tolerance, note)


def _router_check(
    router: Sequence[RouterCheck], routed: int, reference: Reference, tolerance: float
) -> Check:
    """The routing's verdict: the least agreement over blocks with experts; failed where the
    model gave no router logits for each, not applicable to a dense model."""
    if not routed:
        return _not_applicable("router", "not a mixture of experts")
    if not router:
        given = 0 if reference.router_logits is None else len(reference.router_logits)
        return _failed(
            "router", tolerance, f"the model gave router logits for {given} of {routed} routed blocks"
        )
    note = "routed experts as sets, least share of tokens that agree over blocks"
    return _at_least("router", _least([block.agreement for block in router]), tolerance, note)


def _at_most(name: str, value: float, tolerance: float, note: str) -> Check:
    """A check whose figure must be at most `tolerance` (nan fails)."""
    return Check(name, True, bool(value <= tolerance), value, tolerance, note)


def _at_least(name: str, value: float, tolerance: float, note: str) -> Check:
    """A check whose figure must be at least `tolerance` (nan fails)."""
    return Check(name, True, bool(value >= tolerance), value, tolerance, note)


def _failed(name: str, tolerance: float, note: str) -> Check:
    """A check that applies and failed without a figure."""
    return Check(name, True, False, None, tolerance, note)


def _not_applicable(name: str, note: str) -> Check:
    """A check the model offers nothing to compare with."""
    return Check(name, False, None, None, None, note)


__all__ = [
    "CHECKS",
    "DECOMPOSITION_BUDGET",
    "TOLERANCES",
    "Check",
    "LayerCheck",
    "Reference",
    "RouterCheck",
    "Tolerances",
    "VerifyResult",
    "decomposition_residuals",
    "last_state_readings",
    "layer_checks",
    "lens_agreements",
    "logit_error",
    "router_agreements",
    "state_errors",
    "tolerances_for",
    "top1_agreement",
    "verification",
]
