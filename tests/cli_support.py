"""What the end-to-end CLI tests share: the bad-input contract, the Ctrl-C contract, output checks.

The contract (docs/design.md "Output conventions"): bad input exits with code 2 and one line on
stderr that starts with "resstream: error:" and names the value, no traceback, nothing written
to --out; Ctrl-C exits with 130 and one "interrupted" line, leaving only complete files.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from resstream.cli.main import main


def saved_tiny_model(path: Path, case: str = "gpt2") -> Path:
    """A tiny random model of `case` (`tests.test_models_adapters.tiny_model`) saved at `path`
    with the one-character tokenizer: a local Hugging Face directory, as a user's."""
    from tests.test_models_adapters import char_tokenizer, tiny_model

    tiny_model(case).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNG_END = b"IEND\xaeB`\x82"


def assert_nothing_written(out: Path) -> None:
    assert not out.exists() or (out.is_dir() and not any(out.iterdir())), sorted(out.iterdir())


def assert_complete_files(out: Path) -> None:
    """Every file under `out` is complete and parseable; no temporary file is left."""
    for path in out.iterdir():
        assert not path.name.startswith(".") and not path.name.endswith(".tmp"), path.name
        data = path.read_bytes()
        if path.suffix == ".json":
            json.loads(data)
        elif path.suffix == ".csv":
            rows = list(csv.DictReader(data.decode("utf-8").splitlines()))
            assert rows and all(None not in row.values() for row in rows), path.name
        elif path.suffix == ".png":
            assert data.startswith(PNG_MAGIC) and data.endswith(PNG_END), path.name


def expect_usage_error(
    args: list[str], out: Path, capsys, *patterns: str | tuple[str, ...], one_line: bool = True
) -> str:
    """Run `resstream ARGS --out OUT` and check the bad-input contract; return the error line.

    Each pattern must occur in the message (a tuple: any one of its spellings).
    `one_line=False` checks only the last line of stderr (the error message itself).
    """
    capsys.readouterr()  # drop what the test's own setup printed (e.g. save_pretrained's bars)
    code = main([*args, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    if not one_line:
        err = err.splitlines()[-1]
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    assert "Traceback" not in err, err
    for pattern in patterns:
        options = pattern if isinstance(pattern, tuple) else (pattern,)
        assert any(option in err for option in options), (pattern, err)
    assert_nothing_written(out)
    return err


def interrupt(*_args, **_kwargs):
    """A stand-in for any step of a run: the user pressed Ctrl-C."""
    raise KeyboardInterrupt


def check_interrupted(code: int, capsys) -> None:
    """Exit code 130 and one 'interrupted' line on stderr, no traceback."""
    err = capsys.readouterr().err.strip()
    assert code == 130, err
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error: interrupted"), err


def strict_json(path: Path):
    """The file parsed as strict JSON (NaN / Infinity are not JSON)."""

    def refuse(constant):
        raise ValueError(f"{path.name} holds {constant}, which is not JSON")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def verdict_layers(text: str) -> list[int]:
    """Layer numbers of the printed per-layer lines of `simulate` and `recency` (the trend line,
    each followed by its strict verdicts), in order."""
    layers = re.findall(r"^\s+layer (\d+): .*ρ .*\n\s+strict, every step: recency", text, flags=re.MULTILINE)
    return [int(n) for n in layers]


def overflowing(real):
    """A stand-in for `residual_states` whose layer 2 overflowed to inf (as a float16 model's can)."""

    def states(*args, **kwargs):
        result = real(*args, **kwargs).clone()
        result[2, ..., 0] = float("inf")
        return result

    return states


def check_non_finite(code: int, capsys, out: Path) -> None:
    """Exit code 1, one line naming the layer and suggesting float32, nothing written."""
    err = capsys.readouterr().err.strip()
    assert code == 1, err
    assert len(err.splitlines()) == 1 and "non-finite" in err and "layer 2" in err and "--dtype" in err, err
    assert_nothing_written(out)
