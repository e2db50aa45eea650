"""`resstream.edited` and its edits (`Set`, `Add`, `Scale`, `Project`, `Clamp`, `Apply`) against
hand implementations written here with plain hooks on each model's own modules (the view only
finds the modules; the edit is computed in float64 by the test), on every family:

* every operation at a residual state, a head, a neuron and a sub-layer output gives the
  log-probabilities of the hand-hooked forward to 1e-5 (experts: a neuron's clamp and shift
  from the routing computed by hand, `tests.test_models_experts.experts_by_hand`);
* identity edits (Scale 1, Add 0, Apply identity, Set a recorded value, Project keep on the
  whole space) leave the logits bit for bit; a projection on a direction orthogonal to the
  actual activations leaves them to 1e-6;
* Scale on a residual state is the identity-path attenuation of resstream's residual gates:
  a baseline GPT under Scale equals the same weights built with a fixed, learned or router gate;
  on a gated block it multiplies the gate, and two Scales of one state multiply;
* positions (`positions=` or ``@p``) change only the logits at and after them (causality),
  earlier ones bit for bit (mixtures of experts: to 1e-6); `generate` under an edit equals a
  hand-hooked `generate`, and a positional edit gives the same tokens and scores with and
  without the KV cache;
* `edited` leaves no hook behind and the weights untouched, also when the block raises, the
  forward raises or an edit is refused; bad input is a one-line UsageError saying what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

import resstream
from resstream import Add, Apply, Clamp, Project, Scale, Set
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from resstream.training.model import GPT
from tests.test_models_adapters import ALL_CASES, SEQ, tiny_ids, tiny_model
from tests.test_models_experts import experts_by_hand

pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

TOLERANCE = 1e-5
#: An edit's effect on the log-probabilities must be at least this, so a check can fail.
VISIBLE = 1e-4

Fn = Callable[[torch.Tensor], torch.Tensor]


# --- plain hooks on the model's own modules -------------------------------------------------


def _input_hook(fn: Fn):
    """A forward pre-hook (with kwargs) replacing a module's hidden-state input (its first
    positional argument, or `hidden_states`) by fn(x)."""

    def hook(module, args, kwargs):
        if args and isinstance(args[0], torch.Tensor):
            return (fn(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}

    return hook


def _output_hook(fn: Callable[..., torch.Tensor]):
    """A forward hook replacing a module's output (a tensor or a tuple's first) by fn(output, args)."""

    def hook(module, args, out):
        if isinstance(out, tuple):
            return (fn(out[0], args), *out[1:])
        return fn(out, args)

    return hook


@contextmanager
def hooked(pre=(), post=()):
    """`pre` [(module, fn(x) -> x')] on module inputs, `post` [(module, fn(out, args) -> out')]
    on outputs, removed on leaving."""
    handles = [m.register_forward_pre_hook(_input_hook(f), with_kwargs=True) for m, f in pre]
    handles += [m.register_forward_hook(_output_hook(f)) for m, f in post]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def in64(fn: Fn) -> Fn:
    """fn computed in float64, the result cast back to the activation's dtype."""
    return lambda x: fn(x.double()).to(x.dtype)


def out64(fn: Fn) -> Callable[..., torch.Tensor]:
    return lambda out, args: in64(fn)(out)


def logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the model's own output (float64)."""
    with torch.no_grad():
        out = model(ids)
    logits = out[0] if isinstance(out, tuple) else out.logits
    return torch.log_softmax(logits.double(), dim=-1)


def raw_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out[0] if isinstance(out, tuple) else out.logits


def hook_counts(model) -> list[tuple]:
    """Every module's forward hooks and pre-hooks (and the with-kwargs marks torch keeps of
    them), and torch's global forward hooks."""
    from torch.nn.modules import module as torch_module

    per_module = [
        (
            name,
            len(m._forward_hooks),
            len(m._forward_pre_hooks),
            len(m._forward_hooks_with_kwargs),
            len(m._forward_pre_hooks_with_kwargs),
        )
        for name, m in model.named_modules()
    ]
    return [
        *per_module,
        (len(torch_module._global_forward_hooks), len(torch_module._global_forward_pre_hooks)),
    ]


# --- hand edits -----------------------------------------------------------------------------


def _head(view, head: int, fn: Fn) -> Fn:
    """An output projection's input z with head `head`'s slice replaced by fn(slice), float64."""
    d = view.d_head

    def edit(z: torch.Tensor) -> torch.Tensor:
        out = z.double().clone()
        out[..., head * d : (head + 1) * d] = fn(out[..., head * d : (head + 1) * d])
        return out.to(z.dtype)

    return edit


def _column(k: int, fn: Fn) -> Fn:
    """The MLP down-projection's input m with neuron k's column replaced by fn(column), float64."""

    def edit(m: torch.Tensor) -> torch.Tensor:
        out = m.double().clone()
        out[..., k] = fn(out[..., k])
        return out.to(m.dtype)

    return edit


def _expert_row(block, k: int) -> torch.Tensor:
    """Flat neuron k's value vector, from the experts' own parameters: expert e's neuron j is a
    column of down_proj[e] (Mixtral, Qwen3-MoE: (d, d_ff)), a row (GPT-OSS: (d_ff, d)), or
    GPT-OSS's output bias for the neuron after the last (whose coefficient is the router weight)."""
    experts = block.mlp.experts
    e, j = divmod(k, block.experts.width)
    if hasattr(experts, "down_proj_bias"):
        rows = experts.down_proj[e]
        return experts.down_proj_bias[e] if j == rows.shape[0] else rows[j]
    return experts.down_proj[e][:, j]


def _neuron(view, layer: int, k: int, fn: Fn):
    """(pre, post) hand hooks replacing neuron k's coefficient m_k of block `layer` by fn(m_k):
    at the down-projection's input, or for experts (no such input) by adding
    (fn(m_k) − m_k)·W_out[k] to the MLP's output, m_k computed by hand from the routing."""
    block = view.blocks[layer]
    if block.experts is None:
        return [(block.mlp_out_proj, _column(k, fn))], []
    row = _expert_row(block, k).detach().double()

    def edit(out, args):
        x = args[0]
        m = experts_by_hand(block, x.reshape(-1, x.shape[-1]))[:, k].double()
        delta = ((fn(m) - m)[:, None] * row).reshape(out.shape)
        return (out.double() + delta).to(out.dtype)

    return [], [(block.mlp, edit)]


def _attenuated(view, layer: int, alpha: float | torch.Tensor):
    """Hand hooks for block `layer` computing α·x + F(x) (α a number, or (SEQ, 1) per position):
    its input x becomes α·x (what its identity path carries), and the modules that read x (the
    first module of the attention path, and of the MLP path in a parallel block) get x back."""
    block = view.blocks[layer]
    stash = {}

    def scale(x):
        stash["x"] = x
        return (x.double() * alpha).to(x.dtype)

    pre_norm = block.norm_position == "pre"
    readers = [block.ln1 if pre_norm and block.ln1 is not None else block.attn]
    if block.parallel:
        readers.append(block.ln2 if block.ln2 is not None else block.mlp)
    unique = [m for i, m in enumerate(readers) if all(m is not r for r in readers[:i])]
    return [(block.module, scale), *[(m, lambda x: stash["x"]) for m in unique]], []


def _project(rows: torch.Tensor, keep: bool) -> Fn:
    """x minus (or, with keep, only) its orthogonal projection on the span of `rows` (k, width),
    P = Dᵀ(D Dᵀ)⁻¹D in float64."""
    d = rows.double().reshape(-1, rows.shape[-1])
    P = d.T @ torch.linalg.inv(d @ d.T) @ d
    return lambda x: x @ P if keep else x - x @ P


def operations(view) -> list[tuple[object, list, list]]:
    """(edit, pre hooks, post hooks) for every operation at every kind of site of a two-block
    model: heads, residual states (h_0, h_1, the final h_2), neurons, attention and MLP outputs."""
    gen = torch.Generator().manual_seed(3)
    d, dh = view.d_model, view.d_head
    b0, b1 = view.blocks[0], view.blocks[-1]
    value, v, direction = (torch.randn(n, generator=gen) for n in (dh, d, d))
    head_direction, plane = torch.randn(dh, generator=gen), torch.randn(2, d, generator=gen)
    seq = torch.arange(SEQ, dtype=torch.float64)

    def positional(x, positions):
        return x * (1.0 + 0.1 * positions.to(x.dtype))[:, None]

    def with_neuron(edit, layer, k, fn):
        pre, post = _neuron(view, layer, k, fn)
        return edit, pre, post

    return [
        (Set("L0.H1", value), [(b0.out_proj, _head(view, 1, lambda z: value.double().expand_as(z)))], []),
        (Add("L1.resid", v, coef=2.5), [(b1.module, in64(lambda x: x + 2.5 * v.double()))], []),
        (Scale("L0.mlp", 0.5), [], [(b0.mlp, out64(lambda y: 0.5 * y))]),
        (Scale("L1.resid", 0.6), *_attenuated(view, 1, 0.6)),
        (Scale("emb", 0.7), *_attenuated(view, 0, 0.7)),
        (Project("L1.attn", direction), [], [(b1.attn, out64(_project(direction, keep=False)))]),
        (
            Project("L1.H0", head_direction, keep=True),
            [(b1.out_proj, _head(view, 0, _project(head_direction, True)))],
            [],
        ),
        (Project("L2.resid", plane), [], [(b1.module, out64(_project(plane, keep=False)))]),
        with_neuron(Clamp("L0.N5", 3.0), 0, 5, lambda m: torch.full_like(m, 3.0)),
        with_neuron(Add("L1.N3", 1.5, coef=2.0), 1, 3, lambda m: m + 3.0),
        (Apply("emb", positional), [(b0.module, in64(lambda x: x * (1.0 + 0.1 * seq)[:, None]))], []),
    ]


@pytest.mark.parametrize("case", ALL_CASES)
def test_every_operation_matches_a_float64_hand_hook(case: str) -> None:
    """Each edit of `operations` alone, against its hand hooks alone, and visibly not a no-op."""
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids(1)
    plain = logprobs(model, ids)
    for edit, pre, post in operations(view):
        with resstream.edited(model, [edit]):
            ours = logprobs(model, ids)
        with hooked(pre, post):
            hand = logprobs(model, ids)
        error = float((ours - hand).abs().max())
        assert error <= TOLERANCE, f"{case} {edit.label()}: {error:.2e} from the hand hook"
        assert float((ours - plain).abs().max()) > VISIBLE, f"{case} {edit.label()} changed nothing"


def _recorded(model, ids, module, *, output: bool) -> torch.Tensor:
    """A module's output (or its first input) in the plain forward of `ids`, by a plain hook."""
    found = {}
    if output:
        handle = module.register_forward_hook(
            lambda m, a, out: found.update(x=out[0] if isinstance(out, tuple) else out)
        )
    else:
        handle = module.register_forward_pre_hook(lambda m, a: found.update(x=a[0]))
    try:
        raw_logits(model, ids)
    finally:
        handle.remove()
    return found["x"].detach().clone()


@pytest.mark.parametrize("case", ALL_CASES)
def test_identity_edits_change_nothing_bit_for_bit(case: str) -> None:
    """Each of these computes exactly the activation it is given (x·1, x + 0, fn(x) = x, a value
    equal to the one recorded, (x·I)·I with the exact identity basis QR gives), so the logits
    are the same bits."""
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids(1)
    plain = raw_logits(model, ids)
    h1 = _recorded(model, ids, view.blocks[0].module, output=True)
    z0 = _recorded(model, ids, view.blocks[0].out_proj, output=False)
    d = view.d_head
    identities = [
        Scale("L1.mlp", 1.0),
        Scale("L1.resid", 1.0),
        Scale("L0.H*", 1.0),
        Add("L0.H1", torch.zeros(view.d_head)),
        Add("L1.resid", torch.zeros(view.d_model), coef=3.0),
        Apply("L0.N*", lambda x, positions: x),
        Set("L1.resid@3", h1[0, 3]),
        Set("L0.H1@4", z0[0, 4, d : 2 * d]),
        Project("L1.resid", torch.eye(view.d_model), keep=True),
    ]
    for edit in identities:
        with resstream.edited(model, [edit]):
            ours = raw_logits(model, ids)
        assert torch.equal(ours, plain), f"{case} {edit.label()}: {float((ours - plain).abs().max()):.2e}"


@pytest.mark.parametrize("case", ["gpt2", "llama", "mixtral", "resstream"])
def test_projecting_out_a_direction_orthogonal_to_the_activations_changes_nothing(case: str) -> None:
    """A direction orthogonal (in float64) to h_1 at every position: the float32 products x·b
    are rounding, not zero, so the logits agree to 1e-6, not bit for bit; a random direction
    changes them far more, so the check can fail."""
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids(1)
    h1 = _recorded(model, ids, view.blocks[0].module, output=True)[0].double()  # (SEQ, d) spans SEQ < d dims
    basis = torch.linalg.qr(h1.T).Q  # (d, SEQ)
    random = torch.randn(view.d_model, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    orthogonal = random - basis @ (basis.T @ random)
    assert float((h1 @ orthogonal).abs().max()) < 1e-10 * float(h1.abs().max())
    plain = logprobs(model, ids)
    for direction, inside in ((orthogonal, 1e-6), (random, None)):
        with resstream.edited(model, [Project("L1.resid", direction.float())]):
            change = float((logprobs(model, ids) - plain).abs().max())
        if inside is not None:
            assert change <= inside, change
        else:
            assert change > 1e-3, change


# --- Scale on a residual state is the residual gates' attenuation ---------------------------


def _gated(case: str, **gate) -> tuple[GPT, GPT]:
    """(the tiny model of `case`, the same weights in a GPT whose config has `gate`)."""
    model = tiny_model(case)
    gated = GPT(replace(model.config, **gate))
    missing, unexpected = gated.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all(key.startswith("gate.") for key in missing), (missing, unexpected)
    return model, gated.eval()


@pytest.mark.parametrize("case", ["resstream", "resstream_rotary_rms", "resstream_post"])
@pytest.mark.parametrize("layer", [0, 1])
def test_scale_on_a_residual_state_is_a_fixed_gate(case: str, layer: int) -> None:
    """`FixedGate` gives α to block `cut_layer` (0-based, `GPT.blocks[cut_layer]`), which then
    computes y = α·x + attn(ln1(x)) from its input x = h_{cut_layer} (post-norm:
    y = ln1(α·x + attn(x))): Scale("L{cut_layer}.resid", α) on the ungated weights."""
    model, gated = _gated(case, gate="fixed", alpha=0.3, cut_layer=layer)
    ids = tiny_ids(1)
    with resstream.edited(model, [Scale(f"L{layer}.resid", 0.3)]):
        ours = raw_logits(model, ids)
    theirs = raw_logits(gated, ids)
    assert float((ours - theirs).abs().max()) <= TOLERANCE
    assert float((raw_logits(model, ids) - theirs).abs().max()) > 1e-3  # the gate does something


def test_scale_on_every_layer_is_a_learned_gate_and_per_position_a_router() -> None:
    """A learned gate's α_l = 1 − s·softmax(θ)_l (θ set at random) is Scale on every L{l}.resid;
    a router's per-token α_l(t) is one Scale per layer and position (`positions=[t]`)."""
    ids = tiny_ids(1)
    gen = torch.Generator().manual_seed(5)
    for kind in ("learned", "router"):
        model, gated = _gated("resstream", gate=kind, gate_strength=0.8)
        with torch.no_grad():
            for param in gated.gate.parameters():
                param.copy_(torch.randn(param.shape, generator=gen))
            alphas = gated.gate(gated.embed(ids))
        if kind == "learned":
            edits = [Scale(f"L{layer}.resid", float(a)) for layer, a in enumerate(alphas)]
        else:
            edits = [
                Scale(f"L{layer}.resid", float(a[0, t, 0]), positions=[t])
                for layer, a in enumerate(alphas)
                for t in range(SEQ)
            ]
        with resstream.edited(model, edits):
            ours = raw_logits(model, ids)
        theirs = raw_logits(gated, ids)
        assert float((ours - theirs).abs().max()) <= TOLERANCE, kind
        assert float((raw_logits(model, ids) - theirs).abs().max()) > 1e-3, kind


def test_scale_on_a_gated_block_multiplies_its_gate() -> None:
    """On a model trained with a gate α_g at block 1, Scale("L1.resid", α) gives the identity path
    α·α_g: the same weights with a fixed gate of α·α_g there."""
    model = tiny_model("resstream_fixed")  # α_g = 0.5 at block 1
    _, gated = _gated("resstream_fixed", alpha=0.5 * 0.6)
    ids = tiny_ids(1)
    with resstream.edited(model, [Scale("L1.resid", 0.6)]):
        ours = raw_logits(model, ids)
    assert float((ours - raw_logits(gated, ids)).abs().max()) <= TOLERANCE


@pytest.mark.parametrize("case", ["resstream", "gpt2", "gpt_neox"])
def test_scales_of_one_residual_state_multiply(case: str) -> None:
    """Scale 0.5 everywhere and Scale 0.6 at position 3 of h_1: an identity path of 0.5, and
    0.3 at position 3 (a hand attenuation per position; for resstream also a fixed gate of 0.3
    when both act everywhere), as two Scales of any other site multiply."""
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids(1)
    alpha = torch.full((SEQ, 1), 0.5, dtype=torch.float64)
    alpha[3] = 0.3
    with resstream.edited(model, [Scale("L1.resid", 0.5), Scale("L1.resid", 0.6, positions=[3])]):
        ours = logprobs(model, ids)
    with hooked(*_attenuated(view, 1, alpha)):
        hand = logprobs(model, ids)
    assert float((ours - hand).abs().max()) <= TOLERANCE
    if case == "resstream":
        _, gated = _gated(case, gate="fixed", alpha=0.3, cut_layer=1)
        with resstream.edited(model, [Scale("L1.resid", 0.5), Scale("L1.resid", 0.6)]):
            both = raw_logits(model, ids)
        assert float((both - raw_logits(gated, ids)).abs().max()) <= TOLERANCE


# --- positions ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["gpt2", "llama", "gpt_oss", "falcon", "resstream_router"])
def test_an_edit_at_a_position_changes_only_that_position_and_later(case: str) -> None:
    """Earlier positions keep their logits bit for bit — except in a mixture of experts, whose
    experts run the tokens routed to them as one matrix: a token routed elsewhere changes the
    other tokens' matrix shapes, and with several BLAS threads their rounding (seen: GPT-OSS)."""
    model = tiny_model(case)
    view = view_of(model)
    slack = 0.0 if view.blocks[0].experts is None else 1e-6
    ids = tiny_ids(2)
    gen = torch.Generator().manual_seed(6)
    v, value = torch.randn(view.d_model, generator=gen), torch.randn(view.d_head, generator=gen)
    plain = raw_logits(model, ids)
    at_three = [
        Add("L1.resid", v, coef=3.0, positions=[3]),
        Add("L1.resid@3", v, coef=3.0),
        Scale("L0.resid", 0.2, positions=3),  # block 0 attenuated at 3: h_1 changes there only
        Set("L0.H1", value, positions=(3,)),
        Clamp("L0.N5@3", 4.0),
        Project("L0.mlp", v, positions=[3]),
    ]
    for edit in at_three:
        with resstream.edited(model, [edit]):
            ours = raw_logits(model, ids)
        before = float((ours[:, :3] - plain[:, :3]).abs().max())
        assert before <= slack, f"{case} {edit.label()} changed a position before 3 by {before:.2e}"
        change = (ours[:, 3:] - plain[:, 3:]).abs().amax(dim=(0, 2))
        assert bool((change > slack).all()), f"{case} {edit.label()}: unchanged at {change.tolist()}"
    with resstream.edited(model, [Add("L1.resid", v, coef=3.0, positions=[SEQ + 5])]):
        assert torch.equal(raw_logits(model, ids), plain)  # a position past the text: nothing


def test_several_positions_match_a_hand_hook_and_the_position_is_given_once() -> None:
    model = tiny_model("llama")
    view = view_of(model)
    ids = tiny_ids(2)
    v = torch.randn(view.d_model, generator=torch.Generator().manual_seed(7))
    mask = torch.zeros(SEQ, 1, dtype=torch.float64)
    mask[[2, 7]] = 1.0
    with resstream.edited(model, [Add("L1.resid", v, coef=2.0, positions=[7, 2, 7])]):
        ours = logprobs(model, ids)
    with hooked([(view.blocks[1].module, in64(lambda x: x + 2.0 * mask * v.double()))]):
        hand = logprobs(model, ids)
    assert float((ours - hand).abs().max()) <= TOLERANCE
    refused = [Add("L1.resid@3", v, positions=[3])]
    with (
        pytest.raises(UsageError, match=r"by @ or by `positions`, not both"),
        resstream.edited(model, refused),
    ):
        pass


# --- nothing left behind --------------------------------------------------------------------


def _every_kind(view) -> list:
    """An edit at every kind of hook point: states (h_0, h_1, the final state), the attenuation
    of an identity path, z, the coefficients (experts' three hooks), attention and MLP outputs."""
    v = torch.ones(view.d_model)
    return [
        Add("emb", v),
        Add("L1.resid@2", v),
        Set("L2.resid", 0.0, positions=[5]),
        Scale("L1.resid", 0.5),
        Set("L0.H1", 0.0),
        Clamp("L1.N*", 0.1),
        Scale("L0.attn", 2.0),
        Project("L1.mlp", v, keep=True),
    ]


@pytest.mark.parametrize("case", ["gpt2", "mixtral", "resstream_router"])
def test_edited_leaves_no_hook_and_the_weights_as_they_were(case: str) -> None:
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids(1)
    before = hook_counts(model)
    weights = {name: t.clone() for name, t in model.state_dict().items()}
    plain = raw_logits(model, ids)
    with resstream.edited(model, _every_kind(view)) as inside:
        assert inside is model
        assert hook_counts(model) != before
        edited_logits = raw_logits(model, ids)
    assert hook_counts(model) == before
    assert not torch.equal(edited_logits, plain)
    with pytest.raises(KeyError, match="raised inside"), resstream.edited(model, _every_kind(view)):
        raise KeyError("raised inside")
    assert hook_counts(model) == before

    def wrong(x, positions):
        return x[..., :1]

    message = r"Apply\('L1.mlp'\)'s fn returned \(1, 12, 1\) for an activation of shape \(1, 12, 32\)"
    with pytest.raises(ValueError, match=message), resstream.edited(model, [Apply("L1.mlp", wrong)]):
        raw_logits(model, ids)
    assert hook_counts(model) == before
    # refused while installing (the clock and the first edits' hooks were already in) or resolving
    for refused in ([*_every_kind(view), Scale("L2.resid", 0.5)], [Add("L0.resid", torch.ones(3))]):
        with pytest.raises(UsageError), resstream.edited(model, refused):
            pass
        assert hook_counts(model) == before
    state = model.state_dict()
    assert state.keys() == weights.keys()
    assert all(torch.equal(state[name], weights[name]) for name in weights)
    assert torch.equal(raw_logits(model, ids), plain)


# --- generate -------------------------------------------------------------------------------


def _generate(model, prompt, **options):
    """Greedy `generate` of 5 new tokens (never stopping early), with each step's logits."""
    with torch.no_grad():
        return model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=5,
            min_new_tokens=5,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_logits=True,
            **options,
        )


def _steps(out) -> torch.Tensor:
    return torch.stack(out.logits)  # (steps, batch, vocab)


@pytest.mark.parametrize("case", ["gpt2", "llama"])
def test_generate_under_an_edit_is_a_hand_hooked_generate(case: str) -> None:
    model = tiny_model(case)
    view = view_of(model)
    prompt = tiny_ids(1, seq=6)
    v = torch.randn(view.d_model, generator=torch.Generator().manual_seed(8))
    with resstream.edited(model, [Add("L1.resid", v, coef=4.0)]):
        ours = _generate(model, prompt)
    with hooked([(view.blocks[1].module, in64(lambda x: x + 4.0 * v.double()))]):
        hand = _generate(model, prompt)
    assert torch.equal(ours.sequences, hand.sequences)
    assert float((_steps(ours) - _steps(hand)).abs().max()) <= TOLERANCE
    assert float((_steps(ours) - _steps(_generate(model, prompt))).abs().max()) > 1e-3


@pytest.mark.parametrize("case", ["gpt2", "llama", "gpt_oss"])
def test_a_positional_edit_generates_the_same_with_and_without_the_cache(case: str) -> None:
    """Positions are of the whole sequence: one in the prompt (edited in the first forward
    only, with the cache) and one among the new tokens (the prompt has 6: position 7 is the
    second new token, fed alone with the cache). GPT-OSS: the clock reads block 0's cache, a
    sliding window of 4 there."""
    model = tiny_model(case)
    view = view_of(model)
    prompt = tiny_ids(1, seq=6)
    v = torch.randn(view.d_model, generator=torch.Generator().manual_seed(9))
    plain = _steps(_generate(model, prompt))
    for edit in (Add("L1.resid@2", v, coef=4.0), Add("L1.resid", v, coef=4.0, positions=[7])):
        with resstream.edited(model, [edit]):
            cached, uncached = (
                _generate(model, prompt, use_cache=True),
                _generate(model, prompt, use_cache=False),
            )
        assert torch.equal(cached.sequences, uncached.sequences), edit.label()
        assert float((_steps(cached) - _steps(uncached)).abs().max()) <= TOLERANCE, edit.label()
        assert float((_steps(cached) - plain).abs().max()) > 1e-3, edit.label()
    # the steps before position 7 is fed (predicting positions 6 and 7) are the plain ones
    assert torch.equal(_steps(cached)[:2], plain[:2])


# --- bad input ------------------------------------------------------------------------------

V = torch.ones(32)  # d_model of the tiny gpt2
BAD = [
    (Add("L1.foo", V), r"Add\('L1.foo'\): `name`: 'L1.foo' is not a site name; allowed: emb, L<l>.resid"),
    (Add("L5.attn", V), r"layer 5 is out of range; allowed: 0..1 \(0-based\)"),
    (Add("L3.resid", V), r"layer 3 is out of range; allowed: 0..2 \(0-based\)"),
    (Set("L1.H4", 0.0), r"head 4 is out of range; allowed: 0..3"),
    (Clamp("L0.N128", 0.0), r"neuron 128 is out of range; allowed: 0..127"),
    (Set("L1.resid@x", 0.0), r"the position after @ must be a number"),
    (
        Add("L1.resid", torch.ones(31)),
        r"`vector` has shape \(31,\); allowed: \(32,\) \(the width of L1.resid",
    ),
    (Add("L1.H*", torch.ones(3)), r"`vector` has shape \(3,\); allowed: \(4, 8\) or \(8,\)"),
    (Set("L0.H1", torch.ones(32)), r"`value` has shape \(32,\); allowed: \(8,\) \(the width of L0.H1\) or a"),
    (Add("L1.resid"), r"give the `vector` to add"),
    (Add("L1.resid", V, coef=math.nan), r"`coef` nan is not finite; allowed: a finite number"),
    (Add("L1.resid", V, coef=math.inf), r"`coef` inf is not finite"),
    (Scale("L1.mlp", math.inf), r"Scale\('L1.mlp'\): `alpha` inf is not finite"),
    (Scale("L1.resid", math.nan), r"`alpha` nan is not finite"),
    (Scale("L1.mlp", "half"), r"`alpha` 'half' is not a number"),
    (Add("L1.resid", torch.full((32,), math.nan)), r"`vector` is not finite; allowed: finite numbers"),
    (Set("L1.resid", "abc"), r"`value` is a str, not a number or tensor"),
    (Project("L1.resid", torch.zeros(32)), r"`direction`: the directions are zero or not linearly"),
    (Project("L1.resid", torch.ones(2, 32)), r"the directions are zero or not linearly independent"),
    (Project("L1.resid", torch.ones(8)), r"`direction` has shape \(8,\); allowed: \(32,\) or \(k, 32\)"),
    (Project("L1.resid"), r"give the `direction`"),
    (Project("L0.N5", torch.ones(32)), r"a single neuron's coefficient has no direction; use Set or Clamp"),
    (Clamp("L1.resid", 1.0), r"Clamp\('L1.resid'\): Clamp acts on neurons \(L<l>.N<k>, L<l>.N\*, L<l>.E<e>"),
    (Clamp("L1.H0", 1.0), r"Clamp acts on neurons"),
    (Clamp("L1.N3", math.nan), r"`value` nan is not finite"),
    (Scale("L2.resid", 0.5), r"Scale\('L2.resid'\): .* no block reads the final state; use Apply"),
    (Set("L1.H0.pattern", 0.0), r"L1.H0.pattern is read only \(trace reads it\)"),
    (Set("L1.H*.pattern", 0.0), r"is read only"),
    (Add("logits", torch.ones(128)), r"Add\('logits'\): logits is read only"),
    (
        Add("L0.H1.S2", torch.ones(8)),
        r"'L0.H1.S2': an attention source is read and edited by `resstream patch`,",
    ),
    (Add("L0.E1", V), r"this model's MLPs have no experts"),
    ([Add("L1.resid", V), "L1.resid"], r"`edits`: str is not an edit; allowed: Set, Add, Scale, Project"),
    (Add("L1.resid@3", V, positions=[3]), r"give the position by @ or by `positions`, not both"),
    (Add("L1.resid", V, positions=[-1]), r"`positions` \[-1\]; allowed: None, or 0-based positions"),
    (Add("L1.resid", V, positions=[]), r"`positions` \[\]; allowed"),
    (Add("L1.resid", V, positions=[True]), r"`positions` \[True\]"),
    (Apply("L1.resid"), r"`fn` must be a function of \(activation, positions\)"),
]


@pytest.mark.parametrize(("edits", "message"), BAD, ids=[message[:40] for _, message in BAD])
def test_bad_edits_are_one_line_usage_errors_and_install_nothing(edits, message: str) -> None:
    model = tiny_model("gpt2")
    before = hook_counts(model)
    with pytest.raises(UsageError, match=message) as error, resstream.edited(model, edits):
        pytest.fail("the block ran")
    assert "\n" not in str(error.value)
    assert hook_counts(model) == before


def test_an_expert_out_of_range_names_the_experts() -> None:
    model, refused = tiny_model("mixtral"), [Clamp("L0.E9", 0.0)]
    with (
        pytest.raises(UsageError, match=r"expert 9 is out of range; allowed: 0..3"),
        resstream.edited(model, refused),
    ):
        pass
