"""One way to write a command: the option groups of `cli/options.py` and the API's loading
keywords (`api/inputs.takes_load_args`), checked on their own and on the commands that use them."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

import resstream
from resstream.cli import options
from resstream.cli.main import main
from resstream.errors import UsageError

LOAD_KEYWORDS = {"dtype": "auto", "device": "auto", "device_map": None, "trust_remote_code": False}


def _app_receiving(received: dict[str, object]) -> typer.Typer:
    """A one-command app whose command records the objects its groups built."""

    @options.command
    def probe(
        *,
        output: options.OutputArg,
        loading: options.ModelsArg,
        k: Annotated[int, typer.Option(help="Own option.")] = 3,
        sample: Annotated[options.Sample, options.corpus_options(seq_len=32, without=("num_seqs",))],
    ) -> None:
        received.update(output=output, loading=loading, k=k, sample=sample)

    app = typer.Typer()
    app.command("probe")(probe)
    app.command("other")(lambda: None)  # two commands: `probe` is named on the command line
    return app


def test_a_group_reaches_the_command_as_one_object(tmp_path: Path) -> None:
    received: dict[str, object] = {}
    args = ["probe", "--out", str(tmp_path), "--model", "a", "--model", "b", "--seq-len", "16", "--quiet"]
    result = CliRunner().invoke(_app_receiving(received), args)
    assert result.exit_code == 0, result.output
    assert received["output"] == options.Output(tmp_path, quiet=True)
    loading = received["loading"]
    assert isinstance(loading, options.Loading)
    assert loading.models == ("a", "b") and loading.api_kwargs() == {**LOAD_KEYWORDS}
    sample = received["sample"]
    assert isinstance(sample, options.Sample)
    assert (sample.dataset, sample.seq_len, sample.batch_size, sample.num_seqs) == (
        "shakespeare",
        16,
        8,
        None,
    )
    assert received["k"] == 3


def test_a_group_is_listed_where_it_stands_and_without_what_it_leaves_out(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app_receiving({}), ["probe", "--help"], env={"COLUMNS": "200"})
    flags = [
        flag
        for flag in ("--out", "--quiet", "--model", "--k", "--dataset", "--seq-len")
        if flag in result.output
    ]
    assert flags == ["--out", "--quiet", "--model", "--k", "--dataset", "--seq-len"]
    assert [result.output.index(flag) for flag in flags] == sorted(
        result.output.index(flag) for flag in flags
    )
    assert "--num-seqs" not in result.output and "[default: 32, or the shortest" in result.output


def test_no_model_means_the_reference_model_and_a_command_without_device_map_sends_none() -> None:
    single = options.model_options(device_map=False).build(
        model=None, dtype="auto", device="cpu", trust_remote_code=False
    )
    assert single.models == (None,) and single.model is None
    assert "device_map" not in single.api_kwargs() and single.record() == {"dtype": "auto"}
    assert single.device_used == "cpu"


@pytest.mark.parametrize(
    "command", ["shift", "recency", "neurons", "lens", "composition", "attribute", "tune-lens"]
)
def test_every_analysis_command_shares_the_model_options_word_for_word(
    command: str, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "auto, float32, bfloat16, float16." in out
    assert "Run a hub model's own code (only for repositories you trust)." in out


def test_the_api_shows_its_loading_keywords_with_their_defaults() -> None:
    for function in (resstream.shift, resstream.lens, resstream.attribute, resstream.attribute_corpus):
        parameters = inspect.signature(function).parameters
        assert {name: parameters[name].default for name in LOAD_KEYWORDS} == LOAD_KEYWORDS
        assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in LOAD_KEYWORDS)


#: Each one-text function and the keyword group it takes (`resstream.api.prediction`).
ONE_TEXT_GROUPS = {
    "lens": "TextArgs",
    "routes": "PositionArgs",
    "decompose": "PositionArgs",
    "faithfulness": "TargetArgs",
    "attribute": "PredictionArgs",
    "ablate": "PredictionArgs",
    "patch": "PredictionArgs",
}


@pytest.mark.parametrize(("name", "group"), ONE_TEXT_GROUPS.items())
def test_a_one_text_function_shows_its_group_of_text_keywords_and_no_other(name: str, group: str) -> None:
    from resstream.api import prediction

    parameters = inspect.signature(getattr(resstream, name)).parameters
    own = [key for key in getattr(prediction, group).__annotations__ if key not in LOAD_KEYWORDS]
    assert {key: parameters[key].default for key in own} == dict.fromkeys(own)
    assert all(parameters[key].kind is inspect.Parameter.KEYWORD_ONLY for key in own)
    assert set(prediction.TEXT_KEYWORDS).difference(own).isdisjoint(parameters)
    assert {name: parameters[name].default for name in LOAD_KEYWORDS} == LOAD_KEYWORDS


def test_a_text_keyword_a_function_does_not_take_is_pythons_type_error() -> None:
    with pytest.raises(TypeError, match=r"^routes\(\) got an unexpected keyword argument 'target'"):
        resstream.routes("some text", target=" the")


#: The corpus modes' sample keywords (`resstream.api.prediction.CorpusModeArgs`) as their
#: signatures show them: the defaults they had as keywords spelled out one by one.
CORPUS_MODE_KEYWORDS = {
    "dataset": "shakespeare",
    "num_seqs": None,
    "seq_len": None,
    "seed": 0,
    "batch_size": None,
    "data_dir": None,
}


@pytest.mark.parametrize("name", ["attribute_corpus", "routes_corpus"])
def test_a_corpus_mode_shows_its_sample_keywords_with_their_defaults(name: str) -> None:
    parameters = inspect.signature(getattr(resstream, name)).parameters
    assert {key: parameters[key].default for key in CORPUS_MODE_KEYWORDS} == CORPUS_MODE_KEYWORDS
    assert all(parameters[key].kind is inspect.Parameter.KEYWORD_ONLY for key in CORPUS_MODE_KEYWORDS)
    assert {key: parameters[key].default for key in LOAD_KEYWORDS} == LOAD_KEYWORDS
    with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'num_seq'"):
        getattr(resstream, name)(num_seq=2)


def test_a_keyword_group_declares_its_defaults_once_for_signature_and_call() -> None:
    """What the signature shows is what the function reads (`with_defaults`); a default for a
    keyword the group lacks is refused where it is declared."""
    from resstream.api.inputs import keyword_defaults, with_defaults
    from resstream.api.prediction import CorpusModeArgs, corpus_mode_request

    filled = with_defaults(CorpusModeArgs, {"seed": 3})
    assert {key: filled[key] for key in CORPUS_MODE_KEYWORDS} == {**CORPUS_MODE_KEYWORDS, "seed": 3}
    assert filled["dtype"] == "auto"
    request = corpus_mode_request({"num_seqs": 2})
    assert (request.dataset, request.num_seqs, request.seq_len, request.seed) == ("shakespeare", 2, None, 0)
    with pytest.raises(TypeError, match="CorpusModeArgs has no keyword 'num_seq'"):
        keyword_defaults(CorpusModeArgs, num_seq=2)


#: A package shaped as ours: a keyword group in one module adding to another group, and a
#: function in another module that takes it as ``**given``.
GROUPED_PACKAGE = {
    "__init__.py": "",
    "loading.py": "from typing import TypedDict\nclass LoadArgs(TypedDict, total=False):\n    dtype: str\n",
    "groups.py": (
        "from pkg.loading import LoadArgs\n"
        "class TextArgs(LoadArgs, total=False):\n    text_file: str | None\n"
        "class PositionArgs(TextArgs, total=False):\n    position: int | None\n"
    ),
    "api.py": (
        "from typing import Unpack\nfrom pkg.groups import PositionArgs\n"
        "def routes(text=None, *, top_k=1, **given: Unpack[PositionArgs]) -> None:\n    'Doc.'\n"
    ),
}


def test_the_api_reference_lists_the_keywords_of_a_keyword_group() -> None:
    """mkdocs.yml's griffe extensions expand ``**given: Unpack[PositionArgs]`` into its keywords,
    inherited ones too, as `help()` lists them (the real site: tests/test_docs_site.py)."""
    griffe = pytest.importorskip("griffe")
    import yaml

    config = yaml.load((Path(__file__).parents[1] / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    (plugin,) = (p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    extensions = griffe.load_extensions(*plugin["handlers"]["python"]["options"]["extensions"])
    with griffe.temporary_visited_package(
        "pkg", GROUPED_PACKAGE, extensions=extensions, resolve_aliases=True
    ) as package:
        shown = [p.name for p in package["api.routes"].parameters]
    assert shown == ["text", "top_k", "dtype", "text_file", "position"]


def test_an_unknown_keyword_is_pythons_type_error_naming_the_function() -> None:
    with pytest.raises(TypeError, match=r"^lens\(\) got an unexpected keyword argument 'dtyp'"):
        resstream.lens("some text", dtyp="float32")


def test_one_function_one_result_type() -> None:
    one_text = set(inspect.signature(resstream.attribute).parameters)
    corpus = set(inspect.signature(resstream.attribute_corpus).parameters)
    assert {"dataset", "num_seqs", "seq_len", "candidates", "batch_size"}.isdisjoint(one_text)
    assert {"text", "text_file", "position", "target", "foil", "sources"}.isdisjoint(corpus)
    assert inspect.signature(resstream.attribute).return_annotation == "AttributeResult"
    assert inspect.signature(resstream.attribute_corpus).return_annotation == "CorpusAttribution"


def test_a_function_on_one_device_has_no_device_map_and_ablate_refuses_one() -> None:
    assert "device_map" not in inspect.signature(resstream.verify).parameters
    with pytest.raises(TypeError, match=r"^verify\(\) got an unexpected keyword argument 'device_map'"):
        resstream.verify(device_map="auto")
    assert "device_map" in inspect.signature(resstream.tune_lens).parameters  # tests/test_device_map.py
    with pytest.raises(UsageError, match=r"^`device_map` is not supported by ablate yet"):
        resstream.ablate("a text", components=["L0.H0"], device_map="auto", progress=False)


def test_an_empty_model_is_refused_not_taken_for_the_reference_model(tmp_path: Path, capsys) -> None:
    """`--model ""` names no model: the loader refuses it (it is not the built-in default)."""
    assert main(["lens", "--model", "", "--text", "a b c", "--out", str(tmp_path / "o")]) == 2
    assert "model '' is empty" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
