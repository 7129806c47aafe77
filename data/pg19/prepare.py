"""Prepare PG-19 (Rae et al., 2020): 28,602 train / 50 validation / 100 test books from Project Gutenberg.

$ python data/pg19/prepare.py                      # data/pg19/raw/ if it is there, else the Hugging Face hub
$ python data/pg19/prepare.py --source=/data/pg19  # a copy in DeepMind's layout: train/ validation/ test/ of <id>.txt
$ python data/pg19/prepare.py --source=hub         # emozilla/pg19 (parquet) from the hub; needs `pip install datasets`
$ python data/pg19/prepare.py --books=2000         # the first 2,000 training books only, into data/pg19_2000/

--books=N keeps the first N books of the training split (the ∞-former paper's PG-19 subset is the first 2,000, about
200M tokens, its §4.2) and every validation and test book. "First" is the order the books are read in: file names
sorted as strings for a local copy (as `gsutil ls` lists DeepMind's bucket), the rows' order for the hub.

Writes train.bin / validation.bin / test.bin, *_docs.npy and meta.json into --out_dir (see data/README.md).
Every book is one document: its text as stored, then <|endoftext|>. Words = len(text.split()) per book.
data/gutenberg/prepare.py runs its texts through prepare_local() below.
"""
import functools
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from data.shards import (SPLITS, ArgumentParser, DataError, cli_errors, decode_utf8, default_source, encode_doc,
                         load_hub, prepared_meta, write_dataset)

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


def first_books(n_train, books):
    """The number of training books --books keeps (0: all), or a one-line DataError."""
    if books < 0:
        raise DataError(f"--books must be >= 0 (0: every book), got {books}")
    if books > n_train:
        raise DataError(f"--books={books}, but the training split has only {n_train} books")
    return books or n_train


def prepare_local(source_dir, out_dir, *, dataset="pg19", source=None, fingerprint=None, extra=None,
                  num_proc=1, force=False, tokenizer=None, books=0):
    """Tokenize a directory in PG-19's layout. source/fingerprint default to the directory and its files.
    tokenizer: a data/tokenizer.py Tokenizer (GPT-2 when None); data/gutenberg/prepare.py --tokenizer=bytes.
    books: keep the first `books` training books (0: all)."""
    files = book_files(source_dir)
    if books:
        files["train"] = files["train"][:first_books(len(files["train"]), books)]
        extra = {**(extra or {}), "books": books}
    encode = encode_book_file if tokenizer is None else functools.partial(encode_book_file, tokenizer=tokenizer)
    return write_dataset(out_dir, files, encode, dataset=dataset,
                         source=source or f"local:{os.path.abspath(source_dir)}",
                         fingerprint=fingerprint or files_fingerprint(files), word_rule=WORD_RULE, extra=extra,
                         num_proc=num_proc, force=force, tokenizer=tokenizer)


def prepare_hub(repo, out_dir, *, num_proc=1, force=False, books=0):
    source = f"hub:{repo}"
    fingerprint = f"books={books}" if books else None
    if (meta := prepared_meta(out_dir, source, fingerprint, force=force)) is not None:
        return meta
    ds = load_hub(repo, hint=download_hint(os.path.join(out_dir, "raw")))
    splits = {split: ds[split] for split in SPLITS}
    if books:
        splits["train"] = splits["train"].select(range(first_books(len(splits["train"]), books)))
    return write_dataset(out_dir, splits, encode_book_row, dataset="pg19", source=source, fingerprint=fingerprint,
                         word_rule=WORD_RULE, extra={"books": books} if books else None, num_proc=num_proc,
                         force=True)


def default_out_dir(books=0):
    """data/pg19/, or data/pg19_N/ for the first N training books (a dataset of its own: --dataset=pg19_N)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), f"pg19_{books}") if books else here


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--source", default="auto",
                        help="a directory in PG-19's layout, 'hub', or 'auto': <out_dir>/raw/ if it exists, else hub")
    parser.add_argument("--out_dir", default=None,
                        help="where the shards go (default: data/pg19/, with --books=N data/pg19_N/)")
    parser.add_argument("--hub_repo", default=HUB_REPO, help="hub dataset: train/validation/test, a 'text' column")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(), help="tokenizer processes")
    parser.add_argument("--force", action="store_true", help="redo even if meta.json says it is done")
    parser.add_argument("--books", type=int, default=0,
                        help="keep the first N training books (the ∞-former paper's subset: 2000); 0 = all")
    args = parser.parse_args(argv)
    if args.books < 0:
        parser.error(f"--books must be >= 0 (0: every book), got {args.books}")
    out_dir = args.out_dir or default_out_dir(args.books)
    with cli_errors():
        source = default_source(args.source, args.out_dir or here)   # the raw copy stays in data/pg19/raw/
        if source == "hub":
            prepare_hub(args.hub_repo, out_dir, num_proc=args.num_proc, force=args.force, books=args.books)
        else:
            prepare_local(source, out_dir, num_proc=args.num_proc, force=args.force, books=args.books)


if __name__ == "__main__":
    main()
