"""Prepare text8 (Mahoney, 2006): enwik8's text cleaned to lower-case letters and single spaces, 100,000,000
characters, character-level, split 90M / 5M / 5M as Transformer-XL does.

$ python data/text8/prepare.py                           # data/text8/text8.zip, else the unzipped data/text8/text8
$ python data/text8/prepare.py --source=/data/text8.zip  # a copy elsewhere: the zip or the unzipped file

Get it once (31 MB): wget -P data/text8 http://mattmahoney.net/dc/text8.zip
Writes train.bin / validation.bin / test.bin, *_docs.npy and meta.json into --out_dir (see data/README.md).

Tokens: one per character of the 27 symbols " abcdefghijklmnopqrstuvwxyz" (space = 0, a = 1, ..., z = 26), as
uint16. A file with any other character is refused (it is not text8). Each split is one document with no
end-of-document token, as in the authors' corpus (Transformer-XL loads text8 with add_eos=False).

The split is Transformer-XL's prep_text8.py: the last 2 x num_test_chars characters are validation, then test
(5,000,000 each), the rest is train; and, as there, each split is .strip()ped (the file starts with a space, so
train loses it, and a split that starts or ends at a space loses that space). Their train.txt spells the space
'_' and separates the characters by spaces, which their Vocab then splits on: the same character sequence as ours.

Words = len(split.split()) per split (after the strip; the strip changes no word).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from data.enwik8.prepare import CHUNK, NUM_TEST_CHARS, count_words, positive_int, prepare_corpus
from data.shards import ArgumentParser, DataError, Doc, cli_errors
from data.tokenizer import TEXT8_SYMBOLS, chars_tokenizer

NAME = "text8"
URL = "http://mattmahoney.net/dc/text8.zip"
SIZE = 100_000_000
NOT_A_SYMBOL = 255
TOKEN_OF_BYTE = np.full(256, NOT_A_SYMBOL, dtype=np.uint8)  # byte -> its symbol's token (all 27 are ASCII)
TOKEN_OF_BYTE[list(TEXT8_SYMBOLS.encode("ascii"))] = np.arange(len(TEXT8_SYMBOLS))
TOKEN_OF_BYTE_16 = TOKEN_OF_BYTE.astype(np.uint16)  # indexing it gives uint16 tokens directly
WORD_RULE = ("per split: len(part.split()), Python's whitespace split of the split's characters (spaces: text8 has "
             "no other whitespace)")


def check_symbols(data: np.ndarray, path, hint):
    """Every byte must be one of the 27 symbols; else a DataError that names the first one that is not."""
    for i in range(0, len(data), CHUNK):
        bad = np.flatnonzero(TOKEN_OF_BYTE[data[i:i + CHUNK]] == NOT_A_SYMBOL)
        if len(bad):
            at = i + int(bad[0])
            char = data[at:at + 4].tobytes().decode("utf-8", errors="replace")[0]
            shown = repr(char) if char != "\ufffd" else f"byte 0x{data[at]:02x}"
            raise DataError(f"{path}: character {shown} at offset {at:,} is not one of text8's 27 symbols "
                            f"(space and a-z): it is not text8: {hint}")


def strip(data: np.ndarray) -> np.ndarray:
    """data without leading and trailing spaces: prep_text8.py's part.strip() (text8 has no other whitespace)."""
    kept = data != ord(" ")
    if not kept.any():
        return data[:0]
    return data[int(kept.argmax()):len(data) - int(kept[::-1].argmax())]


def encode_chars(data: np.ndarray) -> Doc:
    """One split as one document: part.strip() as in prep_text8.py, one token per character, no end token."""
    data = strip(data)
    return Doc(TOKEN_OF_BYTE_16[data], count_words(data), len(data), 0)


def prepare_text8(source, out_dir, *, num_test_chars=NUM_TEST_CHARS, force=False):
    return prepare_corpus(source, out_dir, name=NAME, url=URL, size=SIZE, tokenizer=chars_tokenizer(),
                          encode=encode_chars, num_test_chars=num_test_chars, force=force, check=check_symbols,
                          word_rule=WORD_RULE)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--source", default=None,
                        help=f"{NAME}.zip or the unzipped {NAME} (default: <out_dir>/{NAME}.zip, else <out_dir>/{NAME})")
    parser.add_argument("--out_dir", default=here, help="where the shards go (default: data/text8/)")
    parser.add_argument("--num_test_chars", type=positive_int, default=NUM_TEST_CHARS,
                        help="characters of validation and of test, the last ones of the file (default 5,000,000; "
                             "another value also lifts the 100,000,000-character size check, for small test files)")
    parser.add_argument("--force", action="store_true", help="redo even if meta.json says it is done")
    args = parser.parse_args(argv)
    with cli_errors():
        prepare_text8(args.source, args.out_dir, num_test_chars=args.num_test_chars, force=args.force)


if __name__ == "__main__":
    main()
