"""Adapters: every family's view reproduces its model's own h_0 and logits (tiny random models)."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from resstream.analysis.decoding.decoder import decoder_of
from resstream.capture import residual_states
from resstream.errors import UsageError
from resstream.models.adapters import ModelView, register, supported_families, view_of
from resstream.models.adapters.registry import ADAPTERS

VOCAB = 128
SEQ = 12
HF_FAMILIES = (
    "gpt2",
    "gpt_neox",
    "gpt_neox_serial",
    "llama",
    "llama_tied",
    "mistral",
    "qwen2",
    "gemma",
    "gemma2",
)
RESSTREAM_VARIANTS = (
    "resstream",
    "resstream_rotary_rms",
    "resstream_post",
    "resstream_learned",
    "resstream_fixed",
    "resstream_router",
)
ALL_CASES = HF_FAMILIES + RESSTREAM_VARIANTS


def _hf_config(case: str):
    import transformers as tf

    llama_like = {
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if case == "gpt2":
        return tf.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2
        )
    if case in ("gpt_neox", "gpt_neox_serial"):
        return tf.GPTNeoXConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=48,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            use_parallel_residual=case == "gpt_neox",
            bos_token_id=1,
            eos_token_id=2,
        )
    if case == "llama":
        return tf.LlamaConfig(**llama_like, attention_bias=True)
    if case == "llama_tied":
        return tf.LlamaConfig(**llama_like, tie_word_embeddings=True)
    if case == "mistral":
        return tf.MistralConfig(**llama_like, sliding_window=32)
    if case == "qwen2":
        return tf.Qwen2Config(**llama_like)
    if case == "gemma":
        return tf.GemmaConfig(**{**llama_like, "num_key_value_heads": 1}, head_dim=16)
    if case == "gemma2":
        return tf.Gemma2Config(
            **llama_like,
            head_dim=16,
            final_logit_softcapping=3.0,
            attn_logit_softcapping=50.0,
            sliding_window=32,
            query_pre_attn_scalar=16,
        )
    raise KeyError(case)


def _resstream_model(case: str):
    from resstream.training.config import ModelConfig
    from resstream.training.model import GPT

    extra = {
        "resstream": {},
        "resstream_rotary_rms": {"pos_emb": "rotary", "norm": "rmsnorm", "bias": False},
        "resstream_post": {"norm_position": "post"},
        "resstream_learned": {"gate": "learned"},
        "resstream_fixed": {"gate": "fixed", "alpha": 0.5, "cut_layer": 1},
        "resstream_router": {"gate": "router"},  # α per token: (batch, seq, 1)
    }[case]
    return GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=16, vocab_size=VOCAB, **extra))


@cache
def tiny_model(case: str) -> torch.nn.Module:
    """A tiny float32 model in eval mode, all parameters perturbed (so norms and biases matter)."""
    torch.manual_seed(0)
    if case.startswith("resstream"):
        model = _resstream_model(case)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(_hf_config(case), dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return model.float().eval()


def tiny_ids(batch: int = 2, seq: int = SEQ, seed: int = 1) -> torch.Tensor:
    """Random token ids (batch, seq)."""
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def model_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The model's own logits."""
    with torch.no_grad():
        out = model(ids)
    return out[0] if isinstance(out, tuple) else out.logits


def test_registry_lists_every_family() -> None:
    assert set(supported_families()) >= {
        "resstream",
        "gpt2",
        "gpt_neox",
        "llama",
        "mistral",
        "qwen2",
        "gemma",
        "gemma2",
    }


@pytest.mark.parametrize("case", ALL_CASES)
def test_embed_is_exactly_the_input_of_block_0(case: str) -> None:
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids()
    states = residual_states(view, ids)
    with torch.no_grad():
        h0 = view.embed(ids)
    assert torch.equal(h0, states[0])


@pytest.mark.parametrize("case", ALL_CASES)
def test_decoding_the_last_state_reproduces_the_logits(case: str) -> None:
    model = tiny_model(case)
    view = view_of(model)
    ids = tiny_ids()
    states = residual_states(view, ids)
    with torch.no_grad():
        ours = decoder_of(view).logits(states[-1])
    theirs = model_logits(model, ids)
    assert ours.shape == theirs.shape == (2, SEQ, VOCAB)
    rel = (ours - theirs).abs().max() / theirs.abs().max()
    assert rel <= 1e-5, f"{case}: relative error {rel:.2e}"


@pytest.mark.parametrize("case", ALL_CASES)
def test_W_O_per_head_reproduces_the_output_projection(case: str) -> None:
    view = view_of(tiny_model(case))
    gen = torch.Generator().manual_seed(2)
    for block in view.blocks:
        n_heads, d_head, d_model = block.W_O.shape
        assert (n_heads, d_head, d_model) == (view.n_heads, view.d_head, view.d_model)
        z = torch.randn(2, 5, n_heads * d_head, generator=gen)
        per_head = torch.einsum("bshd,hdm->bsm", z.view(2, 5, n_heads, d_head), block.W_O)
        if block.b_O is not None:
            per_head = per_head + block.b_O
        with torch.no_grad():
            direct = block.out_proj(z)
        torch.testing.assert_close(per_head, direct, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("case", "tied"),
    [
        ("gpt2", True),
        ("gpt_neox", False),
        ("llama", False),
        ("llama_tied", True),
        ("mistral", False),
        ("qwen2", False),
        ("gemma", True),
        ("gemma2", True),
        ("resstream", True),
    ],
)
def test_tied_flag_and_untied_note(case: str, tied: bool) -> None:
    view = view_of(tiny_model(case))
    assert view.tied is tied
    assert (view.W_U.data_ptr() == view.W_E.data_ptr()) is tied
    untied_note = [note for note in view.notes if "untied" in note]
    assert bool(untied_note) is not tied
    if not tied:
        assert "lm_head.weight" in untied_note[0]
    if not tied:
        assert view.W_U is tiny_model(case).get_output_embeddings().weight


def test_family_specific_fields() -> None:
    g2 = view_of(tiny_model("gemma2"))
    assert g2.logit_softcap == 3.0
    assert all(b.post_attn_norm is not None and b.post_mlp_norm is not None for b in g2.blocks)
    assert g2.blocks[0].ln2 is g2.blocks[0].module.pre_feedforward_layernorm
    assert g2.embed_scale == pytest.approx(32**0.5)
    assert g2.d_head == 16  # head_dim set explicitly (4 heads x 16 != 32)
    gemma = view_of(tiny_model("gemma"))
    assert gemma.logit_softcap is None and gemma.blocks[0].post_attn_norm is None
    assert view_of(tiny_model("gpt2")).embed_scale == 1.0
    assert view_of(tiny_model("gpt_neox")).blocks[0].parallel
    assert not view_of(tiny_model("gpt_neox_serial")).blocks[0].parallel
    assert view_of(tiny_model("llama")).blocks[0].b_O is not None  # attention_bias=True
    assert view_of(tiny_model("qwen2")).blocks[0].b_O is None  # Qwen2: q/k/v bias only
    post = view_of(tiny_model("resstream_post"))
    assert post.blocks[0].norm_position == "post" and any("post-norm" in n for n in post.notes)
    assert any("gate" in n for n in view_of(tiny_model("resstream_learned")).notes)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("gpt2", 64),
        ("gpt_neox", 64),
        ("llama", 64),
        ("gemma2", 64),
        ("resstream", 16),
    ],
)
def test_max_positions_and_sizes(case: str, expected: int) -> None:
    view = view_of(tiny_model(case))
    assert view.max_positions == expected
    assert view.n_layers == 2
    assert view.W_U.shape == view.W_E.shape == (VOCAB, view.d_model)


def test_unknown_family_lists_the_supported_ones() -> None:
    from transformers import OPTConfig, OPTForCausalLM

    model = OPTForCausalLM(
        OPTConfig(
            num_hidden_layers=1,
            hidden_size=16,
            ffn_dim=32,
            num_attention_heads=2,
            vocab_size=32,
            word_embed_proj_dim=16,
            max_position_embeddings=16,
        )
    )
    with pytest.raises(UsageError, match=r"unsupported model family 'opt'.*gpt2.*gpt_neox.*llama"):
        view_of(model)
    with pytest.raises(UsageError, match=r"unsupported model type 'Linear'.*resstream"):
        view_of(torch.nn.Linear(2, 2))


def test_register_adds_a_family() -> None:
    calls = []

    @register("tiny_test_family")
    def adapter(model: torch.nn.Module) -> ModelView:
        calls.append(model)
        return ADAPTERS["gpt2"](model)

    try:
        model = tiny_model("gpt2")
        original = model.config.model_type
        model.config.model_type = "tiny_test_family"
        try:
            assert view_of(model).family == "gpt2" and calls == [model]
        finally:
            model.config.model_type = original
        assert "tiny_test_family" in supported_families()
    finally:
        ADAPTERS.pop("tiny_test_family", None)


def test_reference_model_view_reproduces_its_logits() -> None:
    from resstream.models import load_model

    loaded = load_model(None, device="cpu")
    view = loaded.view
    assert view.family == "resstream" and view.tied and loaded.source == "reference"
    assert not view.model.training
    ids = torch.tensor([loaded.tokenizer.encode("To be, or not to be, that is the question")])
    states = residual_states(view, ids)
    assert states.shape == (view.n_layers + 1, 1, ids.shape[1], view.d_model)
    assert torch.equal(view.embed(ids), states[0])
    with torch.no_grad():
        theirs = view.model(ids)[0]
        ours = decoder_of(view).logits(states[-1])
    assert ((ours - theirs).abs().max() / theirs.abs().max()) <= 1e-5


def _attention_input(view, block_index: int, ids: torch.Tensor) -> torch.Tensor:
    """What block `block_index`'s attention module receives (hooked)."""
    from resstream.capture import record

    with torch.no_grad(), record([view.blocks[block_index].attn], inputs=True) as seen:
        view.model(ids)
    return seen["0"][0]


@pytest.mark.parametrize("case", ALL_CASES)
def test_per_head_values_reproduce_the_attention_output(case: str) -> None:
    """z_h(t) = Σ_j A_h[t, j] · (x_j @ W_V[h] + b_V[h]): the per-head value matrices, with the
    captured attention probabilities, rebuild what the output projection receives."""
    from resstream.capture import attention_probs, record

    view = view_of(tiny_model(case))
    ids = tiny_ids()
    probs = attention_probs(view, ids)
    for index, block in enumerate(view.blocks):
        weights = block.attention_weights()
        assert weights.W_Q.shape == weights.W_K.shape == weights.W_V.shape
        assert weights.W_V.shape == (view.n_heads, view.d_model, view.d_head)
        x = _attention_input(view, index, ids)
        with torch.no_grad(), record([block.out_proj], inputs=True) as seen:
            view.model(ids)
        z = seen["0"][0].view(2, SEQ, view.n_heads, view.d_head)
        v = torch.einsum("btm,hmd->bhtd", x, weights.W_V)
        if weights.b_V is not None:
            v = v + weights.b_V[None, :, None, :]
        rebuilt = torch.einsum("bhtj,bhjd->bthd", probs[index], v)
        torch.testing.assert_close(rebuilt, z, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ALL_CASES)
def test_query_key_weights_reproduce_the_attention_pattern_without_rotary(case: str) -> None:
    """For families with absolute or no positions, softmax(causal(q·k/√d)) from W_Q/W_K is the
    model's own attention pattern; rotary families differ only by the rotation, so they check
    the shapes and that q from W_Q has the model's own norm at position 0 (no rotation there)."""
    from resstream.capture import attention_probs

    view = view_of(tiny_model(case))
    if case not in ("gpt2", "resstream", "resstream_post", "resstream_learned", "resstream_fixed"):
        pytest.skip("rotary positions: W_Q/W_K are read before the rotation")
    ids = tiny_ids()
    probs = attention_probs(view, ids)
    for index, block in enumerate(view.blocks):
        w = block.attention_weights()
        x = _attention_input(view, index, ids)
        q = torch.einsum("btm,hmd->bhtd", x, w.W_Q) + (0 if w.b_Q is None else w.b_Q[None, :, None])
        k = torch.einsum("btm,hmd->bhtd", x, w.W_K) + (0 if w.b_K is None else w.b_K[None, :, None])
        scores = q @ k.transpose(-1, -2) / view.d_head**0.5
        future = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
        ours = scores.masked_fill(future, float("-inf")).softmax(-1)
        torch.testing.assert_close(ours, probs[index], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ALL_CASES)
def test_mlp_weights_reproduce_the_mlp(case: str) -> None:
    """act(x W_in + b_in) [· (x W_up + b_up)] @ W_out + b_out is the MLP module's output, and
    the coefficients m are what `mlp_out_proj` receives."""
    from resstream.capture import record

    view = view_of(tiny_model(case))
    gen = torch.Generator().manual_seed(3)
    for block in view.blocks:
        w = block.mlp_weights()
        assert w.W_in.shape == (view.d_model, w.d_ff) and w.W_out.shape == (w.d_ff, view.d_model)
        x = torch.randn(2, 5, view.d_model, generator=gen)
        with torch.no_grad(), record([block.mlp_out_proj], inputs=True) as seen:
            direct = block.mlp(x)
            pre = x @ w.W_in + (0 if w.b_in is None else w.b_in)
            m = w.act(pre)
            if w.gated:
                m = m * (x @ w.W_up + (0 if w.b_up is None else w.b_up))
            ours = m @ w.W_out + (0 if w.b_out is None else w.b_out)
        torch.testing.assert_close(m, seen["0"][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours, direct, rtol=1e-5, atol=1e-6)
        assert w.gated is (case in ("llama", "llama_tied", "mistral", "qwen2", "gemma", "gemma2"))
