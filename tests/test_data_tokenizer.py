"""Tokenizers: GPT-2 from local files, save/load round trips, BPE training, fingerprints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from resstream.data import (
    load_corpus,
    load_tokenizer,
    save_tokenizer,
    stream_corpus,
    tokenizer_fingerprint,
    train_bpe,
)
from resstream.errors import UsageError

REFERENCE = "Hello world, this is a test"
REFERENCE_IDS = [15496, 995, 11, 428, 318, 257, 1332]
TEXT = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.\n"
    "Pack my box with five dozen liquor jugs! How vexingly quick daft zebras jump.\n"
)


@pytest.fixture(scope="module")
def small_bpe():
    return train_bpe([TEXT] * 4, 300)


@pytest.fixture(scope="module")
def gpt2(shared_data: Path):
    return load_tokenizer("gpt2", data_dir=shared_data)


# --------------------------------------------------------------------------- GPT-2


def test_gpt2_from_local_files_encodes_reference(gpt2) -> None:
    assert gpt2(REFERENCE)["input_ids"] == REFERENCE_IDS
    assert gpt2.eos_token_id == 50256
    assert len(gpt2) == 50257
    assert gpt2.decode(REFERENCE_IDS) == REFERENCE


def test_gpt2_via_environment(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESSTREAM_DATA", str(shared_data))
    assert load_tokenizer("gpt2")(REFERENCE)["input_ids"] == REFERENCE_IDS


def test_gpt2_without_files_falls_back_to_hub(hf_offline: None, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"tokenizer 'gpt2' not found: .*offline mode is set"):
        load_tokenizer("gpt2", data_dir=tmp_path)


def test_gpt2_round_trips_through_a_directory(gpt2, tmp_path: Path) -> None:
    save_tokenizer(gpt2, tmp_path / "tok")
    loaded = load_tokenizer(str(tmp_path / "tok"))
    assert loaded(REFERENCE)["input_ids"] == REFERENCE_IDS
    assert tokenizer_fingerprint(loaded) == tokenizer_fingerprint(gpt2)


# --------------------------------------------------------------------------- train_bpe


def test_train_bpe_by_hand() -> None:
    # byte-level pieces: "ab", "Ġab", "Ġab"; merge 1 = a+b (3 times), merge 2 = Ġ+ab (twice)
    tok = train_bpe(["ab ab ab"], 259)
    assert tok.eos_token_id == 0 and tok.eos_token == "<|endoftext|>"
    assert tok.convert_ids_to_tokens([257, 258]) == ["ab", "Ġab"]
    assert tok("ab ab")["input_ids"] == [257, 258]
    assert len(train_bpe(["ab ab ab"], 258)) == 258


def test_train_bpe_size_and_round_trip(small_bpe) -> None:
    assert len(small_bpe) == 300
    text = "Zebras café — naïve ✓ unseen bytes\n"
    assert small_bpe.decode(small_bpe(text)["input_ids"]) == text
    assert small_bpe("<|endoftext|>")["input_ids"] == [small_bpe.eos_token_id]


def test_train_bpe_is_deterministic(small_bpe) -> None:
    again = train_bpe([TEXT] * 4, 300)
    assert again.backend_tokenizer.to_str() == small_bpe.backend_tokenizer.to_str()
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(small_bpe)


def test_train_bpe_on_a_stream_equals_training_on_the_loaded_corpus(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text(TEXT * 50 + " ".join(TEXT.split()) * 20, encoding="utf-8")  # lines, then one long line
    loaded = train_bpe(load_corpus(str(path)).documents, 400)
    streamed = train_bpe(stream_corpus(str(path), block_bytes=300), 400)
    assert tokenizer_fingerprint(streamed) == tokenizer_fingerprint(loaded)


def test_train_bpe_custom_eos() -> None:
    tok = train_bpe([TEXT], 280, eos_token="</s>")
    assert tok.eos_token == "</s>" and tok.eos_token_id == 0


def test_train_bpe_rejects_tiny_vocab() -> None:
    with pytest.raises(UsageError, match="BPE vocabulary size 100 is too small"):
        train_bpe([TEXT], 100)


def test_bpe_and_fingerprint_are_the_same_in_another_process(small_bpe) -> None:
    code = (
        "import sys, json; from resstream.data import train_bpe, tokenizer_fingerprint; "
        "print(tokenizer_fingerprint(train_bpe([json.loads(sys.argv[1])] * 4, 300)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(TEXT)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == tokenizer_fingerprint(small_bpe)


# --------------------------------------------------------------------------- save / load


def test_save_load_round_trip(small_bpe, tmp_path: Path) -> None:
    save_tokenizer(small_bpe, tmp_path / "saved")
    loaded = load_tokenizer(str(tmp_path / "saved"))
    assert loaded.is_fast
    assert loaded(TEXT)["input_ids"] == small_bpe(TEXT)["input_ids"]
    assert loaded.eos_token_id == small_bpe.eos_token_id
    assert tokenizer_fingerprint(loaded) == tokenizer_fingerprint(small_bpe)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_tokenizer_json_file(small_bpe, tmp_path: Path) -> None:
    small_bpe.backend_tokenizer.save(str(tmp_path / "my-bpe.json"))
    loaded = load_tokenizer(str(tmp_path / "my-bpe.json"))
    assert loaded.eos_token == "<|endoftext|>" and loaded.eos_token_id == 0
    assert loaded(TEXT)["input_ids"] == small_bpe(TEXT)["input_ids"]


def test_bad_tokenizer_file(tmp_path: Path) -> None:
    (tmp_path / "junk.json").write_text("{}", encoding="utf-8")
    with pytest.raises(UsageError, match=r"tokenizer file '.*junk\.json' is not a tokenizers JSON file"):
        load_tokenizer(str(tmp_path / "junk.json"))


def test_unreadable_tokenizer_file_is_reported_as_such(
    small_bpe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tok.json"
    small_bpe.backend_tokenizer.save(str(path))

    def denied(self: Path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)  # root can read any file; simulate a 0000 one
    with pytest.raises(UsageError, match=r"^tokenizer file '.*tok\.json' cannot be read: permission denied$"):
        load_tokenizer(str(path))


def test_unknown_spec_fails_fast_offline(hf_offline: None) -> None:
    with pytest.raises(
        UsageError,
        match=(
            r"^tokenizer 'no-such-tokenizer-xyz' not found: not a local directory or file, and "
            r"the Hugging Face hub could not provide it \(offline mode is set"
        ),
    ):
        load_tokenizer("no-such-tokenizer-xyz")


def test_missing_path_spec(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"tokenizer '.*absent' not found: no such directory or file"):
        load_tokenizer(str(tmp_path / "absent"))


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_is_stable(small_bpe) -> None:
    first = tokenizer_fingerprint(small_bpe)
    assert len(first) == 16 and int(first, 16) >= 0
    small_bpe(TEXT, truncation=True, max_length=4)  # per-call state must not matter
    assert tokenizer_fingerprint(small_bpe) == first


def test_fingerprint_changes_with_vocab_merges_and_specials(small_bpe) -> None:
    base = tokenizer_fingerprint(small_bpe)
    assert tokenizer_fingerprint(train_bpe([TEXT] * 4, 299)) != base
    assert tokenizer_fingerprint(train_bpe([TEXT.upper()] * 4, 300)) != base
    assert tokenizer_fingerprint(train_bpe([TEXT] * 4, 300, eos_token="</s>")) != base
    extended = train_bpe([TEXT] * 4, 300)
    extended.add_special_tokens({"additional_special_tokens": ["<pad>"]})
    assert tokenizer_fingerprint(extended) != base


def test_train_bpe_on_the_builtin_corpus() -> None:
    from resstream.data import load_corpus

    documents = load_corpus("shakespeare").documents  # about 5 MB
    tok = train_bpe(documents, 4096)
    assert len(tok) == 4096


def test_a_new_tokenizer_directory_appears_whole_with_the_umasks_mode(tmp_path, monkeypatch):
    """An interrupted save leaves no empty tokenizer/ that a resume would take for a saved one."""
    import os

    from resstream.data import train_bpe
    from resstream.data.tokenizer import save_tokenizer

    tokenizer = train_bpe(["a b c d e f g"] * 50, 300)
    target = tmp_path / "run" / "tokenizer"

    def interrupted(self, path, *args, **kwargs):
        (Path(path) / "tokenizer.json").write_text("{")
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(type(tokenizer), "save_pretrained", interrupted)
        with pytest.raises(KeyboardInterrupt):
            save_tokenizer(tokenizer, target)
    assert not target.exists() and list((tmp_path / "run").iterdir()) == []
    old = os.umask(0o022)
    try:
        save_tokenizer(tokenizer, target)
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o755
    assert (target / "tokenizer.json").is_file()


def test_a_token_that_is_part_of_a_character_shows_its_bytes() -> None:
    from resstream.data import train_bpe
    from resstream.data.tokenizer import token_text

    tokenizer = train_bpe(["plain ascii text, nothing else " * 20], vocab_size=300)
    ids = tokenizer("a — é", add_special_tokens=False)["input_ids"]
    assert "\ufffd" in tokenizer.decode([ids[2]])  # what decoding alone shows: "�"
    assert [token_text(tokenizer, i) for i in ids] == ["a", " ", "⟨e2⟩", "⟨80⟩", "⟨94⟩", " ", "⟨c3⟩", "⟨a9⟩"]


def test_bytes_shown_in_hex_keep_the_complete_characters_beside_them() -> None:
    from resstream.data.tokenizer import _with_hex_bytes

    assert _with_hex_bytes(" é".encode() + b"\xe2\x80") == " é⟨e2⟩⟨80⟩"
    assert _with_hex_bytes(b"\\x41\xc3") == "\\x41⟨c3⟩"  # a literal backslash stays text
    assert _with_hex_bytes("—".encode()) == "—"


def test_a_non_byte_level_token_part_of_a_character_shows_its_vocabulary_entry() -> None:
    from resstream.data.tokenizer import token_text

    class ByteFallback:  # SentencePiece-style byte tokens, as Llama-2's tokenizer has them
        def decode(self, ids: list[int]) -> str:
            return "\ufffd"

        def convert_ids_to_tokens(self, token_id: int) -> str:
            return "<0xE2>"

    assert token_text(ByteFallback(), 7) == "<0xE2>"


def test_a_trained_bpe_is_kept_per_corpus_and_vocabulary(tmp_path, monkeypatch):
    """The second run on the same corpus loads the kept tokenizer instead of training; it
    encodes exactly as the trained one; another vocabulary size or corpus trains anew."""
    from resstream.data import stream_corpus
    from resstream.data import tokenizer as tk

    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("the quick brown fox jumps over the lazy dog\n" * 200, encoding="utf-8")
    cache = tmp_path / "cache"
    trained = tk.cached_bpe(stream_corpus(str(corpus_file)), 300, cache)
    assert len(list(cache.glob("bpe-*"))) == 1

    def must_not_train(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(tk, "train_bpe", must_not_train)
    kept = tk.cached_bpe(stream_corpus(str(corpus_file)), 300, cache)
    text = "the lazy fox jumps over the quick dog"
    assert kept.encode(text) == trained.encode(text) and kept.eos_token_id == trained.eos_token_id
    with pytest.raises(AssertionError, match="trained again"):
        tk.cached_bpe(stream_corpus(str(corpus_file)), 301, cache)
    corpus_file.write_text("another corpus entirely\n" * 200, encoding="utf-8")
    with pytest.raises(AssertionError, match="trained again"):
        tk.cached_bpe(stream_corpus(str(corpus_file)), 300, cache)


def _break_entry_into_a_file(entry: Path) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text("not a folder")


def _corrupt_entry(entry: Path) -> None:
    entry.mkdir(parents=True)
    (entry / "tokenizer.json").write_text("{ not json")


@pytest.mark.parametrize(
    ("spoil", "unwritable", "notes"),
    [
        (_break_entry_into_a_file, False, ["cannot be used (not a folder", "could not be kept"]),
        (_corrupt_entry, False, ["cannot be used ("]),  # trained again and kept in its place
        (_corrupt_entry, True, ["cannot be used (", "could not be kept in the cache folder"]),
    ],
    ids=["a file", "corrupt json", "corrupt and unwritable"],
)
def test_an_unusable_bpe_cache_entry_is_bypassed_with_a_note(tmp_path, monkeypatch, spoil, unwritable, notes):
    """Never a traceback: the tokenizer is trained (as it would be without the cache) and each
    problem is one note (`ResstreamNotice`)."""
    from resstream.data import stream_corpus
    from resstream.data import tokenizer as tk
    from resstream.notices import ResstreamNotice

    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("the quick brown fox jumps over the lazy dog\n" * 50, encoding="utf-8")
    corpus = stream_corpus(str(corpus_file))
    entry = tk.bpe_cache_entry(corpus, 300, tmp_path / "cache")
    spoil(entry)
    if unwritable:  # (chmod does not stop root)

        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(entry))

        monkeypatch.setattr(tk, "save_tokenizer", refuse)
    with pytest.warns(ResstreamNotice) as caught:
        tokenizer = tk.cached_bpe(corpus, 300, tmp_path / "cache")
    said = [str(w.message) for w in caught]
    assert len(said) == len(notes) and all(n in line for n, line in zip(notes, said, strict=True)), said
    assert str(entry) in said[0]
    text = "the lazy fox jumps"
    assert tokenizer.encode(text) == tk.train_bpe(stream_corpus(str(corpus_file)), 300).encode(text)


def test_the_bpe_cache_key_covers_the_special_token_and_the_tokenizers_version(tmp_path, monkeypatch):
    import tokenizers

    from resstream.data import stream_corpus
    from resstream.data import tokenizer as tk

    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("some text\n", encoding="utf-8")
    corpus = stream_corpus(str(corpus_file))
    entry = tk.bpe_cache_entry(corpus, 300, tmp_path)
    assert tk.bpe_cache_entry(corpus, 300, tmp_path, eos_token="</s>") != entry
    monkeypatch.setattr(tokenizers, "__version__", "0.0.1")
    assert tk.bpe_cache_entry(corpus, 300, tmp_path) != entry


# --------------------------------------------------------------------------- custom code (auto_map)

CUSTOM_CLASS = "tokenization_custom.CustomTokenizerFast"


def with_custom_tokenizer_code(folder: Path, marker: Path, *, legacy: bool = False) -> Path:
    """`folder`, a saved tokenizer, given a class of its own: its tokenizer_config.json's auto_map
    names `CUSTOM_CLASS` in tokenization_custom.py beside it, which writes `marker` when imported
    (`legacy`: the old auto_map form, a bare [slow, fast] list)."""
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    classes = [None, CUSTOM_CLASS]
    config["auto_map"] = classes if legacy else {"AutoTokenizer": classes}
    config_file.write_text(json.dumps(config), encoding="utf-8")
    (folder / "tokenization_custom.py").write_text(
        "from pathlib import Path\n\n"
        "from transformers import PreTrainedTokenizerFast\n\n"
        f"Path({str(marker)!r}).write_text('imported', encoding='utf-8')\n\n\n"
        "class CustomTokenizerFast(PreTrainedTokenizerFast):\n"
        "    pass\n",
        encoding="utf-8",
    )
    return folder


def _code_refusal(label: str, config: str, ending: str) -> str:
    return (
        rf"^{label} needs custom code: the auto_map of {config} names "
        rf"'tokenization_custom\.CustomTokenizerFast'{ending}$"
    )


#: The ends of the refusal where no caller offers `trust_remote_code` (None) and where one does (False).
NOT_SUPPORTED = (
    r", and resstream runs no tokenizer's own code when it trains or tokenises; "
    r"allowed: a tokenizer without custom code \(no auto_map\)"
)
ONLY_IF_TRUSTED = r"; allowed only with `trust_remote_code=True`, if you trust it"


@pytest.mark.parametrize("legacy", [False, True], ids=["auto-map", "legacy-list"])
def test_a_tokenizer_with_its_own_code_is_refused_and_none_of_it_runs(small_bpe, tmp_path, legacy) -> None:
    """Hugging Face would load a plain fast tokenizer in place of the author's class, silently."""
    folder = tmp_path / "custom"
    save_tokenizer(small_bpe, folder)
    marker = tmp_path / "imported"
    with_custom_tokenizer_code(folder, marker, legacy=legacy)
    config = re.escape(repr(str(folder / "tokenizer_config.json")))
    for spec, label in [
        (folder, "tokenizer directory " + re.escape(repr(str(folder)))),
        (folder / "tokenizer.json", "tokenizer " + re.escape(repr(str(folder / "tokenizer.json")))),
    ]:
        with pytest.raises(UsageError, match=_code_refusal(label, config, NOT_SUPPORTED)):
            load_tokenizer(str(spec))
        with pytest.raises(UsageError, match=_code_refusal(label, config, ONLY_IF_TRUSTED)):
            load_tokenizer(str(spec), trust_remote_code=False)
    assert not marker.exists()


def test_code_in_another_repository_is_refused_too(small_bpe, tmp_path) -> None:
    folder = tmp_path / "custom"
    save_tokenizer(small_bpe, folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoTokenizer": [None, "someorg/code--tokenization_x.XTokenizerFast"]}
    config_file.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(
        UsageError, match=r"names 'someorg/code--tokenization_x\.XTokenizerFast'; allowed only"
    ):
        load_tokenizer(str(folder), trust_remote_code=False)


def test_a_saved_copy_whose_auto_map_names_code_it_does_not_hold_loads_with_a_notice(
    small_bpe, tmp_path
) -> None:
    """Hugging Face keeps the auto_map of a tokenizer loaded without its code in every copy it
    saves (the tokenizer/ folder of a run trained before such tokenizers were refused): there is
    no code to run, and its tokenizer.json is the tokenizer that was used."""
    from resstream.notices import ResstreamNotice

    folder = tmp_path / "saved"
    save_tokenizer(small_bpe, folder)
    with_custom_tokenizer_code(folder, tmp_path / "imported")
    (folder / "tokenization_custom.py").unlink()
    expected = (
        r"names 'tokenization_custom\.CustomTokenizerFast', which was not run \(its code is not in the "
        r"folder\); loaded from its tokenizer files"
    )
    with pytest.warns(ResstreamNotice, match=expected):
        loaded = load_tokenizer(str(folder))
    assert loaded(TEXT)["input_ids"] == small_bpe(TEXT)["input_ids"]


def test_a_model_type_whose_auto_map_transformers_ignores_loads_its_own_class(small_bpe, tmp_path) -> None:
    """transformers ignores the tokenizer auto_map of some model types without trust (Phi-3 and
    Qwen2 checkpoints on the hub carry one) and loads its own class: nothing runs, so nothing is
    refused, and a notice says so."""
    from resstream.data.tokenizer_code import tokenizer_code
    from resstream.notices import ResstreamNotice

    folder = tmp_path / "phi"
    save_tokenizer(small_bpe, folder)
    with_custom_tokenizer_code(folder, tmp_path / "imported")
    (folder / "config.json").write_text(json.dumps({"model_type": "phi3"}), encoding="utf-8")
    assert tokenizer_code(folder).runs is False
    with pytest.warns(
        ResstreamNotice, match=r"which was not run \(transformers ignores it for model type 'phi3'"
    ):
        loaded = load_tokenizer(str(folder), trust_remote_code=False)
    assert loaded(TEXT)["input_ids"] == small_bpe(TEXT)["input_ids"]
    assert not (tmp_path / "imported").exists()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}), encoding="utf-8")
    with pytest.raises(UsageError, match="needs custom code"):
        load_tokenizer(str(folder), trust_remote_code=False)


def test_a_folder_whose_config_asks_for_code_gives_its_tokenizer_without_asking_or_running_it(
    small_bpe, tmp_path, monkeypatch
) -> None:
    """A model folder given as a tokenizer: its config.json's auto_map asks for config code that the
    tokenizer does not need. Not told `trust_remote_code`, Hugging Face asks on the terminal and runs
    the code on "y"; resstream tells it False, so it never asks."""
    folder = tmp_path / "model-folder"
    save_tokenizer(small_bpe, folder)
    marker = tmp_path / "imported"
    config = {"model_type": "custom_lm", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "configuration_custom.py").write_text(
        f"from pathlib import Path\n\nPath({str(marker)!r}).write_text('imported', encoding='utf-8')\n",
        encoding="utf-8",
    )
    monkeypatch.setattr("builtins.input", lambda *args: "y")
    loaded = load_tokenizer(str(folder))
    assert loaded(TEXT)["input_ids"] == small_bpe(TEXT)["input_ids"]
    assert not marker.exists()


def _in_a_process(code: str, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` run by another Python, offline, its imported custom code kept under `tmp_path`."""
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), **env}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=environ, timeout=300
    )


@pytest.mark.slow
def test_with_trust_remote_code_the_tokenizers_own_class_is_loaded(small_bpe, tmp_path) -> None:
    folder = tmp_path / "custom"
    save_tokenizer(small_bpe, folder)
    marker = tmp_path / "imported"
    with_custom_tokenizer_code(folder, marker)
    code = (
        "import json, sys; from resstream.data import load_tokenizer; "
        "t = load_tokenizer(sys.argv[1], trust_remote_code=True); "
        "print(json.dumps([type(t).__name__, t.encode(sys.argv[2])]))"
    )
    done = _in_a_process(code, tmp_path, str(folder), "the quick brown fox")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["CustomTokenizerFast", small_bpe.encode("the quick brown fox")]
    assert marker.exists()


@pytest.mark.slow
def test_a_hub_tokenizer_with_its_own_code_is_refused_from_the_local_cache(small_bpe, tmp_path) -> None:
    """A hub name is checked the same way, from the tokenizer_config.json the cache holds."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someorg--custom-tok"
    snapshot = repo / "snapshots" / commit
    save_tokenizer(small_bpe, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    marker = tmp_path / "imported"
    with_custom_tokenizer_code(snapshot, marker)
    code = (
        "import sys; from resstream.data import load_tokenizer; from resstream.errors import UsageError\n"
        "for options in ({}, {'trust_remote_code': False}):\n"
        "    try:\n"
        "        load_tokenizer('someorg/custom-tok', **options)\n"
        "    except UsageError as exc:\n"
        "        print(exc)\n"
    )
    done = _in_a_process(code, tmp_path, HF_HUB_CACHE=str(tmp_path / "hub"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    config = re.escape("its tokenizer_config.json")
    assert len(lines) == 2, done.stdout
    assert re.match(_code_refusal("tokenizer 'someorg/custom-tok'", config, NOT_SUPPORTED), lines[0])
    assert re.match(_code_refusal("tokenizer 'someorg/custom-tok'", config, ONLY_IF_TRUSTED), lines[1])
    assert not marker.exists()
