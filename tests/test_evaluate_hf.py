"""Evaluation of Hugging Face models (`resstream.evaluate_model`, `resstream eval --model DIR`).

Each score is checked against a hand computation: an independent loop that builds the token
stream from the tokenizer, walks the sliding windows one at a time (or the LAMBADA passages one
at a time, unpadded) and calls the Hugging Face model's own forward.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import resstream
from resstream.cli.main import main
from resstream.errors import UsageError
from resstream.models.evaluation import directory_fingerprint, eval_model, hub_revision
from tests.test_evaluate import TEXT, make_run, write_data_dir

#: No test here may reach the network; one torch thread.
pytestmark = pytest.mark.usefixtures("hf_offline", "one_torch_thread")

WORDS = sorted(set(TEXT.split()))


# --------------------------------------------------------------------------- tiny models
def bpe_tokenizer():
    """A byte-level BPE with an eos token (GPT-2 style)."""
    from resstream.data import train_bpe

    return train_bpe([TEXT], vocab_size=300)


def word_tokenizer(*, eos: bool = True):
    """A word-level tokenizer (Llama-like special tokens <s>, </s>; or none at all)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"] if eos else ["<unk>"]
    vocab = {token: i for i, token in enumerate([*specials, *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    extra = {"bos_token": "<s>", "eos_token": "</s>"} if eos else {}
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", **extra)


def fit(model: torch.nn.Module, tokenizer, context: int, *, steps: int = 30) -> torch.nn.Module:
    """A few Adam steps on the test text, so that the model predicts some tokens right and the
    accuracies compared below are not all zero."""
    ids = torch.tensor(tokenizer.encode(TEXT, add_special_tokens=False))
    windows = ids[: len(ids) // context * context].view(-1, context)[:8]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=windows, labels=windows).loss.backward()
        optimizer.step()
    return model.eval()


def save_gpt2(path: Path, tokenizer, *, context: int = 40) -> Path:
    """A 2-layer GPT-2 (learned positions), briefly fitted, saved with its tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=len(tokenizer),
        n_positions=context,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    fit(GPT2LMHeadModel(config), tokenizer, context).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_llama(path: Path, tokenizer, *, context: int = 32) -> Path:
    """A 2-layer Llama (rotary positions, grouped-query attention), briefly fitted."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    fit(LlamaForCausalLM(config), tokenizer, context).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return save_gpt2(tmp_path_factory.mktemp("hf") / "tiny-gpt2", bpe_tokenizer())


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return save_llama(tmp_path_factory.mktemp("hf") / "tiny-llama", word_tokenizer())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_data_dir(tmp_path_factory.mktemp("evaldata") / "data")


# --------------------------------------------------------------------------- hand computations
def hf_model(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def documents(name: str, data_dir: Path) -> list[str]:
    from resstream.data import default_split, load_corpus

    corpus = load_corpus(name, split=default_split(name), data_dir=data_dir)
    return [d if isinstance(d, str) else "".join(d) for d in corpus.documents]


def stream(tokenizer, docs: list[str]) -> list[int]:
    """Every document's ids, then the tokenizer's eos (nothing when it has none)."""
    end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    ids: list[int] = []
    for doc in docs:
        ids += tokenizer.encode(doc, add_special_tokens=False) + end
    return ids


def next_token_scores(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities, argmax) of the next token at each position of one unpadded sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, -1), logits.argmax(-1)


def hand_sliding(model, ids: list[int], block: int, stride: int) -> tuple[float, float, int]:
    """(mean nll, accuracy %, count): windows of `block` inputs at 0, stride, ..., the last one
    pulled back to end at the final token; each scores the positions not scored before."""
    n = len(ids)
    length = min(block, n - 1)
    nll, hits, count, reached, start = 0.0, 0, 0, 0, 0
    while True:
        first = min(start, n - 1 - length)
        logp, top = next_token_scores(model, ids[first : first + length])
        for j in range(length):
            position = first + j + 1
            if position > reached:
                nll -= float(logp[j, ids[position]])
                hits += int(top[j]) == ids[position]
                count += 1
        reached = first + length
        if first == n - 1 - length:
            return nll / count, 100.0 * hits / count, count
        start += stride


def hand_lambada(model, tokenizer, passages: list[str], block: int) -> tuple[float, float, float, int]:
    """(target nll per token, token accuracy %, word accuracy %, target tokens): each passage
    alone: [eos] + context + ' ' + last word, cut from the left to block + 1 tokens."""
    start = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    nll, hits, words, count = 0.0, 0, 0, 0
    for passage in passages:
        context, word = passage.rstrip().rsplit(" ", 1)
        target = tokenizer.encode(" " + word, add_special_tokens=False)
        ids = (start + tokenizer.encode(context, add_special_tokens=False) + target)[-(block + 1) :]
        k = min(len(target), len(ids) - 1)
        logp, top = next_token_scores(model, ids[:-1])
        right = 0
        for position in range(len(ids) - k, len(ids)):
            nll -= float(logp[position - 1, ids[position]])
            right += int(top[position - 1]) == ids[position]
        hits, count, words = hits + right, count + k, words + (right == k)
    return nll / count, 100.0 * hits / count, 100.0 * words / len(passages), count


def check_text(result, expected) -> None:
    loss, accuracy, count = expected
    assert result.num_tokens == count
    assert result.loss == pytest.approx(loss, rel=1e-5)
    assert result.accuracy == pytest.approx(accuracy)
    assert result.perplexity == pytest.approx(math.exp(loss), rel=1e-5)


def check_lambada(result, expected) -> None:
    loss, accuracy, words, count = expected
    assert (result.num_tokens, result.num_examples) == (count, 10)
    assert result.loss == pytest.approx(loss, rel=1e-5)
    assert result.accuracy == pytest.approx(accuracy)
    assert result.last_word_accuracy == pytest.approx(words)


# --------------------------------------------------------------------------- the API
@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_scores_equal_a_hand_computation(which, gpt2_dir, llama_dir, data_dir):
    path = gpt2_dir if which == "gpt2" else llama_dir
    context = 40 if which == "gpt2" else 32
    report = resstream.evaluate_model(
        str(path), "openwebtext,lambada", data_dir=data_dir, stride=7, batch_size=3, progress=False
    )
    model, tokenizer = hf_model(path)
    ids = stream(tokenizer, documents("openwebtext", data_dir))
    assert len(ids) > 3 * context  # several windows, the last one pulled back
    text, lam = report.results
    check_text(text, hand_sliding(model, ids, context, 7))
    check_lambada(lam, hand_lambada(model, tokenizer, documents("lambada", data_dir), context))
    assert 0 < text.accuracy < 100 and 0 < lam.accuracy < 100  # argmax compared, not only the loss
    assert (report.block_size, report.context, report.stride, report.model_source) == (
        context,
        context,
        7,
        "local",
    )
    assert report.model == str(path) and report.model_fingerprint == directory_fingerprint(path)
    assert report.end_of_text == tokenizer.eos_token


def test_block_size_shortens_the_windows_and_the_default_stride(gpt2_dir, data_dir):
    report = resstream.evaluate_model(
        gpt2_dir, "openwebtext", data_dir=data_dir, block_size=12, max_tokens=90, progress=False
    )
    model, tokenizer = hf_model(gpt2_dir)
    ids = stream(tokenizer, documents("openwebtext", data_dir))[:90]
    (text,) = report.results
    check_text(text, hand_sliding(model, ids, 12, 6))
    assert (report.block_size, report.stride, report.context) == (12, 6, 40)


def test_a_tokenizer_without_eos_joins_documents_with_nothing(tmp_path, data_dir):
    """No eos: documents follow each other directly, LAMBADA contexts start bare; eval.json says so."""
    tokenizer = word_tokenizer(eos=False)
    assert tokenizer.eos_token_id is None
    path = save_gpt2(tmp_path / "no-eos", tokenizer, context=24)
    report = resstream.evaluate_model(path, "wikitext-2,lambada", data_dir=data_dir, progress=False)
    model, tokenizer = hf_model(path)
    docs = documents("wikitext-2", data_dir)
    ids = [i for doc in docs for i in tokenizer.encode(doc, add_special_tokens=False)]
    assert len(docs) > 1 and ids == stream(tokenizer, docs)
    text, lam = report.results
    check_text(text, hand_sliding(model, ids, 24, 12))
    check_lambada(lam, hand_lambada(model, tokenizer, documents("lambada", data_dir), 24))
    written = report.to_dict()
    assert written["end_of_text"] is None and "no end-of-text token" in written["documents"]


def test_a_resstream_run_takes_the_same_path(tmp_path, data_dir):
    from resstream.training.evaluate import evaluate_run

    run = make_run(tmp_path / "run")
    ours = resstream.evaluate_model(run, "openwebtext,lambada", data_dir=data_dir, progress=False)
    theirs = evaluate_run(run, "openwebtext,lambada", data_dir=data_dir, progress=False)
    assert ours.results == theirs.results and ours.model_fingerprint == theirs.model_fingerprint
    assert (ours.model_source, ours.context, ours.block_size) == ("resstream", 16, 16)
    assert (
        resstream.evaluate_model(run, "openwebtext", data_dir=data_dir, block_size=8, progress=False).stride
        == 4
    )


def test_evaluate_model_is_part_of_the_api():
    assert "evaluate_model" in resstream.__all__ and "evaluate_model" in dir(resstream)
    from resstream.models.evaluation import evaluate_model

    assert resstream.evaluate_model is evaluate_model


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_size": 41}, "`block_size` 41 is above the model's context (40 tokens); allowed: 2 .. 40"),
        ({"block_size": 1}, "`block_size` must be >= 2"),
        ({"block_size": 10, "stride": 11}, "`stride` 11 is outside [1, 10]"),
    ],
)
def test_bad_block_size(gpt2_dir, data_dir, kwargs, message):
    with pytest.raises(UsageError) as caught:
        resstream.evaluate_model(gpt2_dir, "openwebtext", data_dir=data_dir, progress=False, **kwargs)
    assert message in str(caught.value)


def test_a_config_without_a_context_needs_block_size():
    config = SimpleNamespace(to_dict=dict)
    loaded = SimpleNamespace(run=None, name="odd", model=SimpleNamespace(config=config), source="local")
    with pytest.raises(UsageError, match=r"model 'odd' states no context length .*; give `block_size`$"):
        eval_model(loaded)
    loaded = SimpleNamespace(**vars(loaded), tokenizer=None, where=None)
    made = eval_model(loaded, block_size=8)
    assert (made.block_size, made.context, made.training) == (8, 8, None)


# --------------------------------------------------------------------------- fingerprints
def test_directory_fingerprint_reads_the_weights_not_their_size_or_time(gpt2_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    copy = Path(shutil.copytree(gpt2_dir, tmp_path / "copy"))
    assert directory_fingerprint(copy) == directory_fingerprint(gpt2_dir)
    (copy / "README.md").write_text("notes")  # not part of the model
    assert directory_fingerprint(copy) == directory_fingerprint(gpt2_dir)
    weights = copy / "model.safetensors"
    stat = weights.stat()
    tensors = load_file(weights)
    tensors["lm_head.weight" if "lm_head.weight" in tensors else "transformer.wte.weight"][0, 0] += 1.0
    save_file(tensors, weights, metadata={"format": "pt"})
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same time
    assert weights.stat().st_size == stat.st_size
    assert directory_fingerprint(copy) != directory_fingerprint(gpt2_dir)


def test_a_cached_snapshot_is_fingerprinted_by_its_blob_names(tmp_path):
    """Files linked into the Hugging Face cache are named by their content hash: used as is."""
    import hashlib

    blobs = tmp_path / "blobs"
    blobs.mkdir()
    name = "ab" * 32
    (blobs / name).write_bytes(b"weights")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "model.safetensors").symlink_to(blobs / name)
    line = f"model.safetensors\0{name}\n".encode()
    assert directory_fingerprint(snapshot) == hashlib.sha256(line).hexdigest()[:16]


def test_hub_revision_is_the_commit_the_cache_resolves(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--someone--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    assert hub_revision("someone/tiny") == commit
    assert hub_revision("someone/absent") is None


def test_a_hub_name_is_evaluated_from_the_cache_with_its_revision(tmp_path, monkeypatch, data_dir):
    """Offline, a hub name the cache holds loads from it; its fingerprint is name@commit."""
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--someone--tiny"
    save_gpt2(repo / "snapshots" / commit, bpe_tokenizer(), context=24)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    report = resstream.evaluate_model("someone/tiny", "openwebtext", data_dir=data_dir, progress=False)
    assert (report.model, report.model_source) == ("someone/tiny", "hub")
    assert report.model_fingerprint == f"someone/tiny@{commit}"
    model, tokenizer = hf_model(repo / "snapshots" / commit)
    check_text(
        report.results[0], hand_sliding(model, stream(tokenizer, documents("openwebtext", data_dir)), 24, 12)
    )


# --------------------------------------------------------------------------- the command line
def eval_args(model: Path, data_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--model", str(model), "--data-dir", str(data_dir), "--out", str(out), "--quiet", *extra]


def test_cli_eval_of_a_hugging_face_directory(gpt2_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--benchmarks", "openwebtext,lambada", "--block-size", "16", "--stride", "5", "--batch-size", "2"]
    assert main(eval_args(gpt2_dir, data_dir, out, *args, "--device", "cpu")) == 0, capsys.readouterr().err
    report = json.loads((out / "eval.json").read_text())
    fingerprint = directory_fingerprint(gpt2_dir)
    assert (report["model"], report["model_source"], report["model_fingerprint"]) == (
        str(gpt2_dir),
        "local",
        fingerprint,
    )
    assert (report["block_size"], report["context"], report["stride"]) == (16, 40, 5)
    assert (
        report["end_of_text"] == "<|endoftext|>"
        and "'<|endoftext|>' after each document" in report["documents"]
    )
    model, tokenizer = hf_model(gpt2_dir)
    text, lam = report["benchmarks"]
    expected = hand_sliding(model, stream(tokenizer, documents("openwebtext", data_dir)), 16, 5)
    assert text["loss"] == pytest.approx(expected[0], rel=1e-5) and text["num_tokens"] == expected[2]
    lam_loss = hand_lambada(model, tokenizer, documents("lambada", data_dir), 16)[0]
    assert lam["loss"] == pytest.approx(lam_loss, rel=1e-5)  # batched vs one passage at a time
    record = json.loads((out / "run.json").read_text())["config"]
    assert (record["model"], record["model_source"], record["model_fingerprint"]) == (
        str(gpt2_dir),
        "local",
        fingerprint,
    )
    assert (record["block_size"], record["dtype"], record["model_config"]["model_type"]) == (
        16,
        "auto",
        "gpt2",
    )


def test_cli_eval_of_a_llama_on_shakespeare(llama_dir, data_dir, tmp_path, capsys, monkeypatch):
    """`shakespeare` for a model that is not a run: the tail by the trainer's default rule."""
    import resstream.data as data
    from resstream.data import split_tokens, tokenize_documents

    small = data.Corpus("shakespeare", (TEXT[:700], TEXT[300:1500]), "0123456789abcdef", "test corpus")
    monkeypatch.setattr(data, "load_corpus", lambda name, **kw: small)
    out = tmp_path / "out"
    assert main(eval_args(llama_dir, data_dir, out, "--benchmarks", "shakespeare")) == 0, (
        capsys.readouterr().err
    )
    (bench,) = json.loads((out / "eval.json").read_text())["benchmarks"]
    model, tokenizer = hf_model(llama_dir)
    tail = split_tokens(tokenize_documents(small.documents, tokenizer), 0.1)[1].tolist()
    assert tail[-1] == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("</s>")
    expected = hand_sliding(model, tail, 32, 16)
    assert bench["loss"] == pytest.approx(expected[0], rel=1e-5) and bench["num_tokens"] == expected[2]
    assert (
        "val_fraction=0.1, the trainer's default" in bench["note"] and "not a resstream run" in bench["note"]
    )
    assert "note (shakespeare): validation tail" in capsys.readouterr().out


def _refused(args: list[str], out: Path, capsys, pattern: str) -> None:
    capsys.readouterr()  # what saving the model printed
    code = main([*args, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("resstream: error:"), err
    assert pattern in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (
            ["--block-size", "41"],
            "--block-size 41 is above the model's context (40 tokens); allowed: 2 .. 40",
        ),
        (["--block-size", "1"], "--block-size must be >= 2"),
        (["--block-size", "0"], "--block-size must be >= 2"),
        (["--block-size", "10", "--stride", "11"], "--stride 11 is outside [1, 10]"),
        (["--dtype", "int8"], "int8"),
    ],
)
def test_cli_bad_settings_for_a_hugging_face_model(gpt2_dir, data_dir, tmp_path, capsys, extra, pattern):
    args = ["eval", "--model", str(gpt2_dir), "--data-dir", str(data_dir), "--benchmarks", "openwebtext"]
    _refused([*args, *extra], tmp_path / "out", capsys, pattern)


def test_cli_refuses_what_is_not_a_causal_lm(tmp_path, data_dir, capsys):
    from transformers import BertConfig, BertForMaskedLM

    path = tmp_path / "bert"
    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertForMaskedLM(config).save_pretrained(path)
    bpe_tokenizer().save_pretrained(path)
    _refused(
        ["eval", "--model", str(path), "--data-dir", str(data_dir)],
        tmp_path / "out",
        capsys,
        "not a causal LM",
    )


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda p: p.mkdir(), "has no config.json (nor resstream's model.json)"),
        (lambda p: p.write_text("x"), "is a file"),
        (lambda p: None, "does not exist"),
    ],
)
def test_cli_refuses_a_path_that_is_neither_a_run_nor_a_model(tmp_path, data_dir, capsys, make, pattern):
    path = tmp_path / "thing"
    make(path)
    _refused(["eval", "--model", str(path), "--data-dir", str(data_dir)], tmp_path / "out", capsys, pattern)


def test_cli_refuses_an_uncached_hub_name_offline(tmp_path, data_dir, capsys):
    args = ["eval", "--model", "someone/not-cached-model", "--data-dir", str(data_dir)]
    _refused(args, tmp_path / "out", capsys, "offline mode is set")
