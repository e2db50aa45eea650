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
#: The families of issue 26 (tiny configs in `_new_family_config`): QK-norm, fused projections,
#: post-sub-layer norms inside the branch, experts, attention sinks, parallel blocks, multipliers.
NEW_FAMILIES = (
    "qwen3",
    "gemma3_text",
    "phi3",
    "olmo2",
    "olmo3",
    "mixtral",
    "qwen3_moe",
    "gpt_oss",
    "falcon",
    "falcon_new",
    "cohere",
    "granite",
    "smollm3",
    "phi",
)
HF_FAMILIES = HF_FAMILIES + NEW_FAMILIES
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
    if case in NEW_FAMILIES:
        return _new_family_config(case, llama_like)
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


def _new_family_config(case: str, llama_like: dict):
    """Tiny configs of the families of issue 26 (two layers, every feature its family has)."""
    import transformers as tf

    moe = {"num_experts_per_tok": 2, "output_router_logits": False}
    builders = {
        "qwen3": lambda: tf.Qwen3Config(**llama_like, head_dim=16),
        "gemma3_text": lambda: tf.Gemma3TextConfig(
            **llama_like,
            head_dim=16,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            final_logit_softcapping=3.0,
            query_pre_attn_scalar=16,
        ),
        "phi3": lambda: tf.Phi3Config(**llama_like),
        "olmo2": lambda: tf.Olmo2Config(**llama_like),
        "olmo3": lambda: tf.Olmo3Config(
            **llama_like, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
        ),
        "mixtral": lambda: tf.MixtralConfig(**llama_like, num_local_experts=4, **moe),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(
            **llama_like, num_experts=4, moe_intermediate_size=24, norm_topk_prob=True, **moe
        ),
        "gpt_oss": lambda: tf.GptOssConfig(
            **{**llama_like, "intermediate_size": 24},
            head_dim=16,
            num_local_experts=4,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **moe,
        ),
        "falcon": lambda: tf.FalconConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            vocab_size=VOCAB,
            multi_query=True,
            parallel_attn=True,
            bias=True,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "falcon_new": lambda: tf.FalconConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_kv_heads=2,
            vocab_size=VOCAB,
            new_decoder_architecture=True,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "cohere": lambda: tf.CohereConfig(**llama_like, logit_scale=0.25, use_qk_norm=True),
        "granite": lambda: tf.GraniteConfig(
            **llama_like,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.2,
            logits_scaling=4.0,
        ),
        "smollm3": lambda: tf.SmolLM3Config(**llama_like, no_rope_layer_interval=2),
        "phi": lambda: tf.PhiConfig(
            **{k: v for k, v in llama_like.items() if k != "pad_token_id"}, qk_layernorm=True
        ),
    }
    return builders[case]()


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


def char_tokenizer():
    """A tokenizer of one token per printable ASCII character (ids < 96), which every tiny
    model's vocabulary of `VOCAB` holds."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{chr(c): c - 31 for c in range(32, 127)}}
    assert max(vocab.values()) < VOCAB
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


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
        ("qwen3", False),
        ("gemma3_text", True),
        ("smollm3", True),
        ("olmo2", False),
        ("olmo3", False),
        ("phi3", False),
        ("phi", False),
        ("falcon", True),
        ("falcon_new", True),
        ("cohere", True),
        ("granite", False),
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


#: The families whose attention normalises queries and keys (QK-norm) before rotary.
QK_NORM_CASES = ("qwen3", "gemma3_text", "olmo2", "olmo3")


@pytest.mark.parametrize("case", QK_NORM_CASES)
def test_qk_norm_is_the_models_own(case: str) -> None:
    view = view_of(tiny_model(case))
    span = "all" if case.startswith("olmo") else "head"
    assert any("QK-norm" in note for note in view.notes)
    for block in view.blocks:
        assert block.q_norm is block.attn.q_norm and block.k_norm is block.attn.k_norm
        assert block.qk_norm_span == span
    width = view.n_heads * view.d_head if span == "all" else view.d_head
    assert view.blocks[0].q_norm.weight.shape == (width,)


def test_olmo_normalises_sublayer_outputs_not_inputs() -> None:
    for case in ("olmo2", "olmo3"):
        view = view_of(tiny_model(case))
        for block in view.blocks:
            assert block.ln1 is None and block.ln2 is None
            assert block.post_attn_norm is block.module.post_attention_layernorm
            assert block.post_mlp_norm is block.module.post_feedforward_layernorm
    assert any("sliding window" in note for note in view_of(tiny_model("olmo3")).notes)


def test_gemma3_text_fields() -> None:
    view = view_of(tiny_model("gemma3_text"))
    assert view.logit_softcap == 3.0 and view.embed_scale == pytest.approx(32**0.5)
    block = view.blocks[0]
    assert block.ln1 is block.module.input_layernorm and block.ln2 is block.module.pre_feedforward_layernorm
    assert block.post_attn_norm is block.module.post_attention_layernorm
    assert block.post_mlp_norm is block.module.post_feedforward_layernorm
    assert any("layers [0] attend only to the last 4 tokens" in note for note in view.notes)


def test_gemma3_text_bidirectional_is_refused() -> None:
    import copy

    model = copy.deepcopy(tiny_model("gemma3_text"))
    model.config.use_bidirectional_attention = True
    with pytest.raises(UsageError, match="use_bidirectional_attention"):
        view_of(model)


def test_smollm3_names_its_layers_without_rotary() -> None:
    view = view_of(tiny_model("smollm3"))
    assert view.blocks[0].q_norm is None
    assert any("layers [1] use no rotary" in note for note in view.notes)


def _position_embeddings(view, block_index: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary (cos, sin) block `block_index` receives (hooked from its arguments)."""
    seen = {}

    def hook(module, args, kwargs):
        seen["cos_sin"] = kwargs["position_embeddings"]

    handle = view.blocks[block_index].module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            view.model(ids)
    finally:
        handle.remove()
    return seen["cos_sin"]


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on x (batch, seq, heads, d_head), halves rotated (Llama's layout)."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, :, None] + turned * sin[:, :, None]


def _normed(norm: torch.nn.Module, span: str, heads: torch.Tensor) -> torch.Tensor:
    """QK-norm on (batch, seq, heads, d_head) over one head ("head") or all heads ("all")."""
    if span == "head":
        return norm(heads)
    return norm(heads.flatten(-2)).view(heads.shape)


@pytest.mark.parametrize("case", QK_NORM_CASES)
def test_qk_norm_over_its_span_reproduces_the_attention_pattern(case: str) -> None:
    """softmax(mask(rot(q_norm(x W_Q)) · rot(k_norm(x W_K)) · scale)) is the model's own
    pattern: the view's q_norm / k_norm over `qk_norm_span`, before rotary, are what the model
    computes (sliding layers masked to their window)."""
    from resstream.capture import attention_probs

    view = view_of(tiny_model(case))
    config = view.model.config
    ids = tiny_ids()
    probs = attention_probs(view, ids)
    group = view.n_heads // config.num_key_value_heads
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * view.n_layers
    for index, block in enumerate(view.blocks):
        w = block.attention_weights()
        x = _attention_input(view, index, ids)
        cos, sin = _position_embeddings(view, index, ids)
        q = _normed(block.q_norm, block.qk_norm_span, torch.einsum("btm,hmd->bthd", x, w.W_Q))
        k = _normed(block.k_norm, block.qk_norm_span, torch.einsum("btm,hmd->bthd", x, w.W_K[::group]))
        q, k = _rotated(q, cos, sin), _rotated(k, cos, sin).repeat_interleave(group, dim=2)
        scores = torch.einsum("bthd,bjhd->bhtj", q, k) * block.attn.scaling
        query, key = torch.arange(SEQ)[:, None], torch.arange(SEQ)[None, :]
        hidden = key > query
        if layer_types[index] == "sliding_attention":
            hidden |= key <= query - config.sliding_window
        ours = scores.masked_fill(hidden, float("-inf")).softmax(-1)
        torch.testing.assert_close(ours, probs[index], rtol=1e-4, atol=1e-5)


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
    _assert_values_rebuild_z(view_of(tiny_model(case)), tiny_ids())


def _assert_values_rebuild_z(view: ModelView, ids: torch.Tensor) -> None:
    """Every block's z_h(t) is Σ_j A_h[t, j] · (x_j @ W_V[h] + b_V[h]) (the test above)."""
    from resstream.capture import attention_probs, record

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
        if block.experts is not None:  # routed: tests/test_models_experts.py
            continue
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
        assert w.gated is (case in GATED_MLP_CASES)


#: The cases whose MLP is gated (SwiGLU / GeGLU).
GATED_MLP_CASES = (
    *("llama", "llama_tied", "mistral", "qwen2", "gemma", "gemma2"),
    *("qwen3", "gemma3_text", "smollm3", "olmo2", "olmo3"),
    *("phi3", "cohere", "granite"),
)


# Phi-3, Phi, Falcon, Cohere, Granite: fused projections, parallel blocks, multipliers.


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, pairs: bool = False) -> torch.Tensor:
    """Rotary positions on the first cos.shape[-1] dimensions of x (batch, seq, heads, d_head)
    (partial rotary leaves the rest), halves rotated (Llama's layout) or, with `pairs`,
    neighbouring pairs (Cohere's)."""
    width = cos.shape[-1]
    part = x[..., :width]
    if pairs:
        turned = torch.stack((-part[..., 1::2], part[..., ::2]), dim=-1).flatten(-2)
        part = part * cos[:, :, None] + turned * sin[:, :, None]
    else:
        part = _rotated(part, cos, sin)
    return torch.cat((part, x[..., width:]), dim=-1)


def _causal_pattern(scores: torch.Tensor) -> torch.Tensor:
    """softmax over keys of (batch, heads, query, key) scores, future keys masked."""
    future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


def _heads(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x @ W[h] + b[h] for every head, (batch, seq, heads, d_head)."""
    return torch.einsum("btm,hmd->bthd", x, W) + (0 if b is None else b)


#: Cases whose query, key and value come from one fused projection.
FUSED_QKV_CASES = ("phi3", "falcon", "falcon_new")


def _assert_rotary_pattern(view, ids, scale: float) -> None:
    """softmax(causal(rot(x W_Q + b_Q) · rot(x W_K + b_K) · scale)) from the view's weights is
    the model's own attention pattern in every block."""
    from resstream.capture import attention_probs

    probs = attention_probs(view, ids)
    for index, block in enumerate(view.blocks):
        w = block.attention_weights()
        x = _attention_input(view, index, ids)
        cos, sin = _position_embeddings(view, index, ids)
        q, k = (_rotary(_heads(x, W, b), cos, sin) for W, b in ((w.W_Q, w.b_Q), (w.W_K, w.b_K)))
        scores = torch.einsum("bthd,bjhd->bhtj", q, k) * scale
        torch.testing.assert_close(_causal_pattern(scores), probs[index], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", FUSED_QKV_CASES)
def test_fused_qkv_split_reproduces_the_rotary_pattern(case: str) -> None:
    """softmax(causal(rot(x W_Q + b_Q) · rot(x W_K + b_K) / √d_head)) from the split of the
    fused projection (grouped-query widths, Falcon's groups) is the model's own pattern."""

    view = view_of(tiny_model(case))
    ids = tiny_ids()
    _assert_rotary_pattern(view, ids, view.d_head**-0.5)


def test_phi3_split_of_the_fused_projections() -> None:
    """qkv_proj's output is q | k | v with grouped-query widths (4 query heads, 2 key/value
    heads of 8): W_Q, and every other head of W_K / W_V, are its columns in that order; the
    MLP's gate and up are gate_up_proj's two halves."""
    view = view_of(tiny_model("phi3"))
    block = view.blocks[0]
    w = block.attention_weights()
    W = block.attn.qkv_proj.weight.T  # (d_model, 32 + 16 + 16)
    assert W.shape == (32, 64)
    joined = [t.permute(1, 0, 2).reshape(32, -1) for t in (w.W_Q, w.W_K[::2], w.W_V[::2])]
    assert torch.equal(torch.cat(joined, dim=1), W)
    assert torch.equal(w.W_K[0], w.W_K[1]) and not torch.equal(w.W_K[1], w.W_K[2])
    mlp = block.mlp_weights()
    assert torch.equal(torch.cat((mlp.W_in, mlp.W_up), dim=1), block.mlp.gate_up_proj.weight.T)
    assert block.mlp_out_proj is block.mlp.down_proj


def _tiny_falcon(**config) -> torch.nn.Module:
    """A tiny perturbed Falcon with `config` (the cached cases cover two layouts)."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.FalconForCausalLM(
        tf.FalconConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=VOCAB, **config
        )
    )
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return model.float().eval()


def _assert_block_sums(view: ModelView, ids: torch.Tensor) -> None:
    """Every block's output is its input plus what its attention and MLP add."""
    from resstream.capture import block_internals

    for record in block_internals(view, ids).blocks:
        added = record.block_input + record.attn_output + record.mlp_output
        torch.testing.assert_close(added, record.block_output, rtol=1e-5, atol=1e-6)


def test_falcon_norms_follow_its_architecture() -> None:
    """Parallel attention with one input_layernorm (multi-query case), the new architecture's
    ln_attn / ln_mlp, and the serial block with post_attention_layernorm before the MLP."""
    old = view_of(tiny_model("falcon"))
    new = view_of(tiny_model("falcon_new"))
    serial = view_of(_tiny_falcon(multi_query=False, parallel_attn=False, bias=True))
    for block in old.blocks:
        assert block.parallel and block.ln1 is block.ln2 is block.module.input_layernorm
    for block in new.blocks:
        assert block.parallel and block.ln1 is block.module.ln_attn and block.ln2 is block.module.ln_mlp
    for block in serial.blocks:
        assert not block.parallel
        assert (
            block.ln1 is block.module.input_layernorm and block.ln2 is block.module.post_attention_layernorm
        )
    assert any("1 key/value head(s) shared by the 4" in note for note in old.notes)
    assert any("2 key/value head(s) shared by the 4" in note for note in new.notes)
    assert not any("key/value" in note for note in serial.notes)  # [q_h | k_h | v_h] per head
    ids = tiny_ids()
    _assert_values_rebuild_z(serial, ids)
    _assert_block_sums(serial, ids)
    _assert_block_sums(old, ids)
    theirs = model_logits(serial.model, ids)
    ours = decoder_of(serial).logits(residual_states(serial, ids)[-1])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_falcon_alibi_probabilities_are_what_the_model_computes(implementation: str) -> None:
    """With ALiBi the view's attention probabilities, causal and summing to one, rebuild
    every head's z under either implementation (Falcon's eager ALiBi path differs from its
    sdpa path, and asked for probabilities under sdpa it does not mask them)."""
    view = view_of(_tiny_falcon(alibi=True, multi_query=True, attn_implementation=implementation))
    assert any("ALiBi" in note for note in view.notes)
    ids = tiny_ids()
    _assert_values_rebuild_z(view, ids)
    from resstream.capture import attention_probs

    probs = attention_probs(view, ids)
    assert float(probs.triu(1).abs().max()) == 0.0
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]), rtol=0, atol=1e-5)
    assert view.model.config._attn_implementation == implementation  # restored


def test_phi_parallel_block_partial_rotary_and_layernormed_queries() -> None:
    """Phi: one input_layernorm for both sub-layers, an LM-head bias, and the pattern
    softmax(causal(rot_r(LN_q(x W_Q + b_Q)) · rot_r(LN_k(x W_K + b_K)) / √d_head)) with rotary
    on the first r = partial_rotary_factor·d_head dimensions only."""
    from resstream.capture import attention_probs

    view = view_of(tiny_model("phi"))
    assert view.b_U is view.model.lm_head.bias and view.final_norm is view.model.model.final_layernorm
    assert any("partial rotary" in note for note in view.notes)
    assert any("QK-norm" in note for note in view.notes)
    ids = tiny_ids()
    probs = attention_probs(view, ids)
    for index, block in enumerate(view.blocks):
        assert block.parallel and block.ln1 is block.ln2 is block.module.input_layernorm
        assert block.q_norm is block.attn.q_layernorm and block.k_norm is block.attn.k_layernorm
        assert block.qk_norm_span == "head" and block.mlp_out_proj is block.mlp.fc2
        w = block.attention_weights()
        x = _attention_input(view, index, ids)
        cos, sin = _position_embeddings(view, index, ids)
        assert cos.shape[-1] == block.attn.rotary_ndims < view.d_head
        q = _rotary(block.q_norm(_heads(x, w.W_Q, w.b_Q)), cos, sin)
        k = _rotary(block.k_norm(_heads(x, w.W_K, w.b_K)), cos, sin)
        scores = torch.einsum("bthd,bjhd->bhtj", q, k) * block.attn.scaling
        torch.testing.assert_close(_causal_pattern(scores), probs[index], rtol=1e-4, atol=1e-5)
    _assert_block_sums(view, ids)


def test_cohere_logit_scale_parallel_block_and_per_head_gains() -> None:
    """Cohere: the final norm is logit_scale times the model's norm, one input_layernorm for
    both sub-layers, and QK-norms with one gain row per (query or key/value) head that,
    before the pairwise rotary, give the model's own pattern."""
    from resstream.capture import attention_probs
    from resstream.models.adapters.base import InlineScale

    view = view_of(tiny_model("cohere"))
    assert isinstance(view.final_norm, InlineScale) and view.final_norm.factor == 0.25
    assert view.final_norm.inner is view.model.model.norm and view.tied
    h = torch.randn(2, 3, view.d_model, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(view.final_norm(h), 0.25 * view.model.model.norm(h))
    assert any("logit_scale = 0.25" in note for note in view.notes)
    ids = tiny_ids()
    probs = attention_probs(view, ids)
    group = view.n_heads // view.model.config.num_key_value_heads
    for index, block in enumerate(view.blocks):
        assert block.parallel and block.ln1 is block.ln2 is block.module.input_layernorm
        assert block.q_norm is block.attn.q_norm and block.k_norm is block.attn.k_norm
        assert block.q_norm.weight.shape == (view.n_heads, view.d_head)
        assert block.k_norm.weight.shape == (view.n_heads // group, view.d_head)
        w = block.attention_weights()
        x = _attention_input(view, index, ids)
        cos, sin = _position_embeddings(view, index, ids)
        q = _rotary(block.q_norm(_heads(x, w.W_Q, w.b_Q)), cos, sin, pairs=True)
        k_heads = _heads(x, w.W_K[::group], None if w.b_K is None else w.b_K[::group])
        k = _rotary(block.k_norm(k_heads), cos, sin, pairs=True).repeat_interleave(group, dim=2)
        scores = torch.einsum("bthd,bjhd->bhtj", q, k) * block.attn.scaling
        torch.testing.assert_close(_causal_pattern(scores), probs[index], rtol=1e-4, atol=1e-5)
    _assert_block_sums(view, ids)


def test_granite_multipliers() -> None:
    """Granite: h_0 is embedding_multiplier · W_E[t] exactly; each sub-layer adds
    residual_multiplier times its output (what capture records as attn/mlp output); the
    final norm divides by logits_scaling; attention_multiplier is the scale of the pattern."""
    from resstream.capture import block_internals
    from resstream.models.adapters.base import InlineScale

    view = view_of(tiny_model("granite"))
    trunk = view.model.model
    ids = tiny_ids()
    with torch.no_grad():
        assert torch.equal(view.embed(ids), trunk.embed_tokens(ids) * 3.0)
    assert view.embed_scale == 3.0
    assert isinstance(view.final_norm, InlineScale) and view.final_norm.factor == 0.25
    assert view.final_norm.inner is trunk.norm
    for block in view.blocks:
        for scale in (block.post_attn_norm, block.post_mlp_norm):
            assert isinstance(scale, InlineScale) and scale.factor == 0.5 and scale.inner is None
    for record in block_internals(view, ids).blocks:
        torch.testing.assert_close(record.attn_output, 0.5 * record.attn_raw)
        torch.testing.assert_close(record.mlp_output, 0.5 * record.mlp_raw)
    _assert_block_sums(view, ids)
    _assert_rotary_pattern(view, ids, 0.2)  # the attention multiplier in place of 1/√d_head
    notes = " ".join(view.notes)
    for name in ("embedding_multiplier = 3", "residual_multiplier = 0.5", "attention_multiplier = 0.2"):
        assert name in notes
    assert "logits_scaling = 4" in notes
