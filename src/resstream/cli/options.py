"""The option groups commands share, each declared once, and the `command` decorator.

A command declares a group as one keyword-only parameter whose annotation carries the group,
e.g. ``sample: Annotated[Sample, corpus_options(seq_len=128)]``. `command` expands it into the
group's options in the command's signature (that is what Typer reads, so `--help` lists them
where the group stands) and hands the command one frozen object built from their values:

- `model_options` -> `Loading`: --model, --dtype, --device, --device-map, --trust-remote-code;
- `corpus_options` -> `Sample`: --dataset, --num-seqs, --seq-len, --batch-size, --seed, --data-dir;
- `text_options` -> `OneText`: --text, --text-file and the prediction's --position, --target,
  --target-id, --foil (those the command names);
- `output_options` -> `Output`: --out, --quiet.

Each object's `check()` refuses, before the command runs (so before it imports torch), the values
that need no model and no data to judge (`resstream.checks`); an option of the command's own
does the same with `Checked` metadata (``Annotated[int, typer.Option(...), Checked(check_positive)]``).

Each object turns itself into the API's keyword arguments (`api_kwargs`; `api_kwargs(*groups)`
merges several) and into its part of run.json (`record`); `write_run_record` writes run.json for
every command from those parts.

`with_json_option` gives a command that writes a result JSON the --json option (stdout: the
JSON alone, messages on stderr); `cli/main.py` applies it to the commands it names.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import typing
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Generic, Protocol, TypeVar

import typer

from resstream.checks import (
    check_batch_size,
    check_dtype_name,
    check_fraction,
    check_load_names,
    check_one_text,
    check_positive,
    check_sample_request,
)
from resstream.errors import UsageError, refuse_set

if TYPE_CHECKING:
    from resstream.rundir import OutputSet

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., None])
_KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY

# Options declared once, used alone or in the groups below.
OutOption = Annotated[Path, typer.Option("--out", help="Output directory (created if missing).")]
DeviceMapOption = Annotated[
    str | None,
    typer.Option(
        help="Spread a Hugging Face model over devices: auto, balanced, sequential (needs accelerate)."
    ),
]
TrustRemoteCodeOption = Annotated[
    bool,
    typer.Option("--trust-remote-code", help="Run a hub model's own code (only for repositories you trust)."),
]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress bars.")]
DtypeOption = Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")]
DataDirOption = Annotated[Path | None, typer.Option(help="Local corpora (else env RESSTREAM_DATA).")]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="YAML config file.")]


MODEL_HELP = "Run dir, HF directory or hub name (default: built-in reference model)."
MODELS_HELP = "Run dir, HF directory or hub name; repeat for several (default: built-in reference model)."


@dataclass(frozen=True)
class OptionGroup(Generic[T]):
    """Options that travel together: their parameters (name -> (annotation, default)), in the
    order `--help` lists them, and `build`, which makes the command's object of their values."""

    build: Callable[..., T]
    params: Mapping[str, tuple[Any, Any]]

    def checked(self, values: dict[str, Any]) -> T:
        """The group's object, of its options' values (taken out of `values`), checked by its
        `check()` where it has one: the refusals that need no model and no data, made before the
        command imports torch, so that a bad value is refused at once."""
        made = self.build(**{option: values.pop(option) for option in self.params})
        check = getattr(made, "check", None)
        if check is not None:
            check()
        return made

    def parameters(self) -> list[inspect.Parameter]:
        """The group's options as keyword-only parameters of a signature."""
        return [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
            for name, (annotation, default) in self.params.items()
        ]


def command(func: F) -> F:
    """`func` with every group parameter expanded into the group's options (see the module
    docstring); Typer sees the expanded signature, `func` gets one object per group."""
    hints = typing.get_type_hints(func, include_extras=True)
    groups: dict[str, OptionGroup[Any]] = {}
    early: dict[str, Checked] = {}
    params: list[inspect.Parameter] = []
    for param in inspect.signature(func).parameters.values():
        group = _carried(hints[param.name], OptionGroup)
        if group is None:
            params.append(param.replace(annotation=hints[param.name], kind=inspect.Parameter.KEYWORD_ONLY))
            checked = _carried(hints[param.name], Checked)
            if checked is not None:
                early[param.name] = checked
            continue
        groups[param.name] = group
        params.extend(group.parameters())

    @functools.wraps(func)
    def expanded(**values: Any) -> None:
        for name, group in groups.items():
            values[name] = group.checked(values)
        for name, checked in early.items():
            checked(name, values[name])
        func(**values)

    return typing.cast(F, _with_signature(expanded, params))


def _with_signature(wrapper: Callable[..., None], params: list[inspect.Parameter]) -> Callable[..., None]:
    """`wrapper` (made by `functools.wraps`) showing Typer `params`, not the wrapped function's."""
    del wrapper.__wrapped__  # type: ignore[attr-defined]  # Typer must read these parameters
    wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def _carried(annotation: Any, kind: type[T]) -> T | None:
    """The `kind` (an `OptionGroup`, a `Checked`) an `Annotated[...]` annotation carries, if any."""
    extras = getattr(annotation, "__metadata__", ())
    return next((extra for extra in extras if isinstance(extra, kind)), None)


@dataclass(frozen=True)
class Checked:
    """`Annotated` metadata of a command's own option: `check(name, value)`, a function of
    `resstream.checks` (the library calls it too), refuses a bad value before the command
    imports torch, as the groups' checks do; a value left to its default None is not checked."""

    check: Callable[[str, Any], None]

    def __call__(self, option: str, value: Any) -> None:
        if value is not None:
            self.check(option, value)


#: An integer option that must be >= 1, or a number strictly between 0 and 1, refused before
#: torch is imported: ``top: Annotated[options.Count, typer.Option(help=...)] = 10``.
Count = Annotated[int, Checked(check_positive)]
Fraction = Annotated[float, Checked(check_fraction)]


JSON_HELP = "Print the result JSON to standard output (messages go to standard error)."
JsonOption = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
#: Options with which a command writes no result JSON (parameter → flag): --json is refused then.
NO_RESULT_OPTIONS = {"export": "--export"}


#: What --out's help adds in a command that takes --json.
OUT_WITH_JSON_HELP = (
    "Required, except with --json: then the run writes into a temporary folder, removed once "
    "the result JSON is printed."
)
#: How the messages of a run with --json and no --out name its temporary folder.
TEMPORARY_OUT = "a temporary folder (removed once the result JSON is printed)"


def with_json_option(callback: F) -> F:
    """`callback`, a command that writes its outputs to --out, with --json (listed after --quiet,
    else after --out). With it, whatever the command prints goes to standard error and, once the
    run has finished, its result JSON (`rundir.result_file`) goes to standard output exactly as
    written, for piping: ``resstream shift ... --json | jq .``. A failed run prints no JSON.
    --out becomes optional with --json: without it the run writes into a temporary folder,
    removed once the JSON is printed; without --json it is required as before."""
    hints = typing.get_type_hints(callback, include_extras=True)
    params = [
        _optional_out(param) if param.name == "out" else param
        for param in (
            param.replace(annotation=hints[param.name], kind=_KEYWORD_ONLY)
            for param in inspect.signature(callback).parameters.values()
        )
    ]
    names = [param.name for param in params]
    where = names.index("quiet" if "quiet" in names else "out") + 1
    params.insert(where, inspect.Parameter("json", _KEYWORD_ONLY, annotation=JsonOption, default=False))

    @functools.wraps(callback)
    def printing_result(**values: Any) -> None:
        if not values.pop("json"):
            if values["out"] is None:  # as Typer says it of a required option
                raise UsageError("Missing option '--out'.")
            callback(**values)
            return
        _refuse_runs_without_result(values)
        with _json_out(values["out"]) as (out, messages):
            with contextlib.redirect_stdout(messages):
                callback(**{**values, "out": out})
            print_result(out)

    return typing.cast(F, _with_signature(printing_result, params))


def _optional_out(param: inspect.Parameter) -> inspect.Parameter:
    """--out of a command with --json: optional, its help saying so."""
    info = _carried(param.annotation, typer.models.OptionInfo)
    option = typer.Option("--out", help=f"{info.help if info else ''} {OUT_WITH_JSON_HELP}".strip())
    return param.replace(annotation=Annotated[Path | None, option], default=None)


@contextlib.contextmanager
def _json_out(out: Path | None) -> Iterator[tuple[Path, typing.TextIO]]:
    """(the folder a run with --json writes into, where its messages go): `out` and standard
    error; without `out`, a temporary folder, removed after the block, and standard error with
    that folder's path written as `TEMPORARY_OUT`."""
    if out is not None:
        yield out, sys.stderr
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="resstream-json-") as folder:
        yield Path(folder), typing.cast(typing.TextIO, _Renaming(sys.stderr, folder, TEMPORARY_OUT))


class _Renaming:
    """A text stream that writes to `stream` with every `old` written as `new`."""

    def __init__(self, stream: typing.TextIO, old: str, new: str) -> None:
        self.stream, self.old, self.new = stream, old, new

    def write(self, text: str) -> int:
        return self.stream.write(text.replace(self.old, self.new))

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, ...
        return getattr(self.stream, name)


def _refuse_runs_without_result(values: dict[str, Any]) -> None:
    """Refuse --json beside an option that makes the command write no result JSON (before
    anything is written)."""
    for param, flag in NO_RESULT_OPTIONS.items():
        if values.get(param) is not None:
            raise UsageError(f"--json prints a run's result JSON, and {flag} writes none; leave one out")


def print_result(out: Path) -> None:
    """Print the result JSON of the run in `out` to standard output, as written."""
    from resstream.distributed import launched_rank
    from resstream.rundir import result_file

    if launched_rank() != 0:  # under torchrun, rank 0 wrote it and prints it
        return
    sys.stdout.write(result_file(out).read_text(encoding="utf-8"))
    sys.stdout.flush()


@dataclass(frozen=True)
class Loading:
    """How the command loads its model(s): the model-loading options' values."""

    models: tuple[str | None, ...]
    dtype: str
    device: str
    device_map: str | None = None
    trust_remote_code: bool = False
    takes_device_map: bool = field(default=True, repr=False)
    #: What refuses a --dtype: by default one no model loads in (`checks.DTYPE_NAMES`).
    dtype_check: Callable[[str], object] = field(default=check_dtype_name, repr=False)

    def check(self) -> None:
        """Refuse a --dtype (`dtype_check`), --device or --device-map that names nothing the
        command loads a model with (`checks.check_load_names`)."""
        self.dtype_check(self.dtype)
        check_load_names(None, self.device, self.device_map)

    @property
    def model(self) -> str | None:
        """The one model of a command that takes one (None: the built-in reference model)."""
        return self.models[0]

    @property
    def device_used(self) -> str:
        """The device the run actually used, for run.json ('auto' resolved; a device map named)."""
        from resstream.devices import device_label

        return f"device_map={self.device_map}" if self.device_map else device_label(self.device)

    def api_kwargs(self) -> dict[str, Any]:
        """The API's loading arguments."""
        kwargs: dict[str, Any] = {
            "dtype": self.dtype,
            "device": self.device,
            "trust_remote_code": self.trust_remote_code,
        }
        if self.takes_device_map:
            kwargs["device_map"] = self.device_map
        return kwargs

    def record(self) -> dict[str, Any]:
        """Its part of run.json's config."""
        return (
            {"dtype": self.dtype, "device_map": self.device_map}
            if self.takes_device_map
            else {"dtype": self.dtype}
        )


def model_options(
    *,
    several: bool = False,
    device_map: bool = True,
    dtype_check: Callable[[str], object] = check_dtype_name,
) -> OptionGroup[Loading]:
    """--model (repeatable when `several`), --dtype, --device, --device-map (unless not
    `device_map`) and --trust-remote-code; `dtype_check` for a command whose --dtype takes
    fewer names than a model loads with (a function of `resstream.checks` that refuses the others)."""
    model: tuple[Any, Any] = (
        (Annotated[list[str] | None, typer.Option("--model", help=MODELS_HELP)], None)
        if several
        else (Annotated[str | None, typer.Option(help=MODEL_HELP)], None)
    )
    params: dict[str, tuple[Any, Any]] = {
        "model": model,
        "dtype": (DtypeOption, "auto"),
        "device": (DeviceOption, "auto"),
    }
    if device_map:
        params["device_map"] = (DeviceMapOption, None)
    params["trust_remote_code"] = (TrustRemoteCodeOption, False)

    def build(model: list[str] | str | None, **values: Any) -> Loading:
        return Loading(model_specs(model), takes_device_map=device_map, dtype_check=dtype_check, **values)

    return OptionGroup(build, params)


def model_specs(model: list[str] | str | None) -> tuple[str | None, ...]:
    """The models --model gave (repeated: a list), or (None,) for the reference model when it
    gave none."""
    if isinstance(model, list):
        return tuple(model) or (None,)
    return (None,) if model is None else (model,)


@dataclass(frozen=True)
class Sample:
    """Which sequences of which corpus the command reads, and in what batches."""

    dataset: str | None = None
    num_seqs: int | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    data_dir: Path | None = None

    def check(self) -> None:
        """Refuse a --num-seqs, --seq-len or --batch-size no corpus can give (`resstream.checks`)."""
        check_sample_request(self.num_seqs, self.seq_len)
        if self.batch_size is not None:
            check_batch_size(self.batch_size)

    def corpus_mode(self, **also: object) -> bool:
        """Whether --dataset asks for a one-text command's corpus mode; without it, no other
        corpus option (--num-seqs, --seq-len, then `also`, then --batch-size) may be given."""
        if self.dataset is not None:
            return True
        given = {"num_seqs": self.num_seqs, "seq_len": self.seq_len, **also, "batch_size": self.batch_size}
        refuse_set(given, "applies to corpus mode (`dataset`), not to one text")
        return False

    def api_kwargs(self) -> dict[str, Any]:
        """The API's sampling arguments: its fields, by name."""
        return {item.name: getattr(self, item.name) for item in fields(self)}

    def record(self, *, seq_len: int | None) -> dict[str, Any]:
        """Its part of run.json's config, with the `seq_len` the run settled on (the seed is
        run.json's own field)."""
        recorded = {name: value for name, value in self.api_kwargs().items() if name != "seed"}
        return {**recorded, "seq_len": seq_len, "data_dir": str(self.data_dir) if self.data_dir else None}


def corpus_options(
    *,
    seq_len: int | None = 128,
    dataset: str | None = "shakespeare",
    num_seqs: int | None = 64,
    batch_size: int | None = 8,
    seed: int | None = 0,
    help: Mapping[str, str] | None = None,
    without: Collection[str] = (),
) -> OptionGroup[Sample]:
    """--dataset, --num-seqs, --seq-len, --batch-size, --seed, --data-dir with the command's
    defaults, less those named in `without`; `help` replaces the help of the options it names
    (a command whose corpus is optional says so). --seq-len defaults to None: the API settles
    it (the command's `seq_len`, clipped to the shortest model context), as its help says."""
    texts = {
        "dataset": "Named corpus, .txt/.jsonl path (.jsonl input_ids rows used as given).",
        "num_seqs": "Sequences sampled from the corpus.",
        "seq_len": f"Tokens per sequence \\[default: {seq_len}, or the shortest model context if shorter].",
        "batch_size": "Sequences per forward pass.",
        "seed": "Seed of the sequence sample.",
        **(help or {}),
    }
    kinds: dict[str, tuple[Any, Any]] = {
        "dataset": (str if dataset is not None else str | None, dataset),
        "num_seqs": (int if num_seqs is not None else int | None, num_seqs),
        "seq_len": (int | None, None),
        "batch_size": (int if batch_size is not None else int | None, batch_size),
        "seed": (int if seed is not None else int | None, seed),
    }
    params: dict[str, tuple[Any, Any]] = {
        name: (Annotated[kind, typer.Option(help=texts[name])], default)
        for name, (kind, default) in kinds.items()
        if name not in without
    }
    params["data_dir"] = (DataDirOption, None)
    return OptionGroup(Sample, params)


#: The prediction's options of `text_options`, in the order the API's keyword groups add them
#: (`resstream.api.prediction`: PositionArgs, TargetArgs, PredictionArgs).
PREDICTION_OPTIONS = ("position", "target", "target_id", "foil")


@dataclass(frozen=True)
class OneText:
    """The text a command reads (--text or --text-file) and the prediction in it, as far as
    the command's options name it (`prediction`: those of `PREDICTION_OPTIONS` it declares,
    parameter -> value)."""

    text: str | None = None
    text_file: Path | None = None
    prediction: Mapping[str, Any] = field(default_factory=dict)
    required: bool = field(default=True, repr=False)  # False: the command has a corpus mode

    def check(self) -> None:
        """Refuse no text, two, or an empty --text, where the command always reads a text
        (`require`; a command with a corpus mode calls it, or `check_corpus_mode`, itself)."""
        if self.required:
            self.require()

    @property
    def given(self) -> bool:
        """Whether a text was given (--text or --text-file)."""
        return self.text is not None or self.text_file is not None

    def require(self) -> None:
        """Refuse no text, two, or an empty --text (`checks.check_one_text`)."""
        check_one_text(self.text, self.text_file)

    def check_corpus_mode(self, in_corpus: bool) -> None:
        """A text, unless `in_corpus` (--dataset): then neither a text nor an option of the
        prediction in one."""
        if not in_corpus:
            self.require()
            return
        if self.given:
            raise UsageError("give a text (`text`/`text_file`) or a `dataset`, not both")
        refuse_set(self.prediction, "applies to one text, not to corpus mode (`dataset`)")

    def api_kwargs(self) -> dict[str, Any]:
        """The API's one-text keywords, the text aside (the API takes it first)."""
        return {"text_file": self.text_file, **self.prediction}

    def record(self) -> dict[str, Any]:
        """Its part of run.json's config (the text itself is not recorded, its file's path is)."""
        return {"text_file": str(self.text_file) if self.text_file else None, **self.prediction}


def text_options(
    text_help: str,
    *,
    keywords: Collection[str] = (),
    required: bool = True,
    help: Mapping[str, str] | None = None,
) -> OptionGroup[OneText]:
    """--text (`text_help`), --text-file and the prediction's options among `keywords` (of
    `PREDICTION_OPTIONS`, listed in that order); `help` replaces the help of those it names.
    `required=False` for a command that reads a corpus instead when given --dataset."""
    texts = {
        "text": text_help,
        "text_file": "A UTF-8 file holding the text.",
        "position": "Token position of the prediction (default: the last; negative: from the end).",
        "target": "Target token as text, one token (default: the model's top prediction).",
        "target_id": "Target token id (instead of --target).",
        "foil": "A second token: the target − foil logit difference too.",
        **(help or {}),
    }
    kinds = {"text": str, "text_file": Path, "position": int, "target": str, "target_id": int, "foil": str}
    chosen = tuple(name for name in PREDICTION_OPTIONS if name in keywords)
    params: dict[str, tuple[Any, Any]] = {
        name: (Annotated[kinds[name] | None, typer.Option(help=texts[name])], None)
        for name in ("text", "text_file", *chosen)
    }

    def build(text: str | None, text_file: Path | None, **prediction: Any) -> OneText:
        return OneText(text, text_file, prediction, required=required)

    return OptionGroup(build, params)


def corpus_mode_options(dataset_help: str, *, batch_size: int) -> OptionGroup[Sample]:
    """The corpus options of a one-text command's corpus mode (--dataset instead of a text:
    every next token of a sample of 16 windows of 64 tokens, `api.prediction.prediction_corpus`),
    each saying that it applies there and its default there (--batch-size: `batch_size`)."""
    return corpus_options(
        dataset=None,
        num_seqs=None,
        seq_len=None,
        batch_size=None,
        help={
            "dataset": f"Corpus mode: a named corpus or .txt/.jsonl path; {dataset_help}",
            "num_seqs": "Corpus mode: sequences sampled \\[default: 16].",
            "seq_len": "Corpus mode: tokens per sequence \\[default: 64].",
            "batch_size": f"Corpus mode: sequences per forward pass \\[default: {batch_size}].",
        },
    )


@dataclass(frozen=True)
class Output:
    """Where the command writes, and whether it shows progress."""

    out: Path
    quiet: bool

    @property
    def progress(self) -> bool:
        """Progress bars on (not --quiet)."""
        return not self.quiet

    def api_kwargs(self) -> dict[str, Any]:
        """The API's progress keyword."""
        return {"progress": self.progress}


def api_kwargs(*groups: Loading | Sample | OneText | Output) -> dict[str, Any]:
    """The API's keyword arguments of the command's `groups`, together."""
    return {name: value for group in groups for name, value in group.api_kwargs().items()}


def output_options(*, quiet_help: str = "No progress bars.") -> OptionGroup[Output]:
    """--out and --quiet (`quiet_help`: what a command without bars stops showing)."""
    quiet = Annotated[bool, typer.Option("--quiet", help=quiet_help)]
    return OptionGroup(Output, {"out": (OutOption, inspect.Parameter.empty), "quiet": (quiet, False)})


def write_run_record(
    outputs: OutputSet,
    command_name: str,
    settings: Mapping[str, Any],
    used: Loading | str,
    seed: int | None = None,
    dataset_fingerprint: str | None = None,
    **fields: Any,
) -> None:
    """Stage run.json of every command: its name and `settings` as the config, the seed, the
    device `used` (the model-loading options, whose own part joins the config, or the device's
    name), versions, git, the data's fingerprint, and any further top-level `fields`."""
    from resstream.io import run_record

    loading = used if isinstance(used, Loading) else None
    config = {"command": command_name, **settings, **(loading.record() if loading else {})}
    device = loading.device_used if loading else str(used)
    record = run_record(config, seed=seed, device=device, dataset_fingerprint=dataset_fingerprint)
    outputs.write_record({**record, **fields})


class CorpusSampleResult(Protocol):
    """What a corpus mode's result says of the sample it drew (`write_corpus_mode_record`)."""

    @property
    def num_seqs(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def dataset_fingerprint(self) -> str | None: ...


def write_corpus_mode_record(
    outputs: OutputSet,
    command_name: str,
    settings: Mapping[str, Any],
    loading: Loading,
    sample: Sample,
    corpus: CorpusSampleResult | None,
) -> None:
    """run.json of a command with a corpus mode (`corpus_mode_options`): `settings`, then the
    `dataset`, and the `num_seqs` and `seq_len` its `corpus` result drew (None for one text);
    in corpus mode, the sample's seed and the data's fingerprint too (`write_run_record`)."""
    drawn = {
        "dataset": sample.dataset,
        "num_seqs": corpus.num_seqs if corpus else None,
        "seq_len": corpus.seq_len if corpus else None,
    }
    seed, fingerprint = (sample.seed, corpus.dataset_fingerprint) if corpus else (None, None)
    write_run_record(outputs, command_name, {**settings, **drawn}, loading, seed, fingerprint)


@contextlib.contextmanager
def analysis_outputs(out: Path, command_name: str, device: str) -> Iterator[OutputSet | None]:
    """The outputs of a corpus analysis that may run under torchrun, data-parallel
    (`resstream.distributed`): the process group joined first (for the --device given), then
    rank 0 alone locks `out` and stages the outputs (`rundir.output_set`); the other ranks get
    None, share the analysis and write nothing. The block ends the same way on every rank
    (`distributed.one_outcome`): a failure on any rank, before, during or after the analysis,
    is every rank's one line and exit code, and nothing is written. Run directly: `output_set`.
    run.json records `processes`, the one thing N ranks change (1 run directly)."""
    from resstream.distributed import joined, one_outcome
    from resstream.rundir import output_set

    info = joined(device)
    with one_outcome(info):
        if not info.is_main:
            yield None
            return
        with output_set(out, command_name, recorded={"processes": info.world}) as outputs:
            yield outputs


#: The groups as most commands declare them: ``output: options.OutputArg``.
OutputArg = Annotated[Output, output_options()]
ModelArg = Annotated[Loading, model_options()]
ModelsArg = Annotated[Loading, model_options(several=True)]
