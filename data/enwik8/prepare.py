"""Prepare enwik8 (Mahoney, 2006; the Hutter Prize file): the first 100,000,000 bytes of an English Wikipedia XML
dump, byte-level, split 90M / 5M / 5M bytes as Transformer-XL does.

$ python data/enwik8/prepare.py                          # data/enwik8/enwik8.zip, else the unzipped data/enwik8/enwik8
$ python data/enwik8/prepare.py --source=/data/enwik8.zip  # a copy elsewhere: the zip or the unzipped file

Get it once (36 MB): wget -P data/enwik8 http://mattmahoney.net/dc/enwik8.zip
Writes train.bin / validation.bin / test.bin, *_docs.npy and meta.json into --out_dir (see data/README.md).

Tokens are the file's bytes (0..255, vocabulary 256) stored as uint16, exactly as they are: the file is never
decoded, so its bytes round-trip whatever they are (invalid UTF-8 included). Each split is one document with no
end-of-document token, as in the authors' corpus (Transformer-XL loads enwik8 with add_eos=False).

The split is Transformer-XL's (its getdata.sh runs salesforce/awd-lstm-lm's prep_enwik8.py): the last
2 x num_test_chars bytes are validation, then test (5,000,000 each); the first 90,000,000 are train. One deviation:
prep_enwik8.py writes each byte as a number with a newline byte as a line break, and Transformer-XL's Vocab reads
that file line by line with line.strip().split(), so its token streams have no newline bytes (10) at all; ours keep
every byte, like the .raw copies prep_enwik8.py writes next to them (and like bits-per-byte on the file itself).

Words = len(split.split()) per split (Python's whitespace split of the split's bytes), counted with numpy.
data/text8/prepare.py runs its file through prepare_corpus() below.
"""
import argparse
import hashlib
import os
import sys
import zipfile
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from data.shards import ArgumentParser, DataError, Doc, cli_errors, prepared_meta, write_dataset
from data.tokenizer import bytes_tokenizer

NAME = "enwik8"  # the zip's member and the unzipped file
URL = "http://mattmahoney.net/dc/enwik8.zip"
SIZE = 100_000_000
NUM_TEST_CHARS = 5_000_000  # prep_enwik8.py's num_test_chars
SPLIT_RULE = ("Transformer-XL's (prep_enwik8.py / prep_text8.py): the last 2 x num_test_chars characters are "
              "validation, then test; the rest is train")
WORD_RULE = "per split: len(data.split()), Python's whitespace split of the split's bytes (space \\t \\n \\v \\f \\r)"
WHITESPACE = np.zeros(256, dtype=bool)
WHITESPACE[list(b" \t\n\v\f\r")] = True  # exactly the bytes that bytes.split() splits on
CHUNK = 1 << 24  # bytes per numpy pass: temporaries stay ~16 MB whatever the file's size


def count_words(data: np.ndarray, chunk=CHUNK) -> int:
    """len(data.tobytes().split()) for a uint8 array, without a Python object per word."""
    words, after_space = 0, True
    for i in range(0, len(data), chunk):
        space = WHITESPACE[data[i:i + chunk]]
        starts = ~space  # a word starts at a non-space byte that follows a space (or the start)
        starts[1:] &= space[:-1]
        starts[0] &= after_space
        words += int(np.count_nonzero(starts))
        after_space = bool(space[-1])
    return words


def encode_bytes(data: np.ndarray) -> Doc:
    """One split as one document: its bytes as tokens, no end-of-document token."""
    return Doc(data.astype(np.uint16), count_words(data), len(data), 0)


# -----------------------------------------------------------------------------
# the file: a zip with one member, or that member unzipped

def download_hint(name, url, out_dir):
    return (f"download {url} and put it at {os.path.join(out_dir, name + '.zip')} "
            f"(`wget -P {out_dir} {url}`), or pass --source=PATH (the zip or the unzipped {name})")


def find_source(source, out_dir, name, hint) -> str:
    """--source, or <out_dir>/<name>.zip, or the unzipped <out_dir>/<name>."""
    if source is not None:
        if not os.path.exists(source):
            raise DataError(f"--source={source} does not exist: {hint}")
        if os.path.isdir(source):
            raise DataError(f"--source={source} is a directory, not {name}.zip or {name}: {hint}")
        return source
    for path in (os.path.join(out_dir, name + ".zip"), os.path.join(out_dir, name)):
        if os.path.isfile(path):
            return path
    raise DataError(f"no {name}.zip or {name} in {out_dir}/: {hint}")


def file_crc32(path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            crc = zlib.crc32(block, crc)
    return crc


def inspect(path, name, hint) -> tuple[int, int, bool]:
    """(size, CRC-32, is_zip) of the data in path: the zip's member `name`, or the file itself. Reads no data from
    a zip (its directory has both)."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
                if name not in names:
                    raise DataError(f"{path} has no file {name!r} (it has {', '.join(names[:5]) or 'nothing'}): "
                                    f"it is not {name}.zip: {hint}")
                info = z.getinfo(name)
        except (zipfile.BadZipFile, OSError) as e:
            raise DataError(f"cannot read {path} as a zip ({type(e).__name__}: {e}): {hint}") from None
        return info.file_size, info.CRC, True
    if path.lower().endswith(".zip"):
        raise DataError(f"{path} is not a zip archive (a truncated or failed download?): {hint}")
    try:
        return os.path.getsize(path), file_crc32(path), False
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None


def read_data(path, name, is_zip, hint) -> bytes:
    try:
        if is_zip:
            with zipfile.ZipFile(path) as z:
                return z.read(name)  # checks the CRC-32
        with open(path, "rb") as f:
            return f.read()
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:
        raise DataError(f"cannot read {name} from {path} ({type(e).__name__}: {e}): {hint}") from None


def split_ranges(size, num_test_chars) -> dict[str, tuple[int, int]]:
    """Transformer-XL's split: data[:-2n], data[-2n:-n], data[-n:]."""
    n = num_test_chars
    return {"train": (0, size - 2 * n), "validation": (size - 2 * n, size - n), "test": (size - n, size)}


def prepare_corpus(source, out_dir, *, name, url, size, tokenizer, encode, num_test_chars=NUM_TEST_CHARS,
                   force=False, check=None, word_rule=WORD_RULE):
    """Split one file (zip or unzipped) Transformer-XL's way and write each split as one document.

    encode: uint8 array of a split -> Doc (a module-level function); check(data, path, hint): raise DataError if
    the file's bytes are not this corpus's (text8's alphabet). With the default num_test_chars the file must be
    exactly `size` bytes; a re-run on the same file (same CRC-32, zipped or not) and split does nothing.
    """
    hint = download_hint(name, url, out_dir)
    path = find_source(source, out_dir, name, hint)
    nbytes, crc, is_zip = inspect(path, name, hint)
    what = f"{name} in {path}" if is_zip else path
    if num_test_chars == NUM_TEST_CHARS and nbytes != size:
        raise DataError(f"{what} is {nbytes:,} bytes, not {size:,}: it is truncated or not {name}: {hint}")
    if nbytes <= 2 * num_test_chars:
        raise DataError(f"{what} is {nbytes:,} bytes: no train split is left with --num_test_chars={num_test_chars:,}")
    src = f"local:{os.path.abspath(path)}"
    fingerprint = hashlib.sha256(f"crc32 {crc:08x}\tbytes {nbytes}\tnum_test_chars {num_test_chars}".encode())
    fingerprint = fingerprint.hexdigest()[:16]
    if (meta := prepared_meta(out_dir, src, fingerprint, force, tokenizer.name)) is not None:
        return meta
    raw = read_data(path, name, is_zip, hint)
    if len(raw) != nbytes:
        raise DataError(f"{what}: read {len(raw):,} bytes, expected {nbytes:,}: {hint}")
    data = np.frombuffer(raw, dtype=np.uint8)  # a view: no copy of the 100 MB
    if check is not None:
        check(data, path, hint)
    splits = {split: [data[a:b]] for split, (a, b) in split_ranges(nbytes, num_test_chars).items()}
    return write_dataset(out_dir, splits, encode, dataset=name, source=src, fingerprint=fingerprint,
                         word_rule=word_rule, extra={"num_test_chars": num_test_chars, "split_rule": SPLIT_RULE},
                         num_proc=1, force=True, tokenizer=tokenizer)


def positive_int(value):
    """--num_test_chars: 5000000, 5,000,000 or 5_000_000; a bad one is argparse's one-line error."""
    try:
        n = int(value.replace(",", "").replace("_", ""))
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return n


def prepare_enwik8(source, out_dir, *, num_test_chars=NUM_TEST_CHARS, force=False):
    return prepare_corpus(source, out_dir, name=NAME, url=URL, size=SIZE, tokenizer=bytes_tokenizer(eot=None),
                          encode=encode_bytes, num_test_chars=num_test_chars, force=force)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--source", default=None,
                        help=f"{NAME}.zip or the unzipped {NAME} (default: <out_dir>/{NAME}.zip, else <out_dir>/{NAME})")
    parser.add_argument("--out_dir", default=here, help="where the shards go (default: data/enwik8/)")
    parser.add_argument("--num_test_chars", type=positive_int, default=NUM_TEST_CHARS,
                        help="bytes of validation and of test, the last ones of the file (default 5,000,000; "
                             "another value also lifts the 100,000,000-byte size check, for small test files)")
    parser.add_argument("--force", action="store_true", help="redo even if meta.json says it is done")
    args = parser.parse_args(argv)
    with cli_errors():
        prepare_enwik8(args.source, args.out_dir, num_test_chars=args.num_test_chars, force=args.force)


if __name__ == "__main__":
    main()
