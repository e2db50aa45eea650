"""Corpus analyses under torchrun (issue 28, item 2): 2 gloo processes give the same results
as one process, rank 0 alone writes, and a failure on one rank stops every rank with the same
one line and exit code (`resstream.distributed`).

The primitives are tested in-process (one process: the plain loop; the batch order; the
fail-together decision); the commands end to end with `torch.distributed.run` on a tiny GPT-2.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from resstream.distributed import (
    Distributed,
    Failure,
    exchange,
    first_failure,
    in_batch_order,
    is_agreed,
    my_batches,
    one_outcome,
    portable,
    run_sharded,
)
from resstream.errors import ResstreamError, RunError, UsageError
from tests.cli_support import assert_nothing_written
from tests.conftest import shared_data_path
from tests.test_cli_shift import TEXT, write_rows
from tests.test_models_loading import SENTENCES, _tiny_gpt2

# --------------------------------------------------------------------------- primitives


def test_batches_go_to_ranks_round_robin():
    batches = list("abcdefg")
    shares = [list(my_batches(batches, Distributed(rank, 3))) for rank in range(3)]
    assert shares == [[(0, "a"), (3, "d"), (6, "g")], [(1, "b"), (4, "e")], [(2, "c"), (5, "f")]]
    assert list(my_batches(batches, Distributed())) == list(enumerate(batches))


def test_parts_are_put_back_in_batch_order():
    per_rank = [[(0, "a"), (3, "d"), (6, "g")], [(1, "b"), (4, "e")], [(2, "c"), (5, "f")]]
    assert in_batch_order(per_rank) == list("abcdefg")


def test_parts_that_miss_a_batch_are_refused():
    with pytest.raises(RuntimeError, match="cover"):
        in_batch_order([[(0, "a")], [(2, "c")]])


def test_one_process_runs_the_plain_loop_adding_as_it_measures():
    events: list[str] = []

    def measure(batch: int) -> int:
        events.append(f"measure {batch}")
        return batch * 10

    run_sharded([1, 2, 3], measure, lambda part: events.append(f"add {part}"), Distributed())
    assert events == ["measure 1", "add 10", "measure 2", "add 20", "measure 3", "add 30"]


def test_one_process_raises_its_own_error_unchanged():
    def measure(batch: int) -> int:
        raise UsageError(f"bad batch {batch}")

    with pytest.raises(UsageError, match="bad batch 1") as caught:
        run_sharded([1], measure, lambda part: None, Distributed())
    assert not is_agreed(caught.value)


def test_the_lowest_failing_rank_decides():
    outcomes = [["parts"], Failure(2, RunError("two")), Failure(1, UsageError("one")), None]
    failure = first_failure(outcomes)
    assert failure is not None and failure.rank == 1 and str(failure.error) == "one"
    assert first_failure([["parts"], None]) is None


def test_exchange_of_one_process_raises_a_failure_as_agreed():
    with pytest.raises(UsageError, match="one") as caught:
        exchange(Failure(0, UsageError("one")), Distributed())
    assert is_agreed(caught.value)
    assert exchange(["parts"], Distributed()) == [["parts"]]


def test_one_outcome_of_one_process_is_the_block_as_it_is():
    with pytest.raises(UsageError, match="plain"), one_outcome(Distributed()):
        raise UsageError("plain")


class _Unpicklable(Exception):
    def __init__(self, message: str, extra: int) -> None:
        super().__init__(message)
        self.extra = extra

    def __reduce__(self):
        raise TypeError("no pickling")


def test_errors_travel_as_themselves_or_as_their_one_line():
    error = UsageError("`seq_len` 9 is too long")
    assert portable(error) is error
    assert type(pickle.loads(pickle.dumps(portable(error)))) is UsageError
    line = portable(_Unpicklable("odd", 1))
    assert type(line) is RuntimeError and str(line) == "_Unpicklable: odd"


class _UnpicklableUsage(UsageError):
    def __reduce__(self):
        raise TypeError("no pickling")


def test_a_resstream_error_that_cannot_travel_keeps_its_line_and_exit_code():
    line = portable(_UnpicklableUsage("`top` 0 must be >= 1"))
    assert isinstance(line, ResstreamError) and str(line) == "`top` 0 must be >= 1"
    assert line.exit_code == 2
    assert pickle.loads(pickle.dumps(line)).exit_code == 2


# --------------------------------------------------------------------------- two ranks in one process


def _as_ranks(monkeypatch, model, analysis, world: int = 2) -> list[object]:
    """`analysis(model)` run by `world` threads that stand for the ranks of a torchrun job, each
    with its own copy of `model`: each thread is its own rank (`joined`), and `gathered` hands
    every rank the others' values through a barrier, pickled as the process group would. Each
    rank's result or error."""
    import copy
    import threading

    import resstream.api.attribute as api_attribute
    import resstream.api.inputs as api_inputs
    from resstream import distributed

    barrier = threading.Barrier(world, timeout=120)
    slots: list[object] = [None] * world
    local = threading.local()

    def joined(device=None):
        return Distributed(local.rank, world)

    def gathered(value, info):
        slots[info.rank] = pickle.dumps(value)
        barrier.wait()
        values = [pickle.loads(slot) for slot in slots]
        barrier.wait()
        return values

    monkeypatch.setattr(api_inputs, "joined", joined)
    monkeypatch.setattr(api_attribute, "joined", joined)
    monkeypatch.setattr(distributed, "joined", joined)
    monkeypatch.setattr(distributed, "gathered", gathered)
    outcomes: list[object] = [None] * world

    copies = [copy.deepcopy(model) for _ in range(world)]

    def run(rank: int) -> None:
        local.rank = rank
        try:
            outcomes[rank] = analysis(copies[rank])
        except Exception as error:
            outcomes[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return outcomes


@pytest.fixture(scope="module")
def tiny_model():
    """A tiny GPT-2 in memory with its BPE tokenizer."""
    from resstream.data import train_bpe

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    return _tiny_gpt2(len(tokenizer)), tokenizer


def _same_as_one_process(monkeypatch, model, analysis):
    """The result of two ranks, each of them, is the one of one process, to the bit."""
    one = analysis(model)
    two = _as_ranks(monkeypatch, model, analysis)
    for result in two:
        assert not isinstance(result, BaseException), result
        assert json.dumps(result.to_dict()) == json.dumps(one.to_dict())


@pytest.mark.usefixtures("one_torch_thread")
def test_shift_of_two_ranks_is_one_process(monkeypatch, corpus, tiny_model):
    import resstream

    model, tokenizer = tiny_model
    kwargs = dict(dataset=str(corpus), num_seqs=7, seq_len=10, batch_size=2, tokenizer=tokenizer)
    _same_as_one_process(
        monkeypatch, model, lambda m: resstream.shift(m, decoder=["logit-lens", "embedding"], **kwargs)
    )


@pytest.mark.usefixtures("one_torch_thread")
def test_recency_of_two_ranks_is_one_process(monkeypatch, corpus, tiny_model):
    import resstream

    model, tokenizer = tiny_model
    kwargs = dict(dataset=str(corpus), num_seqs=5, seq_len=6, batch_size=2, tokenizer=tokenizer)
    _same_as_one_process(monkeypatch, model, lambda m: resstream.recency(m, **kwargs))


@pytest.mark.usefixtures("one_torch_thread")
def test_neurons_of_two_ranks_is_one_process(monkeypatch, corpus, tiny_model):
    import resstream

    model, tokenizer = tiny_model
    kwargs = dict(dataset=str(corpus), num_seqs=7, seq_len=10, batch_size=2, tokenizer=tokenizer)
    _same_as_one_process(
        monkeypatch, model, lambda m: resstream.neurons(m, layer=1, top=3, contexts=4, **kwargs)
    )


@pytest.mark.usefixtures("one_torch_thread")
def test_corpus_attribution_of_two_ranks_is_one_process(monkeypatch, corpus, tiny_model):
    from resstream.api.attribute import attribute_corpus

    model, tokenizer = tiny_model
    kwargs = dict(dataset=str(corpus), num_seqs=5, seq_len=8, batch_size=2, tokenizer=tokenizer)
    _same_as_one_process(monkeypatch, model, lambda m: attribute_corpus(m, candidates=4, top=3, **kwargs))


class _Scores:
    """Sliding-window and LAMBADA sums of a model, as `eval` scores a benchmark."""

    def __init__(self, model: torch.nn.Module) -> None:
        from resstream.distributed import joined
        from resstream.training.scoring import LambadaExample, score_lambada, score_tokens

        logits = lambda ids: model(ids).logits  # noqa: E731 - a one-line forward
        stream = torch.arange(5, 90) % 37
        tokens = score_tokens(logits, stream, block_size=12, stride=5, batch_size=2, ranks=joined())
        passages = [LambadaExample(tuple(range(3, 3 + n)), 1 + n % 3) for n in range(5, 12)]
        lambada = score_lambada(logits, passages, batch_size=3, ranks=joined())
        self.sums = {"tokens": vars(tokens), "lambada": vars(lambada)}

    def to_dict(self) -> dict:
        return self.sums


@pytest.mark.usefixtures("one_torch_thread")
def test_eval_sums_of_two_ranks_are_one_process(monkeypatch, tiny_model):
    model, _ = tiny_model
    _same_as_one_process(monkeypatch, model, _Scores)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_failure_on_one_rank_is_every_ranks(monkeypatch, corpus, tiny_model):
    """Rank 1 alone fails while measuring its batch; both ranks raise its error."""
    import resstream
    import resstream.api.shift as api_shift

    model, tokenizer = tiny_model
    real = api_shift.residual_states

    def states(view, batch):
        if batch.shape[0] == 1:  # the last batch (7 windows, batches of 2): rank 1's
            raise UsageError("rank 1 met a bad batch")
        return real(view, batch)

    monkeypatch.setattr(api_shift, "residual_states", states)
    kwargs = dict(dataset=str(corpus), num_seqs=7, seq_len=10, batch_size=2, tokenizer=tokenizer)
    outcomes = _as_ranks(monkeypatch, model, lambda m: resstream.shift(m, **kwargs))
    for outcome in outcomes:
        assert isinstance(outcome, UsageError) and str(outcome) == "rank 1 met a bad batch", outcome


# --------------------------------------------------------------------------- end to end

#: No test here may reach the network; one thread per process.
pytestmark = pytest.mark.usefixtures("hf_offline")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def _saved_gpt2(path: Path, edit=None) -> Path:
    """A tiny 2-layer GPT-2 (context 32) with its BPE tokenizer, saved to `path`; `edit(model)`
    may change its weights first."""
    from resstream.data import train_bpe

    tokenizer = train_bpe(SENTENCES, vocab_size=300)
    model = _tiny_gpt2(len(tokenizer))
    if edit is not None:
        edit(model)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return _saved_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2")


def _launch(processes: int | None) -> tuple[dict[str, str], list[str]]:
    """The environment of a launch (one BLAS thread, offline, no inherited rank) and the
    interpreter arguments before the program: none for one process, torchrun's for `processes`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    if processes is None:
        return env, []
    return env, ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]


def _resstream(args: list[str], processes: int | None) -> subprocess.CompletedProcess[str]:
    """`python -m resstream ARGS` run directly (`processes` None) or under torchrun."""
    env, launcher = _launch(processes)
    cmd = [sys.executable, *launcher, "-m", "resstream", *args, "--device", "cpu", "--quiet"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


LAUNCHER = Path(__file__).with_name("commands_launcher.py")


def _launch_all(commands: list[list[str]], listed: Path, processes: int | None) -> None:
    """Every command of `commands` run in order by one process (`processes` None) or by each
    rank of one torchrun job (`tests/commands_launcher.py`; the list is written to `listed`):
    one launch for all, since a launch's start-up is most of what one command costs here."""
    env, launcher = _launch(processes)
    listed.write_text(json.dumps(commands), encoding="utf-8")
    cmd = [sys.executable, *launcher, str(LAUNCHER), str(listed)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def _commands(corpus: Path, model: Path, data: Path | None) -> dict[str, tuple[list[str], str]]:
    """The corpus analyses checked end to end: name -> (arguments, the result file). `eval`
    only with the real corpora (`data`)."""
    sample = ["--model", str(model), "--dataset", str(corpus), "--batch-size", "2"]
    neurons = ["--layer", "1", "--top", "3", "--contexts", "4"]
    commands = {
        # 5 batches of 2 windows: rank 0 measures batches 0, 2, 4 and rank 1 batches 1, 3
        "shift": (["shift", *sample, "--num-seqs", "9", "--seq-len", "12"], "shift.json"),
        "recency": (["recency", *sample, "--num-seqs", "7", "--seq-len", "8"], "recency.json"),
        "neurons": (["neurons", *neurons, *sample, "--num-seqs", "7", "--seq-len", "10"], "neurons.json"),
        "attribute": (
            ["attribute", "--candidates", "4", "--top", "3", *sample, "--num-seqs", "5", "--seq-len", "8"],
            "attribute.json",
        ),
    }
    if data is not None:
        benchmarks = ["--model", str(model), "--benchmarks", "shakespeare,lambada", "--data-dir", str(data)]
        windows = ["--block-size", "16", "--stride", "8", "--batch-size", "3", "--max-tokens", "300"]
        commands["eval"] = (["eval", *benchmarks, *windows], "eval.json")
    return commands


@pytest.fixture(scope="module")
def parallel_runs(tmp_path_factory, corpus, gpt2_dir) -> dict[str, tuple[Path, Path, str]]:
    """Every command of `_commands` run by 2 gloo processes (one torchrun job) and by one
    process: name -> (its 2-process folder, its 1-process folder, its result file)."""
    data = shared_data_path() if shared_data_path().is_dir() else None
    commands = _commands(corpus, gpt2_dir, data)
    root = tmp_path_factory.mktemp("parallel")
    for processes in (2, 1):
        argv = [
            [*args, "--out", str(root / f"{name}-{processes}"), "--device", "cpu", "--quiet"]
            for name, (args, _) in commands.items()
        ]
        _launch_all(argv, root / f"commands-{processes}.json", processes if processes > 1 else None)
    return {name: (root / f"{name}-2", root / f"{name}-1", result) for name, (_, result) in commands.items()}


def _same_runs(two: Path, one: Path, result: str) -> None:
    """The same result JSON, byte for byte, from 2 processes and from one, and the same run.json
    apart from the number of processes."""
    assert (two / result).read_bytes() == (one / result).read_bytes()
    record_two, record_one = (json.loads((where / "run.json").read_text()) for where in (two, one))
    assert (record_two.pop("processes"), record_one.pop("processes")) == (2, 1)
    assert record_two == record_one
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())


# One torchrun job and one process run them all: about 40 s on 2 cores, where a launch per
# command and process count (3 Python processes importing torch each) took about 30 s a command.


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shift", "recency", "neurons", "attribute"])
def test_a_corpus_analysis_of_two_processes_is_one_process_byte_for_byte(parallel_runs, name):
    _same_runs(*parallel_runs[name])


@pytest.mark.slow
def test_eval_of_two_processes_is_one_process_byte_for_byte(parallel_runs, shared_data):
    _same_runs(*parallel_runs["eval"])


def _overflowing_position(model: torch.nn.Module, position: int = 10) -> None:
    """Position `position` of the GPT-2's position embedding made huge (finite, as loading
    requires): the layer norms of a state there overflow, so only sequences that long meet
    non-finite decoder inputs."""
    with torch.no_grad():
        model.transformer.wpe.weight[position] = 1e38


def _ranks(args: list[str], world: int = 2) -> list[subprocess.CompletedProcess[str]]:
    """`python -m resstream ARGS` as the `world` ranks of one job, launched as torchrun launches
    them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), each rank's exit code and output kept."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [sys.executable, "-m", "resstream", *args, "--device", "cpu", "--quiet"]
    ranks = [
        subprocess.Popen(
            cmd,
            env={
                **env,
                "MASTER_PORT": str(port),
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(world),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    done = []
    for rank in ranks:
        out, err = rank.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(cmd, rank.returncode, out, err))
    return done


def _infinite_position(model: torch.nn.Module, position: int = 10) -> None:
    """Position `position` of the GPT-2's position embedding made infinite: only sequences
    that long reach it (the token embedding, which the analyses check, stays finite)."""
    with torch.no_grad():
        model.transformer.wpe.weight[position] = float("inf")


@pytest.mark.slow
def test_a_failure_on_one_rank_stops_every_rank_with_its_line(tmp_path):
    """Rows of 4 tokens form batch 0 (rank 0), rows of 12 tokens batch 1 (rank 1): only rank
    1's sequences reach the overflowing position embedding, so only rank 1 meets non-finite
    decoder inputs. Every rank stops at once with the line one process prints and its exit
    code 1; nothing is written."""
    model = _saved_gpt2(tmp_path / "huge-position", _overflowing_position)
    rows = write_rows(tmp_path / "rows.jsonl", [[5, 6, 7, 8], [9, 10, 11, 12], list(range(20, 32))])
    out = tmp_path / "out"
    command = ["shift", "--model", str(model), "--dataset", str(rows), "--batch-size", "2"]
    alone = _resstream([*command, "--out", str(tmp_path / "alone")], None)
    assert alone.returncode == 1 and "non-finite" in alone.stderr, alone.stderr[-3000:]
    line = alone.stderr.strip().splitlines()[-1]
    for rank in _ranks([*command, "--out", str(out)]):
        assert rank.returncode == 1, rank.stderr[-3000:]
        assert rank.stderr.strip().splitlines() == [line]
        assert rank.stdout == ""
    assert_nothing_written(out)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_failure_before_the_analysis_on_rank_0_stops_the_rank_in_it(monkeypatch, corpus, tiny_model):
    """Rank 0 fails before the analysis (as when it refuses --out); rank 1, already in the
    analysis's exchange, gets rank 0's error there, and both raise it (`one_outcome`)."""
    import resstream
    from resstream import distributed

    model, tokenizer = tiny_model
    kwargs = dict(dataset=str(corpus), num_seqs=5, seq_len=10, batch_size=2, tokenizer=tokenizer)

    def analysis(m):
        info = distributed.joined()
        with one_outcome(info):
            if info.rank == 0:
                raise UsageError("`out` holds another command's run")
            return resstream.shift(m, **kwargs)

    for outcome in _as_ranks(monkeypatch, model, analysis):
        assert isinstance(outcome, UsageError) and "another command" in str(outcome), outcome


@pytest.mark.usefixtures("one_torch_thread")
def test_a_failure_after_the_analysis_on_rank_0_is_every_ranks(monkeypatch, corpus, tiny_model):
    """Rank 0 fails while writing, after the analysis; the other rank, done, learns it in the
    last exchange and raises it too."""
    import resstream
    from resstream import distributed

    model, tokenizer = tiny_model
    kwargs = dict(dataset=str(corpus), num_seqs=5, seq_len=10, batch_size=2, tokenizer=tokenizer)

    def analysis(m):
        info = distributed.joined()
        with one_outcome(info):
            report = resstream.shift(m, **kwargs)
            if info.rank == 0:
                raise RunError("no space left to write shift.json")
            return report

    for outcome in _as_ranks(monkeypatch, model, analysis):
        assert isinstance(outcome, RunError) and "no space" in str(outcome), outcome


def test_a_device_map_under_torchrun_is_refused(monkeypatch):
    from resstream.api.inputs import LoadOptions

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="under torchrun every process loads its own copy"):
        LoadOptions.of({"device_map": "auto"})
    assert LoadOptions.of({"device": "cpu"}).device == "cpu"
