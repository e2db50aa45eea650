"""What a head reads (issue 26): `head_read_contributions` splits a head's normalised query or
key over the stream's components. Checked against the models' own QK-norm modules (forward
hooks on `self_attn.q_norm` / `k_norm`), with one share computed by hand through ln1, W_Q and
the QK-norm, for per-head norms (Qwen3, Gemma-3), a norm over all heads (OLMo-2), per-head
centring gains (Cohere), LayerNorm QK-norms with biases (Phi) and no QK-norm (Llama)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from resstream.analysis.attribution.heads import head_read_contributions
from resstream.capture import block_internals
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, SEQ, tiny_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYER, POSITION = 1, 7
#: The model's own query/key norm modules of one layer, and whether they see all heads joined.
QK_MODULES = {
    "qwen3": ("q_norm", "k_norm"),
    "gemma3_text": ("q_norm", "k_norm"),
    "olmo2": ("q_norm", "k_norm"),
    "olmo3": ("q_norm", "k_norm"),
    "cohere": ("q_norm", "k_norm"),
    "phi": ("q_layernorm", "k_layernorm"),
}


def captured(
    module: torch.nn.Module, model: torch.nn.Module, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The input and output of `module` in one forward of `model` on `ids`."""
    seen: dict[str, torch.Tensor] = {}

    def hook(mod, args, output):
        seen["in"], seen["out"] = args[0].detach(), output.detach()

    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        handle.remove()
    return seen["in"], seen["out"]


def per_head(t: torch.Tensor, d_head: int, seq: int = SEQ) -> torch.Tensor:
    """A query/key tensor of `seq` positions as the model laid it out — (b, s, heads, d_head),
    (b, heads, s, d_head) or (b, s, heads·d_head) — as (b, s, heads, d_head)."""
    if t.shape[-1] != d_head:
        return t.unflatten(-1, (-1, d_head))
    return t if t.shape[1] == seq else t.transpose(1, 2)


def actual_read(case: str, which: str, head: int) -> torch.Tensor:
    """Head `head`'s normalised query ("q") or key ("k") at POSITION of sequence 0, from a hook
    on the model's own norm module (float64)."""
    model, view = tiny_model(case), view_of(tiny_model(case))
    attn = model.model.layers[LAYER].self_attn
    module = getattr(attn, QK_MODULES[case][0 if which == "q" else 1])
    _, out = captured(module, model, tiny_ids())
    heads = per_head(out, view.d_head)[0, POSITION].double()  # (heads or kv heads, d_head)
    return heads[head // (view.n_heads // heads.shape[0])]


def contributions(case: str, which: str, head: int, **kwargs):
    view = view_of(tiny_model(case))
    internals = block_internals(view, tiny_ids(), attention=kwargs.pop("attention", False))
    return head_read_contributions(view, internals, LAYER, head, POSITION, which, top=100_000, **kwargs)


def total(result) -> float:
    return sum(s.share for s in result.shares) + result.constant


@pytest.mark.parametrize("case", list(QK_MODULES))
@pytest.mark.parametrize("which", ["q", "k"])
def test_shares_sum_to_the_length_of_the_models_own_normalised_query(case, which):
    for head in range(view_of(tiny_model(case)).n_heads):
        actual = actual_read(case, which, head)
        result = contributions(case, which, head)
        assert result.length == pytest.approx(float(actual.norm()), rel=1e-5)
        assert total(result) == pytest.approx(float(actual.norm()), rel=1e-5)
        assert result.residual <= 1e-5 * result.length


@pytest.mark.parametrize("case", ALL_CASES)
def test_every_family_sums_exactly_for_queries_and_keys_of_every_layer(case):
    """Parallel, post-norm, gated, grouped-query, mixture-of-experts and QK-norm blocks alike:
    Σ shares + constant is the length of what the head actually reads (to float32 rounding)."""
    view = view_of(tiny_model(case))
    internals = block_internals(view, tiny_ids())
    for layer in range(view.n_layers):
        for which in ("q", "k"):
            result = head_read_contributions(view, internals, layer, 1, POSITION, which, top=100_000)
            assert result.length > 0
            assert total(result) == pytest.approx(result.length, rel=1e-5)
            assert result.residual <= 1e-5 * result.length


def test_sources_split_the_heads_and_still_sum_exactly():
    actual = actual_read("qwen3", "q", 2)
    result = contributions("qwen3", "q", 2, sources=True, attention=True)
    assert any(s.kind == "source" for s in result.shares)
    assert total(result) == pytest.approx(float(actual.norm()), rel=1e-5)


def centred(v: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    """v − mean(v) for a LayerNorm (torch's, Cohere's), v for an RMSNorm."""
    return v - v.mean() if "LayerNorm" in type(module).__name__ else v


def scale(v: torch.Tensor, module: torch.nn.Module) -> float:
    """The norm's s at its input v: sqrt(mean(centred(v)²) + eps)."""
    eps = getattr(module, "variance_epsilon", None) or module.eps
    return math.sqrt(float(centred(v, module).pow(2).mean()) + eps)


def gain(module: torch.nn.Module) -> torch.Tensor:
    """The norm's gain: its weight, 1 + weight for Gemma's RMSNorm."""
    weight = module.weight.detach().double()
    return 1.0 + weight if "Gemma" in type(module).__name__ else weight


def hand_embedding_share(case: str, which: str, head: int) -> float:
    """The embedding's share, by hand from the modules: h_0 = the embedding module's output;
    ln1 (none in OLMo-2: attention reads the raw stream) with its scale at the actual stream
    and its gain; W_Q (W_K) of the head's key/value head; the QK-norm with its scale at the
    actual query (one head's, or all heads' for OLMo-2) and its gain (Cohere: the head's row);
    dotted with the unit actual normalised query. Biases are not part of the share."""
    model = tiny_model(case)
    layer = model.model.layers[LAYER]
    attn, ids = layer.self_attn, tiny_ids()
    norm = getattr(attn, QK_MODULES[case][0 if which == "q" else 1])
    proj = attn.q_proj if which == "q" else attn.k_proj
    d_head, n_heads = view_of(model).d_head, view_of(model).n_heads
    with torch.no_grad():
        embedding = model.model.embed_tokens(ids)[0, POSITION].double()
    ln1 = getattr(layer, "input_layernorm", None)
    if ln1 is not None:
        stream, _ = captured(ln1, model, ids)
        embedding = centred(embedding, ln1) / scale(stream[0, POSITION].double(), ln1) * gain(ln1)
    q_e = embedding @ proj.weight.detach().double().T  # (kv·d_head,)
    query_in, query_out = captured(norm, model, ids)
    q = per_head(query_in, d_head)[0, POSITION].double()  # (kv, d_head): the actual query
    kv = head // (n_heads // q.shape[0])
    own = slice(kv * d_head, (kv + 1) * d_head)
    if gain(norm).numel() == q.numel() and gain(norm).ndim == 1:  # OLMo-2: one norm over all heads
        n_e = (centred(q_e, norm) / scale(q.reshape(-1), norm) * gain(norm))[own]
    else:
        row = gain(norm)[kv] if gain(norm).ndim == 2 else gain(norm)  # Cohere: a gain per head
        n_e = centred(q_e[own], norm) / scale(q[kv], norm) * row
    actual = per_head(query_out, d_head)[0, POSITION].double()[kv]
    return float(n_e @ actual / actual.norm())


@pytest.mark.parametrize("case", list(QK_MODULES))
@pytest.mark.parametrize("which", ["q", "k"])
def test_the_embedding_share_equals_a_hand_computation(case, which):
    for head in (0, 3):
        result = contributions(case, which, head)
        (embedding,) = [s for s in result.shares if s.kind == "embed"]
        assert embedding.share == pytest.approx(hand_embedding_share(case, which, head), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("which", ["q", "k"])
def test_without_qk_norm_the_shares_sum_to_the_raw_querys_length(which):
    """Llama (attention biases on): the query is x·W_Q + b_Q, read from the projection."""
    model, view = tiny_model("llama"), view_of(tiny_model("llama"))
    attn = model.model.layers[LAYER].self_attn
    _, out = captured(attn.q_proj if which == "q" else attn.k_proj, model, tiny_ids())
    d_head = view.d_head
    heads = per_head(out, d_head)[0, POSITION].double()
    for head in range(view.n_heads):
        actual = heads[head // (view.n_heads // heads.shape[0])]
        result = contributions("llama", which, head)
        assert result.constant != 0.0  # b_Q / b_K
        assert total(result) == pytest.approx(float(actual.norm()), rel=1e-5)


def test_rotary_positions_keep_every_share():
    """The model's own rotary embedding at the position is a rotation: inner products of any
    two queries, so each share ⟨n_c, q̂⟩, are the same after it."""
    model = tiny_model("qwen3")
    generator = torch.Generator().manual_seed(3)
    a, b = (torch.randn(1, 4, 1, 16, generator=generator) for _ in range(2))  # (b, heads, s, d_head)
    cos, sin = model.model.rotary_emb(a, torch.tensor([[POSITION]]))
    ra, rb = apply_rotary_pos_emb(a, b, cos, sin)
    torch.testing.assert_close((ra * rb).sum(-1), (a * b).sum(-1), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ra, a)


def test_shares_are_listed_largest_first_and_which_is_checked():
    result = contributions("qwen3", "q", 1)
    magnitudes = [abs(s.share) for s in result.shares]
    assert magnitudes == sorted(magnitudes, reverse=True)
    view = view_of(tiny_model("qwen3"))
    internals = block_internals(view, tiny_ids())
    assert len(head_read_contributions(view, internals, LAYER, 1, POSITION, top=3).shares) == 3
    with pytest.raises(UsageError, match=r"`which` 'v' is not one of q, k"):
        head_read_contributions(view, internals, LAYER, 1, POSITION, "v")  # type: ignore[arg-type]
