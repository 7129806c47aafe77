"""Prepare PG-19 (Rae et al., 2020): 28,602 train / 50 validation / 100 test books from Project Gutenberg.

$ python data/pg19/prepare.py                      # data/pg19/raw/ if it is there, else the Hugging Face hub
$ python data/pg19/prepare.py --source=/data/pg19  # a copy in DeepMind's layout: train/ validation/ test/ of <id>.txt
$ python data/pg19/prepare.py --source=hub         # emozilla/pg19 (parquet) from the hub; needs `pip install datasets`

Writes train.bin / validation.bin / test.bin, *_docs.npy and meta.json into --out_dir (see data/README.md).
Every book is one document: its text as stored, then <|endoftext|>. Words = len(text.split()) per book.
data/gutenberg/prepare.py runs its texts through prepare_local() below.
"""
import functools
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from data.shards import (SPLITS, ArgumentParser, DataError, cli_errors, decode_utf8, default_source, encode_doc, load_hub,
                         prepared_meta, write_dataset)

WORD_RULE = "per book: len(text.split()), Python's whitespace split of the book's full text (the PG-19 convention)"
HUB_REPO = "emozilla/pg19"


def download_hint(raw_dir):
    return (f"put DeepMind's PG-19 (11 GB) in {raw_dir}/ with `gsutil -m cp -r gs://deepmind-gutenberg/train "
            f"gs://deepmind-gutenberg/validation gs://deepmind-gutenberg/test {raw_dir}/`, "
            f"or `pip install datasets` and run with network access to fetch {HUB_REPO} from the hub")


def book_files(source_dir) -> dict[str, list[str]]:
    """The .txt books of each split of a directory in PG-19's layout, sorted by name."""
    hint = download_hint(source_dir)
    if not os.path.isdir(source_dir):
        raise DataError(f"{source_dir} does not exist: {hint}")
    if not os.listdir(source_dir):
        raise DataError(f"{source_dir} is empty: {hint}")
    files = {}
    for split in SPLITS:
        split_dir = os.path.join(source_dir, split)
        if not os.path.isdir(split_dir):
            raise DataError(f"{split_dir}/ is missing: PG-19's layout is train/ validation/ test/ of <id>.txt")
        names = sorted(name for name in os.listdir(split_dir) if name.endswith(".txt"))
        if not names:
            raise DataError(f"{split_dir}/ has no .txt books")
        files[split] = [os.path.join(split_dir, name) for name in names]
    return files


def encode_book_file(path, tokenizer=None):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    text, replaced = decode_utf8(raw)
    return encode_doc(text, words=len(text.split()), replaced=replaced, tokenizer=tokenizer)


def encode_book_row(row):
    text = row["text"]
    return encode_doc(text, words=len(text.split()))


def files_fingerprint(files):
    """Names and sizes of all the books: a re-run redoes the work only if these changed."""
    h = hashlib.sha256()
    for split, paths in files.items():
        for path in paths:
            h.update(f"{split}/{os.path.basename(path)}\t{os.path.getsize(path)}\n".encode())
    return h.hexdigest()[:16]


def prepare_local(source_dir, out_dir, *, dataset="pg19", source=None, fingerprint=None, extra=None,
                  num_proc=1, force=False, tokenizer=None):
    """Tokenize a directory in PG-19's layout. source/fingerprint default to the directory and its files.
    tokenizer: a data/tokenizer.py Tokenizer (GPT-2 when None); data/gutenberg/prepare.py --tokenizer=bytes."""
    files = book_files(source_dir)
    encode = encode_book_file if tokenizer is None else functools.partial(encode_book_file, tokenizer=tokenizer)
    return write_dataset(out_dir, files, encode, dataset=dataset,
                         source=source or f"local:{os.path.abspath(source_dir)}",
                         fingerprint=fingerprint or files_fingerprint(files), word_rule=WORD_RULE, extra=extra,
                         num_proc=num_proc, force=force, tokenizer=tokenizer)


def prepare_hub(repo, out_dir, *, num_proc=1, force=False):
    source = f"hub:{repo}"
    if (meta := prepared_meta(out_dir, source, force=force)) is not None:
        return meta
    ds = load_hub(repo, hint=download_hint(os.path.join(out_dir, "raw")))
    return write_dataset(out_dir, {split: ds[split] for split in SPLITS}, encode_book_row, dataset="pg19",
                         source=source, word_rule=WORD_RULE, num_proc=num_proc, force=True)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--source", default="auto",
                        help="a directory in PG-19's layout, 'hub', or 'auto': <out_dir>/raw/ if it exists, else hub")
    parser.add_argument("--out_dir", default=here, help="where the shards go (default: data/pg19/)")
    parser.add_argument("--hub_repo", default=HUB_REPO, help="hub dataset: train/validation/test, a 'text' column")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(), help="tokenizer processes")
    parser.add_argument("--force", action="store_true", help="redo even if meta.json says it is done")
    args = parser.parse_args(argv)
    with cli_errors():
        source = default_source(args.source, args.out_dir)
        if source == "hub":
            prepare_hub(args.hub_repo, args.out_dir, num_proc=args.num_proc, force=args.force)
        else:
            prepare_local(source, args.out_dir, num_proc=args.num_proc, force=args.force)


if __name__ == "__main__":
    main()
