"""attribute_position / attribute_batches: every score equals a direct computation, and
corpus mode equals the mean of per-position runs."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from resstream.analysis.attribution.contributions import log_probs_of
from resstream.analysis.attribution.corpus import attribute_batches, batch_scores, neuron_contributions
from resstream.analysis.attribution.decomposition import residual_points
from resstream.analysis.attribution.scores import Levels, attribute_position
from resstream.analysis.decoding.decoder import decoder_of
from resstream.analysis.norms import norm_form
from resstream.capture import block_internals
from resstream.models.adapters import view_of
from tests.test_models_adapters import ALL_CASES, SEQ, tiny_ids, tiny_model

POSITION, TARGET = 9, 17


def _log_prob(view, h: torch.Tensor, target: int) -> float:
    with torch.no_grad():
        return float(decoder_of(view).logits(h.float()).log_softmax(-1)[..., target])


def _run(case: str, **levels):
    view = view_of(tiny_model(case))
    rec = block_internals(view, tiny_ids(batch=1), attention=True)
    result = attribute_position(
        view, rec, decoder_of(view), POSITION, TARGET, levels=Levels(**{"top": 500, **levels})
    )
    return view, rec, result


@pytest.mark.parametrize("case", ALL_CASES)
def test_checks_are_at_rounding_level(case: str) -> None:
    _, _, result = _run(case, linearity=False)
    assert result.check.decomposition_relative <= 1e-5
    assert result.check.dla_residual <= 1e-4
    for query in result.query_contributions:
        assert query.residual <= 1e-4 * max(1.0, abs(query.preactivation))
    dla_total = result.embed_dla + result.bias_dla + sum(x.attn_dla + x.mlp_dla for x in result.layers)
    assert dla_total == pytest.approx(result.logit, abs=1e-4)
    for layer in result.layers:  # a sub-layer's DLA is its parts' plus its bias's
        heads = sum(h.dla for h in result.heads if h.layer == layer.layer)
        assert heads + layer.attn_bias_dla == pytest.approx(layer.attn_dla, abs=1e-5)
        neurons = sum(n.dla for n in result.neurons if n.layer == layer.layer)
        assert neurons + layer.mlp_bias_dla == pytest.approx(layer.mlp_dla, abs=1e-5)


def _as_added(block, raw_output: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """A raw sub-layer part as the stream receives it: through Gemma-2's post norm, frozen at
    the sub-layer's actual raw output (the norm's formula is tested against the module)."""
    if block is None:
        return part
    return norm_form(block).freeze(raw_output).apply(part)


def _attention_base(internals, at) -> torch.Tensor:
    """α·L_in at the position, α a gate's scalar or a router's per-token factor."""
    x = internals.block_input[at][0]
    alpha = internals.identity_scale
    if alpha is None:
        return x
    return x * (alpha[at][0] if alpha.ndim >= 2 else alpha)


@pytest.mark.parametrize("case", ALL_CASES)
def test_every_level_equals_a_direct_decode(case: str) -> None:
    """C = log p(w | x + v) − log p(w | x) with the model's own final norm and unembedding,
    v built here from the recorded z, attention probabilities and coefficients — every head,
    every source, the top neurons of every family."""
    view, rec, result = _run(case)
    points = residual_points(view, rec, [POSITION])
    for layer in result.layers:
        l_ = layer.layer
        expected = _log_prob(view, points[2 * l_ + 1], TARGET) - _log_prob(view, points[2 * l_], TARGET)
        assert layer.attn_contribution == pytest.approx(expected, abs=1e-5)
    at = (0, torch.tensor([POSITION]))
    for head in result.heads:
        block, internals = view.blocks[head.layer], rec.blocks[head.layer]
        raw = rec.blocks[head.layer].z[0, POSITION, head.head] @ block.W_O[head.head].detach()
        v = _as_added(block.post_attn_norm, internals.attn_raw[0, POSITION], raw)
        x = _attention_base(internals, at)
        assert head.contribution == pytest.approx(
            _log_prob(view, x + v, TARGET) - _log_prob(view, x, TARGET), abs=1e-5
        )
    for neuron in result.neurons[:10]:
        block, internals = view.blocks[neuron.layer], rec.blocks[neuron.layer]
        raw = (
            internals.coefficients[0, POSITION, neuron.neuron]
            * block.mlp_weights().W_out[neuron.neuron].detach()
        )
        v = _as_added(block.post_mlp_norm, internals.mlp_raw[0, POSITION], raw)
        x = points[2 * neuron.layer + 1][0]
        expected = _log_prob(view, x + v, TARGET) - _log_prob(view, x, TARGET)
        assert neuron.contribution == pytest.approx(expected, abs=1e-5)
    assert len(result.sources) == sum(view.n_heads * (POSITION + 1) for _ in range(view.n_layers))
    for source in result.sources[:: max(1, len(result.sources) // 25)]:
        block, internals = view.blocks[source.layer], rec.blocks[source.layer]
        w = block.attention_weights()
        j = source.source_position
        value = internals.attn_input[0, j] @ w.W_V[source.head].detach()
        if w.b_V is not None:
            value = value + w.b_V[source.head].detach()
        raw = internals.probs[0, source.head, POSITION, j] * value @ block.W_O[source.head].detach()
        v = _as_added(block.post_attn_norm, internals.attn_raw[0, POSITION], raw)
        x = _attention_base(internals, at)
        expected = _log_prob(view, x + v, TARGET) - _log_prob(view, x, TARGET)
        assert source.contribution == pytest.approx(expected, abs=1e-5)


def test_trajectory_and_prediction() -> None:
    view, _, result = _run("gpt2")
    assert [p.point for p in result.trajectory] == ["L_in_0", "L_res_0", "L_out_0", "L_res_1", "L_out_1"]
    with torch.no_grad():
        logits = view.model(tiny_ids(batch=1)).logits[0, POSITION]
    probs = logits.softmax(-1)
    assert result.probability == pytest.approx(float(probs[TARGET]), rel=1e-4)
    assert result.rank == int((logits > logits[TARGET]).sum())
    assert result.trajectory[-1].rank == result.rank


def test_linearity_check_starts_equal() -> None:
    _, _, result = _run("gpt2")
    check = result.linearity
    assert check is not None and check.counts[0] == 1
    assert check.cumulative[0] == pytest.approx(check.summed[0], abs=1e-6)  # one vector: C(v1) = C(v1)
    # no C at a state can exceed −log p(target) there: the ceiling the plot draws
    assert check.ceiling is not None and max(check.cumulative) <= check.ceiling + 1e-5
    assert -1.0 <= check.correlation <= 1.0


@pytest.mark.parametrize("case", ["gpt2", "gemma2"])
def test_corpus_mode_equals_the_mean_of_per_position_runs(case: str) -> None:
    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    batches = [tiny_ids(batch=2), tiny_ids(batch=1, seed=7)]
    corpus = attribute_batches(view, decoder, batches, partial(block_internals, view), top=3, candidates=4)
    per_sequence = []
    for ids in batches:
        for s in range(ids.shape[0]):
            rec = block_internals(view, ids[s : s + 1])
            runs = [
                attribute_position(
                    view,
                    rec,
                    decoder,
                    i,
                    int(ids[s, i + 1]),
                    levels=Levels(sources=False, neurons=True, linearity=False, queries=0, top=10_000),
                )
                for i in range(SEQ - 1)
            ]
            per_sequence.append(runs)
    for layer in range(view.n_layers):
        attn = [sum(r.layers[layer].attn_contribution for r in runs) / len(runs) for runs in per_sequence]
        dla = [sum(r.layers[layer].mlp_dla for r in runs) / len(runs) for runs in per_sequence]
        assert corpus.layers[layer].attn_contribution.value == pytest.approx(sum(attn) / len(attn), abs=1e-5)
        assert corpus.layers[layer].mlp_dla.value == pytest.approx(sum(dla) / len(dla), abs=1e-5)
    head = corpus.heads[1]
    expected = [
        sum(
            next(h.contribution for h in r.heads if (h.layer, h.head) == (head.layer, head.head))
            for r in runs
        )
        / len(runs)
        for runs in per_sequence
    ]
    assert head.contribution.value == pytest.approx(sum(expected) / len(expected), abs=1e-5)
    neuron = corpus.neurons[0]
    expected = [
        sum(
            next(n.contribution for n in r.neurons if (n.layer, n.neuron) == (neuron.layer, neuron.neuron))
            for r in runs
        )
        / len(runs)
        for runs in per_sequence
    ]
    assert neuron.contribution.value == pytest.approx(sum(expected) / len(expected), abs=1e-5)
    assert corpus.num_seqs == 3 and corpus.positions == 3 * (SEQ - 1)
    assert corpus.check.dla_residual <= 1e-4
    assert corpus.check.decomposition_relative <= 1e-5


@pytest.mark.parametrize("case", ALL_CASES)
def test_half_precision_models_are_attributed(case: str) -> None:
    """A bfloat16 model (what `--dtype auto` loads for most checkpoints on a GPU) runs through
    every level in both modes; the checks hold to bfloat16's precision."""
    import copy

    view = view_of(copy.deepcopy(tiny_model(case)).to(torch.bfloat16))
    decoder = decoder_of(view)
    rec = block_internals(view, tiny_ids(batch=1), attention=True)
    result = attribute_position(view, rec, decoder, POSITION, TARGET, levels=Levels(top=5))
    assert result.check.decomposition_relative <= 2e-2
    assert result.check.dla_residual <= 5e-2 * max(1.0, abs(result.logit))
    corpus = attribute_batches(
        view, decoder, [tiny_ids(batch=2)], partial(block_internals, view), top=3, candidates=4
    )
    assert corpus.check.dla_residual <= 5e-2 * 10


@pytest.mark.parametrize("case", ["gpt2", "llama", "gemma2"])
def test_corpus_candidates_find_the_neurons_with_the_largest_mean_contribution(case: str) -> None:
    """The first-order screen picks the candidates whose exact C is then computed: with a
    quarter of the neurons as candidates, the true top 5 (every neuron scored exactly) is
    found."""
    view = view_of(tiny_model(case))
    decoder = decoder_of(view)
    batches = [tiny_ids(batch=2)]
    n_neurons = sum(b.mlp_weights().d_ff for b in view.blocks)
    record = partial(block_internals, view)
    exact = attribute_batches(view, decoder, batches, record, top=5, candidates=n_neurons, rank_by="c")
    screened = attribute_batches(
        view, decoder, batches, record, top=5, candidates=n_neurons // 4, rank_by="c"
    )
    found = {(n.layer, n.neuron) for n in screened.neurons} & {(n.layer, n.neuron) for n in exact.neurons}
    assert len(found) == 5
    assert "first-order estimate" in screened.neuron_rule and screened.rank_by == "c"


def test_corpus_mode_lists_the_largest_mean_dla_of_all_neurons_with_their_exact_c() -> None:
    """By default (rank_by "dla") the listed neurons are the top 5 by |mean DLA| over every
    neuron (DLA is exact for all, no screen), each with its exact mean C beside it."""
    view = view_of(tiny_model("gpt2"))
    decoder = decoder_of(view)
    batches = [tiny_ids(batch=2)]
    record = partial(block_internals, view)
    listed = attribute_batches(view, decoder, batches, record, top=5, candidates=8)
    scores = batch_scores(view, record(batches[0]), decoder, log_probs_of(decoder))
    mean_dla = torch.stack([s.neuron_dla for s in scores]).mean(0)  # (L, d_ff)
    d_ff = mean_dla.shape[1]
    top = [divmod(int(i), d_ff) for i in mean_dla.abs().flatten().argsort(descending=True)[:5]]
    assert [(n.layer, n.neuron) for n in listed.neurons] == top
    assert listed.rank_by == "dla" and "largest |mean DLA| of all" in listed.neuron_rule
    internals, lp = record(batches[0]), log_probs_of(decoder)
    exact_c = torch.stack([neuron_contributions(view, internals, lp, top, s) for s in range(2)]).mean(0)
    for neuron, c in zip(listed.neurons, exact_c.tolist(), strict=True):
        assert neuron.contribution.value == pytest.approx(c, abs=1e-6)
        assert neuron.dla.value == pytest.approx(float(mean_dla[neuron.layer, neuron.neuron]), abs=1e-9)


@pytest.mark.parametrize("rank_by", ["dla", "c"])
def test_one_text_lists_the_sources_and_neurons_with_the_largest_score_of_its_ranking(rank_by: str) -> None:
    """The listed sources and neurons are the top N of every one by |DLA| (default) or |C|,
    largest first; the other score is kept beside each."""
    _, _, every = _run("gpt2", linearity=False, queries=0)
    view = view_of(tiny_model("gpt2"))
    rec = block_internals(view, tiny_ids(batch=1), attention=True)
    levels = Levels(top=5, linearity=False, queries=0, rank_by=rank_by)  # type: ignore[arg-type]
    result = attribute_position(view, rec, decoder_of(view), POSITION, TARGET, levels=levels)
    field = "dla" if rank_by == "dla" else "contribution"
    for listed, full in ((result.neurons, every.neurons), (result.sources, every.sources)):
        largest = sorted(full, key=lambda entry: -abs(getattr(entry, field)))[:5]
        # C of the listed entries is computed on its own under "dla": fp32 rounding apart
        expected = [getattr(e, field) for e in largest]
        assert [getattr(e, field) for e in listed] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert result.rank_by == rank_by


@pytest.mark.parametrize("case", ["gpt2", "llama"])
def test_lazily_computed_c_equals_every_c(case: str) -> None:
    """Under "dla" the C of each listed source and neuron (and of the linearity check's) is
    computed for those alone; it equals the C that "c" computes for every one of them."""
    _, _, lazy = _run(case, queries=0)
    _, _, every = _run(case, queries=0, rank_by="c")
    every_c = {(n.layer, n.neuron): n.contribution for n in every.neurons}
    every_c.update({(s.layer, s.head, s.source_position): s.contribution for s in every.sources})
    for n in lazy.neurons:
        assert n.contribution == pytest.approx(every_c[(n.layer, n.neuron)], rel=1e-4, abs=1e-6)
    for src in lazy.sources:
        assert src.contribution == pytest.approx(
            every_c[(src.layer, src.head, src.source_position)], rel=1e-4, abs=1e-6
        )
    assert lazy.linearity is not None and lazy.linearity.correlation > 0.9
    assert "C of every layer and head, and of the 500 listed sources and neurons" in lazy.computed
    assert "C of every layer, head, source and neuron" in every.computed


def test_without_contributions_only_the_dla_is_computed() -> None:
    _, _, dla_only = _run("gpt2", contributions=False)
    _, _, both = _run("gpt2")
    assert all(math.isnan(h.contribution) for h in dla_only.heads)
    assert all(math.isnan(n.contribution) for n in dla_only.neurons)
    assert all(math.isnan(s.contribution) for s in dla_only.sources)
    assert dla_only.linearity is None and "no C beyond the layers'" in dla_only.computed
    assert [h.dla for h in dla_only.heads] == [h.dla for h in both.heads]
    assert [x.attn_contribution for x in dla_only.layers] == [x.attn_contribution for x in both.layers]
    with pytest.raises(ValueError, match="needs contributions"):
        Levels(rank_by="c", contributions=False)


def test_the_cost_follows_the_levels(monkeypatch) -> None:
    """Rows of full-vocabulary scores: "dla" scores the heads, the listed entries and the
    linearity check's, far fewer than "c" (every neuron and source); none per component
    without contributions."""
    from resstream.analysis.attribution.contributions import LogProbs

    def rows_scored(**levels) -> int:
        counted = [0]
        real = LogProbs._scores

        def counting(self, rows, reader):
            counted[0] += rows.shape[0]
            return real(self, rows, reader)

        with monkeypatch.context() as patched:
            patched.setattr(LogProbs, "_scores", counting)
            _run("gpt2", queries=0, **levels)
        return counted[0]

    view = view_of(tiny_model("gpt2"))
    neurons = view.n_layers * view.blocks[0].read_mlp_weights().W_out.shape[0]
    every, lazy = rows_scored(rank_by="c", linearity=False), rows_scored(top=5, linearity=False)
    none = rows_scored(contributions=False)
    assert every >= neurons
    assert lazy < every / 2
    assert none <= 2 * view.n_layers + 1 + 2  # the residual points only
