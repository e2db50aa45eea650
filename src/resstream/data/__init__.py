"""resstream.data: text corpora, tokenizers and cached token streams.

Importing this package is cheap: `transformers`, `tokenizers` and `datasets` are imported
only when a function needs them.
"""

from resstream.data.sources import (
    NAMED_CORPORA,
    Corpus,
    CorpusStream,
    data_dir,
    load_corpus,
    load_token_rows,
    stream_corpus,
)
from resstream.data.tokenizer import load_tokenizer, save_tokenizer, tokenizer_fingerprint, train_bpe
from resstream.data.tokens import TokenSplits, build_token_cache, split_tokens, tokenize_documents

__all__ = [
    "NAMED_CORPORA",
    "Corpus",
    "CorpusStream",
    "TokenSplits",
    "build_token_cache",
    "data_dir",
    "load_corpus",
    "load_token_rows",
    "load_tokenizer",
    "save_tokenizer",
    "split_tokens",
    "stream_corpus",
    "tokenize_documents",
    "tokenizer_fingerprint",
    "train_bpe",
]
