"""`resstream.ablate` and `resstream.patch` on the built-in reference model: defaults, the
component grammar, every ablation mode, patching directions, and the one-line refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch

import resstream
from resstream.analysis.interventions.components import (
    ComponentSpace,
    expand,
    parse_component,
    parse_components,
)
from resstream.errors import UsageError

TEXT = "To be, or not to be, that is the question"
CLEAN = "The king is dead, long live the king"
CORRUPT = "The queen is dead, long live the king"
SPACE = ComponentSpace(n_layers=6, n_heads=4, d_ff=512, seq_len=10)


@pytest.mark.parametrize(
    ("name", "spelled"),
    [
        ("emb", "emb"),
        ("L3.attn", "L3.attn"),
        ("L4.mlp", "L4.mlp"),
        ("L3.H2", "L3.H2"),
        ("L5.N511", "L5.N511"),
        ("L3.H2.S7", "L3.H2.S7"),
        ("L2.resid@5", "L2.resid@5"),
        ("L6.resid@0", "L6.resid@0"),
        (" L0.H0 ", "L0.H0"),
    ],
)
def test_every_spelling_round_trips(name: str, spelled: str) -> None:
    assert parse_component(name, SPACE).name == spelled


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("L3.head2", r"not a component name; allowed: emb, L<l>\.attn"),
        ("l3.H2", "not a component name"),
        ("L6.H0", r"layer 6 is out of range; allowed: 0\.\.5"),
        ("L7.resid@0", r"layer 7 is out of range; allowed: 0\.\.6"),
        ("L0.H4", r"head 4 is out of range; allowed: 0\.\.3"),
        ("L0.N512", r"neuron 512 is out of range; allowed: 0\.\.511"),
        ("L0.H1.S10", r"position 10 is out of range; allowed: 0\.\.9"),
        ("L0.resid@10", r"position 10 is out of range; allowed: 0\.\.9"),
    ],
)
def test_bad_names_name_the_grammar_or_the_valid_range(name: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_component(name, SPACE)


def test_wildcards_expand_to_every_index_and_duplicates_are_refused() -> None:
    assert len(parse_components(["L*.H*"], SPACE)) == 24
    assert len(parse_components(["L*.resid@*"], SPACE)) == 7 * 10
    assert expand("L2.N*", ComponentSpace(6, 4, 3)) == ["L2.N0", "L2.N1", "L2.N2"]
    with pytest.raises(UsageError, match="given twice"):
        parse_components(["L0.H1", "L0.H1"], SPACE)
    with pytest.raises(UsageError, match="cannot stand after"):
        parse_components(["*"], SPACE)


def test_ablate_defaults_to_every_head_every_mlp_and_the_top_neurons() -> None:
    result = resstream.ablate(TEXT)
    totals = result.select(path="total")
    kinds = [e.kind for e in totals]
    assert kinds.count("head") == result.n_layers * result.n_heads
    assert kinds.count("mlp") == kinds.count("attn") == result.n_layers
    assert kinds.count("neuron") == 20
    assert result.select(path="direct") == [] and not result.direct  # the direct path when asked
    assert result.position == len(result.tokens) - 1
    for effect in totals:
        assert effect.d_logprob == pytest.approx(effect.logprob - result.clean.logprob, abs=1e-9)
        assert effect.kl >= 0.0


def test_zero_ablation_of_the_final_state_removes_everything() -> None:
    """Setting h_L to zero at the position leaves only the final norm's bias and b_U: the
    direct and total effects agree exactly (nothing lies downstream)."""
    last = len(resstream.ablate(TEXT, components=["emb"]).tokens) - 1
    result = resstream.ablate(TEXT, components=[f"L6.resid@{last}"], direct=True)
    total, direct = result.effects
    assert total.path == "total" and direct.path == "direct"
    assert total.logprob == pytest.approx(direct.logprob, abs=1e-5)


@pytest.mark.parametrize("mode", ["mean", "resample"])
@pytest.mark.slow
def test_mean_and_resample_ablation_run_on_the_built_in_corpus(mode: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESSTREAM_CACHE", str(tmp_path))
    result = resstream.ablate(TEXT, components=["L0.mlp", "L2.H1", "L3.N7"], mode=mode, num_seqs=2)
    assert result.mode == mode
    assert {e.component for e in result.effects} == {"L0.mlp", "L2.H1", "L3.N7"}
    assert all(torch.isfinite(torch.tensor(e.logprob)) for e in result.effects)


@pytest.mark.slow
def test_mean_ablation_is_cached_per_model_and_corpus(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESSTREAM_CACHE", str(tmp_path))
    first = resstream.ablate(TEXT, components=["L1.mlp"], mode="mean", num_seqs=2)
    cached = list((tmp_path / "means").glob("*.pt"))
    assert len(cached) == 1
    again = resstream.ablate(TEXT, components=["L1.mlp"], mode="mean", num_seqs=2)
    assert again.effects == first.effects


def test_mean_ablation_of_an_edited_corpus_is_not_served_from_the_cache(tmp_path, monkeypatch) -> None:
    """The cache names the corpus by its content: the same path with other text is another
    sample, whose means differ."""
    monkeypatch.setenv("RESSTREAM_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The king said that the queen was there, and the prince went home. " * 30)
    first = resstream.ablate(TEXT, components=["L1.mlp"], mode="mean", dataset=str(corpus), num_seqs=2)
    corpus.write_text("Zebras quickly jumped over seventeen lazy xylophones by the vexing fjords. " * 30)
    edited = resstream.ablate(TEXT, components=["L1.mlp"], mode="mean", dataset=str(corpus), num_seqs=2)
    cached = sorted((tmp_path / "cache" / "means").glob("*.pt"))
    assert len(cached) == 2
    assert edited.effects[0].logprob != first.effects[0].logprob
    assert torch.load(cached[0], weights_only=True)["resid"].dtype == torch.float64  # format 2


def test_pinned_rows_are_cut_to_the_text_and_a_shorter_row_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RESSTREAM_CACHE", str(tmp_path / "cache"))
    length = len(resstream.ablate(TEXT, components=["emb"]).tokens)
    pinned = tmp_path / "rows.jsonl"
    rows = [list(range(5, 5 + length + 4)), list(range(40, 40 + length + 1))]
    pinned.write_text("\n".join(json.dumps({"input_ids": row}) for row in rows))
    for mode in ("resample", "mean"):
        result = resstream.ablate(TEXT, components=["L1.H0"], mode=mode, dataset=str(pinned))
        assert all(math.isfinite(e.logprob) for e in result.effects)
        assert result.samples == (len(rows) if mode == "resample" else None)
    pinned.write_text("\n".join(json.dumps({"input_ids": row}) for row in [rows[0], [5, 6, 7]]))
    with pytest.raises(UsageError, match=r"row 2 has 3 tokens, fewer than the text's"):
        resstream.ablate(TEXT, components=["L1.H0"], mode="resample", dataset=str(pinned))


def test_patching_the_changed_token_early_matters_and_unchanged_positions_do_not() -> None:
    result = resstream.patch(CLEAN, corrupt=CORRUPT, components=["L0.resid@*"], target=" king")
    by_name = {e.component: e for e in result.select(path="total")}
    assert result.corrupt is not None and result.corrupt_tokens is not None
    changed = [i for i, (a, b) in enumerate(zip(result.tokens, result.corrupt_tokens, strict=True)) if a != b]
    assert changed == [1]
    for position in range(len(result.tokens)):
        effect = by_name[f"L0.resid@{position}"]
        if position not in changed:
            assert abs(effect.d_logprob) <= 1e-4
            assert effect.fraction_logprob == pytest.approx(1.0, abs=1e-3)
    whole = by_name["L0.resid@1"]
    if result.corrupt.logprob != result.clean.logprob:
        # h_0 at the only changed position carries the whole difference: the patched run is the
        # corrupted run
        assert whole.logprob == pytest.approx(result.corrupt.logprob, abs=1e-4)
        assert whole.fraction_logprob == pytest.approx(0.0, abs=1e-3)


def test_denoising_restores_the_clean_prediction_from_the_changed_position() -> None:
    result = resstream.patch(CLEAN, corrupt=CORRUPT, components=["L0.resid@1"], direction="denoise")
    total = result.select(path="total")[0]
    assert total.logprob == pytest.approx(result.clean.logprob, abs=1e-4)


def test_patch_aligns_texts_of_different_lengths_only_when_asked() -> None:
    with pytest.raises(UsageError, match=r"the text is \d+ tokens and `corrupt` is \d+ tokens"):
        resstream.patch(CLEAN, corrupt="A queen is dead and gone, long live the king")
    result = resstream.patch(
        CLEAN, corrupt="A queen is dead and gone, long live the king", align_end=True, components=["L1.mlp"]
    )
    assert len(result.corrupt_tokens or ()) == len(result.tokens)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: resstream.patch(CLEAN, corrupt="  "), "`corrupt` is empty"),
        (lambda: resstream.ablate(TEXT, target=" question mark"), "`target` ' question mark' is 2 tokens"),
        (lambda: resstream.ablate(TEXT, components=["L9.H0"]), r"layer 9 is out of range; allowed: 0\.\.5"),
        (lambda: resstream.ablate(TEXT, components=["L0.H0.S30"]), "position 30 is out of range"),
        (lambda: resstream.ablate(TEXT, components=["L0.H0.S3"], position=2), "source position 3 is after"),
        (lambda: resstream.ablate(TEXT, positions=[99]), "`positions` 99 is outside the text"),
        (lambda: resstream.ablate(TEXT, mode="half"), "unknown mode 'half'"),
        (lambda: resstream.patch(CLEAN, corrupt=CORRUPT, direction="up"), "unknown direction 'up'"),
        (lambda: resstream.ablate(TEXT, batch_size=0), "`batch_size` 0 is not allowed"),
        (lambda: resstream.ablate(TEXT, mode="resample", num_seqs=0), "`num_seqs` 0 is not allowed"),
        (lambda: resstream.ablate(TEXT, mode="mean", num_seqs=0), "`num_seqs` 0 is not allowed"),
        (
            lambda: resstream.ablate(TEXT, mode="mean", components=["L0.H0.S1"]),
            "mean ablation of an attention",
        ),
        (
            lambda: resstream.patch(CLEAN, corrupt=CORRUPT, atp=True, direct=True),
            "`direct` cannot be combined with `atp`",
        ),
        (
            lambda: resstream.patch(CLEAN, corrupt=CORRUPT, atp=True, confirm=-1),
            r"`confirm` -1 is not allowed; allowed: 0 \(estimates only\) or more",
        ),
    ],
)
def test_bad_inputs_are_one_line_usage_errors(call, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_a_source_wildcard_stands_for_the_sources_the_prediction_can_read() -> None:
    result = resstream.ablate(TEXT, components=["L1.H0.S*"], position=3)
    assert [e.component for e in result.select(path="total")] == [f"L1.H0.S{j}" for j in range(4)]
    with pytest.raises(UsageError, match="source position 4 is after"):
        resstream.ablate(TEXT, components=["L1.H1.S*", "L1.H0.S4"], position=3)


def test_an_attention_source_and_its_head_restrict_to_the_given_positions() -> None:
    """Zero-ablating every source of a head at the position equals zero-ablating the head there."""
    result = resstream.ablate(TEXT, components=["L2.H1"], positions=[-1], direct=True)
    last = result.position
    head = result.select(path="total")[0]
    sources = [f"L2.H1.S{j}" for j in range(last + 1)]
    joint = resstream.ablate(TEXT, components=sources, positions=[-1], direct=True)
    # each source alone; their direct effects add up to the head's direct effect
    direct = sum(e.d_logit for e in joint.select(path="direct"))
    assert direct == pytest.approx(result.select(path="direct")[0].d_logit, abs=1e-4)
    assert head.component == "L2.H1"


def test_the_direct_path_is_measured_only_when_asked() -> None:
    """Without `direct` each component has its total effect alone, the same as beside its direct
    effect; path patching adds its receivers' effects either way."""
    components = ["L0.H1", "L3.mlp", "L2.N5"]
    total = resstream.ablate(TEXT, components=components)
    both = resstream.ablate(TEXT, components=components, direct=True)
    assert {e.path for e in total.effects} == {"total"} and not total.direct
    assert both.direct and both.select(path="total") == list(total.effects)
    assert [e.component for e in both.select(path="direct")] == components
    asked = {"corrupt": CORRUPT, "components": ["L0.H1"], "receivers": ["L2.H0.q"]}
    assert [e.path for e in resstream.patch(CLEAN, **asked).effects] == ["total", "L2.H0.q"]
    assert [e.path for e in resstream.patch(CLEAN, **asked, direct=True).effects] == [
        "total",
        "direct",
        "L2.H0.q",
    ]
