"""Tokenizers: GPT-2's BPE from local files, saved directories, hub names, and new BPEs.

`load_tokenizer(spec)` accepts:

* ``"gpt2"``: built from ``gpt2-tokenizer/encoder.json`` + ``vocab.bpe`` in the data
  directory when they are there (offline), else ``AutoTokenizer.from_pretrained("gpt2")``.
* a directory (one written by `save_tokenizer`, or any Hugging Face tokenizer folder);
* a ``tokenizer.json`` file (the `tokenizers` library's format). Its eos token is the first
  of ``<|endoftext|>``, ``</s>``, ``<eos>``, ``<|end_of_text|>`` that it holds as a special
  token (none: ``eos_token_id`` is None and documents are concatenated with no separator);
* anything else: a Hugging Face hub name. Offline (``HF_HUB_OFFLINE`` set, or the hub host
  unreachable) only the local Hugging Face cache is consulted, so this fails at once.

Every result is a fast (Rust-backed) `PreTrainedTokenizerFast`.

Custom code: a directory or hub repository whose ``tokenizer_config.json`` has an ``auto_map``
naming a tokenizer class of its own is refused unless ``trust_remote_code=True``
(`resstream.data.tokenizer_code`). Hugging Face is always told ``trust_remote_code``
explicitly, so no code from the folder runs without trust, and it never asks on the terminal.

Note on transformers 5.x: ``GPT2TokenizerFast(vocab_file=..., merges_file=...)`` silently
builds an empty tokenizer, so GPT-2 is assembled here with the `tokenizers` library and
wrapped with ``PreTrainedTokenizerFast(tokenizer_object=...)``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resstream.data.files import Document, check_readable, tokenizer_pieces
from resstream.data.sources import CorpusStream
from resstream.data.sources import data_dir as resolve_data_dir
from resstream.data.tokenizer_code import (
    TOKENIZER_CONFIG,
    check_tokenizer_code,
    refuse_code_asked_for,
    say_loaded_without_code,
)
from resstream.errors import UsageError, short_reason
from resstream.hub import looks_like_path, offline_reason
from resstream.io import current_umask, is_real_directory
from resstream.notices import notify

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
GPT2_DIR = "gpt2-tokenizer"
GPT2_MAX_LENGTH = 1024
#: `save_tokenizer` writes into a hidden folder with this prefix beside the target, then renames.
STAGING_PREFIX = ".tokenizer."
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")


def load_tokenizer(
    spec: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    trust_remote_code: bool | None = None,
) -> PreTrainedTokenizerFast:
    """A fast tokenizer from `spec` (see the module docstring); UsageError when none fits.

    A tokenizer with its own code (an ``auto_map`` in its tokenizer_config.json) is loaded with
    that code only when `trust_remote_code` is True. False refuses it, saying it is allowed
    with ``trust_remote_code=True``; None (the default: a caller that offers no way to trust
    code, such as training and tokenising a corpus) refuses it as not supported.
    """
    spec = str(spec).strip()
    if not spec:
        raise UsageError(
            "tokenizer '' is empty: give 'gpt2', a directory, a tokenizer.json file or a Hugging Face name"
        )
    if spec == "gpt2":
        local = _gpt2_files(data_dir)
        if local is not None:
            return gpt2_from_files(*local)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _from_directory(path, spec, trust_remote_code)
    if path.is_file():
        return _from_file(path, spec, trust_remote_code)
    if looks_like_path(spec):
        raise UsageError(f"tokenizer {spec!r} not found: no such directory or file")
    return _from_hub(spec, trust_remote_code)


def gpt2_from_files(
    encoder_json: str | os.PathLike[str],
    vocab_bpe: str | os.PathLike[str],
) -> PreTrainedTokenizerFast:
    """GPT-2's byte-level BPE from OpenAI's `encoder.json` and `vocab.bpe` (offline)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    try:
        model = models.BPE.from_file(str(encoder_json), str(vocab_bpe))
    except Exception as exc:
        raise UsageError(
            f"GPT-2 tokenizer files {str(encoder_json)!r} / {str(vocab_bpe)!r} cannot be read: "
            f"{short_reason(exc)}"
        ) from None
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    return _wrap(backend, eos=EOS_TOKEN, model_max_length=GPT2_MAX_LENGTH)


def train_bpe(
    documents: Iterable[Document],
    vocab_size: int,
    *,
    eos_token: str = EOS_TOKEN,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (GPT-2 style) on `documents`; deterministic for the same input.

    The vocabulary holds the 256 byte symbols, `eos_token` (a special token) and
    `vocab_size - 257` merges (fewer when the text has no more pairs to merge).
    `documents` may be a stream (`stream_corpus`); the trainer gets their text in pieces of
    at most `TOKENIZER_PIECE_CHARS` characters cut between pre-tokens
    (`resstream.data.files.split_text`), so it counts the same words as on whole documents
    while its memory grows with the distinct words, not with the corpus or its longest line.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 258:
        raise UsageError(
            f"BPE vocabulary size {vocab_size} is too small: it must be at least "
            f"258 (256 bytes + the eos token + 1 merge)"
        )
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos_token],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=0,
    )
    pieces = (piece for document in documents for piece in tokenizer_pieces(document))
    backend.train_from_iterator(pieces, trainer=trainer)
    return _wrap(backend, eos=eos_token)


#: Part of the key of a cached BPE tokenizer: raise it when `train_bpe` changes what it makes.
BPE_CACHE_VERSION = 2


def bpe_cache_entry(
    corpus: CorpusStream, vocab_size: int, cache_dir: str | os.PathLike[str], *, eos_token: str = EOS_TOKEN
) -> Path:
    """The folder ``cache_dir/bpe-<key>/`` that keeps `train_bpe`'s tokenizer of `corpus`; the
    key covers what decides it: the corpus text (its fingerprint), `vocab_size`, the special
    token, the `tokenizers` version and `BPE_CACHE_VERSION`."""
    import tokenizers

    fingerprint = corpus.fingerprint if corpus.fingerprint is not None else corpus.scan()
    parts = (BPE_CACHE_VERSION, fingerprint, vocab_size, eos_token, tokenizers.__version__)
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"bpe-{key}"


def cached_bpe(
    corpus: CorpusStream, vocab_size: int, cache_dir: str | os.PathLike[str]
) -> PreTrainedTokenizerFast:
    """`train_bpe` on `corpus`, once per `bpe_cache_entry` (corpus content, vocabulary size, special
    token, tokenizers version): the tokenizer is kept in that folder and loaded from there next
    time (the runs of a sweep, and every later run on the corpus, share it). `train_bpe` is
    deterministic, so a kept tokenizer is the one training would give. An entry that cannot be
    used (not a folder, unreadable, corrupt) is trained again, and one that cannot be written
    only costs the time; either says so in a note (`resstream.notices.notify`)."""
    where = bpe_cache_entry(corpus, vocab_size, cache_dir)
    kept = _kept_bpe(where)
    if kept is not None:
        return kept
    tokenizer = train_bpe(corpus, vocab_size)
    try:
        save_tokenizer(tokenizer, where)
    except OSError as exc:
        if _kept_bpe(where, quiet=True) is None:  # (not kept by another process meanwhile)
            notify(
                f"the BPE tokenizer could not be kept in the cache folder {str(where)!r} "
                f"({type(exc).__name__}: {short_reason(exc)}); the next run on this corpus trains it again"
            )
    return tokenizer


def _kept_bpe(where: Path, *, quiet: bool = False) -> PreTrainedTokenizerFast | None:
    """The tokenizer kept in `where`, None when there is none or it cannot be used (said in a
    note unless `quiet`: what is wrong, and that it is trained again)."""
    if not os.path.lexists(where):
        return None
    try:
        if not is_real_directory(where) or not (where / "tokenizer.json").is_file():
            raise UsageError("not a folder holding tokenizer.json")
        return load_tokenizer(str(where))
    except (UsageError, OSError, ValueError) as exc:
        if not quiet:
            notify(
                f"the cached BPE tokenizer {str(where)!r} cannot be used ({short_reason(exc)}); trained again"
            )
        return None


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: str | os.PathLike[str]) -> None:
    """Write `tokenizer` into `directory` so that `load_tokenizer(directory)` gives it back.

    Files are written to a temporary folder first. A new directory is that folder renamed
    into place whole; an existing one gets the files moved in one by one. Either way an
    interrupted save never leaves a half-written file, nor an empty directory that would
    pass for a saved tokenizer. (A run checks its `tokenizer` folder before it starts:
    `checkpoint.check_run_folders`.)
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory.parent))
    try:
        tokenizer.save_pretrained(str(staging))
        if not directory.exists():
            staging.chmod(0o777 & ~current_umask())  # mkdtemp makes 0700; a directory follows the umask
            os.replace(staging, directory)
            return
        for item in sorted(staging.iterdir()):
            os.replace(item, directory / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerFast) -> str:
    """sha256 (16 hex characters) of what decides the token ids.

    Covers the normaliser, pre-tokeniser, model (vocabulary and merges), added and special
    tokens; not the per-call truncation/padding state. Stable across processes.
    """
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    state.pop("truncation", None)
    state.pop("padding", None)
    state["special_tokens_map"] = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
    state["eos_token_id"] = tokenizer.eos_token_id
    canonical = json.dumps(state, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------- helpers


def token_text(tokenizer: Any, token_id: int) -> str:
    """The text of one token, readable also when it is part of a character.

    A token that is only some of the UTF-8 bytes of a character decodes to "\ufffd" ("�"),
    which hides which bytes it is. A byte-level BPE token (GPT-2, NeoX, Llama-3, resstream's)
    is then shown as its text with the incomplete bytes in hex, "⟨e2⟩⟨80⟩" or " ⟨e2⟩"; another
    tokenizer's token as its vocabulary entry (SentencePiece's byte tokens read "<0xE2>").
    Without a tokenizer (None: a model given token ids and no tokenizer) a token reads as its
    id in angle brackets, "<1234>".
    """
    if tokenizer is None:
        return f"<{int(token_id)}>"
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(piece, str):
        return text
    alphabet = _byte_level_alphabet()
    if not piece or any(ch not in alphabet for ch in piece):
        return piece
    return _with_hex_bytes(bytes(alphabet[ch] for ch in piece))


def decoded_text(tokenizer: Any, token_ids: Iterable[int]) -> str:
    """The text of a sequence of tokens (`tokenizer.decode`); without a tokenizer each token as
    `token_text` reads it then, "<1234>"."""
    ids = [int(t) for t in token_ids]
    if tokenizer is None:
        return "".join(token_text(None, t) for t in ids)
    return str(tokenizer.decode(ids))


def _with_hex_bytes(data: bytes) -> str:
    """`data` as UTF-8 text, each byte that is not part of a complete character as "⟨e2⟩"
    (no spaces: a space in a token's text means a space)."""
    parts: list[str | bytes] = []
    while data:
        try:
            parts.append(data.decode("utf-8"))
            break
        except UnicodeDecodeError as exc:
            if exc.start:
                parts.append(data[: exc.start].decode("utf-8"))
            if parts and isinstance(parts[-1], bytes):
                parts[-1] += data[exc.start : exc.end]
            else:
                parts.append(data[exc.start : exc.end])
            data = data[exc.end :]
    return "".join(p if isinstance(p, str) else "".join(f"⟨{b:02x}⟩" for b in p) for p in parts)


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's characters and the bytes they stand for: the printable bytes of
    Latin-1 ("!".."~", "¡".."¬", "®".."ÿ") stand for themselves; every other byte b, in
    order, for chr(256 + n) with n counting those bytes (so " " is "Ġ", "\n" is "Ċ")."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {chr(b): b for b in kept}
    others = [b for b in range(256) if b not in alphabet.values()]
    alphabet.update({chr(256 + n): b for n, b in enumerate(others)})
    return alphabet


def _wrap(
    backend: Any,
    *,
    eos: str | None,
    model_max_length: int | None = None,
) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    kwargs: dict[str, Any] = {"tokenizer_object": backend}
    if eos is not None:
        kwargs.update(eos_token=eos, bos_token=eos, unk_token=eos)
    if model_max_length is not None:
        kwargs["model_max_length"] = model_max_length
    return PreTrainedTokenizerFast(**kwargs)


def _gpt2_files(explicit: str | os.PathLike[str] | None) -> tuple[Path, Path] | None:
    directory = resolve_data_dir(explicit)
    if directory is None:
        return None
    encoder, merges = directory / GPT2_DIR / "encoder.json", directory / GPT2_DIR / "vocab.bpe"
    return (encoder, merges) if encoder.is_file() and merges.is_file() else None


def _from_directory(path: Path, spec: str, trust_remote_code: bool | None) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    what = f"tokenizer directory {spec!r}" if Path(spec).expanduser().is_dir() else f"tokenizer {spec!r}"
    code = check_tokenizer_code(path, what, trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code is True)
    except Exception as exc:
        refuse_code_asked_for(exc, what, trust_remote_code)
        raise UsageError(f"tokenizer directory {spec!r} cannot be loaded: {short_reason(exc)}") from None
    say_loaded_without_code(code, what, trust_remote_code)
    return check_fast(tokenizer, f"tokenizer {spec!r}")


def _from_file(path: Path, spec: str, trust_remote_code: bool | None) -> PreTrainedTokenizerFast:
    if path.name == "tokenizer.json" and (path.parent / TOKENIZER_CONFIG).is_file():
        return _from_directory(path.parent, spec, trust_remote_code)
    from tokenizers import Tokenizer

    check_readable(path, "tokenizer file")  # else the parser reports an unreadable file as malformed
    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise UsageError(
            f"tokenizer file {spec!r} is not a tokenizers JSON file: {short_reason(exc)}"
        ) from None
    specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    eos = next((t for t in _EOS_CANDIDATES if t in specials), None)
    return _wrap(backend, eos=eos)


def _from_hub(spec: str, trust_remote_code: bool | None) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    offline = offline_reason()
    what = f"tokenizer {spec!r}"
    code = check_tokenizer_code(spec, what, trust_remote_code, local_only=offline is not None)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            spec, local_files_only=offline is not None, trust_remote_code=trust_remote_code is True
        )
    except Exception as exc:
        refuse_code_asked_for(exc, what, trust_remote_code)
        reason = offline or short_reason(exc)
        if offline:
            reason += "; not in the local Hugging Face cache either"
        raise UsageError(
            f"tokenizer {spec!r} not found: not a local directory or file, and the "
            f"Hugging Face hub could not provide it ({reason})"
        ) from None
    say_loaded_without_code(code, what, trust_remote_code)
    return check_fast(tokenizer, f"tokenizer {spec!r}")


def check_fast(tokenizer: Any, described: str) -> PreTrainedTokenizerFast:
    """`tokenizer`, if it is a fast (Rust) one, which resstream tokenizes corpora through;
    UsageError naming it as `described` (e.g. "tokenizer 'gpt2'") if not."""
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise UsageError(
            f"{described} has no fast (Rust) implementation ({type(tokenizer).__name__}); resstream needs one"
        )
    return tokenizer


__all__ = [
    "EOS_TOKEN",
    "check_fast",
    "gpt2_from_files",
    "load_tokenizer",
    "save_tokenizer",
    "tokenizer_fingerprint",
    "train_bpe",
]
