"""The one copy of each small shared helper: flags, path detection, devices, reasons."""

from __future__ import annotations

import pytest
import torch

from resstream.api.decoders import decoder_spec
from resstream.api.prediction import TextRequest
from resstream.checks import (
    check_batch_size,
    check_integer,
    check_max_tokens,
    check_one_text,
    check_positive,
    decoder_kind,
)
from resstream.cli.flags import cli_message, flag
from resstream.devices import device_label, resolve_device
from resstream.errors import UsageError, short_reason
from resstream.hub import looks_like_path
from resstream.simulation import SimulationConfig
from resstream.training.evaluate import EvalSettings


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("`num_seqs` 0 must be >= 1", "--num-seqs 0 must be >= 1"),
        ("`models` 'x' is empty", "--model 'x' is empty"),
        (
            "`out_dir` 'runs/a' already holds a run; pass `resume=True`",
            "--out 'runs/a' already holds a run; pass --resume",
        ),
        ("`learned=False` with no `layers`", "--no-learned with no --layers"),
        ("`simulations` 0 is not allowed", "--simulations 0 is not allowed"),
        # only backticked identifiers are parameters: prose and commands stay as they are
        (
            "the model's vocabulary of 10; run `resstream sweep` first",
            "the model's vocabulary of 10; run `resstream sweep` first",
        ),
        ("no parameter here", "no parameter here"),
    ],
)
def test_cli_message_names_flags(message: str, shown: str) -> None:
    assert cli_message(message) == shown


def test_flag_default_rule() -> None:
    assert flag("top_k") == "--top-k" and flag("seed") == "--seed" and flag("out_dir") == "--out"


def test_a_flag_may_differ_per_command() -> None:
    message = "no passage fits in `max_tokens` 3"
    assert cli_message(message) == cli_message(message, "eval") == "no passage fits in --max-tokens 3"
    assert cli_message(message, "sweep") == "no passage fits in --max-eval-tokens 3"
    assert cli_message(message, "compare") == "no passage fits in --max-eval-tokens 3"


@pytest.mark.parametrize(
    ("spec", "hub_names", "is_path"),
    [
        ("gpt2", True, False),
        ("EleutherAI/pythia-160m", True, False),
        ("Qwen/Qwen2.5-0.5B", True, False),
        ("./gpt2", True, True),
        ("/abs/model", True, True),
        ("~/model", True, True),
        ("a/b/c", True, True),
        ("model/", True, True),
        ("tokenizer.json", True, True),
        ("corpus.txt", False, True),
        ("data/corpus", False, True),
        ("wikitext-2", False, False),
        ("win\\path", True, True),
    ],
)
def test_looks_like_path(spec: str, hub_names: bool, is_path: bool) -> None:
    assert looks_like_path(spec, hub_names=hub_names) is is_path


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert device_label("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert device_label(" cpu ") == "cpu"
    assert resolve_device(" auto ").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(UsageError, match=r"unknown `device` 'tpu'; allowed: auto, cpu, cuda, cuda:N, mps"):
        resolve_device("tpu")
    with pytest.raises(UsageError, match=r"unknown `device` 'cuda:x'"):
        resolve_device("cuda:x")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resolve_device_cuda_uses_the_local_rank() -> None:
    assert resolve_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(UsageError, match="does not exist"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_short_reason_is_one_bounded_line() -> None:
    assert short_reason(ValueError("a\n  b")) == "a b"
    assert short_reason(ValueError("")) == "ValueError"
    assert cli_message(short_reason(OSError("see `config_file` above"))) == "see 'config_file' above"
    long = short_reason(ValueError("x" * 500))
    assert len(long) == 200 and long.endswith("...")


def test_each_caller_of_path_detection_refuses_a_missing_path_without_trying_the_hub(hf_offline) -> None:
    """One detector serves model specs, tokenizer specs and dataset values; where a spec can
    only be a path, the refusal names the missing path instead of a failed hub look-up."""
    from resstream.data import load_corpus, load_tokenizer
    from resstream.models import check_model

    with pytest.raises(UsageError, match=r"model path 'missing\.json' does not exist"):
        check_model("missing.json")
    with pytest.raises(UsageError, match=r"tokenizer 'org/name/sub' not found: no such directory or file"):
        load_tokenizer("org/name/sub")
    with pytest.raises(UsageError, match=r"file 'a\\\\b' does not exist"):
        load_corpus("a\\b")


def test_json_outputs_are_strict_json_even_with_non_finite_values(tmp_path):
    """Python's json writes NaN and Infinity, which are not JSON: every output turns them to null."""
    import numpy as np
    import torch

    from resstream.io import write_json
    from tests.cli_support import strict_json

    value = {
        "loss": float("nan"),
        "rates": np.array([1.0, np.inf]),
        "t": torch.tensor([-np.inf, 2.0]),
        "x": 1,
    }
    write_json(tmp_path / "a.json", value)
    assert strict_json(tmp_path / "a.json") == {"loss": None, "rates": [1.0, None], "t": [None, 2.0], "x": 1}


def test_prediction_batches_refuse_a_sequence_without_a_next_token_and_group_by_length() -> None:
    from resstream.api.inputs import check_next_tokens, prediction_batches

    rows = [torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7, 8])]
    assert [tuple(b.shape) for b in prediction_batches(rows, 4)] == [(2, 3), (1, 2)]
    with pytest.raises(UsageError, match=r"^every sequence needs at least 2 tokens"):
        check_next_tokens([[1, 2], [3]])


def test_the_corpus_modes_draw_one_default_sample() -> None:
    """attribute_corpus, routes_corpus and faithfulness(dataset=...) read `prediction_corpus`:
    16 windows of 64 tokens unless told, the seq_len left to be clipped to the models."""
    from resstream.api import faithfulness
    from resstream.api.prediction import prediction_corpus

    request = prediction_corpus("shakespeare", None, None, 3, None)
    assert (request.num_seqs, request.seq_len, request.default_seq_len, request.seed) == (16, None, 64, 3)
    assert prediction_corpus("shakespeare", 5, 32, 0, None).num_seqs == 5
    assert (faithfulness.DEFAULT_NUM_SEQS, faithfulness.DEFAULT_SEQ_LEN) == (16, 64)


def _refusal(call) -> str:
    with pytest.raises(UsageError) as raised:
        call()
    return str(raised.value)


@pytest.mark.parametrize(
    ("library", "early"),
    [
        (lambda: SimulationConfig(layers=0), lambda: check_positive("layers", 0)),
        (lambda: SimulationConfig(tokens=1), lambda: check_integer("tokens", 1, 2)),
        (lambda: EvalSettings(batch_size=0), lambda: check_batch_size(0)),
        (lambda: EvalSettings(max_tokens=1), lambda: check_max_tokens(1)),
        (lambda: decoder_spec("bogus"), lambda: decoder_kind("bogus")),
        (lambda: decoder_spec("tuned:"), lambda: decoder_kind("tuned:")),
        (lambda: TextRequest.of(None, {}), lambda: check_one_text(None, None)),
        (lambda: TextRequest.of(" ", {}), lambda: check_one_text(" ", None)),
        (lambda: TextRequest.of("a", {"text_file": "a.txt"}), lambda: check_one_text("a", "a.txt")),
    ],
)
def test_the_library_refuses_as_the_command_line_does_before_torch(library, early) -> None:
    """The command line refuses these values before it imports torch (`resstream.checks`), the
    library when it is called: one message (issue 38, item 8)."""
    assert _refusal(library) == _refusal(early)


def test_the_corpus_modes_help_states_the_apis_default_sample() -> None:
    from resstream.api.prediction import DEFAULT_NUM_SEQS, DEFAULT_SEQ_LEN
    from resstream.cli.options import corpus_mode_options

    helps = {
        name: annotation.__metadata__[0].help
        for name, (annotation, _) in corpus_mode_options("every next token.", batch_size=8).params.items()
        if name != "data_dir"
    }
    assert f"[default: {DEFAULT_NUM_SEQS}]" in helps["num_seqs"].replace("\\", "")
    assert f"[default: {DEFAULT_SEQ_LEN}]" in helps["seq_len"].replace("\\", "")
