"""Path patching against a hand-built two-run patch with plain forward hooks on tiny models:
run 1 is the model's own forward with the sender patched and every component between sender
and receiver held at the base run (sub-layer outputs set to their base values, stream norms
frozen at their base inputs by hand formulas); it records the receiver's input. Run 2 is the
base forward with only that input replaced (a head's query, key or value columns of its
family's projection, spelled out here per family; or the MLP's input). Also: each family's
q/k/v columns reproduce its per-head weights, and bad receivers are one-line refusals."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from functools import cache

import pytest
import torch
from torch import nn

from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.interventions.components import ComponentSpace, parse_component
from resstream.analysis.interventions.effects import Readout
from resstream.analysis.interventions.metrics import measure
from resstream.analysis.interventions.paths import (
    Receiver,
    parse_receiver,
    parse_receivers,
    path_effects,
)
from resstream.analysis.interventions.runs import capture_run, run_values
from resstream.capture.hooks import first_tensor, run_forward
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, SEQ, tiny_ids, tiny_model

TOLERANCE = 1e-5
POSITION = SEQ - 1
TARGET = 7
#: Families checked by hand: separate q/k/v with grouped-query heads (llama, qwen2, gemma with
#: one key/value head, Gemma-2 with post-sub-layer norms), fused q | k | v (gpt2, resstream),
#: per-head interleaved (GPT-NeoX, parallel and serial), resstream post-norm and gated.
HAND_CASES = (
    "gpt2",
    "gpt_neox",
    "gpt_neox_serial",
    "llama",
    "qwen2",
    "gemma",
    "gemma2",
    "resstream",
    "resstream_post",
    "resstream_fixed",
)
#: (sender, receiver) pairs on the two-block tiny models.
PAIRS = (
    ("L0.H1", "L1.H0.q"),
    ("L0.H1", "L1.H1.k"),
    ("L0.H0", "L1.H1.v"),
    ("L0.mlp", "L1.H0.q"),
    ("L0.N5", "L1.H1.k"),
    ("L0.H1", "L1.mlp"),
    ("L0.H1", "L0.mlp"),
    ("emb", "L0.H1.v"),
)


def _corrupt_ids(ids: torch.Tensor) -> torch.Tensor:
    """Another random text of the same length."""
    return tiny_ids(1, seq=ids.shape[1], seed=2)


@cache
def _sharp_view(case: str):
    """The tiny model with its attention weights ×5, so that queries and keys matter (a tiny
    random model attends almost uniformly)."""
    model = copy.deepcopy(tiny_model(case))
    view = view_of(model)
    with torch.no_grad():
        for block in view.blocks:
            for param in block.attn.parameters():
                param.mul_(5.0)
    return view


def hand_forward(view, ids, pre=(), post=()) -> torch.Tensor:
    """h_L at POSITION of the model's own forward with plain hooks: `pre` (module, fn(args)
    -> args or None) and `post` (module, fn(args, output) -> output or None)."""
    finals = {}
    handles = [
        view.blocks[-1].module.register_forward_hook(lambda m, a, out: finals.update(h=first_tensor(out)))
    ]
    handles += [m.register_forward_pre_hook(lambda mod, args, f=f: f(args)) for m, f in pre]
    handles += [m.register_forward_hook(lambda mod, args, out, f=f: f(args, out)) for m, f in post]
    try:
        with torch.no_grad():
            run_forward(view, ids)
    finally:
        for h in handles:
            h.remove()
    return finals["h"][:, POSITION]


def _record(view, ids, module, *, output: bool) -> torch.Tensor:
    """A module's input (first argument) or output in the plain forward of `ids` (every
    module's recorded in one forward, kept per view and text)."""
    key = (id(view), tuple(ids.flatten().tolist()))
    if key not in _RECORDS:
        _RECORDS[key] = _every_module(view, ids)
    inputs, outputs = _RECORDS[key]
    return (outputs if output else inputs)[module]


_RECORDS: dict = {}


def _every_module(view, ids) -> tuple[dict, dict]:
    inputs, outputs = {}, {}

    def keep_input(module, args, kwargs):
        state = args[0] if args else kwargs.get("hidden_states")
        if isinstance(state, torch.Tensor):
            inputs.setdefault(module, state.clone())

    def keep_output(module, args, out):
        if isinstance(out, torch.Tensor) or (isinstance(out, tuple) and isinstance(out[0], torch.Tensor)):
            outputs.setdefault(module, first_tensor(out).clone())

    handles = []
    for module in view.model.modules():
        handles.append(module.register_forward_pre_hook(keep_input, with_kwargs=True))
        handles.append(module.register_forward_hook(keep_output))
    try:
        hand_forward(view, ids)
    finally:
        for handle in handles:
            handle.remove()
    return inputs, outputs


def _set_output(value):
    def apply(args, out):
        if isinstance(out, tuple):
            return (value, *out[1:])
        return value

    return apply


def _hand_columns(case: str, view, layer: int, which: str, head: int):
    """The module computing head `head`'s query/key/value in block `layer` and its columns,
    spelled out per family."""
    attn, d_head, n_heads = view.blocks[layer].attn, view.d_head, view.n_heads
    index = "qkv".index(which)
    if case == "gpt2" or case.startswith("resstream"):
        start = index * n_heads * d_head + head * d_head
        return attn.c_attn, torch.arange(start, start + d_head)
    if case.startswith("gpt_neox"):
        start = (3 * head + index) * d_head
        return attn.query_key_value, torch.arange(start, start + d_head)
    config = view.model.config
    group = 1 if which == "q" else n_heads // config.num_key_value_heads
    start = (head // group) * d_head
    return getattr(attn, f"{which}_proj"), torch.arange(start, start + d_head)


def _frozen_norm(module: nn.Module, base_input: torch.Tensor):
    """A norm's output with its scale frozen at `base_input` (LayerNorm, RMSNorm by formula)."""
    weight = module.weight.float()

    def apply(args, out):
        x, base = args[0].float(), base_input.float()
        if isinstance(module, nn.LayerNorm):
            centred = x - x.mean(-1, keepdim=True)
            y = centred * torch.rsqrt(base.var(-1, unbiased=False, keepdim=True) + module.eps) * weight
            return (y + module.bias.float() if module.bias is not None else y).to(out.dtype)
        assert "Gemma2RMSNorm" in type(module).__name__, type(module)
        y = x * torch.rsqrt(base.pow(2).mean(-1, keepdim=True) + module.eps) * (1.0 + weight)
        return y.to(out.dtype)

    return apply


def _held_between(view, ids, sender, point: int):
    """Forward hooks holding every sub-layer output below residual point `point` other than
    the sender's at its base value, and every stream norm there frozen at its base input."""
    hooks = []
    for layer, block in enumerate(view.blocks):
        post_norm = block.norm_position == "post"
        stages = [
            (2 * layer + 1, "attn", block.attn, [block.post_attn_norm, block.ln1 if post_norm else None]),
            (2 * layer + 2, "mlp", block.mlp, [block.post_mlp_norm, block.ln2 if post_norm else None]),
        ]
        for lands, sublayer, module, norms in stages:
            if lands > point:
                continue
            if not (sender.layer == layer and sender.sublayer == sublayer):
                hooks.append((module, _set_output(_record(view, ids, module, output=True))))
            for norm in norms:
                if norm is not None:
                    hooks.append((norm, _frozen_norm(norm, _record(view, ids, norm, output=False))))
    return hooks


def _sender_hook(view, ids, corrupt_ids, sender):
    """A plain hook patching the sender with its value in the corrupted run: (module, pre?, fn)."""
    block = view.blocks[max(sender.layer, 0)]
    if sender.kind == "emb":
        donor = _record(view, corrupt_ids, view.blocks[0].module, output=False)
        return view.blocks[0].module, True, lambda args: (donor, *args[1:])
    if sender.kind == "mlp":
        return block.mlp, False, _set_output(_record(view, corrupt_ids, block.mlp, output=True))
    if sender.kind == "neuron":
        donor = _record(view, corrupt_ids, block.mlp_out_proj, output=False)

        def neuron(args):
            m = args[0].clone()
            m[..., sender.index] = donor[..., sender.index]
            return (m, *args[1:])

        return block.mlp_out_proj, True, neuron
    donor = _record(view, corrupt_ids, block.out_proj, output=False)
    cols = slice(sender.index * view.d_head, (sender.index + 1) * view.d_head)

    def head(args):
        z = args[0].clone()
        z[..., cols] = donor[..., cols]
        return (z, *args[1:])

    return block.out_proj, True, head


def _hand_two_runs(case, view, ids, corrupt_ids, sender, receiver: Receiver) -> torch.Tensor:
    """h_L at POSITION of the hand-built two-run patch (module docstring)."""
    module, pre, patch_sender = _sender_hook(view, ids, corrupt_ids, sender)
    held = _held_between(view, ids, sender, receiver.point(view))
    block = view.blocks[receiver.layer]
    if receiver.kind == "mlp":
        reads, output = block.mlp, False
    else:
        reads, columns = _hand_columns(case, view, receiver.layer, receiver.kind, receiver.head)
        output = True
    seen = {}

    def keep(*args):
        seen["x"] = (first_tensor(args[-1]) if output else args[0][0]).clone()

    pres = [(module, patch_sender)] if pre else []
    posts = [] if pre else [(module, patch_sender)]
    posts = [*posts, *held]
    (posts if output else pres).append((reads, keep))
    hand_forward(view, ids, pre=pres, post=posts)
    received = seen["x"]
    if receiver.kind == "mlp":
        return hand_forward(view, ids, pre=[(reads, lambda args: (received, *args[1:]))])

    def splice(args, out):
        out = out.clone()
        out[..., columns] = received[..., columns]
        return out

    base_z = _record(view, ids, block.out_proj, output=False)
    others = torch.ones(base_z.shape[-1], dtype=torch.bool)
    others[receiver.head * view.d_head : (receiver.head + 1) * view.d_head] = False

    def hold_other_heads(args):
        z = args[0].clone()
        z[..., others] = base_z[..., others]
        return (z, *args[1:])

    return hand_forward(view, ids, pre=[(block.out_proj, hold_other_heads)], post=[(reads, splice)])


@pytest.mark.parametrize("case", HAND_CASES)
def test_path_patching_equals_a_hand_built_two_run_patch(case: str) -> None:
    view = _sharp_view(case)
    ids = tiny_ids(1)
    corrupt_ids = _corrupt_ids(ids)
    base, corrupt = capture_run(view, ids), capture_run(view, corrupt_ids)
    decoder = decoder_of(view)
    readout = Readout(decoder, POSITION, TARGET)
    clean = readout.of_run(base)
    d_ff = view.blocks[0].read_mlp_weights().d_ff
    space = ComponentSpace(view.n_layers, view.n_heads, d_ff, SEQ)
    changes = []
    for sender_name, receiver_name in PAIRS:
        sender, receiver = parse_component(sender_name, space), parse_receiver(receiver_name, space)
        if receiver.kind == "mlp" and receiver.layer == 0 and view.blocks[0].parallel:
            continue  # refused: a parallel block's MLP reads the block input (tested below)
        [effect] = path_effects(
            base, readout, run_values(base, corrupt), [sender], [receiver], mode="patch", clean=clean
        )
        hand = _hand_two_runs(case, view, ids, corrupt_ids, sender, receiver)
        expected = float(measure(decoder, hand, TARGET).logprob[0])
        assert effect.path == receiver.name and effect.component == sender.name
        assert abs(effect.logprob - expected) <= TOLERANCE, (sender_name, receiver_name)
        changes.append(abs(effect.d_logprob))
    assert len(changes) >= len(PAIRS) - 1
    assert sum(change > 1e-4 for change in changes) >= 5  # the patches moved the prediction


@pytest.mark.parametrize("case", ALL_CASES)
def test_qkv_columns_reproduce_each_head_s_weights(case: str) -> None:
    view = view_of(tiny_model(case))
    block = view.blocks[1]
    weights = block.read_attention_weights()
    x = torch.randn(3, view.d_model, generator=torch.Generator().manual_seed(0))
    for which in "qkv":
        W, b = getattr(weights, f"W_{which.upper()}"), getattr(weights, f"b_{which.upper()}")
        for head in range(view.n_heads):
            module, columns = block.qkv_columns(which, head)
            with torch.no_grad():
                ours = module(x.unsqueeze(0))[0][:, columns]
            expected = x @ W[head] + (0 if b is None else b[head])
            torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_the_same_pair_batched_with_others_gives_the_same_effect() -> None:
    view = view_of(tiny_model("llama"))
    ids = tiny_ids(1)
    base, corrupt = capture_run(view, ids), capture_run(view, _corrupt_ids(ids))
    readout = Readout(decoder_of(view), POSITION, TARGET)
    space = ComponentSpace(view.n_layers, view.n_heads, 48, SEQ)
    senders = [parse_component(n, space) for n in ("L0.H0", "L0.H1", "L0.H2", "L0.mlp")]
    receivers = parse_receivers(["L1.H*.k", "L1.mlp"], space)
    values = run_values(base, corrupt)
    clean = readout.of_run(base)
    together = path_effects(
        base, readout, values, senders, receivers, mode="patch", clean=clean, batch_size=3
    )
    assert [(e.path, e.component) for e in together] == [(r.name, s.name) for r in receivers for s in senders]
    alone = path_effects(base, readout, values, senders[1:2], receivers[2:3], mode="patch", clean=clean)
    assert abs(together[len(senders) * 2 + 1].logprob - alone[0].logprob) <= TOLERANCE


SPACE = ComponentSpace(n_layers=6, n_heads=4, d_ff=512, seq_len=10)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("L3.H2.x", r"not a receiver name; allowed: L<l>\.H<h>\.q"),
        ("L3.attn", "not a receiver name"),
        ("L3.H2", "not a receiver name"),
        ("L6.mlp", r"layer 6 is out of range; allowed: 0\.\.5"),
        ("L0.H4.q", r"head 4 is out of range; allowed: 0\.\.3"),
    ],
)
def test_bad_receiver_names_are_one_line_refusals(name: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_receiver(name, SPACE)


def test_receivers_round_trip_expand_and_refuse_duplicates() -> None:
    assert [r.name for r in parse_receivers(["L2.H*.v", "L3.mlp"], SPACE)] == [
        "L2.H0.v",
        "L2.H1.v",
        "L2.H2.v",
        "L2.H3.v",
        "L3.mlp",
    ]
    with pytest.raises(UsageError, match="given twice"):
        parse_receivers(["L1.mlp", "L1.mlp"], SPACE)


@pytest.mark.parametrize(
    ("case", "sender", "receiver"),
    [
        ("gpt2", "L1.H0", "L0.H1.q"),  # receiver before sender
        ("gpt2", "L1.H0", "L1.H1.k"),  # a head cannot send into its own block's heads
        ("gpt2", "L1.mlp", "L1.mlp"),  # nor an MLP into itself
        ("gpt2", "L0.mlp", "L0.H0.v"),
        ("gpt_neox", "L0.H1", "L0.mlp"),  # parallel residual: the MLP reads the block input
    ],
)
def test_a_sender_that_does_not_write_below_its_receiver_is_refused(case, sender, receiver) -> None:
    view = view_of(tiny_model(case))
    ids = tiny_ids(1)
    base = capture_run(view, ids)
    readout = Readout(decoder_of(view), POSITION, TARGET)
    space = ComponentSpace(view.n_layers, view.n_heads, view.blocks[0].read_mlp_weights().d_ff, SEQ)
    late, early = parse_component(sender, space), parse_component("emb", space)
    receivers = [parse_receiver(receiver, space)]
    values, clean = run_values(base, base), readout.of_run(base)
    refusal = re.escape(f"{receiver}: sender {sender} does not write below it")
    for senders, strict in (([early, late], True), ([late], False)):
        with pytest.raises(UsageError, match=refusal):
            path_effects(base, readout, values, senders, receivers, mode="patch", clean=clean, strict=strict)
    # not strict: the late sender's pair is left out, the embedding's measured
    kept = path_effects(
        base, readout, values, [late, early], receivers, mode="patch", clean=clean, strict=False
    )
    assert [(e.component, e.path) for e in kept] == [("emb", receiver)]


def test_a_family_without_qkv_columns_refuses_head_receivers() -> None:
    view = view_of(tiny_model("gpt2"))
    view = replace(view, blocks=tuple(replace(b, qkv_columns=None) for b in view.blocks))
    base = capture_run(view, tiny_ids(1))
    readout = Readout(decoder_of(view), POSITION, TARGET)
    space = ComponentSpace(view.n_layers, view.n_heads, 128, SEQ)
    args = (base, readout, run_values(base, base), [parse_component("L0.H0", space)])
    with pytest.raises(UsageError, match=r"does not say where each head's query.*allowed: MLP receivers"):
        path_effects(*args, [parse_receiver("L1.H0.q", space)], mode="patch", clean=readout.of_run(base))
    [effect] = path_effects(
        *args, [parse_receiver("L1.mlp", space)], mode="patch", clean=readout.of_run(base)
    )
    assert abs(effect.d_logprob) <= TOLERANCE  # values from the base run itself: nothing changes


CLEAN = "The king is dead, long live the king"
CORRUPT = "The queen is dead, long live the king"


def test_patch_adds_one_effect_per_component_and_receiver() -> None:
    from resstream.api.interventions import patch

    result = patch(CLEAN, corrupt=CORRUPT, components=["L0.H1", "L2.mlp"], receivers=["L3.H*.k", "L3.mlp"])
    receivers = ["L3.H0.k", "L3.H1.k", "L3.H2.k", "L3.H3.k", "L3.mlp"]
    paths = [(e.path, e.component) for e in result.effects if e.path not in ("total", "direct")]
    assert paths == [(r, c) for r in receivers for c in ("L0.H1", "L2.mlp")]
    assert all(e.mode == "patch" and e.fraction_logprob is not None for e in result.select(path="L3.mlp"))
    # a wildcard's senders that do not write below a receiver are left out; a named one is refused
    result = patch(CLEAN, corrupt=CORRUPT, components=["L*.mlp"], receivers=["L2.H0.v"])
    assert [e.component for e in result.select(path="L2.H0.v")] == ["L0.mlp", "L1.mlp"]
    with pytest.raises(UsageError, match=r"L1\.H0\.q: sender L2\.mlp does not write below it"):
        patch(CLEAN, corrupt=CORRUPT, components=["L2.mlp"], receivers=["L1.H0.q"])
    with pytest.raises(UsageError, match="cannot be combined with `atp`"):
        patch(CLEAN, corrupt=CORRUPT, receivers=["L1.mlp"], atp=True)
    with pytest.raises(UsageError, match="not a receiver name"):
        patch(CLEAN, corrupt=CORRUPT, components=["L0.H0"], receivers=["L1.H0"])
