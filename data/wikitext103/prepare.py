"""Prepare WikiText-103 raw (Merity et al., 2016; wikitext-103-raw-v1): 28,475 / 60 / 60 Wikipedia articles.

$ python data/wikitext103/prepare.py                      # data/wikitext103/raw/ if it is there, else the hub
$ python data/wikitext103/prepare.py --source=/data/wt103  # a dir with wiki.train.raw wiki.valid.raw wiki.test.raw
$ python data/wikitext103/prepare.py --source=hub         # Salesforce/wikitext; needs `pip install datasets`

Writes train.bin / validation.bin / test.bin, *_docs.npy and meta.json into --out_dir (see data/README.md).
A document is one article: from its " = Title = " line to the next one (" = = Section = = " lines are not
boundaries; the blank line before the first title belongs to the first article). The text is the raw file's,
byte for byte (no detokenization), then <|endoftext|>.

Words, for word-level perplexity comparable to the papers (Transformer-XL's count): every line of the split
file, blank lines included, counts its whitespace-separated words plus one <eos>. Transformer-XL reads the file
in text mode (lines end at \\n, \\r\\n or \\r), strips each line, splits it on whitespace and appends <eos>
(vocabulary.py: encode_file(..., add_eos=True)), so a blank line counts as 1.
"""
import hashlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from data.shards import (SPLITS, ArgumentParser, DataError, cli_errors, decode_utf8, default_source, encode_doc, load_hub,
                         prepared_meta, write_dataset)

RAW_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
WORD_RULE = ("Transformer-XL's: for every line of the raw split file (blank lines included; lines end at \\n, "
             "\\r\\n or \\r as in Python's text mode): len(line.split()) + 1 for its <eos>")
HUB_REPO, HUB_CONFIG = "Salesforce/wikitext", "wikitext-103-raw-v1"


def download_hint(raw_dir):
    return (f"unzip wiki.train.raw, wiki.valid.raw and wiki.test.raw from "
            f"https://wikitext.smerity.com/wikitext-103-raw-v1.zip into {raw_dir}/, "
            f"or `pip install datasets` and run with network access to fetch {HUB_REPO} from the hub")


def is_title(line: bytes) -> bool:
    """An article title ' = Title = ', not a section heading ' = = Section = = '."""
    s = line.strip()
    return s.startswith(b"= ") and s.endswith(b" =") and not s.startswith(b"= =")


def articles(lines):
    """Group the lines (bytes) of a split into articles (bytes): a new one starts at every title line."""
    article, seen_title = [], False
    for line in lines:
        if is_title(line):
            if seen_title:
                yield b"".join(article)
                article = []
            seen_title = True
        article.append(line)
    if article:
        yield b"".join(article)


def count_words(text: str) -> int:
    """Transformer-XL's word count of a piece of a split file (see WORD_RULE)."""
    return sum(len(line.split()) + 1 for line in io.StringIO(text, newline=None))  # newline=None: text mode's lines


def encode_article(raw: bytes):
    text, replaced = decode_utf8(raw)
    return encode_doc(text, words=count_words(text), replaced=replaced)


def file_lines(path):
    with open(path, "rb") as f:
        yield from f


def hub_lines(rows):
    """The hub's rows are the file's lines, with each blank line (' \\n' in the file) stored as ''."""
    for row in rows:
        yield (row["text"] or " \n").encode("utf-8")


def raw_files(source_dir) -> dict[str, str]:
    hint = download_hint(source_dir)
    if not os.path.isdir(source_dir):
        raise DataError(f"{source_dir} does not exist: {hint}")
    if not os.listdir(source_dir):
        raise DataError(f"{source_dir} is empty: {hint}")
    files = {split: os.path.join(source_dir, name) for split, name in RAW_FILES.items()}
    for path in files.values():
        if not os.path.isfile(path):
            raise DataError(f"{path} is missing: {hint}")
        if os.path.getsize(path) == 0:
            raise DataError(f"{path} is empty: {hint}")
    return files


def prepare_local(source_dir, out_dir, *, num_proc=1, force=False):
    files = raw_files(source_dir)
    sizes = "\n".join(f"{name}\t{os.path.getsize(path)}" for name, path in files.items())
    return write_dataset(out_dir, {split: articles(file_lines(path)) for split, path in files.items()},
                         encode_article, dataset="wikitext103", source=f"local:{os.path.abspath(source_dir)}",
                         fingerprint=hashlib.sha256(sizes.encode()).hexdigest()[:16], word_rule=WORD_RULE,
                         num_proc=num_proc, chunksize=16, force=force)


def prepare_hub(out_dir, *, num_proc=1, force=False):
    source = f"hub:{HUB_REPO}/{HUB_CONFIG}"
    if (meta := prepared_meta(out_dir, source, force=force)) is not None:
        return meta
    ds = load_hub(HUB_REPO, HUB_CONFIG, hint=download_hint(os.path.join(out_dir, "raw")))
    return write_dataset(out_dir, {split: articles(hub_lines(ds[split])) for split in SPLITS}, encode_article,
                         dataset="wikitext103", source=source, word_rule=WORD_RULE, num_proc=num_proc,
                         chunksize=16, force=True)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--source", default="auto",
                        help="a directory with wiki.{train,valid,test}.raw, 'hub', or 'auto': <out_dir>/raw/ if it "
                             "exists, else hub")
    parser.add_argument("--out_dir", default=here, help="where the shards go (default: data/wikitext103/)")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(), help="tokenizer processes")
    parser.add_argument("--force", action="store_true", help="redo even if meta.json says it is done")
    args = parser.parse_args(argv)
    with cli_errors():
        source = default_source(args.source, args.out_dir)
        if source == "hub":
            prepare_hub(args.out_dir, num_proc=args.num_proc, force=args.force)
        else:
            prepare_local(source, args.out_dir, num_proc=args.num_proc, force=args.force)


if __name__ == "__main__":
    main()
