"""The faithfulness check of the additive scores: the statistics against hand computations, the
batched direct effects against the engine's direct path, gradient × activation against a
finite difference, the ablation curves' first point against single ablations, and
`resstream.faithfulness` on the built-in model (one text; a real corpus when the offline data
is there) with its notebook display, frame, JSON and CSVs."""

from __future__ import annotations

import copy
import html
import json
import math
from pathlib import Path

import pytest
import torch

from resstream.analysis.attribution.contributions import log_probs_of
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.interventions.components import Component
from resstream.analysis.interventions.effects import Readout, component_effects
from resstream.analysis.interventions.faithfulness import (
    FAITHFULNESS_COLUMNS,
    HEAD_SCORES,
    NEURON_SCORES,
    SELECTIONS,
    USABLE_WINDOWS,
    Level,
    ModelFields,
    PredictionMeasures,
    SampleFields,
    ScoredPrediction,
    Settings,
    agreement_values,
    candidate_neurons,
    curve_sizes,
    direct_effects,
    direct_share,
    exact_effects,
    gradient_times_activation,
    measure_prediction,
    selection_order,
    spearman,
    summarise,
    top_k_overlap,
)
from resstream.analysis.interventions.runs import capture_run, zero_values
from resstream.api.faithfulness import chosen_positions, faithfulness
from resstream.errors import UsageError
from resstream.io import jsonable
from resstream.models.adapters import view_of
from resstream.reporting.faithfulness import (
    CSV_TABLES,
    FIGURES,
    csv_frame,
    faithfulness_html,
    terminal_summary,
    write_faithfulness_report,
)
from resstream.reporting.notebook import frame_csv
from tests.notebook_support import assert_displays, assert_frame_columns
from tests.test_models_adapters import tiny_ids, tiny_model

TEXT = "To be, or not to be, that is the question"
#: Families whose direct path passes post-sub-layer norms, post-norm stream norms or gates.
DIRECT_CASES = ("gpt2", "gemma2", "resstream_post", "resstream_learned")


# ----------------------------------------------------------------------------- statistics
def test_spearman_with_ties_matches_a_hand_computation() -> None:
    # ranks of x with the tie shared: 0, 1.5, 1.5, 3; of y: 0, 2, 1, 3 (both mean 1.5)
    # centred: a = (-1.5, 0, 0, 1.5), b = (-1.5, .5, -.5, 1.5): ρ = 4.5 / sqrt(4.5 · 5)
    x = torch.tensor([1.0, 2.0, 2.0, 4.0])
    y = torch.tensor([0.1, 0.3, 0.2, 0.4])
    assert spearman(x, y) == pytest.approx(4.5 / math.sqrt(4.5 * 5), abs=1e-12)
    assert spearman(x, -y) == pytest.approx(-4.5 / math.sqrt(4.5 * 5), abs=1e-12)
    assert math.isnan(spearman(x, torch.ones(4)))
    assert math.isnan(spearman(x[:1], y[:1]))


def test_top_k_overlap_counts_shared_components_by_magnitude() -> None:
    score = torch.tensor([1.0, -2.0, 2.0, 4.0])  # by |score|: 3, then 1 and 2 tied (1 first)
    effect = torch.tensor([-0.1, 0.2, -0.3, 0.4])  # by |effect|: 3, 2
    assert top_k_overlap(score, effect, 2) == 0.5
    assert top_k_overlap(score, effect, 1) == 1.0
    assert top_k_overlap(score, effect, 10) == 1.0  # k capped at the 4 components


def test_signed_scores_agree_with_minus_the_effect_and_magnitudes_with_its_size() -> None:
    contribution = torch.tensor([3.0, 1.0, 2.0, 5.0])
    effect = -contribution  # ablating removes the contribution
    rho, overlap = agreement_values("C", contribution, effect, 2)
    assert rho == pytest.approx(1.0) and overlap == 1.0
    assert agreement_values("C", contribution, -effect, 2)[0] == pytest.approx(-1.0)
    # the activation magnitude is compared with |effect|: the effect's sign does not matter
    assert agreement_values("activation", contribution, -effect, 2)[0] == pytest.approx(1.0)


def test_direct_share_is_the_magnitude_weighted_mean_of_direct_over_total() -> None:
    # (1·1 + (−0.5)·(−1)) / (2 + 1)
    assert direct_share(torch.tensor([1.0, -0.5]), torch.tensor([2.0, -1.0])) == pytest.approx(0.5)
    assert math.isnan(direct_share(torch.zeros(2), torch.zeros(2)))


def test_candidates_take_each_scores_ranking_in_turn() -> None:
    scores = {
        "a": torch.tensor([[9.0, 8.0, 0.0], [0.0, 0.0, 0.0]]),
        "b": torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, -7.0]]),
    }
    # first of a (L0.N0), first of b (L1.N2), second of a (L0.N1)
    chosen = candidate_neurons(scores, 3)
    assert [c.name for c in chosen] == ["L0.N0", "L0.N1", "L1.N2"]
    assert len(candidate_neurons(scores, 100)) == 6  # capped at every neuron


def test_curve_sizes_are_capped_or_stop_at_the_available_neurons() -> None:
    assert curve_sizes((1, 2, 5, 300), 64) == [1, 2, 5, 64]
    assert curve_sizes((1, 2, 5, 300), 4, capped=False) == [1, 2]
    assert curve_sizes((0, 3), 10) == [3]


def test_positions_are_drawn_without_replacement_among_those_with_a_next_token() -> None:
    generator = torch.Generator().manual_seed(0)
    drawn = chosen_positions(20, 4, generator)
    assert len(set(drawn)) == 4 and drawn == sorted(drawn) and all(0 <= p <= 18 for p in drawn)
    assert chosen_positions(4, 10, generator) == [0, 1, 2]


# ----------------------------------------------------------------------------- tiny models
def _prediction(case: str, *, double: bool = False):
    model = tiny_model(case)
    if double:  # a float64 copy: the cached model is shared by other tests
        model = copy.deepcopy(model).double()
    view = view_of(model)
    ids = tiny_ids(1)
    run = capture_run(view, ids, attention=False)
    decoder = decoder_of(view)
    readout = Readout(decoder, run.seq_len - 1, 7)
    return view, run, decoder, readout, readout.of_run(run)


@pytest.mark.parametrize("case", DIRECT_CASES)
def test_batched_direct_effects_equal_the_engines_direct_path(case: str) -> None:
    _, run, _, readout, clean = _prediction(case)
    chosen = [
        Component(0, "head", 1),
        Component(1, "head", 0),
        Component(0, "neuron", 3),
        Component(1, "neuron", 5),
    ]
    ours = direct_effects(run, readout, clean, chosen)
    engine = component_effects(
        run,
        readout,
        zero_values(run),
        [[c] for c in chosen],
        mode="zero",
        positions=torch.tensor([readout.position]),
        clean=clean,
        paths=("direct",),
    )
    expected = torch.tensor([e.d_logprob for e in engine], dtype=torch.float64)
    assert torch.allclose(ours, expected, atol=1e-6), (ours, expected)
    assert ours.abs().max() > 0  # the check can fail


@pytest.mark.parametrize("case", ["gpt2", "resstream"])
def test_gradient_times_activation_is_the_first_order_change(case: str) -> None:
    """Scaling one activation a by (1 ± ε) changes log p by ±ε·⟨∂ log p/∂a, a⟩ to first order
    (a central difference; the metrics read float32 scores, so ε is not tiny)."""
    _, run, _, readout, clean = _prediction(case, double=True)
    heads, neurons = gradient_times_activation(run, readout)
    eps = 1e-2
    where = torch.tensor([readout.position])
    for component, expected in (
        (Component(1, "head", 1), heads[1, 1]),
        (Component(0, "neuron", 4), neurons[0, 4]),
    ):
        changes = []
        for factor in (1 + eps, 1 - eps):

            def scaled(c, positions, factor=factor):
                return run.activation(c, positions) * factor

            effect = component_effects(
                run,
                readout,
                scaled,
                [[component]],
                mode="scale",
                positions=where,
                clean=clean,
                paths=("total",),
            )[0]
            changes.append(effect.d_logprob)
        assert (changes[0] - changes[1]) / (2 * eps) == pytest.approx(float(expected), rel=1e-2)
        assert abs(float(expected)) > 1e-4  # the check can fail


def test_each_curve_starts_with_its_first_neurons_single_effect() -> None:
    _, run, decoder, readout, clean = _prediction("resstream")
    settings = Settings(candidates=40, top_k=5, curve_sizes=(1, 3, 10_000))
    measured = measure_prediction(run, decoder, log_probs_of(decoder), readout.target, settings)
    neurons = measured.levels[1]
    # the exact-effect selection's first neuron is the largest single drop measured (other batches
    # of the float32 forward round differently: 1e-6)
    assert measured.curves[("effect", 1)][0] == pytest.approx(float(neurons.total.min()), abs=1e-6)
    assert ("effect", 40) not in measured.curves  # the effect curve stops at the candidates
    scores = _all_neuron_scores(run, decoder, readout)
    d_ff = scores["C"].shape[1]
    for method in ("C", "DLA", "activation", "grad_x_act"):
        first = selection_order(method, scores, neurons, None)[0]
        alone = exact_effects(run, readout, clean, [[Component(first // d_ff, "neuron", first % d_ff)]], 8)
        assert measured.curves[(method, 1)][0] == pytest.approx(float(alone[0][0]), abs=1e-6), method
    total = scores["C"].numel()
    assert (("C", total) in measured.curves) and (("C", 10_000) not in measured.curves)  # capped
    assert {m for m, _ in measured.curves} == set(SELECTIONS)


def _all_neuron_scores(run, decoder, readout):
    from resstream.analysis.interventions.faithfulness import all_scores

    return all_scores(run, decoder, log_probs_of(decoder), readout.target).neurons


def test_random_selection_is_seeded() -> None:
    scores = {"C": torch.zeros(2, 8)}
    first = selection_order("random", scores, None, torch.Generator().manual_seed(3))  # type: ignore[arg-type]
    again = selection_order("random", scores, None, torch.Generator().manual_seed(3))  # type: ignore[arg-type]
    assert first == again and sorted(first) == list(range(16))


def _window(sequence: int, total: list[float], score: list[float]) -> list[PredictionMeasures]:
    """One window's one prediction: heads with these total effects and C scores."""
    effects = torch.tensor(total, dtype=torch.float64)
    heads = tuple(Component(0, "head", h) for h in range(len(total)))
    level = Level("head", heads, effects, effects / 2, {"C": torch.tensor(score, dtype=torch.float64)})
    prediction = ScoredPrediction(sequence, 1, 5, "x", -1.0, 0)
    return [PredictionMeasures(prediction, (level,), {("C", 1): (-0.1, -0.01)})]


def test_intervals_from_too_few_windows_carry_a_note() -> None:
    """Two windows: ρ 1 and 0.5 give a 95% interval of [−1, 1], which a note calls uninformative,
    in the result, the terminal's lines and the page; enough windows, or one text, get none."""
    fields = ModelFields("m", top_k=2, candidates=0, neuron_count=0, n_layers=1, n_heads=3, notes=("x",))
    two = [_window(0, [-1.0, -2.0, -3.0], [1.0, 2.0, 3.0]), _window(1, [-1.0, -2.0, -3.0], [1.0, 3.0, 2.0])]
    result = summarise(two, fields, SampleFields(dataset="corpus", num_seqs=2))
    rho = result.agreement_of("head", "C").spearman
    assert (rho.value, rho.low, rho.high, rho.count) == (0.75, -1.0, 1.0, 2)
    note = result.notes[-1]
    assert result.notes[0] == "x" and note.startswith("too few sequences") and "2 windows" in note
    assert f"{USABLE_WINDOWS} windows or more" in note and "next to nothing" in note
    assert f"note: {note}" in terminal_summary(result) and html.escape(note) in faithfulness_html(result, [])
    enough = [_window(k, [-1.0, -2.0, -3.0], [1.0, 2.0, 3.0]) for k in range(USABLE_WINDOWS)]
    assert summarise(enough, fields, SampleFields(dataset="corpus")).notes == ("x",)
    assert summarise(two[:1], fields).notes == ("x",)  # one text: no interval is claimed


# ----------------------------------------------------------------------------- the API
@pytest.fixture(scope="module")
def one_text():
    return faithfulness(TEXT, candidates=24, curve_sizes=(1, 4, 16))


def test_one_text_measures_every_head_and_the_candidates(one_text) -> None:
    result = one_text
    assert result.dataset is None and len(result.predictions) == 1
    prediction = result.predictions[0]
    assert prediction.position == len(result.tokens) - 1 and prediction.rank == 0  # the model's top token
    heads = [c for c in result.components if c.level == "head"]
    neurons = [c for c in result.components if c.level == "neuron"]
    assert len(heads) == result.n_layers * result.n_heads == 24 and len(neurons) == 24
    assert {a.score for a in result.agreement if a.level == "head"} == set(HEAD_SCORES)
    assert {a.score for a in result.agreement if a.level == "neuron"} == set(NEURON_SCORES)
    # gradient × activation is the first-order estimate: it tracks the exact neuron effects
    assert result.agreement_of("neuron", "grad_x_act").spearman.value > 0.9
    assert "faithfulness" in repr(result) and "reference" in repr(result) and len(repr(result)) < 400


def test_frame_columns_and_values_follow_the_result(one_text) -> None:
    frame = assert_frame_columns(one_text, FAITHFULNESS_COLUMNS)
    rho = frame[(frame["table"] == "agreement") & (frame["level"] == "neuron") & (frame["score"] == "DLA")]
    rho = rho[rho["metric"] == "spearman"]
    assert float(rho["value"].iloc[0]) == one_text.agreement_of("neuron", "DLA").spearman.value
    first = one_text.components[0]
    rows = frame[(frame["table"] == "component") & (frame["component"] == first.component)]
    assert float(rows[rows["metric"] == "total"]["value"].iloc[0]) == first.total
    c_row = rows[(rows["metric"] == "score") & (rows["score"] == "C")]
    assert float(c_row["value"].iloc[0]) == first.scores["C"]
    curve = frame[(frame["table"] == "curve") & (frame["score"] == "C") & (frame["n"] == 4)]
    assert (
        float(curve[curve["metric"] == "d_logprob"]["value"].iloc[0])
        == one_text.curve("C")[1].d_logprob.value
    )


def test_displays_its_tables_and_figures(one_text) -> None:
    assert_displays(one_text, ["agreement with the exact effect", "ablation curves", "Spearman ρ"])


def test_report_files_hold_the_dict_and_the_frame(one_text, tmp_path: Path) -> None:
    written = write_faithfulness_report(one_text, tmp_path)
    names = {path.name for path in written}
    assert names == {"ablate.json", "ablate.html", *CSV_TABLES, *FIGURES}
    assert json.loads((tmp_path / "ablate.json").read_text()) == jsonable(one_text.to_dict())
    frame = one_text.to_pandas()
    for name in CSV_TABLES:
        assert (tmp_path / name).read_text() == frame_csv(csv_frame(one_text, name, frame))
    page = (tmp_path / "ablate.html").read_text()
    assert "data:image/png;base64," in page and "http" not in page.replace("http-equiv", "")


def test_single_text_and_corpus_options_are_refused_in_the_other_mode() -> None:
    with pytest.raises(UsageError, match="`position` is for one text"):
        faithfulness(dataset="shakespeare", position=3)
    with pytest.raises(UsageError, match="`num_seqs` is for a corpus"):
        faithfulness(TEXT, num_seqs=3)
    with pytest.raises(UsageError, match="`top_k` 0"):
        faithfulness(TEXT, top_k=0)
    with pytest.raises(UsageError, match="`candidates` 0"):
        faithfulness(TEXT, candidates=0)
    with pytest.raises(UsageError, match="`curve_sizes`"):
        faithfulness(TEXT, curve_sizes=[0])


@pytest.mark.slow
def test_corpus_mode_averages_over_windows_of_the_real_corpus(shared_data: Path) -> None:
    result = faithfulness(
        dataset="shakespeare",
        data_dir=shared_data,
        num_seqs=2,
        seq_len=16,
        positions_per_seq=2,
        candidates=8,
        curve_sizes=(1, 4),
    )
    assert result.dataset == "shakespeare" and result.num_seqs == 2 and len(result.predictions) == 4
    assert [p.sequence for p in result.predictions] == [0, 0, 1, 1]
    grad = result.agreement_of("head", "grad_x_act").spearman
    assert grad.count == 2 and -1.0 <= grad.low <= grad.value <= grad.high <= 1.0
    assert result.dataset_fingerprint and result.sample
    assert any("positions per window" in rule for rule in result.rules)
