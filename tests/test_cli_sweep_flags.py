"""The flag parsing of `resstream sweep` and `resstream compare`: integer lists, the fields a
sweep sets itself, and --max-eval-tokens."""

from __future__ import annotations

import pytest

from resstream.cli.common import check_max_eval_tokens
from resstream.cli.sweep import check_sweep_flags, parse_int_list
from resstream.errors import UsageError


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,x", "--seeds: 'x' is not an integer"),
        ("1.5", "--seeds: '1.5' is not an integer"),
        ("", "--seeds: '' is empty"),
    ],
)
def test_parse_int_list_rejects(text, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_int_list(text, "--seeds")


def test_parse_int_list():
    assert parse_int_list(" 2, 0,2 ", "--layers") == (2, 0)


def test_sweep_owned_flags_refused():
    check_sweep_flags({"n_layer": "2"})
    with pytest.raises(UsageError, match="--gate is set by the sweep"):
        check_sweep_flags({"gate": "fixed"})
    with pytest.raises(UsageError, match="--cut-layer is set by the sweep for each run; use --layers"):
        check_sweep_flags({"cut_layer": "1"})
    with pytest.raises(UsageError, match="use --seeds"):
        check_sweep_flags({"seed": "1"})


def test_max_eval_tokens():
    assert check_max_eval_tokens(None) is None and check_max_eval_tokens("2") == 2
    with pytest.raises(
        UsageError, match=r"^`max_tokens` must be >= 2 \(one token of context, one scored\), got 1"
    ):
        check_max_eval_tokens("1")
    with pytest.raises(UsageError, match="--max-eval-tokens: 'many' is not an integer"):
        check_max_eval_tokens("many")
