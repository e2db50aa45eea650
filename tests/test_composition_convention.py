"""Composition conventions (issue 23, item 4): "resstream" and "transformer-lens" against hand
implementations written here from the Hugging Face modules' own weights in float64, on a tiny
GPT-2 (LayerNorm, random gains and biases) and a tiny Gemma-2 (RMSNorm with gain 1 + w, and a
post-attention norm); where the two must agree and where they must not; and the option in the
API and the CLI (bad values: one line, exit 2)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import resstream
from resstream.analysis.memories.composition import CONVENTIONS, KINDS, composition
from resstream.cli.main import main
from resstream.errors import UsageError
from resstream.models.adapters import view_of
from tests.cli_support import expect_usage_error, strict_json
from tests.test_models_adapters import ALL_CASES, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = ["--device", "cpu", "--quiet", "--samples", "8"]


# ---- the two tiny models, with norms that matter ------------------------------------------


def gpt2_with_norms(unit: bool = False) -> torch.nn.Module:
    """The tiny GPT-2 with ln_1 gains drawn from [0.3, 2] and random biases (`unit`: gains 1,
    every bias 0)."""
    model = copy.deepcopy(tiny_model("gpt2"))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if unit and name.endswith("bias"):
                param.zero_()
            elif name.endswith("ln_1.weight"):
                param.copy_(
                    torch.ones_like(param)
                    if unit
                    else 0.3 + 1.7 * torch.rand(param.shape, generator=generator)
                )
            elif name.endswith("bias"):
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    return model


def gemma2_with_norms(unit: bool = False) -> torch.nn.Module:
    """The tiny Gemma-2 with its input and post-attention norm weights w drawn from [−0.7, 1]
    (gains 1 + w from 0.3 to 2; `unit`: w = 0, gains 1)."""
    model = copy.deepcopy(tiny_model("gemma2"))
    generator = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                drawn = -0.7 + 1.7 * torch.rand(norm.weight.shape, generator=generator)
                norm.weight.copy_(torch.zeros_like(norm.weight) if unit else drawn)
    return model


# ---- hand implementations (float64, d×d products) -----------------------------------------


def centring(d: int) -> torch.Tensor:
    return torch.eye(d, dtype=torch.float64) - 1.0 / d


def score(left: torch.Tensor, right: torch.Tensor) -> float:
    return float(torch.linalg.norm(left @ right) / (torch.linalg.norm(left) * torch.linalg.norm(right)))


def gpt2_heads(model, layer: int) -> dict[str, list[torch.Tensor]]:
    """Per head: W_Q, W_K, W_V (d, h) read from c_attn (Conv1D: x @ W), W_O (h, d) from c_proj,
    and the block's ln_1 gain (d,)."""
    block = model.transformer.h[layer]
    d, H = model.config.n_embd, model.config.n_head
    h = d // H
    qkv = block.attn.c_attn.weight.detach().double()
    out = block.attn.c_proj.weight.detach().double()
    return {
        "Q": [qkv[:, i * h : (i + 1) * h] for i in range(H)],
        "K": [qkv[:, d + i * h : d + (i + 1) * h] for i in range(H)],
        "V": [qkv[:, 2 * d + i * h : 2 * d + (i + 1) * h] for i in range(H)],
        "O": [out[i * h : (i + 1) * h, :] for i in range(H)],
        "gain": block.ln_1.weight.detach().double(),
    }


def gemma2_heads(model, layer: int, post_gain: bool) -> dict[str, list[torch.Tensor]]:
    """Per query head: W_Q, and its key/value head's W_K, W_V (d, h) from the nn.Linear
    projections (x @ Wᵀ), W_O (h, d) from o_proj (times the post-attention gain 1 + w when
    `post_gain`), and the input norm's gain 1 + w (d,)."""
    config = model.config
    block = model.model.layers[layer]
    attn = block.self_attn
    H, KV, h = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    group = H // KV
    q, k, v = (p.weight.detach().double() for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    out = attn.o_proj.weight.detach().double()
    post = 1.0 + block.post_attention_layernorm.weight.detach().double()
    outputs = [out[:, i * h : (i + 1) * h].T for i in range(H)]
    return {
        "Q": [q[i * h : (i + 1) * h].T for i in range(H)],
        "K": [k[(i // group) * h : (i // group + 1) * h].T for i in range(H)],
        "V": [v[(i // group) * h : (i // group + 1) * h].T for i in range(H)],
        "O": [o * post if post_gain else o for o in outputs],
        "gain": 1.0 + block.input_layernorm.weight.detach().double(),
    }


def transformer_lens_process(heads: dict, centred: bool) -> dict:
    """TransformerLens's fold_ln + center_writing_weights on one block's heads, step by step:
    W_Q/W_K/W_V *= ln1.w[:, None]; for LayerNorm each then minus its mean over d_model, and
    W_O minus its mean over d_model (its output)."""
    gain = heads["gain"][:, None]
    folded = {name: [gain * w for w in heads[name]] for name in ("Q", "K", "V")}
    if centred:
        folded = {name: [w - w.mean(0, keepdim=True) for w in ws] for name, ws in folded.items()}
    folded["O"] = [o - o.mean(-1, keepdim=True) for o in heads["O"]] if centred else list(heads["O"])
    return folded


def resstream_process(heads: dict, centred: bool) -> dict:
    """The resstream convention from its definition: reading matrices N·W with N = C·diag(g)
    (C the centring for LayerNorm, I for RMSNorm), writes W_O·C."""
    d = heads["gain"].shape[0]
    C = centring(d) if centred else torch.eye(d, dtype=torch.float64)
    N = C @ torch.diag(heads["gain"])
    processed = {name: [N @ w for w in heads[name]] for name in ("Q", "K", "V")}
    processed["O"] = [o @ C for o in heads["O"]]
    return processed


def hand_scores(blocks: list[dict]) -> dict[str, dict[tuple[int, int, int, int], float]]:
    """Every pair's Q/K/V score from processed heads: OV = W_V W_O, QK = W_Q W_Kᵀ."""
    out: dict[str, dict[tuple[int, int, int, int], float]] = {kind: {} for kind in KINDS}
    H = len(blocks[0]["Q"])
    for l1, a in enumerate(blocks):
        for l2 in range(l1 + 1, len(blocks)):
            b = blocks[l2]
            for h1 in range(H):
                OV_a = a["V"][h1] @ a["O"][h1]
                for h2 in range(H):
                    QK = b["Q"][h2] @ b["K"][h2].T
                    reads = {"q": QK, "k": QK.T, "v": b["V"][h2] @ b["O"][h2]}
                    for kind in KINDS:
                        out[kind][(l1, h1, l2, h2)] = score(OV_a, reads[kind])
    return out


def hand(model, family: str, convention: str) -> dict:
    """The hand scores of `model` ("gpt2" or "gemma2") in `convention`."""
    layers = range(model.config.num_hidden_layers)
    if family == "gpt2":
        blocks = [gpt2_heads(model, layer) for layer in layers]
        centred = True
    else:
        blocks = [gemma2_heads(model, layer, post_gain=convention == "resstream") for layer in layers]
        centred = False
    process = transformer_lens_process if convention == "transformer-lens" else resstream_process
    return hand_scores([process(block, centred) for block in blocks])


def assert_scores_match(result, expected: dict) -> None:
    for kind in KINDS:
        for pair, value in expected[kind].items():
            assert float(result.scores(kind)[pair]) == pytest.approx(value, rel=1e-4), (kind, pair)


# ---- each convention against its hand implementation ---------------------------------------


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize(("family", "build"), [("gpt2", gpt2_with_norms), ("gemma2", gemma2_with_norms)])
def test_each_convention_equals_its_hand_implementation(family, build, convention):
    model = build()
    result = composition(view_of(model), model=family, convention=convention, samples=4)
    assert result.convention == convention
    assert_scores_match(result, hand(model, family, convention))


def test_the_hand_implementations_differ_where_the_conventions_differ():
    """The Gemma-2 hand scores with and without the post-attention gain are not the same, and
    the GPT-2 hand scores change when centring or the gains are left out: the checks above
    can fail."""
    gemma = gemma2_with_norms()
    with_post, without = hand(gemma, "gemma2", "resstream"), hand(gemma, "gemma2", "transformer-lens")
    assert max(abs(with_post["v"][p] - without["v"][p]) for p in with_post["v"]) > 1e-3
    gpt2 = gpt2_with_norms()
    blocks = [gpt2_heads(gpt2, layer) for layer in range(2)]
    uncentred = hand_scores([resstream_process(block, centred=False) for block in blocks])
    centred = hand(gpt2, "gpt2", "resstream")
    assert max(abs(uncentred["q"][p] - centred["q"][p]) for p in centred["q"]) > 1e-4
    for block in blocks:
        block["gain"] = torch.ones_like(block["gain"])
    no_gains = hand_scores([resstream_process(block, centred=True) for block in blocks])
    assert max(abs(no_gains["k"][p] - centred["k"][p]) for p in centred["k"]) > 1e-3


def test_the_conventions_agree_on_gpt2_and_differ_on_gemma2_by_the_post_attention_gain():
    gpt2 = view_of(gpt2_with_norms())
    ours, theirs = (composition(gpt2, model="g", convention=c, samples=4) for c in CONVENTIONS)
    for kind in KINDS:
        torch.testing.assert_close(
            ours.scores(kind), theirs.scores(kind), rtol=1e-5, atol=1e-7, equal_nan=True
        )
    gemma = view_of(gemma2_with_norms())
    ours, theirs = (composition(gemma, model="g", convention=c, samples=4) for c in CONVENTIONS)
    valid = ~ours.v.isnan()
    assert float((ours.v[valid] - theirs.v[valid]).abs().max()) > 1e-3


@pytest.mark.parametrize(("family", "build"), [("gpt2", gpt2_with_norms), ("gemma2", gemma2_with_norms)])
def test_with_unit_gains_and_zero_biases_the_conventions_agree(family, build):
    view = view_of(build(unit=True))
    ours, theirs = (composition(view, model=family, convention=c, samples=4) for c in CONVENTIONS)
    for kind in KINDS:
        torch.testing.assert_close(
            ours.scores(kind), theirs.scores(kind), rtol=1e-5, atol=1e-7, equal_nan=True
        )


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_the_writing_heads_own_ln1_gain_enters_its_write(convention):
    """Scaling a few coordinates of block 0's ln1 gain (which only block 0's heads read through)
    changes every kind of score of pairs written by block 0; scaling the whole gain does not."""
    model = copy.deepcopy(tiny_model("gpt2"))
    view = view_of(model)
    before = composition(view, model="m", convention=convention, samples=4)
    with torch.no_grad():
        model.transformer.h[0].ln_1.weight.mul_(3.0)
    same = composition(view, model="m", convention=convention, samples=4)
    torch.testing.assert_close(same.q, before.q, rtol=1e-4, atol=1e-6, equal_nan=True)
    with torch.no_grad():
        model.transformer.h[0].ln_1.weight[:4].mul_(10.0)
    changed = composition(view, model="m", convention=convention, samples=4)
    for kind in KINDS:
        assert float((changed.scores(kind)[0] - before.scores(kind)[0]).abs().nan_to_num().max()) > 1e-3


# ---- refusals, the result, the API ---------------------------------------------------------


def test_transformer_lens_refuses_a_post_norm_model_and_an_unknown_convention_is_refused():
    view = view_of(tiny_model("resstream_post"))
    with pytest.raises(
        UsageError, match=r"`convention` 'transformer-lens' needs a pre-norm model; 'p' is post"
    ):
        composition(view, model="p", convention="transformer-lens")
    assert composition(view, model="p", samples=4).convention == "resstream"
    with pytest.raises(UsageError, match=r"`convention` 'tl' is not one of resstream, transformer-lens"):
        composition(view, model="p", convention="tl")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"`convention` 'tl' is not one of"):
        resstream.composition(tiny_model("gpt2"), convention="tl")  # type: ignore[arg-type]


def test_the_convention_is_in_the_json_and_the_notes():
    result = composition(view_of(tiny_model("gemma2")), model="g", convention="transformer-lens", samples=4)
    data = json.loads(json.dumps(result.to_dict(top=2), allow_nan=False))
    assert data["convention"] == "transformer-lens"
    assert any("convention transformer-lens" in note for note in data["notes"])
    default = composition(view_of(tiny_model("gemma2")), model="g", samples=4).to_dict(top=2)
    assert default["convention"] == "resstream" and any("convention resstream" in n for n in default["notes"])


def test_the_api_accepts_a_tokenizer_and_the_convention():
    from resstream.data import train_bpe
    from tests.test_models_loading import SENTENCES

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    model = gemma2_with_norms()
    result = resstream.composition(model=model, tokenizer=tokenizer, convention="transformer-lens", samples=4)
    assert result.convention == "transformer-lens"
    assert_scores_match(result, hand(model, "gemma2", "transformer-lens"))
    without = resstream.composition(model, samples=4)
    assert without.convention == "resstream" and without.n_layers == 2
    with pytest.raises(UsageError, match="`tokenizer` is used only with a model passed as an object"):
        resstream.composition("reference", tokenizer=tokenizer)


def test_the_api_is_quiet_by_default():
    import inspect

    assert inspect.signature(resstream.composition).parameters["progress"].default is False


# ---- the CLI -------------------------------------------------------------------------------


@pytest.mark.usefixtures("hf_offline")
def test_cli_convention_transformer_lens_end_to_end(tmp_path, capsys):
    from tests.test_cli_composition import hf_dir

    model = hf_dir(tmp_path, 2)
    runs = {}
    for convention in CONVENTIONS:
        out = tmp_path / convention
        code = main(
            ["composition", *FAST, "--model", str(model), "--convention", convention, "--out", str(out)]
        )
        captured = capsys.readouterr()
        assert code == 0, captured.err
        report = strict_json(out / "composition.json")
        record = json.loads((out / "run.json").read_text())
        assert report["convention"] == convention and record["config"]["convention"] == convention
        assert f"convention {convention}" in captured.out.splitlines()[0]
        runs[convention] = report
    # a GPT-2 is pre-norm LayerNorm without post-attention norms: the conventions agree
    for ours, theirs in zip(runs["resstream"]["pairs"], runs["transformer-lens"]["pairs"], strict=True):
        assert math.isclose(ours["q"], theirs["q"], rel_tol=1e-5, abs_tol=1e-7)


@pytest.mark.parametrize("value", ["tl", "TransformerLens", ""])
def test_cli_bad_convention(tmp_path, capsys, value):
    expect_usage_error(
        ["composition", *FAST, "--convention", value],
        tmp_path / "out",
        capsys,
        "--convention",
        "resstream",
        "transformer-lens",
    )


@pytest.mark.parametrize(
    "case",
    [c for c in ALL_CASES if c not in ("gemma2", "resstream_post")],
)
def test_the_conventions_agree_on_every_pre_norm_family_without_post_attention_norms(case):
    """docs/attribution.md: the two differ only on Gemma-2 (and post-norm and QK-norm models,
    refused)."""
    view = view_of(tiny_model(case))
    if any(block.q_norm is not None or block.k_norm is not None for block in view.blocks):
        with pytest.raises(UsageError, match=r"not defined for .*\(QK-norm\); use `convention` 'resstream'"):
            composition(view, model=case, convention="transformer-lens", samples=4)
        return
    ours, theirs = (composition(view, model=case, convention=c, samples=4) for c in CONVENTIONS)
    for kind in KINDS:
        torch.testing.assert_close(
            ours.scores(kind), theirs.scores(kind), rtol=1e-5, atol=1e-7, equal_nan=True
        )
