"""resstream.data: text corpora, tokenizers and cached token streams.

Importing this package is cheap: `transformers`, `tokenizers` and `datasets` are imported
only when a function needs them.
"""

from resstream.data.corpora import CORPORA, NAMED_CORPORA, CorpusSpec, default_split
from resstream.data.files import Pieces, load_token_rows
from resstream.data.plays import strip_play_markdown
from resstream.data.sources import (
    Corpus,
    CorpusStream,
    corpus_fingerprint,
    data_dir,
    load_corpus,
    stream_corpus,
)
from resstream.data.tokenizer import (
    cached_bpe,
    load_tokenizer,
    save_tokenizer,
    tokenizer_fingerprint,
    train_bpe,
)
from resstream.data.tokens import TokenSplits, build_token_cache, split_tokens, tokenize_documents
from resstream.data.wikitext import split_wikitext_articles, wikitext_raw_from_rows, wikitext_rows_from_file

__all__ = [
    "CORPORA",
    "NAMED_CORPORA",
    "Corpus",
    "CorpusSpec",
    "CorpusStream",
    "Pieces",
    "TokenSplits",
    "build_token_cache",
    "cached_bpe",
    "corpus_fingerprint",
    "data_dir",
    "default_split",
    "load_corpus",
    "load_token_rows",
    "load_tokenizer",
    "save_tokenizer",
    "split_tokens",
    "split_wikitext_articles",
    "stream_corpus",
    "strip_play_markdown",
    "tokenize_documents",
    "tokenizer_fingerprint",
    "train_bpe",
    "wikitext_raw_from_rows",
    "wikitext_rows_from_file",
]
