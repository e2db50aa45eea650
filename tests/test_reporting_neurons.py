"""The terminal summary of `resstream neurons`: tokens shown as every other output shows them."""

from __future__ import annotations

from resstream.analysis.memories.neurons import Context, NeuronReport, NeuronsResult
from resstream.reporting.neurons import summary_lines


def result() -> NeuronsResult:
    neuron = NeuronReport(
        neuron=7,
        max_activation=2.5,
        promoted=((1, 0.9), (2, 0.5)),
        suppressed=((3, -0.4),),
        contexts=(Context(2.5, 0, 3, (4, 1)),),
    )
    return NeuronsResult(
        model="toy",
        layer=1,
        num_layers=2,
        d_ff=16,
        gated=False,
        selection="chosen: 7",
        value_rule="W_U·(g⊙w_k)",
        dataset="corpus",
        sample="1 sequence",
        dataset_fingerprint=None,
        num_seqs=1,
        num_positions=8,
        neurons=(neuron,),
        texts=((1, " say"), (2, "\n"), (3, "it's"), (4, "I")),
    )


def test_summary_shows_tokens_with_visible_whitespace_not_repr():
    lines = summary_lines(result())
    assert lines[0] == "toy: layer 1 of 2, 1 of 16 neurons (chosen: 7); 8 positions"
    assert lines[1] == "  L1.N7: max m 2.5; promotes ␣say ↵; suppresses it's"
    assert lines[2] == "    top context (2.5): I⟦ say⟧"
